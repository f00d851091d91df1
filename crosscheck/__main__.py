"""`python -m crosscheck`: cross-check every reference function (exit 0 pass, 1 fail, 2 usage),
and the `audit`, `explain` and `trainer` subcommands.

Arguments are parsed before anything heavy is imported, so that --help is instant.
"""
import argparse
import math
import os
import sys
import time

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
# --cases, every subcommand: past this, a run no longer ends in a working session (the
# cross-check takes about 0.1 s a case, an audit 0.01 to 1 s, a card 0.1 s a row)
MAX_CASES = 10_000


def _prog(sub: str = "") -> str:
    """The command as the user typed it: `crosscheck` (the console script) or
    `python -m crosscheck`."""
    base = "crosscheck" if os.path.basename(sys.argv[0] or "") == "crosscheck" else \
        "python -m crosscheck"
    return f"{base} {sub}".strip()


def check_parser():
    p = argparse.ArgumentParser(
        prog=_prog(),
        description="Cross-check the NumPy reference (hand VJPs) against the independent torch "
                    "twin (autograd) and scipy finite differences, on seeded cases in float64.",
        epilog=f"subcommands: '{_prog('audit')}' audits your own function against a reference; "
               f"'{_prog('trainer')}' prints a trainer's report card; "
               f"'{_prog('explain')}' walks through the math. Each has its own --help.")
    from . import __version__
    p.add_argument("--version", action="version", version=f"rl-crosscheck {__version__}")
    p.add_argument("--seed", type=int, default=0, help="case seed (default 0)")
    p.add_argument("--cases", type=int, default=12, metavar="N",
                   help=f"cases per function, 1 to {MAX_CASES} (default 12)")
    p.add_argument("--only", metavar="NAME[,NAME]", help="check only these functions")
    p.add_argument("--list", action="store_true",
                   help="list the registry and exit (with --json: as JSON)")
    p.add_argument("--json", action="store_true", help="print one JSON object (see docs/check.md)")
    p.add_argument("-q", "--quiet", action="store_true", help="print failures and a summary only")
    p.add_argument("--scale", type=int, metavar="N",
                   help="instead: value, vjp and fd of policy_objective (each loss and "
                        "aggregation) and gae on batches of N tokens")
    return p


def _check_cases(parser, n) -> None:
    """--cases must lie in 1..MAX_CASES: a usage error naming the value and the range."""
    if not 1 <= n <= MAX_CASES:
        parser.error(f"--cases is {n}; expected a whole number from 1 to {MAX_CASES}")


def _list_rows(entries):
    """The registry's facts that --list shows, one dict per function (--list --json)."""
    return [dict(name=e.name, differentiable_wrt=list(e.diff),
                 trainers_use_it_as="a loss (differentiated)" if e.trainer_grad else
                 "computed without grad",
                 stop_gradient=e.detached or None, audit_property_checks=list(e.checks))
            for e in entries.values()]


def _list(entries) -> str:
    """The registry as a table: every column filled ("-" where a fact does not apply)."""
    rows = [("function", "differentiable wrt", "trainers use it as", "stop-gradient",
             "audit property checks")]
    for r in _list_rows(entries):
        rows.append((r["name"], ", ".join(r["differentiable_wrt"]) or "- (not differentiated)",
                     r["trainers_use_it_as"], r["stop_gradient"] or "-",
                     ", ".join(r["audit_property_checks"]) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                     for r in rows)


def check_main(argv, workers: int = 1) -> int:
    parser = check_parser()
    args = parser.parse_args(argv)
    from .check import registry                  # facts only: --list needs no torch

    entries = registry.build()
    _check_cases(parser, args.cases)
    if args.seed < 0:
        parser.error(f"--seed is {args.seed}; expected a non-negative integer")
    if args.only is not None:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in entries]
        if unknown or not names:
            parser.error(f"--only names unknown function(s) {', '.join(unknown) or '(none)'}; "
                         f"known: {', '.join(entries)}")
        entries = {n: entries[n] for n in names}
    if args.list:
        if args.json:
            import json
            print(json.dumps(dict(functions=_list_rows(entries)), indent=2, ensure_ascii=False))
        else:
            print(_list(entries))
        return EXIT_PASS
    from .check import report
    from .check.stages import run
    t0 = time.perf_counter()
    timings = None
    if args.scale is not None:
        if args.scale < 1:
            parser.error(f"--scale is {args.scale}; expected a positive number of tokens")
        from .check import scale
        short = scale.memory_shortfall(args.scale)
        if short:
            parser.error(f"--scale {args.scale} will not fit in memory: it {short}")
        results, timings = scale.run(args.scale, seed=args.seed)
    else:
        results = run(entries, seed=args.seed, n_cases=args.cases, workers=workers)
    seconds = time.perf_counter() - t0
    ok = all(r.passed for r in results)
    if args.json:
        print(report.to_json(results, args.seed))
        return EXIT_PASS if ok else EXIT_FAIL
    if not args.quiet:
        print(report.table(results))
        print()
        for what, (sec, evals) in (timings or {}).items():
            print(f"  {what:<28} {sec:7.2f} s ({evals} evaluations)")
    if not ok:
        print(report.failures(results))
        print()
    if timings is None:
        print(report.summary(results, len(entries), args.seed, args.cases, seconds))
    else:
        print(f"--scale {args.scale}: {len(results)} stage checks, "
              f"{'all passed' if ok else 'FAILED'} in {seconds:.1f} s")
    return EXIT_PASS if ok else EXIT_FAIL


