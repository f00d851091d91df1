"""The live audit: rides along a real training run and checks, at each sampled optimizer step,
on that step's own tensors, that the gradient the optimizer receives is the gradient of the
objective the trainer documents (docs/live.md).

    with crosscheck.live.watch(trainer, every=10) as w:
        trainer.train()
    print(w.report.text())

A loop of your own: `crosscheck.live.record_loop(objective, ...)` (crosscheck/live/loop.py).
"""

from .objective import MicroBatch, Objective
from .report import Finding, LiveDeviation, Report, StepResult

__all__ = ["watch", "record_loop", "Finding", "LiveDeviation", "MicroBatch", "Objective", "Report",
           "StepResult"]


def watch(trainer, every: int = 10, strict: bool = False, verbose=None):
    """Audit `trainer` while it trains, at the optimizer steps of the schedule: steps 1 and 2,
    then every `every`-th step counted from step 1 (every=10: 1, 2, 11, 21, 31, ...;
    every=1: every step). Step 1 cannot show a KL or clipping bug (policy = old policy =
    reference there); step 2 is the first step that can.

    strict: raise LiveDeviation at the first deviation. verbose: print a line per checked step
    and the final report on stderr (default: when stderr is a terminal).
    Returns a context manager; its `.report` is filled as the run goes.
    """
    from .options import arguments
    every, strict, stream = arguments(every, strict, verbose)
    from . import swift, trl
    if swift.is_swift_grpo(trainer):          # a subclass of TRL's: asked first
        return swift.SwiftWatch(trainer, every, strict, stream)
    if trl.is_trl_grpo(trainer):
        return trl.TRLWatch(trainer, every, strict, stream)
    raise TypeError(f"trainer is a {type(trainer).__module__}.{type(trainer).__qualname__}; "
                    f"expected a TRL or ms-swift GRPOTrainer (for verl and OpenRLHF: "
                    f"crosscheck.live.verl.record(), crosscheck.live.openrlhf.record(); for a loop "
                    f"of your own: crosscheck.live.record_loop())")


def record_loop(objective, *, norm_over: str = "step", value=None, advantages=None,
                every: int = 10, strict: bool = False, verbose=None):
    """The live audit of a home-grown PyTorch loop: mark the loss's inputs and the loss, wrap
    the optimizer, and declare the objective in policy_objective's keywords (normalised over
    each optimizer step or each micro-batch), with optionally a critic's value loss and the
    advantage estimator (crosscheck/live/loop.py, docs/live.md)."""
    from .loop import record
    return record(objective, norm_over=norm_over, value=value, advantages=advantages,
                  every=every, strict=strict, verbose=verbose)
