"""A trainer's report card: its own functions, each audited against a reference.

A trainer module (crosscheck/trainer/<name>.py) declares a `Trainer`: where its math lives, the
rows (one per piece of math: the trainer's function, the reference and conventions it is judged
against, an adapter that only renames and reshapes, the adapter's choices in words, and what we
know of deviations the trainer ships on purpose or by mistake), and the inventory (which of its
functions count, so that those without a reference are listed as not covered).

`run(trainer, path=None, cases=..., seed=...)` loads the code (crosscheck.trainer.loading), runs
every row through `crosscheck.audit.audit` and returns a `Card`, printable as text, Markdown or
JSON.

Every finding is graded (crosscheck.audit.model.GRADES):
- a **deviation**: on inputs the trainer produces, beyond its training precision. It is *known*
  when one of the row's `Known` entries reproduces it: the row re-audited under that entry's
  variant (reference conventions, a transform of the reference's inputs, the micro-batch
  model, a wrapper of the adapted function) passes the failing check on every case and breaks
  no check that passed. Otherwise it is new and unexplained, whatever the check;
- a **robustness** note: only on garbage padding (the audit's robustness check), or a known
  entry of that kind reproduces it;
- a **precision** note: every failing case lies within the float32 row and the trainer trains
  at float32 (or a known entry of that kind reproduces it);
- a **documented choice**: a known entry of that kind, with its citation, reproduces it.

A row's verdict: DOES NOT CONFORM (a new deviation), KNOWN DEVIATION (only reproduced known
deviations), CONFORMS (notes at most), INCONCLUSIVE, COULD NOT ADAPT (the adapter's assumptions
do not hold in this version, or every case raised), NOT IN THIS VERSION (the function or its
module is absent). The card's exit code is 1 only for a new deviation, so that CI can gate on it.
"""
import ast
import contextlib
import functools
import inspect
import os
import re
import sys
import textwrap
import time
import types
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..audit.model import GRADES, end_progress, show_progress
from . import loading

CASES = 48                     # cases per row: past the offset, extreme-ratio and empty-batch cases
# a known entry's kind, and the grade a finding it reproduces gets
KINDS = {"documented choice": "documented choice", "defect": "deviation",
         "robustness": "robustness", "precision": "precision"}
VARIANT_KEYS = ("conventions", "audit", "inputs", "microbatch", "adapt")


@dataclass(frozen=True)
class Known:
    """A deviation we know this trainer has, found at `check`: a documented choice (its docs or
    config say so, `cite` quotes where), a defect, a robustness or a precision matter; `what`
    says what differs and when it bites, citing the code.

    `variant` is how the known behaviour is reproduced, so that it explains a failure only if it
    reproduces it: any of "conventions" (reference conventions over the row's), "audit" (audit
    keywords over the row's), "inputs" (a function of the data returning what the reference is
    given), "microbatch" ("local": each micro-batch normalised by its own counts), "adapt" (a
    function wrapping the adapted callable). An entry without a variant explains nothing; it
    only annotates a robustness or precision note found at its check."""
    check: str
    kind: str
    what: str
    variant: Mapping[str, object] = field(default_factory=dict)
    cite: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Known.kind is {self.kind!r}; expected one of {', '.join(KINDS)}")
        unknown = set(self.variant) - set(VARIANT_KEYS)
        if unknown:
            raise ValueError(f"Known.variant has {', '.join(sorted(unknown))}; expected keys "
                             f"among {', '.join(VARIANT_KEYS)}")

    @property
    def grade(self) -> str:
        return KINDS[self.kind]


@dataclass(frozen=True)
class Row:
    function: str                      # "module:qualname" (module dotted, qualname in it)
    ref: str                           # a registry name
    adapt: Callable                    # adapt(trainer_function) -> the audited callable
    choices: Tuple[str, ...] = ()      # what the adapter decides, in words (printed on the card)
    label: str = ""                    # tells rows of one function apart ("token-mean", "ppo_kl")
    conventions: Mapping[str, object] = field(default_factory=dict)   # over the profile's
    audit: Mapping[str, object] = field(default_factory=dict)        # audit() keywords
    params: Tuple[str, ...] = ()       # the trainer's parameters the adapter passes by name
    known: Tuple[Known, ...] = ()
    block: Optional[tuple] = None      # (first, last, outputs[, nested]): a statement block of
    # the function, run by crosscheck.trainer.blocks, not the function
    # the same block as earlier releases wrote it, tried in order where `block` is not found:
    # ((first, last, outputs[, nested]), the adapter's choice for those releases, in words), ...
    older_blocks: Tuple[Tuple[tuple, str], ...] = ()
    # compose(data) -> data: the reference composition a composing function is judged against,
    # as a transform of the reference's inputs by other references (ms-swift's FIPO loss: PPO's
    # objective with each advantage times fipo_influence_weights); None: the reference itself
    compose: Optional[Callable] = None
    fits: Optional[Callable] = None    # fits(function): raises DoesNotFit / NotInVersion when an
    # assumption of the adapter does not hold in this version (a mode the version lacks); or
    # returns what this version needs: {"conventions": {...} (a hard-coded aggregation),
    # "domain": (...) (inputs it cannot take), "audit": {...} (audit keywords, e.g. the
    # accumulation this version's trainer applies), "choice": the adapter's choice in words}

    @property
    def module(self) -> str:
        return self.function.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.function.partition(":")[2]

    @property
    def name(self) -> str:
        return self.qualname + (f" [{self.label}]" if self.label else "")


