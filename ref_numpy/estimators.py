"""Exact analysis of the KL estimators k1, k2, k3 over one categorical policy.

π = softmax(logits) [V] and ref = softmax(ref_logits) [V]; samples x ~ π (or ~ μ, another
policy) are enumerated exactly, so every mean, variance and expected gradient is exact: no
Monte-Carlo noise, which is what lets a test say *which divergence* an estimator follows.

With u(x) = log ref(x) − log π(x) (so r = e^u = ref/π):
    k1 = −u,   k2 = ½u²,   k3 = e^u − 1 − u
Reference: J. Schulman, "Approximating KL Divergence" (2020); Y. Tang and R. Munos, "On a few
pitfalls in KL divergence gradient estimation for RL", arXiv:2506.09477.
"""
import numpy as np

from ref_common import args

from . import _arrays as ar
from ._arrays import OPS
from .kl import k_estimator


def _log_softmax(z):
    """log softmax over the last axis (leading axes: many distributions, ref_numpy.many)."""
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _k(kind, logp, logref):
    """The estimator at every category x and its derivative wrt log π(x): k(u) at
    u = log ref − log π, and ∂k/∂log π = −k'(u)."""
    with np.errstate(over="ignore"):          # ½u² of a peaked π: `_terms` takes it from there
        k, dk = k_estimator(kind, logref - logp)
    return k, -dk


# ½u² leaves the float range for |u| above this (k2's overflow)
_LOG_K2_LIMIT = 0.5 * (np.log(2.0) + np.log(np.finfo(np.float64).max))


def _dominant(kind, u):
    """Where k(u) leaves the float range, the log of its size written as n·u + rest.

    k3 = e^u − 1 − u for u > log(max float): e^u, n = 1, rest = 0 (the other terms are below
    e^−u·(1 + u) < 1e-305 of it); k2 = ½u² for |u| > sqrt(2·max): n = 0, rest = 2·log|u| − log 2
    (−u and the mean are below 1e-153 of it); k1 = −u never leaves it for finite logits.
    Every factor built from k (k − c, k + 2·∂k, and for k3 ∂k = 1 − e^u) has the same dominant
    term at those categories, with its own sign.
    Returns (big: bool [V], n, rest [V]).
    """
    if kind == "k3":
        return u > ar.LOG_FLOAT_MAX, 1, np.zeros_like(u)
    if kind == "k2":
        with np.errstate(divide="ignore"):
            log_u = np.log(np.abs(u))
        return log_u > _LOG_K2_LIMIT, 0, 2.0 * log_u - np.log(2.0)
    return np.zeros(u.shape, bool), 0, np.zeros_like(u)


def _log_terms(log_mass, logp, logref, kind, factors):
    """log|mass(x)·Π f(x)| and its sign at every category, formed in log space (see `_terms`):
    log mass + Σ log|f|, with a factor that overflowed through k's dominant term contributing
    n·u + rest (`_dominant`), and n·u added as (log mass − n·log π) + n·log ref.
    Returns (log_abs [V], sign [V])."""
    big, n_big, rest_big = _dominant(kind, logref - logp)
    n, rest, sign = 0, np.zeros_like(logp), np.ones_like(logp)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for value, from_k in factors:
            sign = sign * np.sign(value)
            log_value = np.log(np.abs(value))
            if from_k:
                n = n + np.where(big, n_big, 0)
                rest = rest + np.where(big, rest_big, log_value)
            else:
                rest = rest + log_value
        return (log_mass - n * logp) + n * logref + rest, sign


def _terms(direct, log_mass, logp, logref, kind, factors):
    """Per-category products mass(x)·Π f(x), summable, for a peaked π too.

    `direct` is mass·Π f evaluated directly; it is returned unchanged wherever it is finite and
    no factor left the float range. Elsewhere (a category π almost never takes, where ref/π or
    u² overflows, and the direct product is 0·inf, or capped) the product is evaluated in log
    space (`_log_terms`): exp(log mass + Σ log|f|)·Π sign f. Since u = log ref − log π, the
    n·u part is added as (log mass − n·log π) + n·log ref: for mass = π and n = 1 this is
    exactly log ref, so π·e^u is ref, never ref·e^(rounding of a huge u) or 0·inf. A category
    with π(x) = 0 in float64 thereby contributes exactly what the limit gives: 0 for every
    polynomial in u, ref(x) for π·e^u, and an overflow (inf, the true size) for π·e^(2u).

    factors: (value, from_k) pairs; from_k says the factor overflows where k does, and its
    value carries the factor's true sign there.
    Returns (terms [V], fine: where `direct` was kept).
    """
    big = _dominant(kind, logref - logp)[0]
    fine = np.isfinite(direct) & ~big
    if fine.all():
        return direct, fine
    log_abs, sign = _log_terms(log_mass, logp, logref, kind, factors)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(fine, direct, sign * np.exp(log_abs)), fine


