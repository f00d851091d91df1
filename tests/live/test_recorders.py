"""crosscheck.live.verl.record and crosscheck.live.openrlhf.record, driven the way the trainers'
actor loops call their loss functions (tests/live/actor_loops.py): clean steps conform, a
planted scaling bug and a planted count bug are caught, and the modules are restored."""
import numpy as np
import pytest
import torch

from crosscheck.trainer import get, loading
from tests.live import actor_loops


def _loaded(name, modules):
    t = get(name)
    try:
        src = loading.locate(t.package, t.dist, None, t.version_of, needs=t.modules)
    except loading.TrainerNotFound:
        pytest.skip(f"{name} is not installed (.ci/run installs it with --no-deps)")
    return loading.Loaded(src, modules)


@pytest.fixture(scope="module")
def core_algos():
    with _loaded("verl", ["verl.trainer.ppo.core_algos"]) as L:
        yield L.module("verl.trainer.ppo.core_algos")


@pytest.fixture(scope="module")
def openrlhf_modules():
    with _loaded("openrlhf", ["openrlhf.models.loss", "openrlhf.models.utils"]) as L:
        yield L.module("openrlhf.models.loss"), L.module("openrlhf.models.utils")


def _verl(core_algos, explicit=True, **kw):
    import crosscheck.live.verl as lv
    with lv.record(core_algos, verbose=False, explicit_steps=explicit) as r:
        actor_loops.verl_step(core_algos, rec=r if explicit else None, **kw)
    return r.report


def _openrlhf(mods, explicit=True, **kw):
    import crosscheck.live.openrlhf as lo
    with lo.record(*mods, verbose=False, explicit_steps=explicit) as r:
        actor_loops.openrlhf_step(mods[0], rec=r if explicit else None, **kw)
    return r.report


MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("explicit", [True, False], ids=["explicit steps", "steps by counts"])
def test_a_verl_actor_step_conforms(core_algos, mode, explicit):
    report = _verl(core_algos, explicit=explicit, mode=mode)
    assert report.ok is True, report.text()
    (step,) = report.steps
    assert step.counts["gradient"] == [48, 0]
    assert step.counts["micro-batch loss"][0] >= 2           # the loss and its agg_loss calls


@pytest.mark.parametrize("mode", MODES)
def test_verl_dividing_by_the_micro_batches_again_is_caught_as_one_half(core_algos, mode):
    report = _verl(core_algos, mode=mode, bug="twice")
    grads = [f for f in report.deviations if f.check == "gradient"]
    assert grads and all("is 0.5× the documented objective's at every token" in f.message
                         for f in grads)


def test_verl_passing_the_micro_batch_token_count_as_the_global_one_is_caught(core_algos):
    report = _verl(core_algos, bug="local")
    checks = {f.check for f in report.deviations}
    assert checks == {"global counts", "gradient"}, report.text()


def test_a_verl_kl_loss_on_the_same_log_probs_leaves_the_gradient_unjudged(core_algos):
    report = _verl(core_algos, kl=True)
    (step,) = report.steps
    assert "gradient" in step.skipped and "kl_penalty" in step.skipped["gradient"]
    assert "gradient" not in step.counts and step.counts["micro-batch loss"][1] == 0
    # the gradient, which carries the verdict, never ran: inconclusive, with the reason
    assert report.ok is None and "kl_penalty" in report.inconclusive


def test_verl_grpo_advantages_are_checked_and_a_population_std_is_caught(core_algos):
    import crosscheck.live.verl as lv
    rng = np.random.default_rng(0)
    rewards = torch.zeros(8, 5, dtype=torch.float64)
    rewards[:, -1] = torch.tensor(rng.normal(size=8))
    mask = torch.ones(8, 5, dtype=torch.bool)
    index = np.repeat(["a", "b"], 4)
    fn = lambda: core_algos.get_adv_estimator_fn("grpo")     # noqa: E731 (looked up inside)
    with lv.record(core_algos, verbose=False) as r:
        fn()(rewards, mask, index)
    assert r.report.steps[0].counts["advantages"] == [40, 0]          # 8 rows × 5 tokens
    assert r.report.ok is None                    # advantages alone carry no verdict
    real = core_algos.ADV_ESTIMATOR_REGISTRY["grpo"]

    def population_std(token_level_rewards, response_mask, index, epsilon=1e-6,
                       norm_adv_by_std_in_grpo=True, config=None):
        s = token_level_rewards.sum(-1)
        out = torch.empty_like(s)
        for k in set(index):
            rows = torch.tensor(index == k)
            out[rows] = (s[rows] - s[rows].mean()) / (s[rows].std(unbiased=False) + epsilon)
        return out[:, None] * response_mask, out[:, None] * response_mask

    core_algos.ADV_ESTIMATOR_REGISTRY["grpo"] = population_std     # as a fork registers it
    try:
        with lv.record(core_algos, verbose=False) as r:
            fn()(rewards, mask, index)
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY["grpo"] = real
    assert [f.check for f in r.report.deviations] == ["advantages"]


def test_the_verl_module_is_restored_after_the_block(core_algos):
    before = (dict(core_algos.POLICY_LOSS_REGISTRY), dict(core_algos.ADV_ESTIMATOR_REGISTRY),
              core_algos.agg_loss, core_algos.kl_penalty)
    _verl(core_algos, bug="twice")
    after = (dict(core_algos.POLICY_LOSS_REGISTRY), dict(core_algos.ADV_ESTIMATOR_REGISTRY),
             core_algos.agg_loss, core_algos.kl_penalty)
    assert before == after


@pytest.mark.parametrize("token_level", [True, False])
def test_an_openrlhf_actor_step_conforms(openrlhf_modules, token_level):
    report = _openrlhf(openrlhf_modules, token_level=token_level)
    assert report.ok is True, report.text()
    assert report.steps[0].counts["gradient"] == [48, 0]


