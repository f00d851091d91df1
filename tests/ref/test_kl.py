"""The per-token KL terms: kl_penalty (k1, k2, k3, |·|, clamps) and the logged approx_kl.

Hand-computed fixtures, the estimators' identities, and extremes through both twins.
"""
import itertools
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from tests.helpers import both, close, grads


RHO = np.array([-800.0, -100.0, -30.0, -1e-12, 0.0, 1e-12, 30.0, 100.0, 800.0])


def no_nan(*arrays):
    for a in arrays:
        assert not np.isnan(np.asarray(a, dtype=np.float64)).any()


class TestKlPenalty:
    """kl_penalty: the estimators, their gradients and the clamps."""

    def test_the_squared_log_ratio_penalty_is_twice_k2(self):
        # prime-rl's per-token kl_tau·(log π − log μ)²: 2·k2 with β = 2·τ,
        # in value and in gradient (∂/∂logp = 2(logp − ref)), through both twins
        logp = np.array([[-0.3, -2.0, -5.0], [-1e-9, -40.0, -0.7]])
        ref = np.array([[-0.9, -2.0, -1.0], [-3.0, -0.5, -0.71]])
        for k in both("kl_penalty", logp, ref, kind="k2"):
            close(2 * np.asarray(k), (logp - ref) ** 2, rtol=1e-15, atol=0)
        hand, auto, _ = grads("kl_penalty", 0, np.full(logp.shape, 2.0), logp, ref, kind="k2")
        close(hand["logp"], 2 * (logp - ref), rtol=1e-15, atol=0)
        close(auto, 2 * (logp - ref), rtol=1e-15, atol=0)

    def test_estimators_values_and_gradients(self):
        # logp = log 0.5, ref = log 0.4: x = log 0.8
        # k1 = −x, k2 = ½x², k3 = 0.8 − 1 − x, abs = −x;  ∂/∂logp: 1, −x, 1 − 0.8, 1
        x = math.log(0.8)
        logp, ref = np.array([math.log(0.5)]), np.array([math.log(0.4)])
        expected = {"k1": (-x, 1.0), "k2": (0.5 * x * x, -x), "k3": (0.8 - 1 - x, 0.2),
                    "abs": (-x, 1.0)}
        for kind, (val, grad) in expected.items():
            for k in both("kl_penalty", logp, ref, kind=kind):
                close(k, [val], atol=1e-15)
            hand, auto, _ = grads("kl_penalty", 0, np.ones(1), logp, ref, kind=kind)
            close(hand["logp"], [grad], atol=1e-15)
            close(auto, [grad], atol=1e-15)

    def test_clamps(self):
        # k2 at x = −1 is 0.5, clamped to 0.1 → gradient 0
        for k in both("kl_penalty", np.array([1.0]), np.array([0.0]), kind="k2", clamp=(None, 0.1)):
            close(k, [0.1])
        hand, auto, _ = grads("kl_penalty", 0, np.ones(1), np.array([1.0]), np.array([0.0]),
                              kind="k2", clamp=(None, 0.1))
        close(hand["logp"], [0.0])
        close(auto, [0.0])
        # verl k3 (20, 10): x = 25 → 20 → e^20 − 21 → clamped 10, gradient 0
        for k in both("kl_penalty", np.array([0.0]), np.array([25.0]), kind="k3", clamp=(20.0, 10.0)):
            close(k, [10.0])
        # input clamp alone binding: x = 3 → 1 under clamp (1, None); k1 = −1, gradient 0
        hand, auto, _ = grads("kl_penalty", 0, np.ones(1), np.array([0.0]), np.array([3.0]),
                              kind="k1", clamp=(1.0, None))
        close(hand["logp"], [0.0])
        close(auto, [0.0])

    def test_abs_has_zero_gradient_at_zero(self):
        hand, auto, _ = grads("kl_penalty", 0, np.ones(1), np.array([-0.3]), np.array([-0.3]),
                              kind="abs")
        close(hand["logp"], [0.0])
        close(auto, [0.0])

    def test_k3_is_non_negative_and_k1_k3_are_unbiased(self, rng):
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

    def test_k3_keeps_its_digits_for_tiny_log_ratios(self):
        # k3(x) = x²/2 + x³/6 + …; e^x − 1 − x computed naively loses every digit at x = 1e-9
        x = np.array([1e-9, -1e-9, 1e-6])
        for k in both("kl_penalty", np.zeros(3), x, kind="k3"):
            close(k, x ** 2 / 2 + x ** 3 / 6, rtol=1e-9)

    @pytest.mark.parametrize("kind, clamp", list(itertools.product(
        ["k1", "k2", "k3", "abs"], [None, (20.0, 10.0), (None, 10.0)])))
    def test_extremes(self, kind, clamp):
        logp = np.full(RHO.shape, -0.5)
        no_nan(*both("kl_penalty", logp, logp + RHO, kind=kind, clamp=clamp))
        hand, auto, _ = grads("kl_penalty", 0, np.ones(RHO.shape), logp, logp + RHO, kind=kind,
                              clamp=clamp)
        no_nan(hand["logp"], auto)


