"""The ratio levels of ppo_clip_loss and cispo_loss (ART's importance_sampling_level) and the
shaped advantage (Kimi's τ-shifted advantage, a KL folded in as a centred k1), against small
hand-computed fixtures and identities that tie them to other references."""
import math

import numpy as np
import pytest
import torch

import ref_numpy as rn
import ref_torch as rt

# one row of two tokens: ρ = (0.2, −0.4), so ρ̄ = −0.1
LOGP = np.array([[-1.0, -2.0]])
RHO = np.array([[0.2, -0.4]])
OLD = LOGP - RHO
ONES = np.ones((1, 2))
MASK = np.ones((1, 2), bool)
WIDE = dict(clip_low=0.9, clip_high=10.0)      # no clip binds on these ratios


def test_the_mixed_levels_give_the_ratio_of_their_definition():
    e = math.exp
    expected = {"token": [e(0.2), e(-0.4)],
                "sequence": [e(-0.1), e(-0.1)],
                "average": [(e(0.2) + e(-0.1)) / 2, (e(-0.4) + e(-0.1)) / 2],
                "geometric_average": [e(0.05), e(-0.25)]}
    for level, ratios in expected.items():
        loss = rn.ppo_clip_loss(LOGP, OLD, ONES, MASK, level=level, **WIDE)
        np.testing.assert_allclose(loss, -np.array([ratios]), rtol=1e-14, strict=True)


def test_the_sequence_level_is_gspos_sequence_form():
    rng = np.random.default_rng(3)
    logp = np.log(rng.uniform(0.05, 0.95, (5, 11)))
    old = logp - rng.normal(0, 0.3, (5, 11))
    adv = rng.normal(size=5)
    mask = rng.random((5, 11)) > 0.3
    kw = dict(clip_low=0.2, clip_high=0.28)
    np.testing.assert_allclose(
        rn.ppo_clip_loss(logp, old, adv, mask, level="sequence", **kw),
        rn.gspo_loss(logp, old, adv, mask, form="sequence", **kw), rtol=1e-14, strict=True)
    g = rng.normal(size=(5, 11))
    np.testing.assert_allclose(
        rn.ppo_clip_loss_vjp(g, logp, old, adv, mask, level="sequence", **kw)["logp"],
        rn.gspo_loss_vjp(g, logp, old, adv, mask, form="sequence", **kw)["logp"],
        rtol=1e-12, atol=1e-15, strict=True)


def test_a_sequence_ratio_spreads_each_tokens_gradient_over_its_row():
    # ρ = (0.1, −0.1): s = 1 inside the clip, each token's loss −s; d(−2s)/dlogp_j = −2·s/2
    logp = np.array([[-1.0, -1.0]])
    old = logp - np.array([[0.1, -0.1]])
    grad = rn.ppo_clip_loss_vjp(ONES, logp, old, ONES, MASK, level="sequence")["logp"]
    np.testing.assert_allclose(grad, [[-1.0, -1.0]], rtol=1e-14, strict=True)


def test_the_geometric_average_gradient_has_an_own_and_a_shared_half():
    # Σ_t −r̃_t with r̃_t = e^((ρ_t + ρ̄)/2): ∂/∂logp_j = −Σ_t r̃_t·([t = j] + 1/2)/2
    r0, r1 = math.exp(0.05), math.exp(-0.25)
    expected = [[-(1.5 * r0 + 0.5 * r1) / 2, -(0.5 * r0 + 1.5 * r1) / 2]]
    grad = rn.ppo_clip_loss_vjp(ONES, LOGP, OLD, ONES, MASK, level="geometric_average",
                                **WIDE)["logp"]
    np.testing.assert_allclose(grad, expected, rtol=1e-14, strict=True)


def test_a_clipped_token_of_a_mixed_level_passes_no_gradient_through_its_own_ratio():
    # average level, A > 0: token 0's mixed ratio (e^2 + e^0.5)/2 ≈ 4.52 is past 1 + ε: its
    # loss is the clipped constant; token 1's (e^-1 + e^0.5)/2 ≈ 1.01 is inside and carries
    # a/b = e^-1/2 and e^0.5/2 (ρ̄ = 0.5)
    logp = np.array([[-1.0, -1.0]])
    old = logp - np.array([[2.0, -1.0]])
    grad = rn.ppo_clip_loss_vjp(ONES, logp, old, ONES, MASK, level="average")["logp"]
    s = math.exp(0.5)
    np.testing.assert_allclose(grad, [[-(s / 2) / 2, -(math.exp(-1.0) / 2 + s / 2 / 2)]],
                               rtol=1e-14, strict=True)


def test_cispos_weight_at_a_level_is_clipped_and_detached():
    # ART's default: relative bounds, clip_low 1 (no lower bound), clip_high 4 (cap 5); the
    # sequence ratio e^2 ≈ 7.39 is capped at 5 and the gradient is −w·A at every token
    logp = np.array([[-1.0, -3.0]])
    old = logp - 2.0
    kw = dict(bound="relative", clip_low=1.0, clip_high=4.0, level="sequence")
    adv = np.array([[1.0, -2.0]])
    np.testing.assert_allclose(rn.cispo_loss(logp, old, adv, MASK, **kw),
                               [[5.0 * 1.0 * 1.0, -5.0 * 2.0 * 3.0]], rtol=1e-14, strict=True)
    np.testing.assert_allclose(rn.cispo_loss_vjp(ONES, logp, old, adv, MASK, **kw)["logp"],
                               [[-5.0, 10.0]], rtol=1e-14, strict=True)


