"""--scale: every stage passes on the real references, and the fd stage stays sound at scale:
a hand VJP wrong on one token out of 10^5 fails it."""
import numpy as np

import ref_numpy
from crosscheck.check import scale

N = 100_000


def stage(results, name_prefix, stage_name):
    return [r for r in results if r.name.startswith(name_prefix) and r.stage == stage_name]


def test_every_stage_passes_at_scale():
    results, timings = scale.run(N)
    assert all(r.passed for r in results)
    assert {r.stage for r in results} == {"value", "vjp", "fd"}
    assert "fd diagonal (ppo)" in timings


def test_one_wrong_token_in_the_policy_vjp_fails_fd(monkeypatch):
    real = ref_numpy.policy_objective_vjp

    def off_by_one_percent_on_one_token(g, logp, *a, **k):
        out = real(g, logp, *a, **k)["logp"].copy()
        i = np.unravel_index(np.argmax(np.abs(out)), out.shape)
        out[i] *= 1.01
        return {"logp": out}

    monkeypatch.setattr(ref_numpy, "policy_objective_vjp", off_by_one_percent_on_one_token)
    results, _ = scale.run(N)
    fd = stage(results, "policy_objective", "fd")
    assert fd and all(not r.passed for r in fd)
    assert all(r.worst.get("mode") == "diagonal finite differences of the per-token integrand"
               for r in fd)


def test_one_wrong_token_in_the_aggregation_weights_fails_fd(monkeypatch):
    real = ref_numpy.aggregate_vjp

    def one_weight_wrong(g, loss, mask, **k):
        w = real(g, loss, mask, **k)["loss"].copy()
        i = np.unravel_index(np.argmax(w), w.shape)
        w[i] *= 1.001
        return {"loss": w}

    monkeypatch.setattr(ref_numpy, "aggregate_vjp", one_weight_wrong)
    results, _ = scale.run(N)
    assert all(not r.passed for r in stage(results, "policy_objective", "fd"))


def test_one_wrong_entry_in_the_gae_vjp_fails_fd(monkeypatch):
    real = ref_numpy.gae_vjp

    def one_entry_wrong(g, *a, **k):
        out = {key: v.copy() for key, v in real(g, *a, **k).items()}
        i = np.unravel_index(np.argmax(np.abs(out["values"])), out["values"].shape)
        out["values"][i] += 1e-3
        return out

    monkeypatch.setattr(ref_numpy, "gae_vjp", one_entry_wrong)
    results, _ = scale.run(N)
    (fd,) = stage(results, "gae", "fd")
    assert not fd.passed


def test_the_report_names_every_configuration_and_its_costs():
    """The README promises 12 policy_objective configurations (3 losses × 4 aggregations) and
    gae, each through value, vjp and fd, with the cost of each part timed."""
    import time
    t0 = time.perf_counter()
    results, timings = scale.run(2_000)
    wall = time.perf_counter() - t0
    expected = {(f"policy_objective[{loss}, {agg}]", s) for loss in ("ppo", "cispo", "gspo")
                for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                            "seq-mean-token-sum-norm") for s in ("value", "vjp", "fd")}
    expected |= {("gae", s) for s in ("value", "vjp", "fd")}
    assert {(r.name, r.stage) for r in results} == expected and len(results) == len(expected)
    assert all(r.cases == 1 for r in results)
    for key, (sec, evals) in timings.items():
        assert 0 <= sec <= wall and evals >= 1, key
    assert {timings[f"fd diagonal ({loss})"][1] for loss in ("ppo", "cispo", "gspo")} == {4}


def test_errors_that_cancel_in_sum_still_fail_the_aggregation_probes(monkeypatch):
    """Weights off by ±1e-7 relative, alternately, leave Σw unchanged and are far below the
    diagonal check's tolerance: only random-sign probes can see them (a constant probe sees Σw)."""
    real = ref_numpy.aggregate_vjp

    def weights_off_in_pairs(g, loss, mask, **k):
        w = real(g, loss, mask, **k)["loss"].copy()
        flat = np.flatnonzero(mask)
        flat = flat[:flat.size // 2 * 2]
        w.flat[flat[0::2]] += 1e-7 * w.flat[flat[0::2]]
        w.flat[flat[1::2]] -= 1e-7 * w.flat[flat[0::2]]
        return {"loss": w}

    monkeypatch.setattr(ref_numpy, "aggregate_vjp", weights_off_in_pairs)
    results, _ = scale.run(N)
    fd = stage(results, "policy_objective", "fd")
    assert fd and all(not r.passed for r in fd)
    assert all(r.worst["mode"] == "exact linear probe of the aggregation" for r in fd)
    assert all(r.worst["got_from"] == "⟨hand weights, v⟩" for r in fd)


def test_a_scale_failure_names_both_sides(monkeypatch):
    real = ref_numpy.policy_objective_vjp
    monkeypatch.setattr(ref_numpy, "policy_objective_vjp",
                        lambda *a, **k: {"logp": 2 * real(*a, **k)["logp"]})
    results, _ = scale.run(2_000)
    vjp = stage(results, "policy_objective", "vjp")
    assert vjp and all(not r.passed for r in vjp)
    assert {(r.worst["got_from"], r.worst["expected_from"]) for r in vjp} == \
        {("ref_numpy hand VJP", "torch autograd")}
    (value,) = stage(results, "gae", "value")
    assert value.passed and value.worst["expected_from"] == "ref_numpy"


def test_every_comparison_says_what_it_compares(monkeypatch):
    """Each of --scale's comparisons records its input, shape and the two sides compared, so a
    failure can be read without the code."""
    from crosscheck.check import results
    seen = []

    def recording(res, cmp, info):
        seen.append((res.name, res.stage, info))
        return results.record(res, cmp, info)
    monkeypatch.setattr(scale, "record", recording)
    scale.run(2_000)
    sides = {
        "value": {("ref_torch", "ref_numpy")},
        "vjp": {("ref_numpy hand VJP", "torch autograd")},
        "fd": {("⟨hand weights, v⟩", "agg(l + v) − agg(l)"),
               ("ref_numpy hand VJP", "w ⊙ f' (scipy-free FD)"),
               ("⟨hand VJP, d⟩", "⟨u, F(x + d) − F(x)⟩")},
    }
    inputs = {"policy": {"logp", "loss"}, "gae": {"advantages", "returns", "rewards", "values"}}
    assert len(seen) >= 3 * 12 + 5
    for name, stage, info in seen:
        assert (info["got_from"], info["expected_from"]) in sides[stage], (name, stage, info)
        assert info["input"] in inputs["gae" if name == "gae" else "policy"], info
        assert len(info["shape"]) == 2 and info["seed"] == 0, info
    gae_inputs = {(stage, info["input"]) for name, stage, info in seen if name == "gae"}
    assert gae_inputs == {("value", "advantages"), ("value", "returns"), ("vjp", "rewards"),
                          ("vjp", "values"), ("fd", "rewards"), ("fd", "values")}
