"""What finite differences are taken of, where that is not simply the NumPy function.

Freeze rules. Where a definition holds a stop-gradient factor (CISPO's weight, GSPO-token's
sequence ratio), the true gradient is that of the objective with the factor held at its value.
A rule `(fn, arrays, params, name, delta) -> (fn', arrays', params')` gives that objective at
`arrays[name] + delta`: fn' evaluated on arrays' is the function with every detached factor
frozen at the unperturbed point. `fn` is the registry entry's own NumPy function.

Objectives. `kl_estimator_gradient` returns gradients; each output must equal the finite
differences of the expectation it is the gradient of.
"""
import functools
import inspect

import numpy as np
from scipy.special import log_softmax

import ref_numpy
from ref_numpy import many
from ref_numpy.kl import k_estimator


def keyword_defaults(fn):
    """A function's keyword-only parameters that have defaults, with them."""
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()
            if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}


GSPO_DEFAULTS = keyword_defaults(ref_numpy.gspo_loss)


def freeze_ratio(fn, arrays, params, name, delta):
    """CISPO: hold r = exp(logp − old_logp) fixed by moving old_logp with logp: sg(w(r)) is
    frozen, and the objective is the same function of the perturbed arrays."""
    out = dict(arrays)
    out[name] = arrays[name] + delta
    out["old_logp"] = arrays["old_logp"] + delta
    return fn, out, params


def freeze_sequence_ratio(fn, arrays, params, name, delta):
    """GSPO-token: the ratio of token t is exp(logp_t − sg(logp_t) + sg(ρ̄_i)); with ρ̄ frozen at
    its value it is exp(min(ρ̄_i + Δlogp_t, cap)), a per-token PPO ratio against
    old' = logp − ρ̄_i whose log is capped from above only (PPO's log_ratio_clamp is two-sided,
    so the cap is applied to logp instead: logp' = old' + min(logp − old', cap)). The frozen
    objective is `ppo_clip_loss` with GSPO's clip bounds."""
    lp, old = arrays["logp"], arrays["old_logp"]
    m = np.ones(lp.shape, bool) if arrays.get("mask") is None else arrays["mask"].astype(bool)
    with np.errstate(invalid="ignore"):
        diff = np.where(m, lp - old, 0.0)
    rho_bar = diff.sum(axis=-1, keepdims=True) / np.maximum(m.sum(axis=-1, keepdims=True), 1)
    out = dict(arrays, old_logp=np.where(m, lp - rho_bar, old))
    out[name] = arrays[name] + delta
    cap = params.get("log_ratio_max", GSPO_DEFAULTS["log_ratio_max"])
    if cap is not None:
        with np.errstate(invalid="ignore"):            # padding may hold NaN or inf
            out["logp"] = np.where(m, out["old_logp"] + np.minimum(out["logp"] - out["old_logp"],
                                                                   cap), 0.0)
    ppo = {k: params.get(k, GSPO_DEFAULTS[k]) for k in ("clip_low", "clip_high")}
    return ref_numpy.ppo_clip_loss, out, ppo


def gspo_rule(params):
    """GSPO's stop-gradient is in its token form only."""
    form = params.get("form", GSPO_DEFAULTS["form"])
    return freeze_sequence_ratio if form == "token" else None


def objective_rule(params):
    """policy_objective's freeze rule: its policy loss's (`policy_rule`), or with kl_weight
    "score" the KL term's sg(logp) held at the point (`freeze_score_weight`; with a policy loss
    that freezes a factor too, no rule is written: the cases do not combine them). A shaped
    advantage (adv_tau, adv_kl) is held at its value too (`freeze_shaped_advantages`)."""
    if params.get("adv_tau") or params.get("adv_kl"):
        return freeze_shaped_advantages
    if params.get("kl_weight") == "score" and params.get("beta"):
        if policy_rule(params) is not None:
            raise ValueError("no freeze rule combines kl_weight='score' with a policy loss "
                             f"that freezes a factor ({params.get('loss')!r})")
        return freeze_score_weight
    return policy_rule(params)


