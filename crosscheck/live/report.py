"""What a live audit found: graded findings, one summary per checked step, the final report.

The grades are the cards' (crosscheck.audit.model.GRADES). In a live run every input is one the
trainer really produced, so a difference beyond the run's precision is a deviation; a
difference the trainer documents (with its citation) is a documented choice and never fails
the run.
"""
import dataclasses
import json
import math
from typing import Dict, List, Optional, Tuple

from ..audit.model import GRADES, plural

CHECKS = ("settings", "advantages", "reward weights", "dynamic sampling", "rows",
          "row advantages", "detached", "mask", "global counts", "old log-probs",
          "reference log-probs", "temperature", "micro-batch loss", "gradient", "rank agreement",
          "metrics")
# the checks that carry the verdict: a run is CONFORMS only when each ran on a sampled step
CARRIERS = ("micro-batch loss", "gradient")
# what each check compares, in words (a watcher may say it more precisely for its trainer)
CHECK_WORDS = {
    "settings": "each setting the trainer keeps as an attribute (β, ε low/high, temperature, "
                "loss type, scale_rewards, ...), against its configuration",
    "advantages": "the advantages the trainer computed, against group_advantages on the step's "
                  "rewards",
    "detached": "no gradient of the loss flows into the advantages, old or reference log-probs "
                "it received (the objective holds them constant)",
    "micro-batch loss": "each micro-batch's loss value, against the reference objective of its "
                        "rows under the trainer's aggregation",
    "global counts": "the global counts passed to the loss, against the step's rows",
    "gradient": "∂(what each micro-batch back-propagated)/∂logp at every token, summed over the "
                "step and averaged over processes, against ∂J/∂logp of the documented objective",
    "metrics": "the logged metrics, against the reference's on the same tensors",
    "rank agreement": "a checksum of the parameters' gradients (Σg, Σ|g|) after the last "
                      "backward of the step, equal on every process (the all-reduce happened)",
}


class LiveDeviation(AssertionError):
    """Raised by `watch(..., strict=True)` at the first deviation."""

    def __init__(self, finding: "Finding"):
        super().__init__(finding.text())
        self.finding = finding


@dataclasses.dataclass
class Finding:
    step: int
    check: str                              # CHECKS
    grade: str                              # GRADES
    message: str
    rank: Optional[int] = None
    micro_batch: Optional[int] = None
    token: Optional[Tuple[int, ...]] = None  # (row, position) in that micro-batch
    got: Optional[float] = None
    expected: Optional[float] = None
    source: str = ""                         # the trainer's code or docs a choice cites

    def __post_init__(self):
        if self.grade not in GRADES:
            raise ValueError(f"grade is {self.grade!r}; expected one of {GRADES}")

    def where(self) -> str:
        parts = [f"step {self.step}"]
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.micro_batch is not None:
            parts.append(f"micro-batch {self.micro_batch}")
        if self.token is not None:
            parts.append("token " + ", ".join(str(i) for i in self.token))
        return ", ".join(parts)

    def text(self) -> str:
        vals = ""
        if self.got is not None:
            vals = f" (trainer {self.got:.9g}, reference {self.expected:.9g})"
        cite = f" [{self.source}]" if self.source else ""
        return f"{self.grade}: {self.check}, {self.where()}: {self.message}{vals}{cite}"

    def as_json(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("got", "expected"):
            if d[k] is not None and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


@dataclasses.dataclass
class StepResult:
    """One checked optimizer step: per check, how many comparisons ran and how many failed."""
    step: int
    counts: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # check: [n, fails]
    max_rel_err: float = 0.0
    findings: List[Finding] = dataclasses.field(default_factory=list)
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)     # check: why not run

    def count(self, check: str, n: int, fails: int, rel: float = 0.0) -> None:
        if n == 0 and fails == 0:
            return              # nothing compared: the check did not run at this step
        c = self.counts.setdefault(check, [0, 0])
        c[0] += n
        c[1] += fails
        if math.isfinite(rel):
            self.max_rel_err = max(self.max_rel_err, rel)
        else:
            self.max_rel_err = math.inf

    @property
    def deviations(self) -> List[Finding]:
        return [f for f in self.findings if f.grade == "deviation"]

    def line(self) -> str:
        parts = []
        for check in CHECKS:
            if check in self.counts:
                n, bad = self.counts[check]
                parts.append(f"{check} {'ok' if not bad else f'{bad} FAILED'} ({n})")
            elif check in self.skipped:
                parts.append(f"{check} not checked")
        verdict = "DEVIATES" if self.deviations else "conforms"
        notes = len(self.findings) - len(self.deviations)
        tail = f", {plural(notes, 'note')}" if notes else ""
        return (f"crosscheck step {self.step}: {verdict}: " + "; ".join(parts)
                + f"; max rel err {self.max_rel_err:.2g}{tail}")


