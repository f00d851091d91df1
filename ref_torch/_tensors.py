"""torch side of input handling: type, shape, dtype/device and padding checks.

`ref_torch` computes in the dtype and on the device of its inputs; all float inputs of one call
must share them.
"""
import functools
import math

import torch

from ref_numpy import _checks  # the shared, math-free validation (plain Python)


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


def spec(name: str, x) -> _checks.Spec:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} is a {type(x).__name__}; ref_torch expects a torch.Tensor")
    return _checks.Spec(name, tuple(x.shape), _kind(x), str(x.dtype).replace("torch.", ""))


def token(name: str, x) -> torch.Tensor:
    _checks.require_token(spec(name, x))
    return x


def like(name: str, x, ref_name: str, ref: torch.Tensor) -> torch.Tensor:
    s = spec(name, x)
    _checks.require_float(s)
    _checks.same_shape(spec(ref_name, ref), s)
    _checks.same_dtype_device(ref_name, str(ref.dtype), str(ref.device), name, str(x.dtype),
                              str(x.device))
    return x


def mask_of(mask, ref_name: str, ref: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Boolean mask shaped like `ref`; None = all valid."""
    if mask is None:
        return torch.ones(ref.shape, dtype=torch.bool, device=ref.device)
    s = spec(name, mask)
    _checks.require_mask(s, spec(ref_name, ref))
    if mask.device != ref.device:
        raise ValueError(f"{name} is on {mask.device} but {ref_name} is on {ref.device}")
    if mask.dtype == torch.bool:
        return mask
    bad = (mask != 0) & (mask != 1)
    _checks.mask_values(name, not bool(bad.any()), mask[bad][0].item() if bad.any() else None)
    return mask != 0


def finite_at_valid(name: str, x: torch.Tensor, valid: torch.Tensor) -> None:
    bad = valid & ~torch.isfinite(x)
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        _checks.finite_at_valid(name, idx, x[idx].item())


def safe_sqrt(v: torch.Tensor) -> torch.Tensor:
    """sqrt with gradient 0 (not NaN) at v = 0: a zero spread has no direction to move in."""
    pos = v > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, v, torch.ones_like(v))),
                       torch.zeros_like(v))