POLICY_OBJECTIVE_DEFAULTS = keyword_defaults(ref_numpy.policy_objective)


def freeze_shaped_advantages(fn, arrays, params, name, delta):
    """policy_objective with a shaped advantage: Ã = shaped_advantages(...) is a constant of
    the loss (A − τ·sg(ρ) + c·sg(k̄ − k)), so it is computed once at the unperturbed point and
    given as the advantages of an objective without shaping; the loss's own rule
    (`objective_rule` of the other conventions) then freezes what it freezes."""
    out = dict(arrays, advantages=ref_numpy.shaped_advantages(
        arrays["logp"], arrays["old_logp"], arrays["advantages"], arrays["mask"],
        arrays.get("ref_logp"), tau=params.get("adv_tau", 0.0),
        kl_coef=params.get("adv_kl", 0.0)))
    rest = {k: v for k, v in params.items() if k not in ("adv_tau", "adv_kl")}
    inner = objective_rule(rest)
    if inner is not None:
        return inner(fn, out, rest, name, delta)
    out[name] = arrays[name] + delta
    return fn, out, rest


def freeze_score_weight(fn, arrays, params, name, delta):
    """policy_objective with kl_weight="score": the weight exp(logp − sg(logp)) with sg(logp)
    held at the unperturbed logp (`score_anchor`), so that its finite differences carry the
    score term k·∇logp that autograd gives."""
    out = dict(arrays)
    out[name] = arrays[name] + delta
    out["score_anchor"] = arrays["logp"]
    return _score_objective, out, params


def _score_objective(logp, old_logp, advantages, mask=None, ref_logp=None, score_anchor=None,
                     **kw):
    """The policy part (β = 0) plus β·aggregate(frozen score-weighted KL)."""
    c = dict(POLICY_OBJECTIVE_DEFAULTS, **kw)
    policy = ref_numpy.policy_objective(logp, old_logp, advantages, mask, ref_logp,
                                        **dict(kw, beta=0.0, kl_weight=None))
    anchor = old_logp if c["kl_anchor"] == "old" else ref_logp
    kl = frozen_score_kl(logp, score_anchor, anchor, mask, c["kl_kind"], c["kl_clamp"])
    return policy + c["beta"] * ref_numpy.aggregate(kl, mask, mode=c["agg"], norm=c["norm"],
                                                   empty_rows=c["empty_rows"])


def frozen_score_kl(logp, x0, anchor, mask, kind, clamp):
    """exp(logp − x0)·k(logp, anchor) per token, the weight multiplied before the output clamp
    and held at 1 where the input clamp binds (NeMo-RL's calculate_kl, with sg(logp) = x0)."""
    m = np.ones(np.shape(logp), bool) if mask is None else np.asarray(mask, dtype=bool)
    lp, a, x0 = (np.where(m, np.asarray(v, dtype=np.float64), 0.0) for v in (logp, anchor, x0))
    in_b, out_b = clamp if clamp is not None else (None, None)
    x = a - lp
    w = np.exp(lp - x0)
    if in_b is not None:
        w = np.where(np.abs(x) <= in_b, w, 1.0)
        x = np.clip(x, -in_b, in_b)
    with np.errstate(over="ignore", invalid="ignore"):
        v = w * k_estimator(kind, x)[0]
    if out_b is not None:
        v = np.clip(v, -out_b, out_b)
    return np.where(m, v, 0.0)


def policy_rule(params):
    """policy_objective holds its policy loss's stop-gradient (CISPO's weight, VESPO's φ(w),
    DPPO's truncated ratio in form 'logp', GSPO-token's sequence ratio). The KL term must see
    the real logp (and, where it reads it, the real old_logp): the aggregation is linear, so
    the frozen objective is the policy part on the frozen arrays (β = 0) plus the KL part on the
    real ones (A = 0 switches the policy loss off)."""
    loss = params.get("loss", "ppo")
    if loss in ("cispo", "vespo") or loss == "dppo" and params.get("form", "logp") == "logp":
        return freeze_ratio_apart_from_kl if _kl_reads_ratio(params) else freeze_ratio
    if loss != "gspo" or gspo_rule(params) is None:
        return None

    def rule(fn, arrays, params, name, delta):
        _, out, ppo = freeze_sequence_ratio(fn, arrays, params, name, delta)
        rest = {k: v for k, v in params.items()
                if k not in ("form", "log_ratio_max", "clip_low", "clip_high", "loss")}
        out["real_logp"] = arrays["logp"] + delta
        out["real_old_logp"] = arrays["old_logp"]      # the KL's attached ratio, if any
        return _frozen_sequence_objective(fn, tuple(sorted(ppo.items()))), out, rest
    return rule


