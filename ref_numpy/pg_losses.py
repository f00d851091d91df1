"""Losses beyond PPO's ratio clip: rollout-correction importance weights, REINFORCE (with DRO's
penalty), DPPO's trust-region mask and GMPO's geometric mean, each with a hand-derived VJP.
"""
import numpy as np

from ref_common import args, checks

from . import _arrays as ar
from ._arrays import OPS
from .policy_losses import loss_inputs, ppo_clip_loss, ppo_clip_loss_vjp


# ====================================================================== rollout correction
def _is_parts(log_ratio, m, c):
    """The weights of validated conventions `c` from padding-free token log-ratios [B, T]."""
    x = log_ratio
    if c.level == "sequence":
        s = x.sum(axis=-1, keepdims=True)
        if c.seq_stat == "mean":
            s = s / np.maximum(m.sum(axis=-1, keepdims=True), 1)
        s = np.broadcast_to(s, x.shape)
    else:
        s = x
    if c.log_ratio_clamp is not None:
        s = np.clip(s, -c.log_ratio_clamp, c.log_ratio_clamp)
        x = np.clip(x, -c.log_ratio_clamp, c.log_ratio_clamp)
    unit = ar.capped_exp(s)
    lower = -np.inf if c.lower is None else c.lower
    upper = np.inf if c.upper is None else c.upper
    if c.mode == "truncate":
        w = np.minimum(np.maximum(unit, lower), upper)
    else:
        kept = unit if c.kept == "unit" else ar.capped_exp(x)
        w = np.where((unit >= lower) & (unit <= upper), kept, 0.0)
    return np.where(m, w, 0.0)


def rollout_is_weights(logp, rollout_logp, mask=None, *, level="token", mode="truncate",
                       lower=None, upper=2.0, seq_stat="sum", kept="unit",
                       log_ratio_clamp=None):
    """Importance weights that correct for the mismatch between the engine that sampled the
    rollout (vLLM, SGLang) and the one that trains, w ≈ π_train/π_rollout.

    With x_t = logp_t − rollout_logp_t at valid tokens:
        token level:     s_t = x_t
        sequence level:  s_t = S = Σ_t x_t (seq_stat "sum": the product of token ratios) or
                         S = mean_t x_t ("mean": their geometric mean), the same for every token
        log_ratio_clamp: s (and x) clipped to ±clamp before exp
        truncate (TIS):  w_t = clip(e^{s_t}, lower, upper)        (None: that side unbounded)
        mask (MIS):      w_t = e^{s_t} if lower ≤ e^{s_t} ≤ upper else 0;  with kept="token"
                         a kept token carries its own ratio e^{x_t} instead of its unit's

    Reference: Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (2025) for TIS; verl `rollout_corr_helper.compute_rollout_correction_weights`
    (token / sequence, sum, a float threshold truncates, "lower_upper" masks (IcePop),
    clamp ±20), TRL's `vllm_importance_sampling_mode` (token_/sequence_ × truncate/mask, sum,
    clip_min/clip_max, no clamp), OpenRLHF's `is_correction_level` token / seq (a sequence is
    judged by its geometric mean, "mean", and a kept token keeps its own ratio, kept="token").
    Note: the weights are a change of measure, not part of the objective: every trainer
    detaches them (reinforce_loss's `detach` stage proves its use of them is stop-gradient). With
    upper = ∞ and lower = None, truncation is plain importance sampling, w = π_train/π_rollout.

    Worked example: x = [log 3, log 0.5], token level, upper 2: truncate → [2, 0.5];
    mask → [0, 0.5]; sequence level (S = log 1.5): truncate → [1.5, 1.5].

    Args:
      logp: [B, T] float (or [T]). log π_train of the sampled tokens.
      rollout_logp: [B, T] float. log π_rollout of the same tokens.
      mask: [B, T] bool or 0/1, or None.
      level: "token" | "sequence".  mode: "truncate" | "mask".
      lower, upper: None or bounds on the weight (0 ≤ lower ≤ upper; upper may be inf).
      seq_stat: "sum" | "mean".  kept: "unit" | "token".
      log_ratio_clamp: None or a bound c > 0 on |log w|.

    Returns:
      [B, T] float64 weights, 0 at masked positions. Not differentiated (no VJP).
    """
    a = args.pair_inputs(OPS, logp, rollout_logp, mask, ("logp", "rollout_logp"))
    c = args.rollout_is(level, mode, lower, upper, seq_stat, kept, log_ratio_clamp)
    x = ar.zero_masked(a.first, a.mask) - ar.zero_masked(a.second, a.mask)
    return _is_parts(x, a.mask, c)


