"""A TRL-style GRPO per-token loss with a k3 KL term and 'dapo' aggregation, written from
scratch for this example from the conventions of TRL's GRPOTrainer._compute_loss
(docs/conventions.md). 'dapo' divides the
micro-batch's loss sum by the loss tokens of the whole generation batch (`num_items_in_batch`);
the KL term is multiplied by the attached ratio (GRPOConfig.use_bias_correction_kl, True by
default since TRL 1.10).

    python -m crosscheck audit examples/trl_style.py:adapter --ref policy_objective \
        --profile trl --set beta=0.04 --accumulation sum
"""
import torch


def grpo_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages,
              completion_mask, num_items_in_batch, epsilon_low=0.2, epsilon_high=0.2, beta=0.04,
              use_bias_correction_kl=True):
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if beta != 0.0:
        diff = ref_per_token_logps - per_token_logps
        per_token_kl = torch.exp(diff) - diff - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
        per_token_loss = per_token_loss + beta * per_token_kl
    mask = completion_mask.to(per_token_loss.dtype)
    return (per_token_loss * mask).sum() / max(num_items_in_batch, 1)


def adapter(logp, old_logp, advantages, mask, ref_logp, n_tokens_global=None, **_):
    if n_tokens_global is None:
        n_tokens_global = int(mask.sum())
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    keep = lambda x: torch.where(m, x, zero)              # noqa: E731  (padding is 0, as in TRL)
    return grpo_loss(keep(logp), keep(old_logp), keep(ref_logp), keep(advantages), m,
                     n_tokens_global, beta=0.04)
