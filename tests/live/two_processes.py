"""Run by tests/live/test_trl_two_processes.py as a user runs TRL on several processes:

    accelerate launch --cpu --num_processes 2 tests/live/two_processes.py ROOT OUT SCENARIO...

Each scenario trains the tiny model for two steps under crosscheck.live.watch(every=1) and
writes each rank's report to OUT/<scenario>.rank<r>.json.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from trl import GRPOTrainer  # noqa: E402

import crosscheck.live as live  # noqa: E402
from tests.live import tiny_trl  # noqa: E402

SCENARIOS = {
    "dapo": (None, dict(loss_type="dapo")),
    "grpo-accumulated-kl": (None, dict(loss_type="grpo", gradient_accumulation_steps=2,
                                       beta=0.04)),
    "local-count": (lambda: tiny_trl.patched(GRPOTrainer, *tiny_trl.LOCAL_COUNT),
                    dict(loss_type="dapo")),
    "twice-accumulated": (lambda: tiny_trl.double_accumulation(GRPOTrainer),
                          dict(loss_type="dapo", gradient_accumulation_steps=2)),
    "no-sync": (lambda: tiny_trl.unsynchronised(GRPOTrainer), dict(loss_type="dapo")),
    "wrong-mask": (lambda: tiny_trl.patched(GRPOTrainer, *tiny_trl.WRONG_MASK),
                   dict(loss_type="dapo")),
    # provenance across ranks: the global token count, and rows against their advantages
    "count-padding": (lambda: tiny_trl.patched(GRPOTrainer, *tiny_trl.COUNT_PADDING),
                      dict(loss_type="dapo")),
    "rolled-advantages": (lambda: tiny_trl.rolled_advantages(GRPOTrainer),
                          dict(loss_type="dapo")),
}


def main(root, out, *names):
    for name in names:
        make, config = SCENARIOS[name]
        tr = tiny_trl.trainer(root, cls=make() if make else None, **config)
        with live.watch(tr, every=1, verbose=False) as w:
            tr.train()
        rank = tr.accelerator.process_index
        with open(os.path.join(out, f"{name}.rank{rank}.json"), "w") as f:
            json.dump(dict(w.report.as_json(), world=tr.accelerator.num_processes,
                           rank=rank), f)
    import torch.distributed as dist
    if dist.is_initialized():       # end the process group before exit: a gloo thread still
        dist.barrier()              # running at interpreter exit aborts the process
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
