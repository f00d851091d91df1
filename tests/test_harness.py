"""The harness catches planted bugs at the right stage and names them; the CLI keeps its contract."""
import contextlib
import dataclasses
import io
import json
import math
import re

import jsonschema
import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from crosscheck import __main__ as cli
from crosscheck import cases as cases_mod
from crosscheck import harness, registry, tolerances

SEED = 0
N = 8


def run_with(name, **replace):
    entry = dataclasses.replace(registry.build()[name], **replace)
    return {r.stage: r for r in harness.run_entry(entry, SEED, N)}


def assert_caught(results, name, stage, input_name):
    r = results[stage]
    assert r.status == "fail", f"{name} {stage} should have failed"
    msg = harness.failure_message(r)
    assert f"FAIL {name} · {stage} · input {input_name} · seed {SEED}" in msg
    assert "shape (" in msg
    assert f"reproduce: python -m crosscheck --only {name} --seed {SEED}" in msg
    return msg


def test_the_real_registry_passes_on_these_cases():
    for name in registry.build():
        results = run_with(name)
        assert all(r.passed for r in results.values()), [harness.failure_message(r) for r in
                                                         results.values() if not r.passed]


# ---------------------------------------------------------------- planted bugs
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
    def vjp_mean_only(g, x, mask=None, *, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True):
        m = np.ones(np.shape(x), bool) if mask is None else np.asarray(mask, bool)
        xs = np.where(m, x, 0.0)
        n = m.sum()
        var = (np.where(m, xs - xs.sum() / n, 0.0) ** 2).sum() / (n - ddof)
        s = {"var": np.sqrt(var + eps), "clamp": np.sqrt(max(var, eps)),
             "std": np.sqrt(var) + eps}[eps_mode]
        gm = np.where(m, g, 0.0)
        gx = (gm - m * gm.sum() / n) / s if shift_mean else gm / s
        return {"x": np.where(m, gx, 0.0)}                    # forgot ∂s/∂x

    results = run_with("whiten", numpy_vjp=vjp_mean_only)
    assert_caught(results, "whiten", "vjp", "x")
    assert_caught(results, "whiten", "fd", "x")


def test_twin_with_the_wrong_ddof_fails_value():
    def whiten_unbiased(x, mask=None, *, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True):
        return ref_torch.whiten(x, mask, ddof=1, eps=eps, eps_mode=eps_mode, shift_mean=shift_mean)

    results = run_with("whiten", torch_fn=whiten_unbiased)
    msg = assert_caught(results, "whiten", "value", "output")
    assert re.search(r"worst at \[\d+, \d+\] \(element-wise\): ref_torch = \S+, "
                     r"ref_numpy = \S+ \(\|diff\| \S+ > allowed \S+\)", msg), msg


def test_group_twin_with_the_wrong_ddof_fails_value():
    def grpo_unbiased(rewards, **kw):
        return ref_torch.group_advantages(rewards, **dict(kw, ddof=1))

    results = run_with("group_advantages", torch_fn=grpo_unbiased)
    assert_caught(results, "group_advantages", "value", "output")


def _cispo_without_detach(logp, old_logp, advantages, mask=None, *, clip_high=5.0, clip_low=None,
                          bound="absolute", log_ratio_clamp=None):
    """Same value as CISPO, but the weight w is differentiated: the classic missing .detach()."""
    out = ref_torch.cispo_loss(logp, old_logp, advantages, mask, clip_high=clip_high,
                               clip_low=clip_low, bound=bound, log_ratio_clamp=log_ratio_clamp)
    m = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask.bool()
    A = advantages if advantages.shape == logp.shape else advantages[:, None].expand(logp.shape)
    zero = torch.zeros((), dtype=logp.dtype)
    lp, A = torch.where(m, logp, zero), torch.where(m, A, zero)
    rho = torch.where(m, logp - old_logp, zero)
    if log_ratio_clamp is not None:
        rho = torch.clamp(rho, -log_ratio_clamp, log_ratio_clamp)
    r = torch.exp(rho)
    if bound == "absolute":
        w = torch.clamp(r, max=clip_high)
    else:
        w = torch.clamp(r, min=0.0 if clip_low is None else max(1 - clip_low, 0.0),
                        max=1 + clip_high)
    return out + torch.where(m, -(w - w.detach()) * A * lp, zero)


