"""Rollout-correction importance weights (TIS / MIS, token and sequence) and the REINFORCE loss
that applies them: worked numbers computed by hand, identities with plain importance sampling
and with PPO, and the stop-gradient the detach stage must prove."""
import dataclasses
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from crosscheck.check import registry, stages

L3, LH = math.log(3.0), math.log(0.5)


def both(name, *arrays, **kw):
    """ref_numpy's value and ref_torch's (as NumPy) for the same inputs."""
    a = getattr(ref_numpy, name)(*arrays, **kw)
    b = getattr(ref_torch, name)(*(None if x is None else torch.tensor(x) for x in arrays), **kw)
    return np.asarray(a), b.detach().numpy()


# ------------------------------------------------------------------ the weights
@pytest.mark.parametrize("kw, want", [
    # by hand: ratios [3, 0.5]; truncation at 2; masking outside [−∞, 2]; the sequence's
    # product 1.5 for every token
    (dict(), [[2.0, 0.5]]),
    (dict(mode="mask"), [[0.0, 0.5]]),
    (dict(level="sequence"), [[1.5, 1.5]]),
    (dict(level="sequence", mode="mask", lower=0.5), [[1.5, 1.5]]),
    (dict(level="sequence", mode="mask", lower=2.0, upper=5.0), [[0.0, 0.0]]),
    # OpenRLHF: a sequence judged by its geometric mean √1.5, each kept token its own ratio
    (dict(level="sequence", seq_stat="mean", mode="mask", kept="token", lower=0.5, upper=5.0),
     [[3.0, 0.5]]),
    (dict(lower=0.8, upper=1.25), [[1.25, 0.8]]),
])
def test_weights_match_hand_computed_numbers_in_both_twins(kw, want):
    x = np.array([[L3, LH]])
    for got in both("rollout_is_weights", x, np.zeros_like(x), None, **kw):
        np.testing.assert_allclose(got, want, rtol=1e-15)


def test_truncation_with_no_cap_is_plain_importance_sampling():
    rng = np.random.default_rng(0)
    lp, ro = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    m = rng.random((4, 6)) < 0.8
    plain = np.where(m, np.exp(lp - ro), 0.0)
    for kw in (dict(upper=math.inf), dict(upper=None), dict(mode="mask", upper=None)):
        np.testing.assert_allclose(ref_numpy.rollout_is_weights(lp, ro, m, **kw), plain,
                                   rtol=1e-14)
    seq = np.exp(np.where(m, lp - ro, 0.0).sum(axis=1, keepdims=True)) * m
    np.testing.assert_allclose(ref_numpy.rollout_is_weights(lp, ro, m, level="sequence",
                                                            upper=None), seq, rtol=1e-13)


def test_padding_never_reaches_a_weight():
    lp = np.array([[-1.0, np.nan, np.inf]])
    ro = np.array([[-1.5, -np.inf, 1e4]])
    m = np.array([[True, False, False]])
    for kw in (dict(), dict(level="sequence"), dict(level="sequence", seq_stat="mean")):
        for got in both("rollout_is_weights", lp, ro, m, **kw):
            np.testing.assert_allclose(got, [[math.exp(0.5), 0.0, 0.0]], rtol=1e-15)


def test_the_log_ratio_clamp_caps_the_exponent():
    x = np.array([[800.0, -800.0]])
    got = ref_numpy.rollout_is_weights(x, np.zeros_like(x), upper=None, log_ratio_clamp=20.0)
    np.testing.assert_allclose(got, [[math.exp(20.0), math.exp(-20.0)]], rtol=1e-15)


@pytest.mark.parametrize("kw, words", [
    (dict(lower=3.0, upper=2.0), "lower is 3.0 but upper is 2.0"),
    (dict(level="seq"), "level is 'seq'"),
    (dict(mode="clip"), "mode is 'clip'"),
    (dict(upper=-1.0), "upper"),
])
def test_bad_conventions_are_refused_by_name(kw, words):
    x = np.zeros((1, 2))
    with pytest.raises(ValueError, match=words):
        ref_numpy.rollout_is_weights(x, x, **kw)
    with pytest.raises(ValueError, match=words):
        ref_torch.rollout_is_weights(torch.tensor(x), torch.tensor(x), **kw)


