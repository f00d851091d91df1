"""crosscheck.live.record_loop on home-grown loops in the shape of MiniMind's GRPO and PPO
scripts (tests/live/minimind_style.py): clean runs conform at every sampled step; a
per-micro-batch normalisation, the KL on the wrong tokens and advantages not detached are each
caught; the recorder changes nothing in the run; docs/live.md's recipe is the lines that
tests/live/minimind_real.py adds to MiniMind's own scripts."""
import os
import re

import pytest
import torch

import crosscheck.live as live
from tests.live import minimind_real
from tests.live import minimind_style as M

# MiniMind's GRPO objective in policy_objective's words (its report card's 'cispo' row)
CISPO = dict(loss="cispo", clip_high=5.0, bound="absolute", beta=0.1, kl_kind="k3",
             agg="seq-mean-token-mean", empty_rows="include")
GRPO = dict(loss="ppo", clip_low=0.2, clip_high=0.2, beta=0.1, kl_kind="k3",
            agg="seq-mean-token-mean", empty_rows="include")
GROUPS = dict(estimator="group_advantages", group_size=4, ddof=0, eps=1e-4)
# its PPO: token mean per mini-batch, + 0.02 k3, 0.5 · the clipped value loss
PPO = dict(loss="ppo", clip_low=0.2, clip_high=0.2, beta=0.02, kl_kind="k3", agg="token-mean")
VALUE = dict(clip=0.2, coef=0.5)
GAE = dict(estimator="gae", gamma=0.99, lam=0.95, whiten=dict(ddof=0, eps=1e-8))


def _grpo(objective=CISPO, every=1, advantages=GROUPS, **kw):
    rec = live.record_loop(objective, advantages=advantages, every=every, verbose=False)
    with rec:
        M.grpo(rec=rec, loss_type=objective["loss"], **kw)
    return rec.report


def _ppo(every=1, **kw):
    rec = live.record_loop(PPO, norm_over="micro-batch", value=VALUE, advantages=GAE,
                           every=every, verbose=False)
    with rec:
        M.ppo(rec=rec, **kw)
    return rec.report


@pytest.mark.parametrize("objective", [CISPO, GRPO], ids=["cispo", "grpo"])
@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_a_minimind_style_grpo_loop_conforms_at_every_step(objective, accumulation_steps):
    report = _grpo(objective, accumulation_steps=accumulation_steps)
    assert report.ok is True, report.text()
    assert [s.step for s in report.steps] == [1, 2, 3]
    for s in report.steps:
        # 2 prompts × 4 completions × 6 positions per batch; 3 tensors held constant per batch
        assert s.counts["gradient"] == [48 * accumulation_steps, 0]
        assert s.counts["micro-batch loss"] == [accumulation_steps, 0]
        assert s.counts["advantages"] == [8 * accumulation_steps, 0]
        assert s.counts["detached"] == [3 * accumulation_steps, 0]


def test_a_minimind_style_ppo_loop_with_a_critic_conforms():
    report = _ppo()
    assert report.ok is True, report.text()
    for s in report.steps:
        assert s.counts["gradient"] == [24, 0] and s.counts["micro-batch loss"] == [2, 0]
        assert s.counts["advantages"] == [24, 0]
    assert "advantages: the advantages the loop computed, against gae then whiten" in report.text()


def test_a_per_micro_batch_token_normalisation_is_caught_at_step_1():
    report = _grpo(bug="micro-batch-norm", every=10)
    assert report.ok is False
    first = report.deviations[0]
    assert first.step == 1 and first.check == "micro-batch loss"
    assert {f.check for f in report.deviations} == {"micro-batch loss", "gradient"}
    grads = [f.message for f in report.deviations if f.check == "gradient"]
    assert grads and all(m.startswith("the aggregation: the gradient is that of agg='token-mean' "
                                      "normalised over each micro-batch, not the declared "
                                      "agg='seq-mean-token-mean' over each step") for m in grads)


