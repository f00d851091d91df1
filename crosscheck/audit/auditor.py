"""The checks of one case: run the user's function and the reference on the same data, and
compare outputs, gradients and what padding does."""
import numbers
from typing import Dict, List

import numpy as np
import torch

from .. import bridge, tolerances
from ..check import cases as cases_mod
from .calls import (GLOBAL_KW, STRUCTURAL, TIMEOUT, Adapter, InputMutated, call_with_deadline,
                    degenerate, GARBAGE, IN_DOMAIN, exception_text, fill_padding,
                    mutated, mutation_message, neutral, reference_args, snapshot, where_raised,
                    raised_in_ours)
from .model import AuditUsageError, Outcome

# what a trainer's non-differentiable output is, for the report
NOT_DIFFERENTIATED = "trainers do not differentiate through this function: a warning only"
GARBAGE_CASES = 8      # padded cases the robustness check runs on (a note, never a verdict)
NO_GRADIENT = ("not checked: your output carries no gradient, as trainers compute it (this "
               "reference is not differentiated by trainers)")


def _ratio_beyond_float32(data, names) -> bool:
    """Whether a valid log-ratio between two log-prob inputs (`names`: the registry entry's)
    exceeds log(float32 max) = 88.7: exp of it, the importance ratio every loss forms,
    overflows in float32."""
    lps = [np.asarray(data[k], dtype=np.float64) for k in names
           if isinstance(data.get(k), np.ndarray)]
    if len(lps) < 2:
        return False
    m = data.get("mask")
    valid = np.ones(lps[0].shape, bool) if m is None or np.shape(m) != lps[0].shape else \
        np.asarray(m, dtype=bool)
    top = float(np.log(np.finfo(np.float32).max))
    return any(bool((np.abs(a - b)[valid] > top).any()) for i, a in enumerate(lps)
               for b in lps[i + 1:] if a.shape == b.shape)


def _beyond_float32(x, valid) -> bool:
    """Whether a reference value or gradient at a valid position lies beyond float32's range:
    the edge of the float range, where trainers' float32 code overflows by construction."""
    x = np.asarray(x, dtype=np.float64)
    at = np.abs(x[np.broadcast_to(valid, x.shape)]) if x.ndim else np.abs(x.reshape(1))
    at = at[np.isfinite(at)]
    return bool(at.size) and float(at.max()) > float(np.finfo(np.float32).max)


def _dtype_name(x):
    """'float32', 'int64', 'complex128', ... for an array or tensor (or a Python number or a
    list of them), None for anything else."""
    if isinstance(x, torch.Tensor):
        return str(x.dtype).replace("torch.", "")
    if isinstance(x, (np.ndarray, np.generic)):
        return str(x.dtype)
    if isinstance(x, complex) or (isinstance(x, (list, tuple)) and any(
            isinstance(v, complex) for v in np.ravel(np.asarray(x, dtype=object)))):
        return "complex128"
    return None


def _shown(x) -> str:
    """'an int (3)', 'a str ('0.5')': what a function returned, for a message."""
    name = type(x).__name__
    text = repr(x)
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name} ({text[:40]}" + \
        ("…)" if len(text) > 40 else ")")


class BadReturn(TypeError):
    """What the function returned is not what the reference returns (None, a dict without a
    key): a failure of the `shape` check, not an exception of the user's code."""


