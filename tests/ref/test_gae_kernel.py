"""ref_torch.gae without a Python loop over T, and its blocked kernel (ref_torch.gae_blocked):
exact against the NumPy recursion (1e-12 relative in float64) on long rows, right-padded and
holed, with and without dones; each kernel path is taken when it should be."""
import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from ref_torch import gae_blocked


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.mark.parametrize("layout", ["right", "holed", "done_at_end", "interior_dones"])
def test_long_rows_match_the_recursion(layout):
    rng = np.random.default_rng(3)
    B, T = 5, 3001                                  # not a multiple of the 64-step block
    r, v, lv = rng.normal(size=(B, T)), rng.normal(size=(B, T)), rng.normal(size=B)
    L = np.array([T, 1, 0, 1700, 2999])
    m = np.arange(T)[None] < L[:, None]
    dones = None
    if layout == "holed":
        m &= rng.random((B, T)) < 0.7
    if layout == "done_at_end":
        dones = np.zeros((B, T), dtype=bool)
        dones[np.arange(B)[L > 0], L[L > 0] - 1] = True
    if layout == "interior_dones":
        dones = rng.random((B, T)) < 0.01
    r[~m] = np.nan
    for gamma, lam in ((0.99, 0.95), (1.0, 1.0), (0.9, 0.0)):
        ref = ref_numpy.gae(r, v, m, gamma=gamma, lam=lam, dones=dones, last_value=lv)
        got = ref_torch.gae(torch.tensor(r), torch.tensor(v), torch.tensor(m), gamma=gamma,
                            lam=lam, dones=None if dones is None else torch.tensor(dones),
                            last_value=torch.tensor(lv))
        for a, b in zip(got, ref):
            assert rel_err(a.numpy(), b) < 1e-12


def test_gradients_of_the_blocked_path_match_the_hand_vjp():
    rng = np.random.default_rng(4)
    B, T = 3, 200
    r, v = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    m = (np.arange(T)[None] < np.array([[200], [130], [7]])) & (rng.random((B, T)) < 0.8)
    g = (rng.normal(size=(B, T)), rng.normal(size=(B, T)))
    hand = ref_numpy.gae_vjp(g, r, v, m, gamma=0.99, lam=0.95)
    rt, vt = torch.tensor(r, requires_grad=True), torch.tensor(v, requires_grad=True)
    adv, ret = ref_torch.gae(rt, vt, torch.tensor(m), gamma=0.99, lam=0.95)
    ((adv * torch.tensor(g[0])).sum() + (ret * torch.tensor(g[1])).sum()).backward()
    assert rel_err(rt.grad.numpy(), hand["rewards"]) < 1e-12
    assert rel_err(vt.grad.numpy(), hand["values"]) < 1e-12


@pytest.mark.parametrize("T", [1, 2, 31, 32, 33, 40_000])
def test_lengths_around_the_block(T):
    """One step, the edges of a 32-step block, and a long row (three levels of the Toeplitz
    recursion; 1250 block heads in the scaled path's scan)."""
    rng = np.random.default_rng(T)
    B = 2
    r, v, lv = rng.normal(size=(B, T)), rng.normal(size=(B, T)), rng.normal(size=B)
    for m in (np.arange(T)[None] < np.array([[T], [max(T - 5, 0)]]),
              rng.random((B, T)) < 0.6):
        ref = ref_numpy.gae(r, v, m, gamma=0.99, lam=0.95, last_value=lv)
        got = ref_torch.gae(torch.tensor(r), torch.tensor(v), torch.tensor(m), gamma=0.99,
                            lam=0.95, last_value=torch.tensor(lv))
        for a, b in zip(got, ref):
            assert rel_err(a.numpy(), b) < 1e-12


