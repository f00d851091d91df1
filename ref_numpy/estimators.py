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

from ._arrays import OPS
from .kl import k_estimator


def _log_softmax(z):
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def _k(kind, logp, logref):
    """The estimator at every category x and its derivative wrt log π(x): k(u) at
    u = log ref − log π, and ∂k/∂log π = −k'(u)."""
    k, dk = k_estimator(kind, logref - logp)
    return k, -dk


def _parts(logits, ref_logits, kind):
    a = args.kl_estimator_moments(OPS, logits, ref_logits, kind)
    logp, logref = _log_softmax(a.logits), _log_softmax(a.ref_logits)
    return a.logits, logp, logref, np.exp(logp), np.exp(logref), a.kind


def _grad_expectation(p, c):
    """∇_logits Σ_x π(x)·h(log π(x)) given c = h + h' per category: π ⊙ (c − Σ π c)."""
    return p * (c - (p * c).sum())


def kl_estimator_moments(logits, ref_logits, *, kind):
    """Exact moments of a KL estimator under x ~ π.

        kl_forward = KL(π‖ref) = Σ π log(π/ref)      kl_reverse = KL(ref‖π) = Σ ref log(ref/π)
        mean = E_π[k],  bias = mean − kl_forward,  var = E_π[(k − mean)²]

    Reference: Schulman (2020): E_π[k1] = E_π[k3] = KL(π‖ref) (unbiased); k2 is biased.
    Note: k3 ≥ 0, and its variance is small only while π and ref are close; far apart it can
    exceed k1's (the ratio ref/π inside k3 is unbounded).

    Worked example (the seed's p = [.5, .3, .15, .05], q = [.4, .4, .15, .05]):
    KL(p‖q) = 0.025267; Var k1 = 0.049086, Var k3 = 0.000255.

    Args:
      logits: [V] float. Policy π = softmax(logits).
      ref_logits: [V] float. Reference = softmax(ref_logits).
      kind: "k1" | "k2" | "k3".

    Returns:
      dict kl_forward, kl_reverse, mean, bias, var: float64 scalars.
    """
    z, logp, logref, p, q, kind = _parts(logits, ref_logits, kind)
    k, _ = _k(kind, logp, logref)
    kl_f = float((p * (logp - logref)).sum())
    mean = float((p * k).sum())
    return {"kl_forward": kl_f, "kl_reverse": float((q * (logref - logp)).sum()), "mean": mean,
            "bias": mean - kl_f, "var": float((p * (k - mean) ** 2).sum())}


def kl_estimator_moments_vjp(g, logits, ref_logits, *, kind):
    """VJP of `kl_estimator_moments` wrt logits (g: a dict with the five keys, floats).

    Gradient:
      One rule covers every expectation under π: for F = Σ_x π(x)·h(ℓ_x), ℓ = log π,
      ∂π(x)/∂θ_j = π(x)(δ_xj − π_j) and ∂ℓ_x/∂θ_j = δ_xj − π_j, so
          ∂F/∂θ_j = Σ_x π(x)(δ_xj − π_j)(h + h')(ℓ_x) = π_j c_j − π_j Σ_x π(x) c_x,  c = h + h'.
      kl_forward: h = ℓ − ℓ_ref, h' = 1:   ∇ = π ⊙ (ℓ − ℓ_ref − KL(π‖ref))
      kl_reverse = Σ ref(ℓ_ref − ℓ):        ∇ = −Σ_x ref(x)(e_x − π) = π − ref
      mean: h = k, h' = k' (k1' = 1, k2' = −u, k3' = 1 − e^u, with u = ℓ_ref − ℓ)
      var = E[k²] − mean²: h = k², h' = 2k·k', minus 2·mean·∇mean;  bias = mean − kl_forward.

    Returns:
      {"logits": [V]} float64.
    """
    z, logp, logref, p, q, kind = _parts(logits, ref_logits, kind)
    args.moment_cotangent(g)
    k, dk = _k(kind, logp, logref)
    kl_f = (p * (logp - logref)).sum()
    mean = (p * k).sum()
    d_kl_f = p * (logp - logref - kl_f)
    d_kl_r = p - q
    d_mean = _grad_expectation(p, k + dk)
    d_var = _grad_expectation(p, k ** 2 + 2 * k * dk) - 2 * mean * d_mean
    total = (g["kl_forward"] * d_kl_f + g["kl_reverse"] * d_kl_r + g["mean"] * d_mean +
             g["bias"] * (d_mean - d_kl_f) + g["var"] * d_var)
    return {"logits": total}


def _gradient_inputs(logits, ref_logits, kind, use, sample_logits, is_weight):
    a = args.kl_estimator_gradient(OPS, logits, ref_logits, kind, use, sample_logits, is_weight)
    logp, logref = _log_softmax(a.logits), _log_softmax(a.ref_logits)
    p, q = np.exp(logp), np.exp(logref)
    mu = p if a.sample_logits is None else np.exp(_log_softmax(a.sample_logits))
    return a.logits, logp, logref, p, q, a.kind, a.use, a.is_weight, mu


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
    """
    z, logp, logref, p, q, kind, use, is_weight, mu = _gradient_inputs(
        logits, ref_logits, kind, use, sample_logits, is_weight)
    k, dk = _k(kind, logp, logref)
    W = np.ones_like(p) if is_weight is None else p / mu
    attached = 1.0 if is_weight == "attached" else 0.0
    if use == "loss":
        c = W * (dk + k * attached)
    else:
        c = W * k * (1.0 + logp * attached)
    kl_f = (p * (logp - logref)).sum()
    return {"expected": mu * c - p * (mu * c).sum(),
            "grad_kl_forward": p * (logp - logref - kl_f),
            "grad_kl_reverse": p - q}
