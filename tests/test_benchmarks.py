"""benchmarks/run.py: what it times and compares (never how fast anything is)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import run as bench  # noqa: E402
from tests.helpers import UNDER_MUTMUT  # noqa: E402


def test_calls_are_timed_in_shuffled_rounds_after_one_warm_up_each():
    calls = []
    fs = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    medians = bench.interleaved_medians(fs, [30, 1, 30])
    assert calls[:3] == ["a", "b", "c"]                        # warm-up, in order
    rounds = [calls[3:6]] + [calls[6 + 2 * k:8 + 2 * k] for k in range(29)]
    assert sorted(rounds[0]) == ["a", "b", "c"]                # b only in the first round
    assert all(sorted(r) == ["a", "c"] for r in rounds[1:])
    assert len({tuple(r) for r in rounds[1:]}) == 2            # both orders occur
    assert len(medians) == 3 and all(t >= 0 for t in medians)


def test_the_control_pair_flags_a_ratio_beyond_its_limit():
    assert bench.control_ratio(1.0, 1.1) == (pytest.approx(1.1), True)
    assert bench.control_ratio(1.3, 1.0) == (pytest.approx(1.3), False)


@pytest.mark.skipif(UNDER_MUTMUT, reason="counted by a profiler, which mutmut's "
                    "trampolines hide the reference functions from")
def test_reference_calls_are_counted_from_outside_ref_numpy_only():
    import numpy as np
    import ref_numpy
    lp = np.zeros((2, 3))
    counts = bench.reference_calls(lambda: [ref_numpy.policy_objective(
        lp, lp, np.ones((2, 3)), np.ones((2, 3), bool)) for _ in range(3)])
    # policy_objective calls ppo_clip_loss and aggregate itself: those are part of it
    assert counts == {"policy_objective": 3}


def test_the_table_compares_every_implementation_with_the_loop_on_the_same_inputs(capsys):
    rows = bench.gae_table([(3, 40)], "cpu", 2)
    out = capsys.readouterr().out
    assert "copy bandwidth (cpu; 32 MiB" in out and "| control pair |" in out
    assert "| × fresh-output bound |" in out
    names = {(mask, dtype): [row[4] for row in rows if row[3] == mask and row[2] == dtype]
             for mask in ("right", "holed") for dtype in ("float32", "float64")}
    assert names[("right", "float32")] == ["per-step loop", "ref_torch.gae"]
    assert names[("holed", "float32")] == ["per-step loop", "ref_torch.gae"]
    assert names[("right", "float64")] == ["per-step loop", "ref_torch.gae", "ref_numpy.gae",
                                           "scipy lfilter"]
    assert names[("holed", "float64")] == ["per-step loop", "ref_torch.gae", "ref_numpy.gae"]
    for B, T, dtype, mask, name, t, speedup, bound, mem, err, control, fresh in rows:
        assert t > 0 and bound > 0 and control >= 1.0 and fresh > 0
        if name == "per-step loop":
            assert speedup == 1.0
        # every implementation computes the same advantages (float32: a few ulps of |A|)
        assert err < (1e-5 if dtype == "float32" else 1e-12), (name, dtype, mask)


@pytest.mark.parametrize("mask", ["right", "holed"])
def test_the_baseline_loop_is_the_gae_recursion(mask):
    """The verl-style loop the speed-ups are measured against computes GAE itself."""
    import ref_numpy
    r, v, m = bench._inputs(4, 50, torch.float64, mask)
    adv, ret = bench.verl_loop(r, v, m)
    ref = ref_numpy.gae(r.numpy(), v.numpy(), m.numpy(), gamma=bench.GAMMA, lam=bench.LAM)
    assert torch.allclose(adv, torch.tensor(ref[0]), rtol=1e-12, atol=1e-12)
