"""Finite differences evaluate many points per reference call (crosscheck/check/stacking.py,
ref_numpy/many.py): the values must be exactly those of one call per point, and a bug that lives
only in the many-point path must still fail the fd stage."""
import dataclasses

import numpy as np
import pytest

import ref_numpy
from crosscheck.check import cases, registry, stacking, stages
from ref_numpy import many
from tests.helpers import UNDER_MUTMUT

REGISTRY = registry.build()
STACKED = [n for n, e in REGISTRY.items() if e.stack is not None]


def _points(case, name, n=5, seed=0):
    """Input `name` moved at its valid positions, n times: [n, *shape]."""
    rng = np.random.default_rng(seed)
    x0 = case.arrays[name]
    valid = stages._valid(case, name)
    return np.stack([np.where(valid, x0 + 1e-3 * rng.normal(size=x0.shape), x0)
                     for _ in range(n)])


@pytest.mark.parametrize("name", STACKED)
def test_stacked_values_equal_one_call_per_point(name):
    entry = REGISTRY[name]
    for i in range(12):
        case = entry.case(cases.rng_for(0, name, i), i)
        for x in entry.diff:
            how = stacking.mode(entry.stack, case.arrays, case.params, x)
            shared = {k: v for k, v in case.arrays.items() if k != x}
            varying = {x: _points(case, x, seed=i)}
            got = stacking.evaluate(how, entry.numpy_fn, shared, varying, case.params,
                                    entry.outputs)
            want = stacking.evaluate(None, entry.numpy_fn, shared, varying, case.params,
                                     entry.outputs)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", [n for n in STACKED if REGISTRY[n].stack == "rows"])
def test_stacked_jacobian_rows_equal_one_vjp_per_cotangent(name):
    entry = REGISTRY[name]
    case = next(c for c in (entry.case(cases.rng_for(0, name, i), i) for i in range(12))
                if np.ndim(c.arrays[entry.diff[0]]) >= 2)
    outs = [np.asarray(o) for o in ref_numpy_outputs(entry, case)]
    n_out = sum(o.size for o in outs)
    units = [stages._cotangent(entry, outs, e) for e in np.eye(n_out)]
    vjp = lambda arrays, g: entry.numpy_vjp(g, **arrays, **case.params)   # noqa: E731
    got = stacking.vjps("rows", vjp, case.arrays, units, entry.diff[0])
    want = stacking.vjps(None, vjp, case.arrays, units, entry.diff[0])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def ref_numpy_outputs(entry, case):
    from crosscheck import bridge
    return bridge.outputs(entry.numpy_fn(**case.arrays, **case.params), entry.outputs)


def test_many_whiten_cotangents_equal_one_vjp_each():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 5))
    m = rng.random((3, 5)) > 0.3
    gs = [rng.normal(size=(3, 5)) for _ in range(4)]
    for kw in (dict(), dict(shift_mean=False, restore_mean=True, eps_mode="std", ddof=1)):
        got = many.vjps("whiten_vjp", gs, dict(x=x, mask=m), kw)
        for g, row in zip(gs, got):
            np.testing.assert_array_equal(row["x"], ref_numpy.whiten_vjp(g, x, m, **kw)["x"])


def test_a_point_that_is_not_finite_raises_the_public_error():
    case = REGISTRY["aggregate"].case(cases.rng_for(0, "aggregate", 0), 0)
    loss = case.arrays["loss"]
    bad = np.where(case.arrays["mask"], np.inf, 0.0)
    with pytest.raises(ValueError, match="loss is inf at valid position"):
        many.evaluate("aggregate", dict(mask=case.arrays["mask"]),
                      dict(loss=np.stack([loss, bad])), case.params)


def test_a_bug_only_in_the_many_point_path_fails_the_fd_stage(monkeypatch):
    # halve every value the many-point path returns: the hand VJP (unchanged) then disagrees
    # with finite differences, so the fd stage must fail, which it can only if it used the path
    real = many._sum_weighted
    monkeypatch.setattr(many, "_sum_weighted", lambda w, lo, m: [0.5 * v for v in
                                                                  real(w, lo, m)])
    entry = REGISTRY["aggregate"]
    results = {r.stage: r for r in stages.run_entry(entry, 0, 4)}
    assert results["value"].passed and results["vjp"].passed
    assert results["fd"].status == "fail"


