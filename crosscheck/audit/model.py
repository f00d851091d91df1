"""What an audit reports: findings per check, the report, its verdict, and the usage error.

A verdict is only ever given on something that was checked:
- CONFORMS: every check that ran passed, the value check ran on at least one case and, for a
  function trainers differentiate through (a loss), so did the gradient check (torch backend);
- DOES NOT CONFORM: a check failed;
- INCONCLUSIVE: nothing failed, but the value check, or a required gradient check, ran on no
  case (every case skipped: the adapter's names do not match, every case outside the profile's
  domain, ...). `ok` is False, and the command line exits 2.
"""
import dataclasses
import sys
from typing import Dict, List, Optional

# The checks, in the order the report lists them.
CHECKS = ("raises", "inputs", "shape", "finite", "value", "grad", "mask", "garbage",
          "permutation", "microbatch", "kl_direction")
# checks every function passes unless it does something unusual (writes to its inputs): listed
# in a report only when they do not pass
LISTED_WHEN_FAILING = ("inputs",)
STATUSES = ("pass", "info", "warn", "fail")      # "info": not checked by design, and why
# The grade of a finding (crosscheck.trainer.card grades a card's; an audit grades its own):
# - deviation: on inputs the trainer really produces, beyond its precision (a failure);
# - robustness: only on inputs no trainer produces (garbage padding, positive log-probs) or at
#   the edge of the float range;
# - precision: within the float32 row of the tolerance table, for code that trains in float32;
# - documented choice: a convention the trainer documents (cards only, with its citation).
GRADES = ("deviation", "robustness", "precision", "documented choice", "surrogate convention")


class AuditUsageError(ValueError):
    """The audit was asked for something it cannot do (unknown ref, a convention the reference
    refuses, a bad argument)."""


@dataclasses.dataclass
class Outcome:
    """One check on one case."""
    check: str
    ok: bool
    message: str = ""
    warn: bool = False
    info: bool = False
    yours: object = None
    reference: object = None
    exception: Optional[Dict[str, str]] = None     # raises: type, message, where, degenerate
    loose: bool = False        # a value/grad failure within the float32 row of the table
    edge: bool = False         # the case's reference lies beyond float32's range there
    replay: Optional[Dict[str, object]] = None     # the inputs a padding check passed


@dataclasses.dataclass
class Finding:
    """One check over every case: its status, how many cases it ran on, the first failure's
    message, its minimal counterexample and what it most likely is."""
    check: str
    status: str = "pass"                  # one of STATUSES
    cases: int = 0
    message: str = ""
    counterexample: Optional[Dict[str, object]] = None
    diagnosis: str = ""
    exceptions: List[Dict[str, object]] = dataclasses.field(default_factory=list)
    grade: str = ""                       # one of GRADES for a fail or a robustness warning
    float32_ok: Optional[bool] = None     # every failing case lies within the float32 row
    edge_only: Optional[bool] = None      # every failing case lies beyond float32's range


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