class Auditor:
    """One audit's fixed parts: the user's function (through its Adapter), the registry entry,
    the reference conventions (`params`), the backend, the tolerance (None: chosen from the
    precision of the function's first output), the micro-batch accumulation (and whether it
    was assumed), the declared use of a KL term, and the per-call deadline."""

    def __init__(self, adapter: Adapter, entry, params, backend, tol, accumulation,
                 timeout=TIMEOUT, precision=None, kl_use="loss", accumulation_assumed=False,
                 variant=None):
        self.adapter, self.entry, self.params = adapter, entry, params
        self.backend, self.tol, self.precision = backend, tol, precision
        self.accumulation, self.timeout, self.kl_use = accumulation, timeout, kl_use
        self.accumulation_assumed = accumulation_assumed   # neither declared nor a profile's
        self.tolerance_why = ""
        self.tolerance_warning = None           # a given tolerance too wide to mean anything
        self.variant = dict(variant or {})      # a documented variant of the reference (cards)
        self.garbage_runs = 0                   # cases the robustness check has run on
        self.padding_checks = True              # False: the function never sees padding
        # the outputs compared: the entry's, less the optional ones the function leaves out
        self.keys = tuple(k for k in entry.outputs if k not in entry.optional_outputs)

    def accepts(self, name):
        return self.adapter.accepts(name)

    def invoke(self, **kwargs):
        """The one place the audited function is called (under the function's own names)."""
        return call_with_deadline(self.adapter.fn, self.adapter.call_kwargs(kwargs), self.timeout)

    # -------------------------------------------------------------- calling
    def inputs_for(self, case):
        """The data inputs to pass, or (None, reason) when the adapter cannot take this case."""
        data = {}
        keys = list(case.arrays) + [k for k in STRUCTURAL if k in case.params]
        unused = self.entry.unused(self.params) if self.entry.unused else ()
        for k in keys:
            v = case.arrays.get(k, case.params.get(k))
            if v is None:
                continue
            if not self.accepts(k):
                if k in unused:             # kept for the reference; call() never passes it
                    data[k] = v
                    continue
                if k == "group_size" and self.accepts("group_ids"):
                    continue
                return None, f"your function does not accept {k}="
            data[k] = v
        if "group_size" in case.params and self.accepts("group_ids") and "group_ids" not in data:
            # rows of the case's first array (rewards, or the per-token loss): the grouped rows
            B = np.shape(next(v for v in case.arrays.values() if v is not None))[0]
            data["group_ids"] = np.arange(B) // case.params["group_size"]
        for k in self.entry.data_keywords:          # required but absent here: its neutral value
            if k not in data and self.adapter.requires(k):
                v = neutral(k, data)
                if v is not None:
                    data[k] = v
        missing = [k for k in self.adapter.inputs if self.adapter.requires(k) and k not in data
                   and k not in GLOBAL_KW]
        if missing:
            return None, (f"your function requires "
                          f"{', '.join(self.adapter.own(k) + '=' for k in missing)} and this "
                          f"case has no {', '.join(missing)}")
        unmet = self.adapter.unmet()
        if unmet:
            return None, (f"your function requires {', '.join(n + '=' for n in unmet)}, which the "
                          f"reference does not pass")
        return data, ""

    def global_counts(self, data) -> Dict[str, int]:
        m = data.get("mask")
        if m is None:
            return {}
        m = np.asarray(m, dtype=bool)
        return dict(n_tokens_global=int(m.sum()),
                    n_sequences_global=int(m.any(axis=-1).sum()) if m.ndim == 2 else int(m.any()))

    def reference_data(self, data):
        """The data as the reference is given it: a variant's transform of its inputs (a
        trainer's documented convention expressed on the reference's inputs), else as is."""
        inputs = self.variant.get("inputs")
        return data if inputs is None else inputs(dict(data))

    def reference(self, data):
        return self.entry.numpy_fn(**reference_args(self.reference_data(data)), **self.params)

    def reference_vjp(self, data, g):
        return self.entry.numpy_vjp(g, **reference_args(self.reference_data(data)),
                                    **self.params)

    def reference_outputs(self, data) -> List[np.ndarray]:
        out = self.reference(data)
        return [np.asarray(r, dtype=np.float64) for r in
                bridge.outputs(out, self.keys if self.entry.dict_output else None)]

    def cotangent(self, gs):
        """The reference VJP's cotangent for `gs`, one per compared output (0 for an optional
        output the function does not return)."""
        if self.entry.dict_output:
            return {k: dict(zip(self.keys, gs)).get(k, 0.0) for k in self.entry.outputs}
        return tuple(gs) if len(gs) > 1 else gs[0]

    def call(self, data, grad_wrt=(), extra=None):
        """Run the user's function on `data` (tensors for the torch backend, the inputs in
        `grad_wrt` as leaves), with the global counts it names; returns (its raw output, the
        leaves by name)."""
        if self.backend == "torch":
            kwargs = bridge.to_torch(data, requires_grad=grad_wrt)
            leaves = {k: kwargs[k] for k in grad_wrt if k in kwargs}
        else:
            kwargs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in data.items()}
            leaves = {}
        kwargs = {k: v for k, v in kwargs.items() if self.accepts(k)}
        for k, v in dict(self.global_counts(data), **(extra or {})).items():
            if self.accepts(k):
                kwargs[k] = v
        before = snapshot(kwargs)
        raw = self.invoke(**kwargs)
        changes = mutated(before, kwargs)
        if changes:
            raise InputMutated(mutation_message(changes), output=raw,
                               after={k: bridge.to_numpy(kwargs[k]) for k in changes})
        return raw, leaves

    def outputs_of(self, raw) -> list:
        """The function's outputs in the reference's order (a dict by the entry's keys)."""
        if raw is None:
            raise BadReturn("your function returned None")
        if isinstance(raw, dict):
            self.keys = tuple(k for k in self.entry.outputs
                              if k not in self.entry.optional_outputs or k in raw)
            missing = [k for k in self.keys if k not in raw]
            if missing:
                raise BadReturn(f"your function returned a dict without {', '.join(missing)}")
            outs = [raw[k] for k in self.keys]
        else:
            outs = list(raw) if isinstance(raw, (tuple, list)) else [raw]
        for o in outs:
            if self.backend == "torch" and self.entry.trainer_grad and \
                    not isinstance(o, torch.Tensor):
                raise BadReturn(f"your function returned {_shown(o)}, not a torch tensor "
                                f"(backend='torch': a loss trainers differentiate must carry "
                                f"its gradient)")
            if not isinstance(o, (torch.Tensor, np.ndarray, np.generic, numbers.Real)):
                raise BadReturn(f"your function returned {_shown(o)}, not an array or a number")
            kind = _dtype_name(o)
            if kind is not None and kind.startswith("complex"):
                raise BadReturn(f"your function returned {kind}, a complex number: the audit "
                                f"compares real outputs, and would drop the imaginary part")
        return outs

    def expected(self, refs) -> str:
        """The reference's output shapes, as the report states them."""
        shapes = [tuple(r.shape) for r in refs]
        if len(shapes) == 1 and not self.entry.dict_output:
            return str(shapes[0])
        named = ", ".join(f"{k} {sh}" for k, sh in zip(self.keys, shapes))
        return f"a dict of {named}" if self.entry.dict_output else f"the pair ({named})"

    def to_numpy(self, raw):
        return [bridge.to_numpy(o) for o in self.outputs_of(raw)]

    # -------------------------------------------------------------- tolerance
    def judge(self, raw) -> None:
        """Choose the tolerance from the precision the function computes in (once): the
        declared precision, else the dtype of its outputs (float32 → the float32 row)."""
        if self.tol is not None:
            return
        dtypes = [o.dtype for o in self.outputs_of(raw) if isinstance(o, (torch.Tensor,
                                                                          np.ndarray))]
        names = {str(d).replace("torch.", "") for d in dtypes}
        if self.precision is not None:
            precision, why = self.precision, f"precision={self.precision!r} declared"
        elif names & {"float16", "bfloat16"}:
            raise AuditUsageError(f"your function returns {', '.join(sorted(names))}: the audit "
                                  f"judges float64 and float32 code; cast its outputs to "
                                  f"float32 and pass precision='float32'")
        elif "float32" in names:
            precision, why = "float32", "your function returns float32"
        elif names <= {"float64"} and names:
            precision, why = "float64", "your function returns float64"
        else:
            seen = ", ".join(sorted(names)) if names else "Python numbers"
            precision, why = "float64", f"your function returns {seen}, compared as float64"
        self.tol = tolerances.get("audit", precision)
        self.precision = precision
        self.tolerance_why = f"the {precision} row of the tolerance table: {why}"

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

    def mismatch(self, yours, ref, valid, cond=1.0):
        """The first valid index where `yours` and `ref` differ beyond the audit's tolerance
        (the closeness rule of crosscheck.bridge, widened by the condition number κ), or None."""
        return bridge.first_mismatch(yours, ref, self.tol, valid, cond)

    def loose(self, yours, ref, valid, cond=1.0) -> bool:
        """Whether a difference beyond the audit's tolerance lies within the float32 row: code
        that computes in float32 (or trains at it) could not tell them apart."""
        if self.precision == "float32":
            return False
        return bridge.first_mismatch(yours, ref, tolerances.get("audit", "float32"), valid,
                                     cond) is None

    def condition(self, data) -> list:
        """κ ≥ 1 per output where the registry declares a condition number, else 1s."""
        if self.entry.condition is None:
            return [1.0] * len(self.keys)
        args = reference_args(data)
        return self.entry.condition(args, dict(self.params, **args))

    def label(self, k, i):
        """'output[...]' for a one-output function, 'returns[...]' for gae's second output."""
        name = self.keys[k] if len(self.keys) > 1 else "output"
        return name + (str(list(i)) if i else "")

    # -------------------------------------------------------------- the checks of one case
    def raised(self, exc, data) -> Outcome:
        """A call that raised: a failure, or a warning where a trainer rightly refuses a
        degenerate batch with a clear ValueError (one valid token, a group of one)."""
        original = getattr(exc, "original", exc)
        info = dict(type=type(original).__name__, message=str(original)[:300],
                    where=where_raised(exc), degenerate=None, ours=raised_in_ours(exc))
        why = degenerate(data)
        if why and isinstance(original, (ValueError, AssertionError)):
            info["degenerate"] = why
            return Outcome("raises", True, warn=True, exception=info,
                           message=f"your function refuses degenerate batches ({why}): "
                                   f"{exception_text(exc)}")
        hint = ""
        adv, m = data.get("advantages"), data.get("mask")
        if adv is not None and np.ndim(adv) == 1 and m is not None and np.ndim(m) == 2:
            hint = (" (on per-sequence advantages [B]: if your function takes only per-token "
                    "[B, T] ones, declare domain=('per_token_advantages',), on the command "
                    "line --domain per_token_advantages)")
        return Outcome("raises", False, f"{exception_text(exc)} at {info['where']}{hint}",
                       exception=info)

    def run_case(self, case, only=None) -> List[Outcome]:
        """Every check of one case (`only`: the one check wanted, when shrinking or
        describing; the checks before it still run)."""
        data, why = self.inputs_for(case)
        if data is None:
            return [Outcome("skip", True, why)]
        try:
            refs = self.reference_outputs(data)
        except ValueError as exc:           # e.g. eps = 0 on an all-equal group: 0/0
            return [Outcome("skip", True, f"the reference is undefined there ({exc})")]
        tie = None if self.entry.ambiguous is None else self.entry.ambiguous(
            reference_args(self.reference_data(data)), self.params)
        if tie:
            return [Outcome("skip", True, tie)]
        diff_inputs = [d for d in self.entry.diff if d in data]
        want_grad = self.backend == "torch" and self.entry.numpy_vjp is not None and diff_inputs
        keys = self.keys
        try:
            raw, leaves = self.call(data, grad_wrt=diff_inputs if want_grad else ())
            yours = self.to_numpy(raw)
            self.judge(raw)
        except AuditUsageError:
            raise
        except BadReturn as exc:
            return [Outcome("raises", True), Outcome("shape", False, f"{exc}; expected "
                                                                    f"{self.expected(refs)}")]
        except InputMutated as exc:   # what it returned is not judged on a batch it altered
            try:
                self.judge(exc.output)
            except Exception:
                pass
            return [Outcome("raises", True), Outcome("inputs", False, str(exc))]
        except Exception as exc:  # the user's code: report, never crash
            return [self.raised(exc, data)]
        out = [Outcome("raises", True), Outcome("inputs", True)]
        if self.keys != keys:     # the dict returned names the optional outputs it compares
            refs = self.reference_outputs(data)
        if len(yours) != len(refs) or any(y.shape != r.shape for y, r in zip(yours, refs)):
            got = [tuple(y.shape) for y in yours]
            return out + [Outcome("shape", False, f"returns shape {got[0] if len(got) == 1 else got}"
                                                  f", expected {self.expected(refs)}")]
        out.append(Outcome("shape", True))
        finite_ok, value_ok = True, True
        kappas = self.condition(data)
        edge = any(_beyond_float32(r, self.valid_of(data, r.shape)) for r in refs) or \
            _ratio_beyond_float32(data, self.entry.logprobs)
        for k, (y, r) in enumerate(zip(yours, refs)):
            valid = self.valid_of(data, r.shape)
            bad = valid & np.isfinite(r) & ~np.isfinite(y)
            padding = ~valid & ~np.isfinite(y)
            if bad.any() or padding.any():
                i = tuple(int(j) for j in np.argwhere(bad if bad.any() else padding)[0])
                finite_ok = False
                where = (f"where the reference is {r[i]:.6g}" if bad.any() else
                         "at a masked position: masking by multiplication ((loss * mask).sum())"
                         " would turn the sum into NaN; padding may hold finite values only")
                if bad.any() and self.precision == "float32" and \
                        abs(r[i]) > np.finfo(np.float32).max:
                    where += " (beyond float32's range: float32 code overflows here)"
                out.append(Outcome("finite", False, f"{self.label(k, i)} is {y[i]} {where}",
                                   edge=edge))
                continue
            i = self.mismatch(y, r, valid, kappas[k])
            if i is not None:
                value_ok = False
                out.append(Outcome("value", False, f"{self.label(k, i)}: yours {y[i]:.10g}, "
                                                   f"reference {r[i]:.10g}",
                                   loose=self.loose(y, r, valid, kappas[k]), edge=edge))
        if finite_ok:
            out.append(Outcome("finite", True))
        if value_ok and finite_ok:
            out.append(Outcome("value", True))
        if want_grad and only in (None, "grad", "detach"):
            out.extend(self.grad_check(data, raw, leaves, refs, kappas))
        if not self.padding_checks:
            return out
        if only in (None, "mask"):
            out.extend(self.mask_check(data, yours, kappas))
        if only == "garbage" or (only is None and self.garbage_runs < GARBAGE_CASES):
            found = self.garbage_check(data, yours, kappas)
            self.garbage_runs += bool(found) and only is None
            out.extend(found)
        return out

    def plain_gradients(self, data, name):
        """(yours, the reference's) gradient wrt input `name` of the sum of the outputs over
        the valid positions: the cotangent a counterexample states, where the check itself
        draws a random one (which catches more)."""
        raw, leaves = self.call(data, grad_wrt=(name,))
        outs = self.outputs_of(raw)
        refs = self.reference_outputs(data)
        gs = [self.valid_of(data, r.shape).astype(np.float64) if r.ndim else 1.0 for r in refs]
        hand = self.reference_vjp(data, self.cotangent(gs))[name]
        (gr,) = bridge.backprop(outs, gs, [leaves[name]])
        return (np.zeros(np.shape(data[name])) if gr is None else gr,
                np.asarray(hand, dtype=np.float64))

    def grad_check(self, data, raw, leaves, refs, kappas):
        """The autograd gradient through the function against the reference VJP. For a
        function trainers compute without gradients (advantages, returns, metrics) no gradient
        is information and a different one a warning: neither changes training."""
        results = self._grad_outcomes(data, raw, leaves, refs, kappas)
        if self.entry.trainer_grad:
            return results
        return [o if o.ok else Outcome("grad", True, warn=True, yours=o.yours,
                                       reference=o.reference,
                                       message=f"{o.message} ({NOT_DIFFERENTIATED})")
                for o in results]

    def _grad_outcomes(self, data, raw, leaves, refs, kappas):
        outs = self.outputs_of(raw)
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        carries = any(o.requires_grad for o in tensors)
        if not carries and not self.entry.trainer_grad:
            return [Outcome("grad", True, info=True, message=NO_GRADIENT)]
        if len(tensors) != len(outs):
            return [Outcome("grad", False, "backend='torch' but your function returned no tensor")]
        rng = cases_mod.rng_for(0, "audit-grad", int(sum(r.size for r in refs)))
        gs = [rng.normal(size=r.shape) if r.ndim else float(rng.normal()) for r in refs]
        for g, r in zip(gs, refs):
            if r.ndim:
                g *= self.valid_of(data, r.shape)
        hand = self.reference_vjp(data, self.cotangent(gs))
        names = list(leaves)
        try:
            grads = bridge.backprop(outs, gs, [leaves[n] for n in names])
        except Exception as exc:      # autograd through the user's graph: report, never crash
            return [Outcome("grad", False, f"back-propagating through your output raised "
                                           f"{exception_text(exc)}")]
        kinks = {} if self.entry.kinks is None else self.entry.kinks(reference_args(data),
                                                                      self.params)
        kappa = max(float(np.max(k)) for k in kappas)
        results = []
        for n, gr in zip(names, grads):
            auto = np.zeros(data[n].shape) if gr is None else gr
            ref = np.asarray(hand[n], dtype=np.float64)
            valid = self.valid_of(data, auto.shape)
            kink = kinks.get(n)
            if kink is not None:            # the reference is not differentiable there
                auto, ref = np.where(kink, 0.0, auto), np.where(kink, 0.0, ref)
            if gr is None:
                if self.mismatch(auto, ref, valid, kappa) is None:   # the reference's is 0 too
                    results.append(Outcome("grad", True))
                else:
                    results.append(Outcome("grad", False, f"your output does not depend on {n} "
                                                          f"(detached, or computed without grad)",
                                           yours=auto, reference=ref))
                continue
            leak = ~valid & (auto != 0)
            if leak.any():
                i = tuple(int(j) for j in np.argwhere(leak)[0])
                results.append(Outcome("grad", False, f"gradient wrt {n} reaches padding: "
                                                      f"{auto[i]:.6g} at masked {i}"))
                continue
            i = self.mismatch(auto, ref, valid, kappa)
            if i is not None:
                results.append(Outcome("grad", False, f"d/d{n}{list(i)} (random cotangent): "
                                                      f"yours {auto[i]:.10g}, reference "
                                                      f"{ref[i]:.10g}",
                                       yours=auto, reference=ref,
                                       loose=self.loose(auto, ref, valid, kappa),
                                       # the gradient, or the outputs it comes from
                                       edge=_beyond_float32(ref, valid) or any(
                                           _beyond_float32(r, self.valid_of(data, r.shape))
                                           for r in refs) or
                                       _ratio_beyond_float32(data, self.entry.logprobs)))
            else:
                results.append(Outcome("grad", True))
        return results

    def _changed(self, data, yours, other, kappas):
        """'output[i] a → b' for the first valid output that `other` changed, or None."""
        for k, (a, b) in enumerate(zip(yours, other)):
            valid = self.valid_of(data, a.shape)
            same = bridge.within(b, a, self.tol, cond=kappas[k]) | (np.isnan(a) & np.isnan(b))
            bad = valid & ~same
            if bad.any():
                i = tuple(int(j) for j in np.argwhere(bad)[0])
                return f"{self.label(k, i)} {a[i]:.6g} → {b[i]:.6g}"
        return None

    def _masked(self, data) -> bool:
        m = data.get("mask")
        v = data.get("valid")
        return (m is not None and not np.asarray(m, dtype=bool).all()) or \
            (v is not None and not np.asarray(v, dtype=bool).all())

    def mask_check(self, data, yours, kappas):
        """Padding inside each input's domain (plausible log-probs, shared and then differing;
        finite values and logits) changes no valid output: a failure where it does."""
        if not self._masked(data):
            return []
        out = []
        # a function without log-prob inputs (gae, whiten): name the inputs padded instead
        own = None if any(k in data for k in self.entry.logprobs) else ", ".join(
            k for k, v in data.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f")
        for n, (label, logprobs, base) in enumerate(IN_DOMAIN):
            if own:
                label = f"a {('second', 'third')[n]} finite padding of {own}"
            padded = fill_padding(data, logprobs, base, names=self.entry.logprobs)
            try:
                other = self.to_numpy(self.call(padded)[0])
            except Exception as exc:
                out.append(Outcome("mask", False, f"padding with {label} makes your function "
                                                  f"raise {exception_text(exc)}", replay=padded))
                continue
            changed = self._changed(data, yours, other, kappas)
            out.append(Outcome("mask", True) if changed is None else
                       Outcome("mask", False, f"padding with {label} (in every input's domain) "
                                              f"changes a valid output: {changed}",
                               replay=padded))
        return out

    def garbage_check(self, data, yours, kappas):
        """Garbage at padding (±1e4, NaN, inf, positive log-probs), which no trainer's batch
        holds: a robustness warning where it changes a valid output or makes the function
        raise, never a failure."""
        if not self._masked(data):
            return []
        out = []
        for label, logp_fill, other_fill in GARBAGE:
            padded = fill_padding(data, logp_fill, 1.0 if other_fill is None else other_fill,
                                  other_fill, names=self.entry.logprobs)
            try:
                other = self.to_numpy(self.call(padded)[0])
            except Exception as exc:
                out.append(Outcome("garbage", True, warn=True, replay=padded,
                                   message=f"{label} at padding makes your function raise "
                                           f"{exception_text(exc)} (no trainer pads so; a "
                                           f"robustness note)"))
                continue
            changed = self._changed(data, yours, other, kappas)
            out.append(Outcome("garbage", True) if changed is None else
                       Outcome("garbage", True, warn=True, replay=padded,
                               message=f"{label} at padding leaks into a valid output "
                                       f"({changed}): masking by multiplication (inf · 0 = NaN)? "
                                       f"No trainer pads so; a robustness note"))
        return out
