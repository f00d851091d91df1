"""Anything at masked positions (NaN, ±inf, 1e4, −1e30) changes no output and no gradient, and
gradients at masked positions are exactly 0, in both twins and in the hand VJPs."""
import inspect

import numpy as np
import pytest
import torch

from crosscheck import bridge
from crosscheck.check import cases, registry


ENTRIES = {n: e for n, e in registry.build().items()          # those that take a token mask
           if "mask" in inspect.signature(e.numpy_fn).parameters}
JUNK = [np.nan, np.inf, -np.inf, 1e4, -1e30, 0.0]


def refill(case, rng):
    """The same case with fresh garbage at every masked position of every float token input."""
    mask = case.arrays["mask"]
    arrays = {}
    for k, v in case.arrays.items():
        if v is not None and v.dtype.kind == "f" and v.shape == mask.shape:
            v = v.copy()
            v[~mask] = rng.choice(JUNK, size=int((~mask).sum()))
        arrays[k] = v
    return cases.Case(case.label, arrays, case.params, case.stages, case.fd_step)


def padded_cases(name, want=4):
    """The first `want` generated cases of `name` that hold masked positions."""
    found = []
    for i in range(64):
        case = ENTRIES[name].case(cases.rng_for(0, name, i), i)
        m = case.arrays.get("mask")
        if m is not None and not m.all():
            found.append((name, i))
        if len(found) == want:
            return found
    raise AssertionError(f"{name}: the generator made fewer than {want} padded cases")


@pytest.mark.parametrize("name, index", [p for n in ENTRIES for p in padded_cases(n)])
def test_padding_changes_nothing(name, index):
    entry = ENTRIES[name]
    case = entry.case(cases.rng_for(0, name, index), index)
    rng = np.random.default_rng(index)
    other = refill(case, rng)
    mask = case.arrays["mask"]

    def run(c):
        out_np = bridge.outputs(entry.numpy_fn(**c.arrays, **c.params))
        t = {k: (None if v is None else torch.from_numpy(v.copy())) for k, v in c.arrays.items()}
        out_t = bridge.outputs(entry.torch_fn(**t, **c.params))
        g = tuple(np.ones_like(o) if o.ndim else 1.0 for o in out_np)
        g = g if len(g) > 1 else g[0]
        return out_np, out_t, entry.numpy_vjp(g, **c.arrays, **c.params), bridge.autograd_vjp(entry.torch_fn, c.arrays, c.params, entry.diff, g)

    if entry.numpy_vjp is None:                 # a count: compare values only
        for x, y in zip(bridge.outputs(entry.numpy_fn(**case.arrays, **case.params)),
                        bridge.outputs(entry.numpy_fn(**other.arrays, **other.params))):
            np.testing.assert_array_equal(x, y, strict=True)
        return
    a, b = run(case), run(other)
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        np.testing.assert_array_equal(x, y, strict=True)
    for grads_a, grads_b in ((a[2], b[2]), (a[3], b[3])):
        for k in entry.diff:
            np.testing.assert_array_equal(grads_a[k], grads_b[k], strict=True)
            if grads_a[k].shape == mask.shape:
                assert np.all(grads_a[k][~mask] == 0)
                assert np.all(grads_b[k][~mask] == 0)
