"""Policy and value losses in torch, written in objective form from the papers' equations;
autograd gives the gradients (CISPO's weight is detached, as its definition says)."""
import math

import torch

from ref_common import args

from . import _tensors as tt
from ._tensors import OPS


def _prepare(logp, old_logp, advantages, mask, log_ratio_clamp):
    """Padding-free tensors and the ratio exp(logp − old_logp) (log-ratio clamped when asked)."""
    a = args.ratio_inputs(OPS, logp, old_logp, advantages, mask, log_ratio_clamp)
    lp, m, adv = a.logp, a.mask, a.advantages
    zero = tt.zero(lp)
    if a.per_seq:
        adv = torch.where(m.any(dim=-1), adv, zero)[:, None].expand(lp.shape)
    lp0, old0, adv0 = (torch.where(m, x, zero) for x in (lp, a.old_logp, adv))
    log_ratio = lp0 - old0
    if a.log_ratio_clamp is not None:
        log_ratio = torch.clamp(log_ratio, -a.log_ratio_clamp, a.log_ratio_clamp)
    # exp saturates at the largest float rather than overflowing (see ref_numpy._arrays)
    ratio = torch.exp(torch.clamp(log_ratio, max=tt.log_float_max(lp.dtype)))
    return lp0, old0, adv0, m, ratio, zero


def _level_ratio(logp, old_logp, advantages, mask, log_ratio_clamp, level):
    """`_prepare`, with the ratio at `level`: the token ratio e^ρ_t, the sequence ratio
    s = e^ρ̄ (ρ̄ the row's mean log-ratio over its valid tokens), their arithmetic mean
    (e^ρ_t + s)/2 or their geometric mean √(e^ρ_t·s) (ART's importance_sampling_level). All
    attached: autograd differentiates through ρ̄."""
    level = args.ratio_level(level)
    lp0, old0, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask,
                                               log_ratio_clamp)
    if level == "token":
        return lp0, old0, adv0, m, ratio, zero
    log_ratio = lp0 - old0
    if log_ratio_clamp is not None:
        log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    log_ratio = torch.where(m, log_ratio, zero)
    cap = tt.log_float_max(lp0.dtype)
    mean = log_ratio.sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(min=1)
    seq = torch.exp(torch.clamp(mean, max=cap)).expand(lp0.shape)
    if level == "sequence":
        ratio = seq
    elif level == "average":
        ratio = 0.5 * (ratio + seq)
    else:
        ratio = torch.exp(torch.clamp(0.5 * (log_ratio + mean), max=cap))
    return lp0, old0, adv0, m, ratio, zero


def clipped_objective(ratio, adv, lo, hi):
    """PPO's clipped objective min(r·A, clip(r, lo, hi)·A), with ties kept on the unclipped
    term, and where the clipped term is the one taken. The one place in ref_torch this rule is
    written: PPO, GSPO and the logged clip fraction use it."""
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, lo, hi) * adv
    clipped = surr2 < surr1
    return torch.where(clipped, surr2, surr1), clipped


def ppo_clip_loss(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                  clip_c=None, delta=None, log_ratio_clamp=None, level="token"):
    """PPO clipped surrogate as a loss (arXiv:1707.06347 eq. 7), clip-higher, dual clip.

    objective = min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A); for A < 0 with dual clip:
    objective = max(objective, c·A). TRL's δ caps the unclipped ratio: min(r, δ)·A.
    loss = −objective. Ties keep the unclipped term. `level`: the ratio r (`_level_ratio`).
    Args/Returns: as ref_numpy.ppo_clip_loss, with tensors.
    """
    lp0, _, adv0, m, ratio, zero = _level_ratio(logp, old_logp, advantages, mask,
                                                log_ratio_clamp, level)
    p = args.ppo(clip_low, clip_high, clip_c, delta)
    if p.delta is not None:
        # min(r, δ)·A unclipped; the clipped term sees the capped ratio too (equal, as δ ≥ hi)
        ratio = torch.clamp(ratio, max=p.delta)
    objective, _ = clipped_objective(ratio, adv0, p.lo, p.hi)
    if p.clip_c is not None:
        floor = p.clip_c * adv0
        objective = torch.where((adv0 < 0) & (objective < floor), floor, objective)
    return torch.where(m, -objective, zero)


