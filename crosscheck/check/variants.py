"""Known bugs, each written as a small variant of the reference. A registry entry lists the ones
that apply to it; the audit's diagnosis names one when it reproduces a failing function.

A variant takes the data as the audit passes it (`data`: arrays by keyword, with the structural
`group_size` / `group_ids` / `valid`) and the reference conventions (`p`), and returns what the
buggy function would: its output (`value`) or, for a bug that only shows in the gradient, the
gradient for a cotangent `g` (`grad`). A variant that does not apply to a case raises
ValueError.
"""
import dataclasses
from typing import Callable, Optional

import numpy as np

import ref_numpy

STRUCTURAL = ("group_size", "group_ids", "valid")


@dataclasses.dataclass(frozen=True)
class KnownBug:
    label: str                          # what it is, with the public report that found it
    value: Optional[Callable] = None    # (data, p) -> output
    grad: Optional[Callable] = None     # (data, p, g) -> gradient wrt the entry's first input
    detach: bool = False                # the bug is a missing stop-gradient


def arrays_of(data):
    """The array inputs, without the structural ones."""
    return {k: v for k, v in data.items() if k not in STRUCTURAL}


def mask_of(data, shape):
    m = data.get("mask")
    return np.ones(shape, dtype=bool) if m is None else m.astype(bool)


def _adv(data):
    A = data["advantages"]
    return A[:, None] if A.ndim == 1 and data["logp"].ndim == 2 else A


def ppo_dual_on_positive(data, p):
    c = p.get("clip_c") or 3.0
    base = ref_numpy.ppo_clip_loss(**arrays_of(data), **dict(p, clip_c=None))
    A = np.broadcast_to(_adv(data), base.shape)
    m = mask_of(data, base.shape)
    return np.where(m, np.minimum(base, -A * c), 0.0)


def ppo_swapped(data, p):
    lo = p.get("clip_low", 0.2)
    hi = p.get("clip_high") if p.get("clip_high") is not None else lo
    if hi >= 1:
        raise ValueError("cannot swap")
    return ref_numpy.ppo_clip_loss(**arrays_of(data), **dict(p, clip_low=hi, clip_high=lo))


def gspo_product(data, p):
    a = arrays_of(data)
    m = mask_of(data, a["logp"].shape)
    L = np.maximum(m.sum(axis=-1, keepdims=True), 1)
    lp, old = np.where(m, a["logp"], 0.0), np.where(m, a["old_logp"], 0.0)
    # Σ log-ratios = L · mean: emulate the product by scaling old_logp's distance by L
    return ref_numpy.gspo_loss(lp, lp - (lp - old) * L, a["advantages"], a.get("mask"), **p)


def kl_swapped(data, p):
    a = arrays_of(data)
    return ref_numpy.kl_penalty(a["ref_logp"], a["logp"], a.get("mask"), **p)


def kl_negated(data, p):
    return -ref_numpy.kl_penalty(**arrays_of(data), **p)


def whiten_unmasked(data, p):
    """Statistics over every entry, padding included (whatever values it holds)."""
    a = arrays_of(data)
    m = mask_of(data, a["x"].shape)
    return np.where(m, ref_numpy.whiten(a["x"], None, **p), 0.0)


def whiten_adds_mean_back(data, p):
    a = arrays_of(data)
    m = mask_of(data, a["x"].shape)
    x = np.where(m, a["x"], 0.0)
    mu = x.sum() / m.sum()
    return np.where(m, ref_numpy.whiten(a["x"], a.get("mask"), **dict(p, shift_mean=True)) + mu,
                    0.0)


def value_clip_around_returns(data, p):
    a = arrays_of(data)
    return ref_numpy.value_loss(a["values"], a["returns"], a["returns"], a.get("mask"), **p)


