"""benchmarks/run.py: what it times and compares (never how fast anything is)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import run as bench  # noqa: E402


def test_calls_are_timed_in_turns_after_one_warm_up_each():
    calls = []
    fs = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    medians = bench.interleaved_medians(fs, [3, 1, 2])
    assert calls == ["a", "b", "c",            # warm-up
                     "a", "b", "c", "a", "c", "a"]
    assert len(medians) == 3 and all(t >= 0 for t in medians)


def test_the_table_compares_every_implementation_with_the_loop_on_the_same_inputs(capsys):
    rows = bench.gae_table([(3, 40)], "cpu", 2)
    out = capsys.readouterr().out
    assert "copy bandwidth (cpu; 32 MiB" in out
    names = {(mask, dtype): [row[4] for row in rows if row[3] == mask and row[2] == dtype]
             for mask in ("right", "holed") for dtype in ("float32", "float64")}
    assert names[("right", "float32")] == ["per-step loop", "ref_torch.gae"]
    assert names[("holed", "float32")] == ["per-step loop", "ref_torch.gae"]
    assert names[("right", "float64")] == ["per-step loop", "ref_torch.gae", "ref_numpy.gae",
                                           "scipy lfilter"]
    assert names[("holed", "float64")] == ["per-step loop", "ref_torch.gae", "ref_numpy.gae"]
    for B, T, dtype, mask, name, t, speedup, bound, mem, err in rows:
        assert t > 0 and bound > 0
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
