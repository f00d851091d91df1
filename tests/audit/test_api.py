"""The audit API: usage errors, the adapter contract, the closeness rule, deadlines."""
import json

import numpy as np
import pytest
import torch

from crosscheck import assert_conforms, audit
from crosscheck.audit import AuditUsageError
from tests.audit.corpus import (N, failing, finding, gae_loop, grpo, kl, whiten)
from tests.helpers import run_cli


def test_the_reference_undefined_on_a_case_is_skipped_not_a_crash():
    report = audit(grpo(0, 0.0), "group_advantages", profile="minimind", cases=N, eps=0.0)
    assert any("reference is undefined" in why for why in report.skipped)


def test_usage_errors():
    with pytest.raises(AuditUsageError, match="ref is 'grpo'"):
        audit(grpo(0, 1e-4), "grpo")
    with pytest.raises(AuditUsageError, match="profile is 'deepspeed'"):
        audit(grpo(0, 1e-4), "group_advantages", profile="deepspeed")
    with pytest.raises(AuditUsageError, match="profile 'cleanrl' defines no conventions for "
                                              "'group_advantages'") as exc:
        audit(grpo(0, 1e-4), "group_advantages", profile="cleanrl")
    from crosscheck.audit.profiles import PROFILES      # it lists what the profile does define
    defined = PROFILES["cleanrl"].defines()
    assert "group_advantages" not in defined and len(defined) >= 3
    assert str(exc.value).endswith("it defines: " + ", ".join(defined))
    with pytest.raises(AuditUsageError, match="gae needs gamma, lam"):
        audit(gae_loop(1.0, 1.0), "gae")
    with pytest.raises(AuditUsageError, match="'gamma_x' is not a convention of whiten"):
        audit(whiten(0, 1e-8, "var"), "whiten", gamma_x=1)


def test_assert_conforms_raises_with_the_report():
    assert assert_conforms(grpo(0, 1e-4), "group_advantages", profile="minimind", cases=N).ok
    with pytest.raises(AssertionError, match="DOES NOT CONFORM"):
        assert_conforms(grpo(0, 1e-4), "group_advantages", profile="verl", cases=N)


def test_conventions_with_numpy_values_serialise():
    report = audit(kl("k3"), "kl_penalty", cases=2, clamp=(np.float64(10.0), None))
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["conventions"]["clamp"] == [10.0, None]


def test_an_adapter_whose_signature_cannot_be_read_is_offered_every_keyword():
    class Opaque:                    # e.g. a compiled extension: inspect.signature raises
        __signature__ = "not a signature"

        def __call__(self, logp, ref_logp, mask=None, **_):
            return kl("k3")(logp, ref_logp, mask)

    report = audit(Opaque(), "kl_penalty", profile="minimind", cases=6)
    assert report.ok, str(report)


# ================================================================ the audit's own plumbing
def test_the_reference_takes_group_size_over_the_equivalent_ids():
    from crosscheck.audit.calls import reference_args
    ids, r = np.array([0, 0, 1, 1]), np.arange(4.0)
    assert set(reference_args(dict(rewards=r, group_size=2, group_ids=ids))) == \
        {"rewards", "group_size"}
    assert set(reference_args(dict(rewards=r, group_ids=ids))) == {"rewards", "group_ids"}


def test_an_unknown_profile_lists_the_known_ones():
    from crosscheck.audit.profiles import PROFILES
    with pytest.raises(AuditUsageError) as exc:
        audit(grpo(0, 1e-4), "group_advantages", profile="deepspeed")
    assert str(exc.value).endswith("expected one of " + ", ".join(PROFILES))