@dataclass(frozen=True)
class Trainer:
    name: str
    package: str                       # the import name
    dist: str                          # the distribution on the package index
    profile: str                       # the audit profile its rows are judged under
    pinned: str                        # the version CI installs and the published card is of
    modules: Tuple[str, ...]           # the math modules to load
    rows: Tuple[Row, ...]
    inventory: Tuple[Tuple[str, str], ...]   # (module, regex on "function" or "Class.method")
    version_file: Optional[str] = None  # a version file inside the package folder
    installable: bool = True           # False: a checkout only (--path required)
    # the libraries its math modules import that CI installs beside it (`dist==version`, with
    # --no-deps like the trainer: a trainer's own pins could replace torch)
    requires: Tuple[str, ...] = ()
    # modules of loading.ALWAYS_STAND_IN its math needs for real (imported where installed)
    real: Tuple[str, ...] = ()
    # installed modules its math never uses, stood in to save their import time (a dotted name:
    # a submodule of a library that is otherwise real, torch.utils.tensorboard)
    stand_in: Tuple[str, ...] = ()
    # environment variables set while its card runs ((name, value), ...): "{tmp}" is a
    # temporary directory (ROLL writes log files at import, under ROLL_LOG_DIR)
    environ: Tuple[Tuple[str, str], ...] = ()
    # its math modules loaded by file even when installed (loading.Loaded.by_file)
    by_file: bool = False
    not_covered_why: str = "no reference function yet"
    # a function of the inventory not covered for its own reason: ((qualname, why), ...)
    not_run: Tuple[Tuple[str, str], ...] = ()
    notes: Tuple[str, ...] = ()
    # the precision its losses train at (bf16 models, float32 losses): a difference within that
    # row of the tolerance table is a precision note
    precision: str = "float32"
    # the branches and conventions the rows run, and those they do not, in words
    runs: Tuple[str, ...] = ()
    does_not_run: Tuple[str, ...] = ()
    # modules holding the trainer's registries as dict literals, name -> what the configuration
    # selects: a dotted path as a string (Trinity's Registry(default_mapping={...})) or a class
    # the module imports (prime-rl's ALGORITHM_CLASSES); each entry needs a row or a reason
    registries: Tuple[str, ...] = ()
    # domain(source): DOMAINS tags (crosscheck.audit.profiles) that every row's inputs lie in
    # for this release, with the reason in words: ((tag, ...), why), or None
    domain: Optional[Callable] = None
    # False: the rows run in one process even where the command line would fork a second (a
    # JAX trainer compiles each function once per process, and JAX's threads do not survive
    # a fork)
    fork: bool = True

    def version_of(self, root):
        return loading.version_of(root, os.path.join(self.package, self.version_file)) \
            if self.version_file else None


@dataclass
class RowResult:
    row: Row
    file: str
    line: Optional[int]
    verdict: str               # one of ROW_VERDICTS
    conventions: Dict[str, object] = field(default_factory=dict)
    reason: str = ""                   # could not adapt: why; inconclusive: why
    findings: List[dict] = field(default_factory=list)   # each failing check, in order
    end_line: Optional[int] = None     # a statement block's last line
    report: Optional[object] = None    # the AuditReport
    seconds: float = 0.0
    adapted: str = ""                  # what the adapter adjusted to this version, in words

    @property
    def choices(self) -> List[str]:
        return list(self.row.choices) + ([self.adapted] if self.adapted else [])

    @property
    def finding(self) -> Optional[dict]:
        return self.findings[0] if self.findings else None


ROW_VERDICTS = ("CONFORMS", "KNOWN DEVIATION", "DOES NOT CONFORM", "INCONCLUSIVE",
                "COULD NOT ADAPT", "NOT IN THIS VERSION")
NEW = ("a new deviation: not one we know this trainer to make; treat it as a defect until its "
       "code or documentation shows it is a choice")
NOT_RUN = ("COULD NOT ADAPT", "NOT IN THIS VERSION")


