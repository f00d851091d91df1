"""Outcome-reward advantage estimators in torch (OPO, GPG, GRPO pass@k, ReMax, a group baseline
then batch whitening), written from their equations; autograd gives the gradients."""
import torch

from ref_common import args, checks

from . import _tensors as tt
from ._tensors import OPS
from .advantages import group_advantages, group_ids_of, whiten


def _membership(fn, rewards, group_size, group_ids):
    """Rewards [B], the one-hot group membership [G, B] and each row's group index."""
    a = args.outcome_groups(OPS, fn, rewards, group_size, group_ids)
    r = a.rewards
    ids = group_ids_of(r.shape[0], a.group_size, a.group_ids, r.device)
    _, inverse = torch.unique(ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if r.shape[0] else 0
    member = (torch.arange(n_groups, device=r.device)[:, None] == inverse[None, :]).to(r.dtype)
    return r, member, inverse


def opo_advantages(rewards, lengths, *, group_size=None, group_ids=None):
    """OPO (arXiv:2505.23585): A = r − Σ_g L·r / Σ_g L (a group of one keeps r).
    Args/Returns: as ref_numpy.opo_advantages, with tensors.
    """
    r, member, inverse = _membership("opo_advantages", rewards, group_size, group_ids)
    L = args.per_row(OPS, "lengths", lengths, r.shape[0], positive=True).to(r.dtype)
    size = member.sum(dim=1)
    baseline = (member @ (L * r)) / (member @ L)
    return r - torch.where(size[inverse] >= 2, baseline[inverse], tt.zero(r))


def gpg_advantages(rewards, *, group_size=None, group_ids=None, f_norm=1.0):
    """GPG (arXiv:2504.02546): A = B/#(r ≠ 0)·(r − group mean)/f_norm (a group of one: mean 0).
    Args/Returns: as ref_numpy.gpg_advantages, with tensors.
    """
    r, member, inverse = _membership("gpg_advantages", rewards, group_size, group_ids)
    f_norm = checks.positive("f_norm", f_norm)
    alpha = r.shape[0] / max(int(torch.count_nonzero(r.detach())), 1)
    size = member.sum(dim=1)
    mean = (member @ r) / size.clamp(min=1)
    centred = r - torch.where(size[inverse] >= 2, mean[inverse], tt.zero(r))
    return alpha * centred / f_norm


def passk_advantages(rewards, *, group_size=None, group_ids=None, eps=1e-6, scale="group"):
    """GRPO pass@k: the group's best response gets (r_best − r_second)/(std + eps) (or the bare
    margin, scale="none"), every other response 0.
    Args/Returns: as ref_numpy.passk_advantages, with tensors.
    """
    r, member, inverse = _membership("passk_advantages", rewards, group_size, group_ids)
    eps = checks.non_negative("eps", eps)
    scale = checks.choice("scale", scale, ("group", "none"))
    out = torch.zeros_like(r)
    for g in range(member.shape[0]):
        rows = torch.nonzero(inverse == g)[:, 0]
        if len(rows) < 2:
            raise ValueError(f"rewards of row {int(rows[0])} form a group of one; pass@k "
                             "compares the best and second-best of a group of at least 2")
        # in units of 2^e above the group's largest |r|: exact, so A is scale-invariant
        e = tt.binary_exponent(r[rows])
        group = tt.times_power_of_two(r[rows], -e)
        best, where = torch.topk(group, 2)
        margin = best[0] - best[1]
        if scale == "group":
            dev = group - group.mean()
            D = tt.safe_sqrt(dev.pow(2).sum() / (len(rows) - 1)) + tt.ldexp_or_inf(eps, -e)
            if bool(D.detach() == 0):     # all equal, eps = 0: A = 0, no derivative (taken 0)
                margin, D = margin * 0, torch.ones_like(D)
            margin = margin / D
        else:
            margin = tt.times_power_of_two(margin, e)      # the bare margin, in reward units
        one_hot = (torch.arange(r.shape[0], device=r.device) == rows[where[0]]).to(r.dtype)
        out = out + one_hot * margin
    return out


def remax_advantages(rewards, baselines, mask=None):
    """ReMax (arXiv:2310.10505): A_t = Σ_{s ≥ t} m_s r_s − b, a reverse cumulative sum.
    Args/Returns: as ref_numpy.remax_advantages, with tensors.
    """
    a = args.discounted_returns(OPS, rewards, mask, 1.0)
    if a.rewards.dim() != 2:
        raise ValueError(f"rewards has shape {tuple(a.rewards.shape)}; expected [B, T]")
    b = args.per_row(OPS, "baselines", baselines, a.rewards.shape[0])
    m, zero = a.mask, tt.zero(a.rewards)
    to_go = torch.flip(torch.cumsum(torch.flip(torch.where(m, a.rewards, zero), [-1]), -1), [-1])
    return torch.where(m, to_go - b[:, None], zero)


def whitened_group_advantages(rewards, mask, *, group_size=None, group_ids=None, scale="none",
                              eps=1e-6, whiten_eps=1e-8):
    """Group-mean baseline (scaled by the group std under scale="group"), then masked whitening
    over every valid token of the batch (REINFORCE++-baseline, GDPO).
    Args/Returns: as ref_numpy.whitened_group_advantages, with tensors.
    """
    scale = checks.choice("scale", scale, ("none", "group"))
    whiten_eps = checks.non_negative("whiten_eps", whiten_eps)
    ms, s = OPS.spec("mask", mask), OPS.spec("rewards", rewards)
    if len(ms.shape) != 2 or len(s.shape) != 1 or ms.shape[0] != s.shape[0]:
        raise ValueError(f"mask has shape {tuple(ms.shape)} but rewards has {tuple(s.shape)}; "
                         "expected one reward per sequence [B] and a [B, T] mask")
    args.group_rule(OPS, "whitened_group_advantages", s.shape[0], group_size, group_ids)
    a = group_advantages(rewards, group_size=group_size, group_ids=group_ids, ddof=1, eps=eps,
                         scale=scale, baseline="mean", singleton="keep")
    m = args.mask(OPS, mask, ms, mask)   # 0/1 or bool only, as gae's
    x = torch.where(m, a[:, None], tt.zero(a))
    y = whiten(x, m, ddof=1, eps=whiten_eps, eps_mode="var", shift_mean=True)
    return torch.where(m, y, tt.zero(y))


def optimal_token_baseline_advantages(rewards, old_logp, sum_pi_squared, mask=None, *,
                                      group_size=None, group_ids=None, zero_tail=True,
                                      eps=1e-8):
    """OTB: A_t = G_t − b_t with b_t = Σ_g G·W / (Σ_g W + eps) over a group's trajectories at
    step t, W the running sum of 1 − 2π + Σπ² (a group of one: b = 0; zero_tail: the single
    longest trajectory gets b = 0 past the second-longest length).
    Args/Returns: as ref_numpy.optimal_token_baseline_advantages, with tensors.
    """
    a = args.token_groups(OPS, "optimal_token_baseline_advantages", rewards, old_logp,
                          sum_pi_squared, mask, group_size, group_ids)
    eps = checks.non_negative("eps", eps)
    zero_tail = checks.boolean("zero_tail", zero_tail)
    m, zero = a.mask, tt.zero(a.rewards)
    B, T = m.shape
    ids = group_ids_of(B, a.group_size, group_ids, m.device)
    to_go = torch.flip(torch.cumsum(torch.flip(torch.where(m, a.rewards, zero), [-1]), -1), [-1])
    pi = torch.exp(torch.where(m, a.old_logp, zero))
    step = torch.where(m, 1 - 2 * pi + torch.where(m, a.sum_pi_squared, zero), zero)
    W = torch.cumsum(step, dim=-1).detach()
    baseline = torch.zeros_like(to_go)
    for g in torch.unique(ids):
        rows = torch.nonzero(ids == g)[:, 0]
        if len(rows) < 2:
            continue
        weight = torch.where(m[rows], W[rows], zero)
        total = weight.sum(dim=0) + eps
        reached = total > 0                               # a step no member reaches: b = 0
        b = torch.where(reached, (to_go[rows] * weight).sum(dim=0) /
                        torch.where(reached, total, torch.ones_like(total)), zero)
        b = b.expand(len(rows), T)
        if zero_tail:
            lengths = m[rows].sum(dim=-1)
            ordered = torch.sort(lengths).values
            is_longest = lengths == ordered[-1]
            if int(is_longest.sum()) == 1 and ordered[-1] > ordered[-2]:
                tail = (torch.arange(T, device=m.device) >= ordered[-2])[None, :] & \
                    is_longest[:, None]
                b = torch.where(tail, zero, b)
        baseline = baseline.index_put((rows,), b)
    return torch.where(m, to_go - baseline, zero)
