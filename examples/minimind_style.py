"""MiniMind-style GRPO pieces, written from scratch for this example from the conventions of
MiniMind's trainer/train_grpo.py (docs/conventions.md): group advantages with the *biased* std + 1e-4 over consecutive groups, and the
CISPO per-token loss with an absolute cap of 5.0 and a k3 KL term (β = 0.1), averaged per
sequence and then over all rows.

    python -m crosscheck audit examples/minimind_style.py:grpo_advantages --ref group_advantages --profile minimind
    python -m crosscheck audit examples/minimind_style.py:cispo_objective --ref policy_objective --profile minimind
"""
import torch


def grpo_advantages(rewards, group_size):
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)
    std = grouped.std(dim=1, unbiased=False).repeat_interleave(group_size)
    return (rewards - mean) / (std + 1e-4)


def cispo_objective(logp, old_logp, advantages, mask, ref_logp, **_):
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    logp, old_logp, ref_logp = (torch.where(m, x, zero) for x in (logp, old_logp, ref_logp))
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    advantages = torch.where(m, advantages, zero)
    ratio = torch.exp(logp - old_logp)
    weight = torch.clamp(ratio, max=5.0).detach()
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    per_token = -(weight * advantages * logp - 0.1 * kl)
    lengths = m.sum(dim=1).clamp(min=1)
    return ((per_token * m).sum(dim=1) / lengths).mean()      # every row counts, empty ones too
