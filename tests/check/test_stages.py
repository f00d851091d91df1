"""The stages catch planted bugs at the right stage and name them; the real registry passes."""
import dataclasses
import math
import re
import sys

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from crosscheck import bridge
from crosscheck.check import cases as cases_mod
from crosscheck.check import finite_diff, registry, report, results, stages
from tests.helpers import EXAMPLES

sys.path.insert(0, EXAMPLES)
import planted_twin  # noqa: E402


SEED = 0


def run_with(name, **replace):
    entry = dataclasses.replace(registry.build()[name], **replace)
    return {r.stage: r for r in stages.run_entry(entry, SEED, N)}


def assert_caught(results, name, stage, input_name):
    r = results[stage]
    assert r.status == "fail", f"{name} {stage} should have failed"
    msg = report.failure_message(r)
    assert f"FAIL {name} · {stage} · input {input_name} · seed {SEED}" in msg
    assert "shape (" in msg
    assert f"reproduce: python -m crosscheck --only {name} --seed {SEED}" in msg
    return msg


N = 8


def test_the_real_registry_passes_on_these_cases():
    for name in registry.build():
        results = run_with(name)
        assert all(r.passed for r in results.values()), [report.failure_message(r) for r in
                                                         results.values() if not r.passed]


def test_vjp_missing_the_ratio_factor_fails_vjp_and_fd():
    def vjp_without_ratio(g, logp, old_logp, advantages, mask=None, **kw):
        good = ref_numpy.ppo_clip_loss_vjp(g, logp, old_logp, advantages, mask, **kw)["logp"]
        m = np.ones(np.shape(logp), bool) if mask is None else np.asarray(mask, bool)
        with np.errstate(invalid="ignore"):                   # padding may be NaN − NaN
            ratio = np.exp(np.where(m, np.asarray(logp) - np.asarray(old_logp), 0.0))
        return {"logp": np.where(m, good / ratio, 0.0)}      # −A instead of −A·r

    results = run_with("ppo_clip_loss", numpy_vjp=vjp_without_ratio)
    msg = assert_caught(results, "ppo_clip_loss", "vjp", "logp")
    assert "ref_numpy hand VJP" in msg and "torch autograd" in msg
    assert_caught(results, "ppo_clip_loss", "fd", "logp")
    assert results["value"].passed


def test_whitening_vjp_missing_the_variance_path_is_caught():
    def vjp_mean_only(g, x, mask=None, *, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True,
                      restore_mean=False):
        m = np.ones(np.shape(x), bool) if mask is None else np.asarray(mask, bool)
        xs = np.where(m, x, 0.0)
        n = m.sum()
        var = (np.where(m, xs - xs.sum() / n, 0.0) ** 2).sum() / (n - ddof)
        s = {"var": np.sqrt(var + eps), "clamp": np.sqrt(max(var, eps)),
             "std": np.sqrt(var) + eps}[eps_mode]
        gm = np.where(m, g, 0.0)
        gx = (gm - m * gm.sum() / n) / s if shift_mean or restore_mean else gm / s
        gx = gx + m * gm.sum() / n if restore_mean else gx
        return {"x": np.where(m, gx, 0.0)}                    # forgot ∂s/∂x

    results = run_with("whiten", numpy_vjp=vjp_mean_only)
    assert_caught(results, "whiten", "vjp", "x")
    assert_caught(results, "whiten", "fd", "x")


def test_twin_with_the_wrong_ddof_fails_value():
    def whiten_unbiased(x, mask=None, *, ddof=0, **kw):
        return ref_torch.whiten(x, mask, ddof=1, **kw)

    results = run_with("whiten", torch_fn=whiten_unbiased)
    msg = assert_caught(results, "whiten", "value", "output")
    assert re.search(r"worst at \[\d+, \d+\] \(element-wise\): ref_torch = \S+, "
                     r"ref_numpy = \S+ \(\|diff\| \S+ > allowed \S+\)", msg), msg


def test_group_twin_with_the_wrong_ddof_fails_value():
    def grpo_unbiased(rewards, **kw):
        return ref_torch.group_advantages(rewards, **dict(kw, ddof=1))

    results = run_with("group_advantages", torch_fn=grpo_unbiased)
    assert_caught(results, "group_advantages", "value", "output")


