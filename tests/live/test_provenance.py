"""The provenance of the loss's inputs in real TRL GRPOTrainer runs (one process, CPU, the tiny
model of tiny_trl): each planted bug is caught at its first checkable step by the check that
names it; clean runs of the settings each check depends on are not flagged."""
import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("transformers")
pytest.importorskip("datasets")

from trl import GRPOTrainer  # noqa: E402

import crosscheck.live as live  # noqa: E402
from crosscheck.live.provenance import expected_mask  # noqa: E402
from tests.live import tiny_trl  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("trl-provenance"))


def run(root, cls=None, every=1, **config):
    tr = tiny_trl.trainer(root, cls=cls, **config)
    with live.watch(tr, every=every, verbose=False) as w:
        tr.train()
    return w.report


def deviations(step, check):
    return [f for f in step.deviations if f.check == check]


TWO_REWARDS = dict(reward_funcs=[tiny_trl.reward_a, tiny_trl.reward_b], reward_weights=[1.0, 3.0])
CLEAN = [
    dict(loss_type="grpo", steps_per_generation=4, gradient_accumulation_steps=2, epsilon=1e-3,
         beta=0.04, max_steps=3),
    dict(loss_type="dapo", num_iterations=2, epsilon=1e-3, beta=0.04, max_steps=3),
    dict(loss_type="dapo", temperature=0.7, mask_truncated_completions=True,
         gradient_accumulation_steps=2, **TWO_REWARDS),
    dict(loss_type="bnpo", scale_rewards="none", beta=0.04, **TWO_REWARDS),
]


@pytest.mark.parametrize("config", CLEAN, ids=lambda c: ",".join(
    f"{k}={v}" for k, v in c.items() if k != "reward_funcs"))
def test_a_clean_run_passes_every_provenance_check_it_can_run(root, config):
    report = run(root, **config)
    assert report.ok is True, report.text()
    for s in report.steps:
        for check in ("rows", "row advantages", "mask", "global counts", "temperature"):
            assert s.counts[check][0] > 0 and s.counts[check][1] == 0, (check, s.line())
    if config.get("beta"):
        assert all(s.counts["reference log-probs"][0] > 0 for s in report.steps)
    if "reward_weights" in config and config.get("scale_rewards") != "none":
        assert all(s.counts["reward weights"][0] > 0 for s in report.steps)
    old = [s.counts.get("old log-probs", [0])[0] for s in report.steps]
    # TRL computes old log-probs only where a generation outlives a window: checked at the
    # windows that open a generation (steps 1 and 3 here), not after an update
    if config.get("steps_per_generation", 1) > 2 or config.get("num_iterations", 1) > 1:
        assert old[0] > 0 and old[1] == 0 and old[2] > 0
    else:
        assert "old log-probs" in report.not_applicable


def test_a_slice_used_twice_and_one_skipped_is_caught_at_step_one(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.SLICE_TWICE)
    report = run(root, cls=cls, every=10, loss_type="dapo", steps_per_generation=4,
                 gradient_accumulation_steps=2)
    first = report.steps[0]
    msgs = [f.message for f in deviations(first, "rows")]
    assert any("a second time in pass 1" in m for m in msgs), report.text()
    assert first.counts["rows"][1] >= 1
    second = report.steps[1]
    assert any("never in the loss (a slice skipped)" in f.message
               for f in deviations(second, "rows")), report.text()


def test_a_generation_used_for_one_pass_of_two_is_caught_when_it_is_replaced(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.ONE_PASS)
    report = run(root, cls=cls, every=10, loss_type="dapo", num_iterations=2, epsilon=1e-3,
                 max_steps=2)
    first, second = report.steps
    assert not deviations(first, "rows"), report.text()
    (f,) = deviations(second, "rows")
    assert "replaced the previous one after 1 micro-step(s)" in f.message
    assert "1 full time(s), not 2" in f.message and (f.got, f.expected) == (1.0, 2.0)


