"""FIPO's future-KL influence weight: a stop-gradient re-weighting of each token's advantage by
the discounted shift of the policy on the tokens that follow it."""
import numpy as np

from ref_common import args

from . import _arrays as ar
from ._arrays import OPS
from .advantages import discounted_returns

# where a negative-advantage token's ratio exceeds safety_threshold, its weight is held in this
# band (ms-swift's fixed bounds)
SAFETY_BAND = (0.8, 1.0)


def fipo_influence_weights(logp, old_logp, advantages, mask=None, *, decay_rate=32.0,
                           lower=1.0, upper=1.2, ratio_threshold=None, safety_threshold=4.0):
    """FIPO's influence weight f_t, which multiplies token t's advantage (or, the same, its
    clipped PPO loss): how much the policy has moved, since the rollout, on the tokens from t to
    the end of the response.

        x_k  = logp_k − old_logp_k,  r_k = e^{x_k}             (token log-ratio, ratio)
        M_k  = mask_k · [r_k ≤ ratio_threshold]               (no threshold: M_k = mask_k)
        F_t  = Σ_{k ≥ t} γ^{k − t} · M_k · x_k,  γ = 2^{−1/decay_rate}      (the Future-KL)
        f_t  = clip(e^{F_t}, lower, upper)                    (None: that side unbounded)
        f_t  = clip(f_t, 0.8, 1.0)  where A_t < 0 and r_t > safety_threshold
    The sum runs over positions: a masked position inside a row (a hole) contributes nothing
    but still counts in the distance k − t. F_t is the reverse discounted cumulative sum of
    `discounted_returns` over every position, with M·x as its rewards.

    Reference: Ma et al., "FIPO: Eliciting Deep Reasoning with Future-KL Influenced Policy
    Optimization", arXiv:2603.19835 (F_t with M_k the dual-clip mask that drops tokens of
    ratio above the threshold c, γ = 2^{−1/τ}, f_t = clip(exp F_t, 1 − ε_f, 1 + ε_f), Ã = A·f);
    ms-swift 4.6.0 `rlhf_trainers/grpo_trainer.py::_compute_fipo_influence` (loss_type "fipo";
    `--fipo_decay_rate` 32, `--fipo_clip_range` ε_f = 0.2 with `--fipo_clip_high_only` true:
    [1, 1.2], `--delta` as ratio_threshold, `--fipo_safety_threshold` 4.0).
    Note: the weight is a stop-gradient: ms-swift detaches it and multiplies the per-token
    loss −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A) by it (r capped at `--delta` when set),
    which for f > 0 is PPO's clipped loss with the advantage A·f; so it is checked by value
    only, like `rollout_is_weights`, and has no VJP. Where the paper and ms-swift differ: the
    paper's clip is symmetric, [1 − ε_f, 1 + ε_f] (lower=0.8, upper=1.2), ms-swift's default
    is one-sided, [1, 1 + ε_f] (the defaults here); the safety band is ms-swift's (the paper's
    equations have none: safety_threshold=None) and its bounds 0.8 and 1.0 are fixed there;
    ms-swift compares its ratio coef_1 with the thresholds, which is the token ratio r_t at
    its default importance_sampling_level "token" (the sequence ratio at "sequence").
    ms-swift's clip is off when `--fipo_clip_range` is 0 or None (lower=upper=None here).
    With γ → 0 (decay_rate → 0) F_t = M_t·x_t: each token's own ratio, clipped.

    Worked example (decay_rate 1: γ = 0.5; one valid row, x = [0.2, −0.4, 0.4]):
    F = [0.2 + 0.5·(−0.2), −0.4 + 0.5·0.4, 0.4] = [0.1, −0.2, 0.4],
    e^F = [1.10517, 0.81873, 1.49182]; [1, 1.2] → [1.10517, 1, 1.2];
    [0.8, 1.2] → [1.10517, 0.81873, 1.2].

    Args:
      logp: [B, T] float (or [T]). log π_θ of the sampled tokens (current policy).
      old_logp: [B, T] float. log π_old of the same tokens (the rollout's policy).
      advantages: [B, T] float, or [B] (one per sequence). Read only by the safety band.
      mask: [B, T] bool or 0/1, or None (all valid).
      decay_rate: the half-life τ > 0 in tokens (inf: γ = 1, no decay).
      lower, upper: None or bounds on the weight (0 ≤ lower ≤ upper; upper may be inf).
      ratio_threshold: None or c > 0: tokens with r_k > c leave the Future-KL sum.
      safety_threshold: None or s > 0: A_t < 0 and r_t > s hold f_t in [0.8, 1.0].

    Returns:
      [B, T] float64 weights, 0 at masked positions. Not differentiated (no VJP).
    """
    a = args.fipo(OPS, logp, old_logp, advantages, mask, decay_rate, lower, upper,
                  ratio_threshold, safety_threshold)
    r = a.ratio
    x = ar.zero_masked(r.logp, r.mask) - ar.zero_masked(r.old_logp, r.mask)
    adv = r.advantages[:, None] if r.per_seq else r.advantages
    adv = ar.zero_masked(np.broadcast_to(adv, x.shape), r.mask)
    (x, m, adv), squeeze = ar.as_2d(x, r.mask, adv)
    ratio = ar.capped_exp(x)
    keep = m if a.ratio_threshold is None else m & (ratio <= a.ratio_threshold)
    future = discounted_returns(np.where(keep, x, 0.0), gamma=a.gamma)
    f = ar.capped_exp(future)
    f = np.minimum(np.maximum(f, -np.inf if a.lower is None else a.lower),
                   np.inf if a.upper is None else a.upper)
    if a.safety_threshold is not None:
        unsafe = (adv < 0) & (ratio > a.safety_threshold)
        f = np.where(unsafe, np.clip(f, *SAFETY_BAND), f)
    f = np.where(m, f, 0.0)
    return f[0] if squeeze else f
