"""Property-based tests (hypothesis): random shapes (B = 1 and T = 1 included), any mask (empty
rows, holes), wide values (log-ratios to ±50, rewards to 1e6), every convention keyword.
Failures shrink to a minimal example.

Properties: the twins agree and are finite; anything at masked positions (NaN included) changes
no output and no gradient, and gradients there are exactly 0; VJPs are linear in the cotangent;
the adjoint identity ⟨u, J v⟩ = ⟨Jᵀu, v⟩ holds against a directional finite difference (smooth
functions); group advantages are invariant under shuffling rows with their ids; aggregation is
consistent under splitting the batch the way its mode allows.
"""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ref_numpy
import ref_torch
from crosscheck.bridge import tensor as to_torch

SETTINGS = {}                     # from the loaded profile (tests/conftest.py)


def floats(lo, hi):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def token_batch(draw, value_range=50.0):
    B = draw(st.integers(1, 5))
    T = draw(st.integers(1, 9))
    mask = draw(hnp.arrays(np.bool_, (B, T)))
    arr = lambda lo, hi: draw(hnp.arrays(np.float64, (B, T), elements=floats(lo, hi)))  # noqa
    return B, T, mask, arr


def twins(name, args, kwargs, atol=1e-9):
    out_np = getattr(ref_numpy, name)(*args, **kwargs)
    out_t = getattr(ref_torch, name)(*[to_torch(a) for a in args],
                                     **{k: to_torch(v) for k, v in kwargs.items()})
    outs_np = out_np if isinstance(out_np, tuple) else (out_np,)
    outs_t = out_t if isinstance(out_t, tuple) else (out_t,)
    for a, b in zip(outs_np, outs_t):
        a, b = np.asarray(a), b.detach().numpy()
        assert not np.isnan(a).any() and not np.isnan(b).any()
        same_inf = np.isinf(a) & (a == b)
        np.testing.assert_allclose(np.where(same_inf, 0, b), np.where(same_inf, 0, a),
                                   rtol=1e-9, atol=atol)
    return outs_np


def with_nan_padding(mask, *arrays):
    return [np.where(mask, a, np.nan) for a in arrays]


# ---------------------------------------------------------------- twins agree, padding inert
@settings(**SETTINGS)
@given(batch=token_batch(), clip_low=st.sampled_from([0.1, 0.2]),
       clip_high=st.sampled_from([None, 0.28]), clip_c=st.sampled_from([None, 3.0]),
       lrc=st.sampled_from([None, 20.0]), per_seq=st.booleans(), data=st.data())
def test_ppo_twins_agree_and_padding_is_inert(batch, clip_low, clip_high, clip_c, lrc, per_seq,
                                              data):
    B, T, mask, arr = batch
    logp = arr(-30, 0)
    old = logp - arr(-50, 50)
    adv = data.draw(hnp.arrays(np.float64, (B,), elements=floats(-1e3, 1e3))) if per_seq \
        else arr(-1e3, 1e3)
    kw = dict(clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, log_ratio_clamp=lrc)
    base = twins("ppo_clip_loss", (logp, old, adv, mask), kw)[0]
    lp_n, old_n = with_nan_padding(mask, logp, old)
    adv_n = adv if per_seq else with_nan_padding(mask, adv)[0]
    assert np.array_equal(ref_numpy.ppo_clip_loss(lp_n, old_n, adv_n, mask, **kw), base)
    g = np.ones((B, T))
    a = ref_numpy.ppo_clip_loss_vjp(g, logp, old, adv, mask, **kw)["logp"]
    b = ref_numpy.ppo_clip_loss_vjp(g, lp_n, old_n, adv_n, mask, **kw)["logp"]
    assert np.array_equal(a, b) and np.all(a[~mask] == 0) and not np.isnan(a).any()


@settings(**SETTINGS)
@given(batch=token_batch(), bound=st.sampled_from(["absolute", "relative"]),
       cap=st.sampled_from([2.0, 5.0, math.inf]))
def test_cispo_twins_agree(batch, bound, cap):
    B, T, mask, arr = batch
    logp = arr(-30, 0)
    kw = dict(clip_high=cap, bound=bound) if bound == "absolute" else \
        dict(clip_high=0.28, clip_low=0.2, bound=bound)
    twins("cispo_loss", (logp, logp - arr(-50, 50), arr(-1e3, 1e3), mask), kw)


