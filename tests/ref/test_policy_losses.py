"""The policy and value losses: PPO (clip-higher, dual clip, TRL's cap), CISPO, GSPO, SAPO, the
clipped value loss, the logged clip fraction, and the composed actor objective.

Per function: hand-computed fixtures (derived in the comments from the defining equation), the
identities that tie the losses together, corners pinned by hand, and extremes (no NaN in a value
or a gradient for finite valid inputs, log-ratios to ±800 and advantages to ±1e6 included).
"""
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from tests.helpers import both, close, grads


RHO = np.array([-800.0, -100.0, -30.0, -1e-12, 0.0, 1e-12, 30.0, 100.0, 800.0])


def ratio_grid():
    rho, adv = np.meshgrid(RHO, ADV)
    logp = np.full(rho.shape, -0.5)
    return logp, logp - rho, adv


def no_nan(*arrays):
    for a in arrays:
        assert not np.isnan(np.asarray(a, dtype=np.float64)).any()


ADV = np.array([0.0, 1.0, -1.0, 1e6, -1e6])


def test_a_single_sequence_keeps_its_shape():
    """Per-token losses given one sequence [T] return [T], like their [1, T] batch row."""
    rng = np.random.default_rng(2)
    T = 5
    lp, old, adv = (rng.normal(0, 0.1, T) - 1.0), rng.normal(0, 0.1, T) - 1.0, rng.normal(size=T)
    for fn in (ref_numpy.gspo_loss, ref_numpy.ppo_clip_loss, ref_numpy.cispo_loss):
        one = fn(lp, old, adv)
        assert one.shape == (T,)
        assert one == pytest.approx(fn(lp[None], old[None], adv[None])[0], abs=0)


