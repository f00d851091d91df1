"""Audit a trainer's own function against a reference: `audit(fn, ref, ...)`.

The adapter contract (crosscheck.audit.calls has it in full): `fn` receives the reference's
*data* inputs by keyword, under the reference's names or under its own where `rename` maps them,
as torch float64 tensors (backend="torch") or NumPy arrays (backend="numpy"), and returns what
the reference returns (a [B, T] array, a [B] array, a scalar, gae's pair, a dict for the
estimator analysis). The user binds their own hyper-parameters inside the adapter; the reference
takes its conventions from `profile` and `**conventions`, which are validated against the
reference before the first case.

Checks (each case; a failure is shrunk to a minimal counterexample):
  raises, shape, finite   the function runs, returns the reference's shape, is finite on valid
                          positions wherever the reference is, and finite at padding
  value                   outputs equal the reference on valid positions
  grad                    (torch) autograd through fn equals the reference VJP on valid positions
                          and is 0 on padding; for a function trainers compute without gradients
                          (advantages, metrics), a gradient-free output is reported as such
  detach                  a grad failure explained by a factor that must be stop-gradient
  mask                    padding inside each input's domain (plausible log-probs ≤ 0, shared and
                          then differing; finite values and logits) changes no valid output
  garbage                 garbage at padding (±1e4, NaN, inf, positive log-probs), which no
                          trainer produces: a robustness warning where it leaks, never a failure
  permutation             group advantages: shuffling rows with their ids permutes the outputs
  microbatch              the gradient accumulated over 2 and 4 micro-batches, the trainer's way,
                          equals the full-batch gradient of the declared aggregation
  kl_direction            the KL term alone, used as declared (loss or reward), pushes π the
                          way the reference estimator used the same way does

Values and gradients are judged at the precision the function computes in: the tolerance
table's float64 or float32 row, chosen from the dtype of its outputs or declared with
`precision=`. A verdict is given only on what was checked (see crosscheck.audit.model).

Every call of `fn` runs under a deadline (`timeout`, seconds): a function that does not return
stops the audit, INCONCLUSIVE (slow is not wrong). Python cannot kill a thread, so that call is
abandoned in a daemon thread (it ends with the process).

This module imports torch only when an audit runs, so that `import crosscheck` and the command
line's --help stay quick.
"""
import dataclasses
import inspect
import math
import numbers
from typing import Dict, Optional

from .. import tolerances
from . import profiles as profiles_mod
from .model import CHECKS, LISTED_WHEN_FAILING, AuditReport, AuditUsageError, Finding, plural

TIMEOUT = 60.0                   # seconds per call of the audited function (cases are small)
PRECISIONS = ("float64", "float32")
NEUTRAL = ("dones", "last_value", "valid", "sample_logits")     # optional inputs with a "none"
KL_USES = ("loss", "reward")
ACCUMULATIONS = ("mean", "sum", "none")


def _number(name, v, lo=0.0):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < lo:
        raise AuditUsageError(f"{name} is {v!r}; expected a finite number ≥ {lo:g}")
    return float(v)