def _log_of(direct, fine, log_mass, logp, logref, kind, factors):
    """(log|term|, sign) of every term that `_terms` returns, without its overflow: the log of
    the direct product where it was kept, the log-space form elsewhere."""
    log_abs, sign = _log_terms(log_mass, logp, logref, kind, factors)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.where(fine, np.log(np.abs(direct)), log_abs),
                np.where(fine, np.sign(direct), sign))


def _logsumexp(log_abs, axis=-1):
    """log Σ e^(log_abs) over `axis` (−inf for an all −inf row)."""
    top = np.max(log_abs, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(log_abs - top).sum(axis=axis)) + np.squeeze(top, axis)


def _estimator_terms(kind, logp, logref):
    """k, ∂k/∂log π and the per-category factors a gradient of E[k] and E[k²] needs:
    k + ∂k (−u exactly for k3, where the two cancel), ∂k itself, and k + 2·∂k, each as a
    (value, from_k) factor for `_terms`.

    For k3, k + 2·∂k = e^u − 1 − u + 2(1 − e^u) = −expm1(u) − u: both terms have one sign
    (u and expm1(u) share theirs), so nothing cancels, and where e^u leaves the float range
    the factor is −inf, negative as the true one is (k_estimator's ∂k is 0 there, so
    k + 2·∂k as written would be +inf).
    """
    k, dk = _k(kind, logp, logref)
    u = logref - logp
    slope = (-u, False) if kind == "k3" else (k + dk, kind == "k2")
    # ∂k3/∂log π = 1 − e^u keeps its sign (−) where u is past the cap (k_estimator's is 0 there)
    d = (-np.expm1(np.minimum(u, ar.LOG_FLOAT_MAX)), True) if kind == "k3" else (dk, False)
    with np.errstate(over="ignore"):
        twice = (-np.expm1(u) - u, True) if kind == "k3" else (k + 2 * dk, kind == "k2")
    return k, dk, slope, d, twice


def _parts(logits, ref_logits, kind):
    a = args.kl_estimator_moments(OPS, logits, ref_logits, kind)
    logp, logref = _log_softmax(a.logits), _log_softmax(a.ref_logits)
    return a.logits, logp, logref, np.exp(logp), np.exp(logref), a.kind


def _grad_expectation(p, c, pc, fine):
    """∇_logits Σ_x π(x)·h(log π(x)) given c = h + h' per category and its terms pc = π ⊙ c
    (`_terms`, finite where `fine`): π ⊙ (c − Σ π c), written π ⊙ c − π·Σ π c where c left the
    float range."""
    s = pc.sum()
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(fine, p * (c - s), pc - p * s)