class TestPpoClipLoss:
    """ppo_clip_loss: the case split, ties, clip-higher, the dual clip, TRL's δ."""

    def test_positive_advantage_case_split(self):
        # A = 1, ε = 0.2, ρ = [0.5, 0.1, −0.3, −1.5] (the seed's tokens)
        # r = e^ρ; loss = −min(r, clip(r, 0.8, 1.2)):
        #   r = 1.6487 > 1.2: clip binds → −1.2, gradient 0
        #   r = 1.1052, 0.7408, 0.2231: unclipped is the min → −r, gradient −r
        rho = np.array([0.5, 0.1, -0.3, -1.5])
        logp, old, A = -1.0 + rho, np.full(4, -1.0), np.ones(4)
        r = np.exp(rho)
        for loss in both("ppo_clip_loss", logp, old, A):
            close(loss, [-1.2, -r[1], -r[2], -r[3]])
        hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(4), logp, old, A)
        close(hand["logp"], [0.0, -r[1], -r[2], -r[3]])
        close(auto, [0.0, -r[1], -r[2], -r[3]])

    def test_negative_advantage_and_dual_clip(self):
        # A = −1: loss = max(r, clip(r)) (since −A = 1).
        #   r = 0.5 → max(0.5, 0.8) = 0.8 clipped, grad 0;  r = 1.5 → 1.5 unclipped, grad −A·r = 1.5
        #   r = 4 with c = 3: 4 → min(4, −c·A = 3) = 3, grad 0; r = 2.5: 2.5 < 3, grad 2.5
        r = np.array([0.5, 1.5, 4.0, 2.5])
        logp, old, A = np.log(r), np.zeros(4), -np.ones(4)
        for loss in both("ppo_clip_loss", logp, old, A):
            close(loss, [0.8, 1.5, 4.0, 2.5])
        for loss in both("ppo_clip_loss", logp, old, A, clip_c=3.0):
            close(loss, [0.8, 1.5, 3.0, 2.5])
        hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(4), logp, old, A, clip_c=3.0)
        close(hand["logp"], [0.0, 1.5, 0.0, 2.5])
        close(auto, [0.0, 1.5, 0.0, 2.5])

    def test_dual_clip_never_touches_positive_advantages(self):
        # A = +1, r = 4, c = 3: the ordinary clip gives −1.2; the dual clip is for A < 0 only
        for loss in both("ppo_clip_loss", np.array([math.log(4.0)]), np.zeros(1), np.ones(1),
                         clip_c=3.0):
            close(loss, [-1.2])

    def test_tie_on_clip_edge_keeps_the_unclipped_gradient(self):
        # ε_low = ε_high = 0: the clip interval is {1} and r = e^0 = 1 exactly sits on both edges.
        # Both branches equal −A; the unclipped branch carries the gradient −A·r = −A.
        A = np.array([2.0, -3.0])
        hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(2), np.zeros(2), np.zeros(2), A,
                              clip_low=0.0, clip_high=0.0)
        close(hand["logp"], [-2.0, 3.0])
        close(auto, [-2.0, 3.0])

    def test_clip_higher_is_asymmetric(self):
        # ε_low 0.2, ε_high 0.28: r = 1.25 is inside [0.8, 1.28] → unclipped; r = 1.3 → 1.28
        r = np.array([1.25, 1.3])
        for loss in both("ppo_clip_loss", np.log(r), np.zeros(2), np.ones(2), clip_high=0.28):
            close(loss, [-1.25, -1.28])

    def test_log_ratio_clamp_stops_the_gradient(self):
        # ρ = 25 clamped to 20, A = −1: loss = e^20 (unclipped, A < 0), gradient 0 (clamp binds)
        for loss in both("ppo_clip_loss", np.array([25.0]), np.zeros(1), -np.ones(1),
                         log_ratio_clamp=20.0):
            close(loss, [math.exp(20.0)])
        hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(1), np.array([25.0]), np.zeros(1),
                              -np.ones(1), log_ratio_clamp=20.0)
        close(hand["logp"], [0.0])
        close(auto, [0.0])

    def test_per_sequence_advantages_apply_to_every_token(self):
        logp = np.array([[0.1, -0.2], [0.3, 0.05]])
        old = np.zeros((2, 2))
        per_token = np.array([[1.0, 1.0], [-0.5, -0.5]])
        for a, b in zip(both("ppo_clip_loss", logp, old, np.array([1.0, -0.5])),
                        both("ppo_clip_loss", logp, old, per_token)):
            close(a, b)

    def test_trl_delta_equals_the_dual_clip_for_negative_advantages(self):
        # A = −1, δ = 3: r = 4 → loss min(r, δ)·1 = 3 (gradient 0); r = 2.5 → 2.5 (gradient 2.5)
        r = np.array([0.5, 1.5, 4.0, 2.5])
        for loss in both("ppo_clip_loss", np.log(r), np.zeros(4), -np.ones(4), delta=3.0):
            close(loss, [0.8, 1.5, 3.0, 2.5])
        hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(4), np.log(r), np.zeros(4), -np.ones(4),
                              delta=3.0)
        close(hand["logp"], [0.0, 1.5, 0.0, 2.5])
        close(auto, [0.0, 1.5, 0.0, 2.5])
        # A > 0: δ changes nothing (the ordinary clip already binds above 1.2)
        for loss in both("ppo_clip_loss", np.log(r), np.zeros(4), np.ones(4), delta=3.0):
            close(loss, [-0.5, -1.2, -1.2, -1.2])

    def test_at_ratio_one_is_minus_advantage(self, rng):
        logp, A = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
        for loss in both("ppo_clip_loss", logp, logp.copy(), A, clip_c=3.0):
            close(loss, -A)
        hand, auto, _ = grads("ppo_clip_loss", 0, np.ones((3, 5)), logp, logp.copy(), A)
        close(hand["logp"], -A)
        close(auto, -A)

    def test_clip_high_none_means_symmetric(self, rng):
        logp, old, A = rng.normal(size=(3, 5)), rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
        close(ref_numpy.ppo_clip_loss(logp, old, A, clip_low=0.15),
              ref_numpy.ppo_clip_loss(logp, old, A, clip_low=0.15, clip_high=0.15))

    def test_a_ratio_exactly_at_trls_cap_keeps_its_gradient(self):
        """delta caps the ratio as torch.clamp(r, max=δ) does in TRL, whose gradient passes at
        r = δ exactly (the tie convention of every clip here). By hand, A = −1, r = δ = e^1.1:
        loss = −A·r = r, ∂loss/∂logp = −A·r = r; one float step above δ the cap binds: gradient 0."""
        x = 1.1
        delta = float(np.exp(x))
        lp, old, A = np.array([[x]]), np.array([[0.0]]), np.array([[-1.0]])
        g = ref_numpy.ppo_clip_loss_vjp(np.ones((1, 1)), lp, old, A, delta=delta)["logp"]
        assert g[0, 0] == delta
        t = torch.tensor(lp, requires_grad=True)
        ref_torch.ppo_clip_loss(t, torch.tensor(old), torch.tensor(A), delta=delta).sum().backward()
        assert t.grad[0, 0].item() == delta
        lower_cap = np.nextafter(delta, 0.0)                   # a cap one float below r: it binds
        assert ref_numpy.ppo_clip_loss_vjp(np.ones((1, 1)), lp, old, A,
                                           delta=lower_cap)["logp"][0, 0] == 0

    @pytest.mark.parametrize("kw", [dict(), dict(clip_c=3.0), dict(log_ratio_clamp=20.0),
                                    dict(clip_low=0.0, clip_high=0.0), dict(clip_high=0.28)])
    def test_extremes(self, kw):
        logp, old, adv = ratio_grid()
        no_nan(*both("ppo_clip_loss", logp, old, adv, **kw))
        hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(logp.shape), logp, old, adv, **kw)
        no_nan(hand["logp"], auto)


