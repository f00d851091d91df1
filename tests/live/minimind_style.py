"""Home-grown loops in the shape of MiniMind's trainer/train_grpo.py and trainer/train_ppo.py
(jingyaogong/minimind d65ef2c), written from the equations its report card describes, not
copied: a rollout without gradients, the reward's group advantages (biased std + 1e-4) or GAE
then whitening, the loss on the policy's per-token log-probs, ÷ the accumulation steps, one
backward per batch and an optimizer step every `accumulation_steps` batches. The policy and
the critic are bigram tables (an embedding and a linear head), small enough for CI.

The lines the recorder needs are marked `# crosscheck`; `bug` plants what the live audit must
catch:
- "micro-batch-norm": the loss normalised by the micro-batch's own token count in place of
  each sequence's length (GRPO);
- "kl-wrong-tokens": the k3 term averaged over every generated position, the ones after EOS
  included, in place of the completion's tokens (GRPO);
- "not-detached": the rollout's critic values, hence the advantages, keep their graph, so
  the policy loss back-propagates into the critic (PPO).
"""
import copy

import torch
import torch.nn.functional as F

V, EOS, H = 11, 0, 8


class Bigram(torch.nn.Module):
    def __init__(self, out=V, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Embedding(V, H)
        self.head = torch.nn.Linear(H, out)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(V, H, generator=g))
            self.head.weight.copy_(torch.randn(out, H, generator=g) * 0.5)
            self.head.bias.zero_()
            if out == V:
                self.head.bias[EOS] = -0.5          # completions of varied length

    def forward(self, ids):                     # [B, L] → [B, L, out]
        return self.head(self.emb(ids))


def token_logps(model, ids, P):
    """log π(ids[:, t] | ids[:, t-1]) for the completion positions t ≥ P."""
    logits = model(ids[:, :-1])
    return F.log_softmax(logits, -1).gather(2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)[:, P - 1:]


def rollout(model, prompts, R, g):
    ids = prompts
    with torch.no_grad():
        for _ in range(R):
            p = F.softmax(model(ids[:, -1:])[:, -1], -1)
            ids = torch.cat([ids, torch.multinomial(p, 1, generator=g)], 1)
        old = token_logps(model, ids, prompts.shape[1])
    return ids, old


def eos_mask(completion):
    """1 up to and including the first EOS (every generated position where there is none)."""
    is_eos = completion == EOS
    idx = torch.full((completion.shape[0],), completion.shape[1] - 1)
    idx[is_eos.any(1)] = is_eos.int().argmax(1)[is_eos.any(1)]
    return (torch.arange(completion.shape[1])[None] <= idx[:, None]).int()


def reward(completion, mask):
    return ((completion == 3).float() * mask).sum(1) - 0.1 * mask.sum(1)


