"""Rollout-correction weights, REINFORCE / DRO, DPPO and GMPO in torch, written in objective form
from their equations; autograd gives the gradients (the weights, DPPO's truncated ratio and its
trust-region indicator are detached, as their definitions say)."""
import torch

from ref_common import args, checks

from . import _tensors as tt
from ._tensors import OPS
from .policy_losses import _prepare, ppo_clip_loss


def _weights(log_ratio, m, c):
    """Detached weights of validated conventions `c` from padding-free token log-ratios."""
    log_ratio = log_ratio.detach()
    zero = tt.zero(log_ratio)
    if c.level == "sequence":
        s = log_ratio.sum(dim=-1, keepdim=True)
        if c.seq_stat == "mean":
            s = s / m.sum(dim=-1, keepdim=True).clamp(min=1)
        s = s.expand(log_ratio.shape)
    else:
        s = log_ratio
    x = log_ratio
    if c.log_ratio_clamp is not None:
        s, x = (torch.clamp(v, -c.log_ratio_clamp, c.log_ratio_clamp) for v in (s, x))
    cap = tt.log_float_max(log_ratio.dtype)
    unit = torch.exp(torch.clamp(s, max=cap))
    if c.mode == "truncate":
        bounded = c.lower is not None or c.upper is not None
        w = torch.clamp(unit, min=c.lower, max=c.upper) if bounded else unit
    else:
        keep = torch.ones_like(m)
        if c.lower is not None:
            keep = keep & (unit >= c.lower)
        if c.upper is not None:
            keep = keep & (unit <= c.upper)
        own = unit if c.kept == "unit" else torch.exp(torch.clamp(x, max=cap))
        w = torch.where(keep, own, zero)
    return torch.where(m, w, zero)


def rollout_is_weights(logp, rollout_logp, mask=None, *, level="token", mode="truncate",
                       lower=None, upper=2.0, seq_stat="sum", kept="unit",
                       log_ratio_clamp=None):
    """w ≈ π_train/π_rollout per token (or per sequence: exp of the sum or mean of the token
    log-ratios), truncated into [lower, upper] or zeroed outside it; detached.
    Args/Returns: as ref_numpy.rollout_is_weights, with tensors.
    """
    a = args.pair_inputs(OPS, logp, rollout_logp, mask, ("logp", "rollout_logp"))
    c = args.rollout_is(level, mode, lower, upper, seq_stat, kept, log_ratio_clamp)
    zero = tt.zero(a.first)
    x = torch.where(a.mask, a.first, zero) - torch.where(a.mask, a.second, zero)
    return _weights(x, a.mask, c)


def decoupled_ppo_loss(logp, prox_logp, behave_logp, advantages, mask=None, *, clip_low=0.2,
                       clip_high=None, clip_c=None, is_level="token", is_mode="truncate",
                       is_lower=None, is_upper=None, is_seq_stat="mean"):
    """Decoupled PPO (arXiv:2110.00641 §3; AReaL arXiv:2505.24298): PPO's clipped loss with the
    ratio exp(logp − prox_logp), times the detached behaviour weight π_prox/π_behave (as
    rollout_is_weights of prox_logp against behave_logp; 1 with is_level None).
    Args/Returns: as ref_numpy.decoupled_ppo_loss, with tensors.
    """
    d = args.decoupled(OPS, logp, prox_logp, behave_logp, advantages, mask, clip_low, clip_high,
                       clip_c, is_level, is_mode, is_lower, is_upper, is_seq_stat)
    m = d.ratio.mask
    zero = tt.zero(d.ratio.logp)
    with torch.no_grad():
        if d.weights.level is None:
            w = torch.where(m, torch.ones_like(zero), zero)
        else:
            x = torch.where(m, d.ratio.old_logp, zero) - torch.where(m, d.behave_logp, zero)
            w = _weights(x, m, d.weights)
    loss = ppo_clip_loss(logp, prox_logp, advantages, mask, clip_low=clip_low,
                         clip_high=clip_high, clip_c=clip_c)
    return torch.where(m & (w != 0), w * loss, zero)


def opsm_mask(logp, old_logp, advantages, mask=None, *, delta=1e-4):
    """Off-policy sequence masking (DeepSeek-V3.2, arXiv:2512.02556 §3.1): 0 where A < 0 and the
    sequence's mean log(π_old/π) exceeds δ, else 1; 0 at padding. Not differentiated.
    Args/Returns: as ref_numpy.opsm_mask, with tensors.
    """
    with torch.no_grad():
        lp0, old0, adv0, m, _, zero = _prepare(logp, old_logp, advantages, mask, None)
        delta = args.opsm(delta)
        count = m.sum(dim=-1, keepdim=True).clamp(min=1)
        drift = torch.where(m, old0 - lp0, zero).sum(dim=-1, keepdim=True) / count
        dropped = (adv0 < 0) & (drift > delta)
        return torch.where(m & ~dropped, torch.ones_like(lp0), zero)


