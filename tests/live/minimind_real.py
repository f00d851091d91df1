"""MiniMind's own trainer/train_grpo.py, from a checkout (jingyaogong/minimind d65ef2c, the
commit its report card pins), run under crosscheck.live.record_loop on CPU.

A copy of the checkout's trainer/, model/ and dataset/ goes to a temporary folder; the script
there gets the recorder's lines (RECORDER_LINES, inserted after the line they follow) and, for a
planted bug, one replaced line; `grpo_train_epoch`, the script's own function, then runs with
what its `__main__` block would build, at a tiny configuration: a 1-layer MiniMindConfig with
hidden size 32, 2 prompts × 4 generations of 6 tokens, its own TorchRolloutEngine and tokenizer,
and a reward model that scores by length (the real one is a 1.8B InternLM2 download).
"""
import argparse
import importlib
import os
import shutil
import sys
from contextlib import nullcontext

# (the line of train_grpo.py they follow, the lines the recorder needs)
RECORDER_LINES = (
    ("advantages = (rewards - mean_r) / (std_r + 1e-4)  # [B*num_gen]",
     "crosscheck_rec.advantages(advantages, rewards=rewards)"),
    ("completion_mask = ((torch.arange(",
     "crosscheck_rec.inputs(per_token_logps, old_per_token_logps, advantages, completion_mask,"
     " ref_logp=ref_per_token_logps)"),
    ("loss = (policy_loss + aux_loss) / args.accumulation_steps  # scalar",
     "crosscheck_rec.loss(loss)"),
)
BUGS = {
    # each micro-batch normalised as a whole step: the ÷ accumulation_steps left out
    "micro-batch-norm": ("loss = (policy_loss + aux_loss) / args.accumulation_steps  # scalar",
                         "loss = (policy_loss + aux_loss)  # scalar"),
}
PROMPTS = ["<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"]


def patched(checkout, tmp, bug=None):
    for d in ("trainer", "model", "dataset"):
        shutil.copytree(os.path.join(checkout, d), os.path.join(tmp, d))
    path = os.path.join(tmp, "trainer", "train_grpo.py")
    lines = open(path, encoding="utf-8").read().split("\n")
    missing = [a for a, _ in RECORDER_LINES if not any(x.strip().startswith(a) for x in lines)]
    if missing:
        raise ValueError(f"train_grpo.py has no line {missing[0]!r}: not MiniMind d65ef2c")
    out = []
    for line in lines:
        indent = line[:len(line) - len(line.lstrip())]
        out.append(indent + BUGS[bug][1] if bug and line.strip() == BUGS[bug][0] else line)
        out += [indent + added for anchor, added in RECORDER_LINES
                if line.strip().startswith(anchor)]
    open(path, "w", encoding="utf-8").write("\n".join(out))
    return tmp


class LengthReward:
    """Stands in for LMForRewardModel: get_score(messages, response) → a score in [-3, 3]."""

    def get_score(self, messages, response):
        return float(len(response) % 7) / 3.0 - 1.0


def run_grpo(checkout, tmp, rec, bug=None, steps=3, accumulation_steps=2, loss_type="cispo"):
    import torch
    root = patched(checkout, str(tmp), bug)
    for name in [n for n in sys.modules if n.split(".")[0] in ("trainer", "model", "dataset")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        g = importlib.import_module("trainer.train_grpo")
    finally:
        sys.path.remove(root)
    torch.manual_seed(0)
    args = argparse.Namespace(
        device="cpu", max_seq_len=64, max_gen_len=6, num_generations=4, beta=0.1,
        loss_type=loss_type, epsilon=0.2, epsilon_high=5.0, accumulation_steps=accumulation_steps,
        grad_clip=1.0, log_interval=10 ** 9, save_interval=10 ** 9, debug_mode=False,
        debug_interval=20, epochs=1, save_dir=str(tmp), save_weight="grpo")
    lm_config = g.MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, flash_attn=False)
    model = g.MiniMindForCausalLM(lm_config)
    ref_model = g.MiniMindForCausalLM(lm_config)
    ref_model.load_state_dict(model.state_dict())
    ref_model = ref_model.eval().requires_grad_(False)
    tokenizer = g.AutoTokenizer.from_pretrained(os.path.join(root, "model"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g.__dict__.update(
        args=args, lm_config=lm_config, model=model, tokenizer=tokenizer,
        optimizer=rec.optimizer(optimizer), autocast_ctx=nullcontext(), crosscheck_rec=rec,
        scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100))
    engine = g.create_rollout_engine(engine_type="torch", policy_model=model,
                                     tokenizer=tokenizer, device="cpu",
                                     autocast_ctx=nullcontext())
    loader = [{"prompt": list(PROMPTS)} for _ in range(steps * accumulation_steps)]
    g.grpo_train_epoch(0, loader, 10 ** 9, engine, ref_model, LengthReward())
    return model
