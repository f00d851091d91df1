"""Many perturbed inputs in one reference call: how finite differences stay cheap.

A full finite-difference Jacobian evaluates the function at a few stencil points per input
entry: hundreds of points per case. The points are kept as one array per input that moves,
with a leading point axis (`varying`, [P, ...]), beside the inputs they share (`shared`). Where
the function is independent across rows (or across groups), the points are evaluated as the
rows of one batch by a single call of the public reference, which validates its inputs once
for the whole stack; the values are the same as one call per point, row for row.

An entry's `stack` names how (registry):
- "rows": every output row depends on the same row of every input only (per-token losses,
  GAE, returns, GSPO's per-sequence ratio). Points become extra rows; a [T] case's points
  become the rows of a [P, T] batch ("row").
- "groups": group_advantages, whose rows interact only within a group: points become extra
  rows with their group ids kept apart (not under scale="batch", which spans the batch).
- "many": the function couples the whole batch (whitening, aggregation, the actor loss):
  ref_numpy.many evaluates it at every point with its own formulas and one leading axis,
  validating once.
- None: one call per point.
"""
from typing import Callable, List, Mapping, Optional, Sequence

import numpy as np

from ref_numpy import many

from .. import bridge


def mode(stack: Optional[str], arrays: Mapping[str, object], params: Mapping[str, object],
         name: str) -> Optional[str]:
    """The stacking that applies to one case (None: one call per point)."""
    if stack == "rows" and np.ndim(arrays[name]) >= 2:
        return "rows"
    if stack == "rows" and np.ndim(arrays[name]) == 1 and all(       # one [T] trajectory
            np.ndim(v) <= 1 for v in arrays.values() if isinstance(v, np.ndarray)):
        return "row"
    if stack == "rows" and np.ndim(arrays[name]) == 1 and any(       # one value per row [B]
            np.ndim(v) >= 2 and np.shape(v)[0] == np.shape(arrays[name])[0]
            for k, v in arrays.items() if k != name):
        return "rows"
    if stack == "groups" and params.get("scale", "group") != "batch":
        return "groups"
    return "many" if stack == "many" else None


def evaluate(how: Optional[str], fn: Callable, shared: Mapping[str, object],
             varying: Mapping[str, np.ndarray], params: Mapping[str, object],
             outputs: Sequence[str]) -> np.ndarray:
    """fn's flattened outputs at each point, [P, outputs]: the point p has the arrays
    `shared`, and varying[k][p] for each k of `varying`. As few calls as `how` allows."""
    P = len(next(iter(varying.values())))
    if how == "row":                 # one [T] trajectory: the points as the rows of [P, T]
        shared, varying = _one_row(shared), {k: v[:, None] for k, v in varying.items()}
        how = "rows"
    if how == "many" and getattr(fn, "many", None) is not None:     # a frozen objective's own
        return np.array([_flat(o, outputs) for o in fn.many(shared, varying, params)])
    if how == "many" and fn.__module__.startswith("ref_numpy") and fn.__name__ in many.EVALUATORS:
        values = many.evaluate(fn.__name__, shared, varying, params)
        if len(outputs) == 1 and np.ndim(values[0]) == 0:      # one scalar per point
            return np.asarray(values, dtype=np.float64).reshape(P, 1)
        return np.array([_flat(o, outputs) for o in values])
    if how in (None, "many") or P == 1:
        return np.array([_flat(fn(**shared, **{k: v[p] for k, v in varying.items()},
                                  **params), outputs) for p in range(P)])
    key = "rewards" if how == "groups" else next(iter(varying))
    B = np.shape(varying[key])[1]
    batch = {k: _rows(k, v, P, B, how) for k, v in shared.items()}
    batch.update({k: v.reshape((P * B,) + v.shape[2:]) for k, v in varying.items()})
    outs = bridge.outputs(fn(**batch, **params), outputs)
    return np.concatenate([np.asarray(o).reshape(P, -1) for o in outs], axis=1)


def _one_row(arrays):
    """A [T] case's arrays as a batch of one row ([1, T]; a 0-d array as [1])."""
    return {k: v[None] if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


def _flat(out, outputs) -> np.ndarray:
    return np.concatenate([np.asarray(o).reshape(-1) for o in bridge.outputs(out, outputs)])


def _rows(key, value, P, B, how):
    """A shared input as P copies of its rows (or as it is, if it is not per-row)."""
    if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[0] != B:
        return value                              # a scalar, None, or not per-row: shared
    if how == "groups" and key == "group_ids":
        # keep the points' groups apart: ids as codes 0..G−1, shifted by G per point
        _, codes = np.unique(value, return_inverse=True)
        G = int(codes.max()) + 1 if codes.size else 0
        return np.concatenate([codes.reshape(-1) + i * G for i in range(P)])
    return np.concatenate([value] * P, axis=0)


def vjps(how: Optional[str], vjp_at: Callable, arrays: Mapping[str, object],
         cotangents: Sequence[object], name: str, hand=None,
         params: Mapping[str, object] = None) -> List[np.ndarray]:
    """∂⟨g, f⟩/∂`name` for each cotangent g (all for the same inputs): the rows of a Jacobian.
    vjp_at(arrays, g) → {input: gradient}. Under "rows" (or "groups") the copies of the inputs
    are stacked as rows (groups kept apart) with their cotangents, so one call gives them all; under "many", a hand VJP (`hand`,
    with `params`) that ref_numpy.many vectorises takes them all at once; else one call each."""
    if (how == "many" and hand is not None and hand.__module__.startswith("ref_numpy")
            and hand.__name__ in many.VJPS and len(cotangents) > 1):
        return [np.asarray(d[name]) for d in many.vjps(hand.__name__, cotangents, arrays,
                                                       params)]
    if how == "row" and len(cotangents) > 1:
        one = [tuple(gi[None] for gi in g) if isinstance(g, tuple) else g[None]
               for g in cotangents]
        return [r.reshape(np.shape(arrays[name]))
                for r in vjps("rows", vjp_at, _one_row(arrays), one, name)]
    if how not in ("rows", "groups") or len(cotangents) == 1:
        return [np.asarray(vjp_at(arrays, g)[name]) for g in cotangents]
    P, B = len(cotangents), np.shape(arrays["rewards" if how == "groups" else name])[0]
    batch = {k: _rows(k, v, P, B, how) for k, v in arrays.items()}
    if isinstance(cotangents[0], tuple):
        g = tuple(np.concatenate(parts) for parts in zip(*cotangents))
    else:
        g = np.concatenate(cotangents)
    return np.split(np.asarray(vjp_at(batch, g)[name]), P, axis=0)
