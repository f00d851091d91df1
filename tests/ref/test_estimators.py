"""The exact KL-estimator table: values, and which divergence each estimator's gradient follows.

Expected gradients are the published results (Tang & Munos 2025, arXiv:2506.09477) and the
closed forms ∇KL(π‖ref) = π ⊙ (log π − log ref − KL), ∇KL(ref‖π) = π − ref, checked through
both twins; variances are derived by hand from the two-point distributions below.
"""
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch


P = np.array([0.5, 0.3, 0.15, 0.05])       # the seed's policy and reference


Q = np.array([0.4, 0.4, 0.15, 0.05])


def grad_both(z, zr, **kw):
    a = ref_numpy.kl_estimator_gradient(z, zr, **kw)
    t = {k: (None if v is None else torch.tensor(v)) for k, v in
         dict(sample_logits=kw.pop("sample_logits", None)).items()}
    b = ref_torch.kl_estimator_gradient(torch.tensor(z), torch.tensor(zr), **kw, **t)
    return a, {k: v.numpy() for k, v in b.items()}


@pytest.fixture(params=range(6))
def policies(request):
    rng = np.random.default_rng(100 + request.param)
    V = 3 + request.param
    return rng.normal(0, 1.2, V), rng.normal(0, 1.2, V)


@pytest.mark.parametrize("twin", ["numpy", "torch"])
def test_estimator_input_errors(twin):
    mod, conv = (ref_numpy, np.asarray) if twin == "numpy" else (ref_torch, torch.tensor)
    with pytest.raises(ValueError, match=r"logits has shape \(1,\); expected one categorical"):
        mod.kl_estimator_moments(conv([0.5]), conv([0.5]), kind="k1")
    with pytest.raises(ValueError, match=r"ref_logits has shape \(3,\) but logits has \(2,\)"):
        mod.kl_estimator_moments(conv([0.5, 0.1]), conv([0.5, 0.1, 0.0]), kind="k1")
    with pytest.raises(ValueError, match=r"use is 'penalty'; expected one of 'loss', 'reward'"):
        mod.kl_estimator_gradient(conv([0.5, 0.1]), conv([0.5, 0.2]), kind="k3", use="penalty")
    with pytest.raises(ValueError, match=r"is_weight is 'yes'"):
        mod.kl_estimator_gradient(conv([0.5, 0.1]), conv([0.5, 0.2]), kind="k3", is_weight="yes")
    with pytest.raises(ValueError, match=r"kind is 'k4'"):
        mod.kl_estimator_moments(conv([0.5, 0.1]), conv([0.5, 0.2]), kind="k4")
    with pytest.raises(ValueError, match=r"logits is nan at valid position \(1,\)"):
        mod.kl_estimator_moments(conv([0.5, math.nan]), conv([0.5, 0.2]), kind="k1")


class TestKlEstimatorMoments:
    """kl_estimator_moments: exact KLs and an estimator's mean, bias, variance."""

    def test_seed_moments(self):
        for kind, var in (("k1", 0.049086), ("k3", 0.000255)):
            m = ref_numpy.kl_estimator_moments(np.log(P), np.log(Q), kind=kind)
            assert abs(m["kl_forward"] - 0.025267) < 0.5e-6
            assert abs(m["bias"]) < 1e-15                # k1 and k3 are unbiased for KL(π‖ref)
            assert abs(m["var"] - var) < 0.5e-6
        k2 = ref_numpy.kl_estimator_moments(np.log(P), np.log(Q), kind="k2")
        assert k2["bias"] < 0                            # k2 is biased (here low)

    def test_k3_variance_is_not_always_lower_than_k1(self):
        # p = [.99, .01], ref = [.01, .99]: k1 = ±log 99, k3 = ref/p − 1 − log(ref/p)
        p, q = np.array([0.99, 0.01]), np.array([0.01, 0.99])
        u = np.log(q / p)
        var = {}
        for kind, k in (("k1", -u), ("k3", np.expm1(u) - u)):
            mean = (p * k).sum()
            var[kind] = (p * (k - mean) ** 2).sum()
            got = ref_numpy.kl_estimator_moments(np.log(p), np.log(q), kind=kind)
            assert got["var"] == pytest.approx(var[kind], rel=1e-12)
        assert var["k3"] > 90 * var["k1"]               # 79.8 vs 0.836