def _integer(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise AuditUsageError(f"{name} is {v!r}; expected an integer ≥ {lo}")
    return int(v)


def _choice(name, v, options):
    if v is not None and v not in options:
        raise AuditUsageError(f"{name} is {v!r}; expected one of "
                              f"{', '.join(repr(o) for o in options)} (or None)")
    return v


def resolve_conventions(ref: str, profile: Optional[str], conventions: Dict[str, object]):
    """(registry entry, reference conventions, the profile's rule or None) for an audit of
    `ref` under `profile`, with `conventions` overriding; a usage error for anything unknown or
    missing. For policy_objective the profile supplies the keys of the chosen loss only."""
    from ..check import registry as registry_mod

    entries = registry_mod.build()
    if ref not in entries:
        raise AuditUsageError(f"ref is {ref!r}; expected one of {', '.join(entries)}")
    entry = entries[ref]
    params = dict(entry.defaults)
    rule = None
    if profile is not None:
        try:
            rule = profiles_mod.rule(profile, ref, conventions.get("loss"))
        except profiles_mod.ProfileError as exc:
            raise AuditUsageError(str(exc)) from None
        params.update(rule.conventions)
    for k, v in conventions.items():
        if k in entry.data_keywords:
            raise AuditUsageError(f"{k!r} is data, passed to your function by the audit's cases")
        if k not in entry.conventions and not entry.takes_more:
            raise AuditUsageError(f"{k!r} is not a convention of {ref}; its keywords are "
                                  f"{', '.join(entry.conventions)}")
        params[k] = v
    if rule is not None:
        rule.settle(params, conventions)
    missing = [n for n in entry.conventions if n not in params]
    if missing:
        raise AuditUsageError(f"{ref} needs {', '.join(missing)}: pass e.g. "
                              f"{missing[0]}=... (or --set {missing[0]}=...) or a profile")
    return entry, params, rule


def _case_data(case):
    data = {k: v for k, v in case.arrays.items() if v is not None}
    data.update(case.params)
    return data


def check_conventions(entry, params, seed):
    """The reference must accept the conventions: tried on the first cases, a convention it
    refuses on every one of them is a usage error quoting its message (which names the key)."""
    from .calls import audit_case, reference_args

    errors = []
    for i in range(6):
        case = audit_case(entry, seed, i)
        try:
            entry.numpy_fn(**reference_args(_case_data(case)), **params)
            return
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
    conv = ", ".join(f"{k}={v!r}" for k, v in params.items())
    raise AuditUsageError(f"the reference {entry.name} refuses these conventions ({conv}): "
                          f"{errors[0]}")


def _inputs(entry):
    sig = inspect.signature(entry.numpy_fn).parameters
    return tuple(n for n, p in sig.items() if p.kind is p.POSITIONAL_OR_KEYWORD) + \
        entry.data_keywords


def into_domain(rule, case, unused=()):
    """The case as the profile's trainer could see it: (case, what was changed or "") or (None,
    why it lies outside). A case is moved in where a faithful projection exists: a mask with
    holes becomes right-padded by moving each row's valid tokens to its front, in order (the
    trainer's sequence is the same tokens), or left-padded by moving them to its end; rows of
    a group with fewer than two valid members are dropped, and so are rows with no valid token for a trainer that never builds one (but
    not from grouped inputs whose groups are read: groups in `unused`, which the conventions do
    not read, are left out with the rows). Rewards below 0 where they are pass rates (MaxRL)
    are shifted by one constant, the least valid reward, to start at 0 (the differences within
    each group kept). Per-token advantages for a trainer taking one per sequence have no
    projection: that case is skipped."""
    import numpy as np

    from ..check import cases as cases_mod

    if rule is None or not rule.domain:
        return case, ""
    arrays, params, changed = dict(case.arrays), dict(case.params), []
    for tag in rule.domain:
        m = arrays.get("mask")
        if tag == "right_padded" and m is not None and np.ndim(m) == 2:
            mm = np.asarray(m, dtype=bool)
            if (mm[:, 1:] & ~mm[:, :-1]).any():
                order = np.argsort(~mm, axis=1, kind="stable")
                arrays = {k: (np.take_along_axis(v, order, axis=1)
                              if isinstance(v, np.ndarray) and v.shape == mm.shape else v)
                          for k, v in arrays.items()}
                changed.append("right-padded")
        if tag == "left_padded" and m is not None and np.ndim(m) == 2:
            mm = np.asarray(m, dtype=bool)
            if (mm[:, :-1] & ~mm[:, 1:]).any():
                order = np.argsort(mm, axis=1, kind="stable")      # padding first, in order
                arrays = {k: (np.take_along_axis(v, order, axis=1)
                              if isinstance(v, np.ndarray) and v.shape == mm.shape else v)
                          for k, v in arrays.items()}
                changed.append("left-padded")
        if tag == "per_sequence_advantages" and arrays.get("advantages") is not None and \
                np.ndim(arrays["advantages"]) == 2:
            return None, profiles_mod.DOMAINS[tag]
        if tag == "per_token_advantages" and m is not None and np.ndim(m) == 2 and \
                arrays.get("advantages") is not None and np.ndim(arrays["advantages"]) == 1:
            arrays["advantages"] = np.broadcast_to(
                np.asarray(arrays["advantages"])[:, None], np.shape(m)).copy()
            changed.append("advantages per token")
        if tag == "per_sequence_scores" and np.ndim(arrays.get("scores")) == 2:
            return None, profiles_mod.DOMAINS[tag]
        if tag == "outcome_rewards" and m is not None and np.ndim(m) == 2 and \
                np.shape(arrays.get("rewards")) == np.shape(m):
            mm = np.asarray(m, dtype=bool)
            last = mm & (np.cumsum(mm[:, ::-1], axis=1)[:, ::-1] == 1)   # the last valid token
            r = np.asarray(arrays["rewards"], dtype=np.float64)
            if (np.where(last, 0.0, r) != 0).any():
                arrays["rewards"] = np.where(last, r, 0.0)
                changed.append("rewards at each response's last valid token only")
        if tag == "nonempty_rows" and m is not None and np.ndim(m) == 2:
            keep = np.asarray(m, dtype=bool).any(axis=1)
            if not keep.all():
                # the batch without those rows is one the trainer could build; not where rows
                # form groups (dropping one changes its group) or where none is left
                if "group_size" in unused or "group_ids" in unused:
                    params.pop("group_size", None)
                    arrays.pop("group_ids", None)
                if not keep.any() or "group_size" in params or "group_ids" in arrays:
                    return None, profiles_mod.DOMAINS[tag]
                n = len(keep)
                arrays = {k: (v[keep] if isinstance(v, np.ndarray) and v.shape[:1] == (n,)
                              else v) for k, v in arrays.items()}
                changed.append("empty rows dropped")
        if tag == "pass_rates" and arrays.get("rewards") is not None:
            r = np.asarray(arrays["rewards"], dtype=np.float64)
            valid = np.isfinite(r) if arrays.get("valid") is None else \
                np.asarray(arrays["valid"], dtype=bool) & np.isfinite(r)
            low = r[valid].min(initial=0.0)
            if low < 0:
                arrays["rewards"] = r - low
                changed.append("rewards shifted to ≥ 0")
        if tag == "groups_of_two":
            ids, size = arrays.get("group_ids"), params.get("group_size")
            if ids is None:
                if size == 1:
                    return None, profiles_mod.DOMAINS[tag]
                continue
            valid = np.ones(len(ids), dtype=bool) if arrays.get("valid") is None else \
                np.asarray(arrays["valid"], dtype=bool)
            _, inverse = np.unique(np.asarray(ids), return_inverse=True)
            inverse = inverse.reshape(-1)
            keep = np.bincount(inverse, weights=valid)[inverse] >= 2   # two valid members
            if not keep.any():
                return None, profiles_mod.DOMAINS[tag]
            if not keep.all():
                n = len(ids)
                arrays = {k: (v[keep] if isinstance(v, np.ndarray) and v.shape[:1] == (n,)
                              else v) for k, v in arrays.items()}
                changed.append("groups of one dropped")
    if not changed:
        return case, ""
    return (cases_mod.Case(case.label + " (" + ", ".join(changed) + ")", arrays, params,
                           case.stages, case.fd_step), ", ".join(changed))


def audit(fn, ref, *, backend="torch", profile=None, cases=200, seed=0, rtol=None, atol=None,
          precision=None, rename=None, accumulation=None, kl_use=None, timeout=TIMEOUT,
          domain=None, variant=None, padding_checks=True, progress=None,
          **conventions) -> AuditReport:
    """Audit `fn` (a thin adapter around a trainer's function) against reference `ref`.

    Args:
      fn: callable taking the reference's data inputs by keyword; see the module docstring.
      ref: a registry name, e.g. "group_advantages", "ppo_clip_loss", "policy_objective".
      backend: "torch" (tensors in, gradients audited too) or "numpy".
      profile: "verl" | "trl" | "openrlhf" | "minimind" | "cleanrl" | None (the reference
        defaults). A profile also sets the function's domain, the micro-batch accumulation and
        the KL term's use.
      cases: how many seeded cases (an integer ≥ 1); seed: their seed (an integer ≥ 0).
      rtol, atol: the tolerance (finite, ≥ 0), overriding the table's row for the precision.
      precision: "float64" | "float32" | None: the precision the function computes in (None:
        the dtype of its outputs; declare it when the outputs are cast back to float64).
      rename: {your parameter: the reference's input}, e.g. {"log_prob": "logp"}.
      accumulation: how micro-batch gradients are combined: "mean" (loss / n_micro, and DDP's
        average over ranks), "sum" (your function normalises by the global counts
        `n_tokens_global` / `n_sequences_global`, which it receives if it names them) or "none"
        (an optimizer step per batch: no micro-batch check); None: the profile's, else "sum"
        for a function naming a global count, else "mean" (assumed: a micro-batch failure is
        then a warning).
      kl_use: "loss" | "reward" | None (the profile's, else "loss"): how your trainer uses a KL
        term, which the kl_direction check judges.
      timeout: seconds each call of `fn` may take (None: no limit). A call past it ends the
        audit as INCONCLUSIVE; the call itself is abandoned, still running.
      domain: the inputs your function ever sees, overriding the profile's: a tuple of
        "right_padded", "left_padded", "per_sequence_advantages", "per_token_advantages",
        "groups_of_two", "per_sequence_scores", "nonempty_rows", "outcome_rewards"
        (crosscheck.audit.profiles DOMAINS); cases outside it are moved into it or skipped, and
        the report says so.
      progress: a stream for a one-line progress display (the command line passes stderr on
        a terminal), or None: silent.
      padding_checks: False where the function never sees padding (an adapter that passes
        valid tokens only, one at a time): the mask and garbage checks would test the adapter,
        not the function, and are not run (the report says so).
      variant: a documented variant of the reference, with which a report card tests whether
        a trainer's known convention reproduces a failure: {"inputs": a function of the data
        dict returning the data the reference is given, "microbatch": "local" (each
        micro-batch normalised by its own counts)}; None for the reference itself.
      **conventions: reference conventions overriding the profile, e.g. ddof=1, eps=1e-6.

    Returns:
      AuditReport: `.ok`, `.verdict`, `.findings` (check, status, cases, message,
      counterexample, diagnosis), printable.
    """
    cases = _integer("cases", cases, 1)
    seed = _integer("seed", seed, 0)
    from .calls import AuditTimeout
    from .model import end_progress

    aud, rule, notes = prepare(fn, ref, backend=backend, profile=profile, seed=seed, rtol=rtol,
                               atol=atol, precision=precision, rename=rename,
                               accumulation=accumulation, kl_use=kl_use, timeout=timeout,
                               **conventions)
    if variant is not None:
        unknown = set(variant) - {"inputs", "microbatch"} if isinstance(variant, dict) else None
        if unknown is None or unknown or variant.get("microbatch", "local") != "local":
            raise AuditUsageError(f"variant is {variant!r}; expected a dict with 'inputs' (a "
                                  f"function of the data) and/or 'microbatch': 'local'")
        aud.variant = dict(variant)
    if not isinstance(padding_checks, bool):
        raise AuditUsageError(f"padding_checks is {padding_checks!r}; expected True or False")
    aud.padding_checks = padding_checks
    if not padding_checks:
        notes.append("padding: the mask and garbage checks are not run (declared: your "
                     "function is given valid tokens only)")
    rule = _with_domain(rule, domain)
    try:
        report = _run_audit(aud, profile, rule, cases, seed, progress)
    except AuditTimeout as exc:         # slow is not wrong: no verdict either way
        report = AuditReport(aud.entry.name, profile, aud.params, backend, 0, seed, [], {},
                             n_drawn=cases)
        report.inconclusive.append(f"{exc}; the audit stopped there (the call was abandoned): "
                                   f"raise timeout= (--timeout) to audit a slower function")
    finally:
        end_progress(progress)
    report.notes = notes + report.notes
    return report


def prepare(fn, ref, *, backend="torch", profile=None, seed=0, rtol=None, atol=None,
            precision=None, rename=None, accumulation=None, kl_use=None, timeout=TIMEOUT,
            **conventions):
    """Everything an audit fixes before its first case, each argument validated (audit's
    arguments but `cases`): (the Auditor, the profile's rule or None, the report's notes)."""
    if backend not in ("torch", "numpy"):
        raise AuditUsageError(f"backend is {backend!r}; expected 'torch' or 'numpy'")
    _choice("accumulation", accumulation, ACCUMULATIONS)
    _choice("precision", precision, PRECISIONS)
    _choice("kl_use", kl_use, KL_USES)
    if not callable(fn):
        raise AuditUsageError(f"fn is {fn!r}; expected a callable")
    seed = _integer("seed", seed, 0)
    rtol = None if rtol is None else _number("rtol", rtol)
    atol = None if atol is None else _number("atol", atol)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0 or not math.isfinite(timeout)):
        raise AuditUsageError(f"timeout is {timeout!r}; expected a positive number of seconds "
                              "or None")
    entry, params, rule = resolve_conventions(ref, profile, conventions)
    check_conventions(entry, params, seed)

    from .auditor import Auditor
    from .calls import GLOBAL_KW, STRUCTURAL, Adapter

    inputs = _inputs(entry)
    if rename is not None:
        if not isinstance(rename, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in rename.items()):
            raise AuditUsageError(f"rename is {rename!r}; expected a dict of your parameter "
                                  f"names to the reference's input names")
        for own, theirs in rename.items():
            if theirs not in inputs + GLOBAL_KW:
                raise AuditUsageError(f"rename maps {own!r} to {theirs!r}, which {ref} does not "
                                      f"pass; it passes {', '.join(inputs + GLOBAL_KW)}")
    adapter = Adapter(fn, inputs, STRUCTURAL + entry.data_keywords, rename)
    if rename:
        unknown = [own for own in rename if own not in adapter.named and not adapter.var_kw]
        if unknown:
            raise AuditUsageError(f"rename names {', '.join(map(repr, unknown))}, which your "
                                  f"function does not take; it takes {', '.join(adapter.params)}")
    prof = None if profile is None else profiles_mod.get(profile)
    notes = []
    assumed = False
    if "microbatch" in entry.checks and backend == "torch":
        accumulation, assumed, notes = _accumulation(accumulation, prof, rule, adapter)
    if kl_use is None:
        kl_use = prof.kl_use[0] if prof is not None else "loss"
    if "kl_direction" in entry.checks:
        notes.append("KL term: " + (f"judged as a {kl_use}" if kl_use else "not judged")
                     + (f" ({profile}: {prof.kl_use[1]})" if prof is not None else ""))
    for k in entry.data_keywords:
        if adapter.requires(k) and k in NEUTRAL:
            notes.append(f"your function requires {adapter.own(k)}=: cases without it pass its "
                         f"neutral value (no dones, a zero last_value, every row valid)")
    tol, warning = None, None
    if rtol is not None or atol is not None:
        default = tolerances.get("audit", precision or "float64")
        tol = tolerances.Tolerance(default.rtol if rtol is None else rtol,
                                   default.atol if atol is None else atol, "as given")
        warning = tolerances.too_wide(rtol, atol)
    aud = Auditor(adapter, entry, params, backend, tol, accumulation, timeout, precision, kl_use,
                  accumulation_assumed=assumed)
    aud.tolerance_warning = warning
    return aud, rule, notes