@dataclasses.dataclass
class AuditReport:
    ref: str
    profile: Optional[str]
    conventions: Dict[str, object]
    backend: str
    n_cases: int                          # cases run
    seed: int
    findings: List[Finding]
    skipped: Dict[str, int]
    n_drawn: int = 0                      # cases drawn (run + skipped)
    tolerance: Dict[str, object] = dataclasses.field(default_factory=dict)
    notes: List[str] = dataclasses.field(default_factory=list)
    inconclusive: List[str] = dataclasses.field(default_factory=list)
    moved: Dict[str, int] = dataclasses.field(default_factory=dict)   # into the profile's domain
    # replay(inputs): the function's outputs, as a counterexample shows them, on inputs as a
    # counterexample states them (JSON values): a saved finding re-run on today's code
    replay: Optional[object] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def failures(self) -> List[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    @property
    def verdict(self) -> str:
        if self.failures:
            return "DOES NOT CONFORM"
        return "INCONCLUSIVE" if self.inconclusive else "CONFORMS"

    @property
    def ok(self) -> bool:
        return self.verdict == "CONFORMS"

    def verdict_line(self) -> str:
        if self.failures:
            n = len(self.failures)
            return (f"verdict: DOES NOT CONFORM ({plural(n, 'failing check')}: "
                    f"{', '.join(f.check for f in self.failures)})")
        if self.inconclusive:
            return "verdict: INCONCLUSIVE: " + "; ".join(self.inconclusive)
        if self.tolerance.get("warning"):
            return f"verdict: CONFORMS, but {self.tolerance['warning']}"
        return "verdict: CONFORMS"

    def __str__(self) -> str:
        conv = ", ".join(f"{k}={v!r}" for k, v in self.conventions.items())
        head = (f"audit against {self.ref}" + (f" (profile {self.profile})" if self.profile else "")
                + f", backend {self.backend}, {plural(self.n_cases, 'case')}, seed {self.seed}\n"
                f"  reference conventions: {conv or '(defaults)'}")
        lines = [head]
        if self.tolerance:
            t = self.tolerance
            lines.append(f"  tolerance: rtol {t['rtol']:g}, atol {t['atol']:g} ({t['why']})")
            if t.get("warning"):
                lines.append(f"  WARN tolerance: {t['warning']}")
        lines += [f"  {note}" for note in self.notes]
        for f in self.findings:
            lines.append(f"  {f.status.upper():<4} {f.check:<13} {plural(f.cases, 'case'):>9}"
                         + (f"  [{f.grade}]" if f.grade else "")
                         + (f"  {f.message}" if f.message else ""))
            for e in (f.exceptions if len(f.exceptions) > 1 or f.status == "warn" else ()):
                said = f"{e['type']}: {e['message']}" if e["message"] else e["type"]
                lines.append(f"       {said} at {e['where']} "
                             f"({plural(e['cases'], 'case')}"
                             + (f"; {e['degenerate']}" if e.get("degenerate") else "") + ")")
            if f.diagnosis:
                lines.append(f"       likely: {f.diagnosis}")
            if f.counterexample:
                lines.append("       minimal counterexample:")
                for k, v in f.counterexample.items():
                    lines.append(f"         {k}: {v}")
        if self.skipped:
            lines.append(f"  coverage: ran {self.n_cases} of {plural(self.n_drawn, 'case')}")
        for how, n in self.moved.items():
            whose = f"the {self.profile} profile's" if self.profile else "the declared"
            lines.append(f"  note: {plural(n, 'case')} moved into {whose} domain ({how})")
        for why, n in self.skipped.items():
            lines.append(f"  note: {plural(n, 'case')} skipped: {why}")
        lines.append(self.verdict_line())
        return "\n".join(lines)

    def to_dict(self):
        from ..bridge import json_safe
        return dict(ok=self.ok, verdict=self.verdict, ref=self.ref, profile=self.profile,
                    conventions={k: json_safe(v) for k, v in self.conventions.items()},
                    backend=self.backend, cases=self.n_cases, drawn=self.n_drawn,
                    seed=self.seed, tolerance=json_safe(self.tolerance), notes=self.notes,
                    inconclusive=self.inconclusive,
                    findings=[json_safe(dataclasses.asdict(f)) for f in self.findings],
                    skipped=self.skipped, moved=self.moved)


# ---- a one-line progress display (cards, long audits) --------------------------------------
def progress_stream(json_or_piped: bool):
    """stderr when it is a terminal and the output is for a person, else None."""
    return sys.stderr if not json_or_piped and sys.stderr.isatty() else None


def show_progress(stream, text: str) -> None:
    """Rewrite the progress line (nothing where `stream` is None)."""
    if stream is not None:
        stream.write(f"\r\033[K{text}")
        stream.flush()


def end_progress(stream) -> None:
    """Clear the progress line, so the report starts on a clean line."""
    if stream is not None:
        stream.write("\r\033[K")
        stream.flush()
