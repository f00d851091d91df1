"""A real ms-swift GRPO run on CPU (run in the ms-swift environment, tests/live/
swift-requirements.txt): the tiny random Qwen2-style model and character tokenizer of
tiny_trl.py, with a chat template, a synthetic reward registered in ms-swift's `orms`, a local
dataset, no download. `python -m tests.live.tiny_swift ROOT JSON_LIST` runs one watched run per
configuration of the list, in one process, and prints each report's JSON on a line of its own
after MARK."""
import copy
import json
import os
import sys

import torch

MARK = "crosscheck-report "
# the run reads the model from a local directory; without this ms-swift's hub client retries a
# repository listing it cannot reach (no network) for 7 s per run
os.environ.setdefault("MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS", "1")

from tests.live import tiny_trl

# a chat template on the character tokenizer: the prompt's characters, then the completion
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %} {% endif %}")


class CharReward:
    """tiny_trl.reward_a as an ms-swift ORM (constructed with args=...)."""

    def __init__(self, args=None, **kwargs):
        pass

    def __call__(self, completions, **kwargs):
        return tiny_trl.reward_a(completions)


class HasA:
    """1 where the completion holds an 'a', else 0: groups whose four completions agree have
    reward spread 0, the groups ms-swift's dynamic sampling replaces."""

    def __init__(self, args=None, **kwargs):
        pass

    def __call__(self, completions, **kwargs):
        return [float("a" in c) for c in completions]


def model_dir(root):
    path = tiny_trl.model_dir(root)
    cfg = os.path.join(path, "tokenizer_config.json")
    with open(cfg) as f:
        tc = json.load(f)
    if tc.get("chat_template") != CHAT_TEMPLATE:
        tc["chat_template"] = CHAT_TEMPLATE
        with open(cfg, "w") as f:
            json.dump(tc, f)
    return path


def dataset(root):
    path = os.path.join(root, "prompts.jsonl")
    with open(path, "w") as f:
        for p in tiny_trl.PROMPTS * 8:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
    return path


def arguments(root, **overrides):
    from swift.arguments import RLHFArguments
    base = dict(rlhf_type="grpo", model=model_dir(root), model_type="qwen2",
                template="qwen2_5", dataset=[dataset(root)], reward_funcs=["crosscheck_char"],
                output_dir=os.path.join(root, "out"), per_device_train_batch_size=4,
                num_generations=4, max_completion_length=12, max_steps=2, learning_rate=1e-2,
                logging_steps=1, report_to=["none"], save_strategy="no", seed=0,
                temperature=1.0, dataloader_num_workers=0,
                dataloader_persistent_workers=False, tuner_type="full", torch_dtype="float32",
                beta=0.0, split_dataset_ratio=0.0, use_cpu=True, loss_type="grpo")
    base.update(overrides)
    return RLHFArguments(**base)


def _during_loss(trainer_cls, change):
    """A subclass whose `_compute_loss_and_metrics` runs with `change(self, grpo_batch)` applied
    (it returns the batch to use, and may alter the trainer's attributes) and undone after: the
    attributes the audit compares to the configuration read as configured between calls."""
    class Planted(trainer_cls):
        def _compute_loss_and_metrics(self, model, model_inputs, grpo_batch):
            saved = dict(self.__dict__)
            try:
                return super()._compute_loss_and_metrics(model, model_inputs,
                                                         change(self, grpo_batch))
            finally:
                for k in ("beta", "epsilon_low", "epsilon_high"):
                    setattr(self, k, saved[k])
    return Planted


def _replaced(batch, **fields):
    out = copy.copy(batch)
    for k, v in fields.items():
        setattr(out, k, v)
    return out


def _doubled_beta(self, b):
    self.beta = 2 * self.beta
    return b


def _no_clip_higher(self, b):
    self.epsilon_high = self.epsilon_low            # DAPO's clip-higher dropped
    return b


def _dropped_mask(self, b):
    return _replaced(b, completion_mask=torch.ones_like(b.completion_mask))


def _micro_batch_count(self, b):
    # dapo normalised by this micro-batch's tokens, not the accumulation window's
    return _replaced(b, num_items_in_batch=b.completion_mask.sum().float()
                     * self.accelerator.num_processes)


def _old_is_current(self, b):
    # the old log-probs dropped: the ratio is 1 and the clip never binds
    return _replaced(b, old_per_token_logps=None)


def _no_sync(trainer_cls):
    """Every micro-step's backward under DDP's no_sync(): the processes' gradients are never
    averaged (each rank's loss and ∂loss/∂logp are its own and correct)."""
    class Unsynchronised(trainer_cls):
        def training_step(self, model, inputs, *args, **kwargs):
            with self.accelerator.no_sync(model):
                return super().training_step(model, inputs, *args, **kwargs)
    return Unsynchronised


def _no_resample(trainer_cls):
    """Dynamic sampling that keeps every group, those of reward spread 0 included (a copy of
    the rewards: not ms-swift's fallback of keeping the first batch)."""
    class NoResample(trainer_cls):
        def _dynamic_sampling(self, samples, rewards_per_func):
            return samples, rewards_per_func.clone()
    return NoResample


PLANTS = {
    "doubled-beta": lambda c: _during_loss(c, _doubled_beta),
    "no-clip-higher": lambda c: _during_loss(c, _no_clip_higher),
    "dropped-mask": lambda c: _during_loss(c, _dropped_mask),
    "micro-batch-count": lambda c: _during_loss(c, _micro_batch_count),
    "old-is-current": lambda c: _during_loss(c, _old_is_current),
    "no-sync": _no_sync,
    "no-resample": _no_resample,
}


def run(root, every=1, cls=None, plant=None, lift_fipo_guard=False, **overrides):
    """One watched run; returns (trainer, report). `plant` names a bug of PLANTS, planted by
    subclassing the trainer. `lift_fipo_guard` sets `_has_teacher` False: ms-swift (4.5.3,
    4.6.0) sets it True whenever no teacher is given (dynamic self-distillation,
    rollout_mixin.py::_setup_teacher) and then refuses loss_type 'fipo' in
    _compute_loss_and_metrics, so fipo runs only with it lifted."""
    from swift.pipelines.train.rlhf import SwiftRLHF
    from swift.rewards import orms
    import crosscheck.live as live
    orms["crosscheck_char"] = CharReward
    orms["crosscheck_has_a"] = HasA
    os.makedirs(root, exist_ok=True)
    out = {}
    if plant is not None:
        cls = PLANTS[plant]

    class Watched(SwiftRLHF):
        def train(self, trainer):
            if cls is not None:
                trainer.__class__ = cls(type(trainer))
            if lift_fipo_guard:
                trainer._has_teacher = False
            with live.watch(trainer, every=every, verbose=False) as w:
                trainer.train()
            out["trainer"], out["report"] = trainer, w.report
            return {}
    Watched(arguments(root, **overrides)).main()
    return out["trainer"], out["report"]


if __name__ == "__main__":
    for i, conf in enumerate(json.loads(sys.argv[2])):
        _, report = run(os.path.join(sys.argv[1], str(i)), **conf)
        print(MARK + json.dumps({**json.loads(report.json()), "text": report.text()}),
              flush=True)
