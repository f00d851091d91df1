"""The numbers the MiniMind teaching script this project grew from prints (its rl_demo output),
reproduced through the public API.

The seed computes in float32 and prints 4 decimals (or float32 reprs), so the comparisons are
at its printed precision: half a unit of the last printed digit, or 1e-6 for float32 reprs.
Its conventions are MiniMind's: biased std, eps 1e-4 on the group std, rsqrt(var + 1e-8)
whitening over all tokens, symmetric ε = 0.2, absolute CISPO cap, k1/k3 of KL(p‖q).
"""
import numpy as np

from tests.helpers import both, grads

R = np.array([1.0, 0.0, 0.0, 0.0, 0.5])
V = np.array([0.5, 0.6, 0.4, 0.5, 0.2])
DONES = np.array([0, 0, 0, 0, 1])
GAE_KW = dict(gamma=0.99, lam=0.95, dones=DONES)
FOUR_DP = 0.5e-4


def at_4dp(actual, printed):
    np.testing.assert_allclose(actual, printed, rtol=0, atol=FOUR_DP, strict=True)


def test_seed_td_errors():
    # "δ_0 = 1.0940 … δ_4 = 0.3000": GAE with λ = 0 is the one-step TD error
    for adv, _ in both("gae", R, V, gamma=0.99, lam=0.0, dones=DONES):
        at_4dp(adv, [1.0940, -0.2040, 0.0950, -0.3020, 0.3000])


def test_seed_gae_advantages_and_returns():
    for adv, ret in both("gae", R, V, **GAE_KW):
        at_4dp(adv, [0.9697, -0.1322, 0.0763, -0.0198, 0.3000])
        np.testing.assert_allclose(
            ret, [1.469655990600586, 0.4677894115447998, 0.47633111476898193,
                  0.480150043964386, 0.5], rtol=0, atol=1e-6, strict=True)


def test_seed_whitening():
    # mean 0.2388, var 0.1538 (biased), normalised by rsqrt(var + 1e-8)
    adv, _ = both("gae", R, V, **GAE_KW)[0]
    at_4dp(adv.mean(), 0.2388)
    at_4dp(((adv - adv.mean()) ** 2).mean(), 0.1538)
    for y in both("whiten", adv, ddof=0, eps=1e-8, eps_mode="var"):
        at_4dp(y, [1.8638, -0.9461, -0.4143, -0.6596, 0.1561])


OLD = np.full(4, -1.0)
NEW = np.array([-0.5, -0.9, -1.3, -2.5])


def test_seed_ppo_table():
    # ratio 1.649 / 1.105 / 0.741 / 0.223; loss -1.2000 / -1.1052 / -0.7408 / -0.2231; mean -0.8173
    for loss in both("ppo_clip_loss", NEW, OLD, np.ones(4), clip_low=0.2):
        at_4dp(loss, [-1.2000, -1.1052, -0.7408, -0.2231])
    for mean in both("aggregate", both("ppo_clip_loss", NEW, OLD, np.ones(4))[0],
                     np.ones(4, dtype=bool), mode="token-mean"):
        at_4dp(mean, -0.8173)


def test_seed_ppo_table_gradients_say_which_tokens_are_clipped():
    # Computed, not read: only token 0 has a zero gradient. Tokens 2 and 3 have r < 0.8, but with
    # A > 0 the min picks the unclipped r·A, so the clip does not bind and they keep −r.
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(4), NEW, OLD, np.ones(4))
    for g in (hand["logp"], auto):
        assert g[0] == 0.0
        assert np.all(g[1:] < 0)
        at_4dp(-g[1:], [1.1052, 0.7408, 0.2231])


def test_seed_grpo_advantages():
    rewards = np.array([0.8, 0.4, 0.6, 0.2, 0.1, 0.3, 0.9, 0.5])
    printed = [1.3410409688949585, -0.44701361656188965, 0.4470137655735016, -1.3410409688949585,
               -1.1828162670135498, -0.5069211721420288, 1.5207637548446655, 0.16897378861904144]
    for a in both("group_advantages", rewards, group_size=4, ddof=0, eps=1e-4):
        np.testing.assert_allclose(a, printed, rtol=0, atol=1e-6, strict=True)
        assert abs(a[:4].sum()) < 1e-12 and abs(a[4:].sum()) < 1e-12


def test_seed_cispo_vs_ppo_table():
    # ratios 0.3 / 0.9 / 1.5 / 3.0 / 5.0, A = 1: PPO's effective ratio min(r, clip(r)) is
    # 0.3 / 0.9 / 1.2 / 1.2 / 1.2; CISPO's weight min(r, 2.0) is 0.3 / 0.9 / 1.5 / 2.0 / 2.0
    r = np.array([0.3, 0.9, 1.5, 3.0, 5.0])
    logp = np.full(5, -1.0)
    old = logp - np.log(r)
    for loss in both("ppo_clip_loss", logp, old, np.ones(5)):
        np.testing.assert_allclose(-loss, [0.3, 0.9, 1.2, 1.2, 1.2], rtol=1e-12, strict=True)
    hand, auto, _ = grads("cispo_loss", 0, np.ones(5), logp, old, np.ones(5), clip_high=2.0)
    for g in (hand["logp"], auto):           # ∂l/∂logp = −w·A exposes the detached weight w
        np.testing.assert_allclose(-g, [0.3, 0.9, 1.5, 2.0, 2.0], rtol=1e-12, strict=True)


P = np.array([0.5, 0.3, 0.15, 0.05])
Q = np.array([0.4, 0.4, 0.15, 0.05])


def test_seed_kl_estimator_table():
    # KL(p‖q) = 0.025267; k1 = [0.2231, −0.2877, 0, 0]; k3 = [0.0231, 0.0457, 0, 0];
    # E_p[k1] = E_p[k3] = 0.025267; Var k1 = 0.049086, Var k3 = 0.000255
    for k1 in both("kl_penalty", np.log(P), np.log(Q), kind="k1"):
        at_4dp(k1, [0.2231, -0.2877, 0.0, 0.0])
        np.testing.assert_allclose((P * k1).sum(), 0.025267, atol=0.5e-6, strict=True)
        np.testing.assert_allclose((P * (k1 - (P * k1).sum()) ** 2).sum(), 0.049086, atol=0.5e-6,
                                   strict=True)
    for k3 in both("kl_penalty", np.log(P), np.log(Q), kind="k3"):
        at_4dp(k3, [0.0231, 0.0457, 0.0, 0.0])
        np.testing.assert_allclose((P * k3).sum(), 0.025267, atol=0.5e-6, strict=True)
        np.testing.assert_allclose((P * (k3 - (P * k3).sum()) ** 2).sum(), 0.000255,
                                   atol=0.5e-6, strict=True)
        assert k3.min() >= 0
