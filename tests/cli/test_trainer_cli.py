"""`python -m crosscheck trainer`: usage errors exit 2 with a message naming what is wrong, --list
needs no trainer installed, --json and --markdown carry the card."""
import importlib.util
import json

import pytest

from tests.helpers import run_cli


def test_no_trainer_named_is_a_usage_error():
    code, _, err = run_cli(["trainer"])
    assert code == 2 and "name a trainer" in err


def test_an_unknown_trainer_is_a_usage_error_listing_the_known_ones():
    code, _, err = run_cli(["trainer", "megatron"])
    assert code == 2 and "verl" in err and "minimind" in err


def test_minimind_without_a_path_is_a_usage_error(capsys):
    code, _, err = run_cli(["trainer", "minimind"])
    assert code == 2 and "--path" in err


def test_a_path_that_does_not_hold_the_trainer_is_a_usage_error(tmp_path):
    code, _, err = run_cli(["trainer", "verl", "--path", str(tmp_path)])
    assert code == 2 and "does not hold verl" in err


def test_bad_cases_is_a_usage_error():
    code, _, err = run_cli(["trainer", "verl", "--cases", "0"])
    assert code == 2 and "--cases" in err


def test_list_names_every_trainer_and_its_rows():
    code, out, _ = run_cli(["trainer", "--list"])
    assert code == 0
    for name in ("verl", "trl", "openrlhf", "minimind"):
        assert f"{name} (profile {name}" in out
    assert "compute_grpo_outcome_advantage  ->  group_advantages" in out


@pytest.mark.skipif(importlib.util.find_spec("openrlhf") is None,
                    reason="openrlhf is not installed (.ci/run installs it with --no-deps)")
def test_json_and_markdown_carry_the_card(tmp_path):
    md = tmp_path / "card.md"
    code, out, _ = run_cli(["trainer", "openrlhf", "--json", "--cases", "13",
                            "--markdown", str(md)])
    card = json.loads(out)
    # its five deviations (GAE's and the returns' discount through multi-turn holes; the KL
    # loss aggregated token-mean under seq-mean-token-mean, at value, gradient and micro-batch)
    # are known and reproduced: nothing new
    assert code == 0 and card["verdict"] == "KNOWN DEVIATIONS" and card["ok"] is True
    assert card["exit_code"] == 0 and card["grades"]["known deviation"] == 5
    assert card["grades"]["new deviation"] == 0
    assert card["version"] == "0.11.2" and card["cases"] == 13
    assert {r["verdict"] for r in card["rows"]} == {"CONFORMS", "KNOWN DEVIATION"}
    assert 0 < card["coverage"]["ratio"] < 1
    assert md.read_text().startswith("# Report card: openrlhf 0.11.2")


@pytest.mark.skipif(importlib.util.find_spec("openrlhf") is None,
                    reason="openrlhf is not installed (.ci/run installs it with --no-deps)")
def test_what_the_trainers_code_prints_goes_to_stderr_and_json_stays_parseable(monkeypatch):
    # EasyR1 prints "The sum of the mask is less than one ..." at every empty row it averages
    from crosscheck.trainer import card
    real = card.run_row

    def printing(*args, **kwargs):
        print("The sum of the mask is less than one, which can cause a division by zero.")
        return real(*args, **kwargs)
    monkeypatch.setattr(card, "run_row", printing)
    code, out, err = run_cli(["trainer", "openrlhf", "--json", "--cases", "2"])
    assert json.loads(out)["trainer"] == "openrlhf"
    assert "The sum of the mask is less than one" in err


@pytest.mark.parametrize("where, message", [
    ("{tmp}/blocker/card.md", "is a file, not a folder"), ("{tmp}", "is a folder")])
def test_an_unwritable_markdown_path_is_refused_before_the_card_is_computed(tmp_path, where,
                                                                            message, monkeypatch):
    from crosscheck.trainer import card
    (tmp_path / "blocker").write_text("not a folder")
    monkeypatch.setattr(card, "run", lambda *a, **k: pytest.fail("the card was computed"))
    code, out, err = run_cli(["trainer", "openrlhf", "--markdown", where.format(tmp=tmp_path)])
    assert code == 2 and out == ""
    assert f"--markdown {where.format(tmp=tmp_path)!r}: " in err and message in err


def test_markdown_into_a_missing_folder_creates_it_as_explain_plot_does(tmp_path, monkeypatch):
    from crosscheck.trainer import card

    class Card:                           # what trainer_main reads of a computed card
        exit_code = 0

        def markdown(self):
            return "# the card\n"

        def text(self):
            return "the card"
    monkeypatch.setattr(card, "run", lambda *a, **k: Card())
    target = tmp_path / "new" / "deeper" / "card.md"
    code, out, err = run_cli(["trainer", "openrlhf", "--markdown", str(target)])
    assert code == 0 and out == "the card\n"
    assert target.read_text() == "# the card\n"


def test_all_takes_no_trainer_name():
    code, _, err = run_cli(["trainer", "--all", "verl"])
    assert code == 2 and "--all" in err and "no trainer name" in err


def test_all_with_no_trainer_installed_is_a_usage_error(monkeypatch):
    import crosscheck.trainer as trainers
    monkeypatch.setattr(trainers, "TRAINERS", ("minimind",))      # a checkout only
    code, _, err = run_cli(["trainer", "--all"])
    assert code == 2 and "none of the trainers is installed" in err


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None,
                    reason="liger-kernel is not installed (.ci/run installs it with --no-deps)")
def test_all_prints_one_line_per_installed_trainer(monkeypatch):
    import crosscheck.trainer as trainers
    monkeypatch.setattr(trainers, "TRAINERS", ("liger", "minimind"))
    code, out, _ = run_cli(["trainer", "--all", "--cases", "6"])
    (line,) = out.strip().splitlines()
    assert line.startswith("liger 0.8.5: ") and "findings: " in line
    assert code == (1 if "DOES NOT CONFORM" in line else 0)
    code, out, _ = run_cli(["trainer", "--all", "--cases", "6", "--json"])
    (card,) = json.loads(out)
    assert card["trainer"] == "liger"