def test_an_unknown_level_is_refused_by_name():
    for fn in (rn.ppo_clip_loss, rt.ppo_clip_loss, rn.cispo_loss, rt.cispo_loss):
        arrays = (LOGP, OLD, ONES, MASK) if fn.__module__.startswith("ref_numpy") else \
            tuple(torch.as_tensor(a) for a in (LOGP, OLD, ONES, MASK))
        with pytest.raises(ValueError, match="level"):
            fn(*arrays, level="tokens")


def test_the_shaped_advantage_worked_examples():
    np.testing.assert_allclose(rn.shaped_advantages(LOGP, OLD, ONES, MASK, tau=0.5),
                               [[0.9, 1.2]], rtol=1e-14, strict=True)
    ref = LOGP - np.array([[0.1, 0.3]])                        # k = (0.1, 0.3), k̄ = 0.2
    np.testing.assert_allclose(rn.shaped_advantages(LOGP, OLD, ONES, MASK, ref, kl_coef=1.0),
                               [[1.1, 0.9]], rtol=1e-14, strict=True)
    g = np.array([[1.0, 0.0]])
    np.testing.assert_allclose(
        rn.shaped_advantages_vjp(g, LOGP, OLD, ONES, MASK, ref, kl_coef=1.0)["logp"],
        [[-0.5, 0.5]], rtol=1e-14, strict=True)


def test_the_centred_kl_sums_to_zero_over_the_valid_tokens_and_ignores_padding():
    rng = np.random.default_rng(7)
    logp = np.log(rng.uniform(0.05, 0.95, (4, 9)))
    ref = np.log(rng.uniform(0.05, 0.95, (4, 9)))
    mask = rng.random((4, 9)) > 0.4
    zeros = np.zeros(4)
    shaping = rn.shaped_advantages(logp, logp, zeros, mask, ref, kl_coef=0.7)
    assert abs(shaping[mask].sum()) < 1e-12
    garbage = np.where(mask, ref, np.nan), np.where(mask, logp, np.inf)
    np.testing.assert_allclose(
        rn.shaped_advantages(garbage[1], garbage[1], zeros, mask, garbage[0], kl_coef=0.7),
        shaping, rtol=0, atol=0, strict=True)


def test_the_objective_takes_the_shaped_advantage_as_a_constant():
    rng = np.random.default_rng(11)
    logp = np.log(rng.uniform(0.05, 0.95, (3, 7)))
    old = logp - rng.normal(0, 0.3, (3, 7))
    ref = np.log(rng.uniform(0.05, 0.95, (3, 7)))
    adv = rng.normal(size=3)
    mask = rng.random((3, 7)) > 0.3
    mask[:, 0] = True
    shaped = rn.shaped_advantages(logp, old, adv, mask, ref, tau=0.3, kl_coef=0.5)
    kw = dict(loss="ppo", agg="token-mean", clip_low=0.2)
    value = rn.policy_objective(logp, old, adv, mask, ref, adv_tau=0.3, adv_kl=0.5, **kw)
    grad = rn.policy_objective_vjp(1.0, logp, old, adv, mask, ref, adv_tau=0.3, adv_kl=0.5,
                                   **kw)["logp"]
    assert value == pytest.approx(rn.policy_objective(logp, old, shaped, mask, **kw),
                                  rel=1e-14)
    np.testing.assert_allclose(grad, rn.policy_objective_vjp(1.0, logp, old, shaped, mask,
                                                             **kw)["logp"],
                               rtol=1e-14, atol=1e-16, strict=True)
    t = torch.tensor(logp, requires_grad=True)
    rt.policy_objective(t, torch.tensor(old), torch.tensor(adv), torch.tensor(mask),
                        torch.tensor(ref), adv_tau=0.3, adv_kl=0.5, **kw).backward()
    np.testing.assert_allclose(t.grad.numpy(), grad, rtol=1e-10, atol=1e-14, strict=True)


def test_kimis_tau_at_ratio_one_changes_nothing():
    # ρ = 0 everywhere: A − τ·ρ = A
    kw = dict(loss="cispo", agg="token-mean")
    assert rn.policy_objective(LOGP, LOGP, ONES, MASK, adv_tau=2.0, **kw) == \
        pytest.approx(rn.policy_objective(LOGP, LOGP, ONES, MASK, **kw), rel=1e-15)


def test_a_kl_folded_into_the_advantage_needs_ref_logp_and_says_so():
    with pytest.raises(ValueError, match="adv_kl"):
        rn.policy_objective(LOGP, OLD, ONES, MASK, adv_kl=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        rn.shaped_advantages(LOGP, OLD, ONES, MASK, kl_coef=0.1)
    with pytest.raises(ValueError, match="adv_tau"):
        rn.policy_objective(LOGP, OLD, ONES, MASK, adv_tau=-1.0)
