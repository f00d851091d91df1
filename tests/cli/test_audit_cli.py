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
        assert re.search(rf"^{name} \([\w/-]+ [0-9a-f]{{7,9}}\): ", out, re.M), name
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
