"""Calling the audited function: under a deadline, with the inputs it accepts, on cases padded
the way trainers pad them."""
import inspect
import threading
from typing import Callable

import numpy as np
import torch

from ..check import cases as cases_mod

TIMEOUT = 60.0                   # seconds per call of the audited function (cases are small)
STRUCTURAL = ("group_size", "group_ids", "valid")
GLOBAL_KW = ("n_tokens_global", "n_sequences_global")


class AuditTimeout(BaseException):
    """The audited function did not return within the deadline. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` reporting a user error swallows it: the
    audit must stop, not wait again on every remaining case."""


def call_with_deadline(fn, kwargs, timeout):
    """fn(**kwargs) in a worker thread (carrying torch's thread-local grad mode); raise
    AuditTimeout if it has not returned after `timeout` seconds (None: wait forever)."""
    if timeout is None:
        return fn(**kwargs)
    result = {}
    grad_mode = torch.is_grad_enabled()

    def work():
        try:
            with torch.set_grad_enabled(grad_mode):
                result["value"] = fn(**kwargs)
        except BaseException as exc:          # re-raised in the caller's thread below
            result["error"] = exc

    worker = threading.Thread(target=work, name="crosscheck-audit-call", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise AuditTimeout(f"your function did not return within {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def accepts(fn, optional) -> Callable[[str], bool]:
    """Which keywords the adapter takes. **kwargs takes the reference's required data, but an
    optional one (`optional`: valid rows, dones, last_value, group ids, global counts) must be
    named: a function that swallows `valid=` unread would otherwise be blamed for ignoring it."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return lambda name: True
    named = set(sig.parameters)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    optional = set(optional) | set(GLOBAL_KW)
    return lambda name: name in named or (var_kw and name not in optional)


def finite_padding(case, value=0.0):
    """The case with every masked / invalid entry replaced by a finite value (trainers pad so)."""
    arrays = dict(case.arrays)
    m = arrays.get("mask")
    for k, v in arrays.items():
        if v is None or not isinstance(v, np.ndarray) or v.dtype.kind != "f":
            continue
        if m is not None and v.shape == m.shape:
            arrays[k] = np.where(m, v, value)
        elif m is not None and v.ndim == 1 and v.shape[0] == m.shape[0] and m.ndim == 2:
            arrays[k] = np.where(m.any(axis=1), v, value)
        if arrays.get("valid") is not None and v.shape == arrays["valid"].shape:
            arrays[k] = np.where(arrays["valid"], arrays[k], value)
    return cases_mod.Case(case.label, arrays, case.params, case.stages, case.fd_step)


def as_trainer_batch(case):
    """The case as a trainer holds it: only structural params (the audit brings the conventions),
    and a single [T] trajectory becomes [1, T] (trainers hold batches)."""
    structural = {k: v for k, v in case.params.items() if k in STRUCTURAL}
    arrays = dict(case.arrays)
    m = arrays.get("mask")
    if m is not None and m.ndim == 1:
        arrays = {k: (v[None] if isinstance(v, np.ndarray) and v.shape == m.shape else
                      (v.reshape(1) if isinstance(v, np.ndarray) and v.ndim == 0 else v))
                  for k, v in arrays.items()}
    return cases_mod.Case(case.label, arrays, structural, case.stages, case.fd_step)


def reference_args(data):
    """The data as the reference takes it: the adapter may be given both group_size and the
    equivalent group_ids; the reference takes exactly one, so group_size wins."""
    out = dict(data)
    if "group_size" in out:
        out.pop("group_ids", None)
    return out
