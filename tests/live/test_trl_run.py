"""crosscheck.live.watch on real TRL GRPOTrainer runs (one process, CPU, a tiny model built in
the test): clean runs conform, planted bugs are caught at their first sampled step, the run is
not disturbed."""
import json
import math

import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("transformers")
pytest.importorskip("datasets")

import torch  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

import crosscheck.live as live  # noqa: E402
from tests.live import tiny_trl  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("trl-live"))


def run(root, cls=None, every=1, strict=False, **config):
    tr = tiny_trl.trainer(root, cls=cls, **config)
    with live.watch(tr, every=every, strict=strict, verbose=False) as w:
        tr.train()
    return tr, w.report


CLEAN = [
    dict(loss_type="dapo"),
    dict(loss_type="dapo", gradient_accumulation_steps=2),
    dict(loss_type="dapo", beta=0.04),
    dict(loss_type="grpo", gradient_accumulation_steps=2, beta=0.04),
    dict(loss_type="dr_grpo", gradient_accumulation_steps=2),
    dict(loss_type="bnpo", gradient_accumulation_steps=2),
    dict(loss_type="cispo", gradient_accumulation_steps=2, epsilon_high=5.0),
    dict(loss_type="sapo", gradient_accumulation_steps=2),
    dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4,
         epsilon_high=4e-4, gradient_accumulation_steps=2),
    dict(loss_type="grpo", steps_per_generation=4, gradient_accumulation_steps=2, epsilon=1e-3,
         max_steps=3),
    dict(loss_type="dapo", num_iterations=2, epsilon=1e-3, beta=0.04, max_steps=3),
    dict(loss_type="dapo", num_iterations=2, epsilon=1e-3, delta=1.002, max_steps=3),
    dict(loss_type="vespo", gradient_accumulation_steps=2),
    dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=3e-4,
         epsilon_high=4e-4),
    dict(loss_type="sapo", importance_sampling_level="sequence", beta=0.04,
         use_bias_correction_kl=False),
    dict(loss_type="grpo", mask_truncated_completions=True, gradient_accumulation_steps=2),
    dict(loss_type="dapo", scale_rewards="batch"),
    dict(loss_type="bnpo", scale_rewards="none", beta=0.04),
    dict(loss_type="grpo", scale_rewards="group", gradient_accumulation_steps=4, beta=0.04),
    dict(loss_type="dr_grpo", temperature=0.7, gradient_accumulation_steps=2),
]


@pytest.mark.parametrize("config", CLEAN, ids=lambda c: ",".join(f"{k}={v}"
                                                                 for k, v in c.items()))
def test_an_unmodified_trl_run_conforms_at_every_checked_step(root, config):
    tr, report = run(root, **config)
    assert report.ok is True, report.text()
    assert len(report.steps) == config.get("max_steps", 2)
    for s in report.steps:
        assert s.counts["gradient"][0] > 0 and s.counts["gradient"][1] == 0
        assert s.counts["settings"][0] >= 15 and s.counts["settings"][1] == 0
        assert s.counts["micro-batch loss"] == [config.get("gradient_accumulation_steps", 1), 0]
        assert not s.deviations
    assert sum(s.counts.get("advantages", [0])[0] for s in report.steps) > 0
    # the premise: completions of different lengths, so the batches carry padding
    lengths = [h["completions/min_length"] for h in tr.state.log_history if
               "completions/min_length" in h]
    assert min(lengths) < 12


def test_metrics_are_checked_where_clipping_happens(root):
    # a tiny epsilon with a reused generation: the second window's ratios leave the clip range
    _, report = run(root, loss_type="dapo", steps_per_generation=2, gradient_accumulation_steps=1,
                    epsilon=1e-4, max_steps=2)
    assert report.ok is True, report.text()
    assert all(s.counts["metrics"][0] >= 2 for s in report.steps)


def test_a_loss_normalised_by_the_local_token_count_is_caught_at_the_first_step(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.LOCAL_COUNT)
    _, report = run(root, cls=cls, every=5, max_steps=6, loss_type="dapo",
                    gradient_accumulation_steps=2)
    assert [s.step for s in report.steps] == [1, 2, 6]
    first = report.steps[0]
    grads = [f for f in first.deviations if f.check == "gradient"]
    assert grads and all("× the documented objective's at every token" in f.message
                         for f in grads)
    assert {f.micro_batch for f in grads} == {0, 1}
    assert any(f.check == "micro-batch loss" for f in first.deviations)
    assert report.ok is False and "DEVIATES" in report.text()