@pytest.mark.parametrize("token_level", [True, False])
def test_openrlhf_dividing_by_the_micro_batches_again_is_caught(openrlhf_modules, token_level):
    report = _openrlhf(openrlhf_modules, token_level=token_level, bug="twice")
    grads = [f for f in report.deviations if f.check == "gradient"]
    assert grads and all("is 0.5×" in f.message for f in grads)


def test_an_openrlhf_step_with_a_dual_clip_is_judged_with_it(openrlhf_modules):
    """dual_clip 1.05 binds on this batch (negative advantages with ratios above 1.05), so the
    step conforms only if the recorder passes the dual clip on to the reference."""
    data = actor_loops.mini_batch(0)
    lp = actor_loops.log_probs(actor_loops.policy(), data["tokens"]).detach()
    ratio = torch.exp(lp - data["old"])
    assert bool(((data["adv"] < 0) & (ratio > 1.05) & data["mask"]).any())
    report = _openrlhf(openrlhf_modules, dual_clip=1.05)
    assert report.ok is True, report.text()
    assert report.steps[0].counts["gradient"] == [48, 0]


def test_openrlhf_a_local_token_count_is_caught(openrlhf_modules):
    report = _openrlhf(openrlhf_modules, bug="local")
    assert {f.check for f in report.deviations} == {"global counts", "gradient"}


def test_openrlhf_kl_values_are_checked_and_restored(openrlhf_modules):
    import crosscheck.live.openrlhf as lo
    lm, um = openrlhf_modules
    original = (lm.PolicyLoss, um.compute_approx_kl)
    lp = torch.randn(2, 3, dtype=torch.float64)
    with lo.record(lm, um, verbose=False) as r:
        for k in ("k1", "k2", "k3"):
            um.compute_approx_kl(lp, lp + 0.3, kl_estimator=k)
    assert r.report.steps[0].counts["metrics"] == [18, 0] and not r.report.deviations
    assert r.report.ok is None                    # KL values alone carry no verdict
    assert (lm.PolicyLoss, um.compute_approx_kl) == original


def test_the_recorders_refuse_a_module_that_is_not_the_trainers():
    import crosscheck.live.openrlhf as lo
    import crosscheck.live.verl as lv
    with pytest.raises(TypeError, match="has no POLICY_LOSS_REGISTRY"):
        lv.record(np)
    with pytest.raises(TypeError, match="has no PolicyLoss"):
        lo.record(np, np)
    with pytest.raises(ValueError, match="every is 0"):
        lv.record(np, every=0)


def test_an_error_inside_a_recorder_is_reported_and_the_trainers_call_goes_on():
    from crosscheck.live.recorder import Counts, Recorder
    rec = Recorder("test", 1, False, None, "src")
    lp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    # a mask whose shape is not the log-probs': the reference refuses it when the step closes
    rec.policy_call(lp, lp.detach(), torch.zeros(2, dtype=torch.float64), torch.ones(2, 4),
                    torch.tensor(0.0), Counts("token-mean", 1, None, None), dict(loss="ppo"))
    rec.close()
    assert rec.report.errors and "ValueError" in rec.report.errors[0]
    assert rec.report.ok is not False


# ------------------------------------------------------------------ a --no-deps install
NO_DEPS = """
import importlib.util, json, sys
import crosscheck.live.{name} as live
from tests.live import actor_loops
with live.record(verbose=False, explicit_steps=True) as r:
    import {module} as mod                   # what the trainer's own code would import
    fell_back = r.loaded is not None
    actor_loops.{name}_step(mod, rec=r, {bug})
print(json.dumps(dict(ok=r.report.ok, by_file=fell_back,
                      checks=sorted({{f.check for f in r.report.deviations}}),
                      left=sorted(k for k in sys.modules
                                  if k.partition(".")[0] in ("{name}", "{missing}")))))
"""


@pytest.mark.parametrize("name, module, missing", [
    ("verl", "verl.trainer.ppo.core_algos", "ray"),
    ("openrlhf", "openrlhf.models.loss", "peft"),
])
@pytest.mark.parametrize("bug", [None, "twice"])
def test_a_recorder_works_where_the_trainer_was_installed_without_its_dependencies(
        name, module, missing, bug):
    """In a fresh interpreter, as a user's run starts: the trainer's package cannot be
    imported (its __init__ needs ray, peft), so the recorder loads its math by file with the
    card loader's stand-ins, for the block only."""
    import json
    import os
    import subprocess
    import sys
    from importlib.machinery import PathFinder    # what is installed: no stand-in finders
    if PathFinder.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it with --no-deps)")
    if PathFinder.find_spec(missing) is not None:
        pytest.skip(f"{missing} is installed: the trainer imports normally")
    code = NO_DEPS.format(name=name, module=module, missing=missing,
                          bug="" if bug is None else f"bug={bug!r}")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["by_file"] is True and got["left"] == []
    if bug is None:
        assert got["ok"] is True and got["checks"] == []
    else:
        assert got["ok"] is False and "gradient" in got["checks"]


def test_a_recorder_says_in_one_line_how_to_install_a_missing_trainer(monkeypatch):
    import importlib
    import crosscheck.live.verl as lv
    real = importlib.import_module

    def absent(name, *a, **kw):
        if name.partition(".")[0] == "verl":
            raise ModuleNotFoundError(f"No module named {name!r}", name="verl")
        return real(name, *a, **kw)
    monkeypatch.setattr(importlib, "import_module", absent)
    with pytest.raises(ModuleNotFoundError) as err:
        lv.record(verbose=False)
    assert str(err.value) == "verl is not installed; install it with pip install --no-deps " \
        "verl==0.9.1"