class TestApproxKl:
    """approx_kl: the token-mean estimate of KL(π_old‖π) trainers log."""

    def test_estimators(self):
        # u = logp − old = [0.1, −0.2]: k1 = mean(−u) = 0.05; k2 = mean(u²/2) = 0.0125;
        # k3 = mean(e^u − 1 − u); ∂k1/∂logp = −1/N each
        logp, old = np.array([0.1, -0.2]), np.zeros(2)
        expected = {"k1": 0.05, "k2": 0.0125,
                    "k3": ((math.exp(0.1) - 1.1) + (math.exp(-0.2) - 0.8)) / 2}
        for kind, value in expected.items():
            for v in both("approx_kl", logp, old, kind=kind):
                close(v, value)
        hand, auto, _ = grads("approx_kl", 0, 1.0, logp, old, kind="k1")
        close(hand["logp"], [-0.5, -0.5])
        close(auto, [-0.5, -0.5])

    def test_defaults_to_k1_and_an_all_masked_batch_gives_zero(self):
        """k1 = −u averaged over valid tokens (u = logp − old_logp), by hand; no valid token: 0."""
        logp, old = np.array([[-1.0, -2.0, -0.5]]), np.array([[-1.5, -1.0, -0.5]])
        mask = np.array([[True, True, False]])
        assert ref_numpy.approx_kl(logp, old, mask) == pytest.approx((-0.5 + 1.0) / 2, abs=1e-15)
        none = np.zeros_like(mask)
        adv = np.ones_like(logp)
        assert ref_numpy.approx_kl(logp, old, none) == 0.0
        assert ref_numpy.clip_fraction(logp, old, adv, none) == 0.0
        t = {k: torch.tensor(v) for k, v in dict(logp=logp, old=old, none=none, adv=adv).items()}
        assert float(ref_torch.clip_fraction(t["logp"], t["old"], t["adv"], t["none"])) == 0.0
        assert float(ref_torch.approx_kl(t["logp"], t["old"], t["none"])) == 0.0


class TestRatioKlPenalty:
    """ratio_kl_penalty: r·k, the KL(π‖ref) estimate importance-weighted from π_old."""

    def test_ratio_k1_by_hand_value_and_gradient(self):
        # π = 0.5, π_old = 0.25, ref = 0.4: r = 2, k1 = log(0.5/0.4); the gradient
        # r·(1 + log(π/ref)) (product rule: ∂r/∂logp = r, ∂k1/∂logp = 1)
        logp, old, ref = np.log([[0.5, 0.3]]), np.log([[0.25, 0.3]]), np.log([[0.4, 0.2]])
        k1 = np.log([[0.5 / 0.4, 0.3 / 0.2]])
        r = np.array([[2.0, 1.0]])
        for v in both("ratio_kl_penalty", logp, old, ref):
            close(v, r * k1)
        hand, auto, _ = grads("ratio_kl_penalty", 0, np.ones((1, 2)), logp, old, ref)
        close(hand["logp"], r * (1.0 + k1))
        close(auto, r * (1.0 + k1))

    def test_ratio_one_is_kl_penalty_and_the_value_is_unbiased_off_policy(self):
        logp, ref = np.log([[0.5, 0.2]]), np.log([[0.4, 0.3]])
        for kind in ("k1", "k2", "k3"):
            close(ref_numpy.ratio_kl_penalty(logp, logp, ref, kind=kind),
                  ref_numpy.kl_penalty(logp, ref, kind=kind))
        # a three-token vocabulary, samples from π_old: Σ_y π_old(y)·r(y)·k1(y) = KL(π‖ref)
        pi, old = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
        rf = np.array([0.3, 0.3, 0.4])
        est = ref_numpy.ratio_kl_penalty(np.log(pi)[None], np.log(old)[None], np.log(rf)[None])
        close((old * est[0]).sum(), (pi * np.log(pi / rf)).sum())

    def test_clamp_caps_the_log_ratio_at_40_before_the_weight(self):
        # logp − ref = 50 clamped to 40 (open-instruct's ±40): r·40, gradient r·k1 = 40 (the
        # clamp binds: ∂k1 = 0, only the ratio's term)
        logp, old, ref = np.array([[-1.0]]), np.array([[-1.5]]), np.array([[-51.0]])
        r = math.exp(0.5)
        for v in both("ratio_kl_penalty", logp, old, ref, clamp=(40.0, None)):
            close(v, [[r * 40.0]])
        hand, auto, _ = grads("ratio_kl_penalty", 0, np.ones((1, 1)), logp, old, ref,
                              clamp=(40.0, None))
        close(hand["logp"], [[r * 40.0]])
        close(auto, [[r * 40.0]])

    def test_padding_is_never_read_and_a_wrong_old_logp_is_refused(self):
        logp, old, ref = np.array([[-1.0, np.nan]]), np.array([[-1.0, np.inf]]), \
            np.array([[-2.0, np.nan]])
        m = np.array([[True, False]])
        for v in both("ratio_kl_penalty", logp, old, ref, m):
            close(v, [[1.0, 0.0]])
        hand, auto, _ = grads("ratio_kl_penalty", 0, np.ones((1, 2)), logp, old, ref, m)
        close(hand["logp"], [[2.0, 0.0]])
        close(auto, [[2.0, 0.0]])
        with pytest.raises(ValueError, match=r"old_logp has shape \(1, 3\)"):
            ref_numpy.ratio_kl_penalty(logp, np.zeros((1, 3)), ref, m)
        with pytest.raises(ValueError, match="old_logp"):
            bad_old = torch.tensor([[np.nan, 0.0]], dtype=torch.float64)
            ref_torch.ratio_kl_penalty(torch.tensor(logp), bad_old, torch.tensor(ref),
                                       torch.tensor(m))
