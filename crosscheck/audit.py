"""Audit a trainer's own function against a reference: `audit(fn, ref, ...)`.

The adapter contract: `fn` receives the reference's *data* inputs by keyword (arrays such as
`logp=, old_logp=, advantages=, mask=`, and structural ones such as `group_size=` or
`group_ids=`), as torch float64 tensors (backend="torch") or NumPy arrays (backend="numpy"), and
returns what the reference returns (a [B, T] array, a [B] array, a scalar, or gae's pair). The
user binds their own hyper-parameters inside the adapter; the reference takes its conventions
from `profile` and `**conventions`. An input the adapter does not accept (by name or **kwargs)
is not passed, and the cases that need it are skipped and counted.

Checks (each case; a failure is shrunk to a minimal counterexample):
  raises, shape, finite   the function runs, returns the reference's shape, and is finite on
                          valid positions wherever the reference is
  value                   outputs equal the reference on valid positions
  grad                    (torch) autograd through fn equals the reference VJP on valid positions
                          and is 0 on padding
  detach                  a grad failure explained by a factor that must be stop-gradient
  mask                    finite garbage (±1e4) at masked positions changes nothing (a failure);
                          NaN there that leaks into valid outputs is a warning
  permutation             group advantages: shuffling rows with their ids permutes the outputs
  microbatch              the gradient accumulated over 2 and 4 micro-batches / simulated ranks
                          equals the full-batch gradient of the declared aggregation
  kl_direction            a small step on the KL term alone moves π toward the reference
A failing check names the known variant that reproduces it, when one does.

Every call of `fn` runs under a deadline (`timeout`, seconds): a function that does not return
fails the `raises` check and stops the audit. Python cannot kill a thread, so that call is
abandoned in a daemon thread (it ends with the process).
"""
import dataclasses
import inspect
import math
import threading
from typing import Callable, Dict, List, Optional

import numpy as np
import torch


from . import cases as cases_mod
from . import profiles as profiles_mod
from . import registry as registry_mod
from .report import json_safe

RTOL, ATOL = 1e-6, 1e-8          # default: conventions differ by ≥ 1e-4 relative (eps 1e-4 vs
                                  # 1e-6 on a unit std); float32 inside user code stays ≤ 1e-6
STRUCTURAL = ("group_size", "group_ids", "valid")
DATA_KEYWORDS = STRUCTURAL + ("dones", "last_value", "sample_logits")   # data, not conventions
GLOBAL_KW = ("n_tokens_global", "n_sequences_global")
SHRINK_STEPS = 60
TIMEOUT = 60.0                   # seconds per call of the audited function (cases are small)


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


class AuditUsageError(ValueError):
    """The audit was asked for something it cannot do (unknown ref, missing hyper-parameter)."""


@dataclasses.dataclass
class Finding:
    check: str
    status: str = "pass"                  # "pass" | "fail" | "warn"
    cases: int = 0
    message: str = ""
    counterexample: Optional[Dict[str, object]] = None
    diagnosis: str = ""