def sapo_loss(logp, old_logp, advantages, mask=None, *, tau_pos=1.0, tau_neg=1.05,
              log_ratio_clamp=None, level="token"):
    """SAPO (arXiv:2511.20347): the soft gate f_τ(r) = σ(τ(r − 1))·4/τ in place of PPO's clip,
    loss = −f_τ(r)·A, τ = tau_pos where A > 0 else tau_neg; at sequence level r is the
    sequence's exp(mean log-ratio) for each of its tokens.
    Args/Returns: as ref_numpy.sapo_loss, with tensors.
    """
    p = args.sapo(tau_pos, tau_neg, level)
    if p.level == "token":
        _, _, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask, log_ratio_clamp)
    else:
        lp0, old0, adv0, m, _, zero = _prepare(logp, old_logp, advantages, mask,
                                               log_ratio_clamp)      # validates the clamp
        mean_log = (lp0 - old0).sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(
            min=1)
        if log_ratio_clamp is not None:
            mean_log = torch.clamp(mean_log, -log_ratio_clamp, log_ratio_clamp)
        ratio = torch.exp(torch.clamp(mean_log, max=tt.log_float_max(lp0.dtype))).expand(
            lp0.shape)
    tau = torch.where(adv0 > 0, torch.full_like(adv0, p.tau_pos),
                      torch.full_like(adv0, p.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return torch.where(m, -gate * adv0, zero)


def vespo_loss(logp, old_logp, advantages, mask=None, *, k_pos=2.0, lambda_pos=3.0, k_neg=3.0,
               lambda_neg=2.0, log_ratio_clamp=20.0, log_w_min=math.log(1e-8), log_w_max=20.0):
    """VESPO: l = −sg(φ(w))·A·logp, φ(w) = e^λ·w^k·e^(−λw) of the sequence ratio w (product of
    the token ratios, clamped), k and λ by the sign of A. Reference: arXiv:2602.10693.
    Args/Returns: as ref_numpy.vespo_loss, with tensors.
    """
    lp0, old0, adv0, m, _, zero = _prepare(logp, old_logp, advantages, mask, None)
    p = args.vespo(k_pos, lambda_pos, k_neg, lambda_neg, log_ratio_clamp, log_w_min, log_w_max)
    with torch.no_grad():
        log_ratio = lp0 - old0
        if p.log_ratio_clamp is not None:
            log_ratio = torch.clamp(log_ratio, -p.log_ratio_clamp, p.log_ratio_clamp)
        log_w = torch.clamp(torch.where(m, log_ratio, zero).sum(dim=-1, keepdim=True),
                            p.log_w_min, p.log_w_max)
        nonneg = adv0 >= 0
        k = torch.where(nonneg, torch.full_like(adv0, p.k_pos), torch.full_like(adv0, p.k_neg))
        lam = torch.where(nonneg, torch.full_like(adv0, p.lambda_pos),
                          torch.full_like(adv0, p.lambda_neg))
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return torch.where(m, -phi * adv0 * lp0, zero)


def cispo_loss(logp, old_logp, advantages, mask=None, *, clip_high=5.0, clip_low=None,
               bound="absolute", log_ratio_clamp=None, level="token"):
    """CISPO (MiniMax-M1, arXiv:2506.13585 eq. 4–5): loss = −sg(w)·A·logp.

    w = min(r, clip_high) ("absolute") or clip(r, 1 − clip_low, 1 + clip_high) ("relative");
    w is detached: it weights the REINFORCE gradient but is not differentiated. `level`: the
    ratio clipped (`_level_ratio`).
    Args/Returns: as ref_numpy.cispo_loss, with tensors.
    """
    lp0, _, adv0, m, ratio, zero = _level_ratio(logp, old_logp, advantages, mask,
                                                log_ratio_clamp, level)
    w = args.cispo(clip_high, clip_low, bound)
    weight = torch.clamp(ratio, min=w.lo, max=w.hi)
    return torch.where(m, -(weight.detach() * adv0) * lp0, zero)


def gspo_loss(logp, old_logp, advantages, mask=None, *, clip_low=3e-4, clip_high=4e-4,
              form="token", log_ratio_max=None):
    """GSPO (arXiv:2507.18071): PPO's clip on s_i = exp(mean over the row's valid tokens of
    logp − old_logp). form="token": per-token ratio exp(logp − sg(logp) + sg(log s_i)), the
    straight-through GSPO-token; form="sequence": the gradient flows through the mean.
    Args/Returns: as ref_numpy.gspo_loss, with tensors.
    """
    lp0, old0, adv0, m, _, zero = _prepare(logp, old_logp, advantages, mask, None)
    p = args.gspo(clip_low, clip_high, form, log_ratio_max)
    lengths = m.sum(dim=-1, keepdim=True).clamp(min=1).to(lp0.dtype)
    seq_log_ratio = (lp0 - old0).sum(dim=-1, keepdim=True) / lengths
    if p.form == "token":
        log_s = lp0 - lp0.detach() + seq_log_ratio.detach()
    else:
        log_s = seq_log_ratio.expand_as(lp0)
    top = tt.log_float_max(lp0.dtype)
    if p.log_ratio_max is not None:
        top = min(p.log_ratio_max, top)
    s = torch.exp(torch.clamp(log_s, max=top))
    objective, _ = clipped_objective(s, adv0, p.lo, p.hi)
    return torch.where(m, -objective, zero)


def clip_fraction(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                  definition="loss"):
    """Fraction of valid tokens counted as clipped: "loss" (clipped loss > unclipped), "sign"
    (TRL: r > 1+ε with A > 0, or r < 1−ε with A < 0), "ratio" (|r − 1| beyond ε).
    Args/Returns: as ref_numpy.clip_fraction, with tensors (a 0-d tensor).
    """
    lp0, _, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask, None)
    definition, (_, lo, hi) = args.clip_fraction(definition, clip_low, clip_high)
    with torch.no_grad():
        if definition == "loss":
            _, hit = clipped_objective(ratio, adv0, lo, hi)
        elif definition == "sign":
            hit = ((ratio > hi) & (adv0 > 0)) | ((ratio < lo) & (adv0 < 0))
        else:
            hit = (ratio > hi) | (ratio < lo)
        n = m.sum()
        count = (hit & m).sum().to(lp0.dtype)
        return count / n if int(n) else count * 0


def value_loss(values, old_values, returns, mask=None, *, clip=0.2):
    """Clipped value loss ½·max((v − R)², (v_old + clip(v − v_old, ±c) − R)²) (c=None: ½(v − R)²).

    Ties keep the unclipped error. Args/Returns: as ref_numpy.value_loss, with tensors.
    """
    a = args.value_loss(OPS, values, old_values, returns, mask, clip)
    m, c = a.mask, a.clip
    zero = tt.zero(a.values)
    v, v_old, target = (torch.where(m, x, zero) for x in (a.values, a.old_values, a.returns))
    err_unclipped = (v - target).pow(2)
    if c is None:
        return torch.where(m, 0.5 * err_unclipped, zero)
    v_clipped = v_old + torch.clamp(v - v_old, -c, c)
    err_clipped = (v_clipped - target).pow(2)
    worse = torch.where(err_clipped > err_unclipped, err_clipped, err_unclipped)
    return torch.where(m, 0.5 * worse, zero)