def kl_estimator_moments(logits, ref_logits, *, kind):
    """Exact moments of a KL estimator under x ~ π.

        kl_forward = KL(π‖ref) = Σ π log(π/ref)      kl_reverse = KL(ref‖π) = Σ ref log(ref/π)
        mean = E_π[k],  bias = mean − kl_forward,  var = E_π[(k − mean)²],  log_var = log var

    Reference: Schulman (2020): E_π[k1] = E_π[k3] = KL(π‖ref) (unbiased); k2 is biased.
    Note: k3 ≥ 0, and its variance is small only while π and ref are close; far apart it can
    exceed k1's (the ratio ref/π inside k3 is unbounded).

    log_var is formed in log space (a log-sum-exp of log π + 2·log|k − mean|), so it is finite
    where var is beyond float64: a peaked π with π(x) ≈ 0 where ref(x) is not gives
    var ≈ Σ ref²/π (k3), e.g. logits [0, 800, 0, 0] against uniform ref: var = inf,
    log_var = 800 + log(3/16) = 798.326. It is the log of the same per-category terms as var,
    so where those underflow (a point-mass π against a far ref, e.g. k1 with logits
    [0, 800, 0, 0]: var ≈ 3·800²·e^−800) var is 0 and log_var is −inf, below float64's reach.

    Worked example (the seed's p = [.5, .3, .15, .05], q = [.4, .4, .15, .05]):
    KL(p‖q) = 0.025267; Var k1 = 0.049086, Var k3 = 0.000255.

    Args:
      logits: [V] float. Policy π = softmax(logits).
      ref_logits: [V] float. Reference = softmax(ref_logits).
      kind: "k1" | "k2" | "k3".

    Returns:
      dict kl_forward, kl_reverse, mean, bias, var, log_var: float64 scalars.
    """
    z, logp, logref, p, q, kind = _parts(logits, ref_logits, kind)
    return {key: float(v) for key, v in _moments(logp, logref, p, q, kind).items()}


def _moments(logp, logref, p, q, kind):
    """The six moments over the last axis (leading axes: many policies, ref_numpy.many)."""
    k, _ = _k(kind, logp, logref)
    kl_f = (p * (logp - logref)).sum(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):   # direct products `_terms` replaces
        mean = _terms(p * k, logp, logp, logref, kind, [(k, True)])[0].sum(axis=-1)
        dev = k - mean[..., None]
        factors = [(dev, True), (dev, True)]
        direct = p * dev ** 2
        var, fine = _terms(direct, logp, logp, logref, kind, factors)
        log_var = _logsumexp(_log_of(direct, fine, logp, logp, logref, kind, factors)[0])
    return {"kl_forward": kl_f, "kl_reverse": (q * (logref - logp)).sum(axis=-1), "mean": mean,
            "bias": mean - kl_f, "var": var.sum(axis=-1), "log_var": log_var}


def kl_estimator_moments_vjp(g, logits, ref_logits, *, kind):
    """VJP of `kl_estimator_moments` wrt logits (g: a dict of floats by output key; a key left
    out is 0, an unknown key a ValueError).

    Gradient:
      One rule covers every expectation under π: for F = Σ_x π(x)·h(ℓ_x), ℓ = log π,
      ∂π(x)/∂θ_j = π(x)(δ_xj − π_j) and ∂ℓ_x/∂θ_j = δ_xj − π_j, so
          ∂F/∂θ_j = Σ_x π(x)(δ_xj − π_j)(h + h')(ℓ_x) = π_j c_j − π_j Σ_x π(x) c_x,  c = h + h'.
      kl_forward: h = ℓ − ℓ_ref, h' = 1:   ∇ = π ⊙ (ℓ − ℓ_ref − KL(π‖ref))
      kl_reverse = Σ ref(ℓ_ref − ℓ):        ∇ = −Σ_x ref(x)(e_x − π) = π − ref
      mean: h = k, h' = k' (k1' = 1, k2' = −u, k3' = 1 − e^u, with u = ℓ_ref − ℓ)
      var = E[k²] − mean²: h = k², h' = 2k·k', minus 2·mean·∇mean;  bias = mean − kl_forward.
        c = k² + 2k·k' = k·(k + 2k'); for k3, k + 2k' = −expm1(u) − u < 0 wherever u > 0, so
        where π(x) ≈ 0 its term π·c ≈ −ref²/π is large and negative.
      log_var: ∇var / var. Where var is beyond float64 every term of ∇var is divided by var in
        log space before the sum (`_var_gradient_over_var`); ∇var is then that times var, ±inf
        with its true sign. At var = 0, log_var = −inf has no gradient: a nonzero cotangent
        on it is refused (ValueError).

    Returns:
      {"logits": [V]} float64.
    """
    g = args.moment_cotangent(g)
    return moments_vjp_of(_moment_gradients(logits, ref_logits, kind), g)


def moments_vjp_of(parts, g):
    """Σ_key g[key]·∇key from the six gradients `parts` (one cotangent)."""
    total = np.zeros_like(parts["mean"])
    for key, d in parts.items():      # a zero cotangent adds nothing, even to an overflowed var
        if g[key] != 0:
            args.log_var_gradient(d is not None)
            total = total + g[key] * d
    return {"logits": total}