@pytest.mark.skipif(UNDER_MUTMUT, reason="counted by a profiler, which mutmut's "
                    "trampolines hide the reference functions from")
def test_the_default_run_makes_at_most_3200_reference_calls():
    """Counted the way the benchmark counts them (a profiler over the default run): every call
    into ref_numpy from outside it, values and hand VJPs alike. 3,143 at 37 functions: the
    bound is the 3,000 the registry kept at 34 plus the three functions added since
    (docs/performance.md); a function evaluated point by point where it couples the batch
    costs about 2,000 and fails it."""
    from benchmarks import run as bench
    counts = bench.reference_calls(lambda: stages.run(REGISTRY, seed=0, n_cases=12))
    assert 0 < sum(counts.values()) <= 3200, counts.most_common(8)


def test_rows_stacking_is_declared_only_where_rows_are_independent():
    # a row-separable function's output rows do not move when another row changes
    for name in [n for n in STACKED if REGISTRY[n].stack == "rows"]:
        entry = REGISTRY[name]
        case = next(c for c in (entry.case(cases.rng_for(0, name, i), i) for i in range(12))
                    if np.ndim(c.arrays[entry.diff[0]]) >= 2 and
                    np.shape(c.arrays[entry.diff[0]])[0] > 1)
        x = entry.diff[0]
        moved = dict(case.arrays, **{x: case.arrays[x].copy()})
        moved[x][1:] += 0.01
        a = ref_numpy_outputs(entry, case)
        b = ref_numpy_outputs(dataclasses.replace(entry), dataclasses.replace(case,
                                                                           arrays=moved))
        for o1, o2 in zip(a, b):
            np.testing.assert_array_equal(np.asarray(o1)[0], np.asarray(o2)[0])


def test_problems_solved_together_get_the_answers_they_get_alone():
    """finite_diff.solve hands scipy every problem at once; problems that converge early must
    not shift the others' rows (a linear φ converges at once, a wiggly one later). Together an
    element may take more of its MAXITER iterations than alone, which moves its estimate by
    far less than the finite-difference error (a shifted row would be off by O(1))."""
    from crosscheck.check import finite_diff
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 4))
    problems = [
        ("directional", lambda t: 2.0 * np.asarray(t), 1e-2),
        ("directional", lambda t: 1e3 * np.sin(1.0 + 40.0 * np.asarray(t)), 1e-2),
        ("jacobian", lambda X: np.sin(X) @ A.T, rng.normal(size=4), 1e-2, 3),
        ("directional", lambda t: np.exp(3.0 * np.asarray(t)), 1e-3),
        ("jacobian", lambda X: np.exp(X[:, :2]), rng.normal(size=3), 1e-3),
    ]
    together = finite_diff.solve(problems)
    for problem, answer in zip(problems, together):
        np.testing.assert_allclose(answer, finite_diff.solve([problem])[0], rtol=1e-9,
                                   atol=1e-9)
    assert together[0] == pytest.approx(2.0, rel=1e-9)
    assert together[1] == pytest.approx(4e4 * np.cos(1.0), rel=1e-6)


def test_an_all_masked_batch_gives_every_point_the_public_functions_zero():
    """approx_kl with no valid token is 0 (its docstring); the many-point path must not
    divide by the zero count."""
    logp = np.array([[[-1.0, -2.0]], [[-0.5, -1.5]]])
    old, mask = np.array([[-1.2, -1.0]]), np.zeros((1, 2), bool)
    for kind in ("k1", "k2", "k3"):
        assert ref_numpy.approx_kl(logp[0], old, mask, kind=kind) == 0.0
        with np.errstate(all="raise"):
            got = many.evaluate("approx_kl", dict(old_logp=old, mask=mask), dict(logp=logp),
                                dict(kind=kind))
        assert got == [0.0, 0.0]