@dataclass
class Card:
    trainer: Trainer
    source: loading.Source
    loaded: List[str]
    rows: List[RowResult]
    not_covered: List[Tuple[str, str, int]]         # (file, function, line)
    cases: int
    seed: int
    seconds: float = 0.0
    failed_modules: Dict[str, str] = field(default_factory=dict)
    comparison: Optional[object] = None     # against a baseline (crosscheck.trainer.baseline)
    # a not-covered function's reason found by the card itself (a registered function new in
    # this release), over the trainer's `not_run`
    why: Dict[str, str] = field(default_factory=dict)
    path: Optional[str] = None              # the checkout it was run on (None: installed)

    def reason(self, qualname: str) -> Optional[str]:
        """Why a not-covered function has no row, where it has its own reason (else the
        trainer's `not_covered_why` holds)."""
        return self.why.get(qualname) or dict(self.trainer.not_run).get(qualname)

    def against(self, baseline_cards: Mapping[str, dict], source: str) -> "Card":
        """This card compared with the baseline's card of its trainer (none: every deviation is
        new since it); the exit code then gates only on new deviations new since it."""
        from .. import tolerances
        from .baseline import card_signatures, changed, compare
        results = {r.row.name: r for r in self.rows}
        tol = tolerances.get("audit", self.trainer.precision)
        held = set(card_signatures(baseline_cards.get(self.trainer.name) or {}))
        # rows whose deviations the baseline holds, run in a forked child (their replay hook
        # stayed there): run again here, so that their counterexamples can be replayed
        again = sorted({r.row.name for r, f in self.graded()["deviation"]
                        if f["signature"] in held and r.report is not None and
                        getattr(r.report, "replay", None) is None})
        if again:
            rerun = run(self.trainer, path=self.path, cases=self.cases, seed=self.seed,
                        only=again)
            results.update({r.row.name: r for r in rerun.rows})

        def replayed(name, saved):
            r = results.get(name)
            return changed(getattr(r.report, "replay", None) if r else None, saved, tol)
        self.comparison = compare([(r.row.name, f) for r, f in self.graded()["deviation"]],
                                  baseline_cards.get(self.trainer.name), source, replayed)
        return self

    @property
    def covered(self) -> List[RowResult]:
        return [r for r in self.rows if r.verdict not in NOT_RUN]

    def functions(self) -> Tuple[int, int]:
        """(functions with at least one row that ran, functions in the inventory)."""
        ran = {(r.file, r.row.qualname) for r in self.covered}
        listed = {(r.file, r.row.qualname) for r in self.rows} | \
            {(f, q) for f, q, _ in self.not_covered}
        return len(ran), len(listed)

    @property
    def verdict(self) -> str:
        """DOES NOT CONFORM: a new deviation; KNOWN DEVIATIONS: only reproduced known ones;
        NOTHING AUDITED: no row ran; INCOMPLETE: a row could not run or was inconclusive;
        CONFORMS otherwise (notes at most)."""
        verdicts = {r.verdict for r in self.rows}
        if "DOES NOT CONFORM" in verdicts:
            return "DOES NOT CONFORM"
        if not self.covered:
            return "NOTHING AUDITED"
        if "KNOWN DEVIATION" in verdicts:
            return "KNOWN DEVIATIONS"
        if verdicts - {"CONFORMS"}:
            return "INCOMPLETE"
        return "CONFORMS"

    @property
    def exit_code(self) -> int:
        """1 for a new deviation (a regression gate for CI), 2 when nothing could be audited,
        else 0: known deviations, notes and rows that could not run are on the card. Against a
        baseline, 1 only for a new deviation the baseline does not hold."""
        if self.comparison is not None and self.verdict != "NOTHING AUDITED":
            return int(self.comparison.gates)
        return {"DOES NOT CONFORM": 1, "NOTHING AUDITED": 2}.get(self.verdict, 0)

    def graded(self) -> Dict[str, List[Tuple[RowResult, dict]]]:
        """The findings by grade (deviations new and known, then the notes)."""
        out: Dict[str, List[Tuple[RowResult, dict]]] = {g: [] for g in GRADES}
        for r in self.rows:
            for f in r.findings:
                out[f["grade"]].append((r, f))
        return out

    # ---- rendering ---------------------------------------------------------------------
    def _head(self) -> List[str]:
        t, s = self.trainer, self.source
        ran, listed = self.functions()
        return [
            f"{t.name} {s.version} ({s.origin} at {s.root})",
            f"loaded: {'; '.join(self.loaded)}",
            f"judged under the {t.profile} profile, {self.cases} cases per row, seed {self.seed}",
            f"coverage: {ran} of {listed} functions ({100 * ran / max(listed, 1):.0f} %) have a "
            f"reference and ran; {len(self.not_covered)} not covered"
            + "".join(f", {n} {what}" for n, what in (
                (sum(r.verdict == "COULD NOT ADAPT" for r in self.rows), "could not be adapted"),
                (sum(r.verdict == "NOT IN THIS VERSION" for r in self.rows),
                 "not in this version")) if n),
        ]

    @staticmethod
    def _conv(r: RowResult) -> str:
        return f"{r.row.ref}(" + ", ".join(f"{k}={v!r}" for k, v in r.conventions.items()) + ")"

    def text(self) -> str:
        lines = [f"report card: {self._head()[0]}"] + [f"  {h}" for h in self._head()[1:]]
        by_file: Dict[str, List[RowResult]] = {}
        for r in self.rows:
            by_file.setdefault(r.file, []).append(r)
        width = max([len(r.row.name) for r in self.rows] + [8])
        for f, rows in by_file.items():
            lines.append("")
            lines.append(f)
            for r in rows:
                where = (f"l.{r.line}" + (f"-{r.end_line}" if r.end_line else "")) if r.line \
                    else "    "
                lines.append(f"  {r.row.name:<{width}}  {where:>7}  {r.verdict}"
                             + (f" ({r.report.n_cases} of {r.report.n_drawn} cases ran)"
                                if r.report is not None else ""))
                lines.append(f"  {'':<{width}}           against {self._conv(r)}"
                             if r.verdict not in NOT_RUN else
                             f"  {'':<{width}}           {r.verdict.lower()}: {r.reason}")
                if r.verdict == "INCONCLUSIVE":
                    lines.append(f"  {'':<{width}}           why: {r.reason}")
        for title, items in self._sections():
            lines += ["", title]
            for r, f in items:
                lines += [f"  {r.row.name} ({r.file}:{r.line}), check {f['check']}"
                          f"{self._since(f)}:",
                          f"    what differs: {f['message']}"]
                if f.get("diagnosis"):
                    lines.append(f"    likely: {f['diagnosis']}")
                if f.get("counterexample"):
                    lines.append("    minimal counterexample (the inputs as passed, padding "
                                 "included):")
                for k, v in (f.get("counterexample") or {}).items():
                    lines.append(f"      {k}: {v}")
                lines.append(f"    {f['explanation']}")
        choices = [r for r in self.rows if r.row.choices or r.adapted]
        if choices:
            lines += ["", "adapter choices (each adapter only renames and reshapes)"]
            for r in choices:
                lines.append(f"  {r.row.name}: " + "; ".join(r.choices))
        if self.not_covered:
            lines += ["", f"not covered ({self.trainer.not_covered_why})"]
            by: Dict[str, List[str]] = {}
            for f, q, line in self.not_covered:
                why = self.reason(q)
                by.setdefault(f, []).append(f"{q} (l.{line})" + (f" [{why}]" if why else ""))
            for f, names in by.items():
                lines.append(f"  {f}: " + ", ".join(names))
        for m, why in self.failed_modules.items():
            lines.append(f"  module {m} could not be loaded: {why}")
        lines += [f"note: {n}" for n in self.trainer.notes]
        if self.trainer.runs or self.trainer.does_not_run:
            lines += ["", "branches"] + [f"  runs: {b}" for b in self.trainer.runs] + \
                [f"  does not run: {b}" for b in self.trainer.does_not_run]
        lines.append(self._grades_line())
        lines.append(f"card verdict: {self.verdict}" + self._tally())
        lines += self._baseline_lines()
        return "\n".join(lines)

    def _since(self, f) -> str:
        """" [new since the baseline]" or " [in the baseline]" for a deviation, against one."""
        if self.comparison is None or f["grade"] != "deviation":
            return ""
        held = {id(g) for _, g in self.comparison.held}
        return " [in the baseline]" if id(f) in held else " [new since the baseline]"

    def _baseline_lines(self) -> List[str]:
        b = self.comparison
        if b is None:
            return []
        lines = [f"against the baseline {b.source}" + (f" ({self.trainer.name} {b.version})"
                                                       if b.version else
                                                       f" (it holds no {self.trainer.name} card)")
                 + f": {self._baseline_tally()}"]
        for title, items in (("new since the baseline",
                              [(r, f["signature"] + (f" ({f['since']})" if f.get("since")
                                                     else "")) for r, f in b.new]),
                             ("in the baseline", [(r, f["signature"]) for r, f in b.held]),
                             ("fixed (in the baseline, no longer found)",
                              [(g["row"], g["signature"]) for g in b.gone])):
            if items:
                lines.append(f"  {title}:")
                lines += [f"    {sig}" for _, sig in items]
        return lines

    def _baseline_tally(self) -> str:
        b = self.comparison
        return (f"{sum(not f['known'] for _, f in b.new)} new deviation(s) new since it, "
                f"{sum(f['known'] for _, f in b.new)} known deviation(s) new since it, "
                f"{len(b.held)} in it, {len(b.gone)} fixed")

    def _sections(self):
        """(title, [(row, finding)]) for each grade that has findings, new deviations first."""
        g = self.graded()
        new = [(r, f) for r, f in g["deviation"] if not f["known"]]
        known = [(r, f) for r, f in g["deviation"] if f["known"]]
        out = [("new deviations (unexplained: each one counts toward the verdict)", new),
               ("known deviations (each reproduced by its known variant)", known),
               ("documented choices (each reproduced by the documented variant)",
                g["documented choice"]),
               ("surrogate conventions (the value of a surrogate loss; its gradient is judged)",
                g["surrogate convention"]),
               (f"precision notes (below {self.trainer.precision} training precision)",
                g["precision"]),
               ("robustness notes (only on inputs the trainer never produces)",
                g["robustness"])]
        return [(t, items) for t, items in out if items]

    def grade_counts(self) -> Dict[str, int]:
        g = self.graded()
        return {"new deviation": sum(not f["known"] for _, f in g["deviation"]),
                "known deviation": sum(f["known"] for _, f in g["deviation"]),
                **{k: len(v) for k, v in g.items() if k != "deviation"}}

    def _grades_line(self) -> str:
        plural = {"robustness": "robustness notes", "precision": "precision notes"}
        return "findings: " + ", ".join(
            f"{n} " + (plural.get(k, k + "s") if n != 1 else
                       k + " note" if k in plural else k)
            for k, n in self.grade_counts().items()
            if n or k != "surrogate convention")      # named where a card has one

    def summary(self) -> str:
        """The card in one line: trainer, version, verdict, row tally and graded findings."""
        return (f"{self.trainer.name} {self.source.version}: {self.verdict}{self._tally()}; "
                f"{self._grades_line()}" + (f"; against the baseline: {self._baseline_tally()}"
                                            if self.comparison is not None else ""))

    def _tally(self) -> str:
        counts: Dict[str, int] = {}
        for r in self.rows:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
        return " (" + ", ".join(f"{n} {v.lower()}" for v, n in counts.items()) + ")"

    def markdown(self) -> str:
        t = self.trainer
        head = self._head()
        out = [f"# Report card: {t.name} {self.source.version}", "",
               "Generated by `python -m crosscheck trainer " + t.name +
               " --markdown`; do not edit by hand.", ""]
        out += [f"- {h}" for h in head[1:]] + [f"- {self._grades_line()}",
                                                f"- card verdict: **{self.verdict}**" +
                                                self._tally(), ""]
        out += ["| function | file:line | reference (conventions) | verdict |",
                "|---|---|---|---|"]
        for r in self.rows:
            ref = self._conv(r) if r.verdict not in NOT_RUN else \
                f"{r.verdict.lower()}: {r.reason}"
            ran = f" ({r.report.n_cases}/{r.report.n_drawn} cases)" if r.report else ""
            out.append(f"| `{r.row.name}` | {r.file}:{r.line or '?'} | `{ref}` | "
                       f"{r.verdict}{ran} |")
        for title, items in self._sections():
            out += ["", f"## {title[0].upper()}{title[1:]}", ""]
            for r, f in items:
                out += [f"### `{r.row.name}`: {f['check']}", "",
                        f"- what differs: {f['message']}"]
                if f.get("diagnosis"):
                    out.append(f"- likely: {f['diagnosis']}")
                ce = f.get("counterexample") or {}
                if ce:
                    out.append("- minimal counterexample (the inputs as passed, padding "
                               "included):")
                    out += [f"  - {k}: `{v}`" for k, v in ce.items()]
                out += [f"- {f['explanation']}", ""]
        if t.runs or t.does_not_run:
            out += ["", "## Branches", ""]
            out += [f"- runs: {b}" for b in t.runs] + [f"- does not run: {b}"
                                                       for b in t.does_not_run]
        choices = [r for r in self.rows if r.row.choices or r.adapted]
        if choices:
            out += ["", "## Adapter choices", ""]
            out += [f"- `{r.row.name}`: " + "; ".join(r.choices) for r in choices]
        if self.not_covered:
            out += ["", f"## Not covered ({t.not_covered_why})", ""]
            out += [f"- `{q}` ({f}:{line})" + (f": {self.reason(q)}" if self.reason(q)
                                               else "") for f, q, line in self.not_covered]
        if t.notes:
            out += ["", "## Notes", ""] + [f"- {n}" for n in t.notes]
        return "\n".join(out) + "\n"

    def to_dict(self):
        from ..bridge import json_safe
        ran, listed = self.functions()
        return json_safe(dict(
            trainer=self.trainer.name, version=self.source.version, origin=self.source.origin,
            root=self.source.root, loaded=self.loaded, profile=self.trainer.profile,
            cases=self.cases, seed=self.seed, verdict=self.verdict, ok=self.exit_code == 0,
            exit_code=self.exit_code, grades=self.grade_counts(),
            branches=dict(runs=list(self.trainer.runs),
                          does_not_run=list(self.trainer.does_not_run)),
            coverage=dict(functions_run=ran, functions=listed,
                          ratio=ran / max(listed, 1)),
            rows=[dict(function=r.row.qualname, label=r.row.label, file=r.file, line=r.line,
                       ref=r.row.ref, conventions=r.conventions, verdict=r.verdict,
                       reason=r.reason, choices=r.choices,
                       cases_run=None if r.report is None else r.report.n_cases,
                       findings=r.findings,
                       seconds=round(r.seconds, 3))
                  for r in self.rows],
            not_covered=[dict(file=f, function=q, line=line,
                              why=self.reason(q) or self.trainer.not_covered_why)
                         for f, q, line in self.not_covered],
            failed_modules=self.failed_modules, seconds=round(self.seconds, 3),
            **({} if self.comparison is None else {"baseline": self.comparison.to_dict()})))


