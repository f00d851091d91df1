"""MiniMind's own trainer/train_grpo.py (d65ef2c) under crosscheck.live.record_loop, from a
checkout named by CROSSCHECK_MINIMIND (skipped without one: MiniMind is scripts, not a package,
and its code is not copied here). tests/live/minimind_real.py adds the recorder's lines."""
import os

import pytest

import crosscheck.live as live
from tests.live import minimind_real
from tests.live.test_loop import CISPO, GROUPS

CHECKOUT = os.environ.get("CROSSCHECK_MINIMIND", "")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(CHECKOUT, "trainer", "train_grpo.py")),
    reason="set CROSSCHECK_MINIMIND to a jingyaogong/minimind checkout at d65ef2c")
pytest.importorskip("transformers")
pytest.importorskip("datasets")


def _run(tmp_path, bug=None):
    rec = live.record_loop(CISPO, advantages=GROUPS, every=1, verbose=False)
    with rec:
        minimind_real.run_grpo(CHECKOUT, tmp_path, rec, bug=bug)
    return rec.report


def test_minimind_train_grpo_conforms_at_every_step(tmp_path):
    report = _run(tmp_path)
    assert report.ok is True, report.text()
    assert [s.step for s in report.steps] == [1, 2, 3]
    assert all(s.counts["gradient"] == [96, 0] for s in report.steps)


def test_minimind_train_grpo_without_the_accumulation_division_is_caught_as_twice(tmp_path):
    report = _run(tmp_path, bug="micro-batch-norm")
    assert report.ok is False
    assert report.steps[0].counts["micro-batch loss"] == [2, 2]
    grads = [f for f in report.deviations if f.check == "gradient"]
    assert grads and all("is 2× the documented objective's at every token" in f.message
                         for f in grads), report.text()
