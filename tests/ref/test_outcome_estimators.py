"""OPO, GPG, GRPO pass@k, ReMax, the group baseline with token whitening (REINFORCE++-baseline,
GDPO) and the optimal token baseline: worked numbers computed by hand from the definitions, and
identities with the estimators they generalise."""
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch


def both(name, *arrays, **kw):
    a = getattr(ref_numpy, name)(*arrays, **kw)
    t = [None if x is None else torch.tensor(x) for x in arrays]
    kw_t = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    return np.asarray(a), getattr(ref_torch, name)(*t, **kw_t).detach().numpy()


def test_opo_matches_hand_computed_numbers():
    # b = (10·1 + 30·0)/40 = 0.25
    for got in both("opo_advantages", np.array([1.0, 0.0]), np.array([10, 30]), group_size=2):
        np.testing.assert_allclose(got, [0.75, -0.25], rtol=1e-15)


def test_opo_with_equal_lengths_is_the_group_mean_baseline():
    rng = np.random.default_rng(0)
    r = rng.normal(size=12)
    ids = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4])
    got = ref_numpy.opo_advantages(r, np.full(12, 9), group_ids=ids)
    want = ref_numpy.group_advantages(r, group_ids=ids, scale="none", singleton="keep")
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


def test_opo_refuses_a_zero_length():
    with pytest.raises(ValueError, match="lengths holds a value ≤ 0"):
        ref_numpy.opo_advantages(np.zeros(2), np.array([3, 0]), group_size=2)


def test_gpg_matches_hand_computed_numbers():
    # α = 4/1 (one non-zero reward), mean 0.25: A = 4·(r − 0.25)
    for got in both("gpg_advantages", np.array([1.0, 0.0, 0.0, 0.0]), group_size=4):
        np.testing.assert_allclose(got, [3.0, -1.0, -1.0, -1.0], rtol=1e-15)


def test_gpg_with_every_reward_non_zero_is_the_group_mean_baseline():
    rng = np.random.default_rng(1)
    r = rng.normal(size=8)
    np.testing.assert_allclose(ref_numpy.gpg_advantages(r, group_size=4, f_norm=2.0),
                               ref_numpy.group_advantages(r, group_size=4, scale="none") / 2,
                               rtol=1e-14)


def test_passk_matches_hand_computed_numbers():
    # σ = 1 (ddof 1), margin 3 − 2 = 1: the best gets 1, the rest 0
    for got in both("passk_advantages", np.array([1.0, 3.0, 2.0]), group_size=3, eps=0.0):
        np.testing.assert_allclose(got, [0.0, 1.0, 0.0], rtol=1e-15)
    for got in both("passk_advantages", np.array([1.0, 3.0, 3.0, 0.0]), group_size=4):
        np.testing.assert_array_equal(got, 0.0)                # a tie for the best: no winner


def grads(name, g, rewards, **kw):
    """The hand VJP and torch autograd's, for one cotangent."""
    hand = getattr(ref_numpy, name + "_vjp")(g, rewards, **kw)["rewards"]
    t = torch.tensor(rewards, requires_grad=True)
    (getattr(ref_torch, name)(t, **kw) * torch.tensor(g)).sum().backward()
    return hand, t.grad.numpy()


def test_passk_with_eps_zero_gives_an_all_equal_group_zero_and_no_gradient():
    # the docstring's promise: a tie for the best gives 0 to all, also at 0/0 (σ = 0, eps = 0)
    r = np.array([2.0] * 5)
    for got in both("passk_advantages", r, group_size=5, eps=0.0):
        np.testing.assert_array_equal(got, 0.0)
    for got in grads("passk_advantages", np.arange(1.0, 6.0), r, group_size=5, eps=0.0):
        np.testing.assert_array_equal(got, 0.0)


