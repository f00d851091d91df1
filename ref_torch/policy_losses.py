"""Policy and value losses in torch, written in objective form from the papers' equations;
autograd gives the gradients (CISPO's weight is detached, as its definition says)."""
import torch

from ref_numpy import _checks

from . import _tensors as tt
from .kl import kl_penalty
from .reduce import aggregate


def _prepare(logp, old_logp, advantages, mask, log_ratio_clamp):
    """Padding-free tensors and the log-ratio ρ = logp − old_logp (clamped when asked)."""
    lp = tt.token("logp", logp)
    old = tt.like("old_logp", old_logp, "logp", lp)
    s = tt.spec("advantages", advantages)
    per_seq = _checks.require_advantages(s, tt.spec("logp", lp))
    _checks.same_dtype_device("logp", str(lp.dtype), str(lp.device), "advantages",
                              str(advantages.dtype), str(advantages.device))
    m = tt.mask_of(mask, "logp", lp)
    bound = _checks.positive("log_ratio_clamp", log_ratio_clamp, allow_none=True)
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    adv = advantages
    if per_seq:
        has_tokens = m.any(dim=-1)
        tt.finite_at_valid("advantages", adv, has_tokens)
        adv = torch.where(has_tokens, adv, zero)[:, None].expand(lp.shape)
    tt.finite_at_valid("logp", lp, m)
    tt.finite_at_valid("old_logp", old, m)
    tt.finite_at_valid("advantages", adv, m)
    lp0, old0, adv0 = (torch.where(m, a, zero) for a in (lp, old, adv))
    log_ratio = lp0 - old0
    if bound is not None:
        log_ratio = torch.clamp(log_ratio, -bound, bound)
    # exp saturates at the largest float rather than overflowing (see ref_numpy._arrays)
    ratio = torch.exp(torch.clamp(log_ratio, max=tt.log_float_max(lp.dtype)))
    return lp0, adv0, m, ratio, zero


def ppo_clip_loss(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                  clip_c=None, delta=None, log_ratio_clamp=None):
    """PPO clipped surrogate as a loss (arXiv:1707.06347 eq. 7), clip-higher, dual clip.

    objective = min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A); for A < 0 with dual clip:
    objective = max(objective, c·A). TRL's δ caps the unclipped ratio: min(r, δ)·A.
    loss = −objective. Ties keep the unclipped term.
    Args/Returns: as ref_numpy.ppo_clip_loss, with tensors.
    """
    lp0, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask, log_ratio_clamp)
    eps_low = _checks.in_range("clip_low", clip_low, 0.0, 1.0, hi_open=True)
    eps_high = _checks.non_negative("clip_high", clip_high, allow_none=True)
    eps_high = eps_low if eps_high is None else eps_high
    c = _checks.clip_c(clip_c)
    cap = _checks.ratio_cap("delta", delta)
    _checks.delta_above_clip(cap, 1.0 + eps_high)
    surr1 = (ratio if cap is None else torch.clamp(ratio, max=cap)) * adv0
    surr2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv0
    objective = torch.where(surr2 < surr1, surr2, surr1)
    if c is not None:
        floor = c * adv0
        objective = torch.where((adv0 < 0) & (objective < floor), floor, objective)
    return torch.where(m, -objective, zero)


def cispo_loss(logp, old_logp, advantages, mask=None, *, clip_high=5.0, clip_low=None,
               bound="absolute", log_ratio_clamp=None):
    """CISPO (MiniMax-M1, arXiv:2506.13585 eq. 4–5): loss = −sg(w)·A·logp.

    w = min(r, clip_high) ("absolute") or clip(r, 1 − clip_low, 1 + clip_high) ("relative");
    w is detached: it weights the REINFORCE gradient but is not differentiated.
    Args/Returns: as ref_numpy.cispo_loss, with tensors.
    """
    lp0, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask, log_ratio_clamp)
    bound = _checks.choice("bound", bound, _checks.CISPO_BOUNDS)
    _checks.cispo_clip_low(clip_low, bound)
    if bound == "absolute":
        cap = _checks.positive("clip_high", clip_high, allow_inf=True)
        weight = torch.clamp(ratio, max=cap)
    else:
        hi = _checks.non_negative("clip_high", clip_high, allow_inf=True)
        lo = _checks.non_negative("clip_low", clip_low, allow_none=True, allow_inf=True)
        weight = torch.clamp(ratio, min=0.0 if lo is None else max(1.0 - lo, 0.0), max=1.0 + hi)
    return torch.where(m, -(weight.detach() * adv0) * lp0, zero)


