"""Low precision: the torch twins in float32, bfloat16 and float16 against the float64 NumPy
reference, with per-function error bounds *derived* from the formulas (not tuned).

Method: inputs are first rounded to the low dtype, and the reference runs in float64 on those
same rounded values, so the comparison measures arithmetic error only, not input rounding. With
u the unit roundoff (2^-24 float32, 2^-8 bfloat16, 2^-11 float16), a formula of k rounded
operations without cancellation errs by at most k·u relative (first order); where terms cancel,
the bound is absolute, k·u·Σ|terms|. Each bound below is that first-order count times a safety
factor SAFETY = 4, which covers second-order terms and library functions (exp, expm1) that are
accurate to a few ulps rather than half an ulp; every bound also allows SAFETY·tiny, tiny the
smallest normal number of the dtype, since below it (underflow to subnormals) spacing is
absolute, not relative (float16: k2 of x = 1.7e-3 is 1.5e-6, a subnormal). The table:

  ppo_clip_loss   |err| ≤ SAFETY·(|ρ| + 4)·u·|loss|     ρ rounded (u|ρ|), exp (2u), ×A (u), clip
  cispo_loss      |err| ≤ SAFETY·(|ρ| + 5)·u·|loss|     as PPO, one more product (·logp)
  kl_penalty k1   |err| ≤ SAFETY·2u·|x|                  x = ref − logp rounded, negation exact
  kl_penalty k2   |err| ≤ SAFETY·3u·k2                   x rounded, squared, halved
  kl_penalty k3   |err| ≤ SAFETY·4u·(|e^x − 1| + |x|)    expm1 − x cancels for small x: absolute
  value_loss      |err| ≤ SAFETY·4u·(|v| + |R| + |v_old|)²   differences cancel: absolute
  aggregate       |err| ≤ SAFETY·(log2 N + 2)·u·Σ|w·l|  a cascaded sum of N terms, one division
  whiten          first-order propagation through μ = Σx/N (cascaded sum), c = x − μ,
                  var = Σc²/(N − ddof), s = sqrt(var + eps), c/s: see whiten_bound
  group_advantages the same per group, with n-term sums (a matmul against the membership
                  matrix: zeros add exactly, so any order errs ≤ n·u·Σ|terms|): group_bound
  gae             |err A_t| ≤ SAFETY·(k·u32·Σ_{s ≥ t} (γλ)^n(t,s)·(|r_s| + |v_s| + γ|v_next(s)|)
                  + u·|A_t|), half types working in float32 (u32) and rounding once (u); returns
                  add (u32 + u)·|A + v|. k counts the roundings on one term's way to A_t:
                  right-padded rows (Toeplitz path): k = 5 + L·(K + 3): δ in 4 roundings, and
                  each of the L = ⌈log_K (T + 1)⌉ levels of the blocked solve is a dot product
                  of ≤ K = 32 terms (K·u) plus a multiply-add;
                  rows with holes (scaled path): k = 15 + 2K + 6K·|log γλ| + 3·⌈log2 (T/K + 1)⌉:
                  q^c = exp(c·log γλ) errs by (2c·|log γλ| + 2)·u, c ≤ K, and enters three times
                  (y = q^c·r, x = q^c·v, and q^(−c) after); a term of A's own block passes
                  the two triangle products (sums of ≤ 2K terms), one of a later block its
                  block's row sum (≤ K terms) and then the product of the carry (≤ K more);
                  the affine scan over the block heads adds 3u per doubling step; the
                  remaining products and adds are ≤ 10 more
The reference itself is exact to ~1e-16, far below every bound.
"""
import math

import numpy as np
import pytest
import torch

import ref_numpy
import ref_torch
from crosscheck import bridge
from crosscheck.check import cases, registry

SAFETY = 4.0
DTYPES = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def floor(dtype):
    return SAFETY * torch.finfo(dtype).tiny