class TestCispoLoss:
    """cispo_loss: −sg(w)·A·logp under both bounds."""

    def test_absolute_cap_value_and_gradient(self):
        # A = 1, cap 2, logp = −0.5. r = 3 → w = 2: loss = −2·1·(−0.5) = 1, gradient −w·A = −2
        # r = 0.3 → w = 0.3: loss = 0.15, gradient −0.3 (clipped or not, the token keeps a gradient)
        logp = np.array([-0.5, -0.5])
        old = logp - np.log([3.0, 0.3])
        for loss in both("cispo_loss", logp, old, np.ones(2), clip_high=2.0):
            close(loss, [1.0, 0.15])
        hand, auto, _ = grads("cispo_loss", 0, np.ones(2), logp, old, np.ones(2), clip_high=2.0)
        close(hand["logp"], [-2.0, -0.3])
        close(auto, [-2.0, -0.3])

    def test_relative_bound(self):
        # w = clip(r, 1 − 0.2, 1 + 0.28): r = 0.5 → 0.8, r = 2 → 1.28, r = 1.1 → 1.1; A = 1, logp = −1
        r = np.array([0.5, 2.0, 1.1])
        logp = -np.ones(3)
        for loss in both("cispo_loss", logp, logp - np.log(r), np.ones(3), clip_high=0.28,
                         clip_low=0.2, bound="relative"):
            close(loss, [0.8, 1.28, 1.1])

    def test_with_infinite_cap_is_importance_weighted_reinforce(self, rng):
        logp = np.log(rng.uniform(0.1, 0.9, size=(3, 5)))
        old = logp - rng.normal(0, 0.5, size=(3, 5))
        A = rng.normal(size=(3, 5))
        r = np.exp(logp - old)
        for loss in both("cispo_loss", logp, old, A, clip_high=math.inf):
            close(loss, -r * A * logp, rtol=1e-14)
        hand, auto, _ = grads("cispo_loss", 0, np.ones((3, 5)), logp, old, A, clip_high=math.inf)
        close(hand["logp"], -r * A, rtol=1e-14)
        close(auto, -r * A, rtol=1e-14)

    def test_and_ppo_share_the_gradient_inside_the_clip(self, rng):
        # inside [1 − ε, 1 + ε] and below the CISPO cap both give −r·A
        logp = np.log(rng.uniform(0.1, 0.9, size=(2, 6)))
        old = logp - rng.uniform(-0.1, 0.1, size=(2, 6))
        A = rng.normal(size=(2, 6))
        g_ppo, _, _ = grads("ppo_clip_loss", 0, np.ones((2, 6)), logp, old, A)
        g_cis, _, _ = grads("cispo_loss", 0, np.ones((2, 6)), logp, old, A)
        close(g_ppo["logp"], g_cis["logp"], rtol=1e-14)

    @pytest.mark.parametrize("kw", [dict(), dict(clip_high=math.inf), dict(bound="relative",
                                    clip_high=0.28, clip_low=0.2), dict(log_ratio_clamp=20.0)])
    def test_extremes(self, kw):
        logp, old, adv = ratio_grid()
        no_nan(*both("cispo_loss", logp, old, adv, **kw))
        hand, auto, _ = grads("cispo_loss", 0, np.ones(logp.shape), logp, old, adv, **kw)
        no_nan(hand["logp"], auto)


class TestGspoLoss:
    """gspo_loss: the length-normalised sequence ratio, token and sequence forms."""

    def test_value_and_the_two_gradient_forms(self):
        # log-ratios 0.2 and −0.1: s = e^0.05 inside [0.8, 1.2]; A = 1 → l = −s for both tokens
        logp, old, A = np.array([[0.2, -0.1]]), np.zeros((1, 2)), np.ones((1, 2))
        s = math.exp(0.05)
        for form in ("token", "sequence"):
            for loss in both("gspo_loss", logp, old, A, clip_low=0.2, clip_high=0.2, form=form):
                close(loss, [[-s, -s]])
        # cotangent [1, 0]: token form reaches token 0 only (−s); sequence form splits −s over L = 2
        g = np.array([[1.0, 0.0]])
        for form, expected in (("token", [[-s, 0.0]]), ("sequence", [[-s / 2, -s / 2]])):
            hand, auto, _ = grads("gspo_loss", 0, g, logp, old, A, clip_low=0.2, clip_high=0.2,
                                  form=form)
            close(hand["logp"], expected)
            close(auto, expected)

    def test_uses_the_mean_not_the_product(self):
        # log-ratios 0.1 and 0.05, ε = 0.1: mean → s = e^0.075 = 1.0779 inside the clip;
        # a product of ratios would be e^0.15 = 1.1618 and clip to 1.1
        for loss in both("gspo_loss", np.array([[0.1, 0.05]]), np.zeros((1, 2)), np.ones(1),
                         clip_low=0.1, clip_high=0.1):
            close(loss, [[-math.exp(0.075)] * 2])