def test_the_kl_on_the_tokens_after_eos_is_caught_as_a_wrong_mask_at_step_2():
    report = _grpo(bug="kl-wrong-tokens", every=10)
    # at step 1 the policy is the reference: ∂k3/∂logp = 0 everywhere, nothing to see
    assert [s.step for s in report.steps] == [1, 2]
    assert not report.steps[0].deviations
    grads = [f for f in report.steps[1].deviations if f.check == "gradient"]
    assert grads and all(f.message.startswith("a wrong mask: the gradient reaches") and
                         "the objective does not count (mask = 0)" in f.message for f in grads)


def test_advantages_that_keep_the_critics_graph_are_caught_as_not_detached():
    report = _ppo(bug="not-detached", mini_batch_size=4)
    assert report.ok is False
    devs = report.deviations
    assert devs and {f.check for f in devs} == {"detached"}
    assert all("back-propagates into the advantages" in f.message for f in devs)
    # their values are the estimator's: only the gradient path is wrong
    assert all(s.counts["advantages"][1] == 0 for s in report.steps)


def test_advantages_off_the_declared_estimator_are_reported():
    report = _grpo(advantages=dict(GROUPS, ddof=1), every=10)
    assert any(f.check == "advantages" for f in report.deviations)


def test_the_recorder_changes_nothing_in_the_run():
    bare = M.grpo()
    rec = live.record_loop(CISPO, advantages=GROUPS, every=1, verbose=False)
    with rec:
        watched = M.grpo(rec=rec)
    for a, b in zip(bare.parameters(), watched.parameters()):
        assert torch.equal(a, b)


def test_only_the_scheduled_steps_are_checked():
    report = _grpo(every=2, steps=4)
    assert [s.step for s in report.steps] == [1, 2, 3]


def test_strict_stops_before_the_deviating_step_is_applied():
    rec = live.record_loop(CISPO, every=1, strict=True, verbose=False)
    with pytest.raises(live.LiveDeviation, match="micro-batch loss"):
        with rec:
            M.grpo(rec=rec, bug="micro-batch-norm")
    assert len(rec.report.steps) == 1


def test_a_loop_that_marks_no_loss_is_inconclusive():
    rec = live.record_loop(CISPO, every=1, verbose=False)
    opt = rec.optimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    with rec:
        opt.step()
    assert rec.report.ok is None
    assert "gradient checked at no sampled step" in rec.report.inconclusive


def test_a_declaration_outside_the_vocabulary_is_refused_by_name():
    with pytest.raises(ValueError, match="objective: .*agg"):
        live.record_loop(dict(loss="ppo", agg="token-sum"))
    with pytest.raises(ValueError, match="norm_over is 'batch'"):
        live.record_loop(CISPO, norm_over="batch")
    with pytest.raises(ValueError, match="advantages is .*estimator"):
        live.record_loop(CISPO, advantages=dict(estimator="rloo"))


def test_a_wrapped_optimizer_takes_an_lr_scheduler_and_is_restored_on_exit():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    rec = live.record_loop(CISPO, verbose=False)
    with rec:
        rec.optimizer(opt)
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)   # rewraps opt.step
    assert "step" not in opt.__dict__


def _squeezed(text):
    return re.sub(r"\s+", "", re.sub(r"#[^\n]*", "", text))


@pytest.mark.parametrize("which, heading", [("grpo", "`train_grpo.py`, in `grpo_train_epoch`"),
                                            ("ppo", "`train_ppo.py`, in `ppo_train_epoch`")])
def test_the_recipe_in_docs_live_is_the_lines_the_minimind_tests_add(which, heading):
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "live.md"),
               encoding="utf-8").read()
    assert heading in doc
    section = doc[doc.index(heading):]
    section = _squeezed(section[:section.index("declared as")])
    for where, anchor, added in minimind_real.LINES[which]:
        a, b = section.find(_squeezed(anchor)), section.find(_squeezed(added))
        assert a >= 0 and b >= 0, (anchor, added)
        assert (a < b) if where == "after" else (b < a), (where, anchor, added)
