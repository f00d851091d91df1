"""One reference function at many points in one call: what finite differences need.

A finite-difference Jacobian evaluates a function at hundreds of points near one input. The
functions here couple the whole batch (a batch mean, a token count), so the points cannot be
stacked as extra rows of one batch. Instead each is evaluated with its own formulas, written
once in its module, on an array with one leading axis per point: the inputs are validated once,
by the public function's own checks at the first point, and every point is checked to be
finite where the mask is valid. A point that fails that is evaluated alone by the public
function, which then raises its usual error.

    evaluate(name, shared, varying, params) -> [output per point]

`varying` maps the inputs that move (those the function is differentiated in, and for
policy_objective old_logp too: a frozen ratio moves it) to arrays with a leading point axis
[P, ...]; `shared` holds the inputs all points have, the mask among them. Supported: the names
in `EVALUATORS`.
"""
import numpy as np

from ref_common import args

from . import _arrays as ar
from .advantages import _whiten_inputs, _whiten_values, _whiten_vjp_values, whiten, whiten_vjp
from .estimators import (_log_softmax, _moment_gradients, _moments, _parts, kl_estimator_moments,
                         moments_vjp_of)
from .advantages import _group_inputs, group_advantages, group_advantages_vjp
from .kl import _approx_parts, approx_kl, k_estimator
from .outcome import (_gpg_parts, _whitened_parts, gpg_advantages, gpg_alpha, group_centred,
                      whitened_group_advantages)
from .pg_losses import (_gmpo_parts, _kl_cov_parts, gmpo_loss, kl_cov_loss, kl_cov_loss_vjp,
                        kl_cov_selection, kl_cov_slope)
from .objective import (_finite_objective, _policy_parts, _shaped_values, _shaped_vjp_values,
                        _shaping_inputs, kl_term, policy_objective, shaped_advantages,
                        shaped_advantages_vjp)
from .reduce import _weights, aggregate


def _finite(x, m):
    """x [P, ...] if it is finite wherever the mask is valid, else None (each point then goes
    through the public function, which raises its usual error)."""
    x = np.asarray(x, dtype=np.float64)
    valid = np.broadcast_to(m, x.shape[1:]) if m is not None else np.ones(x.shape[1:], bool)
    return x if np.isfinite(x[:, valid]).all() else None


def _sum_weighted(w, lo, m):
    """Σ w·l over the batch axes, per point (lo: [P, *w.shape] after as_2d)."""
    lo = np.where(m, lo, 0.0)
    return [np.float64(v) for v in (w * lo).sum(axis=(-2, -1))]


def _aggregate(v, mask, mode="seq-mean-token-mean", norm=None, empty_rows="exclude",
               group_size=None, group_ids=None):
    _, w = _weights(v["loss"][0], mask, mode, norm, empty_rows, group_size,
                    group_ids)                                        # validates
    m = np.asarray(mask).astype(bool)
    lo = _finite(v["loss"], m)
    if lo is None:
        return None
    return _sum_weighted(w, lo.reshape((len(lo),) + w.shape), m.reshape(w.shape))


def _approx_kl(v, old_logp, mask=None, kind="k1"):
    m, _, kind, n = _approx_parts(v["logp"][0], old_logp, mask, kind)    # validates
    lp = _finite(v["logp"], m)
    if lp is None:
        return None
    u = np.where(m, lp, 0.0) - ar.zero_masked(np.asarray(old_logp, dtype=np.float64), m)
    k, _ = k_estimator(kind, u)
    axes = tuple(range(1, u.ndim))
    return [np.float64(v) for v in (np.where(m, k, 0.0).sum(axis=axes) / n)] if n else \
        [np.float64(0.0)] * len(lp)


def _whiten(v, mask=None, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True,
            restore_mean=False):
    xs, m, ddof, eps, eps_mode = _whiten_inputs(v["x"][0], mask, ddof, eps, eps_mode,
                                                shift_mean, restore_mean)           # validates
    x = _finite(v["x"], m)
    if x is None or xs.size == 0:
        return None
    return list(_whiten_values(np.where(m, x, 0.0), m, ddof, eps, eps_mode, shift_mean,
                               restore_mean))


