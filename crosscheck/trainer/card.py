"""A trainer's report card: its own functions, each audited against a reference.

A trainer module (crosscheck/trainer/<name>.py) declares a `Trainer`: where its math lives, the
rows (one per piece of math: the trainer's function, the reference and conventions it is judged
against, an adapter that only renames and reshapes, the adapter's choices in words, and what we
know of deviations the trainer ships on purpose or by mistake), and the inventory (which of its
functions count, so that those without a reference are listed as not covered).

`run(trainer, path=None, cases=..., seed=...)` loads the code (crosscheck.trainer.loading), runs
every row through `crosscheck.audit.audit` and returns a `Card`, printable as text, Markdown or
JSON. A row's verdict is the audit's; a row that cannot be adapted to this version says why.
"""
import ast
import inspect
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import loading

CASES = 48                     # cases per row: past the offset, extreme-ratio and empty-batch cases
KINDS = ("documented choice", "defect")


@dataclass(frozen=True)
class Known:
    """A deviation we know this trainer has, found at `check`: a documented choice (its docs or
    config say so) or a defect; `what` says what differs and when it bites, citing the code."""
    check: str
    kind: str
    what: str


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
    not_covered_why: str = "no reference function yet"
    # a function of the inventory not covered for its own reason: ((qualname, why), ...)
    not_run: Tuple[Tuple[str, str], ...] = ()
    notes: Tuple[str, ...] = ()

    def version_of(self, root):
        return loading.version_of(root, os.path.join(self.package, self.version_file)) \
            if self.version_file else None


@dataclass
class RowResult:
    row: Row
    file: str
    line: Optional[int]
    verdict: str               # CONFORMS | DOES NOT CONFORM | INCONCLUSIVE | COULD NOT ADAPT
    conventions: Dict[str, object] = field(default_factory=dict)
    reason: str = ""                   # could not adapt: why; inconclusive: why
    findings: List[dict] = field(default_factory=list)   # each failing check, in order
    end_line: Optional[int] = None     # a statement block's last line
    report: Optional[object] = None    # the AuditReport
    seconds: float = 0.0

    @property
    def finding(self) -> Optional[dict]:
        return self.findings[0] if self.findings else None