def test_missing_detach_is_caught_by_vjp_and_detach_stages():
    results = run_with("cispo_loss", torch_fn=planted_twin.cispo_without_detach)
    assert results["value"].passed                           # the value cannot show it
    assert_caught(results, "cispo_loss", "vjp", "logp")
    msg = assert_caught(results, "cispo_loss", "detach", "logp")
    assert "scipy finite differences (detached factor frozen) = " in msg
    assert results["fd"].passed                               # the hand VJP is still right


def test_detach_stage_reports_the_distance_to_the_undetached_gradient():
    r = run_with("cispo_loss")["detach"]
    assert r.passed
    assert r.worst["undetached_fd_max_abs_diff"] > 1e-3     # the detach matters on these cases


def test_hand_vjp_differentiating_the_detached_weight_fails_fd():
    def vjp_through_w(g, logp, old_logp, advantages, mask=None, **kw):
        t = {k: (None if v is None else torch.as_tensor(np.asarray(v)))
             for k, v in dict(logp=logp, old_logp=old_logp, advantages=advantages,
                              mask=mask).items()}
        lp = t["logp"].clone().requires_grad_(True)
        out = planted_twin.cispo_without_detach(lp, t["old_logp"], t["advantages"], t["mask"], **kw)
        (gr,) = torch.autograd.grad((out * torch.as_tensor(g)).sum(), [lp])
        return {"logp": gr.numpy()}

    results = run_with("cispo_loss", numpy_vjp=vjp_through_w)
    assert_caught(results, "cispo_loss", "fd", "logp")


def test_policy_logp_detached_by_accident_is_caught():
    def objective_detached(logp, *args, **kwargs):
        return ref_torch.policy_objective(logp.detach(), *args, **kwargs)

    results = run_with("policy_objective", torch_fn=objective_detached)
    assert results["value"].passed
    assert_caught(results, "policy_objective", "vjp", "logp")


def test_a_twin_that_raises_is_a_reported_failure_not_a_crash():
    def broken(*a, **k):
        raise RuntimeError("boom")

    results = run_with("kl_penalty", torch_fn=broken)
    msg = assert_caught(results, "kl_penalty", "value", "-")
    assert "raised RuntimeError: boom" in msg


def test_a_twin_leaking_padding_into_outputs_is_caught():
    def leaky(loss, mask, **kw):
        return ref_torch.aggregate(torch.nan_to_num(loss, nan=1.0, posinf=1.0, neginf=1.0),
                                   torch.ones_like(mask, dtype=torch.bool), **kw)

    results = run_with("aggregate", torch_fn=leaky)
    assert_caught(results, "aggregate", "value", "output")


def test_a_twin_writing_into_padding_is_caught_at_the_first_such_position():
    def fills_padding(x, mask=None, **kw):
        return torch.where(mask.bool(), ref_torch.whiten(x, mask, **kw), torch.ones(()))

    results = run_with("whiten", torch_fn=fills_padding)
    msg = assert_caught(results, "whiten", "value", "output")
    m = re.search(r"output output is not 0 at masked position \((\d+), (\d+)\): "
                  r"ref_numpy 0\.0, ref_torch 1\.0", msg)
    assert m, msg
    case = results["value"].worst["case"]
    mask = registry.build()["whiten"].case(cases_mod.rng_for(SEED, "whiten", case), case) \
        .arrays["mask"]
    first = tuple(int(k) for k in np.argwhere(~mask)[0])
    assert (int(m[1]), int(m[2])) == first and results["value"].worst["index"] == list(first)


def test_a_twin_returning_nan_at_a_valid_position_is_counted():
    def one_nan(x, mask=None, **kw):
        out = ref_torch.whiten(x, mask, **kw).clone()
        out.view(-1)[0] = float("nan")                    # the first entry is always valid
        return out

    results = run_with("whiten", torch_fn=one_nan)
    msg = assert_caught(results, "whiten", "value", "output")
    assert "output output holds NaN for finite valid inputs (ref_numpy: 0, ref_torch: 1 " \
           "entries)" in msg


def test_a_wrong_gradient_valued_output_is_named_by_the_objective_check():
    """kl_estimator_gradient returns gradients: its fd stage differentiates the objectives they
    are gradients of, and names the output that is wrong."""
    real = ref_numpy.kl_estimator_gradient

    def reverse_off(logits, ref_logits, **kw):
        out = dict(real(logits, ref_logits, **kw))
        out["grad_kl_reverse"] = out["grad_kl_reverse"] * 1.01
        return out

    results = run_with("kl_estimator_gradient", numpy_fn=reverse_off)
    msg = assert_caught(results, "kl_estimator_gradient", "fd", "logits")
    assert results["fd"].worst["output"] == "grad_kl_reverse"
    assert "ref_numpy grad_kl_reverse = " in msg
    assert "scipy finite differences of its expectation = " in msg


