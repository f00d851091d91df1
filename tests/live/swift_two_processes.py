"""Run by tests/live/test_swift_run.py in ms-swift's environment as a user runs ms-swift on
several processes:

    python -m torch.distributed.run --nproc_per_node 2 tests/live/swift_two_processes.py \
        ROOT OUT SCENARIO...

Each scenario trains the tiny model of tiny_swift.py for two steps under
crosscheck.live.watch(every=1) and writes each rank's report to OUT/<scenario>.rank<r>.json.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.live import tiny_swift  # noqa: E402

SCENARIOS = {
    "dapo": dict(loss_type="dapo", gradient_accumulation_steps=2),
    "grpo-kl": dict(loss_type="grpo", gradient_accumulation_steps=2, beta=0.04,
                    num_iterations=2),
    "no-sync": dict(loss_type="dapo", gradient_accumulation_steps=2, plant="no-sync"),
    "micro-batch-count": dict(loss_type="dapo", gradient_accumulation_steps=2,
                              plant="micro-batch-count"),
}


def main(root, out, *names):
    import torch.distributed as dist
    # each rank saves its own copy of the (seeded, identical) model and prompts, so no two
    # processes write one file, and all of them before the first run starts the process group
    # (transformers then saves a model on rank 0 only)
    here = {name: os.path.join(root, name, "rank" + os.environ.get("RANK", "0"))
            for name in names}
    for name in names:
        tiny_swift.model_dir(here[name])
    for name in names:
        trainer, report = tiny_swift.run(here[name], **SCENARIOS[name])
        rank = trainer.accelerator.process_index
        with open(os.path.join(out, f"{name}.rank{rank}.json"), "w") as f:
            json.dump(dict(report.as_json(), world=trainer.accelerator.num_processes,
                           rank=rank), f)
    if dist.is_initialized():       # end the process group before exit: a gloo thread still
        dist.barrier()              # running at interpreter exit aborts the process
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