def _with_domain(rule, domain):
    """The profile's rule with its domain replaced by `domain` (validated), or as it is."""
    if domain is None:
        return rule
    if isinstance(domain, str) or not all(d in profiles_mod.DOMAINS for d in domain):
        raise AuditUsageError(f"domain is {domain!r}; expected a tuple of "
                              f"{', '.join(map(repr, profiles_mod.DOMAINS))}")
    base = rule if rule is not None else profiles_mod.Rule({}, "as given")
    return dataclasses.replace(base, domain=tuple(domain))


_RANK = {"pass": 0, "info": 1, "warn": 2, "fail": 3}


def _fold(f: Finding, o) -> None:
    status = "fail" if not o.ok else "warn" if o.warn else "info" if o.info else "pass"
    if o.exception is not None:
        e = o.exception
        same = next((x for x in f.exceptions if (x["type"], x["where"]) ==
                     (e["type"], e["where"])), None)      # one line of code, one entry
        if same is None:
            f.exceptions.append(dict(e, cases=1))
        else:
            same["cases"] += 1
    if not o.ok and o.check in ("value", "grad", "microbatch", "finite", "permutation"):
        # within the float32 row, or beyond float32's range where float32 code overflows
        f.float32_ok = (o.loose or o.edge) and f.float32_ok is not False
    if not o.ok:
        f.edge_only = o.edge and f.edge_only is not False
    if _RANK[status] > _RANK[f.status]:
        f.status, f.message = status, o.message