@dataclasses.dataclass
class AuditReport:
    ref: str
    profile: Optional[str]
    conventions: Dict[str, object]
    backend: str
    n_cases: int
    seed: int
    findings: List[Finding]
    skipped: Dict[str, int]

    @property
    def ok(self) -> bool:
        return all(f.status != "fail" for f in self.findings)

    @property
    def failures(self) -> List[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    def __str__(self) -> str:
        conv = ", ".join(f"{k}={v!r}" for k, v in self.conventions.items())
        head = (f"audit against {self.ref}" + (f" (profile {self.profile})" if self.profile else "")
                + f", backend {self.backend}, {self.n_cases} cases, seed {self.seed}\n"
                f"  reference conventions: {conv or '(defaults)'}")
        lines = [head]
        for f in self.findings:
            lines.append(f"  {f.status.upper():<4} {f.check:<13} {f.cases:>4} cases"
                         + (f"  {f.message}" if f.message else ""))
            if f.diagnosis:
                lines.append(f"       likely: {f.diagnosis}")
            if f.counterexample:
                lines.append("       minimal counterexample:")
                for k, v in f.counterexample.items():
                    lines.append(f"         {k}: {v}")
        for why, n in self.skipped.items():
            lines.append(f"  note: {n} cases skipped: {why}")
        n_fail = len(self.failures)
        lines.append("verdict: CONFORMS" if self.ok else
                     f"verdict: DOES NOT CONFORM ({n_fail} failing check{'s' * (n_fail > 1)})")
        return "\n".join(lines)

    def to_dict(self):
        return dict(ok=self.ok, ref=self.ref, profile=self.profile,
                    conventions={k: json_safe(v) for k, v in self.conventions.items()},
                    backend=self.backend, cases=self.n_cases, seed=self.seed,
                    findings=[dataclasses.asdict(f) for f in self.findings],
                    skipped=self.skipped)


# ================================================================ conventions and inputs
def resolve_conventions(ref: str, profile: Optional[str], conventions: Dict[str, object]):
    entries = registry_mod.build()
    if ref not in entries:
        raise AuditUsageError(f"ref is {ref!r}; expected one of {', '.join(entries)}")
    entry = entries[ref]
    sig = inspect.signature(entry.numpy_fn)
    kw_only = {n: p for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    params = {n: p.default for n, p in kw_only.items()
              if p.default is not p.empty and n not in DATA_KEYWORDS}
    if profile is not None:
        try:
            params.update(profiles_mod.conventions(profile, ref))
        except profiles_mod.ProfileError as exc:
            raise AuditUsageError(str(exc)) from None
    accepts_more = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for k, v in conventions.items():
        if k not in kw_only and not accepts_more:
            raise AuditUsageError(f"{k!r} is not a convention of {ref}; its keywords are "
                                  f"{', '.join(n for n in kw_only if n not in STRUCTURAL)}")
        if k in DATA_KEYWORDS:
            raise AuditUsageError(f"{k!r} is data, passed to your function by the audit's cases")
        params[k] = v
    missing = [n for n, p in kw_only.items()
               if p.default is p.empty and n not in params and n not in DATA_KEYWORDS]
    if missing:
        raise AuditUsageError(f"{ref} needs {', '.join(missing)}: pass e.g. "
                              f"{missing[0]}=... (or --set {missing[0]}=...) or a profile")
    return entry, params


def _accepts(fn) -> Callable[[str], bool]:
    """Which keywords the adapter takes. **kwargs takes the reference's required data, but an
    optional one (valid rows, dones, last_value, group ids, global counts) must be named: a
    function that swallows `valid=` unread would otherwise be blamed for ignoring it."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return lambda name: True
    named = set(sig.parameters)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    optional = set(DATA_KEYWORDS) | set(GLOBAL_KW)
    return lambda name: name in named or (var_kw and name not in optional)


def _finite_padding(case, value=0.0):
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


def reference_args(data):
    """The data as the reference takes it: the adapter may be given both group_size and the
    equivalent group_ids; the reference takes exactly one, so group_size wins."""
    out = dict(data)
    if "group_size" in out:
        out.pop("group_ids", None)
    return out


# ================================================================ one case, all checks
@dataclasses.dataclass
class Outcome:
    check: str
    ok: bool
    message: str = ""
    warn: bool = False
    yours: object = None
    reference: object = None


class Auditor:
    def __init__(self, fn, entry, params, backend, rtol, atol, accumulation, timeout=TIMEOUT):
        self.fn, self.entry, self.params = fn, entry, params
        self.backend, self.rtol, self.atol = backend, rtol, atol
        self.accumulation, self.timeout = accumulation, timeout
        self.accepts = _accepts(fn)

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
        """Run the user's function; returns (outputs as numpy list, torch leaves, raw)."""
        kwargs, leaves = {}, {}
        for k, v in data.items():
            if isinstance(v, np.ndarray) and self.backend == "torch":
                if v.dtype == bool:
                    kwargs[k] = torch.from_numpy(v.copy())
                elif v.dtype.kind in "iu":
                    kwargs[k] = torch.from_numpy(v.astype(np.int64))
                else:
                    t = torch.tensor(v, dtype=torch.float64, requires_grad=k in grad_wrt)
                    kwargs[k] = t
                    if k in grad_wrt:
                        leaves[k] = t
            else:
                kwargs[k] = v.copy() if isinstance(v, np.ndarray) else v
        for k, v in (extra or {}).items():
            if self.accepts(k):
                kwargs[k] = v
        raw = self.invoke(**kwargs)
        return raw, leaves

    @staticmethod
    def to_numpy(raw):
        seq = raw if isinstance(raw, tuple) else (raw,)
        out = []
        for o in seq:
            if isinstance(o, torch.Tensor):
                out.append(o.detach().cpu().double().numpy())
            else:
                out.append(np.asarray(o, dtype=np.float64))
        return out

    # -------------------------------------------------------------- comparisons
    def valid_of(self, data, shape):
        m = data.get("mask")
        if m is not None and tuple(m.shape) == tuple(shape):
            return m.astype(bool)
        v = data.get("valid")
        if v is not None and tuple(v.shape) == tuple(shape):
            return v.astype(bool)
        return np.ones(shape, dtype=bool)

    def close(self, yours, ref, valid):
        """|yours − ref| ≤ atol + rtol·|ref| where valid. Equal infinities match; a NaN, or an
        inf against anything else, does not (rtol·inf would otherwise allow any value)."""
        with np.errstate(invalid="ignore"):
            diff = np.where(valid & (yours != ref), np.abs(yours - ref), 0.0)
            allowed = self.atol + self.rtol * np.where(np.isfinite(ref), np.abs(ref), 0.0)
            bad = valid & ~(diff <= allowed)
        if bad.any():
            i = tuple(int(k) for k in np.argwhere(bad)[0])
            return False, i
        return True, None

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
            ok, i = self.close(y, r, valid)
            if not ok:
                value_ok = False
                out.append(Outcome("value", False, f"output{_at(k, i)}: yours {y[i]:.10g}, "
                                                   f"reference {r[i]:.10g}"))
        if finite_ok:
            out.append(Outcome("finite", True))
        if value_ok and finite_ok:
            out.append(Outcome("value", True))
        if want_grad:
            out.extend(self.grad_check(data, raw, leaves, refs))
        out.extend(self.mask_check(case, data, yours, raw))
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
        total = sum((o.double() * torch.as_tensor(g, dtype=torch.float64)).sum()
                    for o, g in zip(outs, gs))
        names = list(leaves)
        if not isinstance(total, torch.Tensor) or not total.requires_grad:
            grads = [None] * len(names)
        else:
            grads = torch.autograd.grad(total, [leaves[n] for n in names], allow_unused=True)
        results = []
        for n, gr in zip(names, grads):
            auto = np.zeros(data[n].shape) if gr is None else gr.detach().double().numpy()
            valid = self.valid_of(data, auto.shape)
            if gr is None:
                if self.close(auto, hand[n], valid)[0]:       # the reference gradient is 0 too
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
            ok, i = self.close(auto, hand[n], valid)
            if not ok:
                results.append(Outcome("grad", False, f"d/d{n}{list(i)}: yours {auto[i]:.10g}, "
                                                      f"reference {hand[n][i]:.10g}",
                                       yours=auto, reference=hand[n]))
            else:
                results.append(Outcome("grad", True))
        return results

    def mask_check(self, case, data, yours, raw):
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
                valid = self.valid_of(data, a.shape)
                with np.errstate(invalid="ignore"):
                    bad = valid & ~(np.abs(a - b) <= self.atol + self.rtol * np.abs(a))
                if bad.any():
                    i = tuple(int(j) for j in np.argwhere(bad)[0])
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


# ================================================================ property checks
def permutation_check(aud: Auditor, case, rng) -> Optional[Outcome]:
    if aud.entry.name != "group_advantages" or not aud.accepts("group_ids"):
        return None
    data, _ = aud.inputs_for(case)
    if data is None or "group_ids" not in data:
        return None
    data = {k: v for k, v in data.items() if k != "group_size"}
    try:
        base = aud.to_numpy(aud.call(data)[0])[0]
        perm = rng.permutation(base.shape[0])
        shuffled = {k: (v[perm] if isinstance(v, np.ndarray) else v) for k, v in data.items()}
        moved = aud.to_numpy(aud.call(shuffled)[0])[0]
    except Exception as exc:
        return Outcome("permutation", False, f"{type(exc).__name__}: {exc}")
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(moved - base[perm]) <= aud.atol + aud.rtol * np.abs(base[perm]))
    if bad.any():
        i = int(np.argwhere(bad)[0][0])
        return Outcome("permutation", False,
                       f"shuffling rows with their group_ids changed an advantage: row {perm[i]} "
                       f"was {base[perm[i]]:.6g}, became {moved[i]:.6g} (groups taken by position?)")
    return Outcome("permutation", True)


def microbatch_check(aud: Auditor, case) -> List[Outcome]:
    name = aud.entry.name
    if name not in ("aggregate", "policy_objective") or aud.backend != "torch":
        return []
    data, _ = aud.inputs_for(case)
    if data is None:
        return []
    wrt = "loss" if name == "aggregate" else "logp"
    B = data[wrt].shape[0]
    hand = aud.reference_vjp(data, 1.0)[wrt]
    m = data["mask"]
    out = []
    for K in (2, 4):
        if B % K or B < K:
            continue
        total = np.zeros(data[wrt].shape)
        size = B // K
        try:
            for k in range(K):
                rows = slice(k * size, (k + 1) * size)
                part = {key: (v[rows] if isinstance(v, np.ndarray) and v.shape[:1] == (B,) else v)
                        for key, v in data.items()}
                extra = dict(n_tokens_global=int(m.sum()),
                             n_sequences_global=int(m.any(axis=1).sum()))
                raw, leaves = aud.call(part, grad_wrt=(wrt,), extra=extra)
                weight = 1.0 / K if aud.accumulation == "mean" else 1.0
                (gr,) = torch.autograd.grad(raw.double() * weight, [leaves[wrt]],
                                            allow_unused=True)
                if gr is not None:
                    total[rows] = gr.detach().numpy()
        except Exception as exc:
            out.append(Outcome("microbatch", False, f"{type(exc).__name__}: {exc}"))
            continue
        ok, i = aud.close(total, hand, m.astype(bool))
        if not ok:
            ratio = total[i] / hand[i] if hand[i] else float("inf")
            out.append(Outcome("microbatch", False,
                               f"{K} micro-batches accumulated ({aud.accumulation} of micro-batch "
                               f"gradients) give d/d{wrt}{list(i)} = {total[i]:.6g}, the full "
                               f"batch {hand[i]:.6g} (×{ratio:.3g})"))
        else:
            out.append(Outcome("microbatch", True))
    return out


def kl_direction_check(aud: Auditor, rng) -> Optional[Outcome]:
    if aud.entry.name != "kl_penalty" or aud.backend != "torch":
        return None
    worst = None
    for _ in range(4):
        V = 6
        theta = torch.tensor(rng.normal(0, 0.6, V), requires_grad=True)
        ref = torch.tensor(rng.normal(0, 0.6, V))
        logp = torch.log_softmax(theta, -1)
        ref_logp = torch.log_softmax(ref, -1)
        weights = logp.exp().detach()          # every category once, weighted by π: E_π exactly
        try:
            per_token = aud.invoke(**{k: v for k, v in dict(logp=logp[None], ref_logp=ref_logp[None],
                                                        mask=torch.ones(1, V, dtype=torch.bool)
                                                        ).items() if aud.accepts(k)})
            objective = (weights * per_token[0]).sum()
            g = None                          # detached or grad-free output: no path to θ
            if objective.requires_grad:
                (g,) = torch.autograd.grad(objective, [theta], allow_unused=True)
        except Exception as exc:              # the user's code, or what it returned: report it
            return Outcome("kl_direction", False, f"{type(exc).__name__}: {exc}")
        if g is None or float(g.abs().max()) < 1e-12:
            return Outcome("kl_direction", True, warn=True,
                           message="your KL term has no expected gradient (k1 used as a loss?): "
                                   "it does not pull π toward the reference")
        with torch.no_grad():
            def sym_kl(t):
                lp = torch.log_softmax(t, -1)
                return float(((lp.exp() - ref_logp.exp()) * (lp - ref_logp)).sum())
            before, after = sym_kl(theta), sym_kl(theta - 1e-3 * g / g.norm())
        if after > before:
            worst = f"a small step on your KL term alone raises KL(π‖ref) + KL(ref‖π) " \
                    f"({before:.6g} → {after:.6g}): is its sign flipped?"
    if worst:
        return Outcome("kl_direction", False, worst)
    return Outcome("kl_direction", True)


# ================================================================ shrinking
def shrink(aud: Auditor, case, check: str):
    """Greedily drop rows and columns and round values while `check` still fails."""
    def fails(c):
        try:
            return any(o.check == check and not o.ok and not o.warn for o in aud.run_case(c))
        except Exception:
            return False

    current = case
    for _ in range(SHRINK_STEPS):
        progressed = False
        for candidate in _smaller(current):
            if fails(candidate):
                current, progressed = candidate, True
                break
        if not progressed:
            break
    return current


def _smaller(case):
    arrays, params = case.arrays, case.params
    tok = [k for k, v in arrays.items() if isinstance(v, np.ndarray) and v.ndim == 2]
    seq = [k for k, v in arrays.items() if isinstance(v, np.ndarray) and v.ndim == 1]
    first = next((v for v in arrays.values() if isinstance(v, np.ndarray)), None)
    if first is None:
        return
    B = first.shape[0]
    grouped = "group_size" in params or arrays.get("group_ids") is not None
    if B > 1:
        if grouped:
            G = params.get("group_size")
            ids = arrays.get("group_ids")
            labels = (np.arange(B) // G) if G else ids
            for lab in np.unique(labels):
                keep = labels != lab
                if keep.any():
                    yield _take(case, keep, tok + seq)
        else:
            for i in range(B):
                keep = np.arange(B) != i
                yield _take(case, keep, tok + seq)
    if tok and arrays[tok[0]].shape[1] > 1:
        for cols in (slice(0, -1), slice(1, None)):
            new = dict(arrays)
            for k in tok:
                new[k] = arrays[k][:, cols]
            m = new.get("mask")
            if m is None or m.any():
                yield cases_mod.Case(case.label, new, params)
    for decimals in (1, 0):
        new = {k: (np.round(v, decimals) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                   else v) for k, v in arrays.items()}
        if any(not np.array_equal(new[k], arrays[k], equal_nan=True) for k in new
               if isinstance(arrays[k], np.ndarray)):
            yield cases_mod.Case(case.label, new, params)


def _take(case, keep, keys):
    arrays = dict(case.arrays)
    for k in keys:
        arrays[k] = arrays[k][keep]
    params = dict(case.params)
    if "group_size" in params and arrays.get("group_ids") is None:
        G = params.pop("group_size")
        arrays["group_ids"] = (np.arange(keep.size) // G)[keep]
    return cases_mod.Case(case.label, arrays, params)


def _describe_case(aud: Auditor, case, outcome: Outcome):
    data, _ = aud.inputs_for(case)
    if data is None:
        return None
    ce = {k: json_safe(v) for k, v in data.items()}
    try:
        ref = aud.reference(data)
        ce["reference output"] = json_safe(np.asarray(ref) if not isinstance(ref, tuple) else
                                        [np.asarray(r) for r in ref])
        raw, _ = aud.call(data)
        yours = aud.to_numpy(raw)
        ce["your output"] = json_safe(yours[0] if len(yours) == 1 else yours)
    except Exception as exc:
        ce["your output"] = f"raised {type(exc).__name__}: {exc}"
    if outcome.check in ("grad", "detach"):
        for o in aud.run_case(case):            # the gradients of the shrunk case itself
            if o.check == "grad" and not o.ok and o.yours is not None:
                ce["your gradient"] = json_safe(o.yours)
                ce["reference gradient"] = json_safe(o.reference)
                break
    return ce


# ================================================================ the entry point
def audit(fn, ref, *, backend="torch", profile=None, cases=200, seed=0, rtol=RTOL, atol=ATOL,
          accumulation="mean", timeout=TIMEOUT, **conventions) -> AuditReport:
    """Audit `fn` (a thin adapter around a trainer's function) against reference `ref`.

    Args:
      fn: callable taking the reference's data inputs by keyword; see the module docstring.
      ref: a registry name, e.g. "group_advantages", "ppo_clip_loss", "policy_objective".
      backend: "torch" (tensors in, gradients audited too) or "numpy".
      profile: "verl" | "trl" | "openrlhf" | "minimind" | "cleanrl" | None (the reference
        defaults, MiniMind's where trainers differ).
      cases: how many seeded cases; seed: their seed.
      rtol, atol: value and gradient tolerance (defaults: 1e-6, 1e-8).
      accumulation: how micro-batch gradients are combined in the microbatch check: "mean"
        (loss / n_micro, and DDP's average over ranks) or "sum" (your function normalises by the
        global counts `n_tokens_global` / `n_sequences_global`, which it receives if it accepts
        them).
      timeout: seconds each call of `fn` may take (None: no limit). A call past it fails the
        `raises` check and ends the audit; the call itself is abandoned, still running.
      **conventions: reference conventions overriding the profile, e.g. ddof=1, eps=1e-6.

    Returns:
      AuditReport: `.ok`, `.findings` (check, status, cases, message, counterexample,
      diagnosis), printable.
    """
    if backend not in ("torch", "numpy"):
        raise AuditUsageError(f"backend is {backend!r}; expected 'torch' or 'numpy'")
    if accumulation not in ("mean", "sum"):
        raise AuditUsageError(f"accumulation is {accumulation!r}; expected 'mean' or 'sum'")
    if not callable(fn):
        raise AuditUsageError(f"fn is {fn!r}; expected a callable")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0 or not math.isfinite(timeout)):
        raise AuditUsageError(f"timeout is {timeout!r}; expected a positive number of seconds "
                              "or None")
    entry, params = resolve_conventions(ref, profile, conventions)
    aud = Auditor(fn, entry, params, backend, rtol, atol, accumulation, timeout)
    try:
        return _run_audit(aud, profile, cases, seed)
    except AuditTimeout as exc:
        stopped = Finding("raises", status="fail", cases=1,
                          message=f"{exc}; the audit stopped there (the call was abandoned)")
        return AuditReport(entry.name, profile, params, backend, 0, seed, [stopped], {})


def _run_audit(aud: "Auditor", profile, cases, seed) -> AuditReport:
    entry, params, backend = aud.entry, aud.params, aud.backend
    order = ["raises", "shape", "finite", "value", "grad", "mask", "permutation", "microbatch",
             "kl_direction"]
    tally: Dict[str, Finding] = {c: Finding(c) for c in order}
    first_fail: Dict[str, tuple] = {}
    skipped: Dict[str, int] = {}
    rng = np.random.default_rng([seed, 7])
    n_run = 0
    for i in range(cases):
        case = _finite_padding(entry.case(cases_mod.rng_for(seed, entry.name, i), i))
        case = _as_trainer_batch(case)
        outcomes = aud.run_case(case)
        if outcomes and outcomes[0].check == "skip":
            skipped[outcomes[0].message] = skipped.get(outcomes[0].message, 0) + 1
            continue
        n_run += 1
        extra = [permutation_check(aud, case, rng)] + microbatch_check(aud, case)
        outcomes += [o for o in extra if o is not None]
        seen = set()
        for o in outcomes:
            f = tally[o.check]
            if o.check not in seen:
                f.cases += 1
                seen.add(o.check)
            if not o.ok and f.status != "fail":
                f.status, f.message = "fail", o.message
                first_fail[o.check] = (case, o)
            elif o.warn and f.status == "pass":
                f.status, f.message = "warn", o.message
    kl = kl_direction_check(aud, rng)
    if kl is not None:
        f = tally["kl_direction"]
        f.cases = 4
        f.status = "fail" if not kl.ok else ("warn" if kl.warn else "pass")
        f.message = kl.message
    for check, (case, outcome) in first_fail.items():
        f = tally[check]
        if check in ("value", "grad", "finite", "shape", "raises", "mask"):
            small = shrink(aud, case, check)
            f.counterexample = _describe_case(aud, small, outcome)
            from .diagnose import diagnose
            f.diagnosis, detach = diagnose(aud, small, check)
            if detach and check == "grad":
                f.check = "detach"
    findings = [f for f in tally.values() if f.cases > 0]
    return AuditReport(entry.name, profile, params, backend, n_run, seed, findings, skipped)


def _as_trainer_batch(case):
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


def assert_conforms(fn, ref, **kwargs) -> AuditReport:
    """pytest helper: audit `fn` and raise AssertionError with the readable report if it fails.

        def test_my_grpo_advantages():
            assert_conforms(my_adapter, "group_advantages", profile="verl")
    """
    report = audit(fn, ref, **kwargs)
    if not report.ok:
        raise AssertionError("\n" + str(report))
    return report