def grpo(steps=3, batch=2, G=4, R=6, accumulation_steps=2, loss_type="cispo", beta=0.1,
         epsilon=0.2, epsilon_high=5.0, lr=0.5, rec=None, bug=None, seed=0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = Bigram()
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    if rec is not None:
        optimizer = rec.optimizer(optimizer)                                    # crosscheck
    for step in range(1, steps * accumulation_steps + 1):
        prompts = torch.randint(1, V, (batch, 2), generator=g).repeat_interleave(G, 0)
        outputs, old_per_token_logps = rollout(model, prompts, R, g)
        completion = outputs[:, 2:]
        completion_mask = eos_mask(completion)
        rewards = reward(completion, completion_mask)
        per_token_logps = token_logps(model, outputs, 2)
        with torch.no_grad():
            ref_per_token_logps = token_logps(ref_model, outputs, 2)
        grouped = rewards.view(-1, G)
        mean_r = grouped.mean(1).repeat_interleave(G)
        std_r = grouped.std(1, unbiased=False).repeat_interleave(G)
        advantages = (rewards - mean_r) / (std_r + 1e-4)
        if rec is not None:
            rec.advantages(advantages, rewards=rewards)                         # crosscheck
            rec.inputs(per_token_logps, old_per_token_logps, advantages,        # crosscheck
                       completion_mask, ref_logp=ref_per_token_logps)           # crosscheck
        kl_div = ref_per_token_logps - per_token_logps
        per_token_kl = torch.exp(kl_div) - kl_div - 1
        ratio = torch.exp(per_token_logps - old_per_token_logps)
        if loss_type == "cispo":
            clamped = torch.clamp(ratio, max=epsilon_high).detach()
            pg = clamped * advantages.unsqueeze(1) * per_token_logps
        else:
            pg = torch.min(ratio * advantages.unsqueeze(1),
                           torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages.unsqueeze(1))
        if bug == "kl-wrong-tokens":
            per_token_loss = -pg * completion_mask + beta * per_token_kl
            lengths = completion_mask.sum(1).clamp(min=1)
            policy_loss = (per_token_loss.sum(1) / lengths).mean()
        else:
            per_token_loss = -(pg - beta * per_token_kl)
            if bug == "micro-batch-norm":
                policy_loss = ((per_token_loss * completion_mask).sum()
                               / completion_mask.sum().clamp(min=1))
            else:
                policy_loss = ((per_token_loss * completion_mask).sum(1)
                               / completion_mask.sum(1).clamp(min=1)).mean()
        loss = policy_loss / accumulation_steps
        if rec is not None:
            rec.loss(loss)                                                      # crosscheck
        loss.backward()
        if step % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return model


def ppo(steps=3, B=4, R=6, mini_batch_size=2, ppo_update_iters=1, accumulation_steps=2,
        clip_epsilon=0.2, kl_coef=0.02, vf_coef=0.5, cliprange_value=0.2, gamma=0.99, lam=0.95,
        lr=0.5, rec=None, bug=None, seed=0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    actor, critic = Bigram(), Bigram(out=1, seed=1)
    ref_model = copy.deepcopy(actor).eval().requires_grad_(False)
    actor_optimizer = torch.optim.SGD(actor.parameters(), lr=lr)
    critic_optimizer = torch.optim.SGD(critic.parameters(), lr=lr)
    if rec is not None:
        actor_optimizer = rec.optimizer(actor_optimizer)                        # crosscheck
    grad_accum_step = 0
    for step in range(steps):
        prompts = torch.randint(1, V, (B, 2), generator=g)
        gen_out, old_resp_logp = rollout(actor, prompts, R, g)
        resp = gen_out[:, 2:]
        resp_policy_mask = eos_mask(resp).float()
        resp_lengths = resp_policy_mask.sum(1).long()
        rewards = reward(resp, resp_policy_mask)
        grad_ctx = torch.enable_grad() if bug == "not-detached" else torch.no_grad()
        with grad_ctx:
            old_resp_values = critic(gen_out).squeeze(-1)[:, 1:-1] * resp_policy_mask
            ref_resp_logp = token_logps(ref_model, gen_out, 2)
            token_rewards = torch.zeros_like(old_resp_logp)
            token_rewards[torch.arange(B), resp_lengths - 1] += rewards
            lastgaelam = torch.zeros(B)
            advs_rev = []
            for t in reversed(range(R)):
                nv = old_resp_values[:, t + 1] if t < R - 1 else 0.0
                delta = token_rewards[:, t] + gamma * nv - old_resp_values[:, t]
                lastgaelam = delta + gamma * lam * lastgaelam
                advs_rev.append(lastgaelam)
            advantages = torch.stack(advs_rev[::-1], 1)
            returns = advantages + old_resp_values
            n = resp_policy_mask.sum().clamp(min=1)
            adv_mean = (advantages * resp_policy_mask).sum() / n
            adv_var = ((advantages - adv_mean) ** 2 * resp_policy_mask).sum() / n
            advantages = (advantages - adv_mean) * torch.rsqrt(adv_var + 1e-8) * resp_policy_mask
        if rec is not None:
            rec.advantages(advantages, rewards=token_rewards, mask=resp_policy_mask,  # crosscheck
                           values=old_resp_values)                              # crosscheck
        for _ in range(ppo_update_iters):
            b_inds = torch.randperm(B, generator=g)
            for i in range(0, B, mini_batch_size):
                inds = b_inds[i:i + mini_batch_size]
                mb_values = critic(gen_out[inds]).squeeze(-1)[:, 1:-1]
                mb_logp = token_logps(actor, gen_out[inds], 2)
                m = resp_policy_mask[inds]
                if rec is not None:
                    rec.inputs(mb_logp, old_resp_logp[inds], advantages[inds], m,  # crosscheck
                               ref_logp=ref_resp_logp[inds])                    # crosscheck
                    rec.critic(mb_values, old_resp_values[inds], returns[inds], m)  # crosscheck
                ratio = torch.exp(mb_logp - old_resp_logp[inds])
                kl_ref = ref_resp_logp[inds] - mb_logp
                kl_ref_penalty = ((torch.exp(kl_ref) - kl_ref - 1.0) * m).sum() / m.sum()
                policy_loss = ((torch.max(-advantages[inds] * ratio, -advantages[inds]
                                          * torch.clamp(ratio, 1 - clip_epsilon,
                                                        1 + clip_epsilon)) * m).sum() / m.sum()
                               + kl_coef * kl_ref_penalty)
                clipped = torch.clamp(mb_values, old_resp_values[inds] - cliprange_value,
                                      old_resp_values[inds] + cliprange_value)
                value_loss = 0.5 * (torch.max((mb_values - returns[inds]) ** 2,
                                              (clipped - returns[inds]) ** 2) * m).sum() / m.sum()
                loss = (policy_loss + vf_coef * value_loss) / accumulation_steps
                if rec is not None:
                    rec.loss(loss)                                              # crosscheck
                loss.backward()
                grad_accum_step += 1
                if grad_accum_step % accumulation_steps == 0:
                    actor_optimizer.step()
                    critic_optimizer.step()
                    actor_optimizer.zero_grad()
                    critic_optimizer.zero_grad()
    return actor