def _accumulation(given, prof, rule, adapter):
    """(the micro-batch accumulation to simulate, whether it was assumed, the report's notes on
    it): as given, else the profile's (its rule's, for a loss that accumulates its own way),
    else assumed from the function ("sum" when it names a global count, else "mean")."""
    from .calls import GLOBAL_KW

    named = [k for k in GLOBAL_KW if adapter.accepts(k)]
    assumed = given is None and prof is None
    if given is None and prof is not None:
        given, source = rule.accumulation if rule is not None and rule.accumulation else \
            prof.accumulation
        head = (f"micro-batches: none, as {prof.name} trains ({source}): the micro-batch check "
                f"does not apply (pass accumulation='mean' or 'sum' to check an accumulating "
                f"run)" if given == "none" else
                f"micro-batches: {given} of micro-batch gradients, as {prof.name} accumulates "
                f"({source})")
    elif given is None:
        given = "sum" if named else "mean"        # the global-count note below follows it
        head = ("micro-batches: not declared (no accumulation= and no profile), so the "
                "micro-batch check tries both ways a trainer accumulates: the sum of "
                "micro-batch gradients, each normalised by the whole batch's counts, and their "
                "mean, each normalised by its own; it fails only where neither gives the full "
                "batch's gradient, and says which one fits")
    elif given == "none":
        head = "micro-batches: none (as given): the micro-batch check does not apply"
    else:
        head = f"micro-batches: {given} of micro-batch gradients (as given)"
    notes = [head]
    if given == "sum":
        notes.append("global counts: " + (f"your function receives {', '.join(named)}, the "
                                          f"whole batch's in each micro-batch" if named else
                                          f"your function names neither "
                                          f"{' nor '.join(GLOBAL_KW)}, so each micro-batch can "
                                          f"only normalise by its own counts"))
    elif given == "mean" and named:
        notes.append(f"global counts: your function receives {', '.join(named)}, each "
                     f"micro-batch its own (mean accumulation)")
    return given, assumed, notes


