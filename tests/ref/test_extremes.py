"""The references at the edges of the float range.

Whitening and group normalisation are scale-invariant math: their outputs must not move when
the data is multiplied by 1e±150 or 1e±300 (eps = 0, or eps scaled with the data), in both twins,
and their gradients must scale by exactly 1/c. The KL-estimator moments and expected gradients
of peaked policies (a logit gap up to 1e4, logits ×1e300) are compared with an mpmath evaluation
with enough digits, whose exponent range has no limit, so 0·inf never arises there.
"""
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ref_numpy
import ref_torch
from crosscheck.bridge import backprop, tensor

SCALES = (1e150, 1e-150, 1e300, 1e-300)
EPS_SCALING = {"var": 2, "clamp": 2, "std": 1}      # eps has the units of x^power


def _scaled_eps(eps, c, mode):
    """eps with the data's units, or None where that is not a positive finite float."""
    if eps == 0.0:
        return 0.0
    v = eps * c ** EPS_SCALING[mode] if abs(math.log10(c)) * EPS_SCALING[mode] < 300 else (
        math.inf if c > 1 else 0.0)
    return v if 0.0 < v < math.inf else None


def _spread(draw, shape):
    """Data in about [-10, 20] that is never constant (whitening a constant is refused), with
    every entry distinct (every leave-one-out spread is > 0)."""
    x = draw(hnp.arrays(np.float64, shape, elements=st.floats(-10, 10, width=64)))
    return x + 0.37 * np.arange(x.size, dtype=np.float64).reshape(shape)


# cotangents whose products with 1/c stay normal numbers at every scale tried
COTANGENT = st.one_of(st.just(0.0), st.floats(1e-3, 1.0), st.floats(-1.0, -1e-3))


def _whiten_both(x, m, kw, g):
    y = ref_numpy.whiten(x, m, **kw)
    d = ref_numpy.whiten_vjp(g, x, m, **kw)["x"]
    xt = tensor(x).requires_grad_(True)
    yt = ref_torch.whiten(xt, tensor(m), **kw)
    (dt,) = backprop(yt, g, [xt])
    return (y, d), (yt.detach().numpy(), dt)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), mode=st.sampled_from(("var", "clamp", "std")),
       centring=st.sampled_from(((True, False), (False, False), (False, True))),
       ddof=st.sampled_from((0, 1)), eps=st.sampled_from((0.0, 1e-8)))
def test_whiten_is_scale_invariant_in_both_twins(data, mode, centring, ddof, eps):
    x = _spread(data.draw, (3, 6))
    m = np.ones((3, 6), bool)
    m[0, 4:] = False
    g = data.draw(hnp.arrays(np.float64, (3, 6), elements=COTANGENT))
    shift, restore = centring
    base = dict(ddof=ddof, eps_mode=mode, shift_mean=shift, restore_mean=restore)
    want_y = ref_numpy.whiten(x, m, eps=eps, **base)
    want_d = ref_numpy.whiten_vjp(g, x, m, eps=eps, **base)["x"]
    for c in SCALES:
        e = _scaled_eps(eps, c, mode)
        if e is None:
            continue
        for y, d in _whiten_both(x * c, m, dict(base, eps=e), g):
            # restore_mean re-adds μ, which has the data's units: the rest is invariant
            mean = (lambda v: np.where(m, v[m].mean(), 0.0)) if restore else (lambda v: 0.0)
            y_want = want_y - mean(x) + mean(x * c)
            np.testing.assert_allclose(y, y_want, rtol=1e-9, atol=1e-9 * np.abs(y_want).max())
            if restore:
                continue         # the re-added mean makes ∂y/∂x mix both units
            np.testing.assert_allclose(d * c, want_d, rtol=1e-9,
                                       atol=1e-9 * max(np.abs(g).max(), 1e-3) / np.std(x[m]))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), scale=st.sampled_from(("group", "batch", "leave_one_out", "none")),
       baseline=st.sampled_from(("mean", "leave_one_out")), ddof=st.sampled_from((0, 1)),
       eps=st.sampled_from((0.0, 1e-4)))