@settings(**SETTINGS)
@given(batch=token_batch(), kind=st.sampled_from(["k1", "k2", "k3", "abs"]),
       clamp=st.sampled_from([None, (20.0, 10.0), (None, 10.0)]))
def test_kl_twins_agree_and_padding_is_inert(batch, kind, clamp):
    B, T, mask, arr = batch
    logp, ref = arr(-40, 0), arr(-40, 0)
    base = twins("kl_penalty", (logp, ref, mask), dict(kind=kind, clamp=clamp))[0]
    lp_n, ref_n = with_nan_padding(mask, logp, ref)
    assert np.array_equal(ref_numpy.kl_penalty(lp_n, ref_n, mask, kind=kind, clamp=clamp), base)


@settings(**SETTINGS)
@given(batch=token_batch(), gamma=floats(0, 1), lam=floats(0, 1), with_dones=st.booleans(),
       data=st.data())
def test_gae_twins_agree_and_padding_is_inert(batch, gamma, lam, with_dones, data):
    B, T, mask, arr = batch
    r, v = arr(-1e6, 1e6), arr(-1e3, 1e3)
    dones = data.draw(hnp.arrays(np.bool_, (B, T))) if with_dones else None
    lv = data.draw(hnp.arrays(np.float64, (B,), elements=floats(-10, 10)))
    kw = dict(gamma=gamma, lam=lam, dones=dones, last_value=lv)
    base = twins("gae", (r, v, mask), kw)
    r_n, v_n = with_nan_padding(mask, r, v)
    for a, b in zip(ref_numpy.gae(r_n, v_n, mask, **kw), base):
        assert np.array_equal(a, b)


@settings(**SETTINGS)
@given(batch=token_batch(), mode=st.sampled_from(["token-mean", "seq-mean-token-mean",
                                                  "seq-mean-token-sum",
                                                  "seq-mean-token-sum-norm"]),
       empty_rows=st.sampled_from(["exclude", "include"]))
def test_aggregate_twins_agree(batch, mode, empty_rows):
    B, T, mask, arr = batch
    twins("aggregate", (arr(-1e6, 1e6), mask), dict(mode=mode, empty_rows=empty_rows))


@settings(**SETTINGS)
@given(batch=token_batch(), ddof=st.sampled_from([0, 1]),
       eps_mode=st.sampled_from(["var", "clamp", "std"]), shift=st.booleans())
def test_whiten_twins_agree(batch, ddof, eps_mode, shift):
    B, T, mask, arr = batch
    mask = mask.copy()
    mask.flat[:2] = True
    if mask.sum() - ddof < 1:
        return
    x = arr(-1e3, 1e3)
    # the mean is rounded by ~u·max|x| in either twin; whitening divides that by the scale,
    # at least sqrt(eps) (e.g. constant x = 1e3: 1e-13/1e-4 ≈ 1e-9 between the twins)
    atol = 64 * np.finfo(np.float64).eps * (np.abs(x).max() + 1) / math.sqrt(1e-8)
    twins("whiten", (x, mask), dict(ddof=ddof, eps=1e-8, eps_mode=eps_mode,
                                    shift_mean=shift), atol=atol)


# ---------------------------------------------------------------- VJP linearity and adjoint
@settings(**SETTINGS)
@given(batch=token_batch(), data=st.data())
def test_vjps_are_linear_in_the_cotangent(batch, data):
    B, T, mask, arr = batch
    logp, old, adv = arr(-5, 0), arr(-5, 0), arr(-3, 3)
    g = arr(-2, 2)
    for name, args in (("ppo_clip_loss", (logp, old, adv, mask)),
                       ("kl_penalty", (logp, old, mask)),
                       ("whiten", (adv, np.ones_like(mask)))):
        vjp = getattr(ref_numpy, name + "_vjp")
        key = "x" if name == "whiten" else "logp"
        assert np.all(vjp(np.zeros((B, T)), *args)[key] == 0)
        np.testing.assert_allclose(vjp(2 * g, *args)[key], 2 * vjp(g, *args)[key], rtol=1e-12,
                                   atol=1e-300)