def _run_audit(aud, profile, rule, n_cases, seed, progress=None) -> AuditReport:
    import time

    import numpy as np

    from .calls import audit_case
    from .diagnose import diagnose
    from .model import show_progress
    from .properties import kl_direction_check, microbatch_check, permutation_check
    from .shrink import describe, shrink

    entry, params, backend = aud.entry, aud.params, aud.backend
    tally: Dict[str, Finding] = {c: Finding(c) for c in CHECKS}
    first_fail: Dict[str, tuple] = {}
    skipped: Dict[str, int] = {}
    moved: Dict[str, int] = {}                 # cases moved into the profile's domain, by how
    rng = np.random.default_rng([seed, 7])
    n_run = 0
    t0 = last = time.perf_counter()
    for i in range(n_cases):
        now = time.perf_counter()
        if i == 0 or now - last > 0.5:     # at most twice a second
            last = now
            show_progress(progress, f"audit: case {i + 1}/{n_cases}, {now - t0:.0f} s")
        case = audit_case(entry, seed, i)
        case, change = into_domain(rule, case, entry.unused(params) if entry.unused else ())
        if case is not None and change:
            moved[change] = moved.get(change, 0) + 1
        outcomes = [] if case is None else aud.run_case(case)
        if case is None or (outcomes and outcomes[0].check == "skip"):
            whose = f"the {profile} profile's" if profile else "the declared"
            why = f"outside {whose} domain: {change}" if case is None else \
                outcomes[0].message
            skipped[why] = skipped.get(why, 0) + 1
            continue
        n_run += 1
        if all(o.ok for o in outcomes if o.check == "inputs"):   # else every call alters it
            extra = [permutation_check(aud, case, rng)] + microbatch_check(aud, case)
            outcomes += [o for o in extra if o is not None]
        seen = set()
        for o in outcomes:
            f = tally[o.check]
            if o.check not in seen:
                f.cases += 1
                seen.add(o.check)
            if (not o.ok or (o.warn and o.check == "garbage")) and o.check not in first_fail:
                first_fail[o.check] = (case, o)
            _fold(f, o)
    perm, value = tally["permutation"], tally["value"]
    if perm.status == "fail" and perm.float32_ok and value.status == "fail" and \
            value.float32_ok and aud.precision == "float64":
        # a function computing in float32, judged at float64: the value check's finding (with
        # its hint); the shuffle's float32 rounding is that finding, not a second one
        perm.status = "pass"
        perm.message = ("every change under shuffling lies within float32 rounding, which the "
                        "value check judges")
        first_fail.pop("permutation", None)
    show_progress(progress, "audit: shrinking and diagnosing what failed")
    if aud.tol is None:                    # no call returned: judge at float64
        precision = aud.precision or "float64"
        aud.tol = tolerances.get("audit", precision)
        aud.tolerance_why = f"the {precision} row of the tolerance table: " + (
            f"precision={precision!r} declared" if aud.precision else
            "no output of yours to read a precision from")
    kl = kl_direction_check(aud, rng)
    if kl is not None:
        f = tally["kl_direction"]
        f.cases = 4
        _fold(f, kl)
    for check, (case, outcome) in first_fail.items():
        f = tally[check]
        if check in ("value", "grad", "finite", "shape", "raises", "inputs", "mask", "garbage"):
            small = shrink(aud, case, check)
            f.counterexample = describe(aud, small, outcome)
            f.diagnosis, detach = diagnose(aud, small, check, profile)
            if detach and check == "grad":
                f.check = "detach"
    findings = [f for f in tally.values() if f.cases > 0 and
                (f.status != "pass" or f.check not in LISTED_WHEN_FAILING)]
    for f in findings:
        _grade(f, aud)
    report = AuditReport(entry.name, profile, params, backend, n_run, seed, findings, skipped,
                         n_drawn=n_cases, moved=moved)
    if aud.tol is not None:
        report.tolerance = dict(rtol=aud.tol.rtol, atol=aud.tol.atol,
                                why=aud.tolerance_why or aud.tol.why)
        if aud.tolerance_warning:
            report.tolerance["warning"] = aud.tolerance_warning
    report.inconclusive = _inconclusive(aud, tally, skipped)
    report.replay = lambda inputs: replay(aud, inputs)
    return report


