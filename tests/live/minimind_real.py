"""MiniMind's own trainer/train_grpo.py and trainer/train_ppo.py, from a checkout
(jingyaogong/minimind d65ef2c, the commit its report card pins), run under
crosscheck.live.record_loop on CPU.

A copy of the checkout's trainer/, model/ and dataset/ goes to a temporary folder; the script
there gets the recorder's lines (LINES: each added right before or after the one line of the
script it names) and, for a planted bug, the text BUGS replaces; the script's own epoch function
(`grpo_train_epoch`, `ppo_train_epoch`) then runs with what its `__main__` block would build,
at a tiny configuration: a 1-layer MiniMindConfig with hidden size 32, completions of at most 6
tokens, its own TorchRolloutEngine and tokenizer, the actor wrapped by `rec.optimizer`. Two
things stand in for downloads:
- the `full_sft` checkpoint: the random model taught for SFT_STEPS AdamW steps to answer with
  1 to 6 tokens then <|im_end|>, so that completions end at varied lengths as a chat model's do
  (the mask cut at the first end token then matters);
- the reward model (a 1.8B InternLM2): LengthReward, a score from the response's length.
"""
import argparse
import importlib
import os
import shutil
import sys
from contextlib import nullcontext

# (before/after, the one line of the script it goes next to, the line the recorder needs)
LINES = {
    "grpo": (
        ("after", "advantages = (rewards - mean_r) / (std_r + 1e-4)  # [B*num_gen]",
         "rec.advantages(advantages, rewards=rewards)"),
        ("after", "completion_mask = ((torch.arange(",
         "rec.inputs(per_token_logps, old_per_token_logps, advantages, "
         "completion_mask, ref_logp=ref_per_token_logps)"),
        ("before", "loss.backward()", "rec.loss(loss)"),
    ),
    "ppo": (
        ("after", "advantages = (advantages - adv_mean) * torch.rsqrt(adv_var + 1e-8)",
         "rec.advantages(advantages, rewards=token_rewards, values=old_resp_values, "
         "mask=resp_policy_mask)"),
        ("after", "mb_resp_logp = F.log_softmax(",
         "rec.inputs(mb_resp_logp, old_resp_logp[inds], advantages[inds], "
         "resp_policy_mask[inds], ref_logp=ref_resp_logp[inds])"),
        ("after", "mb_resp_logp = F.log_softmax(",
         "rec.critic(mb_resp_values, old_resp_values[inds], returns[inds], "
         "resp_value_mask[inds])"),
        ("before", "loss.backward()", "rec.loss(loss)"),
    ),
}
_PPO_KL = ("(torch.exp(ref_resp_logp[inds] - mb_resp_logp) - (ref_resp_logp[inds] - mb_resp_logp)"
           " - 1.0)\n                                  * resp_policy_mask[inds]).sum() / "
           "resp_policy_mask[inds].sum()")
BUGS = {
    # each micro-batch normalised as the whole step: the ÷ accumulation_steps left out
    ("grpo", "micro-batch-norm"): (
        ("loss = (policy_loss + aux_loss) / args.accumulation_steps  # scalar",
         "loss = (policy_loss + aux_loss)  # scalar"),),
    # the token mean over the micro-batch's tokens in place of each sequence's token mean
    ("grpo", "token-mean"): (
        ("policy_loss = ((per_token_loss * completion_mask).sum(dim=1) / "
         "completion_mask.sum(dim=1).clamp(min=1)).mean()",
         "policy_loss = (per_token_loss * completion_mask).sum() / "
         "completion_mask.sum().clamp(min=1)"),),
    # the k3 term over every generated position (the rollout's pad mask, not cut at the first
    # <|im_end|>), each sequence's sum still ÷ its completion length
    ("grpo", "kl-wrong-tokens"): (
        ("per_token_loss = -(clamped_ratio * advantages.unsqueeze(1) * per_token_logps - "
         "args.beta * per_token_kl)",
         "per_token_loss = -(clamped_ratio * advantages.unsqueeze(1) * per_token_logps) * "
         "completion_mask + args.beta * per_token_kl * completion_pad_mask"),
        ("policy_loss = ((per_token_loss * completion_mask).sum(dim=1)",
         "policy_loss = ((per_token_loss).sum(dim=1)"),),
    ("ppo", "micro-batch-norm"): (
        ("loss = (policy_loss + args.vf_coef * value_loss + aux_loss) / args.accumulation_steps",
         "loss = (policy_loss + args.vf_coef * value_loss + aux_loss)"),),
    # the rollout's critic values, hence the advantages and returns, computed with gradients
    ("ppo", "not-detached"): (
        ("with torch.no_grad():  # Rollout", "with torch.enable_grad():  # Rollout"),),
    # the k3 term averaged over every generated position (the rollout's pad mask)
    ("ppo", "kl-wrong-tokens"): (
        (_PPO_KL, _PPO_KL.replace("resp_policy_mask", "resp_pad_mask")),),
}
SCRIPT = {"grpo": "train_grpo.py", "ppo": "train_ppo.py"}
PROMPTS = ["<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"]
SFT_STEPS = 10


