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

This module imports torch only when an audit runs, so that `import crosscheck` and the command
line's --help stay quick.
"""
import math
from typing import Dict, Optional

from .. import tolerances
from . import profiles as profiles_mod
from .model import CHECKS, AuditReport, AuditUsageError, Finding

TIMEOUT = 60.0                   # seconds per call of the audited function (cases are small)
_AUDIT_TOL = tolerances.get("audit")
RTOL, ATOL = _AUDIT_TOL.rtol, _AUDIT_TOL.atol


def resolve_conventions(ref: str, profile: Optional[str], conventions: Dict[str, object]):
    """(registry entry, reference conventions) for an audit of `ref` under `profile`, with
    `conventions` overriding; a usage error for anything unknown or missing."""
    from ..check import registry as registry_mod

    entries = registry_mod.build()
    if ref not in entries:
        raise AuditUsageError(f"ref is {ref!r}; expected one of {', '.join(entries)}")
    entry = entries[ref]
    params = dict(entry.defaults)
    if profile is not None:
        try:
            params.update(profiles_mod.conventions(profile, ref))
        except profiles_mod.ProfileError as exc:
            raise AuditUsageError(str(exc)) from None
    for k, v in conventions.items():
        if k in entry.data_keywords:
            raise AuditUsageError(f"{k!r} is data, passed to your function by the audit's cases")
        if k not in entry.conventions and not entry.takes_more:
            raise AuditUsageError(f"{k!r} is not a convention of {ref}; its keywords are "
                                  f"{', '.join(entry.conventions)}")
        params[k] = v
    missing = [n for n in entry.conventions if n not in params]
    if missing:
        raise AuditUsageError(f"{ref} needs {', '.join(missing)}: pass e.g. "
                              f"{missing[0]}=... (or --set {missing[0]}=...) or a profile")
    return entry, params


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
      rtol, atol: value and gradient tolerance (defaults: the tolerance table's "audit" row).
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
    from .auditor import Auditor
    from .calls import AuditTimeout

    entry, params = resolve_conventions(ref, profile, conventions)
    tol = tolerances.Tolerance(rtol, atol, why="the audit's tolerance")
    aud = Auditor(fn, entry, params, backend, tol, accumulation, timeout)
    try:
        return _run_audit(aud, profile, cases, seed)
    except AuditTimeout as exc:
        stopped = Finding("raises", status="fail", cases=1,
                          message=f"{exc}; the audit stopped there (the call was abandoned)")
        return AuditReport(entry.name, profile, params, backend, 0, seed, [stopped], {})


def _run_audit(aud, profile, cases, seed) -> AuditReport:
    import numpy as np

    from ..check import cases as cases_mod
    from .calls import as_trainer_batch, finite_padding
    from .diagnose import diagnose
    from .properties import kl_direction_check, microbatch_check, permutation_check
    from .shrink import describe, shrink

    entry, params, backend = aud.entry, aud.params, aud.backend
    tally: Dict[str, Finding] = {c: Finding(c) for c in CHECKS}
    first_fail: Dict[str, tuple] = {}
    skipped: Dict[str, int] = {}
    rng = np.random.default_rng([seed, 7])
    n_run = 0
    for i in range(cases):
        case = finite_padding(entry.case(cases_mod.rng_for(seed, entry.name, i), i))
        case = as_trainer_batch(case)
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
            f.counterexample = describe(aud, small, outcome)
            f.diagnosis, detach = diagnose(aud, small, check)
            if detach and check == "grad":
                f.check = "detach"
    findings = [f for f in tally.values() if f.cases > 0]
    return AuditReport(entry.name, profile, params, backend, n_run, seed, findings, skipped)


def assert_conforms(fn, ref, **kwargs) -> AuditReport:
    """pytest helper: audit `fn` and raise AssertionError with the readable report if it fails.

        def test_my_grpo_advantages():
            assert_conforms(my_adapter, "group_advantages", profile="verl")
    """
    report = audit(fn, ref, **kwargs)
    if not report.ok:
        raise AssertionError("\n" + str(report))
    return report