# a counterexample's entries that are not inputs
NOT_INPUTS = ("reference output", "your output", "inputs after your call", "gradient of",
              "your gradient", "reference gradient")


def _from_json(v):
    """A counterexample's JSON value as the audit passed it: lists of booleans a bool array,
    of integers an int64 array, of numbers (non-finite ones as "nan", "inf", "-inf") a float64
    array; a number or a string as it is."""
    import numpy as np
    if not isinstance(v, list):
        return v
    flat = list(_leaves(v))
    if flat and all(isinstance(x, bool) for x in flat):
        return np.asarray(v, dtype=bool)
    if flat and all(isinstance(x, int) and not isinstance(x, bool) for x in flat):
        return np.asarray(v, dtype=np.int64)
    return np.asarray(_floats(v), dtype=np.float64)


def _leaves(v):
    for x in v:
        if isinstance(x, list):
            yield from _leaves(x)
        else:
            yield x


def _floats(v):
    if isinstance(v, list):
        return [_floats(x) for x in v]
    return float(v)                      # float("nan"), float("inf") read the strings


def replay(aud, inputs):
    """The audited function's outputs (a counterexample's "your output") on a counterexample's
    inputs; raises what the function or the inputs raise."""
    from .shrink import _labelled
    data = {k: _from_json(v) for k, v in inputs.items() if k not in NOT_INPUTS}
    raw, _ = aud.call(data)
    return _labelled(aud, aud.to_numpy(raw))