def _moment_gradients(logits, ref_logits, kind):
    """The gradient of each of the six moments wrt logits (see kl_estimator_moments_vjp);
    log_var's is None where var = 0 (log_var = −inf has none)."""
    z, logp, logref, p, q, kind = _parts(logits, ref_logits, kind)
    k, dk, slope, _, twice = _estimator_terms(kind, logp, logref)
    kl_f = (p * (logp - logref)).sum()
    d_kl_f = p * (logp - logref - kl_f)
    d_kl_r = p - q
    log_var = _moments(logp, logref, p, q, kind)["log_var"]
    with np.errstate(over="ignore", invalid="ignore"):   # direct products `_terms` replaces
        mean = _terms(p * k, logp, logp, logref, kind, [(k, True)])[0].sum()
        c = k + dk
        d_mean = _grad_expectation(p, c, *_terms(p * c, logp, logp, logref, kind, [slope]))
        c2 = k ** 2 + 2 * k * dk
        factors = [(k, True), twice]
        pc2, fine = _terms(p * c2, logp, logp, logref, kind, factors)
        d_var = _grad_expectation(p, c2, pc2, fine) - 2 * mean * d_mean
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d_log_var = d_var / np.exp(log_var)
    if not np.isfinite(d_var).all() and np.isfinite(log_var):
        d_log_var = _var_gradient_over_var(p * c2, fine, logp, logref, kind, factors, p, mean,
                                           d_mean, log_var)
        with np.errstate(over="ignore"):
            d_var = np.sign(d_log_var) * np.exp(np.log(np.abs(d_log_var)) + log_var)
    d_kl_f, d_kl_r, d_mean, d_var, d_log_var = (
        _sums_to_zero(d, p) for d in (d_kl_f, d_kl_r, d_mean, d_var, d_log_var))
    return {"kl_forward": d_kl_f, "kl_reverse": d_kl_r, "mean": d_mean,
            "bias": d_mean - d_kl_f, "var": d_var,
            "log_var": d_log_var if np.isfinite(log_var) else None}


def _sums_to_zero(d, p):
    """A gradient wrt logits of a function of softmax(logits) sums to 0 (adding a constant to
    every logit changes nothing), so its entry at the most likely category is minus the sum of
    the others. Each other entry is π_j·(c_j − Σπc), accurate to rounding; the direct entry
    π_m·(c_m − Σπc) is a difference of two nearly equal numbers when π_m ≈ 1, and at a point
    mass it is their rounding (its true size can be e^−800). Where d is not finite it is
    returned as it is."""
    if not np.isfinite(d).all():
        return d
    m = int(np.argmax(p))
    d = d.copy()
    d[m] = -(np.sum(np.delete(d, m)))
    return d


def _var_gradient_over_var(direct, fine, logp, logref, kind, factors, p, mean, d_mean,
                           log_var):
    """∇var / var = ∇log var, for a var beyond float64 (a peaked π).

    ∇var_j = π_j c2_j − π_j Σ_x π(x)c2(x) − 2·mean·∇mean_j (c2 = k² + 2k·∂k, see the VJP).
    Every term is divided by var before it is formed: π c2 / var = ±exp(log|π c2| − log var),
    so each is a number of order one and the sum keeps its sign, where the terms themselves
    are ±inf and their difference inf − inf.
    """
    log_abs, sign = _log_of(direct, fine, logp, logp, logref, kind, factors)
    scaled = sign * np.exp(log_abs - log_var)
    return scaled - p * scaled.sum() - 2 * mean * d_mean * np.exp(-log_var)


def _gradient_inputs(logits, ref_logits, kind, use, sample_logits, is_weight):
    a = args.kl_estimator_gradient(OPS, logits, ref_logits, kind, use, sample_logits, is_weight)
    logp, logref = _log_softmax(a.logits), _log_softmax(a.ref_logits)
    p, q = np.exp(logp), np.exp(logref)
    log_mu = logp if a.sample_logits is None else _log_softmax(a.sample_logits)
    mu = p if a.sample_logits is None else np.exp(log_mu)
    return a.logits, logp, logref, p, q, a.kind, a.use, a.is_weight, mu, log_mu


