"""Every example output printed in README.md and docs/, and every file in examples/output/, comes
from this script: it runs each command and writes what it prints.

    python scripts/render_examples.py            # rewrite every example from a fresh run
    python scripts/render_examples.py --check    # exit 1, and show the difference, if any is stale

In a Markdown file an example is a fenced code block right after a line `<!-- example: NAME -->`,
NAME a key of EXAMPLES below. Its first line is the command (`$ python -m crosscheck ...`), the
rest what the command prints, or the part of it the example selects. Commands run in-process,
so the whole set takes about half a minute; tests/cli/test_docs.py runs the same check.

--check compares what matters exactly and the last digits within a tolerance (`same`): every
word, status, verdict and finding must match, while a number may differ by what another CPU's
kernels or rounding order give (`ATEN_CPU_CAPABILITY=default` prints other digits), and a timing
("7.7 s") by anything.
"""
import argparse
import contextlib
import dataclasses
import difflib
import io
import os
import re
import shlex
import sys
from typing import Callable, Dict, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DOCS = ("README.md",) + tuple(sorted(os.path.join("docs", f)
                                   for f in os.listdir(os.path.join(ROOT, "docs"))
                                   if f.endswith(".md")))
TIMING = re.compile(r"\d+(\.\d+)? s\b")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
# Two printed numbers are the same where |x − y| ≤ ATOL + RTOL·max(|x|, |y|).
# RTOL: a float32 kernel of another CPU moves a printed value in its 7th–8th significant digit
#   (u = 2^-24 ≈ 6e-8, a few roundings); 1e-5 is 100× that and still 10× below the 1e-4 by which
#   the closest conventions differ, so a changed convention or count is still stale.
# ATOL: every number below 1e-8 that an example prints is a measured rounding error (the
#   cross-check's max-error columns: 2.22e-16 on one CPU, 0.00e+00 on another); 1e-8 is the
#   smallest tolerance any stage allows beyond rounding (the fd row's atol), so a real error
#   still shows.
RTOL, ATOL = 1e-5, 1e-8
# A number printed as d.dde±dd is, by the project's formatting, a measured error (the
# cross-check's error columns, the walkthrough's mean after whitening). Finite differences and
# rounding move it by a factor of a few from one CPU to another (whiten's fd error: 3.4e-09 on
# one, 5.2e-09 on another), so two of them are the same within MEASURED_FACTOR of each other, or
# both at rounding level (≤ ATOL); an error grown by more than that is still stale.
MEASURED = re.compile(r"[-+]?\d\.\d\de[-+]\d\d")
MEASURED_FACTOR = 10.0


@dataclasses.dataclass(frozen=True)
class Example:
    argv: Tuple[str, ...] = ()                  # after `python -m crosscheck`
    head: Optional[int] = None                  # keep the first lines only ...
    tail: Optional[int] = None                  # ... and/or the last ones, with "..." between
    output: Optional[str] = None                # also written to this file (examples/output/)
    run: Optional[Callable[[], str]] = None     # instead of argv: what a function prints
    shown: str = ""                             # the command line shown for `run`


def _planted_cispo() -> str:
    """The cross-check on a torch twin of CISPO whose .detach() was removed
    (examples/planted_twin.py): the value stage cannot see it; vjp and detach name it."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import planted_twin

    from crosscheck.check import registry, report, stages
    entry = dataclasses.replace(registry.build()["cispo_loss"],
                                torch_fn=planted_twin.cispo_without_detach)
    return report.failures(stages.run_entry(entry, seed=0, n_cases=12))


EX = "examples/"
EXAMPLES: Dict[str, Example] = {
    "check-head": Example((), head=6, tail=1),
    "check": Example(()),
    "check-list": Example(("--list",)),
    "check-planted": Example(run=_planted_cispo, shown="(a planted bug: CISPO's weight not "
                                                       "detached in the torch twin)"),
    "audit-profiles": Example(("audit", "--list-profiles")),
    "explain-ppo": Example(("explain", "--topic", "ppo"), head=18),
    "explain-kl-zh": Example(("explain", "--topic", "kl", "--lang", "zh"), tail=17),
    "explain-beyond": Example(("explain", "--topic", "beyond")),
    "audit-cispo": Example(("audit", EX + "buggy.py:cispo_without_detach", "--ref", "cispo_loss",
                            "--profile", "minimind"),
                           output=EX + "output/buggy_cispo_without_detach.txt"),
    "audit-reshape": Example(("audit", EX + "buggy.py:grpo_by_reshape", "--ref",
                              "group_advantages", "--profile", "minimind"),
                             output=EX + "output/buggy_grpo_by_reshape.txt"),
    "audit-kl-sign": Example(("audit", EX + "buggy.py:kl_sign_flipped", "--ref", "kl_penalty",
                              "--profile", "trl"), output=EX + "output/buggy_kl_sign_flipped.txt"),
    "audit-local-mean": Example(("audit", EX + "buggy.py:local_token_mean", "--ref", "aggregate",
                                 "--profile", "verl"),
                                output=EX + "output/buggy_local_token_mean.txt"),
    "audit-minimind-grpo": Example(("audit", EX + "minimind_style.py:grpo_advantages", "--ref",
                                    "group_advantages", "--profile", "minimind"),
                                   output=EX + "output/minimind_grpo_advantages.txt"),
    "audit-minimind-cispo": Example(("audit", EX + "minimind_style.py:cispo_objective", "--ref",
                                     "policy_objective", "--profile", "minimind"),
                                    output=EX + "output/minimind_cispo_objective.txt"),
    "audit-trl": Example(("audit", EX + "trl_style.py:adapter", "--ref", "policy_objective",
                          "--profile", "trl", "--set", "beta=0.04", "--accumulation", "sum"),
                         output=EX + "output/trl_grpo_loss.txt"),
    "audit-verl": Example(("audit", EX + "verl_style.py:adapter", "--ref", "policy_objective",
                           "--profile", "verl", "--accumulation", "sum"),
                          output=EX + "output/verl_policy_loss.txt"),
}


def command_line(ex: Example) -> str:
    if ex.run is not None:
        return ex.shown
    return "$ " + " ".join(["python -m crosscheck"] + [shlex.quote(a) for a in ex.argv])


_CACHE: Dict[Tuple[str, ...], str] = {}


def printed(ex: Example) -> str:
    """What the example's command prints (stdout, then stderr), in full; run once per argv."""
    if ex.run is not None:
        return ex.run()
    if ex.argv not in _CACHE:
        from crosscheck import __main__ as cli
        out, err = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    cli.main(list(ex.argv))
                except SystemExit:
                    pass
        finally:
            os.chdir(cwd)
        _CACHE[ex.argv] = out.getvalue() + err.getvalue()
    return _CACHE[ex.argv]