class TestKlEstimatorGradient:
    """kl_estimator_gradient: which divergence each estimator's gradient follows."""

    @pytest.mark.parametrize("kind, follows", [("k1", None), ("k2", "grad_kl_forward"),
                                               ("k3", "grad_kl_reverse")])
    def test_on_policy_loss_gradients(self, policies, kind, follows):
        # k1 as a loss: E_π[∇ log π] = 0; k2: ∇KL(π‖ref); k3: ∇KL(ref‖π)
        z, zr = policies
        for g in grad_both(z, zr, kind=kind):
            target = np.zeros_like(z) if follows is None else g[follows]
            np.testing.assert_allclose(g["expected"], target, atol=1e-14, strict=True)
            p, q = np.exp(z - np.logaddexp.reduce(z)), np.exp(zr - np.logaddexp.reduce(zr))
            kl = (p * np.log(p / q)).sum()
            np.testing.assert_allclose(g["grad_kl_forward"], p * (np.log(p / q) - kl), atol=1e-14,
                                       strict=True)
            np.testing.assert_allclose(g["grad_kl_reverse"], p - q, atol=1e-14, strict=True)

    def test_k1_as_a_detached_reward_follows_the_forward_kl(self, policies):
        z, zr = policies
        for g in grad_both(z, zr, kind="k1", use="reward"):
            np.testing.assert_allclose(g["expected"], g["grad_kl_forward"], atol=1e-14, strict=True)

    def test_k3_as_a_loss_is_not_the_forward_kl_gradient(self):
        # the seed's p, q: the k3 loss gradient is π − ref = [0.1, −0.1, 0, 0], not ∇KL(π‖ref)
        g, _ = grad_both(np.log(P), np.log(Q), kind="k3")
        np.testing.assert_allclose(g["expected"], P - Q, atol=1e-15, strict=True)
        assert np.abs(g["expected"] - g["grad_kl_forward"]).max() > 1e-3

    def test_off_policy_needs_the_importance_weight(self, policies):
        z, zr = policies
        zs = z[::-1].copy()                               # samples from another policy μ
        on = grad_both(z, zr, kind="k3")[0]["expected"]
        # no weight: E_μ[∇k3] is neither the on-policy gradient nor a KL gradient
        plain = grad_both(z, zr, kind="k3", sample_logits=zs)[0]
        assert np.abs(plain["expected"] - on).max() > 1e-3
        # a detached weight sg(π/μ) restores the on-policy expectation exactly
        for g in grad_both(z, zr, kind="k3", sample_logits=zs, is_weight="detached"):
            np.testing.assert_allclose(g["expected"], on, atol=1e-13, strict=True)
        # an attached weight differentiates E_π[k] itself: for unbiased k1/k3 that is ∇KL(π‖ref)
        for kind in ("k1", "k3"):
            for g in grad_both(z, zr, kind=kind, sample_logits=zs, is_weight="attached"):
                np.testing.assert_allclose(g["expected"], g["grad_kl_forward"], atol=1e-13,
                                           strict=True)

    def test_a_small_step_along_minus_expected_lowers_the_divergence_it_follows(self):
        z, zr = np.log(P), np.log(Q)
        for kind, key in (("k2", "kl_forward"), ("k3", "kl_reverse")):
            g = ref_numpy.kl_estimator_gradient(z, zr, kind=kind)["expected"]
            before = ref_numpy.kl_estimator_moments(z, zr, kind=kind)[key]
            after = ref_numpy.kl_estimator_moments(z - 0.1 * g, zr, kind=kind)[key]
            assert after < before


def test_a_moment_cotangent_without_some_keys_takes_them_as_zero():
    # written against the five keys before log_var: log_var's cotangent is 0
    z, zr = np.log(P), np.log(Q)
    five = {"kl_forward": 0.0, "kl_reverse": 1.0, "mean": 0.0, "bias": 0.0, "var": 0.0}
    got = ref_numpy.kl_estimator_moments_vjp(five, z, zr, kind="k3")["logits"]
    np.testing.assert_allclose(got, P - Q, rtol=0, atol=1e-15)      # ∇KL(ref‖π) = π − ref
    got = ref_numpy.kl_estimator_moments_vjp({"kl_reverse": 2.0}, z, zr, kind="k1")["logits"]
    np.testing.assert_allclose(got, 2 * (P - Q), rtol=0, atol=1e-15)


def test_an_unknown_moment_cotangent_key_is_refused_by_name():
    z = np.log(P)
    with pytest.raises(ValueError, match=r"g has unknown key\(s\) 'lg_var'; its keys are "
                                         r"kl_forward, kl_reverse, mean, bias, var, log_var"):
        ref_numpy.kl_estimator_moments_vjp({"kl_reverse": 1.0, "lg_var": 1.0}, z, z, kind="k1")
    with pytest.raises(TypeError, match="g is a list; expected a dict"):
        ref_numpy.kl_estimator_moments_vjp([1.0], z, z, kind="k1")