def explanation(row: Row, check: str) -> Tuple[Optional[Known], str]:
    """What we know of a deviation of `row` at `check`, in words."""
    known = next((k for k in row.known if k.check == check), None)
    if known is not None:
        return known, f"{known.kind}: {known.what}"
    return None, ("not a deviation we know this trainer to make on purpose: treat it as a "
                  "defect until its code or documentation shows it is a choice")


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

    @property
    def covered(self) -> List[RowResult]:
        return [r for r in self.rows if r.verdict != "COULD NOT ADAPT"]

    def functions(self) -> Tuple[int, int]:
        """(functions with at least one row that ran, functions in the inventory)."""
        ran = {(r.file, r.row.qualname) for r in self.covered}
        listed = {(r.file, r.row.qualname) for r in self.rows} | \
            {(f, q) for f, q, _ in self.not_covered}
        return len(ran), len(listed)

    @property
    def verdict(self) -> str:
        verdicts = {r.verdict for r in self.rows}
        if "DOES NOT CONFORM" in verdicts:
            return "DOES NOT CONFORM"
        if verdicts - {"CONFORMS"}:
            return "INCOMPLETE"
        return "CONFORMS"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "CONFORMS" else 1

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
            + (f", {sum(r.verdict == 'COULD NOT ADAPT' for r in self.rows)} could not be adapted"
               if any(r.verdict == "COULD NOT ADAPT" for r in self.rows) else ""),
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
                             if r.verdict != "COULD NOT ADAPT" else
                             f"  {'':<{width}}           could not adapt: {r.reason}")
                if r.verdict == "INCONCLUSIVE":
                    lines.append(f"  {'':<{width}}           why: {r.reason}")
        devs = [(r, f) for r in self.rows for f in r.findings]
        if devs:
            lines += ["", "deviations"]
            for r, f in devs:
                lines += [f"  {r.row.name} ({r.file}:{r.line}), check {f['check']}:",
                          f"    what differs: {f['message']}"]
                if f.get("diagnosis"):
                    lines.append(f"    likely: {f['diagnosis']}")
                if f.get("counterexample"):
                    lines.append("    minimal counterexample:")
                for k, v in (f.get("counterexample") or {}).items():
                    lines.append(f"      {k}: {v}")
                lines.append(f"    {f['explanation']}")
        choices = [r for r in self.rows if r.row.choices]
        if choices:
            lines += ["", "adapter choices (each adapter only renames and reshapes)"]
            for r in choices:
                lines.append(f"  {r.row.name}: " + "; ".join(r.row.choices))
        if self.not_covered:
            lines += ["", f"not covered ({self.trainer.not_covered_why})"]
            by: Dict[str, List[str]] = {}
            for f, q, line in self.not_covered:
                why = dict(self.trainer.not_run).get(q)
                by.setdefault(f, []).append(f"{q} (l.{line})" + (f" [{why}]" if why else ""))
            for f, names in by.items():
                lines.append(f"  {f}: " + ", ".join(names))
        for m, why in self.failed_modules.items():
            lines.append(f"  module {m} could not be loaded: {why}")
        lines += [f"note: {n}" for n in self.trainer.notes]
        lines.append(f"card verdict: {self.verdict}" + self._tally())
        return "\n".join(lines)

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
        out += [f"- {h}" for h in head[1:]] + [f"- card verdict: **{self.verdict}**" +
                                                self._tally(), ""]
        out += ["| function | file:line | reference (conventions) | verdict |",
                "|---|---|---|---|"]
        for r in self.rows:
            ref = self._conv(r) if r.verdict != "COULD NOT ADAPT" else \
                f"could not adapt: {r.reason}"
            ran = f" ({r.report.n_cases}/{r.report.n_drawn} cases)" if r.report else ""
            out.append(f"| `{r.row.name}` | {r.file}:{r.line or '?'} | `{ref}` | "
                       f"{r.verdict}{ran} |")
        devs = [(r, f) for r in self.rows for f in r.findings]
        if devs:
            out += ["", "## Deviations", ""]
            for r, f in devs:
                out += [f"### `{r.row.name}`: {f['check']}", "",
                        f"- what differs: {f['message']}"]
                if f.get("diagnosis"):
                    out.append(f"- likely: {f['diagnosis']}")
                ce = f.get("counterexample") or {}
                if ce:
                    out.append("- minimal counterexample:")
                    out += [f"  - {k}: `{v}`" for k, v in ce.items()]
                out += [f"- {f['explanation']}", ""]
        choices = [r for r in self.rows if r.row.choices]
        if choices:
            out += ["", "## Adapter choices", ""]
            out += [f"- `{r.row.name}`: " + "; ".join(r.row.choices) for r in choices]
        if self.not_covered:
            out += ["", f"## Not covered ({t.not_covered_why})", ""]
            out += [f"- `{q}` ({f}:{line})" + (f": {dict(t.not_run)[q]}" if q in dict(t.not_run)
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
            coverage=dict(functions_run=ran, functions=listed,
                          ratio=ran / max(listed, 1)),
            rows=[dict(function=r.row.qualname, label=r.row.label, file=r.file, line=r.line,
                       ref=r.row.ref, conventions=r.conventions, verdict=r.verdict,
                       reason=r.reason, choices=list(r.row.choices),
                       cases_run=None if r.report is None else r.report.n_cases,
                       findings=r.findings,
                       seconds=round(r.seconds, 3))
                  for r in self.rows],
            not_covered=[dict(file=f, function=q, line=line, why=dict(self.trainer.not_run).get(
                q, self.trainer.not_covered_why)) for f, q, line in self.not_covered],
            failed_modules=self.failed_modules, seconds=round(self.seconds, 3)))


# ---- the inventory -------------------------------------------------------------------------

def _definitions(path: str) -> Dict[str, int]:
    """{"function" or "Class.method": line} for a source file's top-level definitions."""
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


def per_sequence(advantages, like):
    """Adapters' broadcast: a per-sequence advantage [B] over the response, as trainers store
    it ([B, T] passes through)."""
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def owner_class(method):
    """The class a method was defined on (PolicyLoss for PolicyLoss.forward), through any
    decorator that wraps it (torch.no_grad)."""
    inner = inspect.unwrap(method)
    return inner.__globals__[inner.__qualname__.split(".")[0]]


def _resolve(module, qualname: str):
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# ---- running -------------------------------------------------------------------------------

