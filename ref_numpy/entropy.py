"""The per-token entropy of the policy, the quantity of an entropy bonus, and its VJP."""
import numpy as np

from ref_common import args

from ._arrays import OPS


def _softmax_parts(logits, mask):
    z, m = args.token_logits(OPS, logits, mask)
    z = np.where(m[..., None], z, 0.0)                  # padding reaches no arithmetic
    shifted = z - z.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=-1, keepdims=True)
    p = e / total
    live = shifted > -np.inf                            # a −inf logit: p = 0, p·z counts 0
    shifted = np.where(live, shifted, 0.0)
    z_bar = (p * shifted).sum(axis=-1)                  # E_p[z] − max z
    H = np.log(total[..., 0]) - z_bar
    return m, shifted, p, z_bar, H


def entropy(logits, mask=None):
    """The entropy of each token's categorical policy, from its logits:

        H = −Σ_k p_k log p_k = logsumexp(z) − Σ_k p_k z_k,   p = softmax(z)

    Reference: verl `compute_entropy_loss` (utils.torch_functional.entropy_from_logits, then
    agg_loss: the entropy bonus is −coef·aggregate(H)), OpenRLHF and TRL's logged entropy.
    Note: computed with the maximum logit subtracted, so logits of any size give the same bits
    as their shifted copy; H ∈ [0, log V]. A −inf logit (vocabulary masking: top-k, top-p) is
    a category of probability 0, whose p·log p is 0: H([−inf, 0, 0]) = log 2.

    Worked example: z = [0, 0] → H = log 2 = 0.693147; z = [log 0.7, log 0.3] →
    H = −(0.7 log 0.7 + 0.3 log 0.3) = 0.610864.

    Args:
      logits: [B, T, V] float (or [T, V]), V ≥ 2.
      mask: [B, T] bool or 0/1, or None.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m, _, _, _, H = _softmax_parts(logits, mask)
    return np.where(m, H, 0.0)


def entropy_vjp(g, logits, mask=None):
    """VJP of `entropy` wrt logits.

    Gradient: ∂logsumexp/∂z_k = p_k, and ∂(Σ_j p_j z_j)/∂z_k = p_k + p_k z_k − p_k Σ_j p_j z_j
    (from ∂p_j/∂z_k = p_j(δ_jk − p_k)), so
        ∂H/∂z_k = −p_k (z_k − Σ_j p_j z_j) = −p_k (log p_k + H),
    which sums to 0 over k (a shift of every logit leaves H unchanged). ∂L/∂z = g·that.
    At a −inf logit p_k = 0 and p_k·log p_k → 0, so its entry is 0.

    Returns:
      {"logits": [B, T, V]} float64, 0 at masked tokens.
    """
    m, shifted, p, z_bar, _ = _softmax_parts(logits, mask)
    gm = np.where(m, args.cotangent(OPS, g, "g", OPS.spec("mask", m)), 0.0)
    return {"logits": gm[..., None] * -p * (shifted - z_bar[..., None])}
