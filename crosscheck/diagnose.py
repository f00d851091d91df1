"""When an audit fails, say what the function most likely computes instead.

Two kinds of explanation, tried in order on the failing (shrunk) case and six more cases:
  1. a convention difference: the same reference with up to two conventions changed (ddof,
     eps, eps placement, clip bounds, aggregation mode, ...) — "a convention difference, not a
     bug";
  2. a known bug from ../shared/reference/bug_classes.md, written here as a small variant of
     the reference (dual clip on A > 0, swapped clip bounds, a product of token ratios, KL
     arguments swapped or its sign flipped, unmasked whitening statistics, a value clip around
     the returns, groups taken by position, a CISPO weight that is not detached).
A variant explains the failure only if it reproduces the user's outputs (or gradients) on every
one of those cases.
"""
import itertools
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

import ref_numpy

from . import cases as cases_mod
from .audit import reference_args

GRID: Dict[str, Dict[str, list]] = {
    "group_advantages": dict(ddof=[0, 1], eps=[1e-4, 1e-6, 1e-8, 1e-9, 0.0],
                             scale=["group", "batch", "none", "leave_one_out"],
                             baseline=["mean", "leave_one_out"]),
    "whiten": dict(ddof=[0, 1], eps=[1e-8, 1e-6, 1e-5], eps_mode=["var", "clamp", "std"],
                   shift_mean=[True, False]),
    "ppo_clip_loss": dict(clip_low=[0.2, 0.1, 0.28], clip_high=[None, 0.2, 0.28],
                          clip_c=[None, 3.0], delta=[None, 3.0], log_ratio_clamp=[None, 20.0]),
    "cispo_loss": dict(bound=["absolute", "relative"], clip_high=[5.0, 4.0, 2.0, 0.28, 0.2],
                       clip_low=[None, 0.2]),
    "gspo_loss": dict(form=["token", "sequence"], clip_low=[3e-4, 0.2],
                      clip_high=[4e-4, 0.2, 0.28], log_ratio_max=[None, 10.0]),
    "kl_penalty": dict(kind=["k1", "k2", "k3", "abs"], clamp=[None, (20.0, 10.0), (None, 10.0)]),
    "aggregate": dict(mode=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                            "seq-mean-token-sum-norm"], empty_rows=["exclude", "include"]),
    "value_loss": dict(clip=[None, 0.2, 0.5]),
    "policy_objective": dict(agg=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"], empty_rows=["exclude", "include"],
                             loss=["ppo", "cispo", "gspo"]),
    "approx_kl": dict(kind=["k1", "k2", "k3"]),
    "clip_fraction": dict(definition=["loss", "sign", "ratio"]),
    "discounted_returns": dict(gamma=[1.0, 0.99]),
    "gae": dict(gamma=[1.0, 0.99], lam=[1.0, 0.95]),
}


# ---------------------------------------------------------------- known bugs, as variants
def _ppo_dual_on_positive(data, p):
    c = p.get("clip_c") or 3.0
    base = ref_numpy.ppo_clip_loss(**_arrays(data), **dict(p, clip_c=None))
    A = np.broadcast_to(_adv(data), base.shape)
    m = _mask(data, base.shape)
    return np.where(m, np.minimum(base, -A * c), 0.0)


def _ppo_swapped(data, p):
    lo = p.get("clip_low", 0.2)
    hi = p.get("clip_high") if p.get("clip_high") is not None else lo
    if hi >= 1:
        raise ValueError("cannot swap")
    return ref_numpy.ppo_clip_loss(**_arrays(data), **dict(p, clip_low=hi, clip_high=lo))


def _gspo_product(data, p):
    a = _arrays(data)
    m = _mask(data, a["logp"].shape)
    L = np.maximum(m.sum(axis=-1, keepdims=True), 1)
    lp, old = np.where(m, a["logp"], 0.0), np.where(m, a["old_logp"], 0.0)
    # Σ log-ratios = L · mean: emulate the product by scaling old_logp's distance by L
    return ref_numpy.gspo_loss(lp, lp - (lp - old) * L, a["advantages"], a.get("mask"),
                               **{k: v for k, v in p.items()})


def _kl_swapped(data, p):
    a = _arrays(data)
    return ref_numpy.kl_penalty(a["ref_logp"], a["logp"], a.get("mask"), **p)


def _kl_negated(data, p):
    return -ref_numpy.kl_penalty(**_arrays(data), **p)


def _whiten_unmasked(data, p):
    a = _arrays(data)
    m = _mask(data, a["x"].shape)
    return np.where(m, ref_numpy.whiten(np.where(m, a["x"], 0.0), None, **p), 0.0)