def test_the_roundoff_bound_holds_and_is_within_100x_of_the_real_error():
    """finite_diff.roundoff must bound the error of a difference quotient of values of size C
    (else fd would blame a correct gradient), and not be so loose that it hides a wrong one."""
    worst = 0.0
    for C in (1e3, 1e6, 1e9):
        for step in (1e-2, 1e-3):
            bound = finite_diff.roundoff(C, step)
            for x0 in np.linspace(0.0, 1.0, 5):
                err = abs(finite_diff.directional(lambda t: C + np.sin(x0 + t), step) -
                          np.cos(x0))
                assert err <= bound, (C, step, x0, err, bound)
                worst = max(worst, err / bound)
    assert worst >= 1e-2


@pytest.mark.parametrize("name, extra", [
    ("gspo_loss", {}),
    ("policy_objective", dict(loss="gspo", agg="token-mean", beta=0.1, kl_kind="k3")),
    ("policy_objective", dict(loss="gspo", agg="seq-mean-token-sum", beta=0.0)),
])
def test_gspo_rows_beyond_the_log_ratio_cap_pass_every_stage(name, extra):
    """log_ratio_max caps log s from above only: a row with ρ̄ = 12 > 10 has no gradient, one
    with ρ̄ = −11.5 keeps its gradient. The fd and detach oracles (ρ̄ frozen) must say the same;
    a two-sided clamp in the freeze rule once zeroed the second row's gradient."""
    rng = np.random.default_rng(0)
    B, T = 3, 5
    m = np.ones((B, T), bool)
    m[1, 3:] = False
    logp = np.log(rng.uniform(0.05, 0.95, (B, T)))
    noise = rng.normal(0, 0.4, (B, T))
    noise -= np.where(m, noise, 0).sum(1, keepdims=True) / m.sum(1, keepdims=True)
    rho = np.array([[12.0], [-11.5], [0.5]]) + noise
    arrays = dict(logp=logp, old_logp=logp - rho, advantages=rng.normal(size=(B, T)), mask=m)
    if name == "policy_objective":
        arrays["ref_logp"] = logp + rng.normal(0, 0.3, (B, T))
    case = cases_mod.Case("rows beyond ±cap", arrays, dict(clip_low=0.2, clip_high=0.28,
                                                           form="token", log_ratio_max=10.0,
                                                           **extra))
    entry = registry.build()[name]
    for stage in ("value", "vjp", "fd", "detach"):
        res = results.StageResult(name, stage)
        stages.run_stage(entry, stage, case, 0, SEED, res)
        assert res.passed, report.failure_message(res)
    hand = ref_numpy.gspo_loss_vjp(np.ones((B, T)), **{k: arrays[k] for k in
                                                       ("logp", "old_logp", "advantages", "mask")},
                                   clip_low=0.2, clip_high=0.28, log_ratio_max=10.0)["logp"]
    assert not hand[0].any() and hand[1, :3].any()


def test_the_directional_mode_is_sound_on_the_registry_and_still_catches_a_bug(monkeypatch):
    """Cases above FULL_JACOBIAN_MAX_INPUTS are judged by random directional derivatives, with
    the round-off allowance scaled by Σ|u|; forced on every case, the real references still
    pass and a VJP missing the ratio factor still fails."""
    monkeypatch.setattr(finite_diff, "FULL_JACOBIAN_MAX_INPUTS", 0)
    for name in ("gae", "whiten", "ppo_clip_loss", "cispo_loss", "gspo_loss", "policy_objective",
                 "kl_penalty", "aggregate"):
        for r in run_with(name).values():
            assert r.passed, report.failure_message(r)
            if r.stage in ("fd", "detach"):
                assert r.worst["mode"].startswith("directional")
    real = ref_numpy.ppo_clip_loss_vjp

    def vjp_doubled(g, *a, **k):
        return {"logp": 2 * real(g, *a, **k)["logp"]}
    assert_caught(run_with("ppo_clip_loss", numpy_vjp=vjp_doubled), "ppo_clip_loss", "fd", "logp")