def kl_estimator_gradient(logits, ref_logits, *, kind, use="loss", sample_logits=None,
                          is_weight=None):
    """The exact expected gradient wrt logits of a trainer's KL term, beside the true ones.

    Samples x ~ μ (μ = π by default; `sample_logits` gives another, behaviour policy). Per sample
    the trainer back-propagates S(x), and the expectation E_μ[∇S] is returned as `expected`:
        use="loss":    S = W·k(x)                  (the estimator differentiated as a loss)
        use="reward":  S = W·sg(k(x))·log π(x)     (REINFORCE with k as a detached reward)
        W = 1 (is_weight=None), π(x)/μ(x) ("attached"), sg(π(x)/μ(x)) ("detached").

    Reference: Tang and Munos, arXiv:2506.09477 (on-policy: k1-as-loss has zero expected
    gradient, k2-as-loss gives ∇KL(π‖ref), k3-as-loss gives ∇KL(ref‖π)).
    Note: which one a trainer follows is decided by `expected` vs `grad_kl_forward` /
    `grad_kl_reverse`, not by the estimator's value: k3 is an unbiased *value* of KL(π‖ref) but
    its *gradient* as a loss is the reverse KL's.

    Args:
      logits, ref_logits: [V] float.
      kind: "k1" | "k2" | "k3".
      use: "loss" | "reward".
      sample_logits: [V] float or None (samples from π itself).
      is_weight: None | "attached" | "detached".

    Returns:
      dict expected, grad_kl_forward (∇KL(π‖ref)), grad_kl_reverse (∇KL(ref‖π)): [V] float64.

    Gradient:
      (the hand derivation of `expected`; autograd and finite differences check it)
      ∇_θ log π(x) = e_x − π, so every per-sample gradient is c(x)·(e_x − π) for a scalar c(x):
        loss:   ∇(W·k) = W·k'·(e_x − π) + k·∇W,   ∇W = W·(e_x − π) if attached, else 0
                c = W·(k' + k·[attached])
        reward: ∇(W·k·ℓ_x) = W·k·(e_x − π) + k·ℓ_x·∇W
                c = W·k·(1 + ℓ_x·[attached])
      and E_μ[c(x)(e_x − π)] = μ ⊙ c − π·Σ_x μ(x)c(x).
      On-policy, no weight, loss: k1' = 1 gives c = 1 and μ − π = 0 (zero gradient);
      k3' = 1 − ref/π gives π ⊙ c = π − ref = ∇KL(ref‖π).
      Peaked π: each μ(x)·c(x) is formed in log space where it would be 0·inf (`_terms`), so
      π(x)·e^u is ref(x) even where π(x) is 0 in float64. Sampling from μ ≠ π without weights
      where π(x) ≈ 0 makes μ·k itself overflow: that is refused (ValueError), not returned as
      NaN.
    """
    z, logp, logref, p, q, kind, use, is_weight, mu, log_mu = _gradient_inputs(
        logits, ref_logits, kind, use, sample_logits, is_weight)
    k, dk, slope, d, _ = _estimator_terms(kind, logp, logref)
    W = np.ones_like(p) if is_weight is None else p / mu
    attached = 1.0 if is_weight == "attached" else 0.0
    log_mass = log_mu if is_weight is None else logp     # μ·W is π when weighted, exactly
    with np.errstate(over="ignore", invalid="ignore"):
        mu_k, _ = _terms(mu * W * k, log_mass, logp, logref, kind, [(k, True)])
        bad = ~np.isfinite(mu_k)
        args.estimator_overflow(int(np.argmax(bad)) if bad.any() else None)
        if use == "loss":
            c = W * (dk + k * attached)
            factors = [slope if attached else d]
        else:
            c = W * k * (1.0 + logp * attached)
            factors = [(k, True), (1.0 + logp * attached, False)]
        mu_c, _ = _terms(mu * c, log_mass, logp, logref, kind, factors)
    kl_f = (p * (logp - logref)).sum()
    return {"expected": mu_c - p * mu_c.sum(),
            "grad_kl_forward": p * (logp - logref - kl_f),
            "grad_kl_reverse": p - q}
