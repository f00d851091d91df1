"""DPPO, GMPO and KL-Cov: worked numbers computed by hand from their definitions, and the
identities that tie each to PPO's surrogate."""
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch


def both(name, *arrays, **kw):
    a = getattr(ref_numpy, name)(*arrays, **kw)
    b = getattr(ref_torch, name)(*(None if x is None else torch.tensor(x) for x in arrays), **kw)
    return np.asarray(a), b.detach().numpy()


def grads(name, g, *arrays, **kw):
    """The hand VJP wrt logp and torch autograd's, for the same cotangent."""
    hand = getattr(ref_numpy, name + "_vjp")(g, *arrays, **kw)["logp"]
    t = [torch.tensor(x) for x in arrays]
    t[0].requires_grad_(True)
    (getattr(ref_torch, name)(*t, **kw) * torch.tensor(g)).sum().backward()
    return hand, t[0].grad.numpy()


# ------------------------------------------------------------------ DPPO
def test_dppo_inside_the_region_is_the_truncated_is_policy_gradient():
    # p = 0.5, q = 0.4: D_TV = 0.1 ≤ 0.2; r = 1.25: l = −1.25·log 0.5, ∂l/∂logp = −1.25
    lp, old, adv = np.array([math.log(0.5)]), np.array([math.log(0.4)]), np.array([1.0])
    for got in both("dppo_loss", lp, old, adv, clip_c=None):
        np.testing.assert_allclose(got, [-1.25 * math.log(0.5)], rtol=1e-15)
    for got in grads("dppo_loss", np.ones(1), lp, old, adv):
        np.testing.assert_allclose(got, [-1.25], rtol=1e-15)


def test_dppo_drops_a_token_that_moved_too_far_in_its_advantages_direction():
    # p − q = 0.3 > 0.2 with A > 0: out; the same move with A < 0 is kept (−A·r·logp)
    lp, old = np.array([math.log(0.5)]), np.array([math.log(0.2)])
    for got in both("dppo_loss", lp, old, np.array([1.0])):
        np.testing.assert_array_equal(got, [0.0])
    for got in both("dppo_loss", lp, old, np.array([-1.0])):
        np.testing.assert_allclose(got, [2.5 * math.log(0.5)], rtol=1e-15)


def test_dppo_binary_kl_of_equal_probabilities_is_zero_and_keeps_every_token():
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.05, 0.95, (3, 4)))
    adv = rng.normal(size=(3, 4))
    for divergence in ("tv", "kl"):
        got = ref_numpy.dppo_loss(lp, lp, adv, divergence=divergence, clip_low=1e-9)
        np.testing.assert_allclose(got, -adv * lp, rtol=1e-15)       # r = 1, every token kept


def test_dppo_with_a_region_that_never_binds_has_the_unclipped_ppo_gradient():
    rng = np.random.default_rng(1)
    lp = np.log(rng.uniform(0.05, 0.95, (3, 5)))
    old = np.log(rng.uniform(0.05, 0.95, (3, 5)))
    adv, g = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    dppo = ref_numpy.dppo_loss_vjp(g, lp, old, adv, clip_low=2.0, clip_c=None)["logp"]
    unclipped = ref_numpy.ppo_clip_loss_vjp(g, lp, old, adv, clip_low=0.999, clip_high=1e6)
    np.testing.assert_allclose(dppo, unclipped["logp"], rtol=1e-14)


@pytest.mark.parametrize("kl_eps", [0.0, 1e-8])
def test_dppo_kl_keeps_a_token_whose_old_probability_is_exactly_one(kl_eps):
    # q = 1 (float32 log-softmax gives old_logp = 0 for a confident token): the binary KL is
    # 1·log(1/p) + 0·log(0/(1 − p)) = −log p = 0.1 ≤ δ, so the token is kept and its gradient
    # is −A·r = e^−0.1 (verl, with ε = 1e-8: +0.9048)
    lp, old, adv = np.array([-0.1]), np.array([0.0]), np.array([-1.0])
    for got in grads("dppo_loss", np.ones(1), lp, old, adv, divergence="kl", kl_eps=kl_eps):
        np.testing.assert_allclose(got, [math.exp(-0.1)], rtol=1e-15)
    # beyond δ it is dropped: −log p = 0.3 > 0.2, with A < 0 and p < q
    for got in grads("dppo_loss", np.ones(1), np.array([-0.3]), old, adv, divergence="kl",
                     kl_eps=kl_eps):
        np.testing.assert_array_equal(got, [0.0])