def selected(ex: Example, text: str) -> str:
    lines = text.rstrip("\n").split("\n")
    if ex.head is None and ex.tail is None:
        return "\n".join(lines)
    keep = lines[:ex.head] if ex.head is not None else []
    if ex.tail is not None:
        keep += ["..."] + lines[-ex.tail:]
    elif ex.head is not None and len(lines) > ex.head:
        keep += ["..."]
    return "\n".join(keep)


def block(name: str) -> str:
    """The fenced block's body for example `name`: the command, then what it prints."""
    ex = EXAMPLES[name]
    return command_line(ex) + "\n" + selected(ex, printed(ex))


MARK = re.compile(r"<!-- example: ([\w-]+) -->\n```\n(.*?)```", re.S)


def markdown_examples(path: str) -> Dict[str, str]:
    """{name: block body} of every example marked in a Markdown file."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    return {m.group(1): m.group(2).rstrip("\n") for m in MARK.finditer(text)}


def same(a: str, b: str) -> bool:
    """Whether two printouts say the same: equal text between the numbers, each pair of numbers
    within RTOL/ATOL (measured errors within MEASURED_FACTOR), timings ignored."""
    a, b = (TIMING.sub("<t> s", t.rstrip("\n")) for t in (a, b))
    if NUMBER.split(a) != NUMBER.split(b):
        return False
    return all(_same_number(x, y) for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)))


def _same_number(x: str, y: str) -> bool:
    u, v = float(x), float(y)
    big = max(abs(u), abs(v))
    if MEASURED.fullmatch(x) and MEASURED.fullmatch(y):
        return big <= ATOL or (u * v > 0 and big <= MEASURED_FACTOR * min(abs(u), abs(v)))
    return abs(u - v) <= ATOL + RTOL * big


def stale():
    """[(where, name, expected, found)] for every example that is not what its command prints."""
    out = []
    for path in DOCS:
        for name, body in markdown_examples(path).items():
            want = block(name)
            if not same(want, body):
                out.append((path, name, want, body))
    for name, ex in EXAMPLES.items():
        if ex.output:
            path = os.path.join(ROOT, ex.output)
            have = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
            want = selected(ex, printed(ex))
            if not same(want, have):
                out.append((ex.output, name, want, have))
    return out


def rewrite():
    for path in DOCS:
        full = os.path.join(ROOT, path)
        text = open(full, encoding="utf-8").read()
        new = MARK.sub(lambda m: f"<!-- example: {m.group(1)} -->\n```\n{block(m.group(1))}\n```",
                       text)
        if new != text:
            open(full, "w", encoding="utf-8").write(new)
            print(f"wrote {path}")
    for name, ex in EXAMPLES.items():
        if ex.output:
            full = os.path.join(ROOT, ex.output)
            open(full, "w", encoding="utf-8").write(selected(ex, printed(ex)) + "\n")
            print(f"wrote {ex.output}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="compare only; exit 1 if any is stale")
    args = p.parse_args(argv)
    if not args.check:
        rewrite()
        return 0
    bad = stale()
    for where, name, want, have in bad:
        print(f"{where}: example {name} is stale:")
        old, new = have.splitlines(True), (want + "\n").splitlines(True)
        if len(old) == len(new):     # only the lines that differ beyond the last digits
            pairs = [(a, b) for a, b in zip(old, new) if not same(a, b)]
            old, new = [a for a, _ in pairs], [b for _, b in pairs]
        sys.stdout.writelines(difflib.unified_diff(old, new, "documented", "printed now", n=0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