# ---- the inventory -------------------------------------------------------------------------

def _definitions(path: str) -> Dict[str, int]:
    """{"function" or "Class.method": line} for a source file's top-level definitions (parsed
    once per version of the file)."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return {}
    return dict(_parsed_definitions(path, stamp))


@functools.lru_cache(maxsize=64)
def _parsed_definitions(path: str, stamp: int) -> Tuple[Tuple[str, int], ...]:
    return tuple(_read_definitions(path).items())


def _read_definitions(path: str) -> Dict[str, int]:
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node.lineno
        elif isinstance(node, ast.ClassDef):
            out[node.name] = node.lineno
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{sub.name}"] = sub.lineno
    return out


def _registered(path: str) -> Dict[str, Tuple[int, str]]:
    """{"function" or "Class": (line, decorator)} for a source file's top-level definitions
    that a registry decorator adds to a registry (`@register_policy_loss("x")`,
    `@register_adv_est(...)`, `@POLICY_LOSS_FN.register_module("x")`): what the trainer's
    configuration can select, whether or not a card knows it."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return {}
    return dict(_parsed_registered(path, stamp))


@functools.lru_cache(maxsize=64)
def _parsed_registered(path: str, stamp: int) -> Tuple[Tuple[str, Tuple[int, str]], ...]:
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError):
        return ()
    out = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            name = target.attr if isinstance(target, ast.Attribute) else \
                getattr(target, "id", "")
            if "register" in name.lower():
                out.setdefault(node.name, (node.lineno, ast.unparse(deco)))
    return tuple(out.items())