def test_a_wrong_second_output_is_named_by_its_own_name():
    """gae returns (advantages, returns): a twin whose returns are off is blamed on `returns`."""
    def returns_off(*a, **k):
        adv, ret = ref_torch.gae(*a, **k)
        return adv, ret * 1.001
    msg = assert_caught(run_with("gae", torch_fn=returns_off), "gae", "value", "returns")
    assert "input advantages" not in msg


def test_a_full_jacobian_failure_names_the_output_and_input_entries():
    def vjp_doubled(g, *a, **k):
        return {"logp": 2 * ref_numpy.kl_penalty_vjp(g, *a, **k)["logp"]}
    msg = assert_caught(run_with("kl_penalty", numpy_vjp=vjp_doubled), "kl_penalty", "fd", "logp")
    m = re.search(r"worst at doutput\[(\d+), (\d+)\] / dlogp\[(\d+), (\d+)\] \(full Jacobian\): "
                  r"ref_numpy hand VJP = ", msg)
    assert m, msg
    # kl_penalty is per token: its Jacobian is diagonal, so the worst entry is d out[i] / d in[i]
    assert m.group(1, 2) == m.group(3, 4), msg


def test_a_failing_comparison_of_huge_values_records_their_finite_difference():
    """abs_err is |got − expected| whenever that difference is finite, even if got + expected
    would overflow (1.5e308 + 1e308)."""
    res = results.StageResult("f", "value")
    cmp = bridge.Comparison(False, 2.0, 5e307, 0.33, (0,), 1.5e308, 1.0e308, 1.0)
    results.record(res, cmp, {"case": 0})
    assert res.status == "fail" and res.worst["abs_err"] == 5e307
    res = results.StageResult("f", "value")
    results.record(res, bridge.Comparison(False, 2.0, 1.0, 1.0, (0,), math.nan, 1.0, 1.0),
                    {"case": 0})
    assert res.worst["abs_err"] == math.inf


def test_a_flat_index_into_the_second_output_names_it():
    outs = (np.zeros((2, 3)), np.zeros((4, 5)))
    assert stages.unflat_index(outs, 4, ("advantages", "returns")) == ["advantages", 1, 1]
    assert stages.unflat_index(outs, 6 + 7, ("advantages", "returns")) == ["returns", 1, 2]
    assert stages.unflat_index(outs, 26, ("advantages", "returns")) == []


