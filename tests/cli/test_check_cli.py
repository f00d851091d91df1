"""`python -m crosscheck`: its JSON, exit codes, listing, summary line and failure paragraphs."""
import contextlib
import dataclasses
import io
import json
import re

import jsonschema
import pytest
import torch

import ref_torch
from tests import helpers
from crosscheck import __main__ as cli
from crosscheck.check import registry, report


SCHEMA = {
    "type": "object",
    "required": ["passed", "seed", "results"],
    "properties": {
        "passed": {"type": "boolean"},
        "seed": {"type": "integer"},
        "results": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "stage", "status", "cases", "max_abs_err", "max_rel_err",
                         "worst"],
            "properties": {
                "name": {"type": "string"},
                "stage": {"enum": ["value", "vjp", "fd", "detach"]},
                "status": {"enum": ["pass", "fail"]},
                "cases": {"type": "integer", "minimum": 1},
                "max_abs_err": {"type": ["number", "string"]},
                "max_rel_err": {"type": ["number", "string"]},
                "worst": {"type": "object"},
            },
        }},
    },
}


def run_cli(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(argv)
    return code, out.getvalue()


def test_json_output_validates_and_covers_every_applicable_stage():
    code, text = run_cli(["--json", "--cases", "4"])
    assert code == 0
    doc = json.loads(text)
    jsonschema.validate(doc, SCHEMA)
    assert doc["passed"] is True and doc["seed"] == 0
    got = {(r["name"], r["stage"]) for r in doc["results"]}
    for name, e in registry.build().items():
        for stage in ("value", "vjp", "fd"):
            if (stage == "vjp" and e.numpy_vjp is None) or (stage != "value" and not e.diff):
                assert (name, stage) not in got   # a gradient-valued function, or a count
                continue
            assert (name, stage) in got
    assert ("cispo_loss", "detach") in got and ("policy_objective", "detach") in got
    assert ("gspo_loss", "detach") in got
    assert ("ppo_clip_loss", "detach") not in got


def test_json_is_byte_identical_for_the_same_seed():
    assert run_cli(["--json", "--cases", "3", "--seed", "5"]) == \
        run_cli(["--json", "--cases", "3", "--seed", "5"])


def test_exit_codes(monkeypatch):
    assert run_cli(["--only", "aggregate", "--cases", "2", "-q"])[0] == 0
    with pytest.raises(SystemExit) as e:
        run_cli(["--only", "nonesuch"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        run_cli(["--cases", "0"])
    assert e.value.code == 2
    broken = dataclasses.replace(registry.build()["whiten"],
                                 torch_fn=lambda x, mask=None, **kw: ref_torch.whiten(
                                     x, mask, **dict(kw, ddof=1)))
    monkeypatch.setattr(registry, "build", lambda: {"whiten": broken})
    code, text = run_cli(["--cases", "4"])
    assert code == 1
    assert "FAIL whiten · value" in text


def test_list_shows_every_function_with_every_column_filled():
    code, text = run_cli(["--list"])
    assert code == 0
    lines = text.splitlines()
    head = re.split(r"\s{2,}", lines[0].strip())
    assert head == ["function", "differentiable wrt", "trainers use it as", "stop-gradient",
                    "audit property checks"]
    starts = [lines[0].index(h) for h in head]
    entries = registry.build()
    assert [line.split()[0] for line in lines[1:]] == list(entries)
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        assert all(cells), line                   # "-" where a fact does not apply, never blank
    clip_fraction = next(line for line in lines if line.startswith("clip_fraction"))
    assert "- (not differentiated)" in clip_fraction
    assert "w = clip(ratio): CISPO's importance weight" in text


def test_the_summary_line_counts_failures():
    """One failure reads '1 FAILED', none 'all passed' (the verdict users grep for in CI)."""
    from crosscheck.check.results import StageResult
    ok, bad = StageResult("f", "value", cases=3), StageResult("g", "vjp", "fail", cases=3)
    assert report.summary([ok, ok], 2, 0, 3, 1.0).startswith("2 functions, 2 stage checks: "
                                                             "all passed")
    assert "2 stage checks: 1 FAILED" in report.summary([ok, bad], 2, 0, 3, 1.0)
    assert "2 stage checks: 2 FAILED" in report.summary([bad, bad], 2, 0, 3, 1.0)


def test_the_summary_line_names_the_seed_and_the_cases():
    code, text = run_cli(["--only", "aggregate", "--cases", "2", "--seed", "3"])
    assert code == 0
    assert re.fullmatch(r"1 function, 3 stage checks: all passed \(seed 3, 2 cases each, "
                        r"\d+\.\d s\)", text.strip().splitlines()[-1])


def test_every_failure_is_its_own_paragraph(monkeypatch):
    entries = registry.build()
    wrong = {n: dataclasses.replace(entries[n], torch_fn=lambda *a, **k: torch.zeros(2, 2))
             for n in ("whiten", "kl_penalty")}
    monkeypatch.setattr(registry, "build", lambda: wrong)
    code, text = run_cli(["--cases", "2", "-q"])
    heads = [line for line in text.splitlines() if "FAIL " in line]
    assert code == 1 and len(heads) == 4                   # value and vjp of each
    assert all(h.startswith("FAIL ") for h in heads)
    assert text.count("\n    reproduce: python -m crosscheck --only ") == 4


def test_json_keeps_greek_and_cjk_readable():
    code, text = run_cli(["--json", "--only", "gae", "--cases", "1"])
    assert code == 0 and "γ=0.99, λ=0.95" in text and "\\u03b3" not in text


def test_the_scale_command_reports_its_verdict_and_the_cost_of_each_part():
    code, text = run_cli(["--scale", "2000"])
    lines = text.strip().splitlines()
    assert code == 0
    assert re.fullmatch(r"--scale 2000: 39 stage checks, all passed in \d+\.\d s", lines[-1])
    for part, evals in (("fd diagonal (ppo)", 4), ("gae value", 2), ("gae vjp", 1),
                        ("gae fd", 4), ("value (12 configurations)", 24),
                        ("vjp (12 configurations)", 24)):
        assert any(re.fullmatch(rf"  {re.escape(part)} +\d+\.\d\d s \({evals} evaluations\)",
                                line) for line in lines), part


def test_the_smallest_scale_runs_and_zero_is_refused():
    code, text = run_cli(["--scale", "1"])
    assert code == 0 and "--scale 1: 39 stage checks, all passed" in text
    code, out, err = helpers.run_cli(["--scale", "0"])
    assert code == 2 and "--scale is 0; expected a positive number of tokens" in err


def test_a_closed_pipe_ends_the_run_quietly():
    """`python -m crosscheck explain | head -1`: the reader goes away mid-output; the CLI stops
    with exit 1 and no traceback."""
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "crosscheck", "explain"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_only_functions_with_a_detached_factor_list_one():
    code, text = run_cli(["--list"])
    assert code == 0
    stop = text.splitlines()[0].index("stop-gradient")
    detached = {line.split()[0] for line in text.splitlines()[1:] if line[stop] != "-"}
    assert detached == {n for n, e in registry.build().items() if e.detached}
    assert detached == {"cispo_loss", "gspo_loss", "policy_objective", "reinforce_loss",
                        "dppo_loss", "vespo_loss"}


def test_a_scale_beyond_the_available_memory_is_refused_before_any_work(monkeypatch):
    from crosscheck.check import scale
    monkeypatch.setattr(scale, "available_memory", lambda: 8 * 2 ** 30)
    monkeypatch.setattr(scale, "run", lambda *a, **k: pytest.fail("the run started"))
    code, out, err = helpers.run_cli(["--scale", "1000000000"])
    assert code == 2 and out == ""
    assert "will not fit in memory" in err and "8.0 GiB is available" in err
    assert f"{8 * 2 ** 30 // scale.BYTES_PER_TOKEN:,} tokens fit" in err


def test_without_torch_a_command_says_in_one_line_that_it_needs_it(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_torch(name, *args, **kw):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return real(name, *args, **kw)
    from crosscheck import __main__ as cli

    def check_main(*a, **k):
        import torch  # noqa: F401  (what the cross-check does first)
    monkeypatch.setattr(cli, "check_main", check_main)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    code, out, err = helpers.run_cli([])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "needs torch, which is not installed" in err


def test_a_missing_optional_package_is_a_usage_error_not_a_traceback(monkeypatch):
    from crosscheck import __main__ as cli

    def explain_main(argv):
        raise ModuleNotFoundError("No module named 'somepkg'", name="somepkg")
    monkeypatch.setitem(cli.SUBCOMMANDS, "explain", explain_main)
    code, out, err = helpers.run_cli(["explain"])
    assert code == 2 and out == ""          # 1 would read as "does not conform"
    assert err.count("\n") == 1 and "needs the package somepkg, which is not installed" in err


@pytest.mark.parametrize("prefix", [[], ["audit", "examples/buggy.py:kl_sign_flipped", "--ref",
                                         "kl_penalty"], ["trainer", "verl"]])
def test_cases_past_the_bound_is_a_usage_error_naming_the_range(prefix, monkeypatch):
    from crosscheck.check import stages
    monkeypatch.setattr(stages, "run", lambda *a, **k: pytest.fail("the run started"))
    code, out, err = helpers.run_cli(prefix + ["--cases", str(10 ** 20)])
    assert code == 2 and out == ""
    assert f"--cases is {10 ** 20}; expected a whole number from 1 to 10000" in err
    code, out, err = helpers.run_cli(prefix + ["--cases", "10001"])
    assert code == 2 and "--cases is 10001; expected a whole number from 1 to 10000" in err


LIST_SCHEMA = {
    "type": "object",
    "required": ["functions"],
    "additionalProperties": False,
    "properties": {"functions": {"type": "array", "items": {
        "type": "object",
        "required": ["name", "differentiable_wrt", "trainers_use_it_as", "stop_gradient",
                     "audit_property_checks"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string"},
            "differentiable_wrt": {"type": "array", "items": {"type": "string"}},
            "trainers_use_it_as": {"enum": ["a loss (differentiated)",
                                            "computed without grad"]},
            "stop_gradient": {"type": ["string", "null"]},
            "audit_property_checks": {"type": "array", "items": {"type": "string"}},
        },
    }}},
}


def test_list_json_prints_the_registry_as_json_with_the_columns_of_list():
    code, text = run_cli(["--list", "--json"])
    assert code == 0
    doc = json.loads(text)
    jsonschema.validate(doc, LIST_SCHEMA)
    assert [f["name"] for f in doc["functions"]] == list(registry.build())
    by_name = {f["name"]: f for f in doc["functions"]}
    assert by_name["gae"] == {"name": "gae", "differentiable_wrt": ["rewards", "values"],
                              "trainers_use_it_as": "computed without grad",
                              "stop_gradient": None, "audit_property_checks": []}
    assert by_name["cispo_loss"]["stop_gradient"] == "w = clip(ratio): CISPO's importance weight"
    assert by_name["kl_penalty"]["audit_property_checks"] == ["kl_direction"]
    code, text = run_cli(["--list", "--json", "--only", "aggregate"])
    assert [f["name"] for f in json.loads(text)["functions"]] == ["aggregate"]
