"""The bridge between the two twins, and between them and a user's code: conversion (NumPy ↔
torch ↔ JSON), the autograd VJP, and the one closeness rule. The harness, `--scale`, the audit,
the walkthrough and the tests all use these; nothing else converts or compares.

The closeness rule (`within`, `compare`): an entry passes where

    |got − expected| ≤ (atol·scale + rtol·max(|got|, |expected|))·κ + extra,

equal infinities match, and a NaN, or an inf against anything else, never does. `scale` is 1
except for finite differences (the size of what is differentiated); `extra` is their round-off
bound; κ ≥ 1 is the condition number of the output where the registry declares one (a
normalisation of values on a large common offset, 1000 ± 0.1, cannot be computed more
accurately than the rounding of its inputs times max|x|/spread). The tolerances themselves
come from `crosscheck.tolerances`.
"""
import dataclasses
import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch


# ====================================================================== conversion
def tensor(x, requires_grad: bool = False):
    """One input as the torch twin takes it: bool and integer arrays keep their meaning (bool,
    int64), float arrays become float64 tensors; None, numbers, strings and tuples pass as they
    are (hyper-parameters)."""
    if x is None or isinstance(x, (bool, int, float, str, tuple)):
        return x
    a = np.asarray(x)
    if a.dtype == bool:
        return torch.from_numpy(a.copy())
    if a.dtype.kind in "iu":
        return torch.from_numpy(a.astype(np.int64))
    return torch.tensor(a, dtype=torch.float64, requires_grad=requires_grad)


def to_torch(arrays: Dict[str, object], requires_grad: Sequence[str] = ()) -> Dict[str, object]:
    """A dict of inputs as `tensor` converts them; the keys in `requires_grad` become leaves."""
    return {k: tensor(v, requires_grad=k in requires_grad) for k, v in arrays.items()}


def to_numpy(x) -> np.ndarray:
    """A tensor (detached, on the CPU) or anything array-like, as a float64 NumPy array."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def outputs(out, keys: Optional[Sequence[str]] = None) -> List[np.ndarray]:
    """A function's outputs as a list of NumPy arrays: a dict in the order of `keys`, a tuple in
    its order, anything else as one output. Tensors are detached; dtypes are kept."""
    seq = [out[k] for k in keys] if isinstance(out, dict) else \
        (out if isinstance(out, tuple) else (out,))
    return [o.detach().cpu().numpy() if isinstance(o, torch.Tensor) else np.asarray(o)
            for o in seq]


def cotangent(outs: Sequence[np.ndarray], vec: np.ndarray, names: Sequence[str],
              as_dict: bool = False):
    """Split a flat vector into a cotangent shaped like `outs`: a float for a 0-d output; a dict
    keyed by `names` (as_dict), a tuple for several outputs, else the one array."""
    parts, k = [], 0
    for o in outs:
        parts.append(vec[k:k + o.size].reshape(o.shape) if o.ndim else float(vec[k]))
        k += o.size
    if as_dict:
        return dict(zip(names, parts))
    return tuple(parts) if len(names) > 1 else parts[0]


def backprop(outs, gs, leaves: Sequence[torch.Tensor]) -> List[Optional[np.ndarray]]:
    """⟨g, outs⟩ differentiated by autograd wrt each leaf, in float64: a NumPy gradient per
    leaf, or None where the outputs do not depend on it (or where nothing requires grad).

    `outs` and `gs` are one tensor and its cotangent, or sequences of them (a float for a 0-d
    output). The one place a vector-Jacobian product is taken through torch."""
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    gs = gs if isinstance(gs, (tuple, list)) else (gs,)
    total = sum((o.double() * torch.as_tensor(g, dtype=torch.float64)).sum()
                for o, g in zip(outs, gs))
    if not (isinstance(total, torch.Tensor) and total.requires_grad):
        return [None] * len(leaves)
    grads = torch.autograd.grad(total, list(leaves), allow_unused=True)
    return [None if g is None else to_numpy(g) for g in grads]


def autograd_vjp(torch_fn, arrays: Dict[str, object], params: Dict[str, object],
                 wrt: Sequence[str], g, keys: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
    """⟨g, torch_fn(arrays, params)⟩ differentiated by autograd wrt the inputs `wrt`, in float64.

    `g` is shaped like the outputs (a dict keyed by `keys` when the function returns a dict).
    An input the output does not depend on gets a zero gradient."""
    t = to_torch(arrays, requires_grad=wrt)
    outs = torch_fn(**t, **params)
    if isinstance(outs, dict):
        outs, g = [outs[k] for k in keys], [g[k] for k in keys]
    grads = backprop(outs, g, [t[n] for n in wrt])
    return {n: (np.zeros(np.shape(arrays[n])) if gr is None else gr) for n, gr in zip(wrt, grads)}


def json_safe(v):
    """Plain JSON values: NumPy arrays become lists (0-d: a number), NumPy scalars Python ones,
    non-finite floats the strings "nan", "inf", "-inf"; dicts, lists and tuples recursively."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


