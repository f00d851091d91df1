"""NumPy side of input handling: how ref_numpy answers the contract parsers' questions about
its arrays (`OPS`), and the small array helpers its formulas share.

`ref_numpy` computes in float64 whatever it is given: it is the reference of record.
"""
import numpy as np

from ref_common.checks import Spec

# exp() arguments are capped here so that a ratio saturates at the largest float instead of
# overflowing to inf (inf·0 would then turn a clipped, zero-gradient token into NaN).
LOG_FLOAT_MAX = float(np.log(np.finfo(np.float64).max))

_KINDS = {"f": "float", "i": "int", "u": "int", "b": "bool", "c": "complex"}


_NAMES = {}


def _dtype_names(dtype):
    """(kind, name) of a dtype, looked up once per dtype (numpy builds dtype.name anew on every
    access, a cost every validated call pays)."""
    names = _NAMES.get(dtype)
    if names is None:
        names = _NAMES[dtype] = (_KINDS.get(dtype.kind, "other"), dtype.name)
    return names


class NumpyOps:
    """ref_common.args.Ops for NumPy: every float input becomes a float64 array."""

    uniform = False          # float inputs of any dtype are converted to float64

    @staticmethod
    def spec(name, x) -> Spec:
        a = np.asarray(x)
        kind, dtype = _dtype_names(a.dtype)
        return Spec(name, tuple(a.shape), kind, dtype)

    @staticmethod
    def floats(x):
        return np.asarray(x, dtype=np.float64)

    @staticmethod
    def bad_mask_value(m):
        m = np.asarray(m)
        bad = (m != 0) & (m != 1)
        return m[bad].flat[0].item() if bad.any() else None

    @staticmethod
    def as_mask(m):
        return np.asarray(m).astype(bool)

    @staticmethod
    def all_valid(like):
        return np.ones(np.shape(like), dtype=bool)

    @staticmethod
    def rows_with_tokens(m):
        return m.any(axis=-1)

    @staticmethod
    def count(m) -> int:
        return int(m.sum())

    @staticmethod
    def first_nonfinite(x, valid):
        bad = valid & ~np.isfinite(x)
        if not bad.any():
            return None
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return idx, x[idx]

    @staticmethod
    def all_finite(x) -> bool:
        return bool(np.all(np.isfinite(x)))


OPS = NumpyOps()


def zero_masked(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """x with every masked position set to 0, so padding (even NaN) reaches no arithmetic."""
    return np.where(valid, x, 0.0)


def as_2d(*arrays):
    """View [T] inputs as one row [1, T]; returns the arrays and whether to squeeze back."""
    squeeze = arrays[0].ndim == 1
    if squeeze:
        arrays = tuple(None if a is None else a[None, ...] for a in arrays)
    return arrays, squeeze


def capped_exp(x: np.ndarray) -> np.ndarray:
    """exp(x) saturating at the largest float instead of overflowing (see LOG_FLOAT_MAX)."""
    return np.exp(np.minimum(x, LOG_FLOAT_MAX))

