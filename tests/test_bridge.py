"""crosscheck.bridge: the one closeness rule, term by term, and the JSON conversion."""
import json
import math

import numpy as np
import pytest

from crosscheck import bridge, tolerances


def test_compare_allows_atol_times_scale_plus_rtol_plus_the_roundoff_bound():
    """The rule of tolerances.py, term by term, at its edges."""
    from crosscheck.tolerances import Tolerance
    tol = Tolerance(rtol=1e-6, atol=1e-8, why="test")
    assert bridge.compare(1.0 + 2e-6, 1.0, tol).ok is False
    assert bridge.compare(1.0 + 2e-6, 1.0, tol, extra=1e-6).ok is True       # + extra
    assert bridge.compare(5e-7, 0.0, tol, scale=1.0).ok is False
    assert bridge.compare(5e-7, 0.0, tol, scale=100.0).ok is True            # atol · scale
    cmp = bridge.compare(np.array([0.0, 3.0]), np.array([0.0, 3.0 + 1e-5]), tol, extra=1e-7)
    assert not cmp.ok and cmp.index == (1,)
    assert cmp.allowed == pytest.approx(1e-8 + 1e-6 * (3.0 + 1e-5) + 1e-7, rel=1e-12)


def test_json_safe_spells_out_what_json_cannot_hold():
    from crosscheck.bridge import json_safe
    got = json_safe({"a": np.inf, "b": -np.inf, "c": float("nan"), "d": np.float32(1.5),
                     "e": np.arange(2), "f": (np.int64(3), [np.array(2.0)])})
    assert got == {"a": "inf", "b": "-inf", "c": "nan", "d": 1.5, "e": [0, 1],
                   "f": [3, [2.0]]}
    assert json.dumps(got)                           # plain JSON now


def test_compare_fails_on_a_shape_mismatch_and_passes_empty_arrays():
    tol = tolerances.get("value")
    bad = bridge.compare(np.zeros(3), np.zeros((3, 1)), tol)
    assert not bad.ok and bad.badness == math.inf and bad.index == ()
    assert math.isnan(bad.got) and math.isnan(bad.expected)
    empty = bridge.compare(np.zeros((2, 0)), np.zeros((2, 0)), tol)
    assert empty.ok and empty.badness == 0.0 and empty.max_abs == 0.0
    assert (empty.got, empty.expected, empty.allowed, empty.index) == (0.0, 0.0, 0.0, ())


def test_compare_reports_the_worst_entry_and_exact_entries_as_zero():
    """badness is err / allowed: 0 for an exact match (not 1, the edge of failing), so the worst
    entry reported is the one that differs, wherever it sits."""
    tol = tolerances.get("value")
    x = np.linspace(1.0, 2.0, 7)
    same = bridge.compare(x, x.copy(), tol)
    assert same.ok and same.badness == 0.0 and same.max_abs == 0.0
    y = x.copy()
    y[4] += 0.25 * (tol.atol + tol.rtol * y[4])        # a quarter of what is allowed there
    near = bridge.compare(y, x, tol)
    assert near.ok and near.index == (4,) and near.got == y[4] and near.expected == x[4]
    assert 0.2 < near.badness < 0.3


def test_within_matches_equal_infinities_and_nothing_else_against_an_inf():
    """Found by a mutant: a diagnosis whose gradient was inf on clipped tokens matched the user's
    finite one, since rtol·|inf| allows any difference. The audit's tolerance, entry by entry."""
    tol = tolerances.get("audit")
    inf, nan = np.inf, np.nan
    ref = np.array([inf, -inf, inf, 1.0, nan, 2.0])
    for i, yours_i, ok in ((0, inf, True), (1, -inf, True), (2, 1e300, False), (2, -inf, False),
                           (3, inf, False), (3, nan, False), (4, nan, False), (4, 0.0, False),
                           (5, 2.0 + 1e-7, True)):
        yours = ref.copy()
        yours[i] = yours_i
        assert bool(bridge.within(yours, ref, tol)[i]) is ok, (i, yours_i)
    masked = np.array([1.0, 5.0, inf])
    assert bridge.first_mismatch(masked, np.array([1.0, nan, 0.0]), tol,
                                 np.array([True, False, False])) is None
    assert bridge.first_mismatch(masked, np.array([1.0, nan, 0.0]), tol,
                                 np.array([True, True, False])) == (1,)

