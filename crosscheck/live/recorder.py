"""The recorder behind the verl and OpenRLHF live audits: micro-batch calls of a policy loss that
normalises by *global* counts (verl's `agg_loss`, OpenRLHF's `aggregate_loss`: dp_size,
batch_num_tokens, global_batch_size), grouped into optimizer steps by those counts and checked.

Semantics of the counts, shared by both trainers (verl core_algos.agg_loss, OpenRLHF
models/loss.aggregate_loss): per micro-batch
    token-mean:            Σ m·l / batch_num_tokens · dp_size
    seq-mean-token-mean:   Σ_rows (Σ_t m·l / L_b) / global_batch_size · dp_size   (rows with tokens)
    seq-mean-token-sum:    Σ_rows Σ_t m·l / global_batch_size · dp_size
    seq-mean-token-sum-norm (verl 0.9): the last ÷ loss_scale_factor (the padded T when None)
and the micro-batch gradients are summed, then averaged over dp ranks by DDP/FSDP. So a step's
rows are complete once they hold batch_num_tokens tokens (token-mean) or global_batch_size rows
(the per-sequence modes) on one rank (dp_size = 1): that closes the step, which is then checked
against the documented objective over its rows, with the counts themselves checked against the
rows. With dp_size > 1 one process sees its own rows only: the counts are taken as given.
"""
import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .. import bridge
from . import checks
from .objective import MicroBatch, Objective, formula_gradient
from .report import Finding, LiveDeviation, Report, StepResult

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclasses.dataclass(frozen=True)
class Counts:
    mode: str
    dp_size: int
    batch_num_tokens: Optional[float]
    global_batch_size: Optional[float]
    loss_scale_factor: Optional[float] = None

    def given(self) -> bool:
        return (self.batch_num_tokens if self.mode == "token-mean"
                else self.global_batch_size) is not None


def micro_batch_formula(counts: Counts, kwargs, mb: MicroBatch):
    """(policy_objective keywords, factor) of one micro-batch's loss under the global counts."""
    mode, dp = counts.mode, counts.dp_size
    if mode == "token-mean":
        if counts.batch_num_tokens is None:
            return {**kwargs, "agg": "token-mean"}, 1.0
        return {**kwargs, "agg": "seq-mean-token-sum-norm",
                "norm": float(counts.batch_num_tokens) / dp}, 1.0
    agg = "seq-mean-token-mean" if mode == "seq-mean-token-mean" else "seq-mean-token-sum"
    kw = {**kwargs, "agg": agg, "empty_rows": "exclude"}
    if mode == "seq-mean-token-sum-norm":
        kw["norm"] = float(counts.loss_scale_factor or mb.mask.shape[1])
    if counts.global_batch_size is None:
        return kw, 1.0
    rows = float(mb.mask.any(axis=1).sum())
    return kw, rows * dp / float(counts.global_batch_size)


def step_objective(counts: Counts, kwargs, source: str) -> Objective:
    """The documented objective over one step's rows (dp_size = 1, counts from the rows)."""
    if counts.mode == "token-mean":
        return Objective({**kwargs, "agg": "token-mean"}, "step", source)
    agg = "seq-mean-token-mean" if counts.mode == "seq-mean-token-mean" else "seq-mean-token-sum"
    kw = {**kwargs, "agg": agg, "empty_rows": "exclude"}
    if counts.mode == "seq-mean-token-sum-norm":
        kw["norm"] = float(counts.loss_scale_factor)
    return Objective(kw, "step", source)


def _guarded(method):
    """An error in the recorder's own code never stops the run (only strict's LiveDeviation
    does): it is reported in Report.errors and the open step is dropped unchecked."""
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except LiveDeviation:
            raise
        except Exception as exc:
            self.report.errors.append(f"step {self._steps}: {type(exc).__name__}: {exc}")
            self._group = None
    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


