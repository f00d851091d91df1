"""MiniMind's own trainer/train_grpo.py and trainer/train_ppo.py (d65ef2c) under
crosscheck.live.record_loop, from a checkout named by CROSSCHECK_MINIMIND (skipped without one:
MiniMind is scripts, not a package, and its code is not copied here). tests/live/minimind_real.py
adds the recorder's lines and plants the bugs in a copy."""
import os

import pytest

import crosscheck.live as live
from tests.live import minimind_real
from tests.live.test_loop import CISPO, GROUPS, PPO, VALUE

CHECKOUT = os.environ.get("CROSSCHECK_MINIMIND", "")
pytestmark = pytest.mark.skipif(
    not all(os.path.isfile(os.path.join(CHECKOUT, "trainer", s))
            for s in ("train_grpo.py", "train_ppo.py")),
    reason="set CROSSCHECK_MINIMIND to a jingyaogong/minimind checkout at d65ef2c (its "
           "trainer/, model/ and dataset/)")
pytest.importorskip("transformers")
pytest.importorskip("datasets")

# train_ppo.py's defaults: γ 1 (--gamma), λ 0.95, whitened by the masked mean and biased
# variance with 1e-8 under the square root
GAE = dict(estimator="gae", gamma=1.0, lam=0.95, whiten=dict(ddof=0, eps=1e-8))


def _grpo(tmp_path, bug=None):
    rec = live.record_loop(CISPO, advantages=GROUPS, every=1, verbose=False)
    with rec:
        minimind_real.run_grpo(CHECKOUT, tmp_path, rec, bug=bug)
    return rec.report


def _ppo(tmp_path, bug=None, **kw):
    rec = live.record_loop(PPO, norm_over="micro-batch", value=VALUE, advantages=GAE, every=1,
                           verbose=False)
    with rec:
        minimind_real.run_ppo(CHECKOUT, tmp_path, rec, bug=bug, **kw)
    return rec.report


def _causes(report, check):
    return [f.message for f in report.deviations if f.check == check]


def test_minimind_train_grpo_conforms_at_every_step(tmp_path):
    report = _grpo(tmp_path)
    assert report.ok is True, report.text()
    assert [s.step for s in report.steps] == [1, 2, 3]
    for s in report.steps:
        # 2 micro-batches of 2 prompts × 4 generations; 3 tensors held constant in each
        assert s.counts["micro-batch loss"] == [2, 0]
        assert s.counts["advantages"] == [16, 0]
        assert s.counts["detached"] == [6, 0]
        assert s.counts["gradient"][0] >= 16 and s.counts["gradient"][1] == 0


def test_minimind_train_grpo_without_the_accumulation_division_is_caught_as_twice(tmp_path):
    report = _grpo(tmp_path, bug="micro-batch-norm")
    assert report.ok is False
    assert report.steps[0].counts["micro-batch loss"] == [2, 2]
    grads = _causes(report, "gradient")
    assert grads and all("is 2× the documented objective's at every token" in m
                         for m in grads), report.text()


def test_minimind_train_grpo_with_a_token_mean_per_micro_batch_is_caught_as_that_aggregation(
        tmp_path):
    report = _grpo(tmp_path, bug="token-mean")
    assert report.ok is False
    assert report.steps[0].counts["micro-batch loss"] == [2, 2]
    grads = _causes(report, "gradient")
    assert len(grads) == 3 and all(
        m.startswith("the aggregation: the gradient is that of agg='token-mean' normalised over "
                     "each micro-batch, not the declared agg='seq-mean-token-mean' over each "
                     "step") for m in grads), report.text()


def test_minimind_train_grpo_with_the_kl_past_the_end_token_is_caught_as_a_wrong_mask(tmp_path):
    report = _grpo(tmp_path, bug="kl-wrong-tokens")
    # at step 1 the policy is the reference: ∂k3/∂logp = 0 everywhere, nothing to see
    assert not report.steps[0].deviations
    grads = [f for f in report.deviations if f.check == "gradient"]
    assert {f.step for f in grads} == {2, 3}, report.text()
    assert all(f.message.startswith("a wrong mask: the gradient reaches") and
               "the objective does not count (mask = 0)" in f.message for f in grads)


def test_minimind_train_ppo_conforms_at_every_step(tmp_path):
    report = _ppo(tmp_path)
    assert report.ok is True, report.text()
    # 2 rollouts of 4 prompts, each updated twice in mini-batches of 2: 2 steps per rollout
    assert [s.step for s in report.steps] == [1, 2, 3, 4]
    for s in report.steps:
        assert s.counts["micro-batch loss"] == [2, 0]
        assert s.counts["detached"] == [6, 0]
        assert s.counts["gradient"][0] >= 4 and s.counts["gradient"][1] == 0
    # the advantages are computed once per rollout, in the step that starts it
    assert [s.step for s in report.steps if "advantages" in s.counts] == [1, 3]
    assert all(s.counts["advantages"][1] == 0 for s in report.steps if "advantages" in s.counts)
    assert "against gae then whiten" in report.text()


def test_minimind_train_ppo_without_the_accumulation_division_is_caught_as_twice(tmp_path):
    report = _ppo(tmp_path, bug="micro-batch-norm")
    assert report.ok is False
    assert all(s.counts["micro-batch loss"] == [2, 2] for s in report.steps)
    grads = _causes(report, "gradient")
    assert grads and all("is 2× the documented objective's at every token" in m
                         for m in grads), report.text()


def test_minimind_train_ppo_with_advantages_that_keep_the_critics_graph_is_caught(tmp_path):
    # one mini-batch per rollout, one rollout per step: the rollout's graph is back-propagated
    # once (a second backward through it would raise before the recorder saw anything)
    report = _ppo(tmp_path, bug="not-detached", mini_batch_size=4, ppo_update_iters=1,
                  accumulation_steps=1)
    assert report.ok is False
    assert {f.check for f in report.deviations} == {"detached"}, report.text()
    assert {f.step for f in report.deviations} == {1, 2}
    assert all(m.startswith("the loss back-propagates into the advantages")
               for m in _causes(report, "detached"))
    # their values are the estimator's, and the log-probs' gradient the objective's
    assert all(s.counts["advantages"][1] == 0 and s.counts["gradient"][1] == 0
               for s in report.steps)


def test_minimind_train_ppo_with_the_kl_past_the_end_token_is_caught_as_a_wrong_mask(tmp_path):
    report = _ppo(tmp_path, bug="kl-wrong-tokens")
    assert not report.steps[0].deviations
    grads = [f for f in report.deviations if f.check == "gradient"]
    assert {f.step for f in grads} == {2, 3, 4}, report.text()
    assert all(f.message.startswith("a wrong mask: the gradient reaches") and
               "the objective does not count (mask = 0)" in f.message for f in grads)
