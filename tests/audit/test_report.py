"""The report: verdict lines, counterexamples shrunk to a minimum, and what each shows."""
import re

import numpy as np
import torch

from crosscheck import audit
from tests.audit.corpus import (N, buggy, failing, finding, gae_loop, grpo, k3_half_detached, kl,
                                 ppo)


def test_failures_are_shrunk_to_small_counterexamples():
    report = audit(grpo(0, 1e-4), "group_advantages", profile="verl", cases=N)
    ce = finding(report, "value").counterexample
    assert len(ce["rewards"]) <= 4
    import ref_numpy
    ids = ce.get("group_ids")
    kw = dict(group_ids=np.asarray(ids)) if ids is not None else dict(group_size=ce["group_size"])
    expected = ref_numpy.group_advantages(np.asarray(ce["rewards"], dtype=float), ddof=1,
                                          eps=1e-6, **kw)            # verl's conventions
    np.testing.assert_allclose(ce["reference output"], expected, rtol=1e-12)
    assert len(ce["your output"]) == len(expected)


def test_the_report_counts_the_cases_it_ran_and_states_its_verdict():
    report = audit(kl("k3"), "kl_penalty", cases=7, seed=3)
    assert report.ok and report.n_cases == 7 and report.seed == 3
    lines = str(report).splitlines()
    assert "7 cases, seed 3" in lines[0]
    assert lines[-1] == "verdict: CONFORMS"
    bad = audit(buggy.kl_sign_flipped, "kl_penalty", cases=7)
    assert str(bad).splitlines()[-1].startswith("verdict: DOES NOT CONFORM (")


def test_a_wrong_second_output_is_named_by_its_index():
    """gae returns (advantages, returns): a function whose returns forget + V is blamed on
    `returns`, by name; its advantages pass."""
    inner = gae_loop(1.0, 1.0)

    def returns_without_values(rewards, values, mask, **kw):
        adv, _ = inner(rewards, values, mask, **kw)
        return adv, adv
    report = audit(returns_without_values, "gae", profile="verl", cases=N)
    assert finding(report, "value").message.startswith("returns[")


def test_the_shrinker_never_splits_a_group():
    """A candidate drops whole groups of `group_size` rows, never a single row of one."""
    from crosscheck.audit.shrink import smaller
    from crosscheck.check import cases as cases_mod
    case = cases_mod.Case("six rewards in groups of 2",
                          dict(rewards=np.arange(6.0), group_ids=None), dict(group_size=2))
    sizes = [c.arrays["rewards"].shape[0] for c in smaller(case)]
    assert 4 in sizes and all(n % 2 == 0 for n in sizes)


def test_a_bug_on_every_token_shrinks_to_one_token():
    def k1_doubled(logp, ref_logp, mask):
        return torch.where(mask.bool(), 2 * (logp - ref_logp), torch.zeros((), dtype=logp.dtype))
    report = audit(k1_doubled, "kl_penalty", kind="k1", cases=10)
    ce = finding(report, "value").counterexample
    assert np.asarray(ce["logp"]).shape == (1, 1) and np.asarray(ce["mask"]).tolist() == [[True]]


def test_a_gradient_counterexample_carries_both_gradients_and_a_value_one_neither():
    report = audit(k3_half_detached, "kl_penalty", kind="k3", cases=10)
    assert failing(report) == {"grad"}
    ce = finding(report, "grad").counterexample
    x = np.asarray(ce["ref_logp"]) - np.asarray(ce["logp"])
    yours, ref = np.asarray(ce["your gradient"]), np.asarray(ce["reference gradient"])
    assert yours.shape == x.shape and np.all(yours != 0)
    # d/dlogp of e^x − x − 1 is −(e^x − 1): the reference's is the user's times (1 − e^x)
    np.testing.assert_allclose(ref, yours * (1 - np.exp(x)), atol=1e-12)

    def k1_doubled(logp, ref_logp, mask):
        return torch.where(mask.bool(), 2 * (logp - ref_logp), torch.zeros((), dtype=logp.dtype))
    ce = finding(audit(k1_doubled, "kl_penalty", kind="k1", cases=5), "value").counterexample
    assert "your output" in ce and "your gradient" not in ce and "reference gradient" not in ce


def test_a_raising_counterexample_names_the_exception():
    def refuses_long_rows(logp, ref_logp, mask):
        if logp.shape[1] > 1:
            raise ValueError("rows longer than 1")
        return kl("k1")(logp, ref_logp, mask)
    report = audit(refuses_long_rows, "kl_penalty", kind="k1", cases=5)
    ce = finding(report, "raises").counterexample
    assert ce["your output"] == "raised ValueError: rows longer than 1"