def test_dividing_by_the_accumulation_steps_twice_is_caught_as_a_factor_of_one_half(root):
    _, report = run(root, cls=tiny_trl.double_accumulation(GRPOTrainer), loss_type="grpo",
                    gradient_accumulation_steps=2)
    first = report.steps[0]
    grads = [f for f in first.deviations if f.check == "gradient"]
    assert grads and all("is 0.5× the documented objective's" in f.message for f in grads)
    for f in grads:
        # the factor names the tokens that differ and why the others agree (padding)
        assert f.message.startswith("a normalisation or scaling factor: "), f.message
        assert " tokens differ ((0, 0), " in f.message, f.message
        assert "not counted (padding or after the end token), no gradient on either side" \
            in f.message, f.message
    # the loss _compute_loss returns is TRL's own: only the gradient shows the second division
    assert first.counts["micro-batch loss"][1] == 0


def test_a_loss_that_counts_padded_tokens_is_caught_at_the_first_step(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.WRONG_MASK)
    _, report = run(root, cls=cls, loss_type="dapo", gradient_accumulation_steps=2)
    grads = [f for f in report.steps[0].deviations if f.check == "gradient"]
    assert grads and all(f.message.startswith("a wrong mask: the gradient reaches ")
                         for f in grads), report.text()
    # the padded positions lie after each completion's first end token
    assert all("after their completion's first end token, which the objective does not "
               "count" in f.message for f in grads)
    assert all("scaling factor" not in f.message for f in grads)
    f = grads[0]
    assert f.token is not None and f.rank == 0 and math.isfinite(f.got)


def test_advantages_with_the_wrong_epsilon_are_caught_and_the_gradient_still_conforms(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.WIDE_EPS)
    _, report = run(root, cls=cls, loss_type="dapo")
    first = report.steps[0]
    assert [f.check for f in first.deviations] == ["advantages"]
    assert first.counts["gradient"][1] == 0


def test_strict_stops_at_the_first_deviation_and_restores_the_trainer(root):
    cls = tiny_trl.double_accumulation(GRPOTrainer)
    tr = tiny_trl.trainer(root, cls=cls, loss_type="dapo", gradient_accumulation_steps=2,
                          max_steps=4)
    with pytest.raises(live.LiveDeviation, match="step 1"):
        with live.watch(tr, every=1, strict=True, verbose=False):
            tr.train()
    assert tr.state.global_step <= 1
    for name in ("training_step", "_compute_loss", "_calculate_rewards",
                 "_generate_and_score_completions", "_get_per_token_logps_and_entropies"):
        assert name not in vars(tr)


def _final_parameters_and_losses(root, watched):
    torch.manual_seed(1)
    tr = tiny_trl.trainer(root, loss_type="dapo", gradient_accumulation_steps=2, beta=0.04)
    if watched:
        with live.watch(tr, every=1, verbose=False):
            tr.train()
    else:
        tr.train()
    params = [p.detach().clone() for p in tr.model.parameters()]
    losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
    return params, losses, torch.rand(3)


def test_the_watched_run_trains_exactly_as_the_unwatched_one(root):
    p0, l0, r0 = _final_parameters_and_losses(root, watched=False)
    p1, l1, r1 = _final_parameters_and_losses(root, watched=True)
    assert l0 == l1
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))
    assert torch.equal(r0, r1)                               # the random state too


def test_every_n_checks_steps_one_and_two_then_every_nth_from_the_first(root):
    tr, report = run(root, every=3, max_steps=7, loss_type="dapo")
    assert [s.step for s in report.steps] == [1, 2, 4, 7]
    logged = [h["crosscheck/max_rel_err"] for h in tr.state.log_history
              if "crosscheck/max_rel_err" in h]
    assert len(logged) == 4 and all(0 <= v < 1e-4 for v in logged)


def test_a_doubled_kl_coefficient_unseen_at_step_one_is_caught_at_step_two(root):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.DOUBLE_KL)
    _, report = run(root, cls=cls, every=10, max_steps=3, loss_type="dapo", beta=0.5)
    assert [s.step for s in report.steps] == [1, 2]
    first, second = report.steps
    assert not first.deviations, report.text()        # KL 0 and ∂KL/∂logp 0 at step 1
    grads = [f for f in second.deviations if f.check == "gradient"]
    assert grads, report.text()
    for f in grads:
        assert f.message.startswith("the KL term: β·KL's gradient is 2× the reference's"), \
            f.message
        assert "the KL coefficient is 1, the configuration's β is 0.5" in f.message
    assert report.ok is False


