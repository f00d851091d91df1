"""Generic validators: each turns one bad argument into an error that names it, says what it got
and what was expected.

Arrays are described by `Spec(name, shape, kind, dtype, device)`; the twins build Specs of their
own arrays, so this module never touches NumPy or torch. One-equation preconditions live beside
their equation in `args`.
"""
import math
import numbers
from typing import NamedTuple, Optional, Tuple


class Spec(NamedTuple):
    """What the validators need to know of one array argument."""

    name: str
    shape: Tuple[int, ...]
    kind: str  # "float" | "int" | "bool" | "complex" | "other"
    dtype: str
    device: str = "cpu"


# ---------------------------------------------------------------- arrays
def require_float(s: Spec) -> None:
    if s.kind != "float":
        raise TypeError(f"{s.name} has dtype {s.dtype}; expected a floating-point array")


def require_token(s: Spec) -> None:
    """A token array: [B, T], or [T] for a single sequence."""
    require_float(s)
    if len(s.shape) not in (1, 2):
        raise ValueError(f"{s.name} has shape {tuple(s.shape)}; expected [B, T] (or [T])")


def require_sequence(s: Spec, length: Optional[int] = None) -> None:
    """A per-sequence array [B]."""
    if len(s.shape) != 1:
        raise ValueError(f"{s.name} has shape {tuple(s.shape)}; expected one value per sequence [B]")
    if length is not None and s.shape[0] != length:
        raise ValueError(f"{s.name} has shape {tuple(s.shape)}; expected [B] = ({length},)")


def same_shape(ref: Spec, other: Spec) -> None:
    if tuple(other.shape) != tuple(ref.shape):
        raise ValueError(
            f"{other.name} has shape {tuple(other.shape)} but {ref.name} has {tuple(ref.shape)}; "
            f"both must be [B, T]"
        )


def require_mask(mask: Spec, ref: Spec) -> None:
    if mask.kind not in ("bool", "int", "float"):
        raise TypeError(f"{mask.name} has dtype {mask.dtype}; expected bool or 0/1 numbers")
    same_shape(ref, mask)


def mask_values(name: str, ok: bool, bad_value=None) -> None:
    if not ok:
        raise ValueError(f"{name} holds {bad_value!r}; expected only 0/1 (or False/True)")


def same_dtype(ref: Spec, other: Spec) -> None:
    if other.dtype != ref.dtype:
        raise TypeError(f"{other.name} has dtype {other.dtype} but {ref.name} has {ref.dtype}; "
                        f"all float inputs must share one dtype")


def same_device(ref: Spec, other: Spec) -> None:
    if other.device != ref.device:
        raise ValueError(f"{other.name} is on {other.device} but {ref.name} is on {ref.device}")


def finite_at_valid(name: str, index, value) -> None:
    """Raise for a NaN/inf found at a valid (mask = 1) position; `index` None means none found."""
    if index is not None:
        raise ValueError(
            f"{name} is {value} at valid position {tuple(index)}; "
            f"only masked positions (mask = 0) may hold NaN or inf"
        )


# ---------------------------------------------------------------- hyper-parameters
def number(name: str, v, *, allow_none: bool = False, allow_inf: bool = False):
    """A real number (bool is not one). Returns it as float, or None when allowed."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} is {v!r} of type {type(v).__name__}; expected a real number")
    v = float(v)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} is {v}; expected a finite number")
    return v


def in_range(name: str, v, lo: float, hi: float, *, lo_open=False, hi_open=False,
             allow_none=False, allow_inf=False):
    v = number(name, v, allow_none=allow_none, allow_inf=allow_inf)
    if v is None:
        return None
    bad = (v < lo or (lo_open and v == lo)) or (v > hi or (hi_open and v == hi))
    if bad:
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"{name} is {v}; expected a value in {lb}{lo}, {hi}{rb}")
    return v


def non_negative(name: str, v, *, allow_none=False, allow_inf=False):
    return in_range(name, v, 0.0, math.inf, allow_none=allow_none, allow_inf=allow_inf)


def positive(name: str, v, *, allow_none=False, allow_inf=False):
    return in_range(name, v, 0.0, math.inf, lo_open=True, allow_none=allow_none,
                    allow_inf=allow_inf)


def choice(name: str, v, options) -> str:
    if v not in options:
        raise ValueError(f"{name} is {v!r}; expected one of {', '.join(repr(o) for o in options)}")
    return v


def boolean(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} is {v!r}; expected True or False")
    return v


def ddof(v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v not in (0, 1):
        raise ValueError(f"ddof is {v!r}; expected 0 (biased, divide by N) or 1 (unbiased, N-1)")
    return int(v)


def clamp_pair(name: str, v):
    """`(input_bound, output_bound)`, each None or a positive number; None means (None, None)."""
    if v is None:
        return None, None
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise ValueError(f"{name} is {v!r}; expected None or a pair (input_bound, output_bound)")
    return (positive(f"{name}[0]", v[0], allow_none=True),
            positive(f"{name}[1]", v[1], allow_none=True))


def ratio_cap(name: str, v):
    """An absolute cap on a ratio: None (off) or a number > 1."""
    if v is None:
        return None
    v = number(name, v)
    if v <= 1.0:
        raise ValueError(f"{name} is {v}; an absolute ratio cap must exceed 1 (or be None)")
    return v
