"""The actor objective aggregate(policy loss + β·KL), from its equation: autograd differentiates
it. Every policy loss of `policy_losses` and DPPO of `pg_losses` can be its loss."""
import torch

from ref_common import args

from . import _tensors as tt
from ._tensors import OPS
from .kl import k_estimate, kl_penalty
from .pg_losses import dppo_loss
from .policy_losses import cispo_loss, gspo_loss, ppo_clip_loss, sapo_loss, vespo_loss
from .reduce import aggregate


def _weighted_kl(logp, old_logp, anchor, mask, kind, clamp, weight):
    """The KL term W·k of kl_weight "ratio" (W = r = exp(logp − old_logp), the ratio capped
    as every exp of a log-ratio is, times the clamped estimate) or "score" (W = exp(logp −
    sg(logp)) as NeMo-RL's calculate_kl forms it: it multiplies the estimate before the output
    clamp and is detached where the input clamp binds, so a binding clamp stops the score term
    too).

    For k3, wherever no clamp or exp cap binds, W·k3 is written as the same function in
    another form, since autograd's product rule would sum W·∂k3/∂logp = W·(1 − e^x) and
    ∂W/∂logp·k3 = W·(e^x − 1 − x), which cancel to −W·x and lose every digit of it once
    e^x ≫ |x| (x = log(anchor/π) = 40 gave −32, x ≥ 50 gave 0). With v = logp − sg(logp)
    (0 in value, ∂v/∂logp = 1), W = sg(W)·e^v and x = sg(x) − v, so exactly
        W·k3(x) = sg(W)·[k3(sg(x)) − sg(x)·expm1(v) − (expm1(v) − v·e^v)]
    (expand e^v·(e^(x0 − v) − 1 − x0 + v)). The last bracket is −½v² + O(v³), and v is 0
    wherever autograd evaluates it, so it is written as −½v²: value, gradient and second
    derivative are W·k3's. Autograd forms the gradient as sg(W)·(−sg(x)·1 + v) = −W·x: no two
    large terms meet (written as expm1(v) − v·e^v, its ±1 would meet sg(x)·1 where autograd
    accumulates the uses of v, and cancel again for small x).
    """
    a = args.kl_penalty(OPS, logp, anchor, mask, kind, clamp)
    m = a.mask
    zero = tt.zero(a.logp)
    lp = torch.where(m, a.logp, zero)
    x = torch.where(m, a.ref_logp, zero) - lp                 # log(anchor/π) at the sample
    cap = tt.log_float_max(lp.dtype)
    if weight == "score":
        log_w = lp - lp.detach()
    else:   # the log-ratio is zeroed at padding first, so an overflow there reaches no gradient
        log_w = torch.clamp(lp - torch.where(m, old_logp, zero), max=cap)
    w = torch.exp(log_w)
    xc, live = x, (x <= cap) if a.kind == "k3" else torch.ones_like(m)
    if a.in_bound is not None:
        inside = x.abs() <= a.in_bound
        if weight == "score":
            w = torch.where(inside, w, w.detach())
        xc = torch.clamp(x, -a.in_bound, a.in_bound)
        live = live & inside
    k = k_estimate(a.kind, xc)
    if a.out_bound is not None:
        live = live & (k.detach().abs() <= a.out_bound)
    if weight == "ratio":
        live = live & (lp - torch.where(m, old_logp, zero) <= cap).detach()
        est = w * (k if a.out_bound is None else torch.clamp(k, -a.out_bound, a.out_bound))
    else:
        est = w * k
        if a.out_bound is not None:
            est = torch.clamp(est, -a.out_bound, a.out_bound)
    if a.kind == "k3":
        live = live & m
        v = lp - lp.detach()
        x0 = torch.where(live, x, zero).detach()
        w0 = torch.where(live, w, torch.ones_like(w)).detach()
        exact = w0 * ((torch.expm1(x0) - x0) - x0 * torch.expm1(v) + 0.5 * v * v)
        est = torch.where(live, exact, est)
    return torch.where(m, est, zero)