# ====================================================================== decoupled PPO
def _decoupled_parts(logp, prox_logp, behave_logp, advantages, mask, clip_low, clip_high, clip_c,
                     is_level, is_mode, is_lower, is_upper, is_seq_stat):
    """The validated mask, the behaviour weights w and the PPO keywords."""
    d = args.decoupled(OPS, logp, prox_logp, behave_logp, advantages, mask, clip_low, clip_high,
                       clip_c, is_level, is_mode, is_lower, is_upper, is_seq_stat)
    m = d.ratio.mask
    if d.weights.level is None:
        w = np.where(m, 1.0, 0.0)
    else:
        x = ar.zero_masked(d.ratio.old_logp, m) - ar.zero_masked(d.behave_logp, m)
        w = _is_parts(x, m, d.weights)
    return m, w, dict(clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)


def decoupled_ppo_loss(logp, prox_logp, behave_logp, advantages, mask=None, *, clip_low=0.2,
                       clip_high=None, clip_c=None, is_level="token", is_mode="truncate",
                       is_lower=None, is_upper=None, is_seq_stat="mean"):
    """Decoupled PPO's per-token loss: PPO's clip around a proximal policy, on tokens that a
    staler behaviour policy sampled, reweighted from the one to the other:

        l_t = w_t · max(−A_t·u_t, −A_t·clip(u_t, 1 − ε_low, 1 + ε_high))      (dual clip: as PPO)
        u_t = exp(logp_t − prox_logp_t)           the ratio the clip is centred on
        w_t = π_prox/π_behave = exp(prox_logp_t − behave_logp_t), a constant (no gradient)

    w is `rollout_is_weights(prox_logp, behave_logp, level=is_level, mode=is_mode,
    lower=is_lower, upper=is_upper, seq_stat=is_seq_stat)`: plain (is_upper None, truncate:
    the objective of the papers), truncated, or masked outside [is_lower, is_upper] (AReaL's
    rejection sampling; at sequence level a sequence's weight is the geometric mean of its token
    weights, is_seq_stat "mean"). is_level None drops w (w = 1: PPO against the proximal policy
    with no behaviour correction).

    Reference: Hilton, Cobbe and Schulman, "Batch size-invariance for policy optimization",
    arXiv:2110.00641, §3 (the decoupled objective); Fu et al., AReaL, arXiv:2505.24298, §5.2
    (π_prox/π_behav times PPO's clipped term around π_prox); AReaL
    `functional.py::ppo_actor_loss_fn` (proximal_logprobs, old_logprobs = the behaviour's,
    rejection_sampling: token/sequence × mask/clamp on the ratio metric).
    Note: with prox_logp = behave_logp it is PPO (w = 1 wherever 1 is inside the bounds).

    Worked example: A = 1, ε = 0.2, u = e^0.1 = 1.1052, prox − behave = log 2: w = 2,
    l = −2.2103, ∂l/∂logp = −2·A·u = −2.2103; with is_mode "mask", is_upper 1.5: w = 0, l = 0.

    Args:
      logp, prox_logp, behave_logp: [B, T] float (or [T]). log π_θ, log π_prox, log π_behave
        of the sampled tokens (AReaL's logprobs, proximal_logprobs, old_logprobs).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      clip_low, clip_high, clip_c: as ppo_clip_loss.
      is_level: None | "token" | "sequence".  is_mode: "truncate" | "mask".
      is_lower, is_upper: None or bounds on w.  is_seq_stat: "sum" | "mean".

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m, w, ppo = _decoupled_parts(logp, prox_logp, behave_logp, advantages, mask, clip_low,
                                 clip_high, clip_c, is_level, is_mode, is_lower, is_upper,
                                 is_seq_stat)
    loss = ppo_clip_loss(logp, prox_logp, advantages, mask, **ppo)
    return np.where(m & (w != 0), w * loss, 0.0)


def decoupled_ppo_loss_vjp(g, logp, prox_logp, behave_logp, advantages, mask=None, *,
                           clip_low=0.2, clip_high=None, clip_c=None, is_level="token",
                           is_mode="truncate", is_lower=None, is_upper=None, is_seq_stat="mean"):
    """VJP of `decoupled_ppo_loss` wrt logp.

    Gradient: w_t depends on prox_logp and behave_logp only, both constants, so
        ∂l_t/∂logp_t = w_t · ∂(PPO's l_t)/∂logp_t = w_t · (−A_t·u_t)·1[unclipped branch active]
    (ppo_clip_loss_vjp's case split, with the ratio u around the proximal policy), 0 when masked
    or where w = 0.

    Returns:
      {"logp": [B, T]} float64.
    """
    m, w, ppo = _decoupled_parts(logp, prox_logp, behave_logp, advantages, mask, clip_low,
                                 clip_high, clip_c, is_level, is_mode, is_lower, is_upper,
                                 is_seq_stat)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", logp)), m)
    d = ppo_clip_loss_vjp(w * gm, logp, prox_logp, advantages, mask, **ppo)["logp"]
    return {"logp": np.where(m & (w != 0), d, 0.0)}


# ====================================================================== off-policy sequence mask
def opsm_mask(logp, old_logp, advantages, mask=None, *, delta=1e-4):
    """Off-policy sequence masking (OPSM): which tokens a negative-advantage sequence that has
    drifted too far from the sampling policy keeps.

        D_b  = Σ_t m_bt·(old_logp_bt − logp_bt) / max(Σ_t m_bt, 1)     the sequence's k1 KL
        keep_bt = m_bt · (1 − 1[A_bt < 0 and D_b > δ])

    The loss is multiplied by keep: a sequence whose policy has moved more than δ (per token,
    on average) from the one that sampled it stops pushing its negative-advantage tokens down;
    positive advantages are always kept.

    Reference: DeepSeek-AI, DeepSeek-V3.2 (arXiv:2512.02556), §3.1 "Off-Policy Sequence
    Masking"; slime `ppo_utils.py::compute_opsm_mask` (opsm_delta, default 1e-4).
    Note: a mask, not differentiated (it is a comparison): the trainer multiplies its loss by
    it. old_logp is the policy that sampled the sequence.

    Worked example: one row, logp = [−1.0, −2.0], old_logp = [−0.9, −1.9]: D = 0.1. With
    A = −1 and δ = 0.05 both tokens are dropped: [0, 0]; with δ = 0.2, or with A = +1: [1, 1].

    Args:
      logp, old_logp: [B, T] float (or [T]).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      delta: the threshold δ on D (a finite number).

    Returns:
      [B, T] float64 of 0 and 1, 0 at masked positions.
    """
    lp, old, adv, m, _ = loss_inputs(logp, old_logp, advantages, mask, None)
    delta = args.opsm(delta)
    n = np.maximum(m.sum(axis=-1, keepdims=True), 1)
    drift = (old - lp).sum(axis=-1, keepdims=True) / n      # lp, old: 0 at padding
    drop = (adv < 0) & (drift > delta)
    return np.where(m & ~drop, 1.0, 0.0)


# ====================================================================== the TV sequence filter
def tv_drift(logp, old_logp, mask, log_ratio_clamp=None):
    """Each row's mean total-variation drift D_b = Σ_t m·|ρ_t − 1| / max(Σ_t m, 1), [B, 1],
    with ρ_t = exp(logp_t − old_logp_t) (the log-ratio clipped to ±log_ratio_clamp first).
    Padding is never read. The one place in ref_numpy D is written: `tv_filter_mask` and the
    case generator's choice of bounds use it."""
    m = np.asarray(mask, dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):     # garbage at padding is never read
        x = np.where(m, np.asarray(logp, dtype=np.float64) -
                     np.asarray(old_logp, dtype=np.float64), 0.0)
    if log_ratio_clamp is not None:
        x = np.clip(x, -log_ratio_clamp, log_ratio_clamp)
    tv = np.where(m, np.abs(ar.capped_exp(x) - 1.0), 0.0)
    return tv.sum(axis=-1, keepdims=True) / np.maximum(m.sum(axis=-1, keepdims=True), 1)


def tv_filter_mask(logp, old_logp, advantages, mask=None, *, lower=None, upper=None,
                   log_ratio_clamp=None):
    """The total-variation sequence filter: which tokens of a sequence whose sampling and
    training engines disagree too much keep their loss, dropping only the tokens whose update
    would widen the disagreement.

        ρ_bt = exp(logp_bt − old_logp_bt)                      π_train / π_sampler per token
        D_b  = Σ_t m_bt·|ρ_bt − 1| / max(Σ_t m_bt, 1)           the sequence's mean TV drift
        out_b = (D_b > upper) or (D_b < lower)                  (a bound None: that side off)
        keep_bt = m_bt · (1 − 1[out_b and sign(log ρ_bt)·A_bt > 0])

    A token with sign(log ρ)·A > 0 is one the policy gradient pushes further from the sampler
    (A > 0 raises π_train where it already exceeds π_sampler; A < 0 lowers it where it is
    already below), so only those are dropped; the others, which pull ρ back toward 1, stay.

    Reference: VACO, arXiv:2603.01365 (the TV-divergence masking as open-instruct cites it);
    open-instruct `grpo_utils.compute_rho_correction` with `rho_mask_tv_divergence`
    (old_logp there is vLLM's log-prob, logp the trainer's old log-prob; the log-ratio clipped
    to ±10; rho_mask_lower_bound / rho_mask_upper_bound the bounds, 0 disabling each).
    Note: a mask, not differentiated (comparisons): the trainer multiplies its loss by it.
    |ρ − 1| is half the L1 distance between the two engines' distributions restricted to the
    sampled token, so D_b is a per-token-averaged TV proxy. sign(0) = 0: a token with ρ = 1
    is never dropped.

    Worked example: one row, logp − old_logp = [log 3, log 0.5], A = +1: ρ = [3, 0.5],
    D = (2 + 0.5)/2 = 1.25. With upper = 1.1 the row is out; sign(log ρ)·A = [+1, −1]:
    keep = [0, 1]. With A = −1: keep = [1, 0]. With upper = 2: keep = [1, 1].

    Args:
      logp: [B, T] float (or [T]). log π_train of the sampled tokens.
      old_logp: [B, T] float. log π of the engine that sampled them.
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      lower, upper: None or finite bounds ≥ 0 on D (lower ≤ upper when both are set).
      log_ratio_clamp: None or c > 0: log ρ clipped to ±c before exp.

    Returns:
      [B, T] float64 of 0 and 1, 0 at masked positions.
    """
    lp, old, adv, m, clamp = loss_inputs(logp, old_logp, advantages, mask, log_ratio_clamp)
    lower, upper = args.tv_filter(lower, upper)
    x = lp - old                                              # 0 at padding
    drift = tv_drift(lp, old, m, clamp)
    out = np.zeros(drift.shape, bool)
    if upper is not None:
        out = out | (drift > upper)
    if lower is not None:
        out = out | (drift < lower)
    drop = out & (np.sign(x) * adv > 0)
    return np.where(m & ~drop, 1.0, 0.0)


# ====================================================================== M2PO's second-moment mask
def m2po_mask(logp, old_logp, mask=None, *, threshold=0.04):
    """M2PO's token mask: drop the tokens of largest squared log-ratio, fewest first, until the
    second moment of the rest is below τ.

        M2_i = (logp_i − old_logp_i)²  over the N valid tokens of the batch, sorted descending
        k    = the least k with  mean(M2_(k+1..N)) < τ   (N − 1 when none: one token stays)
        keep = 0 at the k largest, 1 at the others, 0 at padding

    Reference: Zheng, Zhao and Chen, "Prosperity before Collapse: How Far Can Off-Policy RL
    Reach with Stale Data on LLMs?" (M2PO), arXiv:2510.01161, §4 (the second moment M̂2 of
    log r and its masking); AReaL `actor.py::_apply_m2po_masking` (τ = m2_threshold, the
    behaviour against the proximal log-probs, over the call's valid tokens).
    Note: a mask, not differentiated; M2 is symmetric in its two arguments. Which of several
    tokens with equal M2 at the cut are dropped is left open (an audit does not judge a tie).

    Worked example: log-ratios [0.5, 0.1, −0.1, 0], τ = 0.04: M2 = [0.25, 0.01, 0.01, 0],
    mean of all 0.0675 ≥ τ; without the largest, 0.02/3 = 0.0067 < τ: keep [0, 1, 1, 1].

    Args:
      logp, old_logp: [B, T] float (or [T]).
      mask: [B, T] bool or 0/1, or None.
      threshold: τ > 0.

    Returns:
      [B, T] float64 of 0 and 1, 0 at masked positions.
    """
    a, tau = args.m2po(OPS, logp, old_logp, mask, threshold)
    m = a.mask
    x = ar.zero_masked(a.first, m) - ar.zero_masked(a.second, m)
    m2 = (x * x)[m]
    keep = np.zeros(m.shape)
    n = m2.size
    if n == 0:
        return keep
    order = np.argsort(-m2, kind="stable")
    ranked = m2[order]
    suffix = np.cumsum(ranked[::-1])[::-1] / np.arange(n, 0, -1)
    below = np.flatnonzero(suffix < tau)
    k = int(below[0]) if below.size else n - 1
    kept = np.ones(n)
    kept[order[:k]] = 0.0
    keep[m] = kept
    return keep


# ====================================================================== REINFORCE, DRO
def _reinforce_parts(logp, old_logp, advantages, mask, beta, is_level, is_mode, is_lower,
                     is_upper, is_log_ratio_clamp):
    lp, old, adv, m, _ = loss_inputs(logp, old_logp, advantages, mask, None)
    beta, c = args.reinforce(beta, is_level, is_mode, is_lower, is_upper, is_log_ratio_clamp)
    w = np.ones_like(lp) if c.level is None else _is_parts(lp - old, m, c)
    return lp, old, adv, m, beta, w


def reinforce_loss(logp, old_logp, advantages, mask=None, *, beta=0.0, is_level=None,
                   is_mode="truncate", is_lower=None, is_upper=2.0, is_log_ratio_clamp=20.0):
    """REINFORCE's per-token loss, with DRO's quadratic penalty and in-loss rollout weights:

        l_t = sg(w_t)·(−A_t·logp_t + ½β·(logp_t − old_logp_t)²)

    w = 1, or with is_level set the rollout-correction weight of logp against old_logp read as
    the rollout policy (`rollout_is_weights` with level=is_level, mode=is_mode, lower=is_lower,
    upper=is_upper, log_ratio_clamp=is_log_ratio_clamp), held constant (stop-gradient).

    Reference: Williams (1992); verl `compute_policy_loss_reinforce` (−A·logp, times the
    rollout weights it is given), `compute_policy_loss_gpg` (the same loss: GPG's change is in
    its advantages), `compute_policy_loss_dro` (β = policy_loss.dro_beta) and
    `compute_policy_loss_bypass_mode` with loss_type "reinforce" (old_log_prob is the rollout's;
    token-level weights truncated at 2, log-ratio clamped to ±20).
    Note: the value −A·logp is not the PPO surrogate −A·r, and not even a constant apart from it;
    but at r = 1 (on-policy) the two have the same gradient, −A·∇logp, since ∇r = r·∇logp. With is_level set, beta must be 0 (one
    old_logp cannot be both the rollout and the DRO anchor).

    Worked example: A = 2, logp = −0.5, old = −0.7, β = 1: l = 1 + ½·0.04 = 1.02,
    ∂l/∂logp = −2 + 0.2 = −1.8.

    Args:
      logp, old_logp: [B, T] float (or [T]).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      beta: float ≥ 0.  is_level: None | "token" | "sequence"; the is_* keywords as
      rollout_is_weights' (its sequence statistic is the sum).

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    lp, old, adv, m, beta, w = _reinforce_parts(logp, old_logp, advantages, mask, beta,
                                                is_level, is_mode, is_lower, is_upper,
                                                is_log_ratio_clamp)
    d = lp - old
    return np.where(m, w * (-adv * lp + 0.5 * beta * d * d), 0.0)


def reinforce_loss_vjp(g, logp, old_logp, advantages, mask=None, *, beta=0.0, is_level=None,
                       is_mode="truncate", is_lower=None, is_upper=2.0,
                       is_log_ratio_clamp=20.0):
    """VJP of `reinforce_loss` wrt logp.

    Gradient: w is a constant (stop-gradient), so
        ∂l_t/∂logp_t = w_t·(−A_t + β·(logp_t − old_logp_t))
    and ∂L/∂logp = g·w·(−A + β·(logp − old)); on-policy (logp = old) it is −w·A, the policy
    gradient. Without the stop-gradient the token-level weight would add
    g·(∂w/∂logp)·(−A·logp), which is wrong (IS weights change the measure, not the objective).

    Returns:
      {"logp": [B, T]} float64.
    """
    lp, old, adv, m, beta, w = _reinforce_parts(logp, old_logp, advantages, mask, beta,
                                                is_level, is_mode, is_lower, is_upper,
                                                is_log_ratio_clamp)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", logp)), m)
    return {"logp": np.where(m, gm * w * (-adv + beta * (lp - old)), 0.0)}


# ====================================================================== DPPO
def _dppo_parts(logp, old_logp, advantages, mask, divergence, clip_low, clip_high, clip_c,
                log_ratio_clamp, kl_eps, form):
    """(logp, A, mask, w = min(r, C), kept, form, ∂w/∂logp) on the valid tokens."""
    lp, old, adv, m, clamp = loss_inputs(logp, old_logp, advantages, mask, log_ratio_clamp)
    p = args.dppo(divergence, clip_low, clip_high, clip_c, kl_eps, form)
    rho = lp - old
    inside = np.ones(rho.shape, bool)       # where w moves with logp: inside both clamps
    if clamp is not None:
        inside = np.abs(rho) <= clamp
        rho = np.clip(rho, -clamp, clamp)
    inside = inside & (rho <= ar.LOG_FLOAT_MAX)     # exp saturates there: flat, see ar
    w = ar.capped_exp(rho)
    if p.clip_c is not None:
        inside = inside & (w <= p.clip_c)
        w = np.minimum(w, p.clip_c)
    pi, q = np.exp(lp), np.exp(old)
    if p.divergence == "tv":
        pos_ok, neg_ok = pi - q <= p.hi, pi - q >= -p.lo
    else:
        for name, x in (("logp", lp), ("old_logp", old)):
            if (x > 0).any():
                i = tuple(int(k) for k in np.argwhere(x > 0)[0])
                args.not_a_log_probability(name, i, float(x[i]))
        one_q, one_p = -np.expm1(old), -np.expm1(lp)        # 1 − q and 1 − p, no cancellation
        with np.errstate(divide="ignore", invalid="ignore"):
            # (1 − q)·log(…) is 0 where q = 1: the limit x·log x → 0 (for ε = 0 it is 0·−inf)
            second = np.where(one_q > 0, one_q * (np.log(one_q + p.kl_eps) -
                                                  np.log(one_p + p.kl_eps)), 0.0)
            d = q * (old - lp) + second
        pos_ok, neg_ok = (d <= p.hi) | (pi <= q), (d <= p.lo) | (pi >= q)
    keep = np.where(adv > 0, pos_ok, neg_ok) & m
    return lp, adv, m, w, keep, p.form, np.where(inside, w, 0.0)


def dppo_loss(logp, old_logp, advantages, mask=None, *, divergence="tv", clip_low=0.2,
              clip_high=None, clip_c=3.0, log_ratio_clamp=20.0, kl_eps=0.0, form="logp"):
    """DPPO: a trust region on the sampled token's probability instead of on the ratio.

        p = e^logp, q = e^old_logp, r = exp(clip(logp − old_logp, ±log_ratio_clamp))
        tv:  D = p − q;  kept where A > 0: D ≤ δ_high,  A ≤ 0: D ≥ −δ_low
        kl:  D = q·log(q/p) + (1 − q)·log((1 − q + ε)/(1 − p + ε)), the binary KL, whose
             second term is 0 at q = 1 (the limit of x·log x), so D = −log p there;
             kept where A > 0: D ≤ δ_high or p ≤ q,  A ≤ 0: D ≤ δ_low or p ≥ q
        form "logp":   l_t = −A_t·sg(min(r_t, C))·logp_t·sg(kept_t)
        form "ratio":  l_t = −A_t·min(r_t, C)·sg(kept_t), the ratio attached

    A token leaves the update only when it has moved too far in its advantage's direction.
    Both forms have the gradient −A·r·kept where r < C (and inside the log-ratio clamp); above
    C, "logp" keeps the truncated weight −A·C while "ratio" gives 0 (min(r, C) is then flat).

    Reference: "DPPO" (arXiv:2602.04879) as verl writes it in `compute_policy_loss_dppo_tv` and
    `compute_policy_loss_dppo_kl` (δ = actor.clip_ratio(_low/_high); C = the actor config's
    clip_ratio_c, 3.0 by default, which verl reads as config.get("clip_ratio_c", 20.0), so 20
    is only the fallback where the key is absent; log-ratio clamp ±20; ε = 1e-8 in the binary
    KL: `kl_eps`). float32 log-softmax returns old_logp = 0 exactly for a confident token:
    with ε = 0 its D is −log p, not 0·log 0.
    Note: in form "logp" the value carries logp itself, weighted by the detached truncated
    ratio, so the gradient is −A·min(r, C) inside the region and 0 outside: the truncated-IS
    policy gradient. Form "ratio" is the surrogate −A·r that prime-rl's default loss writes
    (`default_loss_fn`: −keep·A·r, no C and no clamp). With C = None the two forms' gradients
    agree wherever the log-ratio clamp and the exp cap do not bind; where the clamp binds
    (|log r| > 20 by default) "logp" keeps the weight −A·e^(±20) and "ratio" is flat (0), and
    past the exp cap (log r > 709.78) likewise. Their values always differ.

    Worked example: A = 1, logp = log 0.5, old = log 0.4, tv, δ = 0.2: D = 0.1 ≤ 0.2, kept;
    r = 1.25, l = −1.25·log 0.5 = 0.8664, ∂l/∂logp = −1.25. With old = log 0.2 instead,
    D = 0.3 > 0.2: l = 0 and no gradient. In form "ratio" the first token's value is
    −1.25 and its gradient −1.25 (C = 3 is not reached).

    Args:
      logp, old_logp: [B, T] float (or [T]); log-probabilities (≤ 0 for "kl").
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      divergence: "tv" | "kl".  clip_low, clip_high: δ > 0 (clip_high None: δ_low).
      clip_c: None or the truncation C > 0 of the weight.  log_ratio_clamp: None or > 0.
      kl_eps: ε ≥ 0 inside the binary KL's second log.
      form: "logp" | "ratio" (see above).

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    lp, adv, m, w, keep, form, _ = _dppo_parts(logp, old_logp, advantages, mask, divergence,
                                               clip_low, clip_high, clip_c, log_ratio_clamp,
                                               kl_eps, form)
    return np.where(keep, -adv * w * (lp if form == "logp" else 1.0), 0.0)


def dppo_loss_vjp(g, logp, old_logp, advantages, mask=None, *, divergence="tv", clip_low=0.2,
                  clip_high=None, clip_c=3.0, log_ratio_clamp=20.0, kl_eps=0.0, form="logp"):
    """VJP of `dppo_loss` wrt logp.

    Gradient: the region indicator is a stop-gradient factor (a step function of logp besides).
      form "logp": min(r, C) is stop-gradient too, so
          ∂l_t/∂logp_t = −A_t·min(r_t, C)·kept_t.
        (Differentiating the weight would add −A·logp·r·1[r < C], which the trainers do not.)
      form "ratio": w = min(exp(clip(ρ, ±c)), C) with ρ = logp − old_logp; ∂ρ/∂logp = 1, the
        clamp passes it where |ρ| ≤ c, exp gives r, the min passes it where r ≤ C, so
          ∂l_t/∂logp_t = −A_t·r_t·1[|ρ_t| ≤ c]·1[r_t ≤ C]·kept_t
        (the ties pass, as torch.clamp's gradient does at its bounds). exp saturates at the
        largest float past ρ = log(max float) (ar.LOG_FLOAT_MAX): r is flat there, gradient 0.
      ∂L/∂logp = g·(that).

    Returns:
      {"logp": [B, T]} float64.
    """
    _, adv, m, w, keep, form, dw = _dppo_parts(logp, old_logp, advantages, mask, divergence,
                                               clip_low, clip_high, clip_c, log_ratio_clamp,
                                               kl_eps, form)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", logp)), m)
    return {"logp": np.where(keep, -gm * adv * (w if form == "logp" else dw), 0.0)}


# ====================================================================== GMPO
def _gmpo_parts(logp, old_logp, advantages, mask, clip_low, clip_high, eps):
    lp, old, adv, m, _ = loss_inputs(logp, old_logp, advantages, mask, None)
    p = args.gmpo(clip_low, clip_high, eps)
    lp, old, adv, m = (x[None, :] if x.ndim == 1 else x for x in (lp, old, adv, m))
    rho = lp - old
    sgn = np.sign(adv)
    rc = np.clip(rho, -p.lo, p.hi)
    rt = sgn * np.minimum(sgn * rho, sgn * rc)          # the pessimistic branch, per token
    free = m & (sgn != 0) & (sgn * rho <= sgn * rc)      # where rt is rho (it carries gradient)
    denom = m.sum(axis=-1) + p.eps
    denom = np.where(denom > 0, denom, 1.0)              # an empty row: R = Ā = 0
    R = np.where(m, rt, 0.0).sum(axis=-1) / denom
    a_bar = adv.sum(axis=-1) / denom
    return a_bar, ar.capped_exp(R), R, denom, free


def gmpo_loss(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None, eps=0.0):
    """GMPO: PPO's objective on the geometric mean of a sequence's token ratios.

        ρ_t = logp_t − old_logp_t,  ρ̃_t = sign(A_t)·min(sign(A_t)·ρ_t, sign(A_t)·clip(ρ_t, −ε_low, ε_high))
        R_i = Σ_t m_t ρ̃_t / (L_i + eps),   Ā_i = Σ_t m_t A_t / (L_i + eps)
        loss = (1/B)·Σ_i −Ā_i·exp(R_i)

    The clip is in log space, per token, and pessimistic (PPO's min) before the mean.

    Reference: Zhao et al., "Geometric-Mean Policy Optimization" (arXiv:2507.20673), as verl
    writes it in `compute_policy_loss_geo_mean` (ε = clip_ratio(_low/_high), eps = 1e-8; the
    mean over sequences whatever loss_agg_mode says).
    Note: a token outlier moves exp(R) by e^{ρ_t/L} only, which is the point of the geometric
    mean; an empty row has R = 0, Ā = 0 and adds 0 to the sum but counts in B.

    Worked example: one sequence, A = 1, ρ = [0.1, 0.3], ε = 0.2: ρ̃ = [0.1, 0.2], R = 0.15,
    loss = −e^0.15 = −1.161834; ∂loss/∂logp = [−e^0.15/2, 0] = [−0.580917, 0].

    Args:
      logp, old_logp: [B, T] float (or [T]: one sequence).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      clip_low, clip_high: ε ≥ 0 in log space (clip_high None: ε_low).  eps: ≥ 0.

    Returns:
      A 0-d float64 array (0 for an empty batch).
    """
    a_bar, e, _, _, _ = _gmpo_parts(logp, old_logp, advantages, mask, clip_low, clip_high, eps)
    return np.asarray(np.sum(-a_bar * e) / max(len(a_bar), 1))      # an empty batch: 0


def gmpo_loss_vjp(g, logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                  eps=0.0):
    """VJP of `gmpo_loss` wrt logp.

    Gradient: ∂R_i/∂logp_t = m_t·1[ρ̃_t = ρ_t]/(L_i + eps) (the clipped branch is a constant,
    and sign(A) = 0 gives ρ̃ = 0), and exp saturates at the largest float (derivative 0 past
    it), so
        ∂loss/∂logp_{i,t} = g·(1/B)·(−Ā_i·e^{R_i})·1[ρ̃_t = ρ_t]·m_t/(L_i + eps).
    Every token of a sequence shares one weight; the clipped ones get none.

    Returns:
      {"logp": [B, T]} float64 (or [T]).
    """
    a_bar, e, R, denom, free = _gmpo_parts(logp, old_logp, advantages, mask, clip_low,
                                           clip_high, eps)
    g = args.scalar_cotangent(OPS, g, "gmpo_loss")
    live = (R <= ar.LOG_FLOAT_MAX)
    per_seq = g / max(len(a_bar), 1) * (-a_bar * e * live) / denom
    out = np.where(free, per_seq[:, None], 0.0)
    return {"logp": out.reshape(np.shape(logp))}


# ====================================================================== KL-Cov
def kl_cov_selection(lp, adv, m, ratio):
    """The k = max(1, ⌊N·ratio⌋) valid tokens of largest covariance term
    (A − mean A)(logp − mean logp) (means over the N valid tokens), for arrays [..., B, T]
    with any leading axes: a boolean [..., B, T]. Ties go to the first in row-major order."""
    n = m.sum(axis=(-2, -1), keepdims=True)
    n_safe = np.maximum(n, 1)
    a_mean = np.where(m, adv, 0.0).sum(axis=(-2, -1), keepdims=True) / n_safe
    l_mean = np.where(m, lp, 0.0).sum(axis=(-2, -1), keepdims=True) / n_safe
    cov = np.where(m, (adv - a_mean) * (lp - l_mean), -np.inf)
    flat = cov.reshape(cov.shape[:-2] + (-1,))
    N = int(m.sum(axis=(-2, -1)).reshape(-1)[0]) if m.size else 0
    k = max(1, int(N * ratio)) if N else 0
    order = np.argsort(-flat, axis=-1, kind="stable")[..., :k]
    chosen = np.zeros(flat.shape, dtype=bool)
    np.put_along_axis(chosen, order, True, axis=-1)
    return chosen.reshape(cov.shape) & m


def _kl_cov_parts(logp, old_logp, advantages, mask, ratio, coef):
    lp, old, adv, m, _ = loss_inputs(logp, old_logp, advantages, mask, None)
    ratio = checks.in_range("ratio", ratio, 0.0, 1.0, lo_open=True)
    coef = checks.non_negative("coef", coef)
    lp, old, adv, m = (x[None, :] if x.ndim == 1 else x for x in (lp, old, adv, m))
    return lp, old, adv, m, kl_cov_selection(lp, adv, m, ratio), coef


def kl_cov_loss(logp, old_logp, advantages, mask=None, *, ratio=2e-4, coef=0.1):
    """KL-Cov: the unclipped surrogate, with a |log-ratio| penalty on the few tokens whose
    advantage and log-probability co-vary most (the ones that collapse entropy):

        cov_t = (A_t − Ā)(logp_t − mean logp)     (means over the batch's valid tokens)
        S = the k = max(1, ⌊N·ratio⌋) tokens of largest cov (a stop-gradient selection)
        l_t = −A_t·r_t + coef·|logp_t − old_logp_t|·1[t ∈ S],   r = exp(logp − old_logp)

    Reference: Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models" (arXiv:2505.22617), as verl writes it in `compute_policy_loss_kl_cov`
    (ratio = policy_loss.kl_cov_ratio 2e-4; coef = policy_loss.ppo_kl_coef, 0.1 in verl's
    PolicyLossConfig and actor.yaml, the code's 1.0 being only its fallback for None; no
    ratio clip at all).
    Note: the selection spans the whole batch (a token's penalty depends on every other
    token), so micro-batches select differently from the full batch.

    Worked example: A = [1, −1], logp = [−0.5, −2], old = [−1, −1.5], ratio 0.1 (k = 1),
    coef 1: Ā = 0, mean logp = −1.25, cov = [1·0.75, −1·−0.75] = [0.75, 0.75]: a tie, the
    first token wins; l = [−e^0.5 + 0.5, e^−0.5] = [−1.148721, 0.606531].

    Args:
      logp, old_logp: [B, T] float (or [T]).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      ratio: the share of valid tokens penalised, in (0, 1].  coef: float ≥ 0.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    lp, old, adv, m, chosen, coef = _kl_cov_parts(logp, old_logp, advantages, mask, ratio, coef)
    with np.errstate(over="ignore"):
        loss = -adv * ar.capped_exp(lp - old) + coef * np.abs(lp - old) * chosen
    return np.where(m, loss, 0.0).reshape(np.shape(logp))


def kl_cov_loss_vjp(g, logp, old_logp, advantages, mask=None, *, ratio=2e-4, coef=0.1):
    """VJP of `kl_cov_loss` wrt logp.

    Gradient: the selection S is stop-gradient (piecewise constant in logp), so
        ∂l_t/∂logp_t = −A_t·r_t + coef·sign(logp_t − old_logp_t)·1[t ∈ S]
    (r saturates at the largest float, its derivative 0 past it), times g.

    Returns:
      {"logp": [B, T]} float64.
    """
    lp, old, adv, m, chosen, coef = _kl_cov_parts(logp, old_logp, advantages, mask, ratio, coef)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", logp)), m.reshape(
        np.shape(logp)))
    d = kl_cov_slope(lp, old, adv, chosen, coef)
    return {"logp": np.where(m, gm.reshape(m.shape) * d, 0.0).reshape(np.shape(logp))}


def kl_cov_slope(lp, old, adv, chosen, coef):
    """∂l_t/∂logp_t of KL-Cov, the selection held: −A·r + coef·sign(log r)·1[t ∈ S]."""
    rho = lp - old
    return -adv * ar.capped_exp(rho) * (rho <= ar.LOG_FLOAT_MAX) + coef * np.sign(rho) * chosen
