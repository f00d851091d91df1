"""FIPO's future-KL influence weight: worked numbers computed by hand, its limits (γ → 0, γ = 1,
one token), the dual-clip and safety thresholds at their edges, padding, bad input, and that
the weight is a stop-gradient."""
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from crosscheck.check import registry

E = math.exp
OPEN = dict(lower=None, upper=None)


def both(*arrays, **kw):
    """ref_numpy's weights and ref_torch's (as NumPy) for the same inputs."""
    a = ref_numpy.fipo_influence_weights(*arrays, **kw)
    b = ref_torch.fipo_influence_weights(
        *(None if x is None else torch.tensor(x) for x in arrays), **kw)
    return np.asarray(a), b.detach().numpy()


def logps(x):
    """log-probs (logp, old_logp) whose log-ratios are x."""
    x = np.asarray(x, dtype=np.float64)
    lp = np.full(x.shape, math.log(0.5))
    return lp, lp - x


@pytest.mark.parametrize("kw, want", [
    # by hand, γ = 2^(−1/1) = 0.5, x = [0.2, −0.4, 0.4]: F = [0.1, −0.2, 0.4]
    (dict(), [E(0.1), 1.0, 1.2]),                          # ms-swift's default [1, 1.2]
    (dict(lower=0.8, upper=1.2), [E(0.1), E(-0.2), 1.2]),  # the paper's symmetric clip
    (OPEN, [E(0.1), E(-0.2), E(0.4)]),
])
def test_weights_match_hand_computed_numbers_in_both_twins(kw, want):
    lp, old = logps([0.2, -0.4, 0.4])
    for got in both(lp, old, np.ones(3), decay_rate=1.0, **kw):
        np.testing.assert_allclose(got, want, rtol=1e-14)


def test_a_hole_in_the_mask_adds_nothing_but_counts_in_the_distance():
    # x = [0.2, ·, 0.4] with position 1 masked, γ = 0.5: F_0 = 0.2 + 0.5²·0.4 = 0.3 (not 0.4)
    lp, old = logps([[0.2, 7.0, 0.4]])
    m = np.array([[True, False, True]])
    for got in both(lp, old, np.ones((1, 3)), m, decay_rate=1.0, **OPEN):
        np.testing.assert_allclose(got, [[E(0.3), 0.0, E(0.4)]], rtol=1e-14)


def test_a_token_over_the_ratio_threshold_leaves_the_sum_but_keeps_its_own_weight():
    # x = [0.2, log 3, 0.4], c = 2: M = [1, 0, 1]; F = [0.2 + 0.25·0.4, 0.5·0.4, 0.4]
    lp, old = logps([0.2, math.log(3.0), 0.4])
    for got in both(lp, old, np.ones(3), decay_rate=1.0, ratio_threshold=2.0, **OPEN):
        np.testing.assert_allclose(got, [E(0.3), E(0.2), E(0.4)], rtol=1e-14)


def test_a_ratio_equal_to_a_threshold_is_not_above_it():
    # x = [0.2, log 2], r_1 = 2 exactly (e^(log 2) rounds to 2): with c = 2 token 1 stays in
    # token 0's sum, F = [0.2 + 0.5·log 2, log 2]; with s = 2 and A < 0 it is not held
    assert math.exp(math.log(2.0)) == 2.0
    lp, old = logps([0.2, math.log(2.0)])
    for got in both(lp, old, -np.ones(2), decay_rate=1.0, ratio_threshold=2.0,
                    safety_threshold=2.0, **OPEN):
        np.testing.assert_allclose(got, [E(0.2) * math.sqrt(2.0), 2.0], rtol=1e-14)
    # just below the ratio: token 1 leaves the sum and is held in [0.8, 1]
    for got in both(lp, old, -np.ones(2), decay_rate=1.0, ratio_threshold=1.999,
                    safety_threshold=1.999, **OPEN):
        np.testing.assert_allclose(got, [E(0.2), 1.0], rtol=1e-14)


def test_the_safety_band_holds_negative_advantage_tokens_of_large_ratio():
    # x = [log 2, −3], γ = 0.5: e^F = [2·e^−1.5, e^−3]; token 0 (r = 2 > 1.05, A < 0) is held
    # in [0.8, 1]; token 1 (r < 1.05) is not; with A > 0 nothing is held
    lp, old = logps([math.log(2.0), -3.0])
    for got in both(lp, old, -np.ones(2), decay_rate=1.0, safety_threshold=1.05, **OPEN):
        np.testing.assert_allclose(got, [0.8, E(-3.0)], rtol=1e-14)
    for got in both(lp, old, np.ones(2), decay_rate=1.0, safety_threshold=1.05, **OPEN):
        np.testing.assert_allclose(got, [2.0 * E(-1.5), E(-3.0)], rtol=1e-14)
    lp, old = logps([math.log(1.5)])                    # e^F = 1.5 > 1: held at 1
    for got in both(lp, old, -np.ones(1), safety_threshold=1.05, **OPEN):
        np.testing.assert_allclose(got, [1.0], rtol=1e-14)


