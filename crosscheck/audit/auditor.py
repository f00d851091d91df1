"""The checks of one case: run the user's function and the reference on the same data, and
compare outputs, gradients and what padding does."""
from typing import List

import numpy as np
import torch

from .. import bridge
from ..check import cases as cases_mod
from .calls import STRUCTURAL, TIMEOUT, accepts, call_with_deadline, reference_args
from .model import Outcome


class Auditor:
    """One audit's fixed parts: the user's function, the registry entry, the reference
    conventions (`params`), the backend, the tolerance, the micro-batch accumulation and the
    per-call deadline."""

    def __init__(self, fn, entry, params, backend, tol, accumulation, timeout=TIMEOUT):
        self.fn, self.entry, self.params = fn, entry, params
        self.backend, self.tol = backend, tol
        self.accumulation, self.timeout = accumulation, timeout
        self.accepts = accepts(fn, STRUCTURAL + entry.data_keywords)

    def invoke(self, **kwargs):
        """The one place the audited function is called."""
        return call_with_deadline(self.fn, kwargs, self.timeout)

    # -------------------------------------------------------------- calling
    def inputs_for(self, case):
        """The data inputs to pass, or (None, reason) when the adapter cannot take this case."""
        data = {}
        keys = list(case.arrays) + [k for k in STRUCTURAL if k in case.params]
        for k in keys:
            v = case.arrays.get(k, case.params.get(k))
            if v is None:
                continue
            if not self.accepts(k):
                if k == "group_size" and self.accepts("group_ids"):
                    continue
                return None, f"your function does not accept {k}="
            data[k] = v
        if "group_size" in case.params and self.accepts("group_ids") and "group_ids" not in data:
            B = case.arrays["rewards"].shape[0]
            data["group_ids"] = np.arange(B) // case.params["group_size"]
        return data, ""

    def reference(self, data):
        return self.entry.numpy_fn(**reference_args(data), **self.params)

    def reference_vjp(self, data, g):
        return self.entry.numpy_vjp(g, **reference_args(data), **self.params)

    def call(self, data, grad_wrt=(), extra=None):
        """Run the user's function on `data` (tensors for the torch backend, the inputs in
        `grad_wrt` as leaves); returns (its raw output, the leaves by name)."""
        if self.backend == "torch":
            kwargs = bridge.to_torch(data, requires_grad=grad_wrt)
            leaves = {k: kwargs[k] for k in grad_wrt if k in kwargs}
        else:
            kwargs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in data.items()}
            leaves = {}
        for k, v in (extra or {}).items():
            if self.accepts(k):
                kwargs[k] = v
        return self.invoke(**kwargs), leaves

    @staticmethod
    def to_numpy(raw):
        return [bridge.to_numpy(o) for o in (raw if isinstance(raw, tuple) else (raw,))]

    # -------------------------------------------------------------- comparisons
    @staticmethod
    def valid_of(data, shape):
        m = data.get("mask")
        if m is not None and tuple(m.shape) == tuple(shape):
            return m.astype(bool)
        v = data.get("valid")
        if v is not None and tuple(v.shape) == tuple(shape):
            return v.astype(bool)
        return np.ones(shape, dtype=bool)

    def mismatch(self, yours, ref, valid):
        """The first valid index where `yours` and `ref` differ beyond the audit's tolerance
        (the closeness rule of crosscheck.bridge), or None."""
        return bridge.first_mismatch(yours, ref, self.tol, valid)

    # -------------------------------------------------------------- the checks of one case
    def run_case(self, case) -> List[Outcome]:
        data, why = self.inputs_for(case)
        if data is None:
            return [Outcome("skip", True, why)]
        try:
            ref_out = self.reference(data)
        except ValueError as exc:           # e.g. eps = 0 on an all-equal group: 0/0
            return [Outcome("skip", True, f"the reference is undefined there ({exc})")]
        refs = [np.asarray(r, dtype=np.float64) for r in (ref_out if isinstance(ref_out, tuple)
                                                           else (ref_out,))]
        diff_inputs = [d for d in self.entry.diff if d in data]
        want_grad = self.backend == "torch" and self.entry.numpy_vjp is not None and diff_inputs
        try:
            raw, leaves = self.call(data, grad_wrt=diff_inputs if want_grad else ())
            yours = self.to_numpy(raw)
        except Exception as exc:  # the user's code: report, never crash
            return [Outcome("raises", False, f"{type(exc).__name__}: {exc}")]
        out = [Outcome("raises", True)]
        if len(yours) != len(refs) or any(y.shape != r.shape for y, r in zip(yours, refs)):
            got = [tuple(y.shape) for y in yours]
            exp = [tuple(r.shape) for r in refs]
            return out + [Outcome("shape", False, f"returns shape {got[0] if len(got) == 1 else got}"
                                  f", expected {exp[0] if len(exp) == 1 else exp}")]
        out.append(Outcome("shape", True))
        finite_ok, value_ok = True, True
        for k, (y, r) in enumerate(zip(yours, refs)):
            valid = self.valid_of(data, r.shape)
            bad = valid & np.isfinite(r) & ~np.isfinite(y)
            if bad.any():
                i = tuple(int(j) for j in np.argwhere(bad)[0])
                finite_ok = False
                out.append(Outcome("finite", False, f"output{_at(k, i)} is {y[i]} where the "
                                                    f"reference is {r[i]:.6g}"))
                continue
            i = self.mismatch(y, r, valid)
            if i is not None:
                value_ok = False
                out.append(Outcome("value", False, f"output{_at(k, i)}: yours {y[i]:.10g}, "
                                                   f"reference {r[i]:.10g}"))
        if finite_ok:
            out.append(Outcome("finite", True))
        if value_ok and finite_ok:
            out.append(Outcome("value", True))
        if want_grad:
            out.extend(self.grad_check(data, raw, leaves, refs))
        out.extend(self.mask_check(data, yours))
        return out

    def grad_check(self, data, raw, leaves, refs):
        rng = cases_mod.rng_for(0, "audit-grad", int(sum(r.size for r in refs)))
        gs = [rng.normal(size=r.shape) if r.ndim else float(rng.normal()) for r in refs]
        for g, r in zip(gs, refs):
            if r.ndim:
                g *= self.valid_of(data, r.shape)
        g_ref = tuple(gs) if len(gs) > 1 else gs[0]
        hand = self.reference_vjp(data, g_ref)
        outs = raw if isinstance(raw, tuple) else (raw,)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            return [Outcome("grad", False, "backend='torch' but your function returned no tensor")]
        names = list(leaves)
        grads = bridge.backprop(outs, gs, [leaves[n] for n in names])
        results = []
        for n, gr in zip(names, grads):
            auto = np.zeros(data[n].shape) if gr is None else gr
            valid = self.valid_of(data, auto.shape)
            if gr is None:
                if self.mismatch(auto, hand[n], valid) is None:   # the reference gradient is 0 too
                    results.append(Outcome("grad", True))
                else:
                    results.append(Outcome("grad", False, f"your output does not depend on {n} "
                                                          f"(detached, or computed without grad)",
                                           yours=auto, reference=hand[n]))
                continue
            leak = ~valid & (auto != 0)
            if leak.any():
                i = tuple(int(j) for j in np.argwhere(leak)[0])
                results.append(Outcome("grad", False, f"gradient wrt {n} reaches padding: "
                                                      f"{auto[i]:.6g} at masked {i}"))
                continue
            i = self.mismatch(auto, hand[n], valid)
            if i is not None:
                results.append(Outcome("grad", False, f"d/d{n}{list(i)}: yours {auto[i]:.10g}, "
                                                      f"reference {hand[n][i]:.10g}",
                                       yours=auto, reference=hand[n]))
            else:
                results.append(Outcome("grad", True))
        return results

    def mask_check(self, data, yours):
        m = data.get("mask")
        if m is None or m.all():
            return []
        out = []
        for fill, label in ((1e4, "1e4"), (-1e4, "-1e4"), (np.nan, "NaN")):
            garbage = {k: (np.where(m, v, fill) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                           and v.shape == m.shape else v) for k, v in data.items()}
            try:
                other = self.to_numpy(self.call(garbage)[0])
            except Exception as exc:
                if label == "NaN":
                    out.append(Outcome("mask", True, warn=True,
                                       message=f"NaN at masked positions makes your function "
                                               f"raise {type(exc).__name__}"))
                    continue
                out.append(Outcome("mask", False, f"{label} at masked positions makes your "
                                                  f"function raise {type(exc).__name__}: {exc}"))
                continue
            changed = None
            for k, (a, b) in enumerate(zip(yours, other)):
                i = self.mismatch(b, a, self.valid_of(data, a.shape))
                if i is not None:
                    changed = f"output{_at(k, i)} {a[i]:.6g} → {b[i]:.6g}"
                    break
            if changed and label == "NaN":
                out.append(Outcome("mask", True, warn=True,
                                   message=f"NaN at masked positions leaks into valid outputs "
                                           f"({changed}); most trainers pad with finite values"))
            elif changed:
                out.append(Outcome("mask", False, f"{label} at masked positions changes a valid "
                                                  f"output: {changed}"))
            else:
                out.append(Outcome("mask", True))
        return out


def _at(k, i):
    return (f"[{k}]" if k else "") + (str(list(i)) if i else "")
