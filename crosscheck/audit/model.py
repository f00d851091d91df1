"""What an audit reports: findings per check, the report and its verdict, and the usage error."""
import dataclasses
from typing import Dict, List, Optional

# The checks, in the order the report lists them.
CHECKS = ("raises", "shape", "finite", "value", "grad", "mask", "permutation", "microbatch",
          "kl_direction")


class AuditUsageError(ValueError):
    """The audit was asked for something it cannot do (unknown ref, missing hyper-parameter)."""


@dataclasses.dataclass
class Outcome:
    """One check on one case."""
    check: str
    ok: bool
    message: str = ""
    warn: bool = False
    yours: object = None
    reference: object = None


@dataclasses.dataclass
class Finding:
    """One check over every case: its status, how many cases it ran on, the first failure's
    message, its minimal counterexample and what it most likely is."""
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
        from ..bridge import json_safe
        return dict(ok=self.ok, ref=self.ref, profile=self.profile,
                    conventions={k: json_safe(v) for k, v in self.conventions.items()},
                    backend=self.backend, cases=self.n_cases, seed=self.seed,
                    findings=[dataclasses.asdict(f) for f in self.findings],
                    skipped=self.skipped)