class TestSapoLoss:
    """SAPO's soft gate f_τ(r) = σ(τ(r − 1))·4/τ, loss −f_τ(r)·A (arXiv:2511.20347; verl's
    compute_policy_loss_sapo, TRL's loss_type='sapo')."""

    def test_worked_numbers(self):
        # r = 1: f = 4σ(0)/τ = 2/τ; r = e^0.5: σ(0.64872) = 0.656718..., f = 4σ (τ = 1);
        # slope 4σ(1 − σ)·r = 4·0.656718·0.343282·1.648721 = 1.486739
        lp = np.array([[0.0, 0.5, 0.0]])
        A = np.array([[1.0, 1.0, -2.0]])
        sig = 1.0 / (1.0 + math.exp(-(math.exp(0.5) - 1.0)))
        want = [-2.0, -4.0 * sig, 2.0 * 2.0 / 2.0]          # last: τ_neg = 2, −(2/2)·(−2)
        want_g = [-1.0, -4.0 * sig * (1 - sig) * math.exp(0.5), 2.0]
        for out in both("sapo_loss", lp, np.zeros((1, 3)), A, tau_pos=1.0, tau_neg=2.0):
            close(out, [want], atol=1e-14, rtol=1e-14)
        hand, auto, key = grads("sapo_loss", 0, np.ones((1, 3)), lp, np.zeros((1, 3)), A,
                                tau_pos=1.0, tau_neg=2.0)
        close(hand[key], [want_g], atol=1e-14, rtol=1e-14)
        close(auto, [want_g], atol=1e-14, rtol=1e-14)
        assert want_g[1] == pytest.approx(-1.486739, abs=1e-6)

    @pytest.mark.parametrize("tau", [0.3, 1.0, 1.05, 4.0])
    def test_on_policy_its_gradient_is_ppos(self, tau):
        # at r = 1 the gate's slope is 1 whatever τ: the gradient is −A, as PPO's (inside its clip)
        lp = np.full((2, 3), -0.7)
        A = np.array([[1.5, -0.5, 2.0], [-1.0, 0.3, 0.0]])
        sapo, _, k = grads("sapo_loss", 0, np.ones((2, 3)), lp, lp, A, tau_pos=tau, tau_neg=tau)
        ppo = ref_numpy.ppo_clip_loss_vjp(np.ones((2, 3)), lp, lp, A)["logp"]
        close(sapo[k], ppo, atol=1e-15, rtol=1e-15)

    def test_as_the_temperature_vanishes_it_is_the_unclipped_surrogate(self):
        # f_τ(r) = 2/τ + (r − 1) + O(τ²(r − 1)³): the gradient tends to −r·A, the unclipped one
        rng = np.random.default_rng(0)
        lp, old = rng.normal(-1, 0.3, (3, 4)), rng.normal(-1, 0.3, (3, 4))
        A = rng.normal(size=(3, 4))
        g = ref_numpy.sapo_loss_vjp(np.ones((3, 4)), lp, old, A, tau_pos=1e-6,
                                    tau_neg=1e-6)["logp"]
        close(g, -np.exp(lp - old) * A, atol=1e-9, rtol=1e-9)

    def test_a_larger_tau_neg_damps_negative_updates_away_from_on_policy(self):
        lp, old, A = np.array([[0.4]]), np.array([[0.0]]), np.array([[-1.0]])
        soft = ref_numpy.sapo_loss_vjp(np.ones((1, 1)), lp, old, A, tau_neg=1.0)["logp"]
        sharp = ref_numpy.sapo_loss_vjp(np.ones((1, 1)), lp, old, A, tau_neg=3.0)["logp"]
        assert 0 < sharp[0, 0] < soft[0, 0]

    def test_extremes_give_no_nan_and_a_vanishing_gradient(self):
        logp, old, adv = ratio_grid()
        for out in both("sapo_loss", logp, old, adv):
            no_nan(out)
        hand, auto, key = grads("sapo_loss", 0, np.ones(logp.shape), logp, old, adv)
        no_nan(hand[key], auto)
        far = np.abs(logp - old) >= 100      # σ saturates: 4σ(1 − σ)·r is 0 (or e^−100-small)
        assert np.abs(hand[key][far]).max() < 1e-30

    def test_temperatures_must_be_positive(self):
        for mod in (ref_numpy, ref_torch):
            x = np.zeros((1, 2)) if mod is ref_numpy else torch.zeros(1, 2, dtype=torch.float64)
            with pytest.raises(ValueError, match="tau_neg"):
                mod.sapo_loss(x, x, x, tau_neg=0.0)