# ------------------------------------------------------------------ REINFORCE and DRO
def test_reinforce_and_dro_match_hand_computed_numbers():
    # l = −A·logp + ½β(logp − old)² = 1 + 0.02; ∂l/∂logp = −2 + 0.2
    args = (np.array([-0.5]), np.array([-0.7]), np.array([2.0]))
    for got in both("reinforce_loss", *args, beta=1.0):
        np.testing.assert_allclose(got, [1.02], rtol=1e-15)
    g = ref_numpy.reinforce_loss_vjp(np.ones(1), *args, beta=1.0)["logp"]
    np.testing.assert_allclose(g, [-1.8], rtol=1e-15)


def test_reinforce_by_default_is_plain_reinforce_without_dros_term():
    # beta defaults to 0 and is_level to None: l = −A·logp off-policy too (logp ≠ old)
    args = (np.array([-0.5]), np.array([-0.7]), np.array([2.0]))
    for got in both("reinforce_loss", *args):
        np.testing.assert_allclose(got, [1.0], rtol=1e-15)
    np.testing.assert_allclose(ref_numpy.reinforce_loss_vjp(np.ones(1), *args)["logp"], [-2.0],
                               rtol=1e-15)


def test_on_policy_reinforce_has_ppos_gradient():
    # at logp = old the PPO surrogate −A·r and −A·logp have the same gradient, −A
    rng = np.random.default_rng(1)
    lp, adv = np.log(rng.uniform(0.1, 0.9, (3, 5))), rng.normal(size=(3, 5))
    g = rng.normal(size=(3, 5))
    np.testing.assert_allclose(ref_numpy.reinforce_loss_vjp(g, lp, lp, adv)["logp"],
                               ref_numpy.ppo_clip_loss_vjp(g, lp, lp, adv)["logp"], rtol=1e-15)


def test_in_loss_weights_scale_the_gradient_and_are_not_differentiated():
    rng = np.random.default_rng(2)
    lp, old = np.log(rng.uniform(0.1, 0.9, (2, 4))), np.log(rng.uniform(0.1, 0.9, (2, 4)))
    adv = rng.normal(size=(2, 4))
    w = ref_numpy.rollout_is_weights(lp, old, level="token", upper=2.0, log_ratio_clamp=20.0)
    grad = ref_numpy.reinforce_loss_vjp(np.ones((2, 4)), lp, old, adv, is_level="token")["logp"]
    np.testing.assert_allclose(grad, -adv * w, rtol=1e-15)          # −A·sg(w)
    t = torch.tensor(lp, requires_grad=True)
    ref_torch.reinforce_loss(t, torch.tensor(old), torch.tensor(adv), is_level="token").sum() \
        .backward()
    np.testing.assert_allclose(t.grad.numpy(), -adv * w, rtol=1e-14)


def test_a_twin_that_differentiates_the_weights_fails_the_detach_stage():
    entry = registry.build()["reinforce_loss"]

    def undetached(logp, old_logp, advantages, mask=None, *, beta=0.0, is_level=None,
                   is_mode="truncate", is_lower=None, is_upper=2.0, is_log_ratio_clamp=20.0):
        loss = ref_torch.reinforce_loss(logp, old_logp, advantages, mask, beta=beta)
        if is_level is None:
            return loss
        lr = torch.clamp(logp - old_logp, -is_log_ratio_clamp, is_log_ratio_clamp)
        w = torch.exp(lr) if is_level == "token" else \
            torch.exp(torch.where(mask.bool(), lr, 0.0).sum(-1, keepdim=True)).expand(lr.shape)
        w = torch.clamp(w, max=is_upper) if is_mode == "truncate" else w
        return torch.where(mask.bool(), w * loss, 0.0)           # w keeps its gradient: wrong
    bad = dataclasses.replace(entry, torch_fn=undetached)
    good = stages.run({"reinforce_loss": entry}, seed=0, n_cases=12, stages=("detach",))
    caught = stages.run({"reinforce_loss": bad}, seed=0, n_cases=12, stages=("detach",))
    assert good[0].passed
    assert not caught[0].passed


