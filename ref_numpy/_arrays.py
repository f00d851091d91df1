"""NumPy side of input handling: turn arguments into float64 arrays and a boolean mask.

`ref_numpy` computes in float64 whatever it is given: it is the reference of record.
"""
import numpy as np

from . import _checks

# exp() arguments are capped here so that a ratio saturates at the largest float instead of
# overflowing to inf (inf·0 would then turn a clipped, zero-gradient token into NaN).
LOG_FLOAT_MAX = float(np.log(np.finfo(np.float64).max))


def _kind(a: np.ndarray) -> str:
    k = a.dtype.kind
    return {"f": "float", "i": "int", "u": "int", "b": "bool", "c": "complex"}.get(k, "other")


def spec(name: str, x) -> _checks.Spec:
    a = np.asarray(x)
    return _checks.Spec(name, tuple(a.shape), _kind(a), str(a.dtype))


def token(name: str, x) -> np.ndarray:
    """A float token array [B, T] or [T], as float64."""
    _checks.require_token(spec(name, x))
    return np.asarray(x, dtype=np.float64)


def like(name: str, x, ref_name: str, ref: np.ndarray) -> np.ndarray:
    """A float array that must have exactly `ref`'s shape."""
    s = spec(name, x)
    _checks.require_float(s)
    _checks.same_shape(_checks.Spec(ref_name, ref.shape, "float", "float64"), s)
    return np.asarray(x, dtype=np.float64)


def mask_of(mask, ref_name: str, ref: np.ndarray, name: str = "mask") -> np.ndarray:
    """A boolean mask shaped like `ref`; None means every position is valid."""
    if mask is None:
        return np.ones(ref.shape, dtype=bool)
    s = spec(name, mask)
    _checks.require_mask(s, _checks.Spec(ref_name, ref.shape, "float", "float64"))
    m = np.asarray(mask)
    ok = bool(np.all((m == 0) | (m == 1)))
    bad = None if ok else m[(m != 0) & (m != 1)].flat[0].item()
    _checks.mask_values(name, ok, bad)
    return m.astype(bool)


def finite_at_valid(name: str, x: np.ndarray, valid: np.ndarray) -> None:
    bad = valid & ~np.isfinite(x)
    if bad.any():
        idx = np.argwhere(bad)[0]
        _checks.finite_at_valid(name, tuple(int(i) for i in idx), x[tuple(idx)])


def zero_masked(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """x with every masked position set to 0, so padding (even NaN) reaches no arithmetic."""
    return np.where(valid, x, 0.0)


def as_2d(*arrays):
    """View [T] inputs as one row [1, T]; returns the arrays and whether to squeeze back."""
    squeeze = arrays[0].ndim == 1
    if squeeze:
        arrays = tuple(None if a is None else a[None, ...] for a in arrays)
    return arrays, squeeze