@pytest.mark.parametrize("scale", [1e200, 1e-200, 2.0 ** 1000, 3e-305])
def test_passk_is_scale_invariant_as_group_advantages_is(scale):
    # two groups [0, 1]: σ = 1/√2, margin 1: the better of each gets √2, at any scale
    r = np.array([0.0, 1.0, 0.0, 1.0])
    for got in both("passk_advantages", r * scale, group_size=2, eps=0.0):
        np.testing.assert_allclose(got, [0.0, math.sqrt(2), 0.0, math.sqrt(2)], rtol=1e-15)
    # [1, 3, 2], eps = 0: A_best = 1; ∂A/∂r = [0.5, 0.5, −1]/scale (hand: see the VJP)
    r = np.array([1.0, 3.0, 2.0])
    for got in both("passk_advantages", r * scale, group_size=3, eps=0.0):
        np.testing.assert_allclose(got, [0.0, 1.0, 0.0], rtol=1e-15)
    for got in grads("passk_advantages", np.ones(3), r * scale, group_size=3, eps=0.0):
        np.testing.assert_allclose(got * scale, [0.5, 0.5, -1.0], rtol=1e-14)


def test_passk_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="group of one"):
        ref_numpy.passk_advantages(np.array([1.0, 2.0, 3.0]), group_ids=np.array([0, 0, 1]))


def test_remax_matches_hand_computed_numbers_and_is_returns_minus_the_baseline():
    for got in both("remax_advantages", np.array([[0.0, 0.0, 1.0]]), np.array([0.4])):
        np.testing.assert_allclose(got, [[0.6, 0.6, 0.6]], rtol=1e-15)
    rng = np.random.default_rng(2)
    r, b = rng.normal(size=(3, 6)), rng.normal(size=3)
    m = rng.random((3, 6)) < 0.7
    want = ref_numpy.discounted_returns(r, m, gamma=1.0) - np.where(m, b[:, None], 0.0)
    np.testing.assert_allclose(ref_numpy.remax_advantages(r, b, m), want, rtol=1e-14)


def test_whitened_group_advantages_match_hand_computed_numbers():
    # a = [0.5, −0.5, 0, 0]; μ = 0; var = 0.5/3 (ddof 1): A = ±0.5/√(1/6) = ±1.224745
    m = np.ones((4, 1), bool)
    for got in both("whitened_group_advantages", np.array([1.0, 0.0, 2.0, 2.0]), m,
                    group_size=2, whiten_eps=0.0):
        np.testing.assert_allclose(got[:, 0], [math.sqrt(1.5), -math.sqrt(1.5), 0, 0],
                                   rtol=1e-15, atol=1e-16)


def test_whitened_group_advantages_are_whiten_of_the_broadcast_group_advantages():
    rng = np.random.default_rng(3)
    r = rng.normal(size=6)
    m = rng.random((6, 5)) < 0.7
    m[:, 0] = True
    for scale in ("none", "group"):
        a = ref_numpy.group_advantages(r, group_size=3, ddof=1, eps=1e-6, scale=scale,
                                       singleton="keep")
        want = ref_numpy.whiten(np.where(m, a[:, None], 0.0), m, ddof=1, eps=1e-8)
        got = ref_numpy.whitened_group_advantages(r, m, group_size=3, scale=scale)
        np.testing.assert_allclose(got, np.where(m, want, 0.0), rtol=1e-14, atol=1e-15)


def test_otb_matches_hand_computed_numbers():
    # w = 1 − 2·0.5 + 0.5 = 0.5 for both; b = (1·0.5 + 0)/1.0 = 0.5
    r = np.array([[1.0], [0.0]])
    lp, sq = np.full((2, 1), math.log(0.5)), np.full((2, 1), 0.5)
    for got in both("optimal_token_baseline_advantages", r, lp, sq, group_size=2, eps=0.0):
        np.testing.assert_allclose(got, [[0.5], [-0.5]], rtol=1e-15)


def test_otb_with_equal_variance_weights_is_the_groups_mean_reward_to_go():
    # w the same everywhere and every row full: W_t = t·w is common, so b_t = mean_i G_{i,t}
    rng = np.random.default_rng(4)
    r = rng.normal(size=(6, 5))
    lp = np.full((6, 5), math.log(0.5))
    sq = np.full((6, 5), 0.3)
    got = ref_numpy.optimal_token_baseline_advantages(r, lp, sq, group_size=3, eps=0.0)
    G = np.flip(np.cumsum(np.flip(r, -1), -1), -1)
    b = G.reshape(2, 3, 5).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(got, (G.reshape(2, 3, 5) - b).reshape(6, 5), rtol=1e-13,
                               atol=1e-14)