def _kl_reads_ratio(params):
    """Whether policy_objective's KL term reads old_logp: as its anchor (kl_anchor='old') or
    through the attached ratio (kl_weight='ratio'). A stop-gradient of the policy loss must then
    not freeze it."""
    return bool(params.get("beta")) and (params.get("kl_anchor", "ref") == "old" or
                                         params.get("kl_weight") == "ratio")


def freeze_ratio_apart_from_kl(fn, arrays, params, name, delta):
    """policy_objective with a frozen-ratio loss and a KL term that reads old_logp (its anchor,
    or its attached ratio r): freezing r moves old_logp with logp, which would freeze the KL's
    r, or k(logp, old_logp), too. The aggregation is linear, so the frozen objective is the
    policy part on the frozen arrays (β = 0) plus the whole objective on the real ones with
    A = 0 (which switches every policy loss off and leaves the KL term)."""
    _, out, _ = freeze_ratio(fn, arrays, params, name, delta)
    out["real_old_logp"] = arrays["old_logp"]      # logp moves in both parts; old_logp here only
    return _frozen_ratio_objective(fn), out, params


_PART_INPUTS = ("logp", "old_logp", "advantages", "mask", "ref_logp", "real_logp",
                "real_old_logp")


def _sum_of_parts(fn, parts):
    """The objective Σ fn(**arrays, **params) over parts(inputs, kw), a list of (arrays, params)
    pairs, and its evaluation at many points (`many`, when fn is the reference itself): each
    part through ref_numpy.many."""
    def objective(logp, old_logp, advantages, mask=None, ref_logp=None, real_logp=None,
                  real_old_logp=None, **kw):
        inputs = dict(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask,
                      ref_logp=ref_logp, real_logp=real_logp, real_old_logp=real_old_logp)
        return sum(fn(**a, **p) for a, p in parts(inputs, kw))

    def at_many(shared, varying, params):
        whole = dict(shared, **varying)
        # inputs no part rewrites (group_ids for a prompt-level aggregation) go to every part
        other = {k: val for k, val in whole.items() if k not in _PART_INPUTS}
        totals = []
        for arrays, kw in parts({k: whole.get(k) for k in _PART_INPUTS}, params):
            # the real old_logp is the same at every point: given one copy per point
            moving = {k: np.broadcast_to(arrays[k], np.shape(arrays["logp"]))
                      for k in ("logp", "old_logp")}
            fixed = {k: val for k, val in arrays.items() if k not in moving}
            fixed.update(other)
            totals.append(many.evaluate("policy_objective", fixed, moving, kw))
        return [sum(t[j] for t in totals) for j in range(len(totals[0]))]

    objective.many = at_many if fn is ref_numpy.policy_objective else None
    return objective


@functools.lru_cache(maxsize=None)
def _frozen_ratio_objective(fn):
    """The objective of `freeze_ratio_apart_from_kl`: one object per fn, the same at every
    point."""
    def parts(x, kw):
        data = dict(logp=x["logp"], mask=x["mask"], ref_logp=x["ref_logp"])
        return [(dict(data, old_logp=x["old_logp"], advantages=x["advantages"]),
                 dict(kw, beta=0.0)),
                (dict(data, old_logp=x["real_old_logp"],
                      advantages=np.zeros_like(x["advantages"])), kw)]
    return _sum_of_parts(fn, parts)


