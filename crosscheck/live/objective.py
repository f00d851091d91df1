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


@dataclasses.dataclass
class Terms:
    """The reference per-token gradient of one micro-batch split into its terms, each [B, T]:

        ∂J/∂logp = policy + kl

    `policy` is ∂J/∂logp at β = 0 (the policy term under the step's aggregation; zero where the
    clip region removes it), `kl` the rest (β·∂KL/∂logp under the same aggregation, 0 at β = 0).
    `counted` is the mask the objective counts (the trainer's mask, cut after the completion's
    first end token where that is known), `after_end` the positions after that end token,
    `ratio` the importance weight exp(logp − old_logp) (per sequence at sequence level),
    `advantages` broadcast to [B, T], and `kl_alternatives` β·KL's gradient under other KL
    estimators (name → [B, T]), for naming a wrong one."""
    policy: np.ndarray
    kl: np.ndarray
    counted: np.ndarray
    after_end: np.ndarray
    ratio: np.ndarray
    advantages: np.ndarray
    beta: float = 0.0
    clip_low: Optional[float] = None
    clip_high: Optional[float] = None
    delta: Optional[float] = None
    kl_name: str = ""
    kl_alternatives: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def clipped(self) -> np.ndarray:
        """Counted tokens with a non-zero advantage whose policy term has no gradient: the clip
        region (or a zero weight) removes them."""
        return self.counted & (self.advantages != 0) & (self.policy == 0)


def counted_rows(mbs: Sequence[MicroBatch]) -> List[MicroBatch]:
    """Each micro-batch with the mask the objective counts: the trainer's mask, zero after the
    completion's first end token where the recorder knows it (meta "after_end")."""
    out = []
    for mb in mbs:
        after = mb.meta.get("after_end")
        if after is None:
            out.append(mb)
        else:
            out.append(dataclasses.replace(mb, mask=mb.mask & ~np.asarray(after, dtype=bool)))
    return out


KL_ESTIMATORS = (("k1", None), ("k2", None), ("k3", None), ("k1", "ratio"), ("k2", "ratio"),
                 ("k3", "ratio"))


def _kl_name(kind, weight):
    return f"β·{kind}" + (" · ratio (bias-corrected)" if weight == "ratio" else "")


def split_terms(obj: Objective, mbs: Sequence[MicroBatch], reference: Sequence[np.ndarray]
                ) -> List[Terms]:
    """The terms of `reference` (∂J/∂logp of `obj` over `mbs`, per micro-batch), one Terms each.
    Linear in the per-token loss: the KL term is the reference less its β = 0 objective."""
    kw = obj.kwargs
    beta = float(kw.get("beta") or 0.0)
    policy = step_value_and_gradient(dataclasses.replace(obj, kwargs={**kw, "beta": 0.0}),
                                     mbs)[1]
    alternatives = {}
    mine = (kw.get("kl_kind", "k3"), kw.get("kl_weight"))
    if beta:
        # the configured weighting first: where the ratio is 1 (step 1) both read the same
        for kind, weight in sorted(KL_ESTIMATORS, key=lambda e: e[1] != mine[1]):
            if (kind, weight) == mine:
                continue
            alt = step_value_and_gradient(dataclasses.replace(
                obj, kwargs={**kw, "kl_kind": kind, "kl_weight": weight}), mbs)[1]
            alternatives[_kl_name(kind, weight)] = [a - p for a, p in zip(alt, policy)]
    out = []
    for i, (mb, ref, pol) in enumerate(zip(mbs, reference, policy)):
        after = mb.meta.get("after_end")
        after = np.zeros_like(mb.mask) if after is None else np.asarray(after, dtype=bool)
        adv = mb.advantages if mb.advantages.ndim == 2 else \
            np.repeat(mb.advantages[:, None], mb.mask.shape[1], 1)
        with np.errstate(over="ignore", invalid="ignore"):
            log_ratio = np.where(mb.mask, mb.logp - mb.old_logp, 0.0)
            if kw.get("loss") == "gspo":
                n = np.maximum(mb.mask.sum(1, keepdims=True), 1)
                log_ratio = np.repeat(log_ratio.sum(1, keepdims=True) / n, mb.mask.shape[1], 1)
            ratio = np.exp(log_ratio)
        out.append(Terms(policy=pol, kl=ref - pol, counted=mb.mask & ~after, after_end=after,
                         ratio=ratio, advantages=adv, beta=beta, clip_low=kw.get("clip_low"),
                         clip_high=kw.get("clip_high"), delta=kw.get("delta"),
                         kl_name=_kl_name(*mine),
                         kl_alternatives={k: v[i] for k, v in alternatives.items()}))
    return out