def shaped_advantages(logp, old_logp, advantages, mask, ref_logp=None, *, tau=0.0,
                      kl_coef=0.0):
    """Ã = A − τ·(logp − old_logp) + c·(k̄ − k), k = logp − ref_logp per token and k̄ its mean
    over every valid token of the call (Kimi's τ-shifted advantage, arXiv:2501.12599 §2.3.2;
    a KL folded into the advantage as a centred k1). Undetached: the caller detaches it.
    Args/Returns: as ref_numpy.shaped_advantages, with tensors.
    """
    args.policy_mask(mask is None, "shaped_advantages")
    a = args.ratio_inputs(OPS, logp, old_logp, advantages, mask, None)
    tau, c = args.shaped_advantages(ref_logp, tau, kl_coef)
    m, zero = a.mask, tt.zero(a.logp)
    adv = a.advantages
    if a.per_seq:
        adv = torch.where(m.any(dim=-1), adv, zero)[:, None].expand(a.logp.shape)
    lp, old = torch.where(m, a.logp, zero), torch.where(m, a.old_logp, zero)
    out = adv - tau * (lp - old)
    if ref_logp is not None:
        args.like(OPS, "ref_logp", ref_logp, OPS.spec("logp", a.logp))
        args.finite(OPS, "ref_logp", ref_logp, m)
    if c > 0:
        k = torch.where(m, lp - torch.where(m, ref_logp, zero), zero)
        k_bar = k.sum() / m.sum().clamp(min=1)
        out = out + c * (k_bar - k)
    return torch.where(m, out, zero)


def ratio_kl_penalty(logp, old_logp, ref_logp, mask=None, *, kind="k1", clamp=None):
    """r·k(x): kl_penalty's estimator at x = ref_logp − logp times the attached ratio
    r = exp(logp − old_logp), an estimate of KL(π‖ref) from tokens sampled by π_old (open-
    instruct's estimate_kl estimator 3 is kind "k1", clamp (40, None)); autograd differentiates
    both factors. Written as `_weighted_kl` with the ratio weight.
    Args/Returns: as ref_numpy.ratio_kl_penalty, with tensors.
    """
    a = args.pair_inputs(OPS, logp, old_logp, mask, ("logp", "old_logp"))
    return _weighted_kl(a.first, a.second, ref_logp, a.mask, kind, clamp, "ratio")


def policy_objective(logp, old_logp, advantages, mask, ref_logp=None, *, loss="ppo",
                     agg="seq-mean-token-mean", beta=0.0, kl_kind="k3", kl_clamp=None, norm=None,
                     empty_rows="exclude", kl_weight=None, kl_anchor="ref", group_size=None,
                     group_ids=None, adv_tau=0.0, adv_kl=0.0, **loss_kwargs):
    """aggregate(policy_loss + β·kl_penalty): the scalar actor loss a trainer back-propagates.
    With kl_weight="ratio" the KL term is β·exp(logp − old_logp)·k, the ratio attached (TRL's
    use_bias_correction_kl); with "score" it is β·exp(logp − sg(logp))·k (NeMo-RL's), whose
    gradient carries the score term k·∇logp. With kl_anchor="old" it is k(logp, old_logp), the
    KL to the sampling policy (prime-rl's per-token τ·(log r)²), and ref_logp is not read.
    group_size / group_ids: the rows' prompts, for agg="prompt-mean-token-mean".
    adv_tau / adv_kl: the loss is given shaped_advantages(τ = adv_tau, c = adv_kl), detached.

    Args/Returns: as ref_numpy.policy_objective, with tensors.
    """
    p = args.policy_objective(mask, ref_logp, loss, beta, kl_kind, kl_clamp, agg, kl_weight,
                              kl_anchor, adv_tau, adv_kl)
    policy = {"ppo": ppo_clip_loss, "cispo": cispo_loss, "gspo": gspo_loss,
              "sapo": sapo_loss, "vespo": vespo_loss, "dppo": dppo_loss}[p.loss]
    if p.adv_tau > 0 or p.adv_kl > 0:
        advantages = shaped_advantages(logp, old_logp, advantages, mask, ref_logp,
                                       tau=p.adv_tau, kl_coef=p.adv_kl).detach()
    per_token = policy(logp, old_logp, advantages, mask, **loss_kwargs)
    anchor = old_logp if p.kl_anchor == "old" else ref_logp
    if anchor is not None:              # checked even at beta = 0: a wrong one is still a bug
        kl = kl_penalty(logp, anchor, mask, kind=kl_kind, clamp=kl_clamp) \
            if p.kl_weight is None else \
            _weighted_kl(logp, old_logp, anchor, mask, kl_kind, kl_clamp, p.kl_weight)
        if p.beta > 0:
            per_token = per_token + p.beta * kl
    bad = mask.bool() & ~torch.isfinite(per_token)
    if bool(bad.any()):        # finite inputs whose loss overflowed: name the inputs there
        at = tuple(int(i) for i in torch.nonzero(bad)[0])
        adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logp)
        inputs = {"logp": logp, "old_logp": old_logp, "advantages": adv}
        if ref_logp is not None:
            inputs["ref_logp"] = ref_logp
        args.objective_overflow(at, {k: float(v[at]) for k, v in inputs.items()})
    return aggregate(per_token, mask, mode=agg, norm=norm, empty_rows=empty_rows,
                     group_size=group_size, group_ids=group_ids)
