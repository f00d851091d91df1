"""No public function returns NaN (value or gradient) for finite valid inputs, extremes included:
log-ratios to ±800 (past exp overflow), advantages 0 and ±1e6, rewards 1e6, spreads of 1e-12."""
import itertools
import math

import numpy as np
import pytest

from _util import both, grads

RHO = np.array([-800.0, -100.0, -30.0, -1e-12, 0.0, 1e-12, 30.0, 100.0, 800.0])
ADV = np.array([0.0, 1.0, -1.0, 1e6, -1e6])


def ratio_grid():
    rho, adv = np.meshgrid(RHO, ADV)
    logp = np.full(rho.shape, -0.5)
    return logp, logp - rho, adv


def no_nan(*arrays):
    for a in arrays:
        assert not np.isnan(np.asarray(a, dtype=np.float64)).any()


@pytest.mark.parametrize("kw", [dict(), dict(clip_c=3.0), dict(log_ratio_clamp=20.0),
                                dict(clip_low=0.0, clip_high=0.0), dict(clip_high=0.28)])
def test_ppo_extremes(kw):
    logp, old, adv = ratio_grid()
    no_nan(*both("ppo_clip_loss", logp, old, adv, **kw))
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(logp.shape), logp, old, adv, **kw)
    no_nan(hand["logp"], auto)


@pytest.mark.parametrize("kw", [dict(), dict(clip_high=math.inf), dict(bound="relative",
                                clip_high=0.28, clip_low=0.2), dict(log_ratio_clamp=20.0)])
def test_cispo_extremes(kw):
    logp, old, adv = ratio_grid()
    no_nan(*both("cispo_loss", logp, old, adv, **kw))
    hand, auto, _ = grads("cispo_loss", 0, np.ones(logp.shape), logp, old, adv, **kw)
    no_nan(hand["logp"], auto)


@pytest.mark.parametrize("kind, clamp", list(itertools.product(
    ["k1", "k2", "k3", "abs"], [None, (20.0, 10.0), (None, 10.0)])))
def test_kl_extremes(kind, clamp):
    logp = np.full(RHO.shape, -0.5)
    no_nan(*both("kl_penalty", logp, logp + RHO, kind=kind, clamp=clamp))
    hand, auto, _ = grads("kl_penalty", 0, np.ones(RHO.shape), logp, logp + RHO, kind=kind,
                          clamp=clamp)
    no_nan(hand["logp"], auto)


@pytest.mark.parametrize("loss, extra", [("ppo", dict(clip_c=3.0)), ("cispo", dict())])
def test_policy_objective_extremes(loss, extra):
    logp, old, adv = ratio_grid()
    m = np.ones(logp.shape, dtype=bool)
    ref = logp + np.flip(RHO)[None, :]
    for agg in ("token-mean", "seq-mean-token-mean"):
        no_nan(*both("policy_objective", logp, old, adv, m, ref, loss=loss, agg=agg, beta=0.1,
                     kl_clamp=(20.0, 10.0), **extra))
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, old, adv, m, ref, loss=loss,
                              agg=agg, beta=0.1, kl_clamp=(20.0, 10.0), **extra)
        no_nan(hand["logp"], auto)


def test_large_rewards_and_tiny_spreads():
    r = 1e6 + np.array([0.0, 1e-9, 2e-9, 0.0, 5.0, 5.0, 5.0, 5.0])   # a group with σ ≈ 1e-9
    for scale in ("group", "batch", "none"):
        no_nan(*both("group_advantages", r, group_size=4, scale=scale))
        hand, auto, _ = grads("group_advantages", 0, np.ones(8), r, group_size=4, scale=scale)
        no_nan(hand["rewards"], auto)
    x = np.array([[1e-12, 2e-12, 3e-12], [1e6, 1e6, 1e6]])
    for mode in ("var", "clamp", "std"):
        no_nan(*both("whiten", x, eps_mode=mode))
        no_nan(*both("whiten", x[:1], eps_mode=mode, eps=1e-8))
    big = np.full((2, 50), 1e6)
    no_nan(*both("gae", big, -big, gamma=1.0, lam=1.0)[0])
    no_nan(*both("value_loss", big, -big, big))
