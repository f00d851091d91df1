"""Per-token KL penalty estimators k1, k2, k3 and |·|, with optional clamps, and their VJP."""
import numpy as np

from ref_common import args

from . import _arrays as ar
from ._arrays import OPS


def k_estimator(kind: str, x: np.ndarray):
    """The per-sample KL estimators at x = log(q(y)/p(y)), y ~ p, and their derivative in x:

        k1 = −x,   k2 = ½x²,   k3 = e^x − 1 − x,   abs = |x|

    E_p[k1] = E_p[k3] = KL(p‖q). k3 uses expm1 (e^x − 1 without cancellation near 0) and
    saturates e^x at the largest float, where its derivative is taken as 0; |x| has derivative
    sign(x), 0 at 0. The one place in ref_numpy these formulas are written: `kl_penalty`,
    `approx_kl` and the exact analysis in `estimators` use it.
    """
    if kind == "k1":
        return -x, -np.ones_like(x)
    if kind == "k2":
        return 0.5 * x ** 2, x
    if kind == "k3":
        xs = np.minimum(x, ar.LOG_FLOAT_MAX)
        em1 = np.expm1(xs)
        return em1 - xs, em1 * (x <= ar.LOG_FLOAT_MAX)
    return np.abs(x), np.sign(x)


def weighted_slope(kind: str, x: np.ndarray) -> np.ndarray:
    """∂k/∂logp + k at x = log(ref/π) = ref_logp − logp (∂x/∂logp = −1): the gradient of a
    weighted KL term W·k with ∂W/∂logp = W (the ratio, or the score weight), divided by W.

    The two terms cancel, so it is written in closed form, never summed:
        k1: 1 − x        k2: −x + ½x² = x(½x − 1)
        k3: −(e^x − 1) + (e^x − 1 − x) = −x        abs: −sign(x) + |x|
    Summed in floats, k3's terms lose every digit of −x once e^x ≫ |x| (x = 40 gives −32,
    x ≥ 50 gives 0); k2's lose digits near its zero x = 2. Valid where no clamp binds and, for
    k3, below the exp cap (x ≤ LOG_FLOAT_MAX): there ∂k is 0 and the slope is k alone.
    """
    if kind == "k1":
        return 1.0 - x
    if kind == "k2":
        return x * (0.5 * x - 1.0)
    if kind == "k3":
        return -x
    return np.abs(x) - np.sign(x)


def _kl_parts(logp, ref_logp, mask, kind, clamp):
    a = args.kl_penalty(OPS, logp, ref_logp, mask, kind, clamp)
    m, in_b, out_b = a.mask, a.in_bound, a.out_bound
    x = ar.zero_masked(a.ref_logp, m) - ar.zero_masked(a.logp, m)   # x = log(ref/π) at the sample
    dx = np.ones_like(x)
    if in_b is not None:
        dx = (np.abs(x) <= in_b).astype(np.float64)
        x = np.clip(x, -in_b, in_b)
    k, dk = k_estimator(a.kind, x)
    free = dx                                  # 1 where no clamp binds
    if out_b is not None:
        free = free * (np.abs(k) <= out_b)
        dk = dk * (np.abs(k) <= out_b)
        k = np.clip(k, -out_b, out_b)
    return m, k, dk * dx, free


def unclamped(logp, ref_logp, mask=None, *, kind="k3", clamp=None):
    """1 where neither of kl_penalty's clamps binds (inclusive at their edges), else 0; 0 at
    masked positions."""
    m, _, _, free = _kl_parts(logp, ref_logp, mask, kind, clamp)
    return np.where(m, free, 0.0)


