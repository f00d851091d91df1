"""FIPO's future-KL influence weight in torch, from its equation: the discounted sum over the
following tokens is one product with the matrix of γ^(k − t); the weight is detached."""
import torch

from ref_common import args

from . import _tensors as tt
from ._tensors import OPS


def fipo_influence_weights(logp, old_logp, advantages, mask=None, *, decay_rate=32.0,
                           lower=1.0, upper=1.2, ratio_threshold=None, safety_threshold=4.0):
    """f_t = clip(exp F_t, lower, upper), F_t = Σ_{k ≥ t} γ^(k − t)·M_k·(logp_k − old_logp_k),
    γ = 2^(−1/decay_rate), M_k the mask less tokens of ratio above ratio_threshold; held in
    [0.8, 1.0] where A_t < 0 and the ratio exceeds safety_threshold; detached.
    Args/Returns: as ref_numpy.fipo_influence_weights, with tensors.
    """
    a = args.fipo(OPS, logp, old_logp, advantages, mask, decay_rate, lower, upper,
                  ratio_threshold, safety_threshold)
    r = a.ratio
    with torch.no_grad():
        zero = tt.zero(r.logp)
        x = torch.where(r.mask, r.logp, zero) - torch.where(r.mask, r.old_logp, zero)
        adv = r.advantages.unsqueeze(-1) if r.per_seq else r.advantages
        adv = torch.where(r.mask, adv.expand(x.shape), zero)
        cap = tt.log_float_max(x.dtype)
        ratio = torch.exp(torch.clamp(x, max=cap))
        keep = r.mask
        if a.ratio_threshold is not None:
            keep = keep & (ratio <= a.ratio_threshold)
        y = torch.where(keep, x, zero)
        T = x.shape[-1]
        pos = torch.arange(T, device=x.device)
        dist = pos[None, :] - pos[:, None]                      # [t, k]: k − t
        gamma = torch.tensor(a.gamma, dtype=x.dtype, device=x.device)
        decay = torch.where(dist >= 0, gamma ** dist.clamp(min=0).to(x.dtype),
                            torch.zeros((), dtype=x.dtype, device=x.device))
        future = y @ decay.T                                    # F_t = Σ_k decay[t, k]·y_k
        f = torch.exp(torch.clamp(future, max=cap))
        if a.lower is not None or a.upper is not None:
            f = torch.clamp(f, min=a.lower, max=a.upper)
        if a.safety_threshold is not None:
            unsafe = (adv < 0) & (ratio > a.safety_threshold)
            f = torch.where(unsafe, torch.clamp(f, min=0.8, max=1.0), f)
        return torch.where(r.mask, f, zero)