def tv_filter_mask(logp, old_logp, advantages, mask=None, *, lower=None, upper=None,
                   log_ratio_clamp=None):
    """The TV sequence filter (VACO, arXiv:2603.01365, as open-instruct implements it): with
    ρ = exp(logp − old_logp), a sequence is out when its mean |ρ − 1| over its valid tokens is
    above `upper` or below `lower`; in an out sequence a token is dropped (0) where
    sign(log ρ)·A > 0, else kept (1); 0 at padding. Not differentiated.
    Args/Returns: as ref_numpy.tv_filter_mask, with tensors.
    """
    with torch.no_grad():
        lp0, old0, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask,
                                                   log_ratio_clamp)
        lower, upper = args.tv_filter(lower, upper)
        count = m.sum(dim=-1, keepdim=True).clamp(min=1)
        drift = torch.where(m, (ratio - 1).abs(), zero).sum(dim=-1, keepdim=True) / count
        out = torch.zeros_like(drift, dtype=torch.bool)
        if upper is not None:
            out = out | (drift > upper)
        if lower is not None:
            out = out | (drift < lower)
        widens = torch.sign(lp0 - old0) * adv0 > 0
        return torch.where(m & ~(out & widens), torch.ones_like(lp0), zero)


def m2po_mask(logp, old_logp, mask=None, *, threshold=0.04):
    """M2PO (arXiv:2510.01161): over the batch's valid tokens, mask those of largest
    (logp − old_logp)², one by one from the top, until the mean of the rest is under τ (all
    but one when it never is). Not differentiated.
    Args/Returns: as ref_numpy.m2po_mask, with tensors.
    """
    a, tau = args.m2po(OPS, logp, old_logp, mask, threshold)
    with torch.no_grad():
        zero = tt.zero(a.first)
        d = torch.where(a.mask, a.first, zero) - torch.where(a.mask, a.second, zero)
        sq = (d * d)[a.mask]
        n = sq.numel()
        keep = torch.zeros_like(d)
        if n == 0:
            return keep
        # rank r of each token from the top: masking the r largest leaves the n − r smallest
        ranks = torch.empty(n, dtype=torch.long, device=d.device)
        ranks[torch.sort(sq, descending=True, stable=True).indices] = torch.arange(
            n, device=d.device)
        top = torch.sort(sq, descending=True, stable=True).values
        rest_mean = torch.flip(torch.cumsum(torch.flip(top, [0]), 0), [0]) / torch.arange(
            n, 0, -1, device=d.device, dtype=d.dtype)
        under = torch.nonzero(rest_mean < tau)
        k = int(under[0]) if under.numel() else n - 1
        keep[a.mask] = (ranks >= k).to(d.dtype)
        return keep


def reinforce_loss(logp, old_logp, advantages, mask=None, *, beta=0.0, is_level=None,
                   is_mode="truncate", is_lower=None, is_upper=2.0, is_log_ratio_clamp=20.0):
    """l = sg(w)·(−A·logp + ½β(logp − old_logp)²), w the rollout weight of logp against
    old_logp when is_level is set, else 1.
    Args/Returns: as ref_numpy.reinforce_loss, with tensors.
    """
    lp0, old0, adv0, m, _, zero = _prepare(logp, old_logp, advantages, mask, None)
    beta, c = args.reinforce(beta, is_level, is_mode, is_lower, is_upper, is_log_ratio_clamp)
    w = torch.ones_like(lp0) if c.level is None else _weights(lp0 - old0, m, c)
    d = lp0 - old0
    return torch.where(m, w * (-adv0 * lp0 + 0.5 * beta * d * d), zero)