def test_another_kl_estimator_is_named_from_step_one(root):
    # k1's gradient is not 0 where the policy is the reference, k3's is
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.K1_KL)
    _, report = run(root, cls=cls, every=10, max_steps=2, loss_type="dapo", beta=0.5)
    grads = [f for s in report.steps for f in s.deviations if f.check == "gradient"]
    assert {f.step for f in grads} == {1, 2}, report.text()
    assert grads and all(f.message.startswith(
        "the KL estimator: the gradient is the policy term plus β·k1 · ratio "
        "(bias-corrected)'s, not the documented β·k3 · ratio (bias-corrected)'s")
        for f in grads), report.text()


def test_a_widened_clip_range_unseen_at_step_one_is_caught_at_step_two(root):
    # a reused generation (num_iterations 2): step 2's ratios leave [1 - ε, 1 + ε]
    # ε = 0.1: step 2's log-ratios spread over 0.03–0.46, some between ε and 2ε
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.WIDE_CLIP)
    _, report = run(root, cls=cls, every=10, max_steps=3, loss_type="dapo", num_iterations=2,
                    epsilon=0.1)
    assert [s.step for s in report.steps] == [1, 2]
    first, second = report.steps
    assert not first.deviations, report.text()        # ratio 1 everywhere at step 1
    grads = [f for f in second.deviations if f.check == "gradient"]
    assert grads, report.text()
    for f in grads:
        assert f.message.startswith("the clip bounds (ε_low, ε_high): at "), f.message
        assert "the reference clips (" in f.message and "it clips at a wider range" in f.message
        assert "narrower" not in f.message
    assert report.ok is False


def test_a_narrowed_clip_range_is_named_with_the_tokens_it_zeroes(root):
    # ε = 0.2 and the trainer's ε/4: step 2 has log-ratios between them
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.NARROW_CLIP)
    _, report = run(root, cls=cls, every=10, max_steps=2, loss_type="dapo", num_iterations=2,
                    epsilon=0.2)
    first, second = report.steps
    assert not first.deviations, report.text()
    grads = [f for f in second.deviations if f.check == "gradient"]
    assert grads, report.text()
    for f in grads:
        assert f.message.startswith("the clip bounds (ε_low, ε_high): at "), f.message
        assert "inside the reference's clip range (" in f.message
        assert "it clips at a narrower range" in f.message and "wider" not in f.message


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_a_mask_not_cut_at_the_end_token_is_a_mask_finding_at_step_one(root, loss_type):
    cls = tiny_trl.patched(GRPOTrainer, *tiny_trl.NO_END_CUT)
    _, report = run(root, cls=cls, every=10, max_steps=1, loss_type=loss_type)
    grads = [f for f in report.steps[0].deviations if f.check == "gradient"]
    assert grads, report.text()
    for f in grads:
        assert f.message.startswith("a wrong mask: the gradient reaches "), f.message
        assert "after their completion's first end token, which the objective does not " \
               "count" in f.message
        assert "scaling factor" not in f.message
    assert report.ok is False


def test_a_clean_run_with_kl_and_clipping_conforms_at_steps_one_and_two(root):
    _, report = run(root, every=10, max_steps=3, loss_type="dapo", beta=0.5, num_iterations=2,
                    epsilon=1e-3)
    assert [s.step for s in report.steps] == [1, 2]
    assert report.ok is True, report.text()
    assert all(s.counts["gradient"] == [s.counts["gradient"][0], 0] for s in report.steps)


def test_steps_per_generation_above_accumulation_is_a_documented_choice_for_dapo(root):
    _, report = run(root, loss_type="dapo", steps_per_generation=4, gradient_accumulation_steps=2,
                    max_steps=2)
    assert report.ok is True, report.text()
    notes = [f for f in report.findings if f.grade == "documented choice"]
    # two windows share one generation batch; their token counts differ, and TRL divides both
    # by the mean, as its code documents
    assert notes and "rescale it to one accumulation window" in notes[0].source


def test_a_configuration_the_reference_cannot_express_is_reported_not_guessed(root):
    _, report = run(root, loss_type="dapo", top_entropy_quantile=0.5, max_steps=1)
    assert any("top_entropy_quantile" in w for w in report.not_expressed)
    s = report.steps[0]
    assert "micro-batch loss" in s.skipped and "micro-batch loss" not in s.counts
    assert "not checked" in s.line()
    # the loss and the gradient never ran: no green verdict on what was not checked
    assert report.ok is None and report.verdict() == "INCONCLUSIVE"
    assert "gradient checked at no sampled step (top_entropy_quantile=0.5" in report.inconclusive