def test_missing_detach_is_caught_by_vjp_and_detach_stages():
    results = run_with("cispo_loss", torch_fn=_cispo_without_detach)
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
        out = _cispo_without_detach(lp, t["old_logp"], t["advantages"], t["mask"], **kw)
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


# ---------------------------------------------------------------- CLI and JSON
SCHEMA = {
    "type": "object",
    "required": ["passed", "seed", "results"],
    "properties": {
        "passed": {"type": "boolean"},
        "seed": {"type": "integer"},
        "results": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "stage", "status", "cases", "max_abs_err", "max_rel_err",
                         "worst"],
            "properties": {
                "name": {"type": "string"},
                "stage": {"enum": ["value", "vjp", "fd", "detach"]},
                "status": {"enum": ["pass", "fail"]},
                "cases": {"type": "integer", "minimum": 1},
                "max_abs_err": {"type": ["number", "string"]},
                "max_rel_err": {"type": ["number", "string"]},
                "worst": {"type": "object"},
            },
        }},
    },
}


def run_cli(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(argv)
    return code, out.getvalue()


def test_json_output_validates_and_covers_every_applicable_stage():
    code, text = run_cli(["--json", "--cases", "4"])
    assert code == 0
    doc = json.loads(text)
    jsonschema.validate(doc, SCHEMA)
    assert doc["passed"] is True and doc["seed"] == 0
    got = {(r["name"], r["stage"]) for r in doc["results"]}
    for name, e in registry.build().items():
        for stage in ("value", "vjp", "fd"):
            if (stage == "vjp" and e.numpy_vjp is None) or (stage != "value" and not e.diff):
                assert (name, stage) not in got   # a gradient-valued function, or a count
                continue
            assert (name, stage) in got
    assert ("cispo_loss", "detach") in got and ("policy_objective", "detach") in got
    assert ("gspo_loss", "detach") in got
    assert ("ppo_clip_loss", "detach") not in got


def test_json_is_byte_identical_for_the_same_seed():
    assert run_cli(["--json", "--cases", "3", "--seed", "5"]) == \
        run_cli(["--json", "--cases", "3", "--seed", "5"])


def test_exit_codes(monkeypatch):
    assert run_cli(["--only", "aggregate", "--cases", "2", "-q"])[0] == 0
    with pytest.raises(SystemExit) as e:
        run_cli(["--only", "nonesuch"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        run_cli(["--cases", "0"])
    assert e.value.code == 2
    broken = dataclasses.replace(registry.build()["whiten"],
                                 torch_fn=lambda x, mask=None, **kw: ref_torch.whiten(
                                     x, mask, **dict(kw, ddof=1)))
    monkeypatch.setattr(registry, "build", lambda: {"whiten": broken})
    code, text = run_cli(["--cases", "4"])
    assert code == 1
    assert "FAIL whiten · value" in text


def test_list_names_every_function():
    code, text = run_cli(["--list"])
    assert code == 0
    for name in registry.build():
        assert name in text
    assert "detached: w = clip(ratio)" in text


def test_the_summary_line_counts_failures():
    """One failure reads '1 FAILED', none 'all passed' (the verdict users grep for in CI)."""
    from crosscheck import report
    from crosscheck.harness import StageResult
    ok, bad = StageResult("f", "value", cases=3), StageResult("g", "vjp", "fail", cases=3)
    assert report.summary([ok, ok], 2, 0, 3, 1.0).startswith("2 functions, 2 stage checks: "
                                                             "all passed")
    assert "2 stage checks: 1 FAILED" in report.summary([ok, bad], 2, 0, 3, 1.0)
    assert "2 stage checks: 2 FAILED" in report.summary([bad, bad], 2, 0, 3, 1.0)


def test_the_summary_line_names_the_seed_and_the_cases():
    code, text = run_cli(["--only", "aggregate", "--cases", "2", "--seed", "3"])
    assert code == 0
    assert re.fullmatch(r"1 function, 3 stage checks: all passed \(seed 3, 2 cases each, "
                        r"\d+\.\d s\)", text.strip().splitlines()[-1])


def test_every_failure_is_its_own_paragraph(monkeypatch):
    entries = registry.build()
    wrong = {n: dataclasses.replace(entries[n], torch_fn=lambda *a, **k: torch.zeros(2, 2))
             for n in ("whiten", "kl_penalty")}
    monkeypatch.setattr(registry, "build", lambda: wrong)
    code, text = run_cli(["--cases", "2", "-q"])
    heads = [line for line in text.splitlines() if "FAIL " in line]
    assert code == 1 and len(heads) == 4                   # value and vjp of each
    assert all(h.startswith("FAIL ") for h in heads)
    assert text.count("\n    reproduce: python -m crosscheck --only ") == 4


def test_json_keeps_greek_and_cjk_readable():
    code, text = run_cli(["--json", "--only", "gae", "--cases", "1"])
    assert code == 0 and "γ=0.99, λ=0.95" in text and "\\u03b3" not in text


def test_the_scale_command_reports_its_verdict_and_the_cost_of_each_part():
    code, text = run_cli(["--scale", "2000"])
    lines = text.strip().splitlines()
    assert code == 0
    assert re.fullmatch(r"--scale 2000: 39 stage checks, all passed in \d+\.\d s", lines[-1])
    for part, evals in (("fd diagonal (ppo)", 4), ("gae value", 2), ("gae vjp", 1),
                        ("gae fd", 4)):
        assert any(re.fullmatch(rf"  {re.escape(part)} +\d+\.\d\d s \({evals} evaluations\)",
                                line) for line in lines), part


def test_a_closed_pipe_ends_the_run_quietly():
    """`python -m crosscheck explain | head -1`: the reader goes away mid-output; the CLI stops
    with exit 1 and no traceback."""
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "crosscheck", "explain"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_the_roundoff_bound_holds_and_is_within_100x_of_the_real_error():
    """finite_diff.roundoff must bound the error of a difference quotient of values of size C
    (else fd would blame a correct gradient), and not be so loose that it hides a wrong one."""
    from crosscheck import finite_diff
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
        res = harness.StageResult(name, stage)
        harness.run_stage(entry, stage, case, 0, SEED, res)
        assert res.passed, harness.failure_message(res)
    hand = ref_numpy.gspo_loss_vjp(np.ones((B, T)), **{k: arrays[k] for k in
                                                       ("logp", "old_logp", "advantages", "mask")},
                                   clip_low=0.2, clip_high=0.28, log_ratio_max=10.0)["logp"]
    assert not hand[0].any() and hand[1, :3].any()


def test_compare_allows_atol_times_scale_plus_rtol_plus_the_roundoff_bound():
    """The rule of tolerances.py, term by term, at its edges."""
    from crosscheck.tolerances import Tolerance
    tol = Tolerance(rtol=1e-6, atol=1e-8, why="test")
    assert harness.compare(1.0 + 2e-6, 1.0, tol).ok is False
    assert harness.compare(1.0 + 2e-6, 1.0, tol, extra=1e-6).ok is True       # + extra
    assert harness.compare(5e-7, 0.0, tol, scale=1.0).ok is False
    assert harness.compare(5e-7, 0.0, tol, scale=100.0).ok is True            # atol · scale
    cmp = harness.compare(np.array([0.0, 3.0]), np.array([0.0, 3.0 + 1e-5]), tol, extra=1e-7)
    assert not cmp.ok and cmp.index == (1,)
    assert cmp.allowed == pytest.approx(1e-8 + 1e-6 * (3.0 + 1e-5) + 1e-7, rel=1e-12)


def test_the_directional_mode_is_sound_on_the_registry_and_still_catches_a_bug(monkeypatch):
    """Cases above FULL_JACOBIAN_MAX_INPUTS are judged by random directional derivatives, with
    the round-off allowance scaled by Σ|u|; forced on every case, the real references still
    pass and a VJP missing the ratio factor still fails."""
    from crosscheck import finite_diff
    monkeypatch.setattr(finite_diff, "FULL_JACOBIAN_MAX_INPUTS", 0)
    for name in ("gae", "whiten", "ppo_clip_loss", "cispo_loss", "gspo_loss", "policy_objective",
                 "kl_penalty", "aggregate"):
        for r in run_with(name).values():
            assert r.passed, harness.failure_message(r)
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


def test_json_safe_spells_out_what_json_cannot_hold():
    from crosscheck.report import json_safe
    got = json_safe({"a": np.inf, "b": -np.inf, "c": float("nan"), "d": np.float32(1.5),
                     "e": np.arange(2), "f": (np.int64(3), [np.array(2.0)])})
    assert got == {"a": "inf", "b": "-inf", "c": "nan", "d": 1.5, "e": [0, 1],
                   "f": [3, [2.0]]}
    assert json.dumps(got)                           # plain JSON now


def test_a_full_jacobian_failure_names_the_output_and_input_entries():
    def vjp_doubled(g, *a, **k):
        return {"logp": 2 * ref_numpy.kl_penalty_vjp(g, *a, **k)["logp"]}
    msg = assert_caught(run_with("kl_penalty", numpy_vjp=vjp_doubled), "kl_penalty", "fd", "logp")
    m = re.search(r"worst at doutput\[(\d+), (\d+)\] / dlogp\[(\d+), (\d+)\] \(full Jacobian\): "
                  r"ref_numpy hand VJP = ", msg)
    assert m, msg
    # kl_penalty is per token: its Jacobian is diagonal, so the worst entry is d out[i] / d in[i]
    assert m.group(1, 2) == m.group(3, 4), msg


def test_compare_fails_on_a_shape_mismatch_and_passes_empty_arrays():
    tol = tolerances.get("value")
    bad = harness.compare(np.zeros(3), np.zeros((3, 1)), tol)
    assert not bad.ok and bad.badness == math.inf and bad.index == ()
    assert math.isnan(bad.got) and math.isnan(bad.expected)
    empty = harness.compare(np.zeros((2, 0)), np.zeros((2, 0)), tol)
    assert empty.ok and empty.badness == 0.0 and empty.max_abs == 0.0
    assert (empty.got, empty.expected, empty.allowed, empty.index) == (0.0, 0.0, 0.0, ())


def test_compare_reports_the_worst_entry_and_exact_entries_as_zero():
    """badness is err / allowed: 0 for an exact match (not 1, the edge of failing), so the worst
    entry reported is the one that differs, wherever it sits."""
    tol = tolerances.get("value")
    x = np.linspace(1.0, 2.0, 7)
    same = harness.compare(x, x.copy(), tol)
    assert same.ok and same.badness == 0.0 and same.max_abs == 0.0
    y = x.copy()
    y[4] += 0.25 * (tol.atol + tol.rtol * y[4])        # a quarter of what is allowed there
    near = harness.compare(y, x, tol)
    assert near.ok and near.index == (4,) and near.got == y[4] and near.expected == x[4]
    assert 0.2 < near.badness < 0.3


def test_a_failing_comparison_of_huge_values_records_their_finite_difference():
    """abs_err is |got − expected| whenever that difference is finite, even if got + expected
    would overflow (1.5e308 + 1e308)."""
    res = harness.StageResult("f", "value")
    cmp = harness.Comparison(False, 2.0, 5e307, 0.33, (0,), 1.5e308, 1.0e308, 1.0)
    harness._record(res, cmp, {"case": 0})
    assert res.status == "fail" and res.worst["abs_err"] == 5e307
    res = harness.StageResult("f", "value")
    harness._record(res, harness.Comparison(False, 2.0, 1.0, 1.0, (0,), math.nan, 1.0, 1.0),
                    {"case": 0})
    assert res.worst["abs_err"] == math.inf


def test_a_flat_index_into_the_second_output_names_it():
    outs = (np.zeros((2, 3)), np.zeros((4, 5)))
    assert harness._unflat(outs, 4, ("advantages", "returns")) == ["advantages", 1, 1]
    assert harness._unflat(outs, 6 + 7, ("advantages", "returns")) == ["returns", 1, 2]
    assert harness._unflat(outs, 26, ("advantages", "returns")) == []


def test_only_functions_with_a_detached_factor_list_one():
    code, text = run_cli(["--list"])
    assert code == 0
    detached = {line.split()[0] for line in text.splitlines() if "detached" in line}
    assert detached == {n for n, e in registry.build().items() if e.detached}
    assert detached == {"cispo_loss", "gspo_loss", "policy_objective"}
