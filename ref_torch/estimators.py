"""Exact KL-estimator analysis in torch: enumeration over a categorical policy, autograd for
every gradient (see ref_numpy.estimators for the definitions).

Expectations are sums of per-category products mass(x)·f(x). For a peaked π, a category with
π(x) = 0 in float64 can still carry mass·f: π·e^u is ref(x) (u = log ref − log π), and ½u² of a
huge logit gap overflows while π·½u² is 0. `_terms` forms such products in log space, and
autograd differentiates that form; elsewhere it multiplies directly.
"""
import math

import torch

from ref_common import args

from . import _tensors as tt
from ._tensors import OPS
from .kl import k_estimate


def _estimate(kind, log_pi, log_ref):
    return k_estimate(kind, log_ref - log_pi)   # log(ref(x)/π(x)) at every category x


def _overflows(kind, u):
    """Where k(u) is beyond float64, and the log of its size there as n·u + rest:
    k3 = e^u − 1 − u → e^u (n = 1, rest 0); k2 = ½u² → (n = 0, rest = 2·log|u| − log 2).
    The terms dropped are below 1e-150 of the kept one."""
    if kind == "k3":
        return u > tt.log_float_max(u.dtype), 1, torch.zeros_like(u)
    if kind == "k2":
        log_u = torch.log(u.abs())
        big = log_u > 0.5 * (math.log(2.0) + math.log(torch.finfo(u.dtype).max))
        return big, 0, 2.0 * torch.where(big, log_u, torch.zeros_like(u)) - math.log(2.0)
    return torch.zeros_like(u, dtype=torch.bool), 0, torch.zeros_like(u)


def _terms(kind, log_mass, log_pi, log_ref, factors, direct, as_written):
    """mass(x)·Π_i f_i(x) at every category x, differentiable.

    direct: u ↦ the product as written (u = log ref − log π, made 0 where it is not used);
    as_written: its value at u itself, already formed by the caller.
    factors: callables u ↦ (tensor, from_k): a factor of u (from_k: it overflows where k(u)
    does, with k's size), or tensors (plain factors that never overflow), for the log form.
    Categories where Π f is finite and no k overflowed take `direct` (mass ≤ 1, or bounded
    by μ/π, so the product and its gradient stay finite); the others
    exp((log mass − n·log π) + n·log ref + Σ rest)·Π sign, so that mass = π and one e^u give
    exactly ref(x). Each branch sees inputs made safe where it is not used, so no NaN or inf
    reaches the gradient.
    """
    u = (log_ref - log_pi).detach()
    big, n_big, rest_big = _overflows(kind, u)
    with torch.no_grad():
        value = torch.ones_like(u)
        for f in factors:
            value = value * (f(u)[0] if callable(f) else f)
        direct_ok = torch.isfinite(value) & ~big
    if bool(direct_ok.all()):
        return as_written
    u = log_ref - log_pi
    one = torch.ones_like(u)
    near = direct(torch.where(direct_ok, u, torch.zeros_like(u)))
    u_log = torch.where(direct_ok | big, one, u)
    n, rest, sign = 0, torch.zeros_like(u), one
    for f in factors:
        if callable(f):
            v, from_k = f(u_log)
            v = torch.where(direct_ok, one, v)
            part = torch.log(v.abs())
            sign = sign * torch.where(big & from_k, one, torch.sign(v))
            if from_k:
                n = n + torch.where(big, n_big, 0)
                part = torch.where(big, rest_big, part)
        else:
            v = torch.where(direct_ok, one, f)
            sign, part = sign * torch.sign(v), torch.log(v.abs())
        rest = rest + part
    exponent = (log_mass - n * log_pi) + n * log_ref + rest
    exponent = torch.where(direct_ok, torch.zeros_like(u), exponent)
    return torch.where(direct_ok, near, sign * exponent.exp())


def _k_factor(kind, shift=None):
    """The factor k(u) − shift, which overflows where k does."""
    if shift is None:
        return lambda u: (k_estimate(kind, u), True)
    return lambda u: (k_estimate(kind, u) - shift, True)


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
    mean = torch.sum(_terms(kind, log_pi, log_pi, log_ref, [_k_factor(kind)],
                            lambda u: pi * k_estimate(kind, u), pi * est))
    var = torch.sum(_terms(kind, log_pi, log_pi, log_ref, [_k_factor(kind, mean)] * 2,
                           lambda u: pi * (k_estimate(kind, u) - mean).pow(2),
                           pi * (est - mean).pow(2)))
    return {"kl_forward": forward, "kl_reverse": torch.sum(ref * (log_ref - log_pi)),
            "mean": mean, "bias": mean - forward, "var": var,
            "log_var": _log_var(kind, log_pi, log_ref, est, mean)}


