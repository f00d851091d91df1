"""Deliberately buggy functions: each is a real bug class found in public trainers, and each
audit must catch it.

    python -m crosscheck audit examples/buggy.py:cispo_without_detach --ref cispo_loss --profile minimind
    python -m crosscheck audit examples/buggy.py:grpo_by_reshape --ref group_advantages --profile minimind
    python -m crosscheck audit examples/buggy.py:kl_sign_flipped --ref kl_penalty --profile trl
    python -m crosscheck audit examples/buggy.py:local_token_mean --ref aggregate --profile verl
"""
import torch


def cispo_without_detach(logp, old_logp, advantages, mask, **_):
    """CISPO with the weight's .detach() forgotten: the value is right, the gradient is not."""
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp(torch.where(m, logp - old_logp, zero))
    weight = torch.clamp(ratio, max=5.0)                          # bug: no .detach()
    return torch.where(m, -weight * torch.where(m, advantages, zero) * torch.where(m, logp, zero),
                       zero)


def grpo_by_reshape(rewards, group_ids, group_size=None):
    """Groups by reshaping the batch, as if it were sorted by prompt; it is not always."""
    n_groups = len(torch.unique(group_ids))
    grouped = rewards.view(n_groups, -1)                           # bug: ignores group_ids
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, unbiased=False, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).view(-1)


def kl_sign_flipped(logp, ref_logp, mask, **_):
    """k3 with its sign flipped (verl a65c9157): minimising it pushes π away from the reference."""
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    x = torch.where(m, ref_logp - logp, zero)
    return torch.where(m, -(torch.exp(x) - x - 1), zero)           # bug: −k3


def local_token_mean(loss, mask, **_):
    """Token mean over whatever (micro-)batch it is given: fine alone, wrong when a trainer
    averages it over micro-batches of different token counts (open-instruct #1137)."""
    m = mask.to(loss.dtype)
    return (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum() / \
        m.sum().clamp(min=1)