@functools.lru_cache(maxsize=None)
def _frozen_sequence_objective(fn, ppo):
    """GSPO-token's objective with its sequence ratio frozen: the policy part as PPO on the
    frozen arrays (β = 0), plus the KL part on the real logp (`real_logp`). One object per
    (fn, clip bounds), the same at every point, so that finite differences can evaluate all
    points together (`many`, when fn is the reference itself)."""
    ppo = dict(ppo)

    def parts(x, kw):
        data = dict(old_logp=x["old_logp"], advantages=x["advantages"], mask=x["mask"],
                    ref_logp=x["ref_logp"])
        policy = (dict(logp=x["logp"], **data), dict(kw, beta=0.0, loss="ppo", **ppo))
        if kw.get("beta", 0.0) == 0.0:
            return [policy]
        real = dict(data, logp=x["real_logp"], old_logp=x["real_old_logp"],
                    advantages=np.zeros_like(x["advantages"]))
        return [policy, (real, dict(kw, loss="ppo", **ppo))]
    return _sum_of_parts(fn, parts)


def estimator_objectives(arrays, params):
    """The expectations whose gradients kl_estimator_gradient returns, written from the per-token
    `kl_penalty` reference and scipy's log_softmax. The sampling distribution μ is frozen at the
    base point (samples are data); so is a detached weight, and k itself for use="reward".
    Each objective takes many points at once, Z [P, V] → [P]: kl_penalty sees them as the rows
    of one batch, kl_estimator_moments through ref_numpy.many."""
    z0, zr, zs = arrays["logits"], arrays["ref_logits"], arrays.get("sample_logits")
    kind, use, is_weight = params["kind"], params.get("use", "loss"), params.get("is_weight")
    log_ref = log_softmax(zr)
    p0 = np.exp(log_softmax(z0))
    mu = p0 if zs is None else np.exp(log_softmax(zs))
    k0 = ref_numpy.kl_penalty(log_softmax(z0), log_ref, kind=kind)

    def expected(Z):
        logp = log_softmax(Z, axis=-1)
        k = ref_numpy.kl_penalty(logp, np.broadcast_to(log_ref, logp.shape), kind=kind)
        weight = {None: np.ones_like(mu), "attached": np.exp(logp) / mu,
                  "detached": p0 / mu}[is_weight]
        per_sample = weight * k if use == "loss" else weight * k0 * logp
        return (mu * per_sample).sum(axis=-1)

    def moment(key):
        return lambda Z: np.array([m[key] for m in many.evaluate(
            "kl_estimator_moments", dict(ref_logits=zr), dict(logits=Z), dict(kind=kind))])

    return {"expected": expected, "grad_kl_forward": moment("kl_forward"),
            "grad_kl_reverse": moment("kl_reverse")}


# ---------------------------------------------------------------- where a reference has a kink
def group_kinks(data, params):
    """group_advantages is not differentiable where the spread it divides by is 0 (σ = √var at
    var = 0): rows of a group of equal rewards ("group"), every row when the batch is constant
    ("batch"), rows whose others are equal ("leave_one_out")."""
    r = np.asarray(data["rewards"], dtype=np.float64)
    B = r.shape[0]
    if data.get("group_size") is not None:
        gid = np.arange(B) // data["group_size"]
    else:
        gid = np.unique(np.asarray(data["group_ids"]), return_inverse=True)[1].reshape(-1)
    keep = np.ones(B, bool) if data.get("valid") is None else np.asarray(data["valid"], bool)
    scale = params.get("scale", "group")
    kink = np.zeros(B, dtype=bool)
    if scale == "batch":
        kink[:] = np.ptp(r[keep]) == 0 if keep.any() else False
    elif scale in ("group", "leave_one_out"):
        for g in np.unique(gid[keep]):
            rows = np.flatnonzero((gid == g) & keep)
            if rows.size < 2:
                continue
            if scale == "group":
                kink[rows] = np.ptp(r[rows]) == 0
            else:                               # a row's others equal: their spread is 0
                kink[rows] = any(np.ptp(np.delete(r[rows], j)) == 0 for j in range(rows.size)
                                 if rows.size > 2)
    return {"rewards": kink & keep}