def rounded(x, dtype):
    """x rounded to `dtype`, as float64 (exactly representable in dtype)."""
    return torch.tensor(x, dtype=torch.float64).to(dtype).double().numpy()


def low(x, dtype):
    return torch.tensor(x, dtype=torch.float64).to(dtype)


@pytest.fixture(params=list(DTYPES), ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    return request.param


def inputs(dtype, seed=0, B=6, T=40):
    rng = np.random.default_rng(seed)
    logp = rounded(np.log(rng.uniform(0.05, 0.95, (B, T))), dtype)
    rho = rng.normal(0, 0.5, (B, T))
    old = rounded(logp - rho, dtype)
    adv = rounded(rng.normal(size=(B, T)), dtype)
    ref = rounded(logp + rng.normal(0, 0.5, (B, T)), dtype)
    return logp, old, adv, ref


def test_ppo_clip_loss(dtype):
    u = DTYPES[dtype]
    logp, old, adv, _ = inputs(dtype)
    ref = ref_numpy.ppo_clip_loss(logp, old, adv, clip_c=3.0)
    got = ref_torch.ppo_clip_loss(low(logp, dtype), low(old, dtype), low(adv, dtype),
                                  clip_c=3.0).double().numpy()
    bound = SAFETY * (np.abs(logp - old) + 4) * u * np.abs(ref)
    assert np.all(np.abs(got - ref) <= bound + floor(dtype))


def test_cispo_loss(dtype):
    u = DTYPES[dtype]
    logp, old, adv, _ = inputs(dtype)
    ref = ref_numpy.cispo_loss(logp, old, adv, clip_high=2.0)
    got = ref_torch.cispo_loss(low(logp, dtype), low(old, dtype), low(adv, dtype),
                               clip_high=2.0).double().numpy()
    bound = SAFETY * (np.abs(logp - old) + 5) * u * np.abs(ref)
    assert np.all(np.abs(got - ref) <= bound + floor(dtype))


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty(dtype, kind):
    u = DTYPES[dtype]
    logp, _, _, ref_lp = inputs(dtype)
    x = ref_lp - logp
    ref = ref_numpy.kl_penalty(logp, ref_lp, kind=kind)
    got = ref_torch.kl_penalty(low(logp, dtype), low(ref_lp, dtype), kind=kind).double().numpy()
    bound = {"k1": 2 * u * np.abs(x), "k2": 3 * u * np.abs(ref),
             "k3": 4 * u * (np.abs(np.expm1(x)) + np.abs(x))}[kind] * SAFETY
    assert np.all(np.abs(got - ref) <= bound + floor(dtype))


def test_k3_for_tiny_log_ratios_is_absolute_not_relative(dtype):
    """e^x − 1 − x for |x| ≪ 1 is x²/2, but expm1(x) − x cancels: its relative error grows like
    u/|x|. The bound above is absolute (u·|x|), which is what low precision can promise; in
    float64 the cancellation costs nothing measurable at |x| ≥ 1e-9 (see test_identities)."""
    u = DTYPES[dtype]
    x = rounded(np.array([1e-3, -1e-3, 1e-2]), dtype)
    got = ref_torch.kl_penalty(low(np.zeros(3), dtype), low(x, dtype), kind="k3").double().numpy()
    ref = np.expm1(x) - x
    assert np.all(np.abs(got - ref) <= SAFETY * 4 * u * (np.abs(np.expm1(x)) + np.abs(x)) +
                  floor(dtype))


def test_value_loss(dtype):
    u = DTYPES[dtype]
    rng = np.random.default_rng(1)
    v, vo, R = (rounded(rng.normal(size=(6, 40)), dtype) for _ in range(3))
    ref = ref_numpy.value_loss(v, vo, R, clip=0.2)
    got = ref_torch.value_loss(low(v, dtype), low(vo, dtype), low(R, dtype),
                               clip=0.2).double().numpy()
    bound = SAFETY * 4 * u * (np.abs(v) + np.abs(R) + np.abs(vo)) ** 2
    assert np.all(np.abs(got - ref) <= bound + floor(dtype))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_aggregate(dtype, mode):
    u = DTYPES[dtype]
    rng = np.random.default_rng(2)
    loss = rounded(rng.normal(size=(8, 64)), dtype)
    mask = rng.random((8, 64)) < 0.7
    ref = ref_numpy.aggregate(loss, mask, mode=mode)
    w = ref_numpy.aggregate_vjp(1.0, loss, mask, mode=mode)["loss"]
    got = float(ref_torch.aggregate(low(loss, dtype), torch.tensor(mask), mode=mode))
    N = int(mask.sum())
    assert abs(got - ref) <= SAFETY * (math.log2(N) + 2) * u * float(np.abs(w * loss).sum()) + \
        floor(dtype)


def test_exp_saturates_at_the_largest_float_of_each_dtype(dtype):
    """A huge log-ratio saturates the ratio at the dtype's largest float instead of overflowing;
    a clipped token's gradient stays 0 rather than NaN (0·inf) in every dtype."""
    logp = torch.tensor([200.0, 200.0], dtype=dtype, requires_grad=True)
    old = torch.zeros(2, dtype=dtype)
    loss = ref_torch.ppo_clip_loss(logp, old, torch.tensor([1.0, -1.0], dtype=dtype), clip_c=3.0)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    assert torch.all(logp.grad == 0)


def cascade(N):
    return math.log2(max(N, 2)) + 2


def whiten_bound(x, m, u, ddof=0, eps=1e-8):
    """First-order error of (x − μ)/sqrt(var + eps) over the valid entries, in float64."""
    xv = x[m]
    N = xv.size
    mu = xv.mean()
    c = x - mu
    e_mu = cascade(N) * u * np.abs(xv).sum() / N
    e_c = u * np.abs(c) + e_mu
    var = (c[m] ** 2).sum() / (N - ddof)
    e_var = (cascade(N) + 1) * u * var + 2 * (np.abs(c[m]) * e_c[m]).sum() / (N - ddof)
    s = math.sqrt(var + eps)
    e_s = (e_var + u * (var + eps)) / (2 * s) + u * s
    return e_c / s + np.abs(c) * e_s / s ** 2 + u * np.abs(c / s)


def test_whiten(dtype):
    u = DTYPES[dtype]
    rng = np.random.default_rng(7)
    x = rounded(rng.normal(3.0, 2.0, (6, 40)), dtype)
    m = rng.random((6, 40)) < 0.8
    ref = ref_numpy.whiten(x, m)
    got = ref_torch.whiten(low(x, dtype), torch.tensor(m)).double().numpy()
    bound = SAFETY * whiten_bound(x, m, u)
    assert np.all(np.abs(got - ref)[m] <= bound[m] + floor(dtype))
    assert np.all(got[~m] == 0)


def group_bound(r, n, u, eps=1e-4, ddof=0):
    """First-order error of (r − mean_g)/(std_g + eps) for consecutive groups of n rows."""
    out = np.empty_like(r)
    for g in range(0, r.size, n):
        x = r[g:g + n]
        mu = x.mean()
        c = x - mu
        e_c = u * np.abs(c) + (n + 1) * u * np.abs(x).sum() / n
        var = (c ** 2).sum() / (n - ddof)
        e_var = (n + 2) * u * var + 2 * (np.abs(c) * e_c).sum() / (n - ddof)
        sigma = math.sqrt(var)
        e_sigma = e_var / (2 * sigma) + u * sigma
        d = sigma + eps
        out[g:g + n] = e_c / d + np.abs(c) * (e_sigma + u * d) / d ** 2 + u * np.abs(c / d)
    return out


def test_group_advantages(dtype):
    u = DTYPES[dtype]
    rng = np.random.default_rng(8)
    n = 8
    r = rounded(rng.normal(0.5, 1.0, 48), dtype)
    ref = ref_numpy.group_advantages(r, group_size=n)
    got = ref_torch.group_advantages(low(r, dtype), group_size=n).double().numpy()
    assert np.all(np.abs(got - ref) <= SAFETY * group_bound(r, n, u) + floor(dtype))


def next_valid_values(v, m, last_value):
    """|V| at each valid step's next valid step (|last_value| after a row's last), a plain loop."""
    out = np.zeros_like(v)
    for b in range(v.shape[0]):
        nxt = abs(last_value[b])
        for t in reversed(range(v.shape[1])):
            if m[b, t]:
                out[b, t] = nxt
                nxt = abs(v[b, t])
    return out


@pytest.mark.parametrize("layout, lam", [("right", 0.95), ("holed", 0.95), ("holed", 0.45)])
def test_gae(dtype, layout, lam):
    u = DTYPES[dtype]
    rng = np.random.default_rng(9)
    B, T, gamma = 6, 200, 0.99
    r, v = (rounded(rng.normal(size=(B, T)), dtype) for _ in range(2))
    lv = rounded(rng.normal(size=B), dtype)
    m = np.arange(T)[None] < rng.integers(1, T + 1, (B, 1))
    if layout == "holed":
        m &= rng.random((B, T)) < 0.7
    ref_a, ref_r = ref_numpy.gae(r, v, m, gamma=gamma, lam=lam, last_value=lv)
    got_a, got_r = (x.double().numpy() for x in ref_torch.gae(
        low(r, dtype), low(v, dtype), torch.tensor(m), gamma=gamma, lam=lam,
        last_value=low(lv, dtype)))
    terms = np.abs(r) + np.abs(v) + gamma * next_valid_values(v, m, lv)
    weighted = ref_numpy.discounted_returns(np.where(m, terms, 0.0), m, gamma=gamma * lam)
    K = 32
    if layout == "right":
        k = 5 + math.ceil(math.log(T + 1, K)) * (K + 3)
    else:
        k = 15 + 2 * K + 6 * K * abs(math.log(gamma * lam)) + 3 * math.ceil(math.log2(T / K + 1))
    u32 = DTYPES[torch.float32]                 # half types are computed in float32 (docstring)
    e_work = k * u32 * weighted
    e_adv = SAFETY * (e_work + u * np.abs(ref_a))
    assert np.all(np.abs(got_a - ref_a)[m] <= e_adv[m] + floor(dtype))
    e_ret = SAFETY * (e_work + (u32 + u) * np.abs(ref_r))
    assert np.all(np.abs(got_r - ref_r)[m] <= e_ret[m] + floor(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(registry.build()))
def test_output_dtype_follows_input(name, dtype):
    entry = registry.build()[name]
    case = entry.case(cases.rng_for(0, name, 0), 0)          # a plain 3×7 case
    t = {k: (None if v is None else
             torch.from_numpy(v.copy()).to(dtype) if v.dtype.kind == "f" else torch.from_numpy(v))
         for k, v in case.arrays.items()}
    outs = entry.torch_fn(**t, **case.params)
    outs = [outs[k] for k in entry.outputs] if entry.dict_output else \
        (outs if isinstance(outs, tuple) else (outs,))
    refs = bridge.outputs(entry.numpy_fn(**case.arrays, **case.params), entry.outputs)
    for o, r in zip(outs, refs):
        assert o.dtype == dtype
        assert torch.isfinite(o).all()
        # a loose sanity bound only (64 eps of the dtype times the output scale), not a derived
        # tolerance: the derived per-function precision table belongs to the reliability work
        scale = max(1.0, float(np.abs(r).max()))
        assert np.abs(o.double().numpy() - r).max() <= 64 * torch.finfo(dtype).eps * scale