def _policy_objective(v, advantages, mask, ref_logp=None, loss="ppo",
                      agg="seq-mean-token-mean", beta=0.0, kl_kind="k3", kl_clamp=None,
                      norm=None, empty_rows="exclude", kl_weight=None, kl_anchor="ref",
                      group_size=None, group_ids=None, adv_tau=0.0, adv_kl=0.0, **loss_kwargs):
    """aggregate(policy_loss + β·kl_penalty) at every point: the per-token losses are
    independent across rows, so the points are stacked as rows of one batch for them; the
    aggregation is then taken per point. A shaped advantage (adv_tau, adv_kl: its centred k1
    is a mean over the batch) is evaluated point by point."""
    lp0 = np.asarray(v["logp"][0])
    if lp0.ndim != 2 or adv_tau or adv_kl:
        return None
    fn, _, use_kl, beta, kl_kw = _policy_parts(mask, ref_logp, loss, beta, kl_kind, kl_clamp,
                                               agg, kl_weight, kl_anchor)
    P = len(v["logp"])
    rows = lambda a: None if a is None else np.concatenate([np.asarray(a)] * P)  # noqa: E731
    as_rows = lambda a: np.broadcast_to(a, (P,) + lp0.shape).reshape(P * lp0.shape[0], -1)  # noqa
    logp, old = as_rows(v["logp"]), as_rows(v["old_logp"])
    per_token = fn(logp, old, rows(advantages), rows(mask), **loss_kwargs)
    anchor = old if kl_anchor == "old" else rows(ref_logp)
    if anchor is not None:
        kl = kl_term(logp, old, anchor, rows(mask), **kl_kw)
        if use_kl:
            with np.errstate(over="ignore", invalid="ignore"):
                per_token = per_token + beta * kl
    per_token = per_token.reshape((P,) + lp0.shape)
    m = np.asarray(mask).astype(bool)
    if not np.isfinite(per_token[:, m]).all():
        lps, olds = logp.reshape(per_token.shape), old.reshape(per_token.shape)
        for pt, lp, o in zip(per_token, lps, olds):         # the public function's message
            _finite_objective(pt, lp, o, advantages, mask, ref_logp)
    _, w = _weights(per_token[0], mask, agg, norm, empty_rows, group_size, group_ids)
    return _sum_weighted(w, per_token, m)


def _kl_estimator_moments(v, ref_logits, kind):
    _, _, logref, _, q, kind = _parts(v["logits"][0], ref_logits, kind)     # validates
    z = _finite(v["logits"], None)
    if z is None:
        return None
    logp = _log_softmax(z)
    moments = _moments(logp, logref, np.exp(logp), q, kind)
    return [{key: float(m[i]) for key, m in moments.items()} for i in range(len(z))]


def _gmpo_loss(v, old_logp, advantages, mask=None, clip_low=0.2, clip_high=None, eps=0.0):
    """The per-sequence terms are independent across rows: the points are stacked as rows of
    one batch for them, and the mean over sequences is taken per point."""
    lp0 = np.asarray(v["logp"][0])
    m = np.ones(lp0.shape, bool) if mask is None else np.asarray(mask).astype(bool)
    if lp0.ndim != 2 or _finite(v["logp"], m) is None:
        return None
    P, B = len(v["logp"]), lp0.shape[0]
    rows = lambda a: None if a is None else np.concatenate([np.asarray(a)] * P)  # noqa: E731
    a_bar, e, _, _, _ = _gmpo_parts(np.asarray(v["logp"]).reshape((P * B,) + lp0.shape[1:]),
                                    rows(old_logp), rows(advantages), rows(mask), clip_low,
                                    clip_high, eps)
    return [np.float64(t) for t in (-a_bar * e).reshape(P, B).sum(axis=1) / max(B, 1)]


def _kl_cov_loss(v, old_logp, advantages, mask=None, ratio=2e-4, coef=0.1):
    """The covariance selection spans the batch: it is taken per point, with a leading axis."""
    _, old, adv, m, _, coef = _kl_cov_parts(v["logp"][0], old_logp, advantages, mask, ratio,
                                            coef)                                   # validates
    LP = _finite(np.asarray(v["logp"]).reshape((len(v["logp"]),) + m.shape), m)
    if LP is None:
        return None
    LP = np.where(m, LP, 0.0)
    chosen = kl_cov_selection(LP, adv, m, ratio)
    with np.errstate(over="ignore"):
        loss = -adv * ar.capped_exp(LP - old) + coef * np.abs(LP - old) * chosen
    shape = np.shape(v["logp"][0])
    return [x.reshape(shape) for x in np.where(m, loss, 0.0)]


def _grouped_rows(rewards, group_size, group_ids, P):
    """Group ids that keep P stacked copies of a batch's groups apart."""
    _, _, gid, *_ = _group_inputs(rewards, group_size, group_ids, 0, 0.0, "none", "mean", None,
                                  "keep")
    G = int(gid.max(initial=-1)) + 1
    return np.concatenate([gid + p * G for p in range(P)])