def _registry_entries(path: str, module: str, package: str) -> List[Tuple[str, str, str]]:
    """(key, module, name) for each entry of the dict literals in a registry module whose keys
    are strings and whose values name something of the trainer's package: a dotted path
    "package.mod.Name", or a name the module imports from the package."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError):
        return []
    here = module.split(".")
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:               # relative to the registry's package (an __init__)
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                imported[alias.asname or alias.name] = base
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                continue
            if isinstance(v, ast.Constant) and isinstance(v.value, str) and \
                    v.value.startswith(package + ".") and "." in v.value[len(package) + 1:]:
                target, _, name = v.value.rpartition(".")
                out.append((k.value, target, name))
            elif isinstance(v, ast.Name) and imported.get(v.id, "").startswith(package + "."):
                out.append((k.value, imported[v.id], v.id))
    return out


NEW_IN_REGISTRY = ("new in this release: registered as {key!r} in {registry} (what the "
                   "trainer's configuration can select) and unknown to this card: no row, no "
                   "reason")
NEW_IN_RELEASE = ("new in this release: registered with @{deco} (a function the trainer's "
                  "configuration can select) and unknown to this card: no row, no reason")


class StandInSelf(types.SimpleNamespace):
    """A stand-in `self` (or config) for a method called unbound: reading an attribute it does
    not hold raises an AttributeError that names it, so that a version reading a field the
    adapter does not know shows as 'could not adapt', never as a deviation."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"the card's stand-in self has no {name!r}, which this version "
                             f"reads")


def source_of(fn) -> str:
    """The source of a trainer's function (through its decorators), dedented: what an adapter
    reads to check its assumptions; DoesNotFit where it cannot be read."""
    try:
        return textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    except (OSError, TypeError) as exc:
        raise DoesNotFit(f"the source of {getattr(fn, '__qualname__', fn)} cannot be read "
                         f"({exc})")


def unpacked(fn, method: str) -> int:
    """How many values `fn`'s source unpacks from its call of `self.<method>(...)` (1 where it
    does not unpack); DoesNotFit where it never calls it."""
    for node in ast.walk(ast.parse(source_of(fn))):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Attribute) and node.value.func.attr == method:
            target = node.targets[0]
            return len(target.elts) if isinstance(target, (ast.Tuple, ast.List)) else 1
    raise DoesNotFit(f"{getattr(fn, '__qualname__', fn)} does not call self.{method}(...) in "
                     f"this version")


def per_token(call, mask, *tensors):
    """A [B, T] map of a function that aggregates inside, evaluated one valid token at a time
    (a [1, 1] batch, where every aggregation is the identity); 0 at masked positions."""
    import torch
    B, T = mask.shape
    rows = []
    for b in range(B):
        row = [call(*(x[b:b + 1, t:t + 1] for x in tensors)).reshape(())
               if bool(mask[b, t]) else tensors[0].new_zeros(()) for t in range(T)]
        rows.append(torch.stack(row) if row else tensors[0].new_zeros((0,)))
    return torch.stack(rows) if rows else tensors[0].new_zeros((0, T))


def zero_padding(mask, x):
    """x with 0 at masked positions: a trainer's output read at the valid tokens, or an input
    given as a trainer's batch holds it (finite at padding)."""
    return x.where(mask.bool(), x.new_zeros(()))


def per_sequence(advantages, like):
    """Adapters' broadcast: a per-sequence advantage [B] over the response, as trainers store
    it ([B, T] passes through)."""
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def owner_class(method):
    """The class a method was defined on (PolicyLoss for PolicyLoss.forward), through any
    decorator that wraps it (torch.no_grad)."""
    inner = inspect.unwrap(method)
    return inner.__globals__[inner.__qualname__.split(".")[0]]