def test_group_advantages_are_scale_invariant_in_both_twins(data, scale, baseline, ddof, eps):
    r = _spread(data.draw, (12,))
    g = data.draw(hnp.arrays(np.float64, (12,), elements=COTANGENT))
    if scale == "leave_one_out":
        baseline = "leave_one_out"       # the others' std goes with the others' mean
    kw = dict(group_size=4, ddof=ddof, scale=scale, baseline=baseline)
    want = ref_numpy.group_advantages(r, eps=eps, **kw)
    want_d = ref_numpy.group_advantages_vjp(g, r, eps=eps, **kw)["rewards"]
    linear = scale == "none"             # A = r − b scales with the data
    for c in SCALES:
        e = eps * c if eps else 0.0      # eps is added to a std: the data's units
        if eps and not 0.0 < e < math.inf:
            continue
        got = ref_numpy.group_advantages(r * c, eps=e, **kw)
        got_d = ref_numpy.group_advantages_vjp(g, r * c, eps=e, **kw)["rewards"]
        rt = tensor(r * c).requires_grad_(True)
        out_t = ref_torch.group_advantages(rt, eps=e, **kw)
        (got_dt,) = backprop(out_t, g, [rt])
        for y, d in ((got, got_d), (out_t.detach().numpy(), got_dt)):
            y = y / c if linear else y
            d = d if linear else d * c
            np.testing.assert_allclose(y, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())
            # the gradient's natural size is |g|/σ: a gradient that cancels to ~0 (g constant
            # within a group, with eps = 0) is compared at that size
            np.testing.assert_allclose(d, want_d, rtol=1e-9,
                                       atol=1e-9 * max(np.abs(g).max(), 1e-3) / np.std(r))


@pytest.mark.parametrize("mod, conv", [(ref_numpy, np.asarray), (ref_torch, tensor)])
def test_whitening_huge_values_is_not_zero(mod, conv):
    x = np.array([[1.0, 2.0, 3.0]]) * 1e160
    y = np.asarray(mod.whiten(conv(x), eps=0.0))
    np.testing.assert_allclose(y, [[-1.224744871391589, 0.0, 1.224744871391589]], rtol=1e-14)


@pytest.mark.parametrize("mod, conv", [(ref_numpy, np.asarray), (ref_torch, tensor)])
def test_an_overflowing_spread_is_a_spread_not_zero(mod, conv):
    # σ of [1e200, −1e200] is 1e200; its square is beyond float64
    r = np.array([1e200, -1e200, 3e200, 1e200])
    A = np.asarray(mod.group_advantages(conv(r), group_size=2, eps=0.0))
    np.testing.assert_allclose(A, [1.0, -1.0, 1.0, -1.0], rtol=1e-14)


@pytest.mark.parametrize("mod, conv", [(ref_numpy, np.asarray), (ref_torch, tensor)])
def test_tiny_data_beside_eps_is_divided_by_sqrt_eps(mod, conv):
    # var ≈ 1e−400 is far below eps = 1e−8: s = sqrt(eps) = 1e−4, y = (x − μ)/1e−4
    x = np.array([[1e-200, 3e-200]])
    y = np.asarray(mod.whiten(conv(x), eps=1e-8))
    np.testing.assert_allclose(y, [[-1e-196, 1e-196]], rtol=1e-14)


# --------------------------------------------------------------------- KL of peaked policies
def _digits(*logits):
    """Working digits: enough that u = log ref − log π keeps 40 digits after the point even
    when log π is −8e302 (mpmath's exponent has no limit, its mantissa has these digits)."""
    top = max(abs(v) for z in logits if z is not None for v in z)
    return 40 + int(math.log10(max(top, 1.0)))


def _mp_log_softmax(z):
    z = [v if isinstance(v, mpmath.mpf) else mpmath.mpf(float(v)) for v in z]
    top = max(z)
    lse = top + mpmath.log(mpmath.fsum(mpmath.exp(v - top) for v in z))
    return [v - lse for v in z]


def _mp_k(kind, u):
    """k and ∂k/∂log π (= −k'(u)) at u = log ref − log π, exactly."""
    if kind == "k1":
        return -u, mpmath.mpf(1)
    if kind == "k2":
        return u * u / 2, -u
    return mpmath.exp(u) - 1 - u, 1 - mpmath.exp(u)


def _mp_moments(z, zr, kind):
    lp, lr = _mp_log_softmax(z), _mp_log_softmax(zr)
    p = [mpmath.exp(v) for v in lp]
    q = [mpmath.exp(v) for v in lr]
    k = [_mp_k(kind, b - a)[0] for a, b in zip(lp, lr)]
    fwd = mpmath.fsum(pi * (a - b) for pi, a, b in zip(p, lp, lr))
    mean = mpmath.fsum(pi * ki for pi, ki in zip(p, k))
    return {"kl_forward": fwd, "kl_reverse": mpmath.fsum(qi * (b - a) for qi, a, b in zip(q, lp, lr)),
            "mean": mean, "bias": mean - fwd,
            "var": mpmath.fsum(pi * (ki - mean) ** 2 for pi, ki in zip(p, k))}


