"""The live audit of a home-grown PyTorch loop: `crosscheck.live.record_loop(objective, ...)`.

A loop of your own has no trainer object to wrap, so you mark what its loss is made of and
declare, in the reference's vocabulary, the objective it means:

    rec = crosscheck.live.record_loop(
        dict(loss="ppo", clip_low=0.2, agg="seq-mean-token-mean", empty_rows="include",
             beta=0.1, kl_kind="k3"),
        advantages=dict(estimator="group_advantages", group_size=6))
    optimizer = rec.optimizer(optimizer)          # its step() closes each optimizer step
    with rec:
        ...
        rec.advantages(advantages, rewards=rewards)
        rec.inputs(logp, old_logp, advantages, mask, ref_logp=ref_logp)
        loss = ...
        rec.loss(loss)                            # the loss you back-propagate
        loss.backward()

The declaration:
- `objective`: `policy_objective`'s keywords (loss, clip_low/high, beta, kl_kind, agg, norm,
  empty_rows, ...), one normalisation over
- `norm_over`: "step" (J over every row of the optimizer step: the micro-batches' losses sum to
  it) or "micro-batch" (each micro-batch normalised on its own, the results averaged over the
  step's micro-batches);
- `value` (PPO with a critic): `value_loss`'s clip, its coefficient `coef` in the loss and its
  token aggregation `agg`; mark the critic's tensors with `rec.critic(...)`;
- `advantages`: `estimator="group_advantages"` with its conventions, or `estimator="gae"` with
  gamma and lam and, optionally, `whiten=` `whiten`'s conventions.

At each sampled step (steps 1 and 2, then every `every`-th: the TRL watch's schedule) it checks
each micro-batch's loss value, the hooked ∂(what was back-propagated)/∂logp at every token
summed over the step (and ÷ processes) against ∂J/∂logp, that no gradient flows into the
advantages, old or reference log-probs, and the advantages against the declared estimator. A
gradient that fails is tried against the other aggregations (OTHER_AGGS × NORM_OVER): one that
matches names the cause.
"""
import time
import types
from typing import List, Optional

import numpy as np
import torch

import ref_numpy

from .. import bridge
from . import checks
from .objective import MicroBatch, Objective, counted_rows, step_value_and_gradient
from .report import Finding, LiveDeviation, Report, StepResult
from .trl import _all_gather, _broadcast, _dist, sampled

NORM_OVER = ("step", "micro-batch")
# aggregations a gradient that fails is tried against, to name the one the loop computes
OTHER_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
ESTIMATORS = ("group_advantages", "gae")
SOURCE = "the objective you declared"
TRUSTED = (
    "the log-probs, old log-probs, reference log-probs, advantages and masks you marked: the "
    "checks run on the tensors the loss received, as marked (the model's forward pass and the "
    "sampling that produced them are not recomputed)",
    "the rewards you marked, as your reward functions returned them",
    "the backward below the log-probs (∂logp/∂parameters) and the optimizer's update",
    "that every micro-batch back-propagated between two optimizer steps was marked",
)
ALL_REDUCE = ("the all-reduce: each process's gradient is taken to be averaged over the "
              "processes")


