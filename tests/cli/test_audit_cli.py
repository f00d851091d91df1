"""`python -m crosscheck audit`: exit codes, JSON, usage errors, every option reaching the audit."""
import json
import os
import re

import pytest

from tests.helpers import EXAMPLES, run_cli


# ================================================================ the command line
def run(argv):
    return run_cli(argv)


def test_cli_pass_fail_and_json():
    ex = os.path.join(EXAMPLES, "minimind_style.py")
    code, out, _ = run(["audit", f"{ex}:grpo_advantages", "--ref", "group_advantages",
                        "--profile", "minimind", "--cases", "20"])
    assert code == 0 and "verdict: CONFORMS" in out
    code, out, _ = run(["audit", os.path.join(EXAMPLES, "buggy.py") + ":cispo_without_detach",
                        "--ref", "cispo_loss", "--profile", "minimind", "--cases", "20", "--json"])
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and any(f["check"] == "detach" and f["status"] == "fail"
                                      for f in doc["findings"])


def test_what_the_audited_code_prints_goes_to_stderr_and_json_stays_parseable(tmp_path):
    mod = tmp_path / "noisy.py"
    mod.write_text("print('hello at import')\n\n\n"
                   "def adv(rewards, group_size):\n"
                   "    print('hello from the function')\n"
                   "    r = rewards.reshape(-1, group_size)\n"
                   "    return (r - r.mean(-1, keepdim=True)).reshape(-1)\n")
    code, out, err = run(["audit", f"{mod}:adv", "--ref", "group_advantages", "--cases", "5",
                          "--set", "scale=none", "--json"])
    assert json.loads(out)["verdict"] in ("CONFORMS", "DOES NOT CONFORM")
    assert "hello" not in out


@pytest.mark.parametrize("argv, message", [
    (["audit", "missing.py:f", "--ref", "whiten"], "does not exist"),
    (["audit", "examples/buggy.py:nope", "--ref", "whiten"], "has no function 'nope'"),
    (["audit", "examples/buggy.py", "--ref", "whiten"], "expected path/to/file.py:function"),
    (["audit", "examples/buggy.py:kl_sign_flipped", "--ref", "klx"], "ref is 'klx'"),
    (["audit", "examples/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--set", "kind"],
     "expected key=value"),
])
def test_cli_usage_errors_exit_2_with_a_message(argv, message):
    code, _, err = run(argv)
    assert code == 2 and message in err


def test_cli_list_profiles_names_each_profile_and_the_source_of_every_value():
    from crosscheck.audit.profiles import PROFILES
    code, out, _ = run(["audit", "--list-profiles"])
    assert code == 0
    for name in ("verl", "trl", "openrlhf", "minimind", "cleanrl"):
        assert re.search(rf"^{name} \([\w/-]+ ([0-9a-f]{{7,9}}|\d+\.\d+\.\d+)\): ", out, re.M), name
    for p in PROFILES.values():
        for rule in p.rules.values():
            assert f"from {rule.source}\n" in out + "\n"


def test_the_cli_passes_every_option_to_the_audit(tmp_path):
    target = tmp_path / "mine.py"
    target.write_text("import torch\n"
                      "def k3(logp, ref_logp, mask):\n"
                      "    x = torch.where(mask.bool(), ref_logp - logp, torch.zeros(()))\n"
                      "    return (torch.exp(x) - x - 1) * mask\n")
    code, out, _ = run_cli(["audit", f"{target}:k3", "--ref", "kl_penalty", "--cases", "5",
                            "--seed", "2", "--json"])
    doc = json.loads(out)
    assert code == 0 and doc["cases"] == 5 and doc["seed"] == 2 and doc["ok"]
    code, out, _ = run_cli(["audit", f"{target}:k3", "--ref", "kl_penalty", "--cases", "3",
                            "--backend", "numpy", "--json"])
    assert code == 1 and json.loads(out)["backend"] == "numpy"   # torch code given NumPy


def test_a_target_path_holding_a_colon_is_split_at_the_last_one(tmp_path):
    folder = tmp_path / "run:3"
    folder.mkdir()
    (folder / "mine.py").write_text(
        "import torch\n"
        "def k3(logp, ref_logp, mask):\n"
        "    x = torch.where(mask.bool(), ref_logp - logp, torch.zeros(()))\n"
        "    return (torch.exp(x) - x - 1) * mask\n")
    code, out, err = run_cli(["audit", f"{folder / 'mine.py'}:k3", "--ref", "kl_penalty",
                              "--cases", "3"])
    assert code == 0 and "verdict: CONFORMS" in out, err


def test_list_profiles_honours_json():
    from crosscheck.audit.profiles import PROFILES, to_dict
    code, out, _ = run_cli(["audit", "--list-profiles", "--json"])
    assert code == 0
    doc = json.loads(out)
    assert list(doc) == list(PROFILES) and doc == json.loads(json.dumps(to_dict()))


def test_an_inconclusive_audit_exits_2_and_map_makes_it_conclusive(tmp_path):
    target = tmp_path / "verl_names.py"
    target.write_text("import torch\n"
                      "def k3(log_prob, ref_log_prob, response_mask):\n"
                      "    x = torch.where(response_mask.bool(), ref_log_prob - log_prob,\n"
                      "                    torch.zeros((), dtype=log_prob.dtype))\n"
                      "    return (torch.exp(x) - x - 1) * response_mask\n")
    code, out, _ = run_cli(["audit", f"{target}:k3", "--ref", "kl_penalty", "--cases", "4"])
    assert code == 2 and "verdict: INCONCLUSIVE: the value check ran on no case" in out
    assert "--map log_prob=logp --map ref_log_prob=ref_logp --map response_mask=mask" in out
    code, out, _ = run_cli(["audit", f"{target}:k3", "--ref", "kl_penalty", "--cases", "4",
                            "--map", "log_prob=logp", "--map", "ref_log_prob=ref_logp",
                            "--map", "response_mask=mask"])
    assert code == 0 and "verdict: CONFORMS" in out
    code, _, err = run_cli(["audit", f"{target}:k3", "--ref", "kl_penalty", "--map", "log_prob"])
    assert code == 2 and "--map 'log_prob'; expected key=value, e.g. --map log_prob=logp" in err