def _gpg_advantages(v, group_size=None, group_ids=None, f_norm=1.0):
    R = _finite(v["rewards"], None)
    if R is None or R.shape[1] == 0:
        return None
    _, gid, counts, f_norm = _gpg_parts(R[0], group_size, group_ids, f_norm)     # validates
    return list(gpg_alpha(R) / f_norm * group_centred(R, gid, counts))


def _whitened_group_advantages(v, mask, group_size=None, group_ids=None, scale="none",
                               eps=1e-6, whiten_eps=1e-8):
    """The group advantages of all points as the groups of one stacked batch, then the
    whitening of every point with a leading axis."""
    R = _finite(v["rewards"], None)
    if R is None or R.shape[1] == 0:
        return None
    m, _, group, whitening = _whitened_parts(R[0], mask, group_size, group_ids, scale, eps,
                                             whiten_eps)                            # validates
    P, B = R.shape
    a = group_advantages(R.reshape(-1), group_ids=_grouped_rows(R[0], group_size, group_ids, P),
                         **{k: val for k, val in group.items()
                            if k not in ("group_size", "group_ids")}).reshape(P, B)
    X = np.where(m, a[:, :, None], 0.0)
    xs, m, ddof, w_eps, eps_mode = _whiten_inputs(X[0], m, whitening["ddof"], whitening["eps"],
                                                  whitening["eps_mode"], True, False)
    Y = _whiten_values(X, m, ddof, w_eps, eps_mode, True, False)
    return list(np.where(m, Y, 0.0))


# name: (many points, the public function that raises for a point that is not finite)
def _shaped_advantages(v, old_logp, advantages, mask, ref_logp=None, tau=0.0, kl_coef=0.0):
    _, old, adv, m, _ = _shaping_inputs(v["logp"][0], old_logp, advantages, mask, ref_logp, tau,
                                        kl_coef)                              # validates
    lp = _finite(v["logp"], m)
    if lp is None:
        return None
    tau, c = args.shaped_advantages(ref_logp, tau, kl_coef)
    return list(_shaped_values(lp, old, adv, m, ref_logp, tau, c))


EVALUATORS = {"aggregate": (_aggregate, aggregate), "approx_kl": (_approx_kl, approx_kl),
              "whiten": (_whiten, whiten), "policy_objective": (_policy_objective,
                                                                 policy_objective),
              "kl_estimator_moments": (_kl_estimator_moments, kl_estimator_moments),
              "gmpo_loss": (_gmpo_loss, gmpo_loss), "kl_cov_loss": (_kl_cov_loss, kl_cov_loss),
              "gpg_advantages": (_gpg_advantages, gpg_advantages),
              "whitened_group_advantages": (_whitened_group_advantages,
                                            whitened_group_advantages),
              "shaped_advantages": (_shaped_advantages, shaped_advantages)}
# the arrays that differ between points (the rest are shared)
VARYING = {"aggregate": ("loss",), "approx_kl": ("logp",), "whiten": ("x",),
           "policy_objective": ("logp", "old_logp"), "kl_estimator_moments": ("logits",),
           "gmpo_loss": ("logp",), "kl_cov_loss": ("logp",), "gpg_advantages": ("rewards",),
           "whitened_group_advantages": ("rewards",), "shaped_advantages": ("logp",)}


def evaluate(name, shared, varying, params):
    """The value of ref_numpy.<name> at each point (see the module docstring)."""
    fast, one = EVALUATORS[name]
    moving = {k: varying[k] if k in varying else np.broadcast_to(
        shared[k], (len(next(iter(varying.values()))),) + np.shape(shared[k]))
        for k in VARYING[name]}
    rest = {k: val for k, val in shared.items() if k not in VARYING[name]}
    out = fast(moving, **rest, **params)
    if out is None:        # a point not finite where valid, or a 1-D case: one by one
        P = len(next(iter(moving.values())))
        return [one(**rest, **{k: val[p] for k, val in moving.items()}, **params)
                for p in range(P)]
    return out


# ------------------------------------------------------------------ many cotangents
def _whiten_vjps(gs, x, mask=None, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True,
                 restore_mean=False):
    xs, m, ddof, eps, eps_mode = _whiten_inputs(x, mask, ddof, eps, eps_mode, shift_mean,
                                                restore_mean)                     # validates
    whiten_vjp(gs[0], x, mask, ddof=ddof, eps=eps, eps_mode=eps_mode, shift_mean=shift_mean,
               restore_mean=restore_mean)                        # and checks the cotangent
    g = np.stack([np.asarray(gi, dtype=np.float64) for gi in gs])
    rows = _whiten_vjp_values(np.where(m, g, 0.0), xs, m, ddof, eps, eps_mode, shift_mean,
                              restore_mean)
    return [{"x": r} for r in rows]