def _check_objective(objective) -> dict:
    if not isinstance(objective, dict):
        raise TypeError(f"objective is {type(objective).__name__} {objective!r}; expected a "
                        f"dict of policy_objective's keywords (loss, agg, beta, ...)")
    lp = np.full((1, 2), -1.0)
    try:
        ref_numpy.policy_objective(lp, lp, np.ones(1), np.ones((1, 2), bool),
                                   lp if objective.get("beta") else None, **objective)
    except TypeError as exc:
        raise TypeError(f"objective: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"objective: {exc}") from None
    return dict(objective)


def _check_advantages(adv) -> Optional[dict]:
    if adv is None:
        return None
    if not isinstance(adv, dict) or adv.get("estimator") not in ESTIMATORS:
        raise ValueError(f"advantages is {adv!r}; expected a dict with estimator one of "
                         f"{ESTIMATORS} and that estimator's conventions")
    return dict(adv)


def _check_value(value) -> Optional[dict]:
    if value is None:
        return None
    allowed = {"clip", "coef", "agg"}
    if not isinstance(value, dict) or not set(value) <= allowed or "coef" not in value:
        raise ValueError(f"value is {value!r}; expected a dict with coef (the value loss's "
                         f"weight in your loss) and optionally clip (value_loss's) and agg "
                         f"(aggregate's mode, default 'token-mean')")
    return {"clip": 0.2, "agg": "token-mean", **value}


def _np(x):
    return None if x is None else bridge.to_numpy(x)


def _hold(t: torch.Tensor, held: dict, name: str, report: Report) -> None:
    """Count the nonzero gradient entries that reach `t`, or the node it was computed from by
    one indexing or view (`advantages[inds]` marked, `advantages[inds]` written again in the
    loss: two nodes over one tensor), into held[name] (the time it takes into report.seconds)."""
    def count(grads):
        t0 = time.perf_counter()
        held[name] += sum(int((g != 0).sum()) for g in grads if g is not None)
        report.seconds += time.perf_counter() - t0
    nodes = [t.grad_fn] if t.grad_fn is not None else []
    nodes += [n for n, _ in (t.grad_fn.next_functions if t.grad_fn is not None else ())
              if n is not None]
    if t.grad_fn is None:                   # a leaf that requires grad
        t.register_hook(lambda g: count([g]))
    for node in nodes:
        node.register_hook(lambda grad_in, grad_out: count(grad_out))


class LoopRecorder:
    """`crosscheck.live.record_loop`: see the module docstring."""

    def __init__(self, objective, norm_over, value, advantages, every, strict, stream):
        if norm_over not in NORM_OVER:
            raise ValueError(f"norm_over is {norm_over!r}; expected one of {NORM_OVER}")
        self.kw = _check_objective(objective)
        self.scope = norm_over
        self.value_decl = _check_value(value)
        self.adv_decl = _check_advantages(advantages)
        self.every, self.strict, self.stream = every, strict, stream
        self.world = torch.distributed.get_world_size() if _dist() else 1
        self.rank = torch.distributed.get_rank() if _dist() else 0
        self._done = 0                       # optimizer steps taken
        self._res: Optional[StepResult] = None
        self._mbs: List[MicroBatch] = []
        self._caps: List[dict] = []
        self._open: Optional[dict] = None    # the micro-batch marked by inputs(), until loss()
        self._undo = []
        config = [(k, v, "objective= (policy_objective)") for k, v in self.kw.items()]
        config.append(("norm_over", norm_over, "norm_over="))
        for k, v in (self.value_decl or {}).items():
            config.append((f"value {k}", v, "value= (value_loss)"))
        for k, v in (self.adv_decl or {}).items():
            config.append((f"advantages {k}", v, "advantages="))
        words = (f"policy_objective({', '.join(f'{k}={v!r}' for k, v in self.kw.items())}), "
                 f"normalised over each {norm_over}")
        if self.value_decl:
            words += f", + {self.value_decl['coef']} · value_loss"
        self.report = Report("home-grown loop", config, words, "", every, self.world)
        self.report.trusted = list(TRUSTED)
        if self.world == 1:
            self.report.not_applicable["rank agreement"] = "one process"
        else:
            self.report.trusted.append(ALL_REDUCE)
        if self.adv_decl is None:
            self.report.not_applicable["advantages"] = "no advantage estimator declared"
        elif self.adv_decl["estimator"] == "gae":
            self.report.words["advantages"] = (
                "the advantages the loop computed, against gae"
                + (" then whiten" if "whiten" in self.adv_decl else "")
                + " on the marked per-token rewards, values and mask")
        else:
            self.report.words["advantages"] = ("the advantages the loop computed, against "
                                               "group_advantages on the marked rewards")

    # ------------------------------------------------------------------ context
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for obj, had, value in reversed(self._undo):
            if had:
                obj.step = value
            else:
                obj.__dict__.pop("step", None)
        self._undo.clear()
        if self.stream is not None and self.rank == 0 and exc[0] is None:
            self.stream.write(self.report.text() + "\n")
        return False

    def optimizer(self, opt):
        """Wrap `opt.step` on this instance (restored on exit): each call first checks the step
        (so with strict=True a deviating gradient is never applied), then steps."""
        had = "step" in opt.__dict__
        orig = opt.step
        self._undo.append((opt, had, opt.__dict__.get("step")))

        def step(_opt, *args, **kwargs):
            self.step()
            return orig(*args, **kwargs)
        opt.step = types.MethodType(step, opt)      # bound, as LR schedulers expect
        return opt

    @property
    def sampled(self) -> bool:
        return sampled(self._done + 1, self.every)

    def _own(self, fn, *args):
        """The recorder's own code: timed, and an error in it never stops the run."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except LiveDeviation:
            raise
        except Exception as exc:
            self.report.errors.append(f"step {self._done + 1}: {type(exc).__name__}: {exc}")
            self._mbs, self._caps, self._open = [], [], None
            self._res = None
        finally:
            self.report.seconds += time.perf_counter() - t0

    def _result(self) -> StepResult:
        if self._res is None:
            self._res = StepResult(self._done + 1)
        return self._res

    # ------------------------------------------------------------------ marks
    def inputs(self, logp, old_logp, advantages, mask, ref_logp=None):
        """Mark one micro-batch's inputs: `logp` [B, T] the log-probs the loss receives (a hook
        records their gradient), `old_logp`, `advantages` ([B] or [B, T]), `mask` [B, T] and,
        with β > 0, `ref_logp`."""
        if self.sampled:
            self._own(self._inputs, logp, old_logp, advantages, mask, ref_logp)

    def _inputs(self, logp, old_logp, advantages, mask, ref_logp):
        if not (isinstance(logp, torch.Tensor) and logp.requires_grad):
            raise TypeError("logp is not a tensor that requires grad: mark the log-probs the "
                            "loss back-propagates through")
        cap: dict = {"held": {}}

        def keep(g, cap=cap):               # runs in your backward: timed as the audit's own
            t0 = time.perf_counter()
            cap["grad"] = bridge.to_numpy(g)
            self.report.seconds += time.perf_counter() - t0
        logp.register_hook(keep)
        for name, t in (("advantages", advantages), ("old log-probs", old_logp),
                        ("reference log-probs", ref_logp)):
            if t is None:
                continue
            cap["held"][name] = 0
            if isinstance(t, torch.Tensor) and t.requires_grad:
                _hold(t, cap["held"], name, self.report)
        self._open = dict(cap=cap, logp=_np(logp), old=_np(old_logp), adv=_np(advantages),
                          mask=_np(mask) != 0, ref=_np(ref_logp),
                          dtype=str(logp.dtype).replace("torch.", ""))

    def critic(self, values, old_values, returns, mask=None):
        """Mark the critic's tensors of the micro-batch (declared `value=`): the value loss is
        part of the loss value; its gradient reaches the critic, not the log-probs."""
        if self.sampled and self._open is not None:
            self._open["critic"] = (_np(values), _np(old_values), _np(returns),
                                    None if mask is None else _np(mask) != 0)

    def loss(self, loss):
        """Mark the loss this micro-batch back-propagates (after any ÷ accumulation steps);
        returns it unchanged."""
        if self.sampled:
            self._own(self._loss, loss)
        return loss

    def _loss(self, loss):
        o, self._open = self._open, None
        if o is None:
            raise ValueError("loss() was marked with no inputs() before it in this micro-batch")
        self._result()
        mb = MicroBatch(rank=self.rank, index=len(self._mbs), logp=o["logp"], old_logp=o["old"],
                        advantages=o["adv"], mask=o["mask"], ref_logp=o["ref"],
                        loss=float(loss.detach()), dtype=o["dtype"],
                        meta=dict(critic=o.get("critic")))
        self._mbs.append(mb)
        self._caps.append(o["cap"])

    def advantages(self, got, *, rewards, values=None, mask=None):
        """Mark the advantages the loop computed, with what the declared estimator takes:
        `rewards` ([B] for group_advantages; [B, T] per-token for gae, with `values` and
        `mask`). Checked on the spot against the estimator."""
        if self.sampled and self.adv_decl is not None:
            self._own(self._advantages, got, rewards, values, mask)

    def _advantages(self, got, rewards, values, mask):
        res = self._result()
        decl = {k: v for k, v in self.adv_decl.items() if k != "estimator"}
        a = bridge.to_numpy(got)
        dtypes = [str(got.dtype).replace("torch.", "")]
        _, tol = checks.tolerance_row(dtypes)
        r = bridge.to_numpy(rewards)
        if self.adv_decl["estimator"] == "group_advantages":
            checks.advantages(res, a, r, slice(None), decl, "advantages= (group_advantages)",
                              tol, self.rank)
            return
        whiten = decl.pop("whiten", None)
        m = None if mask is None else bridge.to_numpy(mask) != 0
        expected, _ = ref_numpy.gae(r, bridge.to_numpy(values), m, **decl)
        if whiten is not None:
            expected = ref_numpy.whiten(expected, m, **whiten)
        if m is not None:
            a, expected = np.where(m, a, 0.0), np.where(m, expected, 0.0)
        c = bridge.compare(a, expected, tol, cond=1.0 + float(np.max(np.abs(r)) /
                                                              max(np.std(r), 1e-300)))
        res.count("advantages", a.size, 0 if c.ok else 1, c.max_rel)
        if not c.ok:
            res.findings.append(Finding(
                res.step, "advantages", "deviation", "the advantages differ from gae"
                + (" then whiten" if whiten is not None else "") + " on the marked rewards "
                "and values", rank=self.rank, token=c.index, got=c.got, expected=c.expected,
                source="advantages= (gae)"))

    # ------------------------------------------------------------------ the step
    def step(self):
        """The optimizer is about to step (called by the wrapped optimizer; call it yourself
        right after optimizer.step() otherwise): check the step if it is sampled."""
        if self.sampled:
            self._own(self._close)
        self._done += 1
        self._mbs, self._caps, self._open, self._res = [], [], None, None

    def _close(self):
        res = self._result()
        for mb, cap in zip(self._mbs, self._caps):
            mb.grad = cap.get("grad")
            mb.meta["held"] = cap["held"]
        gathered = _all_gather(dict(mbs=self._mbs), self.world)
        if self.rank == 0:
            self._check(res, [mb for p in gathered for mb in p["mbs"]])
        res = _broadcast(res, self.world)
        self.report.steps.append(res)
        if self.stream is not None and self.rank == 0:
            self.stream.write(res.line() + "\n")
            self.stream.flush()
        if self.strict and res.deviations:
            raise LiveDeviation(res.deviations[0])

    def _check(self, res: StepResult, mbs: List[MicroBatch]):
        dtypes = sorted({mb.dtype for mb in mbs})
        row, tol = checks.tolerance_row(dtypes or ["float32"])
        self.report.precision = checks.row_words(row, dtypes)
        if not mbs:
            for c in ("micro-batch loss", "gradient"):
                res.skipped[c] = "no micro-batch was marked in this step"
            return
        self._detached(res, mbs)
        unjudged = [d for d in dtypes if d not in checks.JUDGED]
        if unjudged:
            for c in ("micro-batch loss", "gradient"):
                res.skipped[c] = f"log-probs in {', '.join(unjudged)}: no tolerance row"
            return
        share = self._shares(mbs)
        if share is None:
            res.skipped["micro-batch loss"] = (f"agg {self.kw.get('agg')!r} over the step: "
                                               f"no micro-batch's share of it")
        else:
            extra = self._value_term if self.value_decl else None
            checks.micro_batch_losses(
                res, mbs, lambda mb: (self.kw, share[mb.rank, mb.index], SOURCE), tol,
                extra=None if extra is None else (lambda mb: share[mb.rank, mb.index]
                                                  * extra(mb)))
        checks.gradient(res, mbs, self.world, Objective(self.kw, self.scope, SOURCE), tol,
                        self._aggregations())

    def _aggregations(self):
        """The other token aggregations and normalisation scopes (OTHER_AGGS × NORM_OVER), as
        `checks.gradient` alternatives: a gradient that is one of them is named by it."""
        declared = (self.kw.get("agg", "seq-mean-token-mean"), self.scope)
        out = []
        for agg in OTHER_AGGS:
            try:                            # keywords the declared aggregation alone takes
                kw = _check_objective({**self.kw, "agg": agg})
            except (TypeError, ValueError):
                continue
            for scope in NORM_OVER:
                if (agg, scope) == declared:
                    continue
                obj = Objective(kw, scope, SOURCE)
                out.append((lambda mbs, o=obj: step_value_and_gradient(o, counted_rows(mbs))[1],
                            "deviation",
                            f"the aggregation: the gradient is that of agg={agg!r} normalised "
                            f"over each {scope}, not the declared agg={declared[0]!r} over each "
                            f"{declared[1]}", SOURCE))
        return out

    def _value_term(self, mb: MicroBatch) -> float:
        crit = mb.meta.get("critic")
        if crit is None:
            raise ValueError("value= was declared but critic() was not marked")
        v, old, ret, m = crit
        per_token = ref_numpy.value_loss(v, old, ret, m, clip=self.value_decl["clip"])
        mask = m if m is not None else np.ones(v.shape, bool)
        return self.value_decl["coef"] * float(ref_numpy.aggregate(
            per_token, mask, mode=self.value_decl["agg"]))

    def _shares(self, mbs):
        """Each micro-batch's share of J: its loss is share · policy_objective(its rows)."""
        if self.scope == "micro-batch":
            return {(mb.rank, mb.index): 1.0 / (len(mbs) / self.world) for mb in mbs}
        agg = self.kw.get("agg", "seq-mean-token-mean")
        if agg == "token-mean":
            units = {(mb.rank, mb.index): float(mb.mask.sum()) for mb in mbs}
        elif agg in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
            keep_empty = self.kw.get("empty_rows", "exclude") == "include"
            units = {(mb.rank, mb.index): float(mb.mask.shape[0] if keep_empty
                                                else mb.mask.any(axis=1).sum()) for mb in mbs}
        else:
            return None
        total = sum(units.values())
        return {k: (u / total if total else 0.0) * self.world for k, u in units.items()}

    def _detached(self, res: StepResult, mbs: List[MicroBatch]):
        n = fails = 0
        for mb in mbs:
            for name, nonzero in mb.meta["held"].items():
                n += 1
                if nonzero:
                    fails += 1
                    res.findings.append(Finding(
                        res.step, "detached", "deviation",
                        f"the loss back-propagates into the {name} ({nonzero} nonzero "
                        f"gradient entries reached them): they are not detached, so the step "
                        f"also trains whatever computed them", rank=mb.rank,
                        micro_batch=mb.index, source=SOURCE))
        res.count("detached", n, fails)


def record(objective, *, norm_over: str = "step", value=None, advantages=None, every: int = 10,
         strict: bool = False, verbose=None) -> LoopRecorder:
    """The live audit of a home-grown loop (`crosscheck.live.record_loop`; docs/live.md)."""
    from .options import arguments
    every, strict, stream = arguments(every, strict, verbose)
    return LoopRecorder(objective, norm_over, value, advantages, every, strict, stream)