def test_the_command_splits_the_check_over_two_processes_and_reports_the_same_results():
    """Run as a program on two cores the cross-check forks a child for every other function;
    its results are those one process computes, stage for stage."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import run_cli
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the command runs the check in one process")
    argv = ["--json", "--cases", "3", "--only", "gae,whiten,aggregate,kl_penalty"]
    proc = subprocess.run([sys.executable, "-m", "crosscheck"] + argv, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, out, _ = run_cli(argv)
    assert code == 0
    forked, one = json.loads(proc.stdout), json.loads(out)
    key = lambda r: (r["name"], r["stage"])          # noqa: E731
    assert sorted(forked["results"], key=key) == sorted(one["results"], key=key)
    assert {r["name"] for r in forked["results"]} == {"gae", "whiten", "aggregate", "kl_penalty"}


@pytest.mark.parametrize("params", [
    dict(loss="cispo", bound="absolute", clip_high=5.0, beta=0.1, kl_kind="k3",
         kl_weight="ratio"),
    dict(loss="cispo", bound="absolute", clip_high=5.0, beta=0.1, kl_kind="k2", kl_anchor="old"),
    dict(loss="dppo", clip_low=0.9, clip_c=None, beta=0.1, kl_kind="k2", kl_anchor="old"),
    dict(loss="gspo", form="token", clip_low=0.5, clip_high=0.5, beta=0.1, kl_kind="k1",
         kl_weight="ratio"),
    dict(loss="gspo", form="token", clip_low=0.5, clip_high=0.5, beta=0.1, kl_kind="k1",
         kl_anchor="old"),
], ids=lambda p: f"{p['loss']}-{p.get('kl_weight') or p.get('kl_anchor')}")
def test_a_frozen_stop_gradient_leaves_the_kl_terms_ratio_and_anchor_live(params):
    # the fd stage's frozen objective holds the policy loss's detached ratio, while the KL term
    # reads old_logp through its attached ratio or as its anchor: its central differences must
    # give the hand VJP (freezing the whole objective gave r·∂k alone for CISPO with the ratio)
    rng = np.random.default_rng(3)
    logp = np.log(rng.uniform(0.2, 0.8, (2, 3)))
    old = logp - rng.normal(0.0, 0.1, (2, 3))
    arrays = dict(logp=logp, old_logp=old, advantages=rng.normal(size=(2, 3)),
                  mask=np.ones((2, 3), bool), ref_logp=logp + rng.normal(0.0, 0.3, (2, 3)))
    params = dict(params, agg="token-mean")
    rule = registry.REGISTRY["policy_objective"].freeze_for(params)
    assert rule is not None
    h = 1e-6
    fd = np.zeros(logp.shape)
    for i in np.ndindex(logp.shape):
        step = np.zeros(logp.shape)
        step[i] = h
        up, down = (rule(ref_numpy.policy_objective, arrays, params, "logp", s) for s in
                    (step, -step))
        fd[i] = (up[0](**up[1], **up[2]) - down[0](**down[1], **down[2])) / (2 * h)
    hand = ref_numpy.policy_objective_vjp(1.0, **arrays, **params)["logp"]
    np.testing.assert_allclose(fd, hand, rtol=1e-6, atol=1e-9)


def test_every_diagnosis_grid_lists_distinct_values_its_default_among_them():
    # the diagnosis searches these values (crosscheck.audit.diagnose): a repeated value is a
    # lost one, and a function's own default must be among the conventions it can suggest
    for name, entry in registry.REGISTRY.items():
        for key, values in (entry.grid or {}).items():
            assert isinstance(values, tuple) and values, (name, key)
            assert len({repr(v) for v in values}) == len(values), (name, key, values)
            if key in entry.defaults:
                assert entry.defaults[key] in values, (name, key, entry.defaults[key])


def _passk_at_n2(rewards):
    """passk_advantages' cross-check entry run on one case of pairs at eps = 0, where
    A = ±√2 whatever the rewards are (σ = |Δ|/√2): the gradient is 0, and the hand VJP forms it
    as g/σ − g·Δ²/(2σ³), a difference of two terms of size |g|/σ."""
    case = cases_mod.Case("pairs close together", dict(rewards=np.asarray(rewards)),
                          dict(group_size=2, eps=0.0, scale="group"))
    return dataclasses.replace(registry.build()["passk_advantages"],
                               case=lambda rng, i: case)


def test_a_vjp_whose_terms_cancel_to_zero_is_judged_at_its_condition():
    entry = _passk_at_n2([-1.0, -0.997, 2.195, 2.1957, 0.5, 0.25])
    assert ref_numpy.passk_advantages(**{"rewards": np.array([-1.0, -0.997])}, group_size=2,
                                      eps=0.0)[1] == pytest.approx(math.sqrt(2))
    r = {x.stage: x for x in stages.run_entry(entry, 0, 1)}
    assert r["vjp"].status == "pass", report.failure_message(r["vjp"])
    assert r["vjp"].max_abs_err > 0          # rounding is there: the rule, not luck, passes it


def test_the_condition_scaled_vjp_rule_still_catches_a_missing_term_on_that_case():
    def no_sigma_path(g, rewards, **kw):      # drops ∂σ/∂r: ±g/σ, where the truth is 0
        kw = dict(kw, scale="none")
        out = ref_numpy.passk_advantages_vjp(g, rewards, **kw)["rewards"]
        sigma = abs(rewards[0] - rewards[1]) / math.sqrt(2)
        return {"rewards": out / sigma}
    entry = dataclasses.replace(_passk_at_n2([-1.0, -0.997, 0.5, 0.25]),
                                numpy_vjp=no_sigma_path)
    r = {x.stage: x for x in stages.run_entry(entry, 0, 1)}
    assert r["vjp"].status == "fail"


def test_a_frozen_gspo_objective_keeps_the_group_ids_of_a_prompt_level_aggregation():
    # case 22 of policy_objective at seed 0: GSPO-token under prompt-mean-token-mean with
    # shuffled group_ids; the frozen objective's many-point evaluation dropped group_ids, so
    # its finite differences raised
    entry = registry.build()["policy_objective"]
    results = stages.run_entry(entry, seed=0, n_cases=48, stages=("fd", "detach"))
    assert {r.stage for r in results} == {"fd", "detach"}
    failed = [report.failure_message(r) for r in results if not r.passed]
    assert failed == [], "\n\n".join(failed)