def _mp_var_gradient(z, zr, kind):
    """∂var/∂logits by mpmath's own numerical differentiation of the exact var: independent
    of the hand-derived rule the reference applies."""
    def var_at(j):
        return lambda t: _mp_moments([t if i == j else v for i, v in enumerate(z)], zr,
                                     kind)["var"]
    return [mpmath.diff(var_at(j), mpmath.mpf(float(z[j]))) for j in range(len(z))]


def _mp_expected(z, zr, kind, use, is_weight, zs):
    """E_μ[c(x)(e_x − π)] with c = W·(∂k + k·[attached]) (loss) or W·k·(1 + log π·[attached])."""
    lp, lr = _mp_log_softmax(z), _mp_log_softmax(zr)
    p = [mpmath.exp(v) for v in lp]
    mu = p if zs is None else [mpmath.exp(v) for v in _mp_log_softmax(zs)]
    att = 1 if is_weight == "attached" else 0
    mc = []
    for i, (a, b) in enumerate(zip(lp, lr)):
        k, dk = _mp_k(kind, b - a)
        W = 1 if is_weight is None else p[i] / mu[i]
        c = W * (dk + k * att) if use == "loss" else W * k * (1 + a * att)
        mc.append(mu[i] * c)
    total = mpmath.fsum(mc)
    return [m - pi * total for m, pi in zip(mc, p)]


def _as_float(v):
    """The float64 that an exact value rounds to (inf beyond the largest float)."""
    return math.copysign(math.inf, v) if abs(v) > np.finfo(np.float64).max else float(v)


def _agree(got, exact, scale):
    exact = _as_float(exact)
    if math.isinf(exact):
        assert got == exact
    else:
        assert abs(got - exact) <= 1e-12 * max(abs(exact), scale), (got, exact)


PEAKED = [
    ([0.0, 800.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]),          # KL(π‖ref) = log 4 exactly
    ([0.0, 1e4, 3.0, -2.0], [0.5, -0.3, 0.2, 0.1]),
    ([-1e4, 0.0, 0.7, 1e4], [0.1, 0.2, 0.3, 0.4]),
    ([0.0, 40.0, 1.0, -700.0], [1.0, -1.0, 0.5, 0.0]),        # near the cap, not past it
    ([0.0, 8e302, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]),          # [0, 800, 0, 0]·1e300
    ([1.5e300, -2e300, 0.0, 1e300, 3e300], [0.3, -0.2, 0.1, 0.0, 0.4]),
]


@pytest.mark.parametrize("z, zr", PEAKED)
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_moments_of_peaked_policies_match_exact_arithmetic(z, zr, kind):
    with mpmath.workdps(_digits(z, zr)):
        exact = _mp_moments(z, zr, kind)
    for mod, conv in ((ref_numpy, np.asarray), (ref_torch, tensor)):
        got = mod.kl_estimator_moments(conv(np.array(z)), conv(np.array(zr)), kind=kind)
        for key in exact:
            _agree(float(got[key]), exact[key], 1.0)


def _representable_var(cases):
    """(z, zr, kind) whose exact var is above 1e-300: below, var underflows to 0 and log_var
    is −inf by its contract (tested beside)."""
    out = []
    for z, zr in cases:
        for kind in ("k1", "k2", "k3"):
            with mpmath.workdps(_digits(z, zr)):
                if _mp_moments(z, zr, kind)["var"] > mpmath.mpf("1e-300"):
                    out.append((z, zr, kind))
    return out


@pytest.mark.parametrize("z, zr, kind", _representable_var(
    PEAKED + [([0.0, -1400.0, -2.0], [0.0, -600.0, 1.0]), ([0.0, -800.0, -5.0], [0.0] * 3)]))
def test_log_var_of_peaked_policies_is_the_exact_log(z, zr, kind):
    with mpmath.workdps(_digits(z, zr)):
        log_exact = float(mpmath.log(_mp_moments(z, zr, kind)["var"]))
    for mod, conv in ((ref_numpy, np.asarray), (ref_torch, tensor)):
        got = float(mod.kl_estimator_moments(conv(np.array(z)), conv(np.array(zr)),
                                             kind=kind)["log_var"])
        assert abs(got - log_exact) <= 1e-12 * max(1.0, abs(log_exact)), (mod, got, log_exact)