def test_with_gamma_near_zero_each_token_weighs_only_its_own_ratio():
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 0.5, size=(3, 5))
    lp, old = logps(x)
    for kw in (dict(), dict(lower=0.8, upper=1.2), OPEN):
        want = np.clip(np.exp(x), kw.get("lower", 1.0) or 0.0, kw.get("upper", 1.2) or np.inf)
        for got in both(lp, old, np.ones(3), decay_rate=1e-3, **kw):
            np.testing.assert_allclose(got, want, rtol=1e-14)


def test_with_no_decay_the_future_kl_is_the_plain_sum_to_the_end():
    x = np.array([[0.1, -0.3, 0.25, 0.05]])
    lp, old = logps(x)
    want = np.exp([[0.1, 0.0, 0.3, 0.05]])      # suffix sums: 0.1, −0.0, 0.3, 0.05
    for got in both(lp, old, np.ones(1), decay_rate=math.inf, **OPEN):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("x", [0.3, -0.3, 25.0])
def test_a_single_token_weighs_its_own_clipped_ratio(x):
    lp, old = logps([[x]])
    for got in both(lp, old, np.ones((1, 1))):
        np.testing.assert_allclose(got, [[min(max(E(x), 1.0), 1.2)]], rtol=1e-14)


def test_padding_never_changes_a_weight():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 0.5, size=(3, 6))
    lp, old = logps(x)
    adv = rng.normal(size=(3, 6))
    m = rng.random((3, 6)) < 0.7
    m[0] = False                                          # an empty row
    kw = dict(decay_rate=2.0, lower=0.8, ratio_threshold=1.3, safety_threshold=1.1)
    clean = both(lp, old, adv, m, **kw)
    junk = np.where(m, 0.0, np.nan)
    dirty = both(lp + np.where(m, 0.0, np.inf), old + junk, adv + junk, m, **kw)
    for c, d in zip(clean, dirty):
        np.testing.assert_array_equal(c, d)
        assert (d[~m] == 0.0).all()
    per_seq = np.array([np.nan, -1.0, 2.0])                # an empty row's advantage unread
    for got, want in zip(both(lp, old, per_seq, m, **kw),
                         both(lp, old, np.broadcast_to(per_seq[:, None], (3, 6)).copy()
                              * m, m, **kw)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kw, arrays, name", [
    (dict(decay_rate=0.0), {}, "decay_rate"),
    (dict(decay_rate=-1.0), {}, "decay_rate"),
    (dict(lower=1.3, upper=1.2), {}, "lower"),
    (dict(lower=-0.1), {}, "lower"),
    (dict(ratio_threshold=0.0), {}, "ratio_threshold"),
    (dict(safety_threshold=-1.0), {}, "safety_threshold"),
    ({}, dict(advantages=np.ones((2, 1))), "advantages"),
    ({}, dict(mask=np.ones((2, 2), bool)), "mask"),
    ({}, dict(logp=np.array([[np.nan, -1.0, -1.0], [-1.0, -1.0, -1.0]])), "logp"),
])
def test_bad_input_names_the_argument(kw, arrays, name):
    base = dict(logp=np.full((2, 3), -1.0), old_logp=np.full((2, 3), -1.2),
                advantages=np.ones((2, 3)), mask=None)
    base.update(arrays)
    with pytest.raises(ValueError, match=name):
        ref_numpy.fipo_influence_weights(**base, **kw)
    with pytest.raises(ValueError, match=name):
        ref_torch.fipo_influence_weights(
            **{k: None if v is None else torch.tensor(v) for k, v in base.items()}, **kw)


def test_the_weight_is_a_stop_gradient_computed_in_the_inputs_dtype():
    lp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    w = ref_torch.fipo_influence_weights(lp, lp.detach() - 0.1, torch.ones(1))
    assert not w.requires_grad and w.dtype == torch.float32
    np.testing.assert_allclose(w.numpy(), [[1.2, 1.2, E(0.1)]], rtol=1e-6)
    entry = registry.build()["fipo_influence_weights"]
    assert entry.diff == () and not entry.trainer_grad and entry.numpy_vjp is None