def test_dro_and_in_loss_weights_together_are_refused():
    x = np.zeros((1, 2))
    with pytest.raises(ValueError, match="beta is 0.5 but is_level is 'token'"):
        ref_numpy.reinforce_loss(x, x, x, beta=0.5, is_level="token")


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_masked_weight_exactly_at_either_bound_is_kept(level):
    # IcePop keeps lower ≤ w ≤ upper: w = 0.5 and w = 2 are both kept
    lp = np.log(np.array([[0.5], [2.0]]))
    for ref in (ref_numpy, ref_torch):
        a = (lp, np.zeros_like(lp)) if ref is ref_numpy else (torch.tensor(lp),
                                                               torch.zeros((2, 1)).double())
        got = np.asarray(ref.rollout_is_weights(*a, level=level, mode="mask", lower=0.5,
                                                upper=2.0))
        np.testing.assert_allclose(got, [[0.5], [2.0]], rtol=1e-15)


# ------------------------------------------------------------------ decoupled PPO
# logp − prox = 0.1 (u = e^0.1, inside PPO's clip 0.8..1.2) and 0.5 (u = e^0.5 = 1.6487,
# clipped for A > 0); prox − behave = log 2 and log 0.5 (behaviour weights 2 and 0.5)
_LP, _PROX = np.array([[0.1, 0.5]]), np.array([[0.0, 0.0]])
_BEH, _A = np.array([[-math.log(2.0), math.log(2.0)]]), np.array([1.0])
_U = math.exp(0.1)


@pytest.mark.parametrize("kw, want", [
    # plain weights: [2·(−u), 0.5·(−1.2)] (the second token's clip binds at 1.2)
    (dict(), [[-2 * _U, -0.6]]),
    # AReaL's token mask at 1.5: the weight 2 is rejected, 0.5 kept
    (dict(is_mode="mask", is_upper=1.5), [[0.0, -0.6]]),
    # truncation at 1.5: weights [1.5, 0.5]
    (dict(is_upper=1.5), [[-1.5 * _U, -0.6]]),
    # sequence level, geometric mean of [2, 0.5] = 1 for both tokens: plain PPO around prox
    (dict(is_level="sequence"), [[-_U, -1.2]]),
    # no behaviour weight at all
    (dict(is_level=None), [[-_U, -1.2]]),
])
def test_decoupled_ppo_matches_hand_computed_numbers_in_both_twins(kw, want):
    for v in both("decoupled_ppo_loss", _LP, _PROX, _BEH, _A, **kw):
        np.testing.assert_allclose(v, want, rtol=1e-14, atol=0)


def test_decoupled_ppo_gradient_is_the_weight_times_ppos():
    # ∂l/∂logp = w·(−A·u) where the clip does not bind, 0 where it does: [−2u, 0]
    hand = ref_numpy.decoupled_ppo_loss_vjp(np.ones((1, 2)), _LP, _PROX, _BEH, _A)["logp"]
    lp = torch.tensor(_LP, requires_grad=True)
    ref_torch.decoupled_ppo_loss(lp, *(torch.tensor(x) for x in (_PROX, _BEH, _A))).sum().backward()
    for g in (hand, lp.grad.numpy()):
        np.testing.assert_allclose(g, [[-2 * _U, 0.0]], rtol=1e-14, atol=0)


def test_decoupled_ppo_without_staleness_is_ppo(rng):
    lp, old = rng.normal(-1, 0.3, (3, 4)), rng.normal(-1, 0.3, (3, 4))
    adv = rng.normal(size=3)
    np.testing.assert_array_equal(
        ref_numpy.decoupled_ppo_loss(lp, old, old, adv, clip_c=3.0),
        ref_numpy.ppo_clip_loss(lp, old, adv, clip_c=3.0))