_MOMENT_G = dict.fromkeys(("kl_forward", "kl_reverse", "mean", "bias", "var", "log_var"), 0.0)


@pytest.mark.parametrize("z, zr", [
    ([0.0, -1400.0, -2.0], [0.0, -600.0, 1.0]),   # var ≈ 5.9e85: the k3 factor k + 2k' < 0
    ([0.0, -800.0, -5.0], [0.0, 0.0, 0.0]),       # var beyond float64
    ([0.0, 800.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]),
    ([0.0, 40.0, 1.0, -700.0], [1.0, -1.0, 0.5, 0.0])])
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_the_variance_gradient_of_peaked_policies_has_the_exact_sign_and_size(z, zr, kind):
    with mpmath.workdps(_digits(z, zr) + 20):
        exact = _mp_var_gradient(z, zr, kind)
        var = _mp_moments(z, zr, kind)["var"]
    got = ref_numpy.kl_estimator_moments_vjp(dict(_MOMENT_G, var=1.0), np.array(z),
                                             np.array(zr), kind=kind)["logits"]
    scale = max([1.0] + [abs(_as_float(v)) for v in exact if abs(v) < 1e308])
    for g, e in zip(got, exact):
        _agree(float(g), e, scale)
    if var > mpmath.mpf("1e-300"):          # ∇log var = ∇var / var, finite where var is not
        # ref_numpy only: torch autograd's log_softmax backward forms the most likely entry
        # as g_m − π_m·Σg, whose rounding (π_m rounds to 1) is ~1e-16·mean² here, above a
        # var of 1e-14; the hand gradient takes that entry as minus the sum of the others
        got = ref_numpy.kl_estimator_moments_vjp(dict(_MOMENT_G, log_var=1.0), np.array(z),
                                                 np.array(zr), kind=kind)["logits"]
        for g, e in zip(got, exact):
            _agree(float(g), e / var, 1.0)


def test_log_var_has_no_gradient_where_var_is_zero_in_float64():
    # π = ref: k1 = 0 at every category, var = 0, log_var = −inf
    z = np.array([0.3, -0.2, 1.0])
    with pytest.raises(ValueError, match=r"g\['log_var'\] is nonzero where var is 0"):
        ref_numpy.kl_estimator_moments_vjp(dict(_MOMENT_G, log_var=1.0), z, z, kind="k1")
    assert ref_numpy.kl_estimator_moments(z, z, kind="k1")["log_var"] == -math.inf


def test_k3_moments_of_the_issue_example_are_exact():
    got = ref_numpy.kl_estimator_moments(np.array([0.0, 800.0, 0.0, 0.0]), np.zeros(4),
                                         kind="k3")
    assert got["mean"] == pytest.approx(math.log(4), rel=1e-15)
    assert abs(got["bias"]) < 1e-15
    assert got["var"] == math.inf            # Σ ref²/π ≈ 3/16·e^800, beyond float64
    assert got["log_var"] == pytest.approx(800 + math.log(3 / 16), rel=1e-15)


@pytest.mark.parametrize("z, zr", PEAKED)
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("use, is_weight, sample", [
    ("loss", None, False), ("reward", None, False), ("loss", "attached", True),
    ("reward", "attached", True), ("loss", "detached", True), ("reward", "detached", True)])
def test_kl_expected_gradients_of_peaked_policies_match_exact_arithmetic(z, zr, kind, use,
                                                                         is_weight, sample):
    zs = [0.3 * v for v in zr] if sample else None
    with mpmath.workdps(_digits(z, zr, zs)):
        exact = _mp_expected(z, zr, kind, use, is_weight, zs)
    scale = max(1.0, max(abs(_as_float(v)) for v in exact if abs(v) < 1e308))
    for mod, conv in ((ref_numpy, np.asarray), (ref_torch, tensor)):
        got = mod.kl_estimator_gradient(conv(np.array(z)), conv(np.array(zr)), kind=kind,
                                        use=use, is_weight=is_weight,
                                        sample_logits=None if zs is None else conv(np.array(zs)))
        for g, e in zip(np.asarray(got["expected"]), exact):
            _agree(float(g), e, scale)


