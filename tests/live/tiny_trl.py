"""A real TRL GRPO run on CPU, built in the test: a tiny random Qwen2-style model (hidden 32,
2 layers, a 40-token vocabulary) saved to a temporary directory, a character tokenizer built
with `tokenizers`, a synthetic reward, no download from any hub.

Several token ids end a completion (the digits as well as <eos>), so completions have
different lengths and the batches carry right padding.
"""
import os

import torch

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 "
VOCAB = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
ENDS = [VOCAB["<eos>"]] + [VOCAB[d] for d in "0123"]
PROMPTS = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op"]


def tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def model_dir(root, seed=0):
    """Save the tiny model and its tokenizer under `root`; return the directory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    path = os.path.join(root, "tiny-qwen2")
    if os.path.isdir(path):
        return path
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                      max_position_embeddings=1024, eos_token_id=1, pad_token_id=0,
                      bos_token_id=None, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = ENDS
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path


def reward_a(completions, **kwargs):
    """More 'a's is better, longer is worse: rewards that differ within every group."""
    return [float(c.count("a")) + 0.5 * float(c.count("e")) - 0.05 * len(c) for c in completions]


def reward_b(completions, **kwargs):
    """A second reward: fewer distinct characters is better (differs within groups too)."""
    return [-float(len(set(c))) for c in completions]


def config(out, **overrides):
    from trl import GRPOConfig
    base = dict(output_dir=out, per_device_train_batch_size=4, num_generations=4,
                max_completion_length=12, max_steps=2, learning_rate=1e-2, logging_steps=1,
                report_to="none", use_cpu=True, save_strategy="no", seed=0,
                disable_tqdm=True, temperature=1.0)
    base.update(overrides)
    return GRPOConfig(**base)


def trainer(root, cls=None, reward_funcs=None, **overrides):
    """A GRPOTrainer (or a subclass `cls`) on the tiny model, ready to train."""
    from datasets import Dataset
    from trl import GRPOTrainer
    cls = cls or GRPOTrainer
    path = model_dir(root)
    ds = Dataset.from_dict({"prompt": PROMPTS * 8})
    args = config(os.path.join(root, "out"), **overrides)
    return cls(model=path, reward_funcs=reward_funcs or reward_a, args=args,
               train_dataset=ds, processing_class=tokenizer())


def patched(cls, method, old, new):
    """A subclass of `cls` whose `method` is its own source with one piece `old` replaced by
    `new` (a planted bug in a temporary copy, in memory; the installed package is untouched)."""
    import inspect
    import sys
    import textwrap
    src = textwrap.dedent(inspect.getsource(getattr(cls, method)))
    if src.count(old) != 1:
        raise AssertionError(f"{old!r} occurs {src.count(old)} times in {method}")
    # compiled inside a function whose argument is __class__: a zero-argument super() in the
    # method then starts after the class that defines it, as in the original
    body = (f"def _planted_make(__class__):\n{textwrap.indent(src.replace(old, new), '    ')}"
            f"\n    return {method}\n")
    owner = next(c for c in cls.__mro__ if method in vars(c))
    module = sys.modules[getattr(cls, method).__module__]
    ns: dict = dict(vars(module))
    exec(compile(body, f"<planted {method}>", "exec"), ns)
    return type(f"Planted{cls.__name__}", (cls,), {method: ns["_planted_make"](owner)})


# the planted bugs of the live-audit tests: (method, TRL's code, the bug)
LOCAL_COUNT = ("_compute_loss", 'inputs["num_items_in_batch"].clamp(min=1.0)',
               "mask.sum().clamp(min=1.0)")
WRONG_MASK = ("_compute_loss", 'mask = completion_mask if "tool_mask" not in inputs',
              'mask = torch.ones_like(completion_mask) if "tool_mask" not in inputs')
# invisible at step 1, where the reference, the old and the current policy coincide
DOUBLE_KL = ("_compute_loss", "per_token_loss + self.beta * per_token_kl",
             "per_token_loss + 2 * self.beta * per_token_kl")
WIDE_CLIP = ("_compute_loss", "1 - self.epsilon_low, 1 + self.epsilon_high)",
             "1 - 2 * self.epsilon_low, 1 + 2 * self.epsilon_high)")
NARROW_CLIP = ("_compute_loss", "1 - self.epsilon_low, 1 + self.epsilon_high)",
               "1 - self.epsilon_low / 4, 1 + self.epsilon_high / 4)")
K1_KL = ("_compute_loss", "torch.exp(ref_per_token_logps - per_token_logps) - "
                          "(ref_per_token_logps - per_token_logps) - 1",
         "per_token_logps - ref_per_token_logps")
# the completions keep the tokens generate() produced after their first end token, and the
# completion mask counts them
NO_END_CUT = ("_generate_single_turn", "c[m].tolist() for c, m in zip(",
              "c.tolist() for c, m in zip(")
# the provenance of the loss's inputs (crosscheck/live/provenance.py)
SLICE_TWICE = ("_prepare_inputs",
               "self._buffered_inputs[self._step % self.args.steps_per_generation]",
               "self._buffered_inputs[(self._step % self.args.steps_per_generation) // 2 * 2]")
ONE_PASS = ("_prepare_inputs",
            "generate_every = self.args.steps_per_generation * self.num_iterations",
            "generate_every = self.args.steps_per_generation")
OLD_ROLLED = ("_generate_and_score_completions",
              'output["old_per_token_logps"] = old_per_token_logps',
              'output["old_per_token_logps"] = old_per_token_logps.roll(1, 0)')
REF_IS_POLICY = ("_generate_and_score_completions", "self.ref_model,\n", "self.model,\n")
MASK_PAST_EOS = ("_generate_single_turn", "(sequence_indices <= eos_idx.unsqueeze(1)).int()",
                 "(sequence_indices <= eos_idx.unsqueeze(1) + 1).int()")
COUNT_PADDING = ("_generate_and_score_completions", "gather(loss_mask.sum()).sum()",
                 "gather(torch.ones_like(loss_mask).sum()).sum()")
WEIGHTS_TWICE = ("_generate_and_score_completions",
                 "rewards_per_func * self.reward_weights.to(device).unsqueeze(0)",
                 "rewards_per_func * self.reward_weights.to(device).unsqueeze(0) ** 2")
WIDE_EPS = ("_generate_and_score_completions", "advantages / (std_rewards + 1e-4)",
            "advantages / (std_rewards + 1e-2)")


def double_accumulation(cls):
    """TRL's loss already divides by the accumulation steps; this subclass lets the HF Trainer
    divide again (loss_is_scaled_for_ga = False)."""
    return type(f"Twice{cls.__name__}", (cls,), {"loss_is_scaled_for_ga": False})


def unsynchronised(cls):
    """A subclass that runs every micro-step under the DDP model's no_sync(), the last one
    included (meant to save the all-reduce during accumulation): each process keeps and applies
    its own gradients."""
    def training_step(self, model, inputs, num_items_in_batch=None):
        with model.no_sync():
            return cls.training_step(self, model, inputs, num_items_in_batch)
    return type(f"NoSync{cls.__name__}", (cls,), {"training_step": training_step})


def rolled_advantages(cls):
    """A subclass whose micro-batches carry their rows' advantages rolled by one row (rows and
    advantages reordered separately)."""
    def _prepare_inputs(self, batch):
        inputs = cls._prepare_inputs(self, batch)
        if self.model.training:
            inputs = {**inputs, "advantages": inputs["advantages"].roll(1, 0)}
        return inputs
    return type(f"Rolled{cls.__name__}", (cls,), {"_prepare_inputs": _prepare_inputs})


def loss_at_temperature_one(cls):
    """A subclass that fits the fused LM head again after __init__, at temperature 1: the
    sampler still draws at GRPOConfig.temperature, the loss scores at 1."""
    def __init__(self, *args, **kwargs):
        from trl.trainer.utils import add_fused_lm_head
        cls.__init__(self, *args, **kwargs)
        add_fused_lm_head(self.model, temperature=1.0, outputs=("log_probs", "entropy"))
    return type(f"Hot{cls.__name__}", (cls,), {"__init__": __init__})
