"""Corners pinned by hand or by the torch twin, each one a mutant that survived the suite
(mutation testing, README "Reliability")."""
import inspect
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from crosscheck import registry


def test_batch_scale_with_ddof_1_by_hand():
    """r = [1, 2, 4, 7], groups of 2: centred [−0.5, 0.5, −1.5, 1.5]; the batch std with
    ddof = 1 is sqrt(21 / 3) = √7."""
    r = np.array([1.0, 2.0, 4.0, 7.0])
    got = ref_numpy.group_advantages(r, group_size=2, scale="batch", ddof=1, eps=0.0)
    assert got == pytest.approx(np.array([-0.5, 0.5, -1.5, 1.5]) / math.sqrt(7), abs=1e-15)
    twin = ref_torch.group_advantages(torch.tensor(r), group_size=2, scale="batch", ddof=1,
                                      eps=0.0)
    assert twin.numpy() == pytest.approx(got, abs=1e-15)


def test_leave_one_out_gradient_where_the_others_do_not_spread():
    """Row 3 of [1, 1, 1, 5]: its others are all 1, σ = 0, no scaling; its VJP must match
    autograd through the twin."""
    r = np.array([1.0, 1.0, 1.0, 5.0, 0.3, -0.2, 0.9, 2.0])
    g = np.random.default_rng(0).normal(size=8)
    kw = dict(group_size=4, scale="leave_one_out", baseline="leave_one_out")
    hand = ref_numpy.group_advantages_vjp(g, r, **kw)["rewards"]
    rt = torch.tensor(r, requires_grad=True)
    (ref_torch.group_advantages(rt, **kw) * torch.tensor(g)).sum().backward()
    assert hand == pytest.approx(rt.grad.numpy(), abs=1e-12)


def test_policy_objective_passes_kl_clamp_to_the_kl_term():
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


def test_a_single_sequence_keeps_its_shape():
    """Per-token losses given one sequence [T] return [T], like their [1, T] batch row."""
    rng = np.random.default_rng(2)
    T = 5
    lp, old, adv = (rng.normal(0, 0.1, T) - 1.0), rng.normal(0, 0.1, T) - 1.0, rng.normal(size=T)
    for fn in (ref_numpy.gspo_loss, ref_numpy.ppo_clip_loss, ref_numpy.cispo_loss):
        one = fn(lp, old, adv)
        assert one.shape == (T,)
        assert one == pytest.approx(fn(lp[None], old[None], adv[None])[0], abs=0)


@pytest.mark.parametrize("name", sorted(n for n, e in registry.build().items()
                                        if e.numpy_vjp is not None))
def test_each_vjp_shares_its_functions_defaults(name):
    fn = inspect.signature(getattr(ref_numpy, name)).parameters
    vjp = inspect.signature(getattr(ref_numpy, name + "_vjp")).parameters
    for p in fn:
        if p in vjp:
            assert vjp[p].default == fn[p].default, p


@pytest.mark.parametrize("twin", ["numpy", "torch"])
def test_a_nan_last_value_is_named(twin):
    r, v = np.ones((2, 3)), np.ones((2, 3))
    lv = np.array([0.0, np.nan])
    with pytest.raises(ValueError, match="last_value"):
        if twin == "numpy":
            ref_numpy.gae(r, v, gamma=0.9, lam=0.9, last_value=lv)
        else:
            ref_torch.gae(torch.tensor(r), torch.tensor(v), gamma=0.9, lam=0.9,
                          last_value=torch.tensor(lv))


def test_a_ratio_exactly_at_trls_cap_keeps_its_gradient():
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
