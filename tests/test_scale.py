"""--scale: every stage passes on the real references, and the fd stage stays sound at scale:
a hand VJP wrong on one token out of 10^5 fails it."""
import numpy as np

import ref_numpy
from crosscheck import scale

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