EAGER = ("the function torch.compile wraps, run eagerly: the same statements without a compiler "
         "(compiling costs seconds per call shape on a CPU)")


def eager(fn):
    """The Python function a `torch.compile` wrapper compiles (its `_torchdynamo_orig_callable`),
    else fn itself."""
    inner = getattr(fn, "_torchdynamo_orig_callable", None)
    return inner if callable(inner) else fn


def _resolve(module, qualname: str):
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# ---- running -------------------------------------------------------------------------------

def _progress(stream, i, n, name):
    show_progress(stream, f"[{i}/{n}] {name}")


class DoesNotFit(Exception):
    """An assumption of a row's adapter does not hold in this version (raised by Row.fits)."""


class NotInVersion(Exception):
    """What a row audits does not exist in this version (raised by Row.fits)."""


def run_row(row: Row, loaded: loading.Loaded, source: loading.Source, profile: str, cases: int,
            seed: int, precision: str = "float32", domain=None) -> RowResult:
    """One row's result. `domain`: ((DOMAINS tags, ...), why) that hold for every row of this
    release (Trainer.domain), or None."""
    from ..audit import audit
    from ..audit.api import resolve_conventions
    from ..audit.model import AuditUsageError

    path = source.file(row.module)
    rel = source.relative(path)
    line = _definitions(path).get(row.qualname)
    result = RowResult(row, rel, line, "COULD NOT ADAPT")
    if not os.path.exists(path):
        result.verdict, result.reason = "NOT IN THIS VERSION", f"{rel} does not exist"
        return result
    older = ""
    if row.block is not None:
        from .blocks import BlockNotFound, compile_block
        absent, first_error = True, None
        for block, note in ((row.block, ""),) + tuple(row.older_blocks):
            try:
                fn, result.line, result.end_line = compile_block(path, row.qualname, *block)
            except (OSError, SyntaxError, BlockNotFound) as exc:
                absent = absent and getattr(exc, "absent", False)
                first_error = first_error or exc
                continue
            older = note
            break
        else:
            result.reason = str(first_error)
            if absent:         # no release's form of the block: this version lacks it
                result.verdict = "NOT IN THIS VERSION"
            return result
    else:
        try:
            module = loaded.module(row.module)
        except (ImportError, KeyError) as exc:
            result.reason = f"{row.module} did not load ({exc})"
            return result
        try:
            fn = _resolve(module, row.qualname)
        except AttributeError:
            result.verdict = "NOT IN THIS VERSION"
            result.reason = f"{row.qualname} is not defined in {rel}"
            return result
    uncompiled = eager(fn)
    if uncompiled is not fn:
        fn, older = uncompiled, "; ".join(c for c in (older, EAGER) if c)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    missing = [p for p in row.params if p not in params]
    if missing:
        result.reason = (f"the signature changed: {row.qualname} has no parameter "
                         f"{', '.join(missing)} (it takes {', '.join(params) or 'nothing'})")
        return result
    fit = {}
    if row.fits is not None:
        try:
            fit = row.fits(fn) or {}
        except NotInVersion as exc:
            result.verdict, result.reason = "NOT IN THIS VERSION", str(exc)
            return result
        except DoesNotFit as exc:
            result.reason = str(exc)
            return result
    result.adapted = "; ".join(c for c in (older, fit.get("choice", "")) if c)
    base = dict(row.conventions, **fit.get("conventions", {}))
    # a row may name its own profile (None: the reference's defaults under the row's
    # conventions) for a function its trainer's profile does not describe
    profile = row.audit.get("profile", profile)
    try:
        _, result.conventions, rule = resolve_conventions(row.ref, profile, dict(base))
    except AuditUsageError as exc:
        result.reason = f"the reference refuses the row's conventions: {exc}"
        return result
    keywords_fit = dict(fit.get("audit", {}))
    tags = tuple(fit.get("domain", ())) + tuple(domain[0] if domain else ())
    if tags:
        keywords_fit["domain"] = tuple(dict.fromkeys(
            tuple(row.audit.get("domain", rule.domain if rule is not None else ())) + tags))
    if domain:
        result.adapted = "; ".join(c for c in (result.adapted, domain[1]) if c)

    def audit_row(variant=None):
        variant = dict(variant or {})
        adapt = variant.pop("adapt", None)
        adapter = row.adapt(fn)
        if adapt is not None:
            adapter = adapt(adapter)
        conventions = dict(base, **variant.pop("conventions", {}))
        if row.compose is not None:        # the composition first, then a known variant's
            known_inputs = variant.get("inputs")
            variant["inputs"] = row.compose if known_inputs is None else \
                (lambda data: known_inputs(row.compose(data)))
        keywords = dict(row.audit, **keywords_fit, **variant.pop("audit", {}))
        keywords.pop("profile", None)              # resolved above
        n = keywords.pop("cases", cases)           # a row whose every call is costly runs fewer
        return audit(adapter, row.ref, profile=profile, cases=n, seed=seed,
                     variant=variant or None, **keywords, **conventions)

    t0 = time.perf_counter()
    try:
        report = audit_row()
    except AuditUsageError as exc:
        result.reason = f"the audit refused the adapter: {exc}"
        return result
    except Exception as exc:                   # the trainer's code is not what the row expects
        result.reason = f"the adapter could not be built: {type(exc).__name__}: {exc}"
        return result
    result.report = report
    raised = next((f for f in report.findings if f.check == "raises"), None)
    if raised is not None and raised.status == "fail" and raised.exceptions and \
            sum(e["cases"] for e in raised.exceptions) >= raised.cases:
        e = max(raised.exceptions, key=lambda e: e["cases"])
        result.seconds = time.perf_counter() - t0
        where = _from_root(e["where"], source.root)
        if e.get("ours") is False and where != e["where"] and \
                "stand-in" not in e["message"].lower():
            # the traceback ends in the trainer's own code, and the adapter fits this release
            # (its signature and `fits` checks passed): a release defect, not an adapter's
            result.verdict = "DOES NOT CONFORM"
            result.reason = f"every case raised {e['type']} at {where}"
            result.findings = [dict(
                check="raises", grade="deviation", known=False, kind="new",
                message=f"raises on every input: {e['type']}: {e['message'][:160]} at {where} "
                        f"(the traceback's last frame, in the trainer's code)",
                diagnosis="", counterexample=raised.counterexample,
                explanation="a release defect: the trainer's own code raises on every input "
                            "the row gives it, where the adapter's assumptions hold (its "
                            "signature and checks pass); " + NEW)]
            from .baseline import signature
            result.findings[0]["signature"] = signature(row.name, result.findings[0])
            return result
        result.reason = (f"every case raised, e.g. {e['type']}: {e['message'][:160]} at "
                         f"{_from_root(e['where'], source.root)}: the adapter's assumptions do "
                         f"not hold in this version (a function failing on every input would "
                         f"look the same; no verdict is given)")
        return result
    result.findings = grade(row, report, precision, source.root, audit_row)
    from .baseline import signature
    for f in result.findings:
        f["signature"] = signature(row.name, f)
    result.seconds = time.perf_counter() - t0
    grades = {(f["grade"], f["known"]) for f in result.findings}
    if ("deviation", False) in grades:
        result.verdict = "DOES NOT CONFORM"
    elif ("deviation", True) in grades:
        result.verdict = "KNOWN DEVIATION"
    elif report.inconclusive:
        result.verdict = "INCONCLUSIVE"
        result.reason = "; ".join(report.inconclusive)
    else:
        result.verdict = "CONFORMS"
    return result


