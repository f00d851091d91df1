"""The docs stay true to the command line: each subcommand's command table in docs/ names every
option its --help lists (and no other), the metavars agree, and every option explains itself."""
import os
import re

import pytest

from tests.helpers import EXAMPLES, ROOT, run_cli

SECTIONS = {   # subcommand → the doc, and the heading whose command table documents it
    "": ("docs/check.md", "## Command line"),
    "audit": ("docs/audit.md", "## Command line"),
    "explain": ("docs/explain.md", "# The walkthrough"),
}


def doc_table(sub):
    path, heading = SECTIONS[sub]
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    text = text[text.index(heading):]
    text = text[:text.index("\n## ", 1)]
    return "\n".join(line for line in text.splitlines() if line.startswith("| `"))


ALIASES = {}      # short option → long option, as --help lists them


def help_entries(text):
    """{option: (metavar, description)} from argparse's help, positionals included."""
    out, current = {}, None
    for line in text.split("\n\n", 2)[-1].splitlines():
        m = re.match(r"  (-\w, )?(--?[\w-]+|\w+)( [^ ].*?)?(  +(.*))?$", line)
        if m and not line.startswith("   "):
            current = m[2]
            out[current] = ((m[3] or "").strip(), (m[5] or "").strip())
            if m[1]:
                ALIASES[m[1][:2]] = current
        elif current and line.startswith("    ") and line.strip():
            metavar, desc = out[current]
            out[current] = (metavar, (desc + " " + line.strip()).strip())
    out.pop("-h", None)
    out.pop("--help", None)
    return out


@pytest.mark.parametrize("sub", list(SECTIONS))
def test_the_docs_and_help_name_the_same_options_and_each_is_explained(sub):
    code, out, _ = run_cli(([sub] if sub else []) + ["--help"])
    assert code == 0
    entries = help_entries(out)
    options = {o for o in entries if o.startswith("-")}
    table = doc_table(sub)
    documented = {ALIASES.get(o, o)                     # "-m", "-e": python's and pip's own
                  for o in re.findall(r"(?<![\w-])(--[a-z][\w-]*|-[a-z])\b", table)
                  if o.startswith("--") or o in ALIASES}
    assert options == documented, (sub, options ^ documented)
    for option, (metavar, desc) in entries.items():
        assert desc, f"{sub or 'check'} {option} has no help text"
    for option, placeholder in re.findall(r"(--[a-z][\w-]*) ([A-Z][A-Z_=]*)\b", table):
        assert entries[option][0] == placeholder, (option, placeholder, entries[option][0])


@pytest.mark.parametrize("sub", list(SECTIONS))
def test_usage_names_the_command_as_the_docs_write_it(sub):
    code, out, _ = run_cli(([sub] if sub else []) + ["--help"])
    assert code == 0
    assert out.startswith("usage: " + " ".join(["python -m crosscheck"] + ([sub] if sub else [])))
    code, _, err = run_cli(([sub] if sub else []) + ["--no-such-option"])
    assert code == 2 and err.startswith("usage: python -m crosscheck")


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_audit_accepts_each_backend_the_help_offers(backend):
    """Each choice --help shows is accepted (a numpy-backend run of a torch adapter fails its
    checks, exit 1, but is no usage error)."""
    _, out, _ = run_cli(["audit", "--help"])
    assert "--backend {torch,numpy}" in out
    target = os.path.join(EXAMPLES, "verl_style.py:adapter")
    code, out, err = run_cli(["audit", target, "--ref", "ppo_clip_loss", "--profile", "verl",
                              "--cases", "3", "--backend", backend])
    assert code in (0, 1) and err == "", err
    assert out.startswith(f"audit against ppo_clip_loss (profile verl), backend {backend}, ")


def _parsers():
    from crosscheck import __main__ as cli
    return {"": cli.check_parser(), "audit": cli.audit_parser(),
            "explain": cli.explain_parser()}


@pytest.mark.parametrize("sub", SECTIONS)
def test_every_default_the_help_states_is_the_one_the_parser_uses(sub):
    stated = 0
    for action in _parsers()[sub]._actions:
        m = re.search(r"\(default ([^)]+)\)", action.help or "")
        if m:
            stated += 1
            value = action.default
            assert (str(value) == m[1] or
                    isinstance(value, float) and value == float(m[1])), (action.dest, value, m[1])
    assert stated >= {"": 2, "audit": 4, "explain": 1}[sub]


def test_the_command_lines_defaults_are_the_librarys():
    """`python -m crosscheck` and `audit` run what crosscheck.harness.run and crosscheck.audit
    run when called with no arguments."""
    import inspect

    from crosscheck import audit
    from crosscheck.check import stages as harness
    parsers = _parsers()
    run = inspect.signature(harness.run).parameters
    check = {a.dest: a.default for a in parsers[""]._actions}
    assert (check["seed"], check["cases"]) == (run["seed"].default, run["n_cases"].default)
    lib = inspect.signature(audit).parameters
    cli = {a.dest: a.default for a in parsers["audit"]._actions}
    for name in ("cases", "seed", "backend", "accumulation", "timeout"):
        assert cli[name] == lib[name].default, name


def test_main_reads_its_arguments_from_the_command_line(monkeypatch, capsys):
    from crosscheck import __main__ as cli
    monkeypatch.setattr("sys.argv", ["python -m crosscheck", "--list"])
    assert cli.main() == 0
    assert "policy_objective" in capsys.readouterr().out


def test_the_main_help_names_the_subcommands():
    code, out, _ = run_cli(["--help"])
    assert code == 0
    assert ("subcommands: 'python -m crosscheck audit' audits your own function against a "
            "reference; 'python -m crosscheck trainer' prints a trainer's report card; "
            "'python -m crosscheck explain' walks through the math.") in " ".join(out.split())


@pytest.mark.parametrize("sub", list(SECTIONS))
def test_usage_says_crosscheck_when_run_as_the_console_script(monkeypatch, sub):
    monkeypatch.setattr("sys.argv", ["/somewhere/bin/crosscheck"])
    code, out, _ = run_cli(([sub] if sub else []) + ["--help"])
    assert code == 0 and out.startswith("usage: " + " ".join(["crosscheck"] +
                                                              ([sub] if sub else [])) + " ")


def test_the_audit_help_states_its_exit_codes():
    code, out, _ = run_cli(["audit", "--help"])
    text = " ".join(out.split())
    assert code == 0
    assert ("Exit 0 when it conforms, 1 when it does not, 2 on a usage error or an inconclusive "
            "audit.") in text
