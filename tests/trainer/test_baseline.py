"""A card compared with a saved card (`trainer NAME --baseline FILE`): a new bug is never hidden
by an old one at the same row, the unchanged trainer passes against its own baseline, and a
baseline written with another machine's last digits still matches.

The trainers' code is copied to a temporary directory and patched there (as test_planted does);
the expected outcomes follow from the patch, not from running the card."""
import importlib.util
import json
import os
import shutil

import pytest

from crosscheck import trainer as trainers
from crosscheck.__main__ import main
from crosscheck.trainer import baseline

TRL_GRPO = "torchrl/objectives/llm/grpo.py"
KL_ROW = "GRPOLoss._kl_to_ref [token_mean, kl_to_ref_coeff 0.1]"
EM = "openrlhf/trainer/ppo_utils/experience_maker.py"
GAE = "RemoteExperienceMaker.get_advantages_and_returns"


def _copy(name, tmp_path):
    t = trainers.get(name)
    spec = importlib.util.find_spec(t.package)
    if spec is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it with --no-deps)")
    from importlib import metadata
    if metadata.version(t.dist) != t.pinned:
        pytest.skip(f"{name} is not at its pinned version {t.pinned}")
    root = tmp_path / name
    shutil.copytree(os.path.dirname(spec.origin), root / t.package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _patch(root, rel, old, new):
    path = root / rel
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"the pinned code no longer holds {old!r}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def _card(capsys, *argv):
    """(exit code, the card's JSON) of `trainer ... --json`."""
    capsys.readouterr()
    code = main(["trainer", *argv, "--json", "--cases", "24"])
    return code, json.loads(capsys.readouterr().out)


def _save(tmp_path, capsys, *argv):
    code, saved = _card(capsys, *argv)
    path = tmp_path / "card.json"
    path.write_text(json.dumps(saved), encoding="utf-8")
    return code, saved, str(path)


def _perturbed(value, scale=1 + 3e-9):
    """Every float of a saved card nudged in its last digits (another machine's kernels)."""
    if isinstance(value, float):
        return value * scale
    if isinstance(value, list):
        return [_perturbed(v, scale) for v in value]
    if isinstance(value, dict):
        return {k: _perturbed(v, scale) for k, v in value.items()}
    return value


def test_a_relation_is_one_factor_rounded_or_not_a_scaling():
    assert baseline.relation(0.5, 0.25) == "×2"
    assert baseline.relation([[0.0, 0.0]], [[0.3, 0.0]]) == "×0"
    assert baseline.relation([1.0, -2.0], [-1.0, 2.0]) == "×-1"
    assert baseline.relation([1.0, 2.0], [1.0, 3.0]) == "not a scaling"
    assert baseline.relation(1.0001, 1.0) == "×(1+1e-04)"
    # near 1, the decade of the difference: rounding moves it only across a power of ten
    assert baseline.relation(1 - 1.5e-4, 1.0) == baseline.relation(1 - 9e-4, 1.0) == "×(1-1e-04)"
    assert baseline.relation("nan", 1.0) == "non-finite"
    assert baseline.relation([[True]], 1.0) == ""


def test_a_signature_carries_no_digits_beyond_a_rounded_factor():
    finding = dict(check="value", grade="deviation", known=False, kind="new", diagnosis="",
                   message="output[1]: yours 0.6000000012, reference 0.3000000007",
                   counterexample={"your output": [0.6000000012, 0.2], "reference output":
                                   [0.3000000007, 0.1]})
    nudged = dict(finding, message="output[1]: yours 0.6000000031, reference 0.3000000011",
                  counterexample=_perturbed(finding["counterexample"]))
    sig = baseline.signature("f [x]", finding)
    assert sig == "f [x] | value | deviation | new | output | ×2"
    assert baseline.signature("f [x]", nudged) == sig



def test_a_counterexample_of_unequal_groups_and_one_of_a_single_group_are_two_findings():
    # NeMo-RL's GRPO baseline: its float32 one-pass variance fails on one group at the pinned
    # commit; a mean group size planted beside it fails on groups of unequal sizes
    def finding(ids):
        return dict(check="value", grade="deviation", known=False, kind="new", diagnosis="",
                    message="output[0]: yours 1, reference 2",
                    counterexample={"rewards": [0.4, -0.1, -0.1, 0.3], "group_ids": ids,
                                    "your output": [1.0, 0.2, 0.3, 0.0],
                                    "reference output": [2.0, 0.1, 0.3, 0.0]})
    one, unequal = finding([0, 0, 0, 0]), finding([4, 4, 4, 28])
    assert baseline.signature("f", one).endswith("not a scaling | one group")
    assert baseline.signature("f", unequal).endswith(
        "not a scaling | groups of unequal sizes, a group of one")
    assert baseline.signature("f", finding([1, 1, 2, 2])).endswith("groups of equal sizes")
    assert baseline.signature("f", finding([7, 7, 3, 3])) == \
        baseline.signature("f", finding([1, 1, 2, 2]))       # the ids' values do not enter it

def _saved(output):
    return dict(check="value", grade="deviation", known=False, message="output[0]: yours 1",
                counterexample={"rewards": [[1.0, "nan"]], "mask": [[True, False]],
                                "reference output": [0.0, 0.0], "your output": output})


def test_a_replayed_counterexample_is_the_same_within_tolerance_and_new_beyond_it():
    from crosscheck import tolerances
    tol = tolerances.get("audit", "float32")
    seen = []

    def replay(value):
        def run(inputs):
            seen.append(inputs)
            return value
        return run
    saved = _saved({"advantages": [0.5, 0.0], "returns": [1.5, "nan"]})
    # another machine's last digits: the same
    assert baseline.changed(replay({"advantages": [0.5 * (1 + 1e-7), 0.0],
                                    "returns": [1.5, "nan"]}), saved, tol) == ""
    # the inputs as the counterexample states them, its outputs included (replay drops them)
    assert seen[-1]["rewards"] == [[1.0, "nan"]]
    said = baseline.changed(replay({"advantages": [0.25, 0.0], "returns": [1.5, "nan"]}),
                            saved, tol)
    assert "output[0] is now 0.25" in said and "gave 0.5" in said
    assert "now" in baseline.changed(replay({"advantages": [0.5, 0.0], "returns": [1.5, 2.0]}),
                                     saved, tol)

    def raising(inputs):
        raise ZeroDivisionError("division by zero")
    assert "raises ZeroDivisionError" in baseline.changed(raising, saved, tol)
    # nothing to replay: no hook, or a saved output that is not numbers
    assert baseline.changed(None, saved, tol) == ""
    assert baseline.changed(replay([0.0]), _saved("raised ValueError: x"), tol) == ""


def test_a_held_signature_is_new_when_the_replay_says_the_output_changed():
    row = "f [x]"
    finding = dict(_saved([1.0, 0.0]), signature=baseline.signature(row, _saved([1.0, 0.0])))
    base = {"trainer": "t", "rows": [{"function": "f", "label": "x", "findings": [finding]}]}
    same = baseline.compare([(row, finding)], base, "b.json", lambda name, f: "")
    assert [n for n, _ in same.held] == [row] and not same.new and not same.gone
    moved = baseline.compare([(row, finding)], base, "b.json",
                             lambda name, f: "its output[0] is now 2" if name == row else "")
    (name, new), = moved.new
    assert name == row and new["since"] == "its output[0] is now 2" and moved.gates
    assert [g["row"] for g in moved.gone] == [row] and not moved.held
    assert moved.to_dict()["new"][0]["since"] == "its output[0] is now 2"


def test_a_baseline_that_cannot_be_read_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]", encoding="utf-8")
    for path in (str(bad), str(tmp_path / "missing.json")):
        with pytest.raises(SystemExit) as exc:
            main(["trainer", "skyrl", "--baseline", path])
        assert exc.value.code == 2
        assert "--baseline" in capsys.readouterr().err