class Recorder:
    """Records micro-batch policy-loss calls; checks each step when its rows are complete."""

    def __init__(self, trainer: str, every: int, strict: bool, stream, source: str,
                 explicit_steps: bool = False):
        self.every, self.strict, self.stream, self.source = every, strict, stream, source
        self.explicit = explicit_steps
        self.report = Report(trainer, [], "each step's rows under the loss_agg_mode, normalised "
                             "by the global counts the trainer passes", "", every, 1)
        self.report.trusted = [
            "the rewards, log-probs, old log-probs, advantages and masks the actor loop passed "
            "to the loss: read as given",
            "the backward below the log-probs and the optimizer's update",
            "the all-reduce across data-parallel ranks (each process sees its own rows)"]
        self._group: Optional[dict] = None
        self._steps = 0
        self._touched: Dict[int, str] = {}      # log-prob tensors a further term was computed on

    # ------------------------------------------------------------------ recording
    @_guarded
    def policy_call(self, logp, old, adv, mask, value, counts: Counts, kwargs: Optional[dict],
                    why_not: str = ""):
        """One call of the policy loss, before its backward: `logp` is the tensor the loss
        received (a hook records its gradient), `value` the loss it returned."""
        g = self._group
        if g is not None and not self.explicit and (g["counts"] != counts or g["complete"]):
            self.close()
            g = None
        if g is None:
            self._steps += 1
            g = self._group = dict(counts=counts, mbs=[], holders=[], complete=False,
                                   sampled=(self._steps - 1) % self.every == 0, shared=[],
                                   kwargs=kwargs, why_not=why_not, ids=set())
        if not g["sampled"]:
            return
        if kwargs is None or kwargs != g["kwargs"]:
            g["why_not"] = g["why_not"] or why_not or "the policy loss changed within a step"
            g["kwargs"] = None
        cap: dict = {}
        if isinstance(logp, torch.Tensor) and logp.requires_grad:
            logp.register_hook(lambda grad, cap=cap: cap.__setitem__("grad",
                                                                     bridge.to_numpy(grad)))
            g["ids"].add(id(logp))
            if id(logp) in self._touched:            # the further term came first
                g["shared"].append(self._touched[id(logp)])
        m = bridge.to_numpy(mask) != 0
        mb = MicroBatch(rank=0, index=len(g["mbs"]), logp=bridge.to_numpy(logp),
                        old_logp=bridge.to_numpy(old), advantages=bridge.to_numpy(adv), mask=m,
                        ref_logp=None, loss=float(bridge.to_numpy(value)),
                        dtype=str(logp.dtype).replace("torch.", ""), meta=dict(counts=counts))
        g["mbs"].append(mb)
        g["holders"].append(cap)
        if counts.dp_size == 1 and counts.given():
            tokens = sum(int(x.mask.sum()) for x in g["mbs"])
            rows = sum(int(x.mask.any(axis=1).sum()) for x in g["mbs"])
            full = (tokens >= counts.batch_num_tokens if counts.mode == "token-mean"
                    else rows >= counts.global_batch_size)
            g["complete"] = bool(full)

    @_guarded
    def other_term(self, logp, what: str):
        """Another term of the loss computed on the same log-probs (a KL loss): its gradient
        reaches them too, so the step's gradient check cannot judge the policy loss alone."""
        if not (isinstance(logp, torch.Tensor) and logp.requires_grad):
            return
        self._touched[id(logp)] = what
        g = self._group
        if g is not None and id(logp) in g["ids"]:
            g["shared"].append(what)

    def step(self):
        """The optimizer stepped (explicit_steps=True): check the micro-batches since the last."""
        self.close()

    # ------------------------------------------------------------------ checking
    @_guarded
    def close(self):
        """Check the open step (called when the next step starts, and on exit)."""
        g, self._group = self._group, None
        self._touched = {}
        if g is None or not g["sampled"] or not g["mbs"]:
            return
        for mb, cap in zip(g["mbs"], g["holders"]):
            mb.grad = cap.get("grad")
        res = self._loose(self._steps)
        counts, mbs = g["counts"], g["mbs"]
        dtypes = sorted({mb.dtype for mb in mbs})
        row, tol = checks.tolerance_row(dtypes)
        self.report.precision = checks.row_words(row, dtypes)
        if g["kwargs"] is None or any(d not in checks.JUDGED for d in dtypes):
            why = g["why_not"] or f"log-probs in {', '.join(dtypes)}: no tolerance row"
            res.skipped.update({"micro-batch loss": why, "gradient": why})
            self._finish(res)
            return
        kwargs = g["kwargs"]
        differ = {mb.meta["counts"] for mb in mbs}
        if len(differ) > 1:
            res.count("global counts", len(mbs), 1)
            res.findings.append(Finding(
                res.step, "global counts", "deviation",
                f"the micro-batches of one optimizer step pass {len(differ)} different global "
                f"counts: " + "; ".join(f"batch_num_tokens={c.batch_num_tokens}, "
                                        f"global_batch_size={c.global_batch_size}"
                                        for c in sorted(differ, key=str)),
                source=self.source))

        def formula(mb):
            kw, f = micro_batch_formula(mb.meta["counts"], kwargs, mb)
            return kw, f, self.source
        checks.micro_batch_losses(res, mbs, formula, tol)
        if g["shared"]:
            res.skipped["gradient"] = ("a further term on the same log-probs (" +
                                       ", ".join(sorted(set(g["shared"]))) + ") reaches their "
                                       "gradient; its coefficient is the actor loop's")
        elif not counts.given():
            res.skipped["gradient"] = ("no global counts were passed: the micro-batches' "
                                       "weighting is the actor loop's")
        elif counts.dp_size > 1:
            self._given_counts(res, mbs, counts, kwargs, formula, tol)
        else:
            if len(differ) == 1:
                self._counts(res, mbs, counts)
            lsf = counts.loss_scale_factor
            if counts.mode == "seq-mean-token-sum-norm" and lsf is None:
                self._given_counts(res, mbs, counts, kwargs, formula, tol)
            else:
                checks.gradient(res, mbs, 1, step_objective(counts, kwargs, self.source), tol)
        self._finish(res)

    def _given_counts(self, res, mbs, counts, kwargs, formula, tol):
        """The gradient against the counts as given (their totals cannot be seen from here)."""
        reference = formula_gradient(formula, mbs, counts.dp_size)
        applied = [mb.grad / counts.dp_size for mb in mbs]
        scale = max(float(np.max(np.abs(r))) if r.size else 0.0 for r in reference)
        fails = 0
        for mb, a, r in zip(mbs, applied, reference):
            c = bridge.compare(a, r, tol, scale=scale)
            if not c.ok:
                fails += int((~bridge.within(a, r, tol, scale=scale)).sum())
                res.findings.append(Finding(
                    res.step, "gradient", "deviation", "∂loss/∂logp differs from the "
                    "objective's under the global counts as given", micro_batch=mb.index,
                    token=c.index, got=c.got, expected=c.expected, source=self.source))
        res.count("gradient", sum(a.size for a in applied), fails)

    def _counts(self, res, mbs, counts):
        tokens = sum(int(mb.mask.sum()) for mb in mbs)
        rows = sum(int(mb.mask.any(axis=1).sum()) for mb in mbs)
        if counts.mode == "token-mean":
            name, passed, actual = "batch_num_tokens", counts.batch_num_tokens, tokens
        else:
            name, passed, actual = "global_batch_size", counts.global_batch_size, rows
        ok = float(passed) == float(actual)
        res.count("global counts", 1, 0 if ok else 1)
        if not ok:
            res.findings.append(Finding(
                res.step, "global counts", "deviation",
                f"the {name} the trainer passes is not the step's: its micro-batches hold "
                f"{actual}", got=float(passed), expected=float(actual), source=self.source))

    def _finish(self, res: StepResult):
        if self.stream is not None:
            self.stream.write(res.line() + "\n")
        if self.strict and res.deviations:
            raise LiveDeviation(res.deviations[0])

    @_guarded
    def value(self, check: str, got, expected, what: str, source: str):
        """A value the trainer computed, against the reference's (advantages, aggregation, a
        KL estimate), checked on the spot and reported in the step that is open."""
        g = self._group
        step = self._steps if g is not None else self._steps + 1
        res = self._loose(step)
        dtypes = [str(got.dtype).replace("torch.", "")] if isinstance(got, torch.Tensor) else []
        _, tol = checks.tolerance_row(dtypes or ["float64"])
        a, e = bridge.to_numpy(got), np.asarray(expected, dtype=np.float64)
        c = bridge.compare(a, e, tol)
        res.count(check, max(a.size, 1), 0 if c.ok else 1, c.max_rel)
        if not c.ok:
            f = Finding(step, check, "deviation", f"{what} differs from the reference's",
                        token=c.index or None, got=c.got, expected=c.expected, source=source)
            res.findings.append(f)
            if self.strict:
                raise LiveDeviation(f)

    def _loose(self, step) -> StepResult:
        """The StepResult collecting on-the-spot checks of `step` (created on first use)."""
        for s in self.report.steps:
            if s.step == step:
                return s
        s = StepResult(step)
        self.report.steps.append(s)
        return s