def test_dppo_truncates_at_verls_default_clip_ratio_c():
    # ActorConfig.clip_ratio_c = 3.0: r = e^2 is truncated to 3 (A < 0 keeps the move up)
    lp, old, adv = np.array([-0.05]), np.array([-2.05]), np.array([-1.0])
    for got in grads("dppo_loss", np.ones(1), lp, old, adv, clip_low=10.0):
        np.testing.assert_allclose(got, [3.0], rtol=1e-15)


def test_dppo_ratio_form_carries_the_ratio_itself_with_the_same_gradient_inside_the_region():
    # p = 0.5, q = 0.4, A = 1: kept (D = 0.1); form "ratio": l = −A·r = −1.25, ∂l/∂logp = −r
    lp, old, adv = np.array([math.log(0.5)]), np.array([math.log(0.4)]), np.array([1.0])
    for got in both("dppo_loss", lp, old, adv, clip_c=None, form="ratio"):
        np.testing.assert_allclose(got, [-1.25], rtol=1e-15)
    for got in grads("dppo_loss", np.ones(1), lp, old, adv, clip_c=None, form="ratio"):
        np.testing.assert_allclose(got, [-1.25], rtol=1e-15)
    # dropped (p − q = 0.3 > 0.2 with A > 0): value and gradient 0 in this form too
    for got in grads("dppo_loss", np.ones(1), np.array([math.log(0.5)]),
                     np.array([math.log(0.2)]), adv, clip_c=None, form="ratio"):
        np.testing.assert_array_equal(got, [0.0])


def test_dppo_ratio_form_is_flat_above_the_truncation_and_outside_the_log_ratio_clamp():
    # r = e^2 > C = 3, A = −1, kept: form "logp" has the truncated weight −A·C = 3 as its
    # gradient, form "ratio" has min(r, C) = C, a constant: value 3, gradient 0
    lp, old, adv = np.array([-0.05]), np.array([-2.05]), np.array([-1.0])
    for got in both("dppo_loss", lp, old, adv, clip_low=10.0, form="ratio"):
        np.testing.assert_allclose(got, [3.0], rtol=1e-15)
    for got in grads("dppo_loss", np.ones(1), lp, old, adv, clip_low=10.0, form="ratio"):
        np.testing.assert_array_equal(got, [0.0])
    # log r = 2 beyond a clamp of 1.5: r = e^1.5 held, gradient 0; at a clamp of 2.5, e^2
    for clamp, value, grad in ((1.5, math.exp(1.5), 0.0), (2.5, math.exp(2.0), math.exp(2.0))):
        for got in both("dppo_loss", lp, old, adv, clip_low=10.0, clip_c=None, form="ratio",
                        log_ratio_clamp=clamp):
            np.testing.assert_allclose(got, [value], rtol=1e-15)
        for got in grads("dppo_loss", np.ones(1), lp, old, adv, clip_low=10.0, clip_c=None,
                         form="ratio", log_ratio_clamp=clamp):
            np.testing.assert_allclose(got, [grad], rtol=1e-15)


@pytest.mark.parametrize("log_r", [700.0, 800.0, 1e4, -800.0])
def test_dppo_ratio_form_saturates_its_ratio_past_the_exp_cap_in_value_and_gradient(log_r):
    # C = None and no clamp: l = −A·r. exp is capped at the largest argument whose exp is
    # finite (log max ≈ 709.78): r = e^700 below it (gradient −A·r); above it r holds at the
    # largest float and is flat there (gradient 0, as a clamp that binds); e^−800 = 0
    lp, adv = np.array([-1.0 if log_r > 0 else -801.0]), np.array([1.0])
    old = lp - log_r
    big = np.finfo(np.float64).max
    value, grad = {700.0: (-math.exp(700.0), -math.exp(700.0)), 800.0: (-big, 0.0),
                   1e4: (-big, 0.0), -800.0: (0.0, 0.0)}[log_r]
    kw = dict(clip_low=1.0, clip_c=None, log_ratio_clamp=None, form="ratio")
    for got in both("dppo_loss", lp, old, adv, **kw):
        np.testing.assert_allclose(got, [value], rtol=1e-13)
    for got in grads("dppo_loss", np.ones(1), lp, old, adv, **kw):
        np.testing.assert_allclose(got, [grad], rtol=1e-13)