@pytest.mark.parametrize("mod, conv", [(ref_numpy, np.asarray), (ref_torch, tensor)])
def test_unweighted_sampling_where_pi_has_no_mass_is_refused_by_name(mod, conv):
    # μ uniform, π peaked: μ·k3 ≈ μ·ref/π = e^800/16 is beyond float64, and so is its gradient
    with pytest.raises(ValueError, match=r"sample_logits put probability on category 0"):
        mod.kl_estimator_gradient(conv(np.array([0.0, 800.0, 0.0, 0.0])), conv(np.zeros(4)),
                                  kind="k3", sample_logits=conv(np.zeros(4)))


@pytest.mark.parametrize("mod, conv", [(ref_numpy, np.asarray), (ref_torch, tensor)])
def test_an_objective_that_overflows_names_its_inputs(mod, conv):
    lp = np.array([[1e300, -1.0]])
    z, o = np.zeros((1, 2)), np.ones((1, 2))
    with pytest.raises(ValueError, match=r"^the inputs overflow the loss at valid position "
                                         r"\(0, 0\) \(logp=1e\+300, old_logp=0, advantages=1, "
                                         r"ref_logp=0\)"):
        mod.policy_objective(conv(lp), conv(z), conv(o), conv(o), conv(z), beta=0.1,
                             kl_kind="k2")


KL_XS = [s * v for v in (1e-8, 1e-3, 0.5, 1.0, 3.0, 10.0, 40.0, 50.0, 100.0, 300.0, 700.0)
         for s in (1.0, -1.0)]


def _mp_weighted_kl(kind, lp, weight_log, anchor):
    """W·k as a function of logp in exact arithmetic: W = exp(logp − weight_log) (the score
    weight exp(logp − sg(logp)) has weight_log = logp at the point), x = anchor − logp."""
    def f(t):
        x = anchor - t
        k = {"k1": -x, "k2": x * x / 2, "k3": mpmath.exp(x) - 1 - x, "abs": abs(x)}[kind]
        return mpmath.exp(t - weight_log) * k
    return f


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
@pytest.mark.parametrize("weight, anchor_name, clamp", [
    ("score", "ref", None), ("ratio", "ref", None), ("ratio", "old", None),
    ("score", "ref", (750.0, None)), ("ratio", "ref", (750.0, None))])
def test_the_weighted_kl_terms_gradient_is_exact_from_tiny_to_huge_log_ratios(
        kind, weight, anchor_name, clamp):
    # J = β·W·k(x) on one token, β = 1, A = 0: ∂J/∂logp against mpmath's derivative of the
    # same function at 400 digits (k3's e^x − 1 − x at x = 700 cancels 300 digits there).
    # For k3 the terms ∂k/∂logp = 1 − e^x and k = e^x − 1 − x sum to −x: summed in floats they
    # lose every digit of it once e^x ≫ x (x = 40 gave −32, x ≥ 50 gave 0)
    mpmath.mp.dps = 400
    lp = -0.5
    for x in KL_XS:
        ref = lp + x
        # anchor "old": the KL is taken against old_logp = ref, and r = exp(logp − old) = e^−x;
        # anchor "ref": old_logp sits 0.25 below logp (r = e^0.25) or, for the score, at logp
        old = ref if anchor_name == "old" else (lp - 0.25 if weight == "ratio" else lp)
        weight_log = lp if weight == "score" else old
        f = _mp_weighted_kl(kind, mpmath.mpf(lp), mpmath.mpf(weight_log), mpmath.mpf(ref))
        exact = float(mpmath.diff(f, mpmath.mpf(lp)))
        args = (np.array([[lp]]), np.array([[old]]), np.zeros(1), np.ones((1, 1), bool),
                np.array([[ref]]))
        kw = dict(agg="token-mean", beta=1.0, kl_kind=kind, kl_clamp=clamp, kl_weight=weight,
                  kl_anchor=anchor_name)
        if not math.isfinite(float(f(mpmath.mpf(lp)))):
            continue                  # the term itself is beyond float64: refused, not tested
        hand = ref_numpy.policy_objective_vjp(1.0, *args, **kw)["logp"][0, 0]
        t = [tensor(a) for a in args]
        t[0].requires_grad_(True)
        (auto,) = backprop(ref_torch.policy_objective(*t, **kw), 1.0, [t[0]])
        for name, got in (("ref_numpy", hand), ("ref_torch", float(np.asarray(auto)[0, 0]))):
            assert got == pytest.approx(exact, rel=1e-13, abs=1e-300), (name, x)