def gspo_loss(logp, old_logp, advantages, mask=None, *, clip_low=3e-4, clip_high=4e-4,
              form="token", log_ratio_max=None):
    """GSPO (arXiv:2507.18071): PPO's clip on s_i = exp(mean over the row's valid tokens of
    logp − old_logp). form="token": per-token ratio exp(logp − sg(logp) + sg(log s_i)), the
    straight-through GSPO-token; form="sequence": the gradient flows through the mean.
    Args/Returns: as ref_numpy.gspo_loss, with tensors.
    """
    lp0, adv0, m, _, zero = _prepare(logp, old_logp, advantages, mask, None)
    eps_low = _checks.in_range("clip_low", clip_low, 0.0, 1.0, hi_open=True)
    eps_high = _checks.non_negative("clip_high", clip_high)
    form = _checks.choice("form", form, _checks.GSPO_FORMS)
    cap = _checks.number("log_ratio_max", log_ratio_max, allow_none=True)
    old0 = torch.where(m, old_logp, zero)
    lengths = m.sum(dim=-1, keepdim=True).clamp(min=1).to(lp0.dtype)
    seq_log_ratio = (lp0 - old0).sum(dim=-1, keepdim=True) / lengths
    if form == "token":
        log_s = lp0 - lp0.detach() + seq_log_ratio.detach()
    else:
        log_s = seq_log_ratio.expand_as(lp0)
    top = tt.log_float_max(lp0.dtype) if cap is None else min(cap, tt.log_float_max(lp0.dtype))
    s = torch.exp(torch.clamp(log_s, max=top))
    surr1 = s * adv0
    surr2 = torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high) * adv0
    return torch.where(m, -torch.where(surr2 < surr1, surr2, surr1), zero)


def clip_fraction(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                  definition="loss"):
    """Fraction of valid tokens counted as clipped: "loss" (clipped loss > unclipped), "sign"
    (TRL: r > 1+ε with A > 0, or r < 1−ε with A < 0), "ratio" (|r − 1| beyond ε).
    Args/Returns: as ref_numpy.clip_fraction, with tensors (a 0-d tensor).
    """
    lp0, adv0, m, ratio, zero = _prepare(logp, old_logp, advantages, mask, None)
    definition = _checks.choice("definition", definition, _checks.CLIP_FRACTIONS)
    eps_low = _checks.in_range("clip_low", clip_low, 0.0, 1.0, hi_open=True)
    eps_high = _checks.non_negative("clip_high", clip_high, allow_none=True)
    eps_high = eps_low if eps_high is None else eps_high
    with torch.no_grad():
        if definition == "loss":
            hit = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv0 < ratio * adv0
        elif definition == "sign":
            hit = ((ratio > 1 + eps_high) & (adv0 > 0)) | ((ratio < 1 - eps_low) & (adv0 < 0))
        else:
            hit = (ratio > 1 + eps_high) | (ratio < 1 - eps_low)
        n = m.sum()
        count = (hit & m).sum().to(lp0.dtype)
        return count / n if int(n) else count * 0


def value_loss(values, old_values, returns, mask=None, *, clip=0.2):
    """Clipped value loss ½·max((v − R)², (v_old + clip(v − v_old, ±c) − R)²) (c=None: ½(v − R)²).

    Ties keep the unclipped error. Args/Returns: as ref_numpy.value_loss, with tensors.
    """
    v = tt.token("values", values)
    v_old = tt.like("old_values", old_values, "values", v)
    target = tt.like("returns", returns, "values", v)
    m = tt.mask_of(mask, "values", v)
    c = _checks.positive("clip", clip, allow_none=True)
    for name, a in (("values", v), ("old_values", v_old), ("returns", target)):
        tt.finite_at_valid(name, a, m)
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    v, v_old, target = (torch.where(m, a, zero) for a in (v, v_old, target))
    err_unclipped = (v - target).pow(2)
    if c is None:
        return torch.where(m, 0.5 * err_unclipped, zero)
    v_clipped = v_old + torch.clamp(v - v_old, -c, c)
    err_clipped = (v_clipped - target).pow(2)
    worse = torch.where(err_clipped > err_unclipped, err_clipped, err_unclipped)
    return torch.where(m, 0.5 * worse, zero)


def policy_objective(logp, old_logp, advantages, mask, ref_logp=None, *, loss="ppo",
                     agg="seq-mean-token-mean", beta=0.0, kl_kind="k3", kl_clamp=None, norm=None,
                     empty_rows="exclude", **loss_kwargs):
    """aggregate(policy_loss + β·kl_penalty): the scalar actor loss a trainer back-propagates.

    Args/Returns: as ref_numpy.policy_objective, with tensors.
    """
    loss = _checks.choice("loss", loss, _checks.POLICY_LOSSES)
    beta = _checks.non_negative("beta", beta)
    _checks.policy_mask(mask is None, "policy_objective")
    _checks.kl_reference(beta, ref_logp is None)
    _checks.policy_kl(kl_kind, kl_clamp)
    policy = {"ppo": ppo_clip_loss, "cispo": cispo_loss, "gspo": gspo_loss}[loss]
    per_token = policy(logp, old_logp, advantages, mask, **loss_kwargs)
    if ref_logp is not None:            # checked even at beta = 0: a wrong one is still a bug
        kl = kl_penalty(logp, ref_logp, mask, kind=kl_kind, clamp=kl_clamp)
        if beta > 0:
            per_token = per_token + beta * kl
    return aggregate(per_token, mask, mode=agg, norm=norm, empty_rows=empty_rows)