def _whiten_adds_mean_back(data, p):
    a = _arrays(data)
    m = _mask(data, a["x"].shape)
    x = np.where(m, a["x"], 0.0)
    mu = x.sum() / m.sum()
    return np.where(m, ref_numpy.whiten(a["x"], a.get("mask"), **dict(p, shift_mean=True)) + mu,
                    0.0)


def _value_clip_around_returns(data, p):
    a = _arrays(data)
    return ref_numpy.value_loss(a["values"], a["returns"], a["returns"], a.get("mask"), **p)


def _groups_by_position(data, p):
    a = _arrays(data)
    ids = data.get("group_ids")
    if ids is None:
        raise ValueError("consecutive already")
    n_groups = len(np.unique(ids))
    B = a["rewards"].shape[0]
    if B % n_groups:
        raise ValueError("not reshapeable")
    return ref_numpy.group_advantages(a["rewards"], group_size=B // n_groups, **p)


def _groups_keep_invalid(data, p):
    a = _arrays(data)
    if data.get("valid") is None:
        raise ValueError("no invalid rows")
    kw = {k: data[k] for k in ("group_ids", "group_size") if k in data}
    return ref_numpy.group_advantages(a["rewards"], **kw, **p) * data["valid"]


def _cispo_undetached_grad(data, p, g):
    """∂/∂logp of −w·A·logp with w = clip(r) differentiated too: −A·(w + logp·r·1[w = r])."""
    a = _arrays(data)
    lp, old = a["logp"], a["old_logp"]
    m = _mask(data, lp.shape)
    A = np.broadcast_to(_adv(data), lp.shape)
    r = np.exp(np.where(m, lp - old, 0.0))
    w = ref_numpy.cispo_loss_vjp(-np.ones(lp.shape), lp, old, np.ones(lp.shape), a.get("mask"),
                                 **p)["logp"]                        # −(−w·1) = w on valid tokens
    passes = np.isclose(w, r, rtol=0, atol=0)
    grad = -A * (w + np.where(m, lp, 0.0) * r * passes)
    return np.where(m, g * grad, 0.0)


KNOWN: Dict[str, List[Tuple[str, Callable, Optional[Callable]]]] = {
    "ppo_clip_loss": [
        ("dual clip applied to positive advantages too (tianshou #433, verl #783)",
         _ppo_dual_on_positive, None),
        ("clip bounds swapped: ε_low and ε_high exchanged (DAPO clip-higher)", _ppo_swapped, None),
    ],
    "gspo_loss": [("the sequence ratio as a product of token ratios; GSPO uses the "
                   "length-normalised mean", _gspo_product, None)],
    "kl_penalty": [("the estimator's arguments swapped (logp ↔ ref_logp)", _kl_swapped, None),
                   ("the KL term's sign flipped (verl a65c9157 maximised KL)", _kl_negated, None)],
    "whiten": [("statistics over padding too (unmasked mean and variance)", _whiten_unmasked,
                None),
               ("shift_mean=False adds the mean back (slime #1369)", _whiten_adds_mean_back, None)],
    "value_loss": [("the value clip is around the returns, not the old values (a no-op)",
                    _value_clip_around_returns, None)],
    "group_advantages": [
        ("groups taken as consecutive blocks, ignoring group_ids (a reshape of an interleaved "
         "batch: R1-V #67, PipelineRL #54)", _groups_by_position, None),
        ("invalid rows kept in the group statistics (OpenRLHF #1239)", _groups_keep_invalid,
         None)],
    "cispo_loss": [("CISPO's weight w = clip(ratio) is not detached: its gradient is "
                    "differentiated too", None, _cispo_undetached_grad)],
}
DETACH_VARIANTS = {"CISPO's weight w = clip(ratio) is not detached: its gradient is "
                   "differentiated too"}


def _arrays(data):
    return {k: v for k, v in data.items() if k not in ("group_size", "group_ids", "valid")}


def _mask(data, shape):
    m = data.get("mask")
    return np.ones(shape, dtype=bool) if m is None else m.astype(bool)


def _adv(data):
    A = data["advantages"]
    return A[:, None] if A.ndim == 1 and data["logp"].ndim == 2 else A


# ---------------------------------------------------------------- matching
def _probe_cases(aud, case, n=6):
    from .audit import _finite_padding, _as_trainer_batch
    out = [case]
    for i in range(40):
        if len(out) > n:
            break
        c = _finite_padding(aud.entry.case(cases_mod.rng_for(99, aud.entry.name, i), i))
        c = _as_trainer_batch(c)
        data, _ = aud.inputs_for(c)
        if data is not None:
            out.append(c)
    return out


def _user_values(aud, probes):
    """The user's outputs on the probes it runs on (a probe it raises on is left out)."""
    got = []
    for c in probes:
        data, _ = aud.inputs_for(c)
        try:
            got.append((data, aud.to_numpy(aud.call(data)[0])))
        except Exception:
            continue
    return got if got else None


def _user_grads(aud, probes):
    wrt = [d for d in aud.entry.diff]
    got = []
    for c in probes:
        data, _ = aud.inputs_for(c)
        names = [d for d in wrt if d in data]
        try:
            raw, leaves = aud.call(data, grad_wrt=names)
            outs = raw if isinstance(raw, tuple) else (raw,)
            rng = np.random.default_rng(5)
            gs = [rng.normal(size=tuple(o.shape)) if o.dim() else float(rng.normal())
                  for o in outs]
            total = sum((o.double() * torch.as_tensor(g, dtype=torch.float64)).sum()
                        for o, g in zip(outs, gs))
            if not total.requires_grad:
                return None
            grads = torch.autograd.grad(total, [leaves[n] for n in names], allow_unused=True)
        except Exception:          # the user's code raised on a probe: no diagnosis
            return None
        got.append((data, tuple(gs) if len(gs) > 1 else gs[0],
                    {n: (np.zeros(data[n].shape) if gr is None else gr.detach().numpy())
                     for n, gr in zip(names, grads)}))
    return got


def _same(aud, a, b, data):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    return aud.close(a, b, aud.valid_of(data, a.shape))[0]


def _variants(aud) -> List[Tuple[str, Dict[str, object]]]:
    grid = GRID.get(aud.entry.name, {})
    keys = [k for k in grid if k in aud.params or k in ("delta",)]
    out = []
    for n_changed in (1, 2):
        for combo in itertools.combinations(keys, n_changed):
            for values in itertools.product(*(grid[k] for k in combo)):
                if any(aud.params.get(k) == v for k, v in zip(combo, values)):
                    continue
                out.append((", ".join(f"{k}={v!r}" for k, v in zip(combo, values)),
                            dict(aud.params, **dict(zip(combo, values)))))
    return out


def diagnose(aud, case, check) -> Tuple[str, bool]:
    """(explanation, whether it is a missing stop-gradient) for a failing check, or ("", False)."""
    if check not in ("value", "grad"):
        return "", False
    probes = _probe_cases(aud, case)
    name = aud.entry.name
    if check == "value":
        user = _user_values(aud, probes)
        if user is None:
            return "", False
        known = next((label for label, value_fn, _ in KNOWN.get(name, [])
                      if value_fn is not None and _all_match(
                          aud, user, lambda d, f=value_fn: f(d, aud.params))), None)
        convention = next((label for label, params in _variants(aud)
                           if _all_match(aud, user, lambda d, p=params: aud.entry.numpy_fn(
                               **reference_args(d), **p))), None)
        if known and convention:
            return (f"matches a known bug: {known} (it computes the same as {name} with "
                    f"{convention})", False)
        if known:
            return f"matches a known bug: {known}", False
        if convention:
            return (f"matches {name} with {convention}: a convention difference, not a bug",
                    False)
        return "", False
    user = _user_grads(aud, probes)
    if user is None:
        return "", False
    for label, params in _variants(aud):
        def vjp(d, g, p=params):
            return aud.entry.numpy_vjp(g, **reference_args(d), **p)
        if _all_grads_match(aud, user, vjp):
            detach = name in ("gspo_loss", "policy_objective") and \
                params.get("form") == "sequence" and aud.params.get("form", "token") == "token"
            what = ("GSPO-token's sequence factor is not detached: the gradient flows through "
                    "the mean (" if detach else "") + f"matches {name}'s gradient with {label}" + \
                (")" if detach else ": a convention difference, not a bug")
            return what, detach
    for label, _, grad_fn in KNOWN.get(name, []):
        if grad_fn is None:
            continue
        wrt = aud.entry.diff[0]
        if _all_grads_match(aud, user, lambda d, g, f=grad_fn: {wrt: f(d, aud.params, g)}):
            return f"matches a known bug: {label}", label in DETACH_VARIANTS
    return "", False


def _all_match(aud, user, fn, at_least=2):
    """The variant reproduces the user's outputs on every probe it applies to (≥ at_least)."""
    compared = 0
    for data, yours in user:
        try:
            ref = fn(data)
        except (ValueError, TypeError):
            continue                          # the variant does not apply to this probe
        refs = ref if isinstance(ref, tuple) else (ref,)
        if len(refs) != len(yours) or not all(_same(aud, y, r, data)
                                              for y, r in zip(yours, refs)):
            return False
        compared += 1
    return compared >= min(at_least, len(user))


def _all_grads_match(aud, user, vjp):
    for data, g, yours in user:
        try:
            ref = vjp(data, g)
        except (ValueError, TypeError):
            return False
        for n, y in yours.items():
            if not _same(aud, y, ref[n], data):
                return False
    return True
