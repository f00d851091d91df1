"""The reference side of the live audit: what one optimizer step should back-propagate.

A trainer's step is a window of micro-batches on every rank. Each micro-batch computes a loss
from its per-token log-probs and back-propagates it; the optimizer receives the sum over the
window, averaged over ranks (DDP's all-reduce mean). Per completion token that gradient is

    g_applied[token] = (1/P) · ∂(loss its micro-batch back-propagated)/∂logp[token]

(each token lies in exactly one micro-batch), and it must equal ∂J/∂logp[token] for J the
objective the trainer documents for the whole step. The documented J is one of two shapes:

- scope "step": one normalisation over every row of the step on every rank (DAPO's token mean
  over the global accumulated batch, GRPO's mean over all sequences, Dr. GRPO's constant):
      J = policy_objective(all the step's rows, **kwargs);
- scope "micro-batch": each micro-batch normalised on its own and the results averaged
  (TRL's bnpo, "the local batch"):
      J = (1/M) Σ_m policy_objective(rows of micro-batch m, **kwargs),  M micro-batches in all.

Everything here is NumPy on float64 copies of the run's own tensors; the gradients are the
reference's hand-derived VJPs (ref_numpy.policy_objective_vjp), with no autograd and no
second pass through the model.
"""
import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

import ref_numpy

SCOPES = ("step", "micro-batch")


@dataclasses.dataclass
class MicroBatch:
    """One micro-batch as a rank back-propagated it: float64 copies of its tensors."""
    rank: int
    index: int                         # position in the accumulation window, from 0
    logp: np.ndarray                   # [B, T] the log-probs the loss received
    old_logp: np.ndarray               # [B, T]
    advantages: np.ndarray             # [B] or [B, T]
    mask: np.ndarray                   # [B, T] bool: the tokens the loss counts
    ref_logp: Optional[np.ndarray]     # [B, T] or None
    loss: float                        # the value the trainer's loss function returned
    grad: Optional[np.ndarray] = None  # ∂(the loss back-propagated)/∂logp, from a tensor hook
    dtype: str = "float32"             # the log-probs' dtype in the run
    meta: Dict[str, object] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Objective:
    """An objective as the reference computes it: `policy_objective` keywords, the rows one
    normalisation spans, a factor, and where the trainer states it."""
    kwargs: Mapping[str, object]       # loss, agg, norm, empty_rows, beta, kl_kind, clip_*, ...
    scope: str                         # SCOPES
    source: str
    factor: float = 1.0

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"scope is {self.scope!r}; expected one of {SCOPES}")


def _arrays(mb: MicroBatch):
    return mb.logp, mb.old_logp, mb.advantages, mb.mask, mb.ref_logp


def _call(kwargs, logp, old_logp, advantages, mask, ref_logp):
    kw = dict(kwargs)
    if not kw.get("beta"):
        ref_logp = None                # a KL term at beta 0 contributes nothing
    value = float(ref_numpy.policy_objective(logp, old_logp, advantages, mask, ref_logp, **kw))
    grad = ref_numpy.policy_objective_vjp(1.0, logp, old_logp, advantages, mask, ref_logp,
                                          **kw)["logp"]
    return value, grad


def micro_batch_value(kwargs: Mapping[str, object], factor: float, mb: MicroBatch) -> float:
    """The reference value of one micro-batch's loss: factor · policy_objective(its rows)."""
    return factor * _call(kwargs, *_arrays(mb))[0]


def stacked(mbs: Sequence[MicroBatch]):
    """All rows of `mbs` in one batch, padded on the right to the longest T (padding is masked
    out and holds 0), and each micro-batch's (row slice, T)."""
    T = max(mb.mask.shape[1] for mb in mbs)
    per_token = lambda a: a.ndim == 2                                       # noqa: E731

    def pad(a, fill):
        if a is None:
            return None
        out = np.full((a.shape[0], T), fill, dtype=a.dtype)
        out[:, :a.shape[1]] = a
        return out

    logp = np.concatenate([pad(mb.logp, 0.0) for mb in mbs])
    old = np.concatenate([pad(mb.old_logp, 0.0) for mb in mbs])
    mask = np.concatenate([pad(mb.mask, False) for mb in mbs])
    if any(per_token(mb.advantages) for mb in mbs):
        adv = np.concatenate([pad(mb.advantages if per_token(mb.advantages)
                                  else np.repeat(mb.advantages[:, None], mb.mask.shape[1], 1),
                                  0.0) for mb in mbs])
    else:
        adv = np.concatenate([mb.advantages for mb in mbs])
    ref = None
    if all(mb.ref_logp is not None for mb in mbs):
        ref = np.concatenate([pad(mb.ref_logp, 0.0) for mb in mbs])
    where, row = [], 0
    for mb in mbs:
        where.append((slice(row, row + mb.mask.shape[0]), mb.mask.shape[1]))
        row += mb.mask.shape[0]
    return (logp, old, adv, mask, ref), where


def step_value_and_gradient(obj: Objective, mbs: Sequence[MicroBatch]
                            ) -> Tuple[float, List[np.ndarray]]:
    """J of the whole step and ∂J/∂logp for each micro-batch, in its own [B, T]."""
    if obj.scope == "step":
        arrays, where = stacked(mbs)
        value, grad = _call(obj.kwargs, *arrays)
        return obj.factor * value, [obj.factor * grad[rows, :T] for rows, T in where]
    values, grads = zip(*(_call(obj.kwargs, *_arrays(mb)) for mb in mbs))
    M = len(mbs)
    return (obj.factor * sum(values) / M, [obj.factor * g / M for g in grads])


def applied_gradient(mbs: Sequence[MicroBatch], world: int) -> List[np.ndarray]:
    """What the optimizer receives per token: each micro-batch's hooked gradient / P."""
    return [mb.grad / world for mb in mbs]


def formula_gradient(formula, mbs: Sequence[MicroBatch], world: int) -> List[np.ndarray]:
    """The gradient a trainer's own micro-batch formula implies, summed over the window and
    averaged over ranks: factor_m · ∂policy_objective(rows of m, **kwargs_m)/∂logp / P, where
    `formula(mb)` gives (kwargs_m, factor_m, source)."""
    out = []
    for mb in mbs:
        kwargs, factor, _ = formula(mb)
        out.append(factor * _call(kwargs, *_arrays(mb))[1] / world)
    return out