def test_the_report_is_json_with_the_verdict_and_every_finding(root):
    cls = tiny_trl.double_accumulation(GRPOTrainer)
    _, report = run(root, cls=cls, loss_type="grpo", gradient_accumulation_steps=2, max_steps=1)
    d = json.loads(report.json())
    assert d["verdict"] == "DEVIATES" and d["ok"] is False
    f = d["steps"][0]["findings"][0]
    assert {"step", "check", "grade", "rank", "micro_batch", "token", "got", "expected"} <= set(f)
    assert any(c.startswith("gradient: ") for c in d["checked"])
    assert "rank agreement: not applicable (one process)" in d["checked"]
    assert "the rewards, as your reward functions returned them" in d["trusted"]
    assert any("reference model's log-probs" in t for t in d["trusted"]) is False   # β = 0


def test_a_method_the_user_set_on_the_instance_is_restored_as_it_was(root):
    tr = tiny_trl.trainer(root, loss_type="dapo", max_steps=1)
    calls = []
    own = tr._compute_loss

    def mine(model, inputs):
        calls.append(1)
        return own(model, inputs)
    tr._compute_loss = mine
    with live.watch(tr, every=1, verbose=False) as w:
        tr.train()
    assert tr._compute_loss is mine and calls and w.report.ok is True


def test_an_error_inside_the_audit_is_reported_and_the_run_goes_on(root):
    tr = tiny_trl.trainer(root, loss_type="dapo", max_steps=2)
    w = live.watch(tr, every=1, verbose=False)

    def broken(gathered):
        raise RuntimeError("planted")
    w._check = broken
    with w:
        tr.train()
    assert tr.state.global_step == 2
    assert len(w.report.errors) == 2 and "RuntimeError: planted" in w.report.errors[0]
    assert w.report.ok is None and "audit errors" in w.report.text()


def test_a_trainer_without_the_methods_it_wraps_is_refused_by_name(root):
    tr = tiny_trl.trainer(root, loss_type="dapo", max_steps=1)
    tr._get_per_token_logps_and_entropies = None          # as a release that renamed it
    with pytest.raises(TypeError, match="has no _get_per_token_logps_and_entropies"):
        live.watch(tr)


def test_watch_refuses_bad_arguments_by_name(root):
    with pytest.raises(ValueError, match="every is 0"):
        live.watch(object(), every=0)
    with pytest.raises(TypeError, match="every is str"):
        live.watch(object(), every="10")
    with pytest.raises(TypeError, match="expected a TRL or ms-swift GRPOTrainer"):
        live.watch(object())


def test_log_probs_returned_alone_are_captured_whole_as_from_a_tuple():
    # older TRL releases return the log-probs alone, newer ones (log-probs, entropies)
    from types import SimpleNamespace

    from crosscheck.live.trl import TRLWatch
    watch = TRLWatch.__new__(TRLWatch)
    watch.t = SimpleNamespace(accelerator=SimpleNamespace(scaler=None))
    lp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3]])
    for out in (lp, (lp, None), (lp, lp.exp())):
        cap = {}
        watch._capture_logps(out, cap)
        np.testing.assert_array_equal(cap["logp"], lp.numpy())
        assert cap["dtype"] == "float32"
        assert ("entropy" in cap) == (isinstance(out, tuple) and out[1] is not None)


def _drifted(attr, factor):
    """A subclass that changes one setting after GRPOTrainer.__init__ read its configuration."""
    def __init__(self, *args, **kwargs):
        GRPOTrainer.__init__(self, *args, **kwargs)
        setattr(self, attr, factor * getattr(self, attr))
    return type(f"Drifted{attr}", (GRPOTrainer,), {"__init__": __init__})


@pytest.mark.parametrize("attr, configured", [("beta", 0.04), ("epsilon_high", 0.2)])
def test_a_trainer_attribute_that_disagrees_with_its_configuration_is_reported_at_step_one(
        root, attr, configured):
    # at step 1 neither shows in the loss (KL 0, every ratio 1): only the setting itself does
    _, report = run(root, cls=_drifted(attr, 2.0), every=10, max_steps=1, loss_type="dapo",
                    beta=0.04)
    (first,) = report.steps
    assert [f.check for f in first.deviations] == ["settings"], report.text()
    (f,) = first.deviations
    assert f"trainer.{attr} is {2 * configured!r} but its configuration says {configured!r}" \
        in f.message
    assert (f.got, f.expected) == (2 * configured, configured)
    assert first.counts["settings"][1] == 1 and report.ok is False
    # the step is judged against the configuration the user wrote
    assert ("epsilon_high" if attr == "epsilon_high" else "beta", configured) in \
        [(k, v) for k, v, _ in report.config]
