"""A verl-style PPO actor loss, written from scratch for this example (not copied from verl).

It follows the conventions of verl's `compute_policy_loss_vanilla` and `agg_loss`
(docs/conventions.md): log-ratio clamped to ±20, clip 0.2/0.2, the dual clip c = 3 always on,
and a token mean over the *global* batch: the sum over this micro-batch divided by the number
of valid tokens in the whole batch (verl's `batch_num_tokens`), micro-batch gradients summed.

    python -m crosscheck audit examples/verl_style.py:adapter --ref policy_objective \
        --profile verl --accumulation sum
"""
import torch


def vanilla_policy_loss(old_log_prob, log_prob, advantages, response_mask, batch_num_tokens,
                        clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0):
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    mask = response_mask.to(pg_losses.dtype)
    return (pg_losses * mask).sum() / max(batch_num_tokens, 1)       # global token-mean


def adapter(logp, old_logp, advantages, mask, n_tokens_global=None, **_):
    """The audit's adapter: the reference's inputs in, verl's argument order and shapes out."""
    if n_tokens_global is None:                        # called on a whole batch
        n_tokens_global = int(mask.sum())
    if advantages.dim() == 1:                          # one advantage per sequence
        advantages = advantages[:, None].expand_as(logp)
    zero = torch.zeros((), dtype=logp.dtype)
    m = mask.bool()
    return vanilla_policy_loss(torch.where(m, old_logp, zero), torch.where(m, logp, zero),
                               torch.where(m, advantages, zero), m, n_tokens_global)