def test_decoupled_ppo_names_its_behaviour_log_probs():
    for fn, conv in ((ref_numpy.decoupled_ppo_loss, np.asarray),
                     (ref_torch.decoupled_ppo_loss, torch.tensor)):
        with pytest.raises(ValueError, match=r"behave_logp has shape \(1, 1\) but logp has"):
            fn(conv(_LP), conv(_PROX), conv(_BEH[:, :1]), conv(_A))
        with pytest.raises(ValueError, match="prox_logp"):
            fn(conv(_LP), conv(np.array([[np.nan, 0.0]])), conv(_BEH), conv(_A))
        with pytest.raises(ValueError, match="is_mode is 'reject'"):
            fn(conv(_LP), conv(_PROX), conv(_BEH), conv(_A), is_mode="reject")


# ------------------------------------------------------------------ off-policy sequence masking
# one row, logp = [−1, −2], old_logp = [−0.9, −1.9]: its drift D = mean(old − logp) = 0.1
_OLP, _OOLD = np.array([[-1.0, -2.0]]), np.array([[-0.9, -1.9]])


@pytest.mark.parametrize("adv, delta, want", [
    ([-1.0], 0.05, [[0.0, 0.0]]),      # A < 0 and D > δ: the sequence's tokens are dropped
    ([-1.0], 0.2, [[1.0, 1.0]]),       # D under δ: kept
    ([1.0], 0.05, [[1.0, 1.0]]),       # a positive advantage is always kept
    ([-1.0], 0.1 + 1e-9, [[1.0, 1.0]]),
])
def test_opsm_matches_hand_computed_masks_in_both_twins(adv, delta, want):
    for v in both("opsm_mask", _OLP, _OOLD, np.array(adv), delta=delta):
        np.testing.assert_array_equal(v, want)


def test_opsm_judges_per_token_advantages_and_reads_no_padding():
    # row 0: D = (0.1 + 0.1)/2 over its two valid tokens (the NaN padding never read);
    # per-token advantages: only the negative one is dropped
    lp = np.array([[-1.0, -2.0, np.nan]])
    old = np.array([[-0.9, -1.9, 5.0]])
    adv = np.array([[-1.0, 2.0, -3.0]])
    m = np.array([[True, True, False]])
    for v in both("opsm_mask", lp, old, adv, m, delta=0.05):
        np.testing.assert_array_equal(v, [[0.0, 1.0, 0.0]])


# ------------------------------------------------------------------ M2PO's second-moment mask
@pytest.mark.parametrize("rho, tau, want", [
    # M2 = [0.25, 0.01, 0.01, 0]: mean 0.0675 ≥ 0.04; without the 0.25, 0.02/3 < 0.04
    ([0.5, 0.1, -0.1, 0.0], 0.04, [0.0, 1.0, 1.0, 1.0]),
    # τ = 0.005: 0.02/3 = 0.00667 ≥ τ, then 0.01/2 = 0.005 is not < τ, then 0/1 < τ: three go
    ([0.5, 0.1, -0.1, 0.0], 0.005, [0.0, 0.0, 0.0, 1.0]),
    # τ above the mean of all: nothing dropped
    ([0.5, 0.1, -0.1, 0.0], 0.1, [1.0, 1.0, 1.0, 1.0]),
    # τ no suffix reaches (every M2 ≥ τ): all but the smallest dropped
    ([0.5, 0.3, -0.4, 0.2], 0.01, [0.0, 0.0, 0.0, 1.0]),
])
def test_m2po_matches_hand_computed_masks_in_both_twins(rho, tau, want):
    old = np.zeros((1, 4))
    for v in both("m2po_mask", np.array([rho]), old, threshold=tau):
        np.testing.assert_array_equal(v, [want])