@pytest.mark.parametrize("clamp", [20.0, None])
def test_dppo_forms_share_their_gradient_with_c_none_only_where_the_clamp_does_not_bind(clamp):
    # C = None, A = 1, kept (clip_low huge). Inside the clamp both forms' gradients are −A·r.
    # Where the default ±20 clamp binds (log r = 25), "logp" keeps the weight −A·e^20 while
    # "ratio" is flat (0); without a clamp both are −A·e^25 there
    lp = np.array([-1.0, -1.0])
    old = lp - np.array([0.5, 25.0])
    adv = np.ones(2)
    kw = dict(clip_low=1e300, clip_c=None, log_ratio_clamp=clamp)
    inside = -math.exp(0.5)
    beyond = (-math.exp(20.0), 0.0) if clamp else (-math.exp(25.0), -math.exp(25.0))
    for form, at_25 in zip(("logp", "ratio"), beyond):
        for got in grads("dppo_loss", np.ones(2), lp, old, adv, form=form, **kw):
            np.testing.assert_allclose(got, [inside, at_25], rtol=1e-14)


def test_dppo_refuses_an_unknown_form_by_name():
    x = np.array([[-0.5]])
    with pytest.raises(ValueError, match="form is 'prob'; expected one of"):
        ref_numpy.dppo_loss(x, x, x, form="prob")
    with pytest.raises(ValueError, match="form is 'prob'; expected one of"):
        ref_torch.dppo_loss(torch.tensor(x), torch.tensor(x), torch.tensor(x), form="prob")


def test_dppo_kl_refuses_a_positive_log_probability():
    x = np.array([[0.5]])
    with pytest.raises(ValueError, match="logp at valid position"):
        ref_numpy.dppo_loss(x, -x, x, divergence="kl")
    with pytest.raises(ValueError, match="logp at valid position"):
        ref_torch.dppo_loss(torch.tensor(x), torch.tensor(-x), torch.tensor(x), divergence="kl")


# ------------------------------------------------------------------ GMPO
def test_gmpo_matches_hand_computed_numbers():
    # ρ = [0.1, 0.3], ε = 0.2, A = 1: ρ̃ = [0.1, 0.2], R = 0.15; loss = −e^0.15, and only the
    # unclipped token carries gradient, e^0.15 / 2
    lp, old, adv = np.array([0.1, 0.3]), np.zeros(2), np.ones(2)
    for got in both("gmpo_loss", lp, old, adv):
        np.testing.assert_allclose(got, -math.exp(0.15), rtol=1e-15)
    for got in grads("gmpo_loss", np.array(1.0), lp, old, adv):
        np.testing.assert_allclose(got, [-math.exp(0.15) / 2, 0.0], rtol=1e-15)


def test_gmpo_on_one_token_sequences_is_ppo_clipped_in_log_space():
    # with L = 1 the geometric mean is the token's ratio: PPO with the clip interval
    # [e^−ε_low, e^ε_high], averaged over sequences
    rng = np.random.default_rng(2)
    lp = np.log(rng.uniform(0.05, 0.95, (6, 1)))
    old = lp - rng.normal(0, 0.4, (6, 1))
    adv = rng.normal(size=(6, 1))
    lo, hi = 0.2, 0.3
    ppo = ref_numpy.ppo_clip_loss(lp, old, adv, clip_low=1 - math.exp(-lo),
                                  clip_high=math.exp(hi) - 1)
    got = ref_numpy.gmpo_loss(lp, old, adv, clip_low=lo, clip_high=hi)
    np.testing.assert_allclose(got, ppo.mean(), rtol=1e-13)


def test_gmpo_empty_rows_count_in_the_mean_and_add_nothing():
    lp = np.array([[0.1, 0.2], [0.0, 0.0]])
    m = np.array([[True, True], [False, False]])
    adv = np.array([1.0, np.nan])
    got = ref_numpy.gmpo_loss(lp, np.zeros_like(lp), adv, m)
    np.testing.assert_allclose(got, -math.exp(0.15) / 2, rtol=1e-15)


# ------------------------------------------------------------------ KL-Cov
def test_kl_cov_matches_hand_computed_numbers():
    # Ā = 0, mean logp = −1.25: cov = [1·0.75, −1·−0.75] = [0.75, 0.75], a tie: the first
    # token (row-major) is penalised
    lp, old, adv = np.array([-0.5, -2.0]), np.array([-1.0, -1.5]), np.array([1.0, -1.0])
    want = [-math.exp(0.5) + 0.5, math.exp(-0.5)]
    for got in both("kl_cov_loss", lp, old, adv, ratio=0.1, coef=1.0):
        np.testing.assert_allclose(got, want, rtol=1e-15)
    for got in grads("kl_cov_loss", np.ones(2), lp, old, adv, ratio=0.1, coef=1.0):
        np.testing.assert_allclose(got, [-math.exp(0.5) + 1.0, math.exp(-0.5)], rtol=1e-15)
    cov = (adv - adv.mean()) * (lp - lp.mean())
    np.testing.assert_allclose(cov, [0.75, 0.75], rtol=1e-15)