def test_otb_zero_tail_clears_the_baseline_of_the_single_longest_trajectory():
    r = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    m = np.array([[1, 1, 1], [1, 0, 0]], bool)
    lp, sq = np.full((2, 3), math.log(0.5)), np.full((2, 3), 0.5)
    on = ref_numpy.optimal_token_baseline_advantages(r, lp, sq, m, group_size=2)
    off = ref_numpy.optimal_token_baseline_advantages(r, lp, sq, m, group_size=2,
                                                      zero_tail=False)
    # past the shorter one's length (1) the longest row has only itself: b = its own G
    np.testing.assert_allclose(off[0, 1:], 0.0, atol=1e-8)
    np.testing.assert_allclose(on[0, 1:], [1.0, 1.0], rtol=1e-15)
    np.testing.assert_allclose(on[:, 0], off[:, 0], rtol=1e-15)


def test_passk_in_pairs_is_rloos_advantage_of_the_winner():
    # in a group of two the best's margin over the second is its leave-one-out advantage
    rng = np.random.default_rng(5)
    r = rng.normal(size=10)
    got = ref_numpy.passk_advantages(r, group_size=2, scale="none")
    rloo = ref_numpy.group_advantages(r, group_size=2, baseline="leave_one_out", scale="none")
    np.testing.assert_allclose(got, np.where(rloo > 0, rloo, 0.0), rtol=1e-15)


@pytest.mark.parametrize("bad", [0.5, 2.0, np.nan])
def test_whitened_group_advantages_refuses_a_mask_that_is_not_zero_or_one(bad):
    """As gae does: a mask holding 0.5, 2 or NaN is a ValueError naming the mask and the value."""
    r = np.array([1.0, 0.0, 2.0, 1.0])
    m = np.ones((4, 3))
    m[1, 2] = bad
    for fn, args in ((ref_numpy.whitened_group_advantages, (r, m)),
                     (ref_torch.whitened_group_advantages, (torch.tensor(r), torch.tensor(m)))):
        with pytest.raises(ValueError, match="mask"):
            fn(*args, group_size=2)
    ok = np.array(m, copy=True)
    ok[1, 2] = 0.0
    a, t = both("whitened_group_advantages", r, ok, group_size=2)
    np.testing.assert_allclose(a, t, rtol=1e-12)


def test_a_pass_at_k_group_of_one_is_refused_naming_its_row_and_the_rule():
    with pytest.raises(ValueError, match=r"rewards of row 2 form a group of one; pass@k compares "
                                         r"the best and second-best of a group of at least 2"):
        ref_numpy.passk_advantages(np.array([1.0, 0.0, 1.0]), group_ids=np.array([0, 0, 1]))


@pytest.mark.parametrize("name", ["opo_advantages", "gpg_advantages", "passk_advantages",
                                  "whitened_group_advantages"])
def test_an_outcome_estimator_given_no_groups_names_itself(name):
    args = {"whitened_group_advantages": (np.ones(4), np.ones((4, 3), bool)),
            "opo_advantages": (np.ones(4), np.ones(4))}.get(name, (np.ones(4),))
    for ref in (ref_numpy, ref_torch):
        a = args if ref is ref_numpy else tuple(torch.tensor(x) for x in args)
        with pytest.raises(ValueError, match=f"^{name} needs exactly one of group_size= or "
                                             f"group_ids="):
            getattr(ref, name)(*a)


def test_the_optimal_token_baseline_names_a_non_boolean_zero_tail():
    rewards, lp = np.ones((2, 3)), np.full((2, 3), -0.5)
    for ref in (ref_numpy, ref_torch):
        a = (rewards, lp, lp) if ref is ref_numpy else tuple(torch.tensor(x) for x in
                                                             (rewards, lp, lp))
        with pytest.raises(TypeError, match="zero_tail"):
            ref.optimal_token_baseline_advantages(*a, group_size=2, zero_tail="yes")