class TestValueLoss:
    """value_loss: the clip around the old value."""

    def test_branches_and_gradients(self):
        # c = 0.2. token 0: v 1.0, v_old 0.5, R 2 → v_clip 0.7: ½·max(1.0², 1.3²) = 0.845, grad 0
        # token 1: v 1.0, v_old 0.5, R 0 → ½·max(1², 0.7²) = 0.5, grad v − R = 1
        # token 2: v 0.6, v_old 0.5, R 2 (inside the clip: branches tie) → 0.98, grad −1.4
        # token 3: v 0.75, v_old 0.5, c = 0.25 in float is exact: on the edge, both branches equal,
        #          unclipped carries the gradient: v − R = 0.75 − 2 = −1.25 (checked with c = 0.25)
        v, vo, R = np.array([1.0, 1.0, 0.6]), np.array([0.5, 0.5, 0.5]), np.array([2.0, 0.0, 2.0])
        for loss in both("value_loss", v, vo, R):
            close(loss, [0.845, 0.5, 0.98], atol=1e-15)
        hand, auto, _ = grads("value_loss", 0, np.ones(3), v, vo, R)
        close(hand["values"], [0.0, 1.0, -1.4], atol=1e-15)
        close(auto, [0.0, 1.0, -1.4], atol=1e-15)
        hand, auto, _ = grads("value_loss", 0, np.ones(1), np.array([0.75]), np.array([0.5]),
                              np.array([2.0]), clip=0.25)
        close(hand["values"], [-1.25])
        close(auto, [-1.25])
        for loss in both("value_loss", v, vo, R, clip=None):
            close(loss, 0.5 * (v - R) ** 2)

    def test_without_clip_is_half_squared_error(self, rng):
        v, vo, R = (rng.normal(size=(3, 4)) for _ in range(3))
        close(ref_numpy.value_loss(v, vo, R, clip=None), 0.5 * (v - R) ** 2)
        close(ref_numpy.value_loss(v, vo, R, clip=1e9), 0.5 * (v - R) ** 2)


class TestClipFraction:
    """clip_fraction: the three definitions trainers log."""

    def test_definitions(self):
        # (r, A): (1.5, +1) binds; (0.5, +1) does not bind but |r − 1| > ε; (0.5, −1) binds;
        # (1.1, +1) inside. "loss" and "sign": 2/4; "ratio": 3/4
        r = np.array([1.5, 0.5, 0.5, 1.1])
        A = np.array([1.0, 1.0, -1.0, 1.0])
        for definition, expected in (("loss", 0.5), ("sign", 0.5), ("ratio", 0.75)):
            for f in both("clip_fraction", np.log(r), np.zeros(4), A, definition=definition):
                close(f, expected)