@dataclasses.dataclass
class Report:
    trainer: str
    config: List[Tuple[str, object, str]]           # (setting, value, where it is read)
    objective: str                                  # the documented objective, in words
    precision: str                                  # the tolerance row the run is judged at
    every: int
    world: int
    not_expressed: List[str] = dataclasses.field(default_factory=list)
    steps: List[StepResult] = dataclasses.field(default_factory=list)
    seconds: float = 0.0                            # time spent in the audit's own code
    errors: List[str] = dataclasses.field(default_factory=list)   # the audit's own, run went on
    # what the watcher compares (check: words) and what it takes as given without checking
    words: Dict[str, str] = dataclasses.field(default_factory=lambda: dict(CHECK_WORDS))
    trusted: List[str] = dataclasses.field(default_factory=list)
    not_applicable: Dict[str, str] = dataclasses.field(default_factory=dict)  # check: why

    @property
    def findings(self) -> List[Finding]:
        return [f for s in self.steps for f in s.findings]

    @property
    def deviations(self) -> List[Finding]:
        return [f for f in self.findings if f.grade == "deviation"]

    def _why_not(self, check: str) -> str:
        whys = sorted({s.skipped[check] for s in self.steps if check in s.skipped})
        return "; ".join(whys) if whys else ("no step was checked" if not self.steps else
                                             "no step reached it")

    @property
    def inconclusive(self) -> Optional[str]:
        """Why no verdict can be given, or None: a check that carries the verdict (CARRIERS)
        ran on no sampled step."""
        missing = [c for c in CARRIERS if not any(c in s.counts for s in self.steps)]
        if not missing:
            return None
        why = "; ".join(f"{c} checked at no sampled step ({self._why_not(c)})" for c in missing)
        if self.errors:
            why += f"; {plural(len(self.errors), 'audit error')}"
        return why

    @property
    def ok(self) -> Optional[bool]:
        """False: a deviation; True: none, and the micro-batch loss and the gradient were each
        checked on at least one sampled step; None (INCONCLUSIVE): either never ran."""
        if self.deviations:
            return False
        return None if self.inconclusive else True

    def verdict(self) -> str:
        return {True: "CONFORMS", False: "DEVIATES", None: "INCONCLUSIVE"}[self.ok]

    def checked(self) -> List[str]:
        """Each check, what it compares, and on how many steps it ran (or why it did not)."""
        out = []
        for check in CHECKS:
            ran = [s.counts[check] for s in self.steps if check in s.counts]
            if ran:
                out.append(f"{check}: {self.words.get(check, check)} "
                           f"({sum(n for n, _ in ran)} comparisons on "
                           f"{plural(len(ran), 'step')})")
            elif check in self.not_applicable:
                out.append(f"{check}: not applicable ({self.not_applicable[check]})")
            elif any(check in s.skipped for s in self.steps) or check in CARRIERS:
                out.append(f"{check}: not checked ({self._why_not(check)})")
        return out

    def text(self) -> str:
        lines = [f"crosscheck live audit: {self.trainer}: {self.verdict()}"]
        if self.ok is None:
            lines += [f"  inconclusive: {self.inconclusive}"]
        lines += [
                 f"  {plural(len(self.steps), 'step')} checked (every {self.every}), "
                 f"{plural(self.world, 'process')}; judged at "
                 f"{self.precision or 'no tolerance row (nothing compared)'}; the audit's own "
                 f"time {self.seconds:.3g} s",
                 f"  objective: {self.objective}"]
        lines += ["  config:"] + [f"    {k} = {v!r}  ({src})" for k, v, src in self.config]
        lines += ["  checked:"] + [f"    {c}" for c in self.checked()]
        if self.trusted:
            lines += ["  trusted without checking:"] + [f"    {t}" for t in self.trusted]
        if self.not_expressed:
            lines += ["  not checked (the reference cannot express it):"]
            lines += [f"    {w}" for w in self.not_expressed]
        lines += ["  steps:"] + [f"    {s.line()}" for s in self.steps]
        if self.errors:
            lines += ["  audit errors (those steps are unchecked; the run went on):"]
            lines += [f"    {e}" for e in self.errors]
        by_grade = {g: [f for f in self.findings if f.grade == g] for g in GRADES}
        for g in GRADES:
            if by_grade[g]:
                lines += [f"  {g} ({len(by_grade[g])}):"]
                lines += [f"    {f.text()}" for f in by_grade[g][:20]]
                if len(by_grade[g]) > 20:
                    lines += [f"    ... and {len(by_grade[g]) - 20} more"]
        return "\n".join(lines)

    def as_json(self) -> dict:
        return {
            "trainer": self.trainer, "verdict": self.verdict(), "ok": self.ok,
            "inconclusive": self.inconclusive if self.ok is None else None,
            "checked": self.checked(), "trusted": list(self.trusted),
            "every": self.every, "world": self.world, "precision": self.precision,
            "objective": self.objective, "seconds": self.seconds,
            "config": [{"setting": k, "value": v if isinstance(v, (int, float, str, bool,
                                                                    type(None))) else repr(v),
                        "source": s} for k, v, s in self.config],
            "not_expressed": list(self.not_expressed), "errors": list(self.errors),
            "steps": [{"step": s.step, "counts": {k: {"checked": n, "failed": b}
                                                  for k, (n, b) in s.counts.items()},
                       "skipped": dict(s.skipped),
                       "max_rel_err": s.max_rel_err if math.isfinite(s.max_rel_err) else "inf",
                       "findings": [f.as_json() for f in s.findings]} for s in self.steps],
        }

    def json(self) -> str:
        return json.dumps(self.as_json(), indent=2)
