"""KL penalty estimators in torch (Schulman, "Approximating KL Divergence", 2020)."""
import torch

from ref_numpy import _checks

from . import _tensors as tt


def kl_penalty(logp, ref_logp, mask=None, *, kind="k3", clamp=None):
    """Per-token estimator of KL(π‖ref) at y ~ π, with log_ratio = log ref(y) − log π(y):

        k1 = −log_ratio,  k2 = ½·log_ratio²,  k3 = expm1(log_ratio) − log_ratio,  abs = |log_ratio|

    `clamp = (input_bound, output_bound)` clips log_ratio, then the estimate.
    Args/Returns: as ref_numpy.kl_penalty, with tensors.
    """
    lp = tt.token("logp", logp)
    ref = tt.like("ref_logp", ref_logp, "logp", lp)
    m = tt.mask_of(mask, "logp", lp)
    kind = _checks.choice("kind", kind, _checks.KL_KINDS)
    in_bound, out_bound = _checks.clamp_pair("clamp", clamp)
    tt.finite_at_valid("logp", lp, m)
    tt.finite_at_valid("ref_logp", ref, m)
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    log_ratio = torch.where(m, ref, zero) - torch.where(m, lp, zero)
    if in_bound is not None:
        log_ratio = torch.clamp(log_ratio, -in_bound, in_bound)
    if kind == "k1":
        est = -log_ratio
    elif kind == "k2":
        est = 0.5 * log_ratio.pow(2)
    elif kind == "k3":
        capped = torch.clamp(log_ratio, max=tt.log_float_max(lp.dtype))
        est = torch.expm1(capped) - capped
    else:
        est = log_ratio.abs()
    if out_bound is not None:
        est = torch.clamp(est, -out_bound, out_bound)
    return torch.where(m, est, zero)


def approx_kl(logp, old_logp, mask=None, *, kind="k1"):
    """Token-mean estimate of KL(π_old‖π) from rollout tokens x ~ π_old, with
    log_ratio = logp − old_logp: k1 = −log_ratio, k2 = ½log_ratio², k3 = expm1(log_ratio) −
    log_ratio. Args/Returns: as ref_numpy.approx_kl, with tensors (a 0-d tensor).
    """
    lp = tt.token("logp", logp)
    old = tt.like("old_logp", old_logp, "logp", lp)
    m = tt.mask_of(mask, "logp", lp)
    kind = _checks.choice("kind", kind, ("k1", "k2", "k3"))
    tt.finite_at_valid("logp", lp, m)
    tt.finite_at_valid("old_logp", old, m)
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    log_ratio = torch.where(m, lp, zero) - torch.where(m, old, zero)
    if kind == "k1":
        est = -log_ratio
    elif kind == "k2":
        est = 0.5 * log_ratio.pow(2)
    else:
        capped = torch.clamp(log_ratio, max=tt.log_float_max(lp.dtype))
        est = torch.expm1(capped) - capped
    n = int(m.sum())
    total = torch.where(m, est, zero).sum()
    return total / n if n else total * 0
