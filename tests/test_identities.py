"""Identities that tie functions together (rlax style), checked on random inputs for both twins."""
import math

import numpy as np
import pytest
from scipy.signal import lfilter

import ref_numpy
from _util import both, close, grads


def discounted_cumsum(x, discount):
    """Σ_l discount^l · x_{t+l}: lfilter on the reversed sequence, a loop-free third oracle."""
    return lfilter([1.0], [1.0, -discount], x[..., ::-1], axis=-1)[..., ::-1]


@pytest.fixture
def rng():
    return np.random.default_rng(20261202)


def test_gae_lambda_zero_is_the_td_error(rng):
    r, v = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    v_next = np.concatenate([v[:, 1:], np.zeros((3, 1))], axis=1)
    for adv, _ in both("gae", r, v, gamma=0.9, lam=0.0):
        close(adv, r + 0.9 * v_next - v, atol=1e-14)


def test_gae_lambda_one_is_the_discounted_return_minus_v(rng):
    r, v, lv = rng.normal(size=(3, 7)), rng.normal(size=(3, 7)), rng.normal(size=3)
    G = discounted_cumsum(r, 0.95) + 0.95 ** (7 - np.arange(7))[None, :] * lv[:, None]
    for adv, ret in both("gae", r, v, gamma=0.95, lam=1.0, last_value=lv):
        close(adv, G - v, atol=1e-13)
        close(ret, G, atol=1e-13)


def test_gae_equals_lfilter_of_td_errors(rng):
    r, v = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
    v_next = np.concatenate([v[:, 1:], np.zeros((4, 1))], axis=1)
    expected = discounted_cumsum(r + 0.99 * v_next - v, 0.99 * 0.95)
    for adv, _ in both("gae", r, v, gamma=0.99, lam=0.95):
        close(adv, expected, atol=1e-13)


def test_gae_masked_steps_behave_as_if_removed(rng):
    # carrying across masked steps = running GAE on the valid steps alone (compacted)
    r, v = rng.normal(size=9), rng.normal(size=9)
    m = np.array([1, 1, 0, 0, 1, 0, 1, 1, 0], dtype=bool)
    adv_c, ret_c = ref_numpy.gae(r[m], v[m], gamma=0.9, lam=0.8)
    for adv, ret in both("gae", r, v, m, gamma=0.9, lam=0.8):
        close(adv[m], adv_c, atol=1e-14)
        close(ret[m], ret_c, atol=1e-14)
        assert np.all(adv[~m] == 0) and np.all(ret[~m] == 0)


def test_whiten_gives_zero_mean_unit_variance_on_valid_entries(rng):
    x = rng.normal(3.0, 2.0, size=(4, 6))
    m = rng.random((4, 6)) < 0.6
    for ddof in (0, 1):
        for y in both("whiten", x, m, ddof=ddof, eps=0.0):
            close(y[m].mean(), 0.0, atol=1e-14)
            close(((y[m] - y[m].mean()) ** 2).sum() / (m.sum() - ddof), 1.0, atol=1e-13)


def test_ppo_at_ratio_one_is_minus_advantage(rng):
    logp, A = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    for loss in both("ppo_clip_loss", logp, logp.copy(), A, clip_c=3.0):
        close(loss, -A)
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones((3, 5)), logp, logp.copy(), A)
    close(hand["logp"], -A)
    close(auto, -A)


def test_cispo_with_infinite_cap_is_importance_weighted_reinforce(rng):
    logp = np.log(rng.uniform(0.1, 0.9, size=(3, 5)))
    old = logp - rng.normal(0, 0.5, size=(3, 5))
    A = rng.normal(size=(3, 5))
    r = np.exp(logp - old)
    for loss in both("cispo_loss", logp, old, A, clip_high=math.inf):
        close(loss, -r * A * logp, rtol=1e-14)
    hand, auto, _ = grads("cispo_loss", 0, np.ones((3, 5)), logp, old, A, clip_high=math.inf)
    close(hand["logp"], -r * A, rtol=1e-14)
    close(auto, -r * A, rtol=1e-14)