def patched(checkout, tmp, which, bug=None, recorder=True):
    """Copy the checkout's code to `tmp`, add LINES[which] to the script (unless `recorder`
    is False: the bare script), plant `bug`."""
    for d in ("trainer", "model", "dataset"):
        shutil.copytree(os.path.join(checkout, d), os.path.join(tmp, d))
    path = os.path.join(tmp, "trainer", SCRIPT[which])
    text = open(path, encoding="utf-8").read()
    for old, new in BUGS[which, bug] if bug else ():
        if text.count(old) != 1:
            raise ValueError(f"{SCRIPT[which]} holds {old!r} {text.count(old)} times, not once: "
                             f"not MiniMind d65ef2c")
        text = text.replace(old, new)
    lines = text.split("\n")
    out = [[] for _ in lines]                     # what goes before/at/after each line
    for where, anchor, added in LINES[which] if recorder else ():
        at = [i for i, x in enumerate(lines) if x.strip().startswith(anchor)]
        if len(at) != 1:
            raise ValueError(f"{SCRIPT[which]} has {len(at)} lines starting {anchor!r}, not "
                             f"one: not MiniMind d65ef2c")
        line = lines[at[0]]
        indent = line[:len(line) - len(line.lstrip())]
        out[at[0]].append((where, indent + added))
    new = []
    for line, extra in zip(lines, out):
        new += [x for w, x in extra if w == "before"] + [line]
        new += [x for w, x in extra if w == "after"]
    open(path, "w", encoding="utf-8").write("\n".join(new))
    return tmp


def _module(root, name):
    for mod in [n for n in sys.modules if n.split(".")[0] in ("trainer", "model", "dataset")]:
        del sys.modules[mod]
    sys.path.insert(0, root)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(root)


class LengthReward:
    """Stands in for LMForRewardModel: get_score(messages, response) → a score in [-1, 1]."""

    def get_score(self, messages, response):
        return float(len(response) % 7) / 3.0 - 1.0


def tiny_config(g, hidden_size=32, num_hidden_layers=1):
    return g.MiniMindConfig(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                            num_attention_heads=2, num_key_value_heads=1, flash_attn=False)


def sft_standin(model, tokenizer, steps=SFT_STEPS):
    """The `full_sft` checkpoint's stand-in: `steps` AdamW steps of SFT on PROMPTS answered by
    1 to 6 random tokens then <|im_end|>."""
    import torch
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eos = tokenizer.eos_token_id
    for _ in range(steps):
        rows = [(tokenizer(p, add_special_tokens=False).input_ids,
                 torch.randint(100, len(tokenizer), (k,), generator=g).tolist() + [eos])
                for p in PROMPTS for k in range(1, 7)]
        L = max(len(a) + len(b) for a, b in rows)
        x = torch.zeros(len(rows), L, dtype=torch.long)
        y = torch.full((len(rows), L), -100)
        for i, (a, b) in enumerate(rows):
            x[i, :len(a) + len(b)] = torch.tensor(a + b)
            y[i, len(a):len(a) + len(b)] = torch.tensor(b)
        loss = model(x, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    return model


def _models(g, root, sft_steps=SFT_STEPS, **config):
    import torch
    torch.manual_seed(0)
    lm_config = tiny_config(g, **config)
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(root, "model"))
    model = sft_standin(g.MiniMindForCausalLM(lm_config), tokenizer, sft_steps)
    ref_model = g.MiniMindForCausalLM(lm_config)
    ref_model.load_state_dict(model.state_dict())
    return lm_config, tokenizer, model, ref_model.eval().requires_grad_(False)