def test_the_unchanged_trainer_passes_against_its_own_baseline_and_another_machines(
        tmp_path):
    from crosscheck.trainer import card
    root = _copy("openrlhf", tmp_path)
    t = trainers.get("openrlhf")
    saved = card.run(t, path=str(root), cases=24, only=[GAE]).to_dict()
    # OpenRLHF's GAE known deviation (it discounts through a multi-turn row's masked steps)
    assert saved["exit_code"] == 0 and saved["grades"]["known deviation"] == 1
    again = card.run(t, path=str(root), cases=24, only=[GAE]).against(
        {"openrlhf": saved}, "card.json")
    assert again.exit_code == 0 and not again.comparison.new and not again.comparison.gone
    assert [name for name, _ in again.comparison.held] == [GAE]
    other = card.run(t, path=str(root), cases=24, only=[GAE]).against(
        {"openrlhf": _perturbed(saved)}, "other.json")
    assert other.exit_code == 0 and not other.comparison.new and not other.comparison.gone


def test_a_second_bug_at_a_row_with_a_known_deviation_is_new_since_the_baseline(tmp_path):
    from crosscheck.trainer import card
    root = _copy("openrlhf", tmp_path)
    t = trainers.get("openrlhf")
    saved = {"openrlhf": card.run(t, path=str(root), cases=24, only=[GAE]).to_dict()}
    # λ dropped from the recursion: the known entry's variant (steps of reward 0 through the
    # holes) does not reproduce that, so the row's value finding is a new deviation where the
    # baseline holds a known one
    _patch(root, EM, "lastgaelam = delta + gamma * lambd * lastgaelam",
           "lastgaelam = delta + gamma * lastgaelam")
    now = card.run(t, path=str(root), cases=24, only=[GAE]).against(saved, "card.json")
    assert now.exit_code == 1
    (name, new), = now.comparison.new
    assert name == GAE and new["check"] == "value" and not new["known"]
    assert [g["row"] for g in now.comparison.gone] == [GAE]