def _from_root(text: str, root: str) -> str:
    """`text` with the trainer's files named from its root (not from the working directory)."""
    root = os.path.abspath(root)
    for prefix in (os.path.join(root, ""), os.path.join(os.path.relpath(root), "")):
        if prefix not in ("./", ""):
            text = text.replace(prefix, "")
    return text


def reproduces(report, variant_report, check: str) -> bool:
    """Whether a re-audit under a known entry's variant passes `check` where the row's audit
    failed it, and breaks no check that passed."""
    def status(rep):
        return {f.check: f.status for f in rep.findings}
    before, after = status(report), status(variant_report)
    if after.get(check) == "fail" or variant_report.n_cases < report.n_cases:
        return False
    return all(after.get(c) != "fail" for c, st in before.items() if st != "fail")


BEYOND_FLOAT32 = ("robustness: only where the reference lies beyond float32's range (the edge "
                  "of the float range), where this trainer's float32 code overflows")


def grade(row: Row, report, precision: str, root: str, audit_row) -> List[dict]:
    """The graded findings of a row's audit (see the module docstring): each failure, and each
    robustness note of the audit."""
    out = []
    again_by_variant = {}      # one re-audit per variant: entries at several checks share one
    for f in report.findings:
        if not (f.status == "fail" or f.grade == "robustness"):
            continue
        entries = [k for k in row.known if k.check == f.check]
        grade_, known, said = f.grade or "deviation", None, ""
        if grade_ == "deviation":
            for k in entries:
                if not k.variant:
                    continue
                if id(k.variant) not in again_by_variant:
                    try:
                        again_by_variant[id(k.variant)] = audit_row(k.variant)
                    except Exception:                      # the variant itself does not run
                        again_by_variant[id(k.variant)] = None
                again = again_by_variant[id(k.variant)]
                if again is None:
                    continue
                if reproduces(report, again, f.check):
                    known = k
                    break
            if known is not None:
                grade_ = known.grade
                said = f"{known.kind}: {known.what}" + (f" ({known.cite})" if known.cite else "")
            elif f.edge_only and precision == "float32":
                grade_, said = "robustness", BEYOND_FLOAT32
            elif f.float32_ok and precision == "float32":
                grade_ = "precision"
                said = ("within the float32 row of the tolerance table: below the precision "
                        "this trainer trains at (float32 losses, bfloat16 models)")
            else:
                said = NEW + ("" if not entries else
                              "; the known " + "; ".join(f"{k.kind} at {k.check} ({k.what[:80]}"
                                                         f"...)" for k in entries) +
                              " does not reproduce it")
        else:
            note = next((k for k in entries if k.grade == grade_), None)
            said = (f"{note.kind}: {note.what}" if note is not None else
                    BEYOND_FLOAT32 if f.edge_only else
                    "robustness: only with garbage at padding, which no trainer's batch holds")
        out.append(dict(check=f.check, grade=grade_, known=known is not None or
                        grade_ != "deviation",
                        message=_from_root(f.message, root), diagnosis=f.diagnosis,
                        counterexample=f.counterexample, explanation=said,
                        kind=known.kind if known else ("new" if grade_ == "deviation" else
                                                       grade_)))
    return _surrogate_values(row, report, out)


SURROGATE = ("a surrogate convention: the value of {ref}({loss}) is a surrogate whose gradient "
             "is what trains, and a loss written as another surrogate of the same gradient "
             "(CISPO's −sg(w)·A·log π for −w·A) has another value; the gradient check judges "
             "what trains, and {grad}")


def _surrogate_values(row: Row, report, out: List[dict]) -> List[dict]:
    """A new value deviation of a differentiated loss whose reference is a surrogate under the
    row's conventions (its registry entry's `surrogate`), graded a surrogate convention where the
    gradient was checked on the same cases and no other check of the row fails but the
    gradient's: the value of such a loss is a convention; the gradient carries the finding.
    A value difference the padding or micro-batch checks also see is in the math, and stays."""
    from ..check.registry import REGISTRY
    entry = REGISTRY.get(row.ref)
    if entry is None or entry.surrogate is None or not entry.trainer_grad or \
            not entry.surrogate(report.conventions):
        return out
    status = {f.check: f.status for f in report.findings}
    if status.get("grad") not in ("pass", "fail"):
        return out
    failing = {f["check"] for f in out if f["grade"] == "deviation"} - {"value", "grad"}
    if failing:
        return out
    grad = ("it fails there: see the row's grad finding" if status["grad"] == "fail" else
            "it passes on every case")
    for f in out:
        if f["check"] == "value" and f["grade"] == "deviation" and f["kind"] == "new":
            f.update(grade="surrogate convention", known=True, kind="surrogate convention",
                     explanation=SURROGATE.format(
                         ref=row.ref, grad=grad, loss=", ".join(
                             f"{k}={report.conventions[k]!r}" for k in ("loss",)
                             if k in report.conventions)))
    return out


