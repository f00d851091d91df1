"""A real ms-swift GRPO run on CPU (run in the ms-swift environment, tests/live/
swift-requirements.txt): the tiny random Qwen2-style model and character tokenizer of
tiny_trl.py, with a chat template, a synthetic reward registered in ms-swift's `orms`, a local
dataset, no download. `python -m tests.live.tiny_swift ROOT JSON_LIST` runs one watched run per
configuration of the list, in one process, and prints each report's JSON on a line of its own
after MARK."""
import json
import os
import sys

MARK = "crosscheck-report "

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


def run(root, every=1, cls=None, **overrides):
    """One watched run; returns (trainer, report)."""
    from swift.pipelines.train.rlhf import SwiftRLHF
    from swift.rewards import orms
    import crosscheck.live as live
    orms["crosscheck_char"] = CharReward
    os.makedirs(root, exist_ok=True)
    out = {}

    class Watched(SwiftRLHF):
        def train(self, trainer):
            if cls is not None:
                trainer.__class__ = cls(type(trainer))
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