def dppo_loss(logp, old_logp, advantages, mask=None, *, divergence="tv", clip_low=0.2,
              clip_high=None, clip_c=3.0, log_ratio_clamp=20.0, kl_eps=0.0, form="logp"):
    """DPPO (arXiv:2602.04879): l = −A·sg(min(r, C))·logp·sg(kept) (form "logp"), or
    l = −A·min(r, C)·sg(kept) with the ratio attached (form "ratio", prime-rl's default loss);
    kept where the binary TV (p − q) or binary KL between the token's new and old probabilities
    is inside δ in the advantage's direction.
    Args/Returns: as ref_numpy.dppo_loss, with tensors.
    """
    lp0, old0, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask,
                                               log_ratio_clamp)
    p = args.dppo(divergence, clip_low, clip_high, clip_c, kl_eps, form)
    w = ratio if p.clip_c is None else torch.clamp(ratio, max=p.clip_c)
    with torch.no_grad():
        pi, q = torch.exp(lp0), torch.exp(old0)
        if p.divergence == "tv":
            pos_ok, neg_ok = pi - q <= p.hi, pi - q >= -p.lo
        else:
            for name, x in (("logp", lp0), ("old_logp", old0)):
                bad = torch.nonzero(x > 0)
                if len(bad):
                    i = tuple(int(k) for k in bad[0])
                    args.not_a_log_probability(name, i, x[i].item())
            not_q, not_pi = -torch.expm1(old0), -torch.expm1(lp0)
            # 0·log 0 = 0 where q = 1 (its limit), so the binary KL there is −log p
            tail = not_q * (torch.log(not_q + p.kl_eps) - torch.log(not_pi + p.kl_eps))
            binary_kl = q * (old0 - lp0) + torch.where(not_q > 0, tail, torch.zeros_like(tail))
            pos_ok = (binary_kl <= p.hi) | (pi <= q)
            neg_ok = (binary_kl <= p.lo) | (pi >= q)
        kept = torch.where(adv0 > 0, pos_ok, neg_ok) & m
    if p.form == "ratio":
        return torch.where(kept, -adv0 * w, zero)
    return torch.where(kept, -adv0 * w.detach() * lp0, zero)


def gmpo_loss(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None, eps=0.0):
    """GMPO (arXiv:2507.20673): −mean_i Ā_i·exp(Σ_t ρ̃_t/(L_i + eps)), ρ̃ the log-ratio clipped
    pessimistically per token (PPO's min, in log space).
    Args/Returns: as ref_numpy.gmpo_loss, with tensors.
    """
    lp0, old0, adv0, m, _, zero = _prepare(logp, old_logp, advantages, mask, None)
    p = args.gmpo(clip_low, clip_high, eps)
    if lp0.dim() == 1:
        lp0, old0, adv0, m = (x.unsqueeze(0) for x in (lp0, old0, adv0, m))
    log_ratio = lp0 - old0
    sign = torch.sign(adv0)
    clipped = torch.clamp(log_ratio, -p.lo, p.hi)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    length = m.sum(dim=-1).to(lp0.dtype) + p.eps
    length = torch.where(length > 0, length, torch.ones_like(length))
    mean_log_ratio = torch.where(m, pessimistic, zero).sum(dim=-1) / length
    mean_adv = adv0.sum(dim=-1) / length
    ratio = torch.exp(torch.clamp(mean_log_ratio, max=tt.log_float_max(lp0.dtype)))
    return (-mean_adv * ratio).sum() / max(mean_adv.shape[0], 1)


def kl_cov_loss(logp, old_logp, advantages, mask=None, *, ratio=2e-4, coef=0.1):
    """KL-Cov (arXiv:2505.22617): −A·r everywhere, plus coef·|log r| on the top
    max(1, ⌊N·ratio⌋) valid tokens by the (detached) covariance (A − Ā)(logp − mean logp).
    Args/Returns: as ref_numpy.kl_cov_loss, with tensors.
    """
    lp0, old0, adv0, m, ratio_, zero = _prepare(logp, old_logp, advantages, mask, None)
    share = checks.in_range("ratio", ratio, 0.0, 1.0, lo_open=True)
    coef = checks.non_negative("coef", coef)
    flat_m = m.reshape(-1)
    n = int(flat_m.sum())
    penalty = torch.zeros_like(lp0).reshape(-1)
    if n:
        with torch.no_grad():
            a = adv0.reshape(-1)[flat_m]
            lp = lp0.reshape(-1)[flat_m]
            cov = (a - a.mean()) * (lp - lp.mean())
            k = max(1, int(n * share))
            # the largest k, ties to the first position (a stable sort of −cov)
            top = torch.sort(-cov, stable=True).indices[:k]
            where = torch.nonzero(flat_m)[:, 0][top]
        penalty = penalty.index_fill(0, where, 1.0)
    penalty = penalty.reshape(lp0.shape)
    loss = -adv0 * ratio_ + coef * (lp0 - old0).abs() * penalty
    return torch.where(m, loss, zero)
