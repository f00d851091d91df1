"""Exact KL-estimator analysis in torch: enumeration over a categorical policy, autograd for
every gradient (see ref_numpy.estimators for the definitions)."""
import torch

from ref_common import args

from ._tensors import OPS
from .kl import k_estimate


def _estimate(kind, log_pi, log_ref):
    return k_estimate(kind, log_ref - log_pi)   # log(ref(x)/π(x)) at every category x


def kl_estimator_moments(logits, ref_logits, *, kind):
    """KL(π‖ref), KL(ref‖π), and E_π, bias, Var_π of the estimator, by enumeration.

    Args/Returns: as ref_numpy.kl_estimator_moments, with tensors (0-d).
    """
    kind = args.kl_estimator_moments(OPS, logits, ref_logits, kind).kind
    log_pi = torch.log_softmax(logits, dim=-1)
    log_ref = torch.log_softmax(ref_logits, dim=-1)
    pi, ref = log_pi.exp(), log_ref.exp()
    est = _estimate(kind, log_pi, log_ref)
    forward = torch.sum(pi * (log_pi - log_ref))
    mean = torch.sum(pi * est)
    return {"kl_forward": forward, "kl_reverse": torch.sum(ref * (log_ref - log_pi)),
            "mean": mean, "bias": mean - forward, "var": torch.sum(pi * (est - mean).pow(2))}


def kl_estimator_gradient(logits, ref_logits, *, kind, use="loss", sample_logits=None,
                          is_weight=None):
    """E_{x~μ}[∇ S(x)] by autograd through the per-sample term a trainer back-propagates,
    next to ∇KL(π‖ref) and ∇KL(ref‖π) (autograd too). The sampling distribution μ is data
    (detached); S = W·k (use="loss") or W·sg(k)·log π(x) (use="reward"), W = 1, π/μ or sg(π/μ).

    Args/Returns: as ref_numpy.kl_estimator_gradient, with tensors. Its values are gradients,
    so it computes them with grad enabled, under torch.no_grad() too.
    """
    with torch.enable_grad():
        return _kl_estimator_gradient(logits, ref_logits, kind, use, sample_logits, is_weight)


def _kl_estimator_gradient(logits, ref_logits, kind, use, sample_logits, is_weight):
    a = args.kl_estimator_gradient(OPS, logits, ref_logits, kind, use, sample_logits, is_weight)
    kind, use, is_weight = a.kind, a.use, a.is_weight
    theta = logits.detach().clone().requires_grad_(True)
    log_pi = torch.log_softmax(theta, dim=-1)
    log_ref = torch.log_softmax(ref_logits.detach(), dim=-1)
    if sample_logits is None:
        mu = log_pi.exp().detach()
    else:
        mu = torch.softmax(sample_logits.detach(), dim=-1)
    if is_weight is None:
        weight = torch.ones_like(mu)
    else:
        weight = log_pi.exp() / mu
        if is_weight == "detached":
            weight = weight.detach()
    est = _estimate(kind, log_pi, log_ref)
    per_sample = weight * est if use == "loss" else weight * est.detach() * log_pi
    (expected,) = torch.autograd.grad(torch.sum(mu * per_sample), theta)

    def grad_of(f):
        t = logits.detach().clone().requires_grad_(True)
        lp = torch.log_softmax(t, dim=-1)
        (gr,) = torch.autograd.grad(f(lp, log_ref), t)
        return gr

    return {"expected": expected,
            "grad_kl_forward": grad_of(lambda lp, lr: torch.sum(lp.exp() * (lp - lr))),
            "grad_kl_reverse": grad_of(lambda lp, lr: torch.sum(lr.exp() * (lr - lp)))}