def explain_parser():
    from .explain import TOPICS

    p = argparse.ArgumentParser(
        prog=_prog("explain"),
        description="A guided walkthrough of the RL math and its gradients, every number "
                    "computed by ref_numpy and confirmed by ref_torch.")
    p.add_argument("--lang", choices=("en", "zh"), default="en", help="language (default en)")
    p.add_argument("--topic", choices=TOPICS, help="show one topic")
    p.add_argument("--json", action="store_true", help="the numbers, for programs")
    p.add_argument("--plot", metavar="DIR",
                   help="write the topics' PNG figures to DIR, created if missing (needs "
                        "matplotlib)")
    return p


def explain_main(argv) -> int:
    import json

    p = explain_parser()
    args = p.parse_args(argv)
    from .explain import TOPICS
    from .explain import topics as explain
    topics = (args.topic,) if args.topic else TOPICS
    plots = None
    if args.plot:                        # refuse an unusable DIR before printing anything
        from .explain import plots
        try:
            plots.ready()
        except plots.PlotUnavailable as exc:
            print(str(exc), file=sys.stderr)
            return EXIT_USAGE
        _output_path(p, "--plot", args.plot, folder=True)
    try:
        sections = explain.walkthrough(topics)
    except explain.WalkthroughError as exc:
        print(f"walkthrough stopped: {exc}", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(json.dumps(explain.to_json_doc(sections), indent=2, ensure_ascii=False))
    else:
        print(explain.to_text(sections, args.lang), end="")
    if plots is not None:
        paths = plots.write_figures(args.plot, topics)
        print("\n".join(f"wrote {path}" for path in paths) or
              f"no figure belongs to topic {args.topic}", file=sys.stderr)
    return EXIT_PASS


def _load_target(target):
    """'path/to/file.py:function' → the function; raises ValueError with a usage message."""
    import importlib.machinery
    import importlib.util

    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"target is {target!r}; expected path/to/file.py:function")
    if os.path.isdir(path):
        raise ValueError(f"target file {path!r} is a directory; expected a Python file")
    if not os.path.isfile(path):
        raise ValueError(f"target file {path!r} does not exist")
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    # read as Python source whatever its name ends in (noext, .pyw, .txt)
    loader = importlib.machinery.SourceFileLoader("crosscheck_audit_target", path)
    spec = importlib.util.spec_from_file_location("crosscheck_audit_target", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:         # sys.exit() at import: a usage error, not its exit code
        raise ValueError(f"importing {path} called sys.exit({exc.code!r}); the audit needs "
                         f"a module that defines {name!r} without exiting") from None
    except Exception as exc:  # the user's module: report, never a traceback
        raise ValueError(f"importing {path} raised {type(exc).__name__}: {exc}") from None
    if not hasattr(module, name):
        raise ValueError(f"{path} has no function {name!r}")
    fn = getattr(module, name)
    if not callable(fn):
        raise ValueError(f"{path} defines {name!r} as a {type(fn).__name__}, not a function")
    return fn


def _pairs(items, option, example):
    """`--set key=value` / `--map name=input` items as a dict (values as Python literals for
    --set, as text for --map)."""
    import ast

    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{option} {item!r}; expected key=value, e.g. {option} {example}")
        if option == "--set":
            try:
                out[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                out[key.strip()] = value.strip()
        else:
            out[key.strip()] = value.strip()
    return out


def audit_parser():
    from .audit import profiles

    p = argparse.ArgumentParser(
        prog=_prog("audit"),
        description="Audit your own function against a reference: values, gradients, masks, "
                    "group permutations, micro-batch accumulation, KL direction. Exit 0 when it "
                    "conforms, 1 when it does not, 2 on a usage error or an inconclusive audit.")
    p.add_argument("target", nargs="?", help="path/to/file.py:function (your adapter)")
    p.add_argument("--ref", metavar="NAME", help="the reference function, e.g. group_advantages")
    p.add_argument("--profile", choices=sorted(profiles.PROFILES), help="a trainer's conventions")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a reference convention (repeatable), e.g. --set ddof=1")
    p.add_argument("--map", action="append", metavar="YOURS=INPUT",
                   help="pass the reference's INPUT as your parameter YOURS (repeatable), e.g. "
                        "--map log_prob=logp")
    p.add_argument("--cases", type=int, default=200, metavar="N",
                   help=f"cases, 1 to {MAX_CASES} (default 200)")
    p.add_argument("--seed", type=int, default=0, help="case seed (default 0)")
    p.add_argument("--backend", choices=("torch", "numpy"), default="torch",
                   help="what your function takes and returns (default torch)")
    p.add_argument("--precision", choices=("float64", "float32"),
                   help="the precision your function computes in (default: its outputs' dtype)")
    p.add_argument("--accumulation", choices=("mean", "sum", "none"),
                   help="how your trainer combines micro-batch gradients; none: a step per "
                        "batch (default: the profile's, else both sum and mean are tried)")
    p.add_argument("--domain", action="append", choices=sorted(profiles.DOMAINS), metavar="TAG",
                   help="the inputs your function ever sees, overriding the profile's "
                        "(repeatable): " + ", ".join(sorted(profiles.DOMAINS)))
    p.add_argument("--kl-use", choices=("loss", "reward"),
                   help="how your trainer uses a KL term (default: the profile's, else loss)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="per call of your function (default 60); a call past it ends the "
                        "audit as inconclusive (exit 2)")
    p.add_argument("--json", action="store_true", help="the report (or the profiles) as JSON")
    p.add_argument("--list-profiles", action="store_true", help="show the trainer profiles")
    return p


def audit_main(argv, isolate: bool = False) -> int:
    """`audit`. With `isolate` (a fresh command line, whose torch has not run), the audit runs
    in a forked child: a function that ends the process, even below Python, ends the child,
    and the verdict is INCONCLUSIVE (exit 2), never the exit status it chose."""
    import json

    p = audit_parser()
    args = p.parse_args(argv)
    from .audit import profiles
    if args.list_profiles:
        print(json.dumps(profiles.to_dict(), indent=2, ensure_ascii=False) if args.json else
              profiles.describe())
        return EXIT_PASS
    if not args.target or not args.ref:
        p.error("give a target path/to/file.py:function and --ref NAME (or --list-profiles)")
    _check_cases(p, args.cases)
    if args.seed < 0:
        p.error(f"--seed is {args.seed}; expected a non-negative integer")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        p.error(f"--timeout is {args.timeout}; expected a positive number of seconds")
    if isolate:
        from . import fork
        status, result = fork.in_child(lambda: _audit(args))
        out, err, code = result if status == "ok" else _ended(args, status, result)
    else:
        out, err, code = _audit(args)
    if err:
        print(err, file=sys.stderr)
    if out:
        print(out)
    return code


def _audit(args):
    """(what to print, what to print on stderr, the exit status) of the audit `args` asks for;
    the user's module is imported here, where the audit runs."""
    from .audit import audit as run_audit
    from .audit.model import progress_stream
    try:
        with _prints_to_stderr():                 # the user's module and function print too
            fn = _load_target(args.target)
            conventions = _pairs(args.set, "--set", "ddof=1")
            rename = _pairs(args.map, "--map", "log_prob=logp") or None
            report = run_audit(fn, args.ref, backend=args.backend, profile=args.profile,
                               cases=args.cases, seed=args.seed, accumulation=args.accumulation,
                               precision=args.precision, kl_use=args.kl_use, rename=rename,
                               domain=None if args.domain is None else tuple(args.domain),
                               timeout=args.timeout,
                               progress=progress_stream(args.json or not sys.stdout.isatty()),
                               **conventions)
    except (ValueError, TypeError) as exc:
        return "", f"{_prog('audit')}: error: {exc}", EXIT_USAGE
    return _audit_output(args, report)


def _audit_output(args, report):
    import json

    out = json.dumps(report.to_dict(), indent=2, ensure_ascii=False) if args.json else \
        str(report)
    if report.verdict == "INCONCLUSIVE":
        return out, "", EXIT_USAGE
    return out, "", EXIT_PASS if report.ok else EXIT_FAIL


def _ended(args, status, how):
    """The report of an audit whose process ended without a verdict (or failed to send one)."""
    from .audit.model import AuditReport

    try:
        conventions = _pairs(args.set, "--set", "ddof=1")
    except ValueError:
        conventions = {}
    report = AuditReport(args.ref, args.profile, conventions, args.backend, 0, args.seed, [],
                         {}, n_drawn=args.cases)
    report.inconclusive.append(
        f"the process running the audit ended ({how}) before giving a verdict: your function "
        f"(or its module) ends the process; an audit needs one that returns" if status == "ended"
        else f"the process running the audit failed ({how})")
    return _audit_output(args, report)


def trainer_parser():
    from .trainer import TRAINERS

    p = argparse.ArgumentParser(
        prog=_prog("trainer"),
        description="A trainer's report card: its own functions (as installed, or in a "
                    "checkout with --path) audited against the references under its profile. "
                    "Exit 1 when a card finds a new deviation (one no known entry reproduces), "
                    "2 on a usage error (the trainer not installed, --path not holding it) or "
                    "when no row could run, 0 otherwise: known deviations and notes are on the "
                    "card.")
    p.add_argument("name", nargs="?", choices=TRAINERS, help="the trainer")
    p.add_argument("--path", metavar="DIR", help="a source checkout or a fork (default: the "
                                                 "installed package; MiniMind needs it)")
    p.add_argument("--cases", type=int, default=48, metavar="N",
                   help=f"cases per row, 1 to {MAX_CASES} (default 48)")
    p.add_argument("--seed", type=int, default=0, help="case seed (default 0)")
    p.add_argument("--json", action="store_true", help="the card as JSON")
    p.add_argument("--markdown", metavar="FILE",
                   help="also write the card as Markdown to FILE (its folder created if "
                        "missing)")
    p.add_argument("--baseline", metavar="FILE_OR_DIR",
                   help="compare with a saved card (what --json prints; with --all, the list "
                        "--all --json prints, or a folder of cards): exit 1 only for a new "
                        "deviation the baseline does not hold")
    p.add_argument("--list", action="store_true",
                   help="list the trainers and the functions each card covers")
    p.add_argument("--all", action="store_true",
                   help="the card of every installed trainer, one line each (MiniMind, which "
                        "needs --path, is left out)")
    return p


def _trainer_list() -> str:
    from . import trainer as trainers
    lines = []
    for name in trainers.TRAINERS:
        t = trainers.get(name)
        where = "installed or --path" if t.installable else "--path CHECKOUT only"
        lines.append(f"{name} (profile {t.profile}; pinned {t.pinned}; {where})")
        for r in t.rows:
            lines.append(f"  {r.module.replace('.', '/')}.py  {r.name}  ->  {r.ref}")
    return "\n".join(lines)


def _output_path(parser, option, path, folder=False) -> None:
    """The one rule for every option naming where output goes (trainer --markdown FILE,
    explain --plot DIR), applied before any work: missing folders are created; a path that
    cannot be written is a usage error (exit 2) naming the option, the path and why."""
    where = os.path.abspath(path)
    target = where if folder else os.path.dirname(where)
    up = target
    while not os.path.exists(up):                 # the deepest part of the path that exists
        up = os.path.dirname(up)
    if not folder and os.path.isdir(where):
        problem = "is a folder; expected a file name"
    elif folder and os.path.exists(where) and not os.path.isdir(where):
        problem = "is a file; expected a folder"
    elif not os.path.isdir(up):
        problem = f"{up!r} is a file, not a folder"
    else:
        try:
            os.makedirs(target, exist_ok=True)
            problem = None
        except OSError as exc:
            problem = f"cannot create its folder ({exc.strerror or exc})"
        if problem is None and (not os.access(target, os.W_OK) or (
                os.path.exists(where) and not os.access(where, os.W_OK))):
            problem = "is not writable"
    if problem:
        parser.error(f"{option} {path!r}: {problem}")


def _prints_to_stderr():
    """While a trainer's or a user's code runs: what it prints (EasyR1's "The sum of the mask is
    less than one" at every empty row) goes to stderr, so that stdout holds the report alone
    (`--json`)."""
    import contextlib
    return contextlib.redirect_stdout(sys.stderr)


def trainer_main(argv, workers: int = 1) -> int:
    import json

    p = trainer_parser()
    args = p.parse_args(argv)
    if args.list:
        print(_trainer_list())
        return EXIT_PASS
    if args.all and (args.name or args.path or args.markdown):
        p.error("--all runs every installed trainer's card: it takes no trainer name, --path "
                "or --markdown")
    if not args.name and not args.all:
        p.error("name a trainer (or --all, or --list)")
    _check_cases(p, args.cases)
    if args.seed < 0:
        p.error(f"--seed is {args.seed}; expected a non-negative integer")
    if args.markdown:
        _output_path(p, "--markdown", args.markdown)
    from . import trainer as trainers
    from .audit.model import progress_stream
    from .trainer import baseline, card, loading
    saved = None
    if args.baseline:
        try:
            saved = baseline.load(args.baseline)
        except baseline.BaselineError as exc:
            p.error(str(exc))
        if args.name and args.name not in saved:
            p.error(f"--baseline {args.baseline!r} holds no card of {args.name} (it holds "
                    f"{', '.join(sorted(saved))})")
    if args.all:
        return _all_cards(args, saved)
    try:
        with _prints_to_stderr():
            result = card.run(trainers.get(args.name), path=args.path, cases=args.cases,
                              seed=args.seed, workers=workers,
                              progress=progress_stream(args.json or not sys.stdout.isatty()))
            if saved is not None:
                result.against(saved, args.baseline)
    except loading.TrainerNotFound as exc:
        print(f"{_prog('trainer')}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(result.markdown())
    print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False) if args.json else
          result.text())
    return result.exit_code


def _all_cards(args, saved=None) -> int:
    """`trainer --all`: each installed trainer's card in one line (JSON: the cards). Exit 1
    if any card finds a new deviation (against `saved`, the baseline's cards by trainer: one
    the baseline does not hold), 2 if no trainer is installed or no card could audit
    anything, else 0."""
    import json

    from . import trainer as trainers
    from .audit.model import progress_stream
    from .trainer import card
    names = trainers.installed()
    if not names:
        print(f"{_prog('trainer')}: error: none of the trainers is installed "
              f"({', '.join(trainers.pins())}; pip install --no-deps)", file=sys.stderr)
        return EXIT_USAGE
    # one process: a card forks its second worker from a process whose torch has not run yet,
    # which after the first card no longer holds
    with _prints_to_stderr():
        cards = [card.run(trainers.get(n), cases=args.cases, seed=args.seed, workers=1,
                          progress=progress_stream(args.json or not sys.stdout.isatty()))
                 for n in names]
        if saved is not None:
            for c in cards:
                c.against(saved, args.baseline)
    if args.json:
        print(json.dumps([c.to_dict() for c in cards], indent=2, ensure_ascii=False))
    else:
        print("\n".join(c.summary() for c in cards))
    codes = {c.exit_code for c in cards}
    return 1 if 1 in codes else 2 if codes == {2} else 0


SUBCOMMANDS = {"explain": explain_main, "audit": audit_main, "trainer": trainer_main}


def main(argv=None) -> int:
    """The command line. Run as a program (argv None: a fresh process that has computed
    nothing yet), the cross-check forks a second worker when there are two cores; called with
    argv, as from Python, it stays in one process (forking a process whose torch thread pool
    has run is unsafe)."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        workers = 2 if program and (os.cpu_count() or 1) >= 2 else 1
        if argv and argv[0] == "trainer":
            return trainer_main(argv[1:], workers=workers)
        if argv and argv[0] == "audit":
            return audit_main(argv[1:], isolate=program and hasattr(os, "fork"))
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        return check_main(argv, workers=workers)
    except BrokenPipeError:            # `... | head` closed stdout: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAIL
    except ModuleNotFoundError as exc:     # a missing package is no verdict: never exit 1
        prog = _prog(argv[0] if argv and argv[0] in SUBCOMMANDS else '')
        if exc.name == "torch":
            print(f"{prog}: error: this command needs torch, which is not installed; see "
                  f"https://pytorch.org/get-started/locally/ (ref_numpy itself needs NumPy "
                  f"only)", file=sys.stderr)
        else:
            print(f"{prog}: error: this command needs the package {exc.name or exc}, which is "
                  f"not installed", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