@settings(**SETTINGS)
@given(batch=token_batch(), gamma=floats(0, 1), lam=floats(0, 1), data=st.data())
def test_gae_adjoint_identity(batch, gamma, lam, data):
    """GAE is linear in rewards: ⟨u, A(r + v) − A(r)⟩ = ⟨Aᵀu, v⟩ exactly, up to rounding."""
    B, T, mask, arr = batch
    r, vals, u, d = arr(-10, 10), arr(-10, 10), arr(-1, 1), arr(-1, 1)
    kw = dict(gamma=gamma, lam=lam)
    lhs = (u * (ref_numpy.gae(r + d, vals, mask, **kw)[0] - ref_numpy.gae(r, vals, mask, **kw)[0])).sum()
    rhs = (ref_numpy.gae_vjp((u, np.zeros((B, T))), r, vals, mask, **kw)["rewards"] * d).sum()
    assert abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs))


@settings(**SETTINGS)
@given(batch=token_batch(), kind=st.sampled_from(["k1", "k2", "k3"]))
def test_kl_adjoint_identity_against_a_directional_difference(batch, kind):
    B, T, mask, arr = batch
    logp, ref, u, d = arr(-3, 0), arr(-3, 0), arr(-1, 1), arr(-1, 1)
    h = 1e-5
    f = lambda x: (u * ref_numpy.kl_penalty(x, ref, mask, kind=kind)).sum()  # noqa: E731
    fd = (f(logp + h * d) - f(logp - h * d)) / (2 * h)
    hand = (ref_numpy.kl_penalty_vjp(u, logp, ref, mask, kind=kind)["logp"] * d).sum()
    assert abs(fd - hand) <= 1e-6 * (1 + abs(hand))


# ---------------------------------------------------------------- invariances
@settings(**SETTINGS)
@given(n_groups=st.integers(1, 4), size=st.integers(1, 5), data=st.data(),
       scale=st.sampled_from(["group", "batch", "none", "leave_one_out"]),
       ddof=st.sampled_from([0, 1]))
def test_group_advantages_are_invariant_under_shuffling_rows_with_their_ids(
        n_groups, size, data, scale, ddof):
    B = n_groups * size
    rewards = data.draw(hnp.arrays(np.float64, (B,), elements=floats(-1e6, 1e6)))
    ids = np.repeat(np.arange(n_groups), size) * 7 + 3
    perm = data.draw(st.permutations(list(range(B))))
    baseline = "leave_one_out" if scale == "leave_one_out" else "mean"
    kw = dict(ddof=ddof, eps=1e-4, scale=scale, baseline=baseline)
    a = twins("group_advantages", (rewards,), dict(group_ids=ids, **kw))[0]
    b = ref_numpy.group_advantages(rewards[perm], group_ids=ids[perm], **kw)
    np.testing.assert_allclose(b, a[perm], rtol=1e-10, atol=1e-10)


@settings(**SETTINGS)
@given(batch=token_batch(), split=st.integers(1, 4))
def test_aggregation_splits_the_way_its_mode_allows(batch, split):
    B, T, mask, arr = batch
    if split >= B:
        return
    loss = arr(-100, 100)
    parts = [(loss[:split], mask[:split]), (loss[split:], mask[split:])]
    agg = ref_numpy.aggregate
    # a constant normaliser: the sum of the parts
    whole = agg(loss, mask, mode="seq-mean-token-sum-norm")
    assert math.isclose(whole, sum(agg(l, m, mode="seq-mean-token-sum-norm") for l, m in parts),
                        rel_tol=1e-12, abs_tol=1e-9)
    # a mean over all rows: the parts weighted by their row counts
    whole = agg(loss, mask, mode="seq-mean-token-mean", empty_rows="include")
    mixed = sum(agg(l, m, mode="seq-mean-token-mean", empty_rows="include") * len(l)
                for l, m in parts) / B
    assert math.isclose(whole, mixed, rel_tol=1e-12, abs_tol=1e-9)
    # a token mean: the parts weighted by their token counts
    if mask.sum():
        whole = agg(loss, mask, mode="token-mean")
        mixed = sum(agg(l, m, mode="token-mean") * m.sum() for l, m in parts) / mask.sum()
        assert math.isclose(whole, mixed, rel_tol=1e-12, abs_tol=1e-9)


def test_whiten_of_a_constant_batch_agrees_to_rounding():
    # found by hypothesis: constant x = 1e3 whitens to ~1e-9 in one twin and 0 in the other;
    # both are 0 to the rounding of the mean, amplified by 1/sqrt(eps)
    x = np.full((4, 5), 1000.0)
    twins("whiten", (x, np.ones((4, 5), dtype=bool)), dict(eps=1e-8),
          atol=64 * np.finfo(np.float64).eps * 1001 / 1e-4)