class TestPolicyObjective:
    """policy_objective: aggregate(policy loss + β·KL)."""

    def test_is_zero_at_ratio_one_but_its_gradient_is_not(self):
        # ratio ≡ 1 and centred advantages [1, −1]: loss = −mean(A) = 0, yet ∂/∂logp = −A/N
        logp = np.array([[-0.7, -1.2]])
        A = np.array([[1.0, -1.0]])
        m = np.ones((1, 2), dtype=bool)
        for v in both("policy_objective", logp, logp.copy(), A, m, agg="token-mean"):
            close(v, 0.0, atol=1e-15)
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, logp.copy(), A, m, agg="token-mean")
        close(hand["logp"], [[-0.5, 0.5]])
        close(auto, [[-0.5, 0.5]])

    def test_adds_the_weighted_kl_gradient(self):
        # k1 term: ∂(β·k1)/∂logp = β per token; token-mean over 2 tokens; ratio 1, A = 0
        logp = np.array([[-0.7, -1.2]])
        m = np.ones((1, 2), dtype=bool)
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, logp.copy(), np.zeros((1, 2)), m,
                              logp - 0.3, agg="token-mean", beta=0.1, kl_kind="k1")
        close(hand["logp"], [[0.05, 0.05]])
        close(auto, [[0.05, 0.05]])

    def test_kl_weight_ratio_multiplies_the_kl_term_by_the_attached_ratio(self):
        # r = e^(logp − old) = 2 and x = ref − logp = ln 2: k3 = e^x − 1 − x = 1 − ln 2, and
        # ∂k3/∂logp = −(e^x − 1) = −1. With A = 0, β = 0.5, one token:
        #   J = β·r·k3 = 1 − ln 2;  ∂J/∂logp = β·(r·(−1) + r·k3) = −ln 2
        logp = np.array([[-1.0, 0.0]])
        old, ref = logp - math.log(2.0), logp + math.log(2.0)
        m = np.array([[True, False]])
        kw = dict(agg="token-mean", beta=0.5, kl_weight="ratio")
        for v in both("policy_objective", logp, old, np.zeros(1), m, ref, **kw):
            close(v, 1.0 - math.log(2.0), atol=1e-15)
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, old, np.zeros(1), m, ref, **kw)
        close(hand["logp"], [[-math.log(2.0), 0.0]])
        close(auto, [[-math.log(2.0), 0.0]])
        # without the weight: J = β·k3, ∂J/∂logp = β·(−1)
        hand, _, _ = grads("policy_objective", 0, 1.0, logp, old, np.zeros(1), m, ref,
                           agg="token-mean", beta=0.5)
        close(hand["logp"], [[-0.5, 0.0]])

    def test_kl_weight_score_adds_the_score_term_to_the_gradient_alone(self):
        # x = ref − logp = ln 2 as above: k3 = 1 − ln 2, ∂k3/∂logp = −1. The score weight
        # exp(logp − sg(logp)) is 1: J = β·k3 = 0.5·(1 − ln 2), unchanged, and
        #   ∂J/∂logp = β·(∂k3/∂logp + k3) = 0.5·(−1 + 1 − ln 2) = −0.5·ln 2
        logp = np.array([[-1.0, 0.0]])
        ref = logp + math.log(2.0)
        m = np.array([[True, False]])
        kw = dict(agg="token-mean", beta=0.5, kl_weight="score")
        for v in both("policy_objective", logp, logp.copy(), np.zeros(1), m, ref, **kw):
            close(v, 0.5 * (1.0 - math.log(2.0)), atol=1e-15)
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, logp.copy(), np.zeros(1), m, ref,
                              **kw)
        close(hand["logp"], [[-0.5 * math.log(2.0), 0.0]])
        close(auto, [[-0.5 * math.log(2.0), 0.0]])

    @pytest.mark.parametrize("x, kind, clamp", [
        (25.0, "k1", (20.0, None)),       # the input clamp binds (k1 = −20 there)
        (3.0, "k3", (20.0, 10.0))],       # the output clamp binds: k3 = e³ − 4 > 10
        ids=["input clamp", "output clamp"])
    def test_kl_weight_score_has_no_gradient_where_a_clamp_binds(self, x, kind, clamp):
        # NeMo-RL's calculate_kl: where a clamp binds, the value is clamped and neither ∂k nor
        # the score term k·∇logp reaches logp
        logp = np.array([[-1.0]])
        kw = dict(agg="token-mean", beta=0.5, kl_weight="score", kl_kind=kind, kl_clamp=clamp)
        m = np.ones((1, 1), bool)
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, logp.copy(), np.zeros(1), m,
                              logp + x, **kw)
        close(hand["logp"], [[0.0]])
        close(auto, [[0.0]])

    def test_kl_anchor_old_takes_the_kl_to_the_sampling_policy_and_ignores_ref_logp(self):
        # prime-rl's default loss: −keep·A·r + τ·(log r)² = DPPO's ratio form + 2τ·k2(logp, old)
        # Token 1: p = 0.5, q = 0.4 (kept, A = 1), log r = ln 1.25; token 2 padding.
        # τ = 1e-3: J = −1.25 + 1e-3·ln²1.25 (one valid token),
        #           ∂J/∂logp = −1.25 + 2e-3·ln 1.25
        logp = np.array([[math.log(0.5), 0.0]])
        old = np.array([[math.log(0.4), 0.0]])
        m = np.array([[True, False]])
        lr = math.log(1.25)
        kw = dict(loss="dppo", form="ratio", clip_c=None, log_ratio_clamp=None,
                  agg="token-mean", beta=2e-3, kl_kind="k2", kl_anchor="old")
        for ref in (None, np.full((1, 2), -9.0)):       # not read: the same either way
            for v in both("policy_objective", logp, old, np.ones(1), m, ref, **kw):
                close(v, -1.25 + 1e-3 * lr * lr, atol=1e-15)
            hand, auto, _ = grads("policy_objective", 0, 1.0, logp, old, np.ones(1), m, ref,
                                  **kw)
            close(hand["logp"], [[-1.25 + 2e-3 * lr, 0.0]])
            close(auto, [[-1.25 + 2e-3 * lr, 0.0]])

    @pytest.mark.parametrize("ref", [ref_numpy, ref_torch], ids=["numpy", "torch"])
    @pytest.mark.parametrize("keywords, words", [
        (dict(kl_weight="sequence"), "kl_weight is 'sequence'; expected one of"),
        (dict(kl_anchor="reference"), "kl_anchor is 'reference'; expected one of"),
        (dict(no_ref=True), "beta is 0.1 but ref_logp is None")])
    def test_refuses_a_wrong_kl_keyword_by_name(self, ref, keywords, words):
        # kl_anchor 'ref' (the default) with beta > 0 still needs ref_logp
        x = np.zeros((1, 2)) if ref is ref_numpy else torch.zeros((1, 2), dtype=torch.float64)
        m = np.ones((1, 2), bool) if ref is ref_numpy else torch.ones((1, 2), dtype=torch.bool)
        keywords = dict(keywords)
        given = None if keywords.pop("no_ref", False) else x
        with pytest.raises(ValueError, match=words):
            ref.policy_objective(x, x, x[:, 0], m, given, beta=0.1, **keywords)

    def test_kl_weight_ratio_keeps_an_overflowing_padded_ratio_out(self):
        logp = np.array([[-1.0, 900.0]])                  # padding: e^(900 − 0) overflows
        m = np.array([[True, False]])
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, np.zeros((1, 2)), np.zeros(1),
                              m, np.zeros((1, 2)), agg="token-mean", beta=0.1, kl_weight="ratio")
        close(hand["logp"], auto)
        assert np.isfinite(auto).all() and auto[0, 1] == 0.0

    @pytest.mark.parametrize("groups", [dict(group_ids=np.array([0, 0, 1])),
                                        dict(group_ids=np.array([7, 7, 2]))],
                             ids=["ids", "other ids"])
    def test_prompt_mean_token_mean_weighs_each_prompt_equally(self, groups):
        # SkyRL's prompt_mean: rows 0, 1 answer one prompt (1 + 2 valid tokens), row 2 another
        # (1 token). r = 1, A = [1, 2, 4] per row: the PPO loss is −A per token, so
        #   J = ((−1 − 2 − 2)/3 + (−4)/1)/2 = −17/6
        # and ∂J/∂logp = −A·w with w = 1/(3·2) in the first prompt, 1/(1·2) in the second
        logp = np.array([[-1.0, 0.0], [-0.5, -2.0], [-0.3, 0.0]])
        m = np.array([[True, False], [True, True], [True, False]])
        A = np.array([1.0, 2.0, 4.0])
        kw = dict(agg="prompt-mean-token-mean", **groups)
        for v in both("policy_objective", logp, logp.copy(), A, m, **kw):
            close(v, -17.0 / 6.0, atol=1e-15)
        hand, auto, _ = grads("policy_objective", 0, 1.0, logp, logp.copy(), A, m, **kw)
        expected = [[-1.0 / 6.0, 0.0], [-1.0 / 3.0, -1.0 / 3.0], [-2.0, 0.0]]
        close(hand["logp"], expected)
        close(auto, expected)

    @pytest.mark.parametrize("ref", [ref_numpy, ref_torch], ids=["numpy", "torch"])
    def test_prompt_mean_token_mean_needs_the_rows_prompts(self, ref):
        x = np.zeros((2, 2)) if ref is ref_numpy else torch.zeros((2, 2), dtype=torch.float64)
        m = np.ones((2, 2), bool) if ref is ref_numpy else torch.ones((2, 2), dtype=torch.bool)
        with pytest.raises(ValueError, match="needs exactly one of group_size= or group_ids="):
            ref.policy_objective(x, x, x[:, 0], m, agg="prompt-mean-token-mean")

    def test_is_aggregate_of_its_parts(self, rng):
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

    def test_passes_kl_clamp_to_the_kl_term(self):
        """J = aggregate(ppo + β·k3 clamped), composed here from the parts, value and gradient;
        and the clamp binds (J differs without it)."""
        rng = np.random.default_rng(1)
        B, T = 3, 6
        logp = np.log(rng.uniform(0.1, 0.9, (B, T)))
        old, ref = logp - rng.normal(0, 0.3, (B, T)), logp + rng.normal(0, 1.0, (B, T))
        adv, mask = rng.normal(size=(B, T)), rng.random((B, T)) < 0.8
        beta, clamp = 0.5, (0.2, 0.05)
        parts = dict(logp=logp, old_logp=old, advantages=adv, mask=mask)
        per_token = ref_numpy.ppo_clip_loss(**parts) + beta * ref_numpy.kl_penalty(
            logp, ref, mask, clamp=clamp)
        J = ref_numpy.policy_objective(**parts, ref_logp=ref, beta=beta, kl_clamp=clamp)
        assert J == pytest.approx(ref_numpy.aggregate(per_token, mask), abs=1e-14)
        assert abs(J - ref_numpy.policy_objective(**parts, ref_logp=ref, beta=beta)) > 1e-3
        w = ref_numpy.aggregate_vjp(1.0, per_token, mask)["loss"]
        grad = ref_numpy.ppo_clip_loss_vjp(w, **parts)["logp"] + beta * ref_numpy.kl_penalty_vjp(
            w, logp, ref, mask, clamp=clamp)["logp"]
        hand = ref_numpy.policy_objective_vjp(1.0, **parts, ref_logp=ref, beta=beta, kl_clamp=clamp)
        assert hand["logp"] == pytest.approx(grad, abs=1e-14)

    @pytest.mark.parametrize("loss, extra", [("ppo", dict(clip_c=3.0)), ("cispo", dict())])
    def test_extremes(self, loss, extra):
        logp, old, adv = ratio_grid()
        m = np.ones(logp.shape, dtype=bool)
        ref = logp + np.flip(RHO)[None, :]
        for agg in ("token-mean", "seq-mean-token-mean"):
            no_nan(*both("policy_objective", logp, old, adv, m, ref, loss=loss, agg=agg, beta=0.1,
                         kl_clamp=(20.0, 10.0), **extra))
            hand, auto, _ = grads("policy_objective", 0, 1.0, logp, old, adv, m, ref, loss=loss,
                                  agg=agg, beta=0.1, kl_clamp=(20.0, 10.0), **extra)
            no_nan(hand["logp"], auto)