def test_an_adapter_without_group_ids_runs_the_consecutive_cases_and_skips_the_rest():
    by_ids = grpo(1, 1e-6, alone="keep")

    def by_size(rewards, group_size, valid=None):
        return by_ids(rewards, torch.arange(len(rewards)) // group_size, valid)
    report = audit(by_size, "group_advantages", profile="verl", cases=N)
    assert report.ok, str(report)
    ran = finding(report, "value").cases
    assert list(report.skipped) == ["your function does not accept group_ids="]
    assert ran > 0 and report.skipped["your function does not accept group_ids="] == N - ran
    d = report.to_dict()
    assert d["ref"] == "group_advantages" and d["skipped"] == report.skipped
    assert json.loads(json.dumps(d))["skipped"] == report.skipped


def test_an_unknown_convention_lists_the_known_ones():
    with pytest.raises(AuditUsageError) as exc:
        audit(whiten(0, 1e-8, "var"), "whiten", gamma_x=1)
    assert str(exc.value).endswith("its keywords are ddof, eps, eps_mode, shift_mean, "
                                   "restore_mean")


@pytest.mark.parametrize("timeout", ["1", True, 0, -1.0, float("nan"), float("inf")])
def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout):
    with pytest.raises(AuditUsageError, match=r"timeout is .*; expected a positive number"):
        audit(kl("k1"), "kl_penalty", kind="k1", cases=2, timeout=timeout)


# ================================================================ robustness
def test_raising_wrong_shape_and_nan_are_reported_not_raised():
    def boom(**_):
        raise RuntimeError("my trainer broke")
    r = audit(boom, "kl_penalty", cases=5)
    assert "raises" in failing(r) and "my trainer broke" in finding(r, "raises").message
    assert finding(r, "kl_direction").status == "fail"
    assert finding(r, "kl_direction").message == "RuntimeError: my trainer broke"
    r = audit(lambda logp, ref_logp, mask: (logp - ref_logp).sum(1), "kl_penalty", cases=5)
    assert "shape" in failing(r) and "expected" in finding(r, "shape").message
    r = audit(lambda logp, ref_logp, mask: logp * float("nan"), "kl_penalty", cases=5)
    assert "finite" in failing(r)


def test_a_long_audit_shows_progress_on_the_stream_it_is_given_and_is_silent_without():
    import io
    stream = io.StringIO()

    def k1(logp, ref_logp, mask):
        return logp - ref_logp
    report = audit(k1, "kl_penalty", kind="k1", cases=5, progress=stream)
    shown = stream.getvalue()
    assert report.ok and "audit: case 1/5" in shown and shown.endswith("\r\033[K")
    code, out, err = run_cli(["audit", "examples/buggy.py:kl_sign_flipped", "--ref",
                              "kl_penalty", "--cases", "5"])
    assert "\r" not in err and "audit: case" not in err + out       # piped: silent


def test_an_optional_input_a_function_requires_gets_the_value_that_means_none():
    # a GAE that requires last_value, dones or valid is called with what a case without them
    # has: no bootstrap (zeros per row), no episode ends, every row valid
    from crosscheck.audit import calls
    data = dict(rewards=np.ones((2, 3)), mask=np.ones((2, 3), bool))
    np.testing.assert_array_equal(calls.neutral("last_value", data), np.zeros(2))
    np.testing.assert_array_equal(calls.neutral("dones", data), np.zeros((2, 3), bool))
    np.testing.assert_array_equal(calls.neutral("valid", data), np.ones(2, bool))
    assert calls.neutral("last_value", dict(mask=data["mask"])) is None


def test_a_batch_is_degenerate_only_with_a_group_of_one_or_too_few_tokens():
    # where a trainer may rightly refuse a batch: groups by id or by size, and the mask
    from crosscheck.audit import calls
    assert calls.degenerate(dict(group_ids=np.array([0, 0, 1, 1]))) is None
    assert calls.degenerate(dict(group_ids=np.array([0, 0, 1]))) == "a group of one"
    assert calls.degenerate(dict(group_size=1)) == "a group of one"
    assert calls.degenerate(dict(mask=np.array([[True, True], [True, False]]))) == \
        "a one-token row"
    assert calls.degenerate(dict(mask=np.array([[True, False]]))) == "fewer than two valid tokens"