PATHS = {"right-padded Toeplitz": ("right", 0.95), "scaled (holes)": ("holed", 0.95),
         "scaled at the smallest γλ": ("holed", None), "scan (holes, small γλ)": ("holed", 0.3)}


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.replace("γλ", "gamma-lambda"))
def test_each_path_is_taken_and_gives_the_recursions_values_and_gradients(path, monkeypatch):
    """Which path runs depends on the mask, on γλ (Q_MIN) and on autograd (the scaled path works
    in place, so holed inputs that require grad take the scan); each must be the one expected
    and match the recursion and the hand VJP, with NaN in the padding."""
    layout, lam = PATHS[path]
    gamma = 0.99
    if lam is None:
        lam = gae_blocked.Q_MIN / gamma
    taken = []
    for name in ("gae_right_padded", "gae_scaled"):
        f = getattr(gae_blocked, name)
        monkeypatch.setattr(gae_blocked, name,
                            lambda *a, f=f, name=name: taken.append(name) or f(*a))
    rng = np.random.default_rng(5)
    B, T = 4, 100
    r, v, lv = rng.normal(size=(B, T)), rng.normal(size=(B, T)), rng.normal(size=B)
    m = np.arange(T)[None] < np.array([[100], [64], [1], [0]])
    if layout == "holed":
        m &= rng.random((B, T)) < 0.7
        m[0, 1] = False
    r[~m], v[~m] = np.nan, np.inf
    ref = ref_numpy.gae(r, v, m, gamma=gamma, lam=lam, last_value=lv)
    plain = ref_torch.gae(torch.tensor(r), torch.tensor(v), torch.tensor(m), gamma=gamma,
                          lam=lam, last_value=torch.tensor(lv))
    expected = {"right-padded Toeplitz": ["gae_right_padded"],
                "scan (holes, small γλ)": []}.get(path, ["gae_scaled"])
    assert taken == expected
    assert rel_err(plain[0].numpy(), ref[0]) < 1e-12
    assert rel_err(plain[1].numpy(), ref[1]) < 1e-12

    taken.clear()
    g = (rng.normal(size=(B, T)), rng.normal(size=(B, T)))
    hand = ref_numpy.gae_vjp(g, r, v, m, gamma=gamma, lam=lam, last_value=lv)
    rt, vt = torch.tensor(r, requires_grad=True), torch.tensor(v, requires_grad=True)
    adv, ret = ref_torch.gae(rt, vt, torch.tensor(m), gamma=gamma, lam=lam,
                             last_value=torch.tensor(lv))
    ((adv * torch.tensor(g[0])).sum() + (ret * torch.tensor(g[1])).sum()).backward()
    assert taken == (["gae_right_padded"] if layout == "right" else [])
    assert rel_err(adv.detach().numpy(), ref[0]) < 1e-12
    assert rel_err(ret.detach().numpy(), ref[1]) < 1e-12
    assert rel_err(rt.grad.numpy(), hand["rewards"]) < 1e-12
    assert rel_err(vt.grad.numpy(), hand["values"]) < 1e-12
    if layout == "right":
        # the padding is zeroed by a bitwise and without autograd, by torch.where with it:
        # the same bits
        assert torch.equal(plain[0], adv.detach()) and torch.equal(plain[1], ret.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk", [1, 70, 200, 1 << 20])
def test_the_scaled_path_in_chunks_of_rows(chunk, dtype, monkeypatch):
    """The scaled path takes rows in chunks that share their work buffers: one row at a time,
    two rows (the last chunk shorter), and all at once give the recursion's values; the last
    block's padding (T = 45 is not a multiple of 32) is cleared in every chunk, whatever the
    buffers held before (NaN from the previous call's chunk is planted)."""
    monkeypatch.setattr(gae_blocked, "CHUNK", chunk)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    rng = np.random.default_rng(7)
    B, T = 5, 45
    r, v, lv = rng.normal(size=(B, T)), rng.normal(size=(B, T)), rng.normal(size=B)
    m = rng.random((B, T)) < 0.7
    m[1] = False
    r[~m], v[~m] = np.nan, -np.inf
    ref = ref_numpy.gae(r, v, m, gamma=0.99, lam=0.9, last_value=lv)
    got = ref_torch.gae(torch.tensor(r, dtype=dtype), torch.tensor(v, dtype=dtype),
                        torch.tensor(m), gamma=0.99, lam=0.9,
                        last_value=torch.tensor(lv, dtype=dtype))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(got, ref):
        assert a.dtype == dtype and a.shape == (B, T)
        assert rel_err(a.double().numpy(), b) < tol


def test_the_bitwise_select_equals_where_bit_for_bit():
    """−0.0, NaN payloads, infinities and subnormals kept where valid; +0.0 where masked."""
    for dtype in (torch.float32, torch.float64):
        tiny = torch.finfo(dtype).tiny / 4
        x = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf"), tiny, -1.5, 7.0],
                         dtype=dtype)
        for m in (torch.tensor([True] * 7), torch.tensor([False] * 7),
                  torch.tensor([True, False, True, False, True, False, True])):
            got = gae_blocked.select(x, m, gae_blocked.mask_bits(m, dtype))
            want = torch.where(m, x, torch.zeros((), dtype=dtype))
            bits = gae_blocked.BITS[dtype]
            assert torch.equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lam", [0.0, 1e-3, 0.5])
def test_small_decays_underflow_harmlessly(dtype, lam):
    """γλ^32 underflows for small λ; weights that small are below the result's resolution."""
    rng = np.random.default_rng(6)
    B, T = 3, 500
    r, v = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    m = rng.random((B, T)) < 0.8
    ref = ref_numpy.gae(r, v, m, gamma=0.99, lam=lam)
    got = ref_torch.gae(torch.tensor(r, dtype=dtype), torch.tensor(v, dtype=dtype),
                        torch.tensor(m), gamma=0.99, lam=lam)
    # float32: a handful of roundings per step, each ≤ 2^-24 of the largest term it touches
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(got, ref):
        assert np.isfinite(a.numpy()).all()
        assert rel_err(a.double().numpy(), b) < tol


@pytest.mark.parametrize("layout", ["right", "holed"])
@pytest.mark.parametrize("where", ["first", "middle", "last valid"])
@pytest.mark.parametrize("arg", ["rewards", "values"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_valid_input_is_named(layout, where, arg, bad):
    """The blocked path checks finiteness through one sum of δ (every valid input enters it with
    coefficient ±1); a NaN or ±inf anywhere valid, even at γ = 0, must still raise and name it."""
    B, T = 3, 50
    r, v = np.ones((B, T)), np.ones((B, T))
    m = np.arange(T)[None] < np.array([[50], [40], [7]])
    if layout == "holed":
        m[:, 1::3] = False
    t = {"first": 0, "middle": 3, "last valid": int(np.flatnonzero(m[1]).max())}[where]
    (r if arg == "rewards" else v)[1, t] = bad
    for gamma in (0.99, 0.0):
        with pytest.raises(ValueError, match=rf"{arg} is .* at valid position \(1, {t}\)"):
            ref_torch.gae(torch.tensor(r), torch.tensor(v), torch.tensor(m), gamma=gamma,
                          lam=0.95)


def test_an_overflowing_sum_is_not_mistaken_for_a_bad_input():
    """Σδ may overflow with finite inputs (float32: 3e38 + 3e38 = inf); the full scan then finds
    nothing and the call goes on."""
    r = torch.tensor([[3e38, 3e38]], dtype=torch.float32)
    adv, _ = ref_torch.gae(r, torch.zeros_like(r), gamma=0.0, lam=0.0)
    assert torch.equal(adv, r)