def test_sapo_at_sequence_level_gates_the_geometric_mean_ratio():
    # two tokens with log-ratios 0.2 and 0.6: s = e^0.4 for both; A = 1, τ = 1:
    # l_t = −σ(s − 1)·4, ∂L/∂logp_t = ½·Σ_t' (−4σ(1 − σ)·s) = −4σ(1 − σ)·s
    import math

    import ref_numpy
    s = math.exp(0.4)
    sig = 1 / (1 + math.exp(-(s - 1)))
    lp, old, adv = np.array([[0.2, 0.6]]), np.zeros((1, 2)), np.ones((1, 2))
    got = ref_numpy.sapo_loss(lp, old, adv, level="sequence", tau_neg=1.0)
    np.testing.assert_allclose(got, [[-4 * sig, -4 * sig]], rtol=1e-15)
    g = ref_numpy.sapo_loss_vjp(np.ones((1, 2)), lp, old, adv, level="sequence")["logp"]
    np.testing.assert_allclose(g, [[-4 * sig * (1 - sig) * s] * 2], rtol=1e-14)
    # one token per sequence: the sequence ratio is the token's
    one = np.array([[0.3], [-0.2]])
    np.testing.assert_array_equal(
        ref_numpy.sapo_loss(one, np.zeros_like(one), np.array([1.0, -1.0]), level="sequence"),
        ref_numpy.sapo_loss(one, np.zeros_like(one), np.array([1.0, -1.0])))


def test_sapo_at_sequence_level_caps_the_mean_log_ratio_from_above_and_below():
    # one row of two tokens, log-ratios ±0.8 (mean ±0.8): under log_ratio_clamp 0.5 the
    # sequence's mean is clamped to ±0.5, where SAPO's gate σ(τ(r − 1)) is far from saturated,
    # so the value is the one at a mean of exactly ±0.5, and differs from the unclamped one
    m = np.ones((1, 2), dtype=bool)
    for sign in (1.0, -1.0):
        for A in (1.0, -1.0):
            def value(x, clamp=0.5):
                return ref_numpy.sapo_loss(np.full((1, 2), sign * x), np.zeros((1, 2)),
                                           np.array([A]), m, level="sequence",
                                           log_ratio_clamp=clamp)
            close(value(0.8), value(0.5))
            assert abs(value(0.8, None)[0, 0] - value(0.5)[0, 0]) > 1e-3
