"""Correct code conforms in every style trainers write; a planted bug is caught in any style.

Each audit runs 30 cases, enough to reach the regimes drawn from case 12 on (large common
offsets, log-ratios past float32's exp overflow, large advantages, empty first micro-batches)."""
import pytest

from crosscheck import audit, tolerances
from tests.audit.corpus import failing
from tests.audit.styles import BUGS, STYLES

CASES = 30


@pytest.mark.parametrize("ref, fn, kwargs", [row[1:] for row in STYLES],
                         ids=[row[0] for row in STYLES])
def test_a_correct_implementation_conforms_whatever_its_style(ref, fn, kwargs):
    kwargs = dict(kwargs)
    report = audit(fn, ref, cases=kwargs.pop("cases", CASES), **kwargs)
    assert report.ok, str(report)
    assert report.n_cases >= 9, report.skipped


@pytest.mark.parametrize("ref, fn, kwargs, checks", [row[1:] for row in BUGS],
                         ids=[row[0] for row in BUGS])
def test_a_planted_bug_is_caught_by_the_check_that_concerns_it(ref, fn, kwargs, checks):
    report = audit(fn, ref, cases=CASES, **kwargs)
    assert report.verdict == "DOES NOT CONFORM"
    assert checks & failing(report), str(report)


def test_float32_code_is_judged_at_the_float32_row_and_the_report_says_so():
    fn = next(fn for name, _, fn, _ in STYLES if name == "whiten-float32")
    report = audit(fn, "whiten", profile="minimind", cases=6)
    assert report.tolerance["why"] == ("the float32 row of the tolerance table: your function "
                                       "returns float32")
    row = tolerances.get("audit", "float32")
    assert (report.tolerance["rtol"], report.tolerance["atol"]) == (row.rtol, row.atol)
    assert row.rtol > tolerances.get("audit", "float64").rtol
    assert f"tolerance: rtol {row.rtol:g}, atol {row.atol:g} (the float32 row" in str(report)