def _log_var(kind, log_pi, log_ref, est, mean):
    """log Σ_x π(x)(k(x) − mean)², finite where var is beyond float64.

    Where k(x) overflows (`_overflows`: k ≈ e^(n·u + rest)), (k − mean)² ≈ e^(2(n·u + rest))
    (mean is finite, below 1e-300 of k there), so log π + 2·log|k − mean| is
    (1 − 2n)·log π + 2n·log ref + 2·rest; where only the square overflows, log π + 2·log|k −
    mean|. The other categories are summed directly and enter as the log of their sum. Each
    branch sees safe inputs where it is not used, so autograd gives no NaN.
    """
    u = (log_ref - log_pi).detach()
    big, n, rest = _overflows(kind, u)
    dev = est - mean
    sq = dev.detach().pow(2)
    log_form = big | ~torch.isfinite(log_pi.detach().exp() * sq)
    neg = torch.full_like(u, -math.inf)
    safe_dev = torch.where(log_form & ~big, dev, torch.ones_like(dev))
    logged = torch.where(big, (1 - 2 * n) * log_pi + 2 * n * log_ref + 2 * rest,
                         log_pi + 2 * torch.log(safe_dev.abs()))
    logged = torch.where(log_form, logged, neg)
    direct = torch.sum(torch.where(log_form, torch.zeros_like(u),
                                   log_pi.exp() * torch.where(log_form, torch.zeros_like(u),
                                                              dev).pow(2)))
    positive = direct.detach() > 0
    log_direct = torch.where(positive, torch.log(torch.where(positive, direct,
                                                             torch.ones_like(direct))),
                             torch.tensor(-math.inf, dtype=u.dtype))
    return torch.logsumexp(torch.cat([logged, log_direct.reshape(1)]), dim=0)


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
        log_mu = log_pi.detach()
    else:
        mu = torch.softmax(sample_logits.detach(), dim=-1)
        log_mu = torch.log_softmax(sample_logits.detach(), dim=-1)
    if is_weight is None:
        weight = torch.ones_like(mu)
        log_mass = log_mu                                   # log(μ·W)
    else:
        weight = log_pi.exp() / mu
        log_mass = log_pi
        if is_weight == "detached":
            weight = weight.detach()
            log_mass = log_mu + (log_pi - log_mu).detach()
    est = _estimate(kind, log_pi, log_ref)
    per_sample = _terms(kind, log_mass, log_pi, log_ref, [_k_factor(kind)],
                        lambda u: mu * (weight * k_estimate(kind, u)), mu * (weight * est))
    bad = ~torch.isfinite(per_sample.detach())
    args.estimator_overflow(int(torch.nonzero(bad)[0]) if bool(bad.any()) else None)
    if use == "loss":
        total = per_sample.sum()
    else:
        # S = W·sg(k)·log π(x). Where every μ·W·k is formed directly, as written; else
        # Σ sg(μ·W·k)·log π, whose value may overflow while its gradient does not (a product
        # with a constant is not used backwards), plus, for an attached W, Σ μ·W·sg(k·log π)
        # for the gradient through W
        if bool(torch.isfinite(est * log_pi).all() &
                ~_overflows(kind, (log_ref - log_pi).detach())[0].any()):
            total = torch.sum(mu * (weight * est.detach() * log_pi))
        else:
            total = torch.sum(per_sample.detach() * log_pi)
            if is_weight == "attached":
                total = total + torch.sum(_terms(
                    kind, log_mass, log_pi.detach(), log_ref,
                    [_k_factor(kind), log_pi.detach()],
                    lambda u: mu * (weight * (k_estimate(kind, u) * log_pi).detach()),
                    mu * (weight * (est * log_pi).detach())))
    (expected,) = torch.autograd.grad(total, theta)

    def grad_of(f):
        t = logits.detach().clone().requires_grad_(True)
        lp = torch.log_softmax(t, dim=-1)
        (gr,) = torch.autograd.grad(f(lp, log_ref), t)
        return gr

    return {"expected": expected,
            "grad_kl_forward": grad_of(lambda lp, lr: torch.sum(lp.exp() * (lp - lr))),
            "grad_kl_reverse": grad_of(lambda lp, lr: torch.sum(lr.exp() * (lr - lp)))}