def test_advantages_rolled_against_their_rows_are_caught_at_step_one(root):
    report = run(root, cls=tiny_trl.rolled_advantages(GRPOTrainer), every=10,
                 loss_type="dapo", max_steps=1)
    (first,) = report.steps
    (f,) = deviations(first, "row advantages")
    assert "carry an advantage other than the one computed for their completion" in f.message
    # the advantages _generate_and_score_completions returned are themselves right
    assert first.counts["advantages"][1] == 0 and first.counts["rows"][1] == 0
    assert report.ok is False


def test_old_log_probs_not_the_sampling_policys_are_caught_at_step_one(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.OLD_ROLLED)
    report = run(root, cls=cls, every=10, loss_type="dapo", steps_per_generation=4,
                 gradient_accumulation_steps=2, max_steps=1)
    (first,) = report.steps
    fs = deviations(first, "old log-probs")
    assert fs and "they are not the sampling policy's (ratio ≠ 1 before any update)" in \
        fs[0].message, report.text()


def test_reference_log_probs_from_the_policy_are_caught_at_step_two(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.REF_IS_POLICY)
    report = run(root, cls=cls, every=10, loss_type="dapo", beta=0.04, max_steps=3)
    first, second = report.steps
    # at step 1 the policy is the reference: the KL-0 check passes, as it must
    assert not first.deviations and first.counts["reference log-probs"][0] > 0
    (f,) = deviations(second, "reference log-probs")
    assert "not computed with the reference model" in f.message
    assert report.ok is False


def test_a_reference_model_that_trains_is_caught_as_not_frozen(root):
    tr = tiny_trl.trainer(root, loss_type="dapo", beta=0.04, max_steps=2)
    with live.watch(tr, every=1, verbose=False) as w:
        tr.ref_model.model.norm.weight.data.mul_(1.5)      # a reference that moved
        tr.train()
    fs = deviations(w.report.steps[0], "reference log-probs")
    assert any("changed since the audit began" in f.message for f in fs), w.report.text()


def test_a_mask_one_token_past_the_end_is_caught_at_step_one(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.MASK_PAST_EOS)
    report = run(root, cls=cls, every=10, loss_type="dapo", max_steps=1)
    (first,) = report.steps
    (f,) = deviations(first, "mask")
    assert "the mask runs 1 token(s) past the first end-of-sequence token" in f.message
    assert f.got == f.expected + 1


def test_num_items_counting_padding_is_caught_as_the_global_count(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.COUNT_PADDING)
    report = run(root, cls=cls, every=10, loss_type="dapo", max_steps=1)
    (first,) = report.steps
    (f,) = deviations(first, "global counts")
    assert "num_items_in_batch is" in f.message and f.got > f.expected
    assert f.got % 4 == 0            # every position of the generation's 4 rows, padding too


def test_a_loss_at_temperature_one_while_sampling_at_0_7_is_caught_at_step_one(root):
    report = run(root, cls=tiny_trl.loss_at_temperature_one(GRPOTrainer), every=10,
                 loss_type="dapo", temperature=0.7, max_steps=1)
    (first,) = report.steps
    fs = deviations(first, "temperature")
    assert fs and "at temperature 1.0, not at the configured 0.7" in fs[0].message, \
        report.text()


def test_reward_weights_applied_twice_are_named_at_step_one(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.WEIGHTS_TWICE)
    report = run(root, cls=cls, every=10, loss_type="dapo", max_steps=1, **TWO_REWARDS)
    (first,) = report.steps
    (f,) = deviations(first, "reward weights")
    assert "reward_weights applied twice (Σ w²·r)" in f.message
    assert deviations(first, "advantages")


def test_the_expected_mask_ends_at_the_first_end_token_and_drops_truncated_rows():
    ids = np.array([[5, 1, 7, 1], [5, 6, 7, 8], [5, 6, 0, 0], [5, 6, 7, 0]])
    # end token 1, padding 0, limit 4: row 1 has no end (truncated); row 3 ends in padding
    keep = expected_mask(ids, [1], 0, 4, truncated_off=False)
    assert keep.astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1],
                                         [1, 1, 1, 1]]
    drop = expected_mask(ids, [1], 0, 4, truncated_off=True)
    assert drop.astype(int).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1],
                                         [1, 1, 1, 1]]