def whiten_kinks(data, params):
    """whiten with eps_mode="std" divides by √var + eps: not differentiable at var = 0."""
    x = np.asarray(data["x"], dtype=np.float64)
    m = np.ones(x.shape, bool) if data.get("mask") is None else np.asarray(data["mask"], bool)
    if params.get("eps_mode", "var") != "std" or not m.any():
        return {}
    return {"x": m & (np.ptp(x[m]) == 0)}


# ---------------------------------------------------------------- condition numbers
def _spread_scale(r, gid, params):
    """Per row, the size of the denominator group_advantages divides by (σ + eps, |μ + eps|
    for scale="mean", or 1)."""
    scale, eps = params.get("scale", "group"), params.get("eps", 1e-4)
    ddof = params.get("ddof", 0)
    D = np.ones_like(r)
    if scale == "batch" and r.size:
        D[:] = np.sqrt(((r - r.mean()) ** 2).sum() / max(r.size - ddof, 1)) + eps
    elif scale in ("group", "leave_one_out", "mean"):
        for g in np.unique(gid):
            rows = np.flatnonzero(gid == g)
            if rows.size < 2:
                continue
            rr = r[rows]
            if scale == "mean":
                D[rows] = abs(rr.mean() + eps)
            elif scale == "group":
                D[rows] = np.sqrt(((rr - rr.mean()) ** 2).sum() / max(rows.size - ddof, 1)) + eps
            else:
                for j, i in enumerate(rows):
                    o = np.delete(rr, j)
                    sd = np.sqrt(((o - o.mean()) ** 2).sum() / max(o.size - ddof, 1)) \
                        if o.size - ddof > 0 else 0.0
                    D[i] = sd + eps if sd > 0 else 1.0
    return D


def group_condition(data, params):
    """κ of group_advantages per row: max |r| over the row's group over its denominator. At
    1000 ± 0.1 it is 1e4: the inputs' own rounding already moves A by κ ulps. Under
    scale="mean" the denominator is itself a sum of the rewards, so a rounding of it moves A by
    |A| times as much again: κ·(1 + |A|)."""
    r = np.asarray(data["rewards"], dtype=np.float64)
    B = r.shape[0]
    keep = np.ones(B, bool) if data.get("valid") is None else np.asarray(data["valid"], bool)
    if data.get("group_size") is not None:
        gid = np.arange(B) // data["group_size"]
    else:
        gid = np.unique(np.asarray(data["group_ids"]), return_inverse=True)[1].reshape(-1)
    kappa = np.ones(B)
    rk, gk = np.where(keep, r, 0.0)[keep], gid[keep]
    D = _spread_scale(rk, gk, params)
    big = np.array([np.abs(rk[gk == g]).max() for g in gk]) if rk.size else np.zeros(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa[keep] = np.maximum(1.0, np.where(D > 0, big / D, 1.0))
        if params.get("scale") == "mean":
            kappa[keep] *= 1.0 + np.where(D > 0, big / D, 0.0)
    return [kappa]


def passk_condition(data, params):
    """κ of passk_advantages: group_advantages' κ with its σ (n − 1) under scale="group"; 1
    under scale="none", where A is a difference of two rewards."""
    if params.get("scale", "group") == "none":
        return [np.ones(np.shape(data["rewards"]))]
    return group_condition(data, dict(params, ddof=1, scale="group"))


def whiten_condition(data, params):
    """κ of whiten: max |x| over the valid entries over the scale it divides by."""
    x = np.asarray(data["x"], dtype=np.float64)
    m = np.ones(x.shape, bool) if data.get("mask") is None else np.asarray(data["mask"], bool)
    if m.sum() < 2:
        return [np.ones(x.shape)]
    v = x[m]
    ddof, eps = params.get("ddof", 0), params.get("eps", 1e-8)
    var = ((v - v.mean()) ** 2).sum() / max(v.size - ddof, 1)
    mode = params.get("eps_mode", "var")
    s = {"var": np.sqrt(var + eps), "clamp": np.sqrt(max(var, eps)),
         "std": np.sqrt(var) + eps}[mode]
    return [np.full(x.shape, max(1.0, np.abs(v).max() / s) if s > 0 else 1.0)]
