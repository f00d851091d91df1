"""Input validation shared by `ref_numpy` and `ref_torch`.

This is the only code the two twins share, and it holds no math: it is plain Python (no NumPy,
no torch). Each twin describes its arrays as `Spec(name, shape, kind, dtype)` and answers the
value questions itself (are the mask entries 0/1, is a valid entry NaN); this module turns the
answers into errors that name the argument, what it got and what was expected.
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


AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
EMPTY_ROWS = ("exclude", "include")
EPS_MODES = ("var", "clamp", "std")
GROUP_SCALES = ("group", "batch", "leave_one_out", "none")
GROUP_BASELINES = ("mean", "leave_one_out")
KL_KINDS = ("k1", "k2", "k3", "abs")
CISPO_BOUNDS = ("absolute", "relative")
POLICY_LOSSES = ("ppo", "cispo", "gspo")
GSPO_FORMS = ("token", "sequence")
CLIP_FRACTIONS = ("loss", "sign", "ratio")


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


def require_advantages(adv: Spec, logp: Spec) -> bool:
    """Advantages are per token (logp's shape) or per sequence ([B] for a [B, T] logp).

    Returns True when they are per sequence. Nothing else is accepted: a [B, 1] column or a
    [T] vector against [B, T] would broadcast silently elsewhere.
    """
    require_float(adv)
    if tuple(adv.shape) == tuple(logp.shape):
        return False
    if len(logp.shape) == 2 and tuple(adv.shape) == (logp.shape[0],):
        return True
    per_seq = f" or one per sequence [B] = ({logp.shape[0]},)" if len(logp.shape) == 2 else ""
    raise ValueError(
        f"{adv.name} has shape {tuple(adv.shape)} but {logp.name} has {tuple(logp.shape)}; "
        f"expected per token {tuple(logp.shape)}{per_seq}"
    )


def finite_at_valid(name: str, index, value) -> None:
    """Raise for a NaN/inf found at a valid (mask = 1) position; `index` None means none found."""
    if index is not None:
        raise ValueError(
            f"{name} is {value} at valid position {tuple(index)}; "
            f"only masked positions (mask = 0) may hold NaN or inf"
        )


def same_dtype_device(ref_name: str, ref_dtype: str, ref_device: str, name: str, dtype: str,
                      device: str) -> None:
    if dtype != ref_dtype:
        raise TypeError(f"{name} has dtype {dtype} but {ref_name} has {ref_dtype}; all float "
                        f"inputs must share one dtype")
    if device != ref_device:
        raise ValueError(f"{name} is on {device} but {ref_name} is on {ref_device}")


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


def ddof(v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v not in (0, 1):
        raise ValueError(f"ddof is {v!r}; expected 0 (biased, divide by N) or 1 (unbiased, N-1)")
    return int(v)


def clip_c(v):
    """Dual-clip constant: None (off) or a number > 1 (c ≤ 1 would bound the loss below -A)."""
    if v is None:
        return None
    v = number("clip_c", v)
    if v <= 1.0:
        raise ValueError(f"clip_c is {v}; the dual clip needs c > 1 (or None to disable it)")
    return v


def ratio_cap(name: str, v):
    """An absolute cap on a ratio: None (off) or a number > 1."""
    if v is None:
        return None
    v = number(name, v)
    if v <= 1.0:
        raise ValueError(f"{name} is {v}; an absolute ratio cap must exceed 1 (or be None)")
    return v


def delta_above_clip(delta, hi: float) -> None:
    if delta is not None and delta < hi:
        raise ValueError(f"delta is {delta} but the upper clip edge 1 + clip_high is {hi}; "
                         f"TRL's cap must be at least the clip edge (it recommends δ > 1 + ε)")


def clamp_pair(name: str, v):
    """`clamp=(input_bound, output_bound)`, each None or a positive number."""
    if v is None:
        return None, None
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise ValueError(f"{name} is {v!r}; expected None or a pair (input_bound, output_bound)")
    return (positive(f"{name}[0]", v[0], allow_none=True),
            positive(f"{name}[1]", v[1], allow_none=True))


def policy_kl(kl_kind, kl_clamp):
    """policy_objective's own names for the KL term's conventions (kl_penalty calls them kind
    and clamp): a wrong value is reported under the keyword the caller used."""
    choice("kl_kind", kl_kind, KL_KINDS)
    clamp_pair("kl_clamp", kl_clamp)


def group_size(v, batch: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"group_size is {v!r}; expected a positive integer")
    if batch % v:
        raise ValueError(f"group_size is {v} but rewards has B = {batch} rows; "
                         f"group_size must divide B")
    return int(v)


def grouping(group_size_given: bool, group_ids: Optional[Spec], batch: int) -> None:
    """Exactly one of group_size / group_ids, and ids are [B] integers."""
    if group_size_given == (group_ids is not None):
        raise ValueError("group_advantages needs exactly one of group_size= or group_ids=; "
                         f"got {'both' if group_size_given else 'neither'}")
    if group_ids is not None:
        if group_ids.kind not in ("int", "bool"):
            raise TypeError(f"group_ids has dtype {group_ids.dtype}; expected integers")
        require_sequence(group_ids, batch)


# ---------------------------------------------------------------- degenerate statistics
def whiten_count(n_valid: int, ddof_: int) -> None:
    if n_valid - ddof_ <= 0:
        raise ValueError(f"mask has {n_valid} valid entries; whiten with ddof={ddof_} needs at "
                         f"least {ddof_ + 1}")


def whiten_scale(scale_is_zero: bool, n_valid: int) -> None:
    if scale_is_zero:
        raise ValueError(f"x has zero variance over its {n_valid} valid entries and eps=0: "
                         f"whitening would divide by zero")


def loo_scale(scale: str, baseline: str) -> None:
    if scale == "leave_one_out" and baseline != "leave_one_out":
        raise ValueError(f"scale is 'leave_one_out' but baseline is {baseline!r}; the others' "
                         f"std goes with the others' mean (baseline='leave_one_out', as NeMo)")


def group_spread(row) -> None:
    """`row` is the first row whose group has zero spread while eps = 0, or None."""
    if row is not None:
        raise ValueError(f"rewards of row {row}'s group have zero spread and eps=0: the "
                         f"advantage would be 0/0; use eps > 0 or scale='none'")


def policy_mask(mask_is_none: bool, fn: str) -> None:
    if mask_is_none:
        raise ValueError(f"mask is None; {fn} needs the [B, T] mask of valid tokens")


def kl_reference(beta: float, ref_missing: bool) -> None:
    if beta > 0 and ref_missing:
        raise ValueError(f"beta is {beta} but ref_logp is None; a KL term needs ref_logp")


def agg_norm(norm, mode: str) -> None:
    if norm is not None and mode != "seq-mean-token-sum-norm":
        raise ValueError(f"norm is {norm!r} but mode is {mode!r}; norm only applies to "
                         f"'seq-mean-token-sum-norm'")


def cispo_clip_low(clip_low, bound: str) -> None:
    if bound == "absolute" and clip_low is not None:
        raise ValueError(f"clip_low is {clip_low!r}, but bound='absolute' has no lower bound; "
                         f"use bound='relative' or leave clip_low=None")


def boolean(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} is {v!r}; expected True or False")
    return v


def last_value(shape, batch_shape, finite: bool) -> None:
    if tuple(shape) != tuple(batch_shape):
        raise ValueError(f"last_value has shape {tuple(shape)}; expected one value per sequence "
                         f"{tuple(batch_shape)}")
    if not finite:
        raise ValueError("last_value holds NaN or inf; it bootstraps every row and must be finite")


def require_logits(s: Spec, like: Optional[Spec] = None) -> None:
    """One categorical policy's logits [V], V ≥ 2 (and the shape of `like` when given)."""
    require_float(s)
    if len(s.shape) != 1 or s.shape[0] < 2:
        raise ValueError(f"{s.name} has shape {tuple(s.shape)}; expected one categorical "
                         f"policy's logits [V] with V ≥ 2")
    if like is not None and tuple(s.shape) != tuple(like.shape):
        raise ValueError(f"{s.name} has shape {tuple(s.shape)} but {like.name} has "
                         f"{tuple(like.shape)}; both are [V]")