def kl_penalty(logp, ref_logp, mask=None, *, kind="k3", clamp=None):
    """Per-token estimators of KL(π‖ref) from a sample of π.

    With x = ref_logp − logp = log(ref(y)/π(y)) at the sampled token y ~ π:
        k1 = −x,   k2 = ½x²,   k3 = e^x − 1 − x,   abs = |x|

    Reference: J. Schulman, "Approximating KL Divergence" (2020), http://joschu.net/blog/kl-approx.html.
    Note: E_π[k1] = E_π[k3] = KL(π‖ref); k3 ≥ 0 always; k2 is biased (≈ KL to second order).
    Their *gradients* as losses differ: see `estimators.py` (Tang and Munos, arXiv:2506.09477).
    `clamp=(input_bound, output_bound)` clips x to ±input_bound before the estimator and the
    result to ±output_bound after it (verl k3: (20, 10); OpenRLHF: (None, 10) on every kind).
    k3 uses expm1 so that small x loses no digits, and caps e^x at the largest float.

    Worked example: logp = log 0.5, ref = log 0.4: x = −0.2231; k1 = 0.2231, k2 = 0.0249,
    k3 = 0.8 − 1 + 0.2231 = 0.0231.

    Args:
      logp: [B, T] float (or [T]). log π of the sampled tokens.
      ref_logp: [B, T] float. log π_ref of the same tokens.
      mask: [B, T] bool or 0/1, or None.
      kind: "k1" | "k2" | "k3" | "abs".
      clamp: None or (input_bound, output_bound), each None or > 0.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m, k, _, _ = _kl_parts(logp, ref_logp, mask, kind, clamp)
    return np.where(m, k, 0.0)


def kl_penalty_vjp(g, logp, ref_logp, mask=None, *, kind="k3", clamp=None):
    """VJP of `kl_penalty` wrt logp.

    Gradient:
      x = ref − logp, so ∂x/∂logp = −1 and ∂k/∂logp = −k'(x):
        k1: +1        k2: −x = logp − ref        k3: −(e^x − 1) = 1 − ref/π        abs: −sign(x)
      Each clamp multiplies by the indicator that it does not bind (inclusive at its edge, as
      torch.clamp passes the gradient there). At x = 0, |x| has gradient 0. Masked → 0.

    Returns:
      {"logp": [B, T]} float64.
    """
    m, _, dk, _ = _kl_parts(logp, ref_logp, mask, kind, clamp)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", logp)), m)
    return {"logp": np.where(m, -gm * dk, 0.0)}


def _approx_parts(logp, old_logp, mask, kind):
    a = args.approx_kl(OPS, logp, old_logp, mask, kind)
    u = ar.zero_masked(a.logp, a.mask) - ar.zero_masked(a.old_logp, a.mask)  # log(π/π_old), x ~ π_old
    return a.mask, u, a.kind, a.n_valid


def approx_kl(logp, old_logp, mask=None, *, kind="k1"):
    """The "approx KL" trainers log: a token-mean estimate of KL(π_old‖π) from the rollout.

    With u = logp − old_logp at tokens sampled from π_old:
        k1 = −u,   k2 = ½u²,   k3 = e^u − 1 − u,   approx_kl = Σ m·k / Σ m

    Reference: Schulman (2020). verl and OpenRLHF log k1 (`ppo_kl`), MiniMind and TRL PPO k2,
    CleanRL k3 (`approx_kl`); docs/conventions.md names the code.
    Note: k1 can average negative on a batch although KL ≥ 0; k3 cannot. This is kl_penalty
    with the roles of the two policies swapped (samples from π_old). 0 when no token is valid.

    Returns:
      float64 scalar.
    """
    m, u, kind, n = _approx_parts(logp, old_logp, mask, kind)
    k, _ = k_estimator(kind, u)
    return np.float64(np.where(m, k, 0.0).sum() / n) if n else np.float64(0.0)


def approx_kl_vjp(g, logp, old_logp, mask=None, *, kind="k1"):
    """VJP of `approx_kl` wrt logp.

    Gradient:
      ∂u/∂logp = 1 and each valid token weighs 1/N: ∂/∂logp = g/N · k'(u) with
      k1' = −1, k2' = u, k3' = e^u − 1 (0 past the exp cap). Masked positions get 0.

    Returns:
      {"logp": [B, T]} float64.
    """
    m, u, kind, n = _approx_parts(logp, old_logp, mask, kind)
    g = args.scalar_cotangent(OPS, g, "approx_kl")
    _, dk = k_estimator(kind, u)
    return {"logp": np.where(m, g * dk / max(n, 1), 0.0)}


def _placed_scores(a, m):
    """The task scores per token: as given, or each row's score at its last valid token."""
    if not a.per_seq:
        return ar.zero_masked(a.scores, m)
    T = m.shape[-1]
    last = T - 1 - np.argmax(m[:, ::-1], axis=-1)
    at_last = (np.arange(T)[None, :] == last[:, None]) & m
    return np.where(at_last, np.where(m.any(axis=-1), a.scores, 0.0)[:, None], 0.0)


def kl_rewards(scores, logp, ref_logp, mask=None, *, beta=0.05, kind="k1", clamp=None):
    """Token rewards with the KL penalty folded in, for PPO with a critic:

        r_t = s_t − β·k_t,   k_t = kl_penalty(logp, ref_logp, kind, clamp)_t

    s is the task score per token, or one score per sequence placed at the row's last valid
    token (its end of sequence), 0 elsewhere.

    Reference: Ziegler et al., "Fine-Tuning Language Models from Human Preferences"
    (arXiv:1909.08593) and InstructGPT's per-token KL reward; verl `compute_rewards`
    (token_level_scores − kl_ratio·(old_log_prob − ref_log_prob): k1), OpenRLHF
    `models/utils.compute_reward` (the score at the last action token, −kl_coef·kl added),
    TRL PPO (`non_score_reward = −kl_coef·kl`, the score added at the end of the response).
    Note: rewards are computed without gradient; the KL enters GAE's returns. This differs from
    the KL *loss* term of GRPO (policy_objective's beta), whose gradient is taken.

    Worked example: s = [0, 1] per token, logp = [−1, −2], ref = [−1.5, −1.5], β = 0.1, k1:
    k = [0.5, −0.5], r = [−0.05, 1.05].

    Args:
      scores: [B, T] or [B] float.
      logp, ref_logp: [B, T] float (or [T]).
      mask: [B, T] bool or 0/1, or None.
      beta: float ≥ 0.  kind, clamp: as kl_penalty's.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    k = kl_penalty(logp, ref_logp, mask, kind=kind, clamp=clamp)
    a = args.kl_rewards(OPS, scores, logp, mask, beta)
    m = np.ones(k.shape, bool) if mask is None else OPS.as_mask(mask)
    return np.where(m, _placed_scores(a, m) - a.beta * k, 0.0)


def kl_rewards_vjp(g, scores, logp, ref_logp, mask=None, *, beta=0.05, kind="k1", clamp=None):
    """VJP of `kl_rewards` wrt logp.

    Gradient: the scores do not depend on logp, so ∂r_t/∂logp_t = −β·∂k_t/∂logp_t, and the
    VJP is kl_penalty's with cotangent −β·g.

    Returns:
      {"logp": [B, T]} float64.
    """
    a = args.kl_rewards(OPS, scores, logp, mask, beta)
    gs = -a.beta * args.cotangent(OPS, g, "g", OPS.spec("logp", logp))
    return kl_penalty_vjp(gs, logp, ref_logp, mask, kind=kind, clamp=clamp)