def test_cispo_and_ppo_share_the_gradient_inside_the_clip(rng):
    # inside [1 − ε, 1 + ε] and below the CISPO cap both give −r·A
    logp = np.log(rng.uniform(0.1, 0.9, size=(2, 6)))
    old = logp - rng.uniform(-0.1, 0.1, size=(2, 6))
    A = rng.normal(size=(2, 6))
    g_ppo, _, _ = grads("ppo_clip_loss", 0, np.ones((2, 6)), logp, old, A)
    g_cis, _, _ = grads("cispo_loss", 0, np.ones((2, 6)), logp, old, A)
    close(g_ppo["logp"], g_cis["logp"], rtol=1e-14)


def test_ppo_clip_high_none_means_symmetric(rng):
    logp, old, A = rng.normal(size=(3, 5)), rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    close(ref_numpy.ppo_clip_loss(logp, old, A, clip_low=0.15),
          ref_numpy.ppo_clip_loss(logp, old, A, clip_low=0.15, clip_high=0.15))


@pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_sum_to_zero_in_each_group(rng, baseline, scale):
    r = rng.normal(size=12)
    ids = rng.permutation(np.repeat(np.arange(3), 4))
    for a in both("group_advantages", r, group_ids=ids, scale=scale, baseline=baseline):
        for g in range(3):
            close(a[ids == g].sum(), 0.0, atol=1e-13)


def test_leave_one_out_is_a_rescaled_mean_baseline(rng):
    # r_i − mean of the others = n/(n − 1)·(r_i − μ)
    r = rng.normal(size=10)
    close(ref_numpy.group_advantages(r, group_size=5, scale="none", baseline="leave_one_out"),
          5 / 4 * ref_numpy.group_advantages(r, group_size=5, scale="none"), atol=1e-14)


def test_k3_is_non_negative_and_k1_k3_are_unbiased(rng):
    x = np.linspace(-30, 30, 2001)
    for k in both("kl_penalty", np.zeros_like(x), x, kind="k3"):
        assert np.all(k >= 0)
    # exact expectation under a small policy p: Σ p·k1 = Σ p·k3 = KL(p‖q)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.4, 0.4, 0.15, 0.05])
    kl = float((p * np.log(p / q)).sum())
    for kind in ("k1", "k3"):
        for k in both("kl_penalty", np.log(p), np.log(q), kind=kind):
            close((p * k).sum(), kl, atol=1e-15)


def test_k3_keeps_its_digits_for_tiny_log_ratios():
    # k3(x) = x²/2 + x³/6 + …; e^x − 1 − x computed naively loses every digit at x = 1e-9
    x = np.array([1e-9, -1e-9, 1e-6])
    for k in both("kl_penalty", np.zeros(3), x, kind="k3"):
        close(k, x ** 2 / 2 + x ** 3 / 6, rtol=1e-9)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_mean_aggregations_weight_valid_tokens_to_one(rng, mode):
    m = rng.random((5, 8)) < 0.5
    m[0] = False
    hand, _, _ = grads("aggregate", 0, 1.0, rng.normal(size=(5, 8)), m, mode=mode)
    close(hand["loss"].sum(), 1.0)
    assert np.all(hand["loss"][~m] == 0)


def test_value_loss_without_clip_is_half_squared_error(rng):
    v, vo, R = (rng.normal(size=(3, 4)) for _ in range(3))
    close(ref_numpy.value_loss(v, vo, R, clip=None), 0.5 * (v - R) ** 2)
    close(ref_numpy.value_loss(v, vo, R, clip=1e9), 0.5 * (v - R) ** 2)


def test_policy_objective_is_aggregate_of_its_parts(rng):
    logp = np.log(rng.uniform(0.1, 0.9, size=(3, 6)))
    old = logp - rng.normal(0, 0.2, size=(3, 6))
    ref = logp - rng.normal(0, 0.2, size=(3, 6))
    A = rng.normal(size=3)
    m = rng.random((3, 6)) < 0.7
    per_token = ref_numpy.cispo_loss(logp, old, A, m, clip_high=2.0) + \
        0.05 * ref_numpy.kl_penalty(logp, ref, m, kind="k2")
    expected = ref_numpy.aggregate(per_token, m, mode="token-mean")
    for v in both("policy_objective", logp, old, A, m, ref, loss="cispo", agg="token-mean",
                  beta=0.05, kl_kind="k2", clip_high=2.0):
        close(v, expected, atol=1e-14)