def groups_by_position(data, p):
    a = arrays_of(data)
    ids = data.get("group_ids")
    if ids is None:
        raise ValueError("consecutive already")
    n_groups = len(np.unique(ids))
    B = a["rewards"].shape[0]
    if B % n_groups:
        raise ValueError("not reshapeable")
    return ref_numpy.group_advantages(a["rewards"], group_size=B // n_groups, **p)


def groups_keep_invalid(data, p):
    a = arrays_of(data)
    if data.get("valid") is None:
        raise ValueError("no invalid rows")
    kw = {k: data[k] for k in ("group_ids", "group_size") if k in data}
    return ref_numpy.group_advantages(a["rewards"], **kw, **p) * data["valid"]


def cispo_undetached_grad(data, p, g):
    """∂/∂logp of −w·A·logp with w = clip(r) differentiated too: −A·(w + logp·r·1[w = r])."""
    a = arrays_of(data)
    lp, old = a["logp"], a["old_logp"]
    m = mask_of(data, lp.shape)
    A = np.broadcast_to(_adv(data), lp.shape)
    r = np.exp(np.where(m, lp - old, 0.0))
    w = ref_numpy.cispo_loss_vjp(-np.ones(lp.shape), lp, old, np.ones(lp.shape), a.get("mask"),
                                 **p)["logp"]                        # −(−w·1) = w on valid tokens
    passes = np.isclose(w, r, rtol=0, atol=0)
    grad = -A * (w + np.where(m, lp, 0.0) * r * passes)
    return np.where(m, g * grad, 0.0)


def dppo_undetached_grad(data, p, g):
    """∂/∂logp of −A·w·logp·kept with w = min(r, C) differentiated too (form "logp"): the
    held gradient −A·w·kept plus logp times form "ratio"'s −A·∂w/∂logp·kept."""
    if p.get("form", "logp") != "logp":
        raise ValueError("form 'ratio' differentiates its weight already")
    a = arrays_of(data)
    held = ref_numpy.dppo_loss_vjp(g, **a, **p)["logp"]
    through = ref_numpy.dppo_loss_vjp(g, **a, **dict(p, form="ratio"))["logp"]
    m = mask_of(data, a["logp"].shape)
    return np.where(m, held + np.where(m, a["logp"], 0.0) * through, 0.0)


def vespo_undetached_grad(data, p, g):
    """∂/∂logp of −φ(w)·A·logp with φ differentiated too: the held gradient −φ·A·g plus, for
    each token s of a row, ∂log w/∂logp_s · Σ_t g_t·(−φ_t·A_t)·logp_t·(k_t − λ_t·w), where
    ∂φ/∂log w = φ·(k − λ·w) and log w = clip(Σ clip(ρ, ±c), log_w_min, log_w_max)."""
    a = arrays_of(data)
    lp = a["logp"]
    m = mask_of(data, lp.shape)
    d = dict(ref_numpy.vespo_loss.__kwdefaults__, **p)
    held = ref_numpy.vespo_loss_vjp(g, **a, **p)["logp"]                 # −g·φ·A
    rho = np.where(m, lp - a["old_logp"], 0.0)
    c = d["log_ratio_clamp"]
    passes = np.ones(rho.shape, bool) if c is None else np.abs(rho) < c
    rho = rho if c is None else np.clip(rho, -c, c)
    total = np.where(m, rho, 0.0).sum(axis=-1, keepdims=True)
    inside = (total > d["log_w_min"]) & (total < d["log_w_max"])
    log_w = np.clip(total, d["log_w_min"], d["log_w_max"])
    pos = np.broadcast_to(_adv(data), lp.shape) >= 0
    k = np.where(pos, d["k_pos"], d["k_neg"])
    lam = np.where(pos, d["lambda_pos"], d["lambda_neg"])
    with np.errstate(over="ignore", invalid="ignore"):
        terms = np.where(m, held * np.where(m, lp, 0.0) * (k - lam * np.exp(log_w)), 0.0)
    through = terms.sum(axis=-1, keepdims=True) * inside * passes
    return np.where(m, held + through, 0.0)


def objective_kl_swapped(data, p):
    """policy_objective with its KL estimator's arguments swapped, k(ref_logp, logp), the
    term's weight (TRL's ratio r = exp(logp − old_logp), or none) kept: aggregate is linear, so
    the objective plus β·aggregate(swapped term − term)."""
    a = arrays_of(data)
    beta = p.get("beta") or 0.0
    if not beta or p.get("kl_anchor", "ref") != "ref" or a.get("ref_logp") is None:
        raise ValueError("no KL term against ref_logp")
    from ref_numpy.objective import kl_term
    lp, old, ref = (np.asarray(a[k], dtype=np.float64) for k in ("logp", "old_logp",
                                                                  "ref_logp"))
    m = mask_of(data, lp.shape)
    kw = dict(kind=p.get("kl_kind", "k3"), clamp=p.get("kl_clamp"), weight=p.get("kl_weight"))
    with np.errstate(all="ignore"):
        term = kl_term(lp, old, ref, m, **kw)
        # k(ref, logp)·r(logp, old): kl_term's ratio formed from ref against ref − (logp − old)
        swapped = kl_term(ref, np.where(m, ref - (lp - old), 0.0), lp, m, **kw)
    diff = np.where(m, beta * (swapped - term), 0.0)
    return ref_numpy.policy_objective(**a, **p) + ref_numpy.aggregate(
        diff, m, mode=p.get("agg", "seq-mean-token-mean"), norm=p.get("norm"),
        empty_rows=p.get("empty_rows", "exclude"))


PPO = (KnownBug("dual clip applied to positive advantages too (tianshou #433, verl #783)",
                value=ppo_dual_on_positive),
       KnownBug("clip bounds swapped: ε_low and ε_high exchanged (DAPO clip-higher)",
                value=ppo_swapped))
GSPO = (KnownBug("the sequence ratio as a product of token ratios; GSPO uses the "
                 "length-normalised mean", value=gspo_product),)
KL = (KnownBug("the estimator's arguments swapped (logp ↔ ref_logp)", value=kl_swapped),
      KnownBug("the KL term's sign flipped (verl a65c9157 maximised KL)", value=kl_negated))
WHITEN = (KnownBug("statistics over padding too (unmasked mean and variance)",
                   value=whiten_unmasked),
          KnownBug("shift_mean=False adds the mean back (slime #1369)",
                   value=whiten_adds_mean_back))
VALUE = (KnownBug("the value clip is around the returns, not the old values (a no-op)",
                  value=value_clip_around_returns),)
GROUPS = (KnownBug("groups taken as consecutive blocks, ignoring group_ids (a reshape of an "
                   "interleaved batch: R1-V #67, PipelineRL #54)", value=groups_by_position),
          KnownBug("invalid rows kept in the group statistics (OpenRLHF #1239)",
                   value=groups_keep_invalid))
CISPO = (KnownBug("CISPO's weight w = clip(ratio) is not detached: its gradient is "
                  "differentiated too", grad=cispo_undetached_grad, detach=True),)
DPPO = (KnownBug("DPPO's weight min(r, C) is not detached: its gradient is differentiated "
                 "too (form 'logp')", grad=dppo_undetached_grad, detach=True),)
VESPO = (KnownBug("VESPO's weight φ(w) is not detached: the gamma weight of the sequence "
                  "ratio is differentiated too", grad=vespo_undetached_grad, detach=True),)
OBJECTIVE = (KnownBug("the KL estimator's arguments swapped (logp ↔ ref_logp), its weight "
                      "kept (TRL's ratio-weighted KL)", value=objective_kl_swapped),)
