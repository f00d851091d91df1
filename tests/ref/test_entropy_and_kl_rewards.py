"""The per-token entropy (an entropy bonus's quantity) and KL-shaped rewards: worked numbers,
and identities with the definitions they restate."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

import ref_numpy
import ref_torch


def test_entropy_matches_hand_computed_numbers_in_both_twins():
    z = np.array([[0.0, 0.0], [math.log(0.7), math.log(0.3)]])
    want = [math.log(2), -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))]
    np.testing.assert_allclose(ref_numpy.entropy(z), want, rtol=1e-15)
    np.testing.assert_allclose(ref_torch.entropy(torch.tensor(z)).numpy(), want, rtol=1e-15)


def test_entropy_agrees_with_scipy_and_ignores_a_common_shift():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 3, (3, 4, 7))
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(ref_numpy.entropy(z), scipy_entropy(p, axis=-1), rtol=1e-13)
    grid = np.round(z * 2 ** 20) / 2 ** 20          # logits whose shift by 500 is exact
    np.testing.assert_array_equal(ref_numpy.entropy(grid + 500.0), ref_numpy.entropy(grid))


def test_entropy_gradient_sums_to_zero_over_the_vocabulary():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(2, 3, 5))
    g = ref_numpy.entropy_vjp(rng.normal(size=(2, 3)), z)["logits"]
    np.testing.assert_allclose(g.sum(-1), 0.0, atol=1e-15)


def test_entropy_padding_never_reaches_an_output_or_a_gradient():
    z = np.array([[[0.0, 1.0], [np.nan, np.inf]]])
    m = np.array([[True, False]])
    np.testing.assert_array_equal(ref_numpy.entropy(z, m)[0, 1], 0.0)
    np.testing.assert_array_equal(ref_numpy.entropy_vjp(np.ones((1, 2)), z, m)["logits"][0, 1],
                                  [0.0, 0.0])


def test_a_minus_inf_logit_is_vocabulary_masking_with_probability_zero():
    # top-k leaves [−inf, 0, 0]: H = log 2; the banned token's gradient entry is 0
    z = np.array([[[-np.inf, 0.0, 0.0], [1.0, 2.0, -np.inf]]])
    p = np.array([1.0, math.e]) / (1 + math.e)
    want = [math.log(2), -(p * np.log(p)).sum()]
    g = np.array([[1.0, -2.0]])
    t = torch.tensor(z, requires_grad=True)
    h = ref_torch.entropy(t)
    (h * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(ref_numpy.entropy(z), [want], rtol=1e-15)
    np.testing.assert_allclose(h.detach().numpy(), [want], rtol=1e-15)
    hand = ref_numpy.entropy_vjp(g, z)["logits"]
    # the finite logits' gradient is that of the same policy without the banned token
    np.testing.assert_allclose(hand[0, 1, :2], -2.0 * ref_numpy.entropy_vjp(
        np.ones((1, 1)), z[:, 1:, :2])["logits"][0, 0], rtol=1e-15)
    np.testing.assert_allclose(t.grad.numpy(), hand, rtol=1e-14, atol=1e-16)
    assert hand[0, 0, 0] == 0.0 and hand[0, 1, 2] == 0.0


@pytest.mark.parametrize("mod, conv", [(ref_numpy, np.asarray), (ref_torch, torch.tensor)])
def test_entropy_refuses_nan_plus_inf_and_an_all_banned_vocabulary_at_a_valid_token(mod, conv):
    with pytest.raises(ValueError, match=r"logits is inf at valid position \(0, 0, 1\)"):
        mod.entropy(conv(np.array([[[0.0, np.inf]]])))
    with pytest.raises(ValueError, match=r"logits is nan at valid position"):
        mod.entropy(conv(np.array([[[np.nan, 0.0]]])))
    with pytest.raises(ValueError, match=r"logits are −inf for every token .* position \(0, 0\)"):
        mod.entropy(conv(np.array([[[-np.inf, -np.inf]]])))
    # the same rows at a masked position are padding
    z = np.array([[[-np.inf, -np.inf], [0.0, 0.0]]])
    np.testing.assert_array_equal(np.asarray(mod.entropy(conv(z), conv(np.array([[0, 1]])))),
                                  [[0.0, math.log(2)]])


def test_entropy_refuses_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match="mask"):
        ref_numpy.entropy(np.zeros((2, 3, 4)), np.ones((2, 4), bool))


def test_kl_rewards_match_hand_computed_numbers():
    # k1 = logp − ref = [0.5, −0.5]; r = s − 0.1·k
    got = ref_numpy.kl_rewards(np.array([0.0, 1.0]), np.array([-1.0, -2.0]),
                               np.array([-1.5, -1.5]), beta=0.1)
    np.testing.assert_allclose(got, [-0.05, 1.05], rtol=1e-15)


def test_a_sequence_score_lands_on_its_last_valid_token():
    lp = np.array([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    m = np.array([[1, 1, 0], [1, 0, 1], [0, 0, 0]], bool)
    scores = np.array([3.0, 2.0, np.nan])                   # an empty row may hold garbage
    for got in (ref_numpy.kl_rewards(scores, lp, np.zeros_like(lp), m, beta=0.0),
                ref_torch.kl_rewards(*(torch.tensor(x) for x in (scores, lp, np.zeros_like(lp),
                                                                 m)), beta=0.0).numpy()):
        np.testing.assert_array_equal(got, [[0, 3, 0], [0, 0, 2], [0, 0, 0]])


def test_kl_rewards_are_the_scores_minus_beta_times_kl_penalty():
    rng = np.random.default_rng(2)
    s, lp, ref = (rng.normal(size=(3, 5)) for _ in range(3))
    m = rng.random((3, 5)) < 0.8
    for kind, clamp in (("k1", None), ("k3", (20.0, 10.0)), ("k2", None), ("abs", None)):
        got = ref_numpy.kl_rewards(s, lp, ref, m, beta=0.3, kind=kind, clamp=clamp)
        kl = ref_numpy.kl_penalty(lp, ref, m, kind=kind, clamp=clamp)
        np.testing.assert_allclose(got, np.where(m, s - 0.3 * kl, 0.0), rtol=1e-15)
        g = rng.normal(size=(3, 5))
        np.testing.assert_allclose(
            ref_numpy.kl_rewards_vjp(g, s, lp, ref, m, beta=0.3, kind=kind, clamp=clamp)["logp"],
            ref_numpy.kl_penalty_vjp(-0.3 * g, lp, ref, m, kind=kind, clamp=clamp)["logp"],
            rtol=1e-15)
