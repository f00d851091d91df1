"""KL penalty estimators in torch (Schulman, "Approximating KL Divergence", 2020)."""
import torch

from ref_common import args

from . import _tensors as tt
from ._tensors import OPS


def k_estimate(kind: str, log_ratio: torch.Tensor) -> torch.Tensor:
    """The estimator of KL(p‖q) at a sample y ~ p, from log_ratio = log(q(y)/p(y)):

        k1 = −log_ratio,  k2 = ½·log_ratio²,  k3 = expm1(log_ratio) − log_ratio,  abs = |log_ratio|

    (k3 with exp saturating at the dtype's largest float). The one place in ref_torch these
    formulas are written: `kl_penalty`, `approx_kl` and the exact analysis in `estimators`.
    """
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.pow(2)
    if kind == "k3":
        capped = torch.clamp(log_ratio, max=tt.log_float_max(log_ratio.dtype))
        return torch.expm1(capped) - capped
    return log_ratio.abs()


def kl_penalty(logp, ref_logp, mask=None, *, kind="k3", clamp=None):
    """Per-token estimator of KL(π‖ref) at y ~ π, with log_ratio = log ref(y) − log π(y) (see
    `k_estimate`). `clamp = (input_bound, output_bound)` clips log_ratio, then the estimate.
    Args/Returns: as ref_numpy.kl_penalty, with tensors.
    """
    a = args.kl_penalty(OPS, logp, ref_logp, mask, kind, clamp)
    m = a.mask
    zero = tt.zero(a.logp)
    log_ratio = torch.where(m, a.ref_logp, zero) - torch.where(m, a.logp, zero)
    if a.in_bound is not None:
        log_ratio = torch.clamp(log_ratio, -a.in_bound, a.in_bound)
    est = k_estimate(a.kind, log_ratio)
    if a.out_bound is not None:
        est = torch.clamp(est, -a.out_bound, a.out_bound)
    return torch.where(m, est, zero)


def approx_kl(logp, old_logp, mask=None, *, kind="k1"):
    """Token-mean estimate of KL(π_old‖π) from rollout tokens x ~ π_old: `k_estimate` at
    log_ratio = logp − old_logp = log(π(x)/π_old(x)).
    Args/Returns: as ref_numpy.approx_kl, with tensors (a 0-d tensor).
    """
    a = args.approx_kl(OPS, logp, old_logp, mask, kind)
    m = a.mask
    zero = tt.zero(a.logp)
    est = k_estimate(a.kind, torch.where(m, a.logp, zero) - torch.where(m, a.old_logp, zero))
    total = torch.where(m, est, zero).sum()
    return total / a.n_valid if a.n_valid else total * 0


def kl_rewards(scores, logp, ref_logp, mask=None, *, beta=0.05, kind="k1", clamp=None):
    """r_t = s_t − β·k_t: task scores (per token, or per sequence at the last valid token)
    minus the β-weighted per-token KL estimate of `kl_penalty`.
    Args/Returns: as ref_numpy.kl_rewards, with tensors.
    """
    k = kl_penalty(logp, ref_logp, mask, kind=kind, clamp=clamp)
    a = args.kl_rewards(OPS, scores, logp, mask, beta)
    m = OPS.all_valid(k) if mask is None else OPS.as_mask(mask)
    zero = tt.zero(k)
    if a.per_seq:
        position = torch.arange(m.shape[-1], device=m.device)
        last = torch.where(m, position, torch.full_like(position, -1)).max(dim=-1).values
        s = torch.where((position[None, :] == last[:, None]) & m,
                        torch.where(m.any(dim=-1), a.scores, zero)[:, None], zero)
    else:
        s = torch.where(m, a.scores, zero)
    return torch.where(m, s - a.beta * k, zero)