def test_a_second_bug_at_a_row_with_a_new_deviation_is_new_since_the_baseline(tmp_path):
    from crosscheck.trainer import card
    root = _copy("torchrl", tmp_path)
    t = trainers.get("torchrl")
    before = card.run(t, path=str(root), cases=24, only=[KL_ROW])
    assert before.exit_code == 1                  # the KL's mean over all B·T positions
    saved = {"torchrl": before.to_dict()}
    again = card.run(t, path=str(root), cases=24, only=[KL_ROW]).against(saved, "card.json")
    assert again.exit_code == 0 and not again.comparison.new
    # the KL term doubled: on every case the output is twice the baseline code's, so the
    # relation to the reference on the value's counterexample is no longer the baseline's
    _patch(root, TRL_GRPO, "return coeff * kl_penalty, kl_penalty",
           "return 2 * coeff * kl_penalty, kl_penalty")
    after = card.run(t, path=str(root), cases=24, only=[KL_ROW]).against(saved, "card.json")
    assert after.exit_code == 1
    assert ("value", False) in {(f["check"], f["known"]) for _, f in after.comparison.new}
    assert "[new since the baseline]" in after.text()
    # without the baseline, the card's verdict and exit code were already those of a failure
    assert after.verdict == before.verdict == "DOES NOT CONFORM"


def test_a_baseline_is_a_card_a_list_of_cards_or_a_folder_of_them(tmp_path, capsys):
    pytest.importorskip("skyrl")
    folder = tmp_path / "baselines"
    folder.mkdir()
    code, saved = _card(capsys, "skyrl")
    (folder / "skyrl.json").write_text(json.dumps(saved), encoding="utf-8")
    cards = baseline.load(str(folder))
    assert list(cards) == ["skyrl"] and cards["skyrl"]["version"] == saved["version"]
    both = tmp_path / "all.json"
    both.write_text(json.dumps([saved, dict(saved, trainer="verl")]), encoding="utf-8")
    assert sorted(baseline.load(str(both))) == ["skyrl", "verl"]