FLOAT32_HINT = ("every difference lies within the float32 row of the tolerance table, or "
                "beyond float32's range: if your function computes in float32 (and casts "
                "back), pass precision='float32'")


def _grade(f: Finding, aud) -> None:
    """An audit's own grades: a failure is a deviation (with a hint where it lies within the
    float32 row and the function was judged at float64); garbage padding's warning is a
    robustness note."""
    if f.status == "fail" and f.edge_only and aud.precision == "float32":
        # float32 code overflows where the reference is beyond float32's range: inputs no
        # trainer produces, at the edge of its float range
        f.status, f.grade = "warn", "robustness"
        f.message += " (every failing case is beyond float32's range: a robustness note)"
    elif f.status == "fail":
        f.grade = "deviation"
        if f.float32_ok and aud.precision == "float64":
            f.message += f" ({FLOAT32_HINT})"
    elif f.status == "warn" and f.check == "garbage":
        f.grade = "robustness"


def _inconclusive(aud, tally, skipped):
    """Why nothing can be concluded, or []: the value check (or, for a function trainers
    differentiate, the gradient check) ran on no case."""
    reasons = []
    grad_needed = aud.entry.numpy_vjp is not None and aud.entry.trainer_grad
    if tally["value"].cases == 0:
        reasons.append("the value check ran on no case")
    if grad_needed and aud.backend == "numpy":
        reasons.append(f"{aud.entry.name} is a loss trainers differentiate, and the numpy "
                       f"backend has no gradients: audit it with backend='torch'")
    elif grad_needed and tally["grad"].cases == 0 and tally["value"].cases > 0 and \
            tally["raises"].status != "fail":
        reasons.append("the gradient check ran on no case")
    if reasons and skipped:
        top = max(skipped, key=skipped.get)
        reasons.append(f"{plural(sum(skipped.values()), 'case')} skipped, "
                       f"{skipped[top]} because {top}")
        if any("requires" in why or "does not accept" in why for why in skipped):
            reasons.append(aud.adapter.mapping_help(aud.entry.name))
    return reasons


def assert_conforms(fn, ref, **kwargs) -> AuditReport:
    """pytest helper: audit `fn` and raise AssertionError with the readable report unless it
    conforms. The message's first line is the verdict (pytest's short summary shows it).

        def test_my_grpo_advantages():
            assert_conforms(my_adapter, "group_advantages", profile="verl")
    """
    report = audit(fn, ref, **kwargs)
    if not report.ok:
        raise AssertionError(report.verdict_line() + "\n" + str(report))
    return report
