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