def run_grpo(checkout, tmp, rec, bug=None, steps=3, accumulation_steps=2, loss_type="cispo",
             num_generations=4, max_gen_len=6, sft_steps=SFT_STEPS, timings=None, **config):
    """train_grpo.py's grpo_train_epoch: 2 prompts × `num_generations` a batch, `steps`
    optimizer steps of `accumulation_steps` batches; `config`: tiny_config's sizes; `timings`:
    a list that gets the epoch's wall time (the set-up left out)."""
    import time
    import torch
    root = patched(checkout, str(tmp), "grpo", bug, recorder=rec is not None)
    g = _module(root, "trainer.train_grpo")
    lm_config, tokenizer, model, ref_model = _models(g, root, sft_steps, **config)
    args = argparse.Namespace(
        device="cpu", max_seq_len=64, max_gen_len=max_gen_len, num_generations=num_generations,
        beta=0.1, loss_type=loss_type, epsilon=0.2, epsilon_high=5.0,
        accumulation_steps=accumulation_steps,
        grad_clip=1.0, log_interval=10 ** 9, save_interval=10 ** 9, debug_mode=False,
        debug_interval=20, epochs=1, save_dir=str(tmp), save_weight="grpo")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g.__dict__.update(
        args=args, lm_config=lm_config, model=model, tokenizer=tokenizer,
        optimizer=rec.optimizer(optimizer) if rec is not None else optimizer,
        autocast_ctx=nullcontext(), rec=rec,
        scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100))
    engine = g.create_rollout_engine(engine_type="torch", policy_model=model,
                                     tokenizer=tokenizer, device="cpu",
                                     autocast_ctx=nullcontext())
    loader = [{"prompt": list(PROMPTS)} for _ in range(steps * accumulation_steps)]
    t0 = time.perf_counter()
    g.grpo_train_epoch(0, loader, 10 ** 9, engine, ref_model, LengthReward())
    if timings is not None:
        timings.append(time.perf_counter() - t0)
    return model


def run_ppo(checkout, tmp, rec, bug=None, rollouts=2, batch_size=4, mini_batch_size=2,
            ppo_update_iters=2, accumulation_steps=2, lr=1e-3):
    """train_ppo.py's ppo_train_epoch: `rollouts` batches of `batch_size` prompts, each updated
    `ppo_update_iters` times in mini-batches of `mini_batch_size`, an optimizer step every
    `accumulation_steps` mini-batches; the script's defaults otherwise (γ 1, λ 0.95, clip 0.2,
    value clip 0.2, vf_coef 0.5, kl_coef 0.02, early_stop_kl 0.25)."""
    import torch
    root = patched(checkout, str(tmp), "ppo", bug, recorder=rec is not None)
    g = _module(root, "trainer.train_ppo")
    lm_config, tokenizer, actor, ref_model = _models(g, root)
    critic = g.CriticModel(lm_config)
    critic.load_state_dict(actor.state_dict(), strict=False)    # as __main__ loads full_sft
    args = argparse.Namespace(
        device="cpu", max_seq_len=64, max_gen_len=6, accumulation_steps=accumulation_steps,
        grad_clip=1.0, log_interval=1, save_interval=10 ** 9, clip_epsilon=0.2, vf_coef=0.5,
        kl_coef=0.02, gamma=1.0, lam=0.95, cliprange_value=0.2,
        ppo_update_iters=ppo_update_iters, early_stop_kl=0.25, mini_batch_size=mini_batch_size,
        debug_mode=False, debug_interval=20, debug_log_ratio=False, epochs=1,
        save_dir=str(tmp), save_weight="ppo_actor")
    actor_optimizer = torch.optim.AdamW(actor.parameters(), lr=lr)
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=lr)
    g.__dict__.update(
        args=args, lm_config=lm_config, actor_model=actor, critic_model=critic,
        tokenizer=tokenizer, autocast_ctx=nullcontext(), rec=rec,
        actor_optimizer=rec.optimizer(actor_optimizer) if rec is not None else actor_optimizer,
        critic_optimizer=critic_optimizer)
    engine = g.create_rollout_engine(engine_type="torch", policy_model=actor,
                                     tokenizer=tokenizer, device="cpu",
                                     autocast_ctx=nullcontext())
    sched = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=100)
             for o in (actor_optimizer, critic_optimizer)]
    loader = [{"prompt": (PROMPTS * batch_size)[:batch_size]} for _ in range(rollouts)]
    g.ppo_train_epoch(0, loader, 10 ** 9, engine, ref_model, *sched, LengthReward())
    return actor