# ====================================================================== closeness
@dataclasses.dataclass
class Comparison:
    ok: bool
    badness: float        # the worst |diff| / allowed (0: exact; > 1: a failure)
    max_abs: float
    max_rel: float
    index: tuple
    got: float
    expected: float
    allowed: float


def _elementwise(got, expected, tol, scale, extra, cond=1.0):
    """(diff, mag, allowed, badness) per entry under the closeness rule."""
    same_inf = np.isinf(got) & np.isinf(expected) & (np.sign(got) == np.sign(expected))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(got - expected))
        mag = np.where(same_inf, 0.0, np.maximum(np.abs(got), np.abs(expected)))
        allowed = (tol.atol * scale + tol.rtol * mag) * cond + extra
        diff = np.where(np.isnan(diff), np.inf, diff)
        badness = np.where(diff == 0, 0.0, diff / allowed)
        badness = np.where(np.isnan(badness), np.inf, badness)    # NaN anywhere is the worst
    return diff, mag, allowed, badness


def within(got, expected, tol, scale: float = 1.0, extra: float = 0.0,
           cond=1.0) -> np.ndarray:
    """Per entry: does `got` match `expected` under the closeness rule? (Same shapes.)"""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return _elementwise(got, expected, tol, scale, extra, cond)[3] <= 1.0


def first_mismatch(got, expected, tol, valid, cond=1.0) -> Optional[tuple]:
    """The first index (row-major) where `valid` holds and `got` does not match, or None."""
    bad = np.asarray(valid, dtype=bool) & ~within(got, expected, tol, cond=cond)
    return tuple(int(k) for k in np.argwhere(bad)[0]) if bad.any() else None


def compare(got, expected, tol, scale: float = 1.0, extra: float = 0.0,
            cond=1.0) -> Comparison:
    """The closeness rule over whole arrays: the verdict, the worst entry and the largest
    absolute and relative errors. Different shapes never match; empty arrays always do."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return Comparison(False, math.inf, math.inf, math.inf, (), math.nan, math.nan, 0.0)
    diff, mag, allowed, badness = _elementwise(got, expected, tol, scale, extra, cond)
    floor = tol.atol * scale / tol.rtol if tol.rtol > 0 else 0.0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # relative error where it means something: below atol·scale/rtol the absolute term rules
        rel = np.where(diff == 0, 0.0, diff / np.maximum(mag, floor))
    if got.size == 0:
        return Comparison(True, 0.0, 0.0, 0.0, (), 0.0, 0.0, 0.0)
    flat = int(np.argmax(badness))
    idx = np.unravel_index(flat, got.shape) if got.ndim else ()
    worst = float(badness.flat[flat])
    return Comparison(bool(worst <= 1.0), worst, float(diff.max()), float(rel.max()),
                      tuple(int(i) for i in idx), float(got.flat[flat]),
                      float(expected.flat[flat]), float(allowed.flat[flat]))