def test_the_report_states_the_conventions_it_audited_against():
    lines = str(audit(kl("k3", 20.0, 10.0), "kl_penalty", profile="verl", cases=3)).splitlines()
    assert lines[1] == "  reference conventions: kind='k3', clamp=(20.0, 10.0)"
    lines = str(audit(kl("k1"), "kl_penalty", kind="k1", cases=3)).splitlines()
    assert lines[1] == "  reference conventions: kind='k1', clamp=None"


def test_the_report_names_the_reference_and_prints_bare_passing_lines():
    report = audit(kl("k3"), "kl_penalty", kind="k3", cases=5)
    assert report.ok and report.ref == "kl_penalty" and report.to_dict()["ref"] == "kl_penalty"
    lines = str(report).splitlines()
    assert lines[0].startswith("audit against kl_penalty, backend torch, 5 cases, seed 0")
    passing = [line for line in lines if line.startswith("  PASS")]
    assert passing and all(re.fullmatch(r"  PASS [a-z_]+ +\d+ cases", line) for line in passing)


def test_a_non_finite_output_is_shown_in_the_counterexample():
    r = audit(lambda logp, ref_logp, mask: logp * float("nan"), "kl_penalty", cases=5)
    ce = finding(r, "finite").counterexample
    assert np.isnan(np.asarray(ce["your output"], dtype=float)).any()
    assert np.isfinite(np.asarray(ce["reference output"], dtype=float)).all()


def test_value_and_gradient_failures_quote_both_numbers():
    report = audit(ppo(lo=0.1, hi=0.1), "ppo_clip_loss", profile="trl", cases=N)
    for check in ("value", "grad"):
        msg = finding(report, check).message
        assert re.search(r"yours -?[0-9.e+-]+, reference -?[0-9.e+-]+", msg), msg
    assert finding(report, "grad").message.startswith("d/dlogp[")


def test_one_case_is_one_case():
    report = audit(kl("k3"), "kl_penalty", kind="k3", cases=1)
    assert ", 1 case, seed 0\n" in str(report)
    assert re.search(r"PASS value +1 case\n", str(report))


def test_a_function_returning_none_is_told_so():
    report = audit(lambda logp, ref_logp, mask: None, "kl_penalty", kind="k3", cases=4)
    f = finding(report, "shape")
    assert f.status == "fail" and f.message.startswith("your function returned None; expected (")
    assert f.counterexample["your output"] == "None: your function returned nothing"


def test_a_pair_is_labelled_by_its_names():
    def wrong_returns(rewards, values, mask):
        adv, _ = gae_loop(1.0, 1.0)(rewards, values, mask)
        return adv, adv
    report = audit(wrong_returns, "gae", gamma=1.0, lam=1.0, cases=N)
    f = finding(report, "value")
    assert f.message.startswith("returns[")
    assert set(f.counterexample["reference output"]) == {"advantages", "returns"}
    assert set(f.counterexample["your output"]) == {"advantages", "returns"}


def test_a_function_that_always_raises_shrinks_to_the_smallest_batch():
    def always(logp, ref_logp, mask):
        raise RuntimeError("broken")
    report = audit(always, "kl_penalty", kind="k3", cases=N)
    ce = finding(report, "raises").counterexample
    assert np.asarray(ce["logp"]).shape == (1, 1)
    assert ce["your output"] == "raised RuntimeError: broken"


def test_a_gradient_counterexample_shows_the_plain_gradient_of_the_sum_and_says_so():
    # k3 with its sign flipped: d k3/d logp = 1 − e^u; at logp −3, ref −4 (u = −1): 0.632
    def flipped(logp, ref_logp, mask):
        u = ref_logp - logp
        return -(torch.exp(u) - 1 - u)
    report = audit(flipped, "kl_penalty", kind="k3", cases=20)
    ce = finding(report, "grad").counterexample
    assert ce["gradient of"] == "the sum of the valid outputs, wrt logp"
    u = np.asarray(ce["ref_logp"]) - np.asarray(ce["logp"])
    m = np.asarray(ce["mask"], dtype=bool)
    np.testing.assert_allclose(np.asarray(ce["reference gradient"])[m], (1 - np.exp(u))[m],
                               rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ce["your gradient"])[m], -(1 - np.exp(u))[m],
                               rtol=1e-12)
    assert "random cotangent" in finding(report, "grad").message
    for f in report.findings:                 # a counterexample's log-probs are log-probs
        for k in ("logp", "ref_logp"):
            if f.counterexample and k in f.counterexample:
                v = np.asarray(f.counterexample[k], dtype=float)
                assert (v[np.asarray(f.counterexample["mask"], dtype=bool)] <= 0).all()
