"""torch side of input handling: how ref_torch answers the contract parsers' questions about its
tensors (`OPS`), and the small helpers its formulas share.

`ref_torch` computes in the dtype and on the device of its inputs; all float inputs of one call
must share them.
"""
import functools
import math

import torch

from ref_common.checks import Spec


@functools.lru_cache(maxsize=None)
def log_float_max(dtype: torch.dtype) -> float:
    """Largest exp() argument, representable in `dtype`, whose exp stays finite there.

    log(max) rounded to nearest can round *up* (float32: 88.7228394 → exp = inf), so step down
    by one resolution unit until exp is finite: 709.78 in float64, 88.72 in float32, 11.08 in
    float16, 88.5 in bfloat16.
    """
    c = torch.tensor(math.log(torch.finfo(dtype).max), dtype=dtype)
    while not bool(torch.isfinite(torch.exp(c))):
        c = (c.double() - c.double().abs() * torch.finfo(dtype).eps).to(dtype)
    return float(c)


def _kind(x: torch.Tensor) -> str:
    if x.dtype == torch.bool:
        return "bool"
    if x.is_complex():
        return "complex"
    return "float" if x.is_floating_point() else "int"


class TorchOps:
    """ref_common.args.Ops for torch: tensors stay as they are (dtype, device, autograd)."""

    uniform = True          # float inputs of one call share one dtype and one device

    @staticmethod
    def spec(name, x) -> Spec:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} is a {type(x).__name__}; ref_torch expects a torch.Tensor")
        if x.is_meta:                   # no values: masks, counts and finiteness cannot be read
            raise ValueError(f"{name} is on the meta device; ref_torch computes values and "
                             f"validates them, so it expects a tensor with data (cpu, cuda)")
        return Spec(name, tuple(x.shape), _kind(x), str(x.dtype).replace("torch.", ""),
                    str(x.device))

    @staticmethod
    def floats(x):
        return x

    @staticmethod
    def bad_mask_value(m):
        if m.dtype == torch.bool:
            return None
        bad = (m != 0) & (m != 1)
        return m[bad][0].item() if bool(bad.any()) else None

    @staticmethod
    def as_mask(m):
        return m if m.dtype == torch.bool else m != 0

    @staticmethod
    def all_valid(like):
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)

    @staticmethod
    def rows_with_tokens(m):
        return m.any(dim=-1)

    @staticmethod
    def count(m) -> int:
        return int(m.sum())

    @staticmethod
    def first_nonfinite(x, valid):
        bad = valid & ~torch.isfinite(x)
        if not bool(bad.any()):
            return None
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        return idx, x[idx].item()

    @staticmethod
    def all_finite(x) -> bool:
        return bool(torch.isfinite(x).all())


OPS = TorchOps()


def zero(like: torch.Tensor) -> torch.Tensor:
    """A 0-d zero of `like`'s dtype and device (for torch.where)."""
    return torch.zeros((), dtype=like.dtype, device=like.device)


def safe_sqrt(v: torch.Tensor) -> torch.Tensor:
    """sqrt with gradient 0 (not NaN) at v = 0: a zero spread has no direction to move in."""
    pos = v > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, v, torch.ones_like(v))),
                       torch.zeros_like(v))


def binary_exponent(x: torch.Tensor) -> int:
    """e with max|x| < 2^e ≤ 2·max|x| (0 for all-zero x): dividing by 2^e is exact and leaves
    every |x| below 1. Not differentiated: the functions that use it are invariant to it."""
    peak = float(x.detach().abs().max()) if x.numel() else 0.0
    return math.frexp(peak)[1]


def times_power_of_two(x: torch.Tensor, e) -> torch.Tensor:
    """x·2^e, exact wherever the result is a normal number: two factors of at most 2^±538,
    since 2^e itself is not a float64 for |e| > 1023 (e.g. data near the smallest subnormal).
    e: an int, or an integer tensor of x's shape."""
    if isinstance(e, torch.Tensor):       # one exponent per element
        half = torch.div(e, 2, rounding_mode="floor")
        return (x * torch.exp2(half.to(torch.float64)).to(x.dtype)
                * torch.exp2((e - half).to(torch.float64)).to(x.dtype))
    half = e // 2
    return x * math.ldexp(1.0, half) * math.ldexp(1.0, e - half)


def ldexp_or_inf(v: float, e: int) -> float:
    """v·2^e as a Python float, inf where it overflows (math.ldexp raises there)."""
    try:
        return math.ldexp(v, e)
    except OverflowError:
        return math.inf