def _progress(stream, i, n, name):
    if stream is not None:
        stream.write(f"\r\033[K[{i}/{n}] {name}")
        stream.flush()


def run_row(row: Row, loaded: loading.Loaded, source: loading.Source, profile: str, cases: int,
            seed: int) -> RowResult:
    from ..audit import audit
    from ..audit.api import resolve_conventions
    from ..audit.model import AuditUsageError

    path = source.file(row.module)
    rel = source.relative(path)
    line = _definitions(path).get(row.qualname)
    result = RowResult(row, rel, line, "COULD NOT ADAPT")
    if row.block is not None:
        from .blocks import BlockNotFound, compile_block
        try:
            fn, result.line, result.end_line = compile_block(path, row.qualname, *row.block)
        except (OSError, SyntaxError, BlockNotFound) as exc:
            result.reason = str(exc)
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
            result.reason = f"{row.qualname} is not defined in {rel} in this version"
            return result
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    missing = [p for p in row.params if p not in params]
    if missing:
        result.reason = (f"the signature changed: {row.qualname} has no parameter "
                         f"{', '.join(missing)} (it takes {', '.join(params) or 'nothing'})")
        return result
    try:
        _, result.conventions, _ = resolve_conventions(row.ref, profile, dict(row.conventions))
    except AuditUsageError as exc:
        result.reason = f"the reference refuses the row's conventions: {exc}"
        return result
    try:
        adapter = row.adapt(fn)
    except Exception as exc:                   # the trainer's code is not what the row expects
        result.reason = f"the adapter could not be built: {type(exc).__name__}: {exc}"
        return result
    t0 = time.perf_counter()
    try:
        report = audit(adapter, row.ref, profile=profile, cases=cases, seed=seed,
                       **dict(row.audit), **dict(row.conventions))
    except AuditUsageError as exc:
        result.reason = f"the audit refused the adapter: {exc}"
        return result
    result.seconds = time.perf_counter() - t0
    result.report = report
    result.verdict = report.verdict
    if report.inconclusive:
        result.reason = "; ".join(report.inconclusive)
    root = os.path.join(source.root, "")          # the trainer's files, named from its root
    for f in report.failures:
        known, said = explanation(row, f.check)
        result.findings.append(dict(check=f.check, message=f.message.replace(root, ""),
                                    diagnosis=f.diagnosis,
                                    counterexample=f.counterexample, explanation=said,
                                    kind=known.kind if known else "unexplained"))
    return result


def run(trainer: Trainer, path: Optional[str] = None, cases: int = CASES, seed: int = 0,
        progress=None, only: Optional[Sequence[str]] = None) -> Card:
    """The card of `trainer` as installed (path None) or in the checkout at `path`.
    `progress`: a stream for a one-line progress display (a terminal), or None."""
    t0 = time.perf_counter()
    if path is None and not trainer.installable:
        raise loading.TrainerNotFound(f"{trainer.name} is not a package: pass --path to a "
                                      f"checkout of it")
    source = loading.locate(trainer.package, trainer.dist, path, trainer.version_of,
                            needs=trainer.modules + tuple(
                                sorted({r.module for r in trainer.rows if r.block})))
    rows = [r for r in trainer.rows if only is None or r.qualname in only]
    with loading.Loaded(source, trainer.modules) as loaded, loading.quiet_warnings():
        results = []
        for i, row in enumerate(rows):
            _progress(progress, i + 1, len(rows), row.name)
            results.append(run_row(row, loaded, source, trainer.profile, cases, seed))
        described = loaded.describe()
        failed = dict(loaded.failed)
    if progress is not None:
        progress.write("\r\033[K")
        progress.flush()
    ran = {(r.module, r.qualname) for r in trainer.rows}
    not_covered = []
    for module, pattern in trainer.inventory:
        path_ = source.file(module)
        for q, line in _definitions(path_).items():
            if re.fullmatch(pattern, q) and (module, q) not in ran:
                not_covered.append((source.relative(path_), q, line))
    return Card(trainer, source, described, results, not_covered, cases, seed,
                time.perf_counter() - t0, failed)


def progress_stream(json_or_piped: bool):
    """stderr when it is a terminal and the output is for a person, else None."""
    return sys.stderr if not json_or_piped and sys.stderr.isatty() else None
