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


def _score_weighted_kl(logp, anchor, mask, kind, clamp):
    """exp(logp − sg(logp))·k, as NeMo-RL's calculate_kl forms it: the weight (1 in value)
    multiplies the estimate before the output clamp and is detached where the input clamp
    binds, so a binding clamp stops the score term too."""
    a = args.kl_penalty(OPS, logp, anchor, mask, kind, clamp)
    m = a.mask
    zero = tt.zero(a.logp)
    lp = torch.where(m, a.logp, zero)
    log_ratio = torch.where(m, a.ref_logp, zero) - lp
    w = torch.exp(lp - lp.detach())
    if a.in_bound is not None:
        w = torch.where(log_ratio.abs() <= a.in_bound, w, w.detach())
        log_ratio = torch.clamp(log_ratio, -a.in_bound, a.in_bound)
    est = w * k_estimate(a.kind, log_ratio)
    if a.out_bound is not None:
        est = torch.clamp(est, -a.out_bound, a.out_bound)
    return torch.where(m, est, zero)


def policy_objective(logp, old_logp, advantages, mask, ref_logp=None, *, loss="ppo",
                     agg="seq-mean-token-mean", beta=0.0, kl_kind="k3", kl_clamp=None, norm=None,
                     empty_rows="exclude", kl_weight=None, kl_anchor="ref", **loss_kwargs):
    """aggregate(policy_loss + β·kl_penalty): the scalar actor loss a trainer back-propagates.
    With kl_weight="ratio" the KL term is β·exp(logp − old_logp)·k, the ratio attached (TRL's
    use_bias_correction_kl); with "score" it is β·exp(logp − sg(logp))·k (NeMo-RL's), whose
    gradient carries the score term k·∇logp. With kl_anchor="old" it is k(logp, old_logp), the KL to the
    sampling policy (prime-rl's τ·(log r)²), and ref_logp is not read.

    Args/Returns: as ref_numpy.policy_objective, with tensors.
    """
    p = args.policy_objective(mask, ref_logp, loss, beta, kl_kind, kl_clamp, agg, kl_weight,
                              kl_anchor)
    policy = {"ppo": ppo_clip_loss, "cispo": cispo_loss, "gspo": gspo_loss,
              "sapo": sapo_loss, "vespo": vespo_loss, "dppo": dppo_loss}[p.loss]
    per_token = policy(logp, old_logp, advantages, mask, **loss_kwargs)
    anchor = old_logp if p.kl_anchor == "old" else ref_logp
    if anchor is not None:              # checked even at beta = 0: a wrong one is still a bug
        kl = kl_penalty(logp, anchor, mask, kind=kl_kind, clamp=kl_clamp) \
            if p.kl_weight != "score" else \
            _score_weighted_kl(logp, anchor, mask, kl_kind, kl_clamp)
        if p.kl_weight == "ratio":
            valid = mask.bool()
            # the log-ratio is zeroed at padding first, so an overflow there reaches no gradient
            log_r = torch.where(valid, logp - old_logp, torch.zeros_like(logp))
            kl = torch.where(valid, torch.exp(log_r) * kl, torch.zeros_like(kl))
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
    return aggregate(per_token, mask, mode=agg, norm=norm, empty_rows=empty_rows)