@pytest.mark.parametrize("argv, message", [
    (["--cases", "0"], "--cases is 0; expected a whole number from 1 to 10000"),
    (["--cases", "-5"], "--cases is -5; expected a whole number from 1 to 10000"),
    (["--seed", "-1"], "--seed is -1; expected a non-negative integer"),
    (["--set", "kind=k9"], "kind is 'k9'"),
])
def test_audit_arguments_are_validated_on_the_command_line(tmp_path, argv, message):
    target = tmp_path / "mine.py"
    target.write_text("def k(logp, ref_logp, mask):\n    return logp\n")
    code, out, err = run_cli(["audit", f"{target}:k", "--ref", "kl_penalty"] + argv)
    assert code == 2 and message in err and out == ""


_PPO = ("import torch\n"
        "def ppo(logp, old_logp, advantages, mask):\n"
        "    r = torch.exp(logp - old_logp)\n"
        "    a = advantages if advantages.dim() == 2 else advantages[:, None]\n"
        "    return -torch.min(r * a, torch.clamp(r, 0.8, 1.2) * a)\n")


@pytest.mark.parametrize("name", ["noext", "mine.pyw", "mine.txt"])
def test_a_target_file_of_any_name_is_read_as_python_source(tmp_path, name):
    target = tmp_path / name
    target.write_text(_PPO)
    code, out, err = run_cli(["audit", f"{target}:ppo", "--ref", "ppo_clip_loss", "--cases", "8"])
    assert code == 0 and "verdict: CONFORMS" in out, err


@pytest.mark.parametrize("source, target, message", [
    (None, "{dir}:f", "is a directory; expected a Python file"),
    ("import sys\nsys.exit(5)\n", "{file}:f", "called sys.exit(5)"),
    ("f = 3\n", "{file}:f", "defines 'f' as a int, not a function"),
    ("def g():\n    pass\n", "{file}:f", "has no function 'f'"),
])
def test_a_target_that_is_not_a_function_is_a_usage_error_naming_what_it_is(tmp_path, source,
                                                                             target, message):
    f = tmp_path / "mine.py"
    if source is not None:
        f.write_text(source)
    code, out, err = run_cli(["audit", target.format(dir=tmp_path, file=f), "--ref",
                              "ppo_clip_loss"])
    assert code == 2 and message in err and "Traceback" not in err + out


def test_a_complex_output_is_refused_and_an_integer_one_is_named():
    import torch
    from crosscheck import audit

    def complex_ppo(logp, old_logp, advantages, mask):
        r = torch.exp(logp - old_logp)
        loss = -torch.min(r * advantages, torch.clamp(r, 0.8, 1.2) * advantages)
        return loss.to(torch.complex128) + 1j * torch.ones_like(loss)

    report = audit(complex_ppo, "ppo_clip_loss", cases=6)
    assert not report.ok and "complex128" in str(report)
    assert "returns float64" not in str(report)

    def int_ppo(logp, old_logp, advantages, mask):
        return torch.zeros(logp.shape, dtype=torch.int64)

    text = str(audit(int_ppo, "ppo_clip_loss", cases=6))
    assert "your function returns int64, compared as float64" in text


def test_a_loss_taking_only_per_token_advantages_is_told_about_domain_and_conforms_with_it(
        tmp_path):
    target = tmp_path / "tok.py"
    target.write_text("import torch\n"
                      "def ppo(logp, old_logp, advantages, mask):\n"
                      "    assert advantages.shape == logp.shape\n"
                      "    r = torch.exp(logp - old_logp)\n"
                      "    return -torch.min(r * advantages, torch.clamp(r, 0.8, 1.2) * "
                      "advantages)\n")
    code, out, _ = run_cli(["audit", f"{target}:ppo", "--ref", "ppo_clip_loss", "--cases", "30"])
    assert code == 1 and "--domain per_token_advantages" in out
    code, out, _ = run_cli(["audit", f"{target}:ppo", "--ref", "ppo_clip_loss", "--cases", "30",
                            "--domain", "per_token_advantages"])
    assert code == 0 and "verdict: CONFORMS" in out
    assert "moved into the declared domain (advantages per token)" in out
    code, _, err = run_cli(["audit", f"{target}:ppo", "--ref", "ppo_clip_loss",
                            "--domain", "tokens"])
    assert code == 2 and "invalid choice: 'tokens'" in err


@pytest.mark.parametrize("how, code, text", [
    ("os._exit(0)", 1, "FAIL raises"),
    # below Python: only the process running the audit apart from the command sees it
    ("ctypes.CDLL(None)._exit(0)", 2, "verdict: INCONCLUSIVE: the process running the audit "
                                      "ended (exit status 0) before giving a verdict")])
def test_an_audited_function_ending_the_process_never_exits_0(how, code, text, tmp_path):
    import subprocess
    import sys
    from tests.helpers import ROOT
    target = tmp_path / "ending.py"
    target.write_text("import ctypes, os\n"
                      "def k3(logp, ref_logp, mask):\n"
                      f"    {how}\n")
    proc = subprocess.run([sys.executable, "-m", "crosscheck", "audit", f"{target}:k3", "--ref",
                           "kl_penalty", "--set", "kind=k3", "--cases", "3"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert text in proc.stdout