def _gpg_vjps(gs, rewards, group_size=None, group_ids=None, f_norm=1.0):
    r, gid, counts, f_norm = _gpg_parts(rewards, group_size, group_ids, f_norm)
    G = np.stack([np.asarray(g, dtype=np.float64) for g in gs])
    return [{"rewards": row} for row in gpg_alpha(r) / f_norm * group_centred(G, gid, counts)]


def _whitened_group_advantages_vjps(gs, rewards, mask, group_size=None, group_ids=None,
                                    scale="none", eps=1e-6, whiten_eps=1e-8):
    """whiten's VJP with a leading cotangent axis, the token sums, then group_advantages' VJP
    of every cotangent as the groups of one stacked batch."""
    m, X, group, whitening = _whitened_parts(rewards, mask, group_size, group_ids, scale, eps,
                                             whiten_eps)                            # validates
    xs, m, ddof, w_eps, eps_mode = _whiten_inputs(X, m, whitening["ddof"], whitening["eps"],
                                                  whitening["eps_mode"], True, False)
    G = np.stack([np.where(m, np.asarray(g, dtype=np.float64), 0.0) for g in gs])
    gX = _whiten_vjp_values(G, xs, m, ddof, w_eps, eps_mode, True, False)
    ga = np.where(m, gX, 0.0).sum(axis=-1)                                          # [K, B]
    K, B = ga.shape
    rest = {k: val for k, val in group.items() if k not in ("group_size", "group_ids")}
    gr = group_advantages_vjp(ga.reshape(-1), np.tile(np.asarray(rewards, dtype=np.float64), K),
                              group_ids=_grouped_rows(rewards, group_size, group_ids, K),
                              **rest)["rewards"]
    return [{"rewards": r} for r in gr.reshape(K, B)]


def _kl_estimator_moments_vjps(gs, logits, ref_logits, kind):
    """The six moment gradients once, combined per cotangent."""
    parts = _moment_gradients(logits, ref_logits, kind)                            # validates
    return [moments_vjp_of(parts, args.moment_cotangent(g)) for g in gs]


def _kl_cov_loss_vjps(gs, logp, old_logp, advantages, mask=None, ratio=2e-4, coef=0.1):
    """The per-token derivative once (the selection is fixed), times each cotangent."""
    kl_cov_loss_vjp(gs[0], logp, old_logp, advantages, mask, ratio=ratio, coef=coef)  # checks
    lp, old, adv, m, chosen, coef = _kl_cov_parts(logp, old_logp, advantages, mask, ratio, coef)
    d = kl_cov_slope(lp, old, adv, chosen, coef)
    shape = np.shape(logp)
    return [{"logp": np.where(m, np.where(m, np.asarray(g, dtype=np.float64).reshape(m.shape),
                                          0.0) * d, 0.0).reshape(shape)} for g in gs]


def _shaped_advantages_vjps(gs, logp, old_logp, advantages, mask, ref_logp=None, tau=0.0,
                            kl_coef=0.0):
    _, _, _, m, _ = _shaping_inputs(logp, old_logp, advantages, mask, ref_logp, tau, kl_coef)
    shaped_advantages_vjp(gs[0], logp, old_logp, advantages, mask, ref_logp, tau=tau,
                          kl_coef=kl_coef)                       # validates, and the cotangent
    tau, c = args.shaped_advantages(ref_logp, tau, kl_coef)
    gm = np.where(m, np.stack([np.asarray(gi, dtype=np.float64) for gi in gs]), 0.0)
    return [{"logp": row} for row in _shaped_vjp_values(gm, m, tau, c)]


VJPS = {"whiten_vjp": _whiten_vjps, "kl_cov_loss_vjp": _kl_cov_loss_vjps, "kl_estimator_moments_vjp": _kl_estimator_moments_vjps, "gpg_advantages_vjp": _gpg_vjps,
        "whitened_group_advantages_vjp": _whitened_group_advantages_vjps,
        "shaped_advantages_vjp": _shaped_advantages_vjps}


def vjps(name, cotangents, arrays, params):
    """ref_numpy.<name> (a hand VJP) at many cotangents for the same inputs: the rows of a
    Jacobian, in one call. Supported: the names in `VJPS`."""
    return VJPS[name](cotangents, **arrays, **params)