def test_m2po_pools_the_batch_and_reads_no_padding():
    # two rows, padding holding NaN: the valid log-ratios [0.5, 0 | 0.1] pool to
    # M2 [0.25, 0, 0.01], mean 0.0867 ≥ 0.04; without 0.25: 0.005 < 0.04
    lp = np.array([[0.5, 0.0], [0.1, np.nan]])
    m = np.array([[True, True], [True, False]])
    for v in both("m2po_mask", lp, np.zeros((2, 2)), m, threshold=0.04):
        np.testing.assert_array_equal(v, [[0.0, 1.0], [1.0, 0.0]])


# ------------------------------------------------------------------ the TV sequence filter
_TV_LP = np.array([[math.log(3.0), math.log(0.5)]])     # ρ = [3, 0.5]: D = (2 + 0.5)/2 = 1.25
_TV_OLD = np.zeros((1, 2))


@pytest.mark.parametrize("adv, bounds, want", [
    ([1.0], dict(upper=1.1), [[0.0, 1.0]]),     # out; sign(log ρ)·A = [+1, −1]: drop the first
    ([-1.0], dict(upper=1.1), [[1.0, 0.0]]),    # out; A < 0 widens where ρ < 1: drop the second
    ([1.0], dict(upper=2.0), [[1.0, 1.0]]),     # D = 1.25 ≤ 2: in, nothing dropped
    ([1.0], dict(lower=1.5), [[0.0, 1.0]]),     # D < lower: out as well
    ([1.0], dict(lower=1.0, upper=2.0), [[1.0, 1.0]]),
    ([1.0], dict(), [[1.0, 1.0]]),              # no bound: the filter is off
])
def test_tv_filter_matches_hand_computed_masks_in_both_twins(adv, bounds, want):
    for v in both("tv_filter_mask", _TV_LP, _TV_OLD, np.array(adv), **bounds):
        np.testing.assert_array_equal(v, want)


def test_tv_filter_averages_over_valid_tokens_and_reads_no_padding():
    # row 0: ρ = [2, 1] over its two valid tokens, D = 0.5 (the NaN padding never read); the
    # same tokens with a third valid one at ρ = 1 would give D = 1/3 < 0.4 and keep them
    lp = np.array([[math.log(2.0), 0.0, np.nan]])
    old = np.array([[0.0, 0.0, 7.0]])
    m = np.array([[True, True, False]])
    for v in both("tv_filter_mask", lp, old, np.array([1.0]), m, upper=0.4):
        np.testing.assert_array_equal(v, [[0.0, 1.0, 0.0]])     # ρ = 1: sign 0, never dropped
    lp3 = np.array([[math.log(2.0), 0.0, 0.0]])
    for v in both("tv_filter_mask", lp3, np.zeros((1, 3)), np.array([1.0]), upper=0.4):
        np.testing.assert_array_equal(v, [[1.0, 1.0, 1.0]])


def test_tv_filter_clamps_the_log_ratio_before_the_drift():
    # log ρ = 12: D = e^12 − 1 unclamped, e^10 − 1 with the ±10 clamp; an upper bound between
    # the two tells them apart (A > 0 and log ρ > 0: the token widens the gap)
    lp = np.array([[12.0]])
    bound = math.exp(11.0)
    for v in both("tv_filter_mask", lp, np.zeros((1, 1)), np.array([1.0]), upper=bound):
        np.testing.assert_array_equal(v, [[0.0]])
    for v in both("tv_filter_mask", lp, np.zeros((1, 1)), np.array([1.0]), upper=bound,
                  log_ratio_clamp=10.0):
        np.testing.assert_array_equal(v, [[1.0]])


@pytest.mark.parametrize("fn", [ref_numpy.tv_filter_mask, ref_torch.tv_filter_mask])
def test_tv_filter_refuses_crossed_or_negative_bounds(fn):
    lp = np.zeros((1, 2)) if fn is ref_numpy.tv_filter_mask else torch.zeros(1, 2,
                                                                              dtype=torch.float64)
    adv = lp[:, 0]
    with pytest.raises(ValueError, match="lower is 2.0 but upper is 1.0"):
        fn(lp, lp, adv, lower=2.0, upper=1.0)
    with pytest.raises(ValueError, match="upper is -1.0"):
        fn(lp, lp, adv, upper=-1.0)