@contextlib.contextmanager
def _environ(settings):
    """The trainer's environment variables (Trainer.environ) while its card runs; "{tmp}" in a
    value is a temporary directory, removed afterwards."""
    import tempfile
    from unittest import mock
    with tempfile.TemporaryDirectory(prefix="crosscheck-") as tmp, \
            mock.patch.dict(os.environ, {k: v.replace("{tmp}", tmp) for k, v in settings}):
        yield


def _run_rows(trainer, source, rows, cases, seed, progress, shown=None):
    """(the rows' results, what the loader describes, the modules that failed to load).
    `shown`: the row numbers the progress display gives (1..len(rows) by default)."""
    shown = shown or list(range(1, len(rows) + 1))
    total = max(shown, default=0)
    domain = trainer.domain(source) if trainer.domain is not None else None
    with _environ(trainer.environ), \
            loading.Loaded(source, trainer.modules, trainer.real, trainer.stand_in,
                           by_file=trainer.by_file) as loaded, \
            loading.quiet_warnings():
        results = []
        for i, row in zip(shown, rows):
            _progress(progress, i, total, row.name)
            results.append(run_row(row, loaded, source, trainer.profile, cases, seed,
                                   trainer.precision, domain))
        return results, loaded.describe(), dict(loaded.failed)


def _run_rows_forked(trainer, source, rows, cases, seed, progress):
    """Every other row in a forked child, the rest here, at once (crosscheck.fork); the child
    sends its results back without their Row, which holds closures."""
    from ..fork import in_two_processes

    mine, theirs = rows[0::2], rows[1::2]

    def there():
        done = _run_rows(trainer, source, theirs, cases, seed, None)[0]
        for r in done:
            r.row = None
            if r.report is not None:       # a closure over the child's auditor
                r.report.replay = None
        return done
    (here, described, failed), there_ = in_two_processes(
        lambda: _run_rows(trainer, source, mine, cases, seed, progress,
                          shown=list(range(1, len(rows) + 1, 2))), there)
    for r, row in zip(there_, theirs):
        r.row = row
    results = [None] * len(rows)
    results[0::2], results[1::2] = here, there_
    return results, described, failed


def run(trainer: Trainer, path: Optional[str] = None, cases: int = CASES, seed: int = 0,
        progress=None, only: Optional[Sequence[str]] = None, workers: int = 1) -> Card:
    """The card of `trainer` as installed (path None) or in the checkout at `path`.
    `progress`: a stream for a one-line progress display (a terminal), or None. With
    workers=2 (and os.fork) a forked child runs every other row meanwhile, each process
    loading the trainer itself; the card is the same (every row is seeded on its own). Fork
    only from a process whose torch thread pool has not run (the command line's)."""
    t0 = time.perf_counter()
    if path is None and not trainer.installable:
        raise loading.TrainerNotFound(f"{trainer.name} is not a package: pass --path to a "
                                      f"checkout of it")
    source = loading.locate(trainer.package, trainer.dist, path, trainer.version_of,
                            needs=trainer.modules + tuple(
                                sorted({r.module for r in trainer.rows if r.block})))
    rows = [r for r in trainer.rows if only is None or r.qualname in only or r.name in only]
    if workers > 1 and trainer.fork and len(rows) > 1 and hasattr(os, "fork"):
        results, described, failed = _run_rows_forked(trainer, source, rows, cases, seed,
                                                      progress)
    else:
        results, described, failed = _run_rows(trainer, source, rows, cases, seed, progress)
    end_progress(progress)
    ran = {(r.module, r.qualname) for r in trainer.rows}
    not_covered = []
    for module, pattern in trainer.inventory:
        path_ = source.file(module)
        for q, line in _definitions(path_).items():
            if re.fullmatch(pattern, q) and (module, q) not in ran:
                not_covered.append((source.relative(path_), q, line))
    # the registries: a registered function with no row and no reason of its own is new
    why, listed, reasons = {}, {(f, q) for f, q, _ in not_covered}, dict(trainer.not_run)
    for module in dict.fromkeys(trainer.modules + tuple(m for m, _ in trainer.inventory)):
        path_ = source.file(module)
        for q, (line, deco) in _registered(path_).items():
            if (module, q) in ran or q in reasons or \
                    any(m == module and r.startswith(q + ".") for m, r in ran):
                continue             # a row of it (or of one of its methods), or its reason
            why[q] = NEW_IN_RELEASE.format(deco=deco)
            if (source.relative(path_), q) not in listed:
                not_covered.append((source.relative(path_), q, line))
    # the registries read as data: an entry whose class or function has no row and no reason
    for registry in trainer.registries:
        path_ = source.file(registry)
        for key, module, name in _registry_entries(path_, registry, trainer.package):
            if any(m == module and (q == name or q.startswith(name + ".")) for m, q in ran) \
                    or any(r.startswith(name + ".") for r in reasons):
                continue             # a row of it (or of one of its methods), or its reason
            target = source.file(module)
            if name not in reasons:                  # listed with its own reason, or new
                why[name] = NEW_IN_REGISTRY.format(key=key, registry=source.relative(path_))
            if (source.relative(target), name) not in listed:
                listed.add((source.relative(target), name))
                not_covered.append((source.relative(target), name,
                                    _definitions(target).get(name, 0)))
    return Card(trainer, source, described, results, not_covered, cases, seed,
                time.perf_counter() - t0, failed, why=why, path=path)