def test_kl_cov_penalty_defaults_to_verls_ppo_kl_coef():
    # PolicyLossConfig.ppo_kl_coef = 0.1 (1.0 is only the code's fallback for None)
    lp, old, adv = np.array([-0.5, -2.0]), np.array([-1.0, -1.5]), np.array([1.0, -1.0])
    for got in both("kl_cov_loss", lp, old, adv, ratio=0.1):
        np.testing.assert_allclose(got, [-math.exp(0.5) + 0.05, math.exp(-0.5)], rtol=1e-15)


def test_kl_cov_without_its_penalty_is_the_unclipped_surrogate():
    rng = np.random.default_rng(3)
    lp, old = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    adv = rng.normal(size=(3, 4))
    got = ref_numpy.kl_cov_loss(lp, old, adv, ratio=0.5, coef=0.0)
    np.testing.assert_allclose(got, -adv * np.exp(lp - old), rtol=1e-15)


def test_kl_cov_penalises_the_largest_covariance_tokens():
    rng = np.random.default_rng(4)
    lp, old, adv = rng.normal(size=(4, 5)), rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    got = ref_numpy.kl_cov_loss(lp, old, adv, ratio=0.25, coef=1.0)
    penalised = ~np.isclose(got, -adv * np.exp(lp - old), rtol=0, atol=1e-12)
    cov = (adv - adv.mean()) * (lp - lp.mean())
    assert penalised.sum() == 5                                 # ⌊20 · 0.25⌋
    assert cov[penalised].min() > cov[~penalised].max()


# ------------------------------------------------------------------ VESPO
def test_vespo_matches_hand_computed_numbers():
    # w = 2, k = 2, λ = 3: φ = e^3·2²·e^−6 = 4e^−3; l = −φ·A·logp, ∂l/∂logp = −φ·A
    phi = 4 * math.exp(-3)
    lp, old, adv = np.array([-0.5]), np.array([-0.5 - math.log(2)]), np.array([1.0])
    for got in both("vespo_loss", lp, old, adv):
        np.testing.assert_allclose(got, [0.5 * phi], rtol=1e-14)
    for got in grads("vespo_loss", np.ones(1), lp, old, adv):
        np.testing.assert_allclose(got, [-phi], rtol=1e-14)


def test_vespo_on_policy_is_reinforce_and_its_weight_is_one():
    # w = 1 gives φ = e^λ·1·e^−λ = 1 for either sign: the REINFORCE loss −A·logp
    rng = np.random.default_rng(5)
    lp = np.log(rng.uniform(0.05, 0.95, (3, 6)))
    adv = rng.normal(size=(3, 6))
    np.testing.assert_allclose(ref_numpy.vespo_loss(lp, lp, adv),
                               ref_numpy.reinforce_loss(lp, lp, adv), rtol=1e-15)


def test_vespo_weight_is_the_sequences_and_follows_the_advantages_sign():
    # two tokens whose log-ratios sum to log 3: φ_pos = e^3·9·e^−9, φ_neg = e^2·27·e^−6
    lp = np.array([[-1.0, -1.0]])
    old = lp - np.array([[math.log(3) / 2, math.log(3) / 2]])
    adv = np.array([[1.0, -1.0]])
    g = ref_numpy.vespo_loss_vjp(np.ones((1, 2)), lp, old, adv)["logp"]
    np.testing.assert_allclose(g, [[-9 * math.exp(-6), 27 * math.exp(-4)]], rtol=1e-13)


def test_vespo_clamps_the_sequences_log_weight_at_20_by_default_as_trl_does():
    # Σ log-ratio = 25 > 20: log w = 20 (TRL's clamp). With λ tiny the weight is w^k itself, so
    # the bound shows: φ = exp(λ + k·20 − λ·e^20) with k = 1, λ = 1e-9
    lp = np.array([[-0.5, -0.5]])
    old = lp - 12.5
    adv = np.array([[1.0, 1.0]])
    kw = dict(k_pos=1.0, lambda_pos=1e-9)
    phi = math.exp(1e-9 + 20.0 - 1e-9 * math.exp(20.0))
    for got in both("vespo_loss", lp, old, adv, **kw):
        np.testing.assert_allclose(got, -phi * adv * lp, rtol=1e-12)
    assert not np.allclose(ref_numpy.vespo_loss(lp, old, adv, log_w_max=21.0, **kw),
                           -phi * adv * lp, rtol=1e-3)
