"""The diagnosis is sound: a variant is proposed only when the declared conventions fail and the
variant reproduces the function on every probe (padding included); a deviation is named against
the profile that declared the convention; NaN never 'changes' into NaN."""
import pytest
import torch

from crosscheck import audit
from crosscheck.audit.diagnose import diagnose
from tests.audit.corpus import N, auditor_for, finding, global_token_mean, grpo, kl, whiten


def test_a_bug_no_variant_explains_gets_no_diagnosis():
    def scaled(loss, mask, n_tokens_global=None):
        return 1.5 * global_token_mean(loss, mask, n_tokens_global)
    report = audit(scaled, "aggregate", profile="verl", cases=N)
    assert finding(report, "value").status == "fail" and finding(report, "value").diagnosis == ""
    assert finding(report, "grad").diagnosis == ""


def test_a_variant_without_effect_under_the_declared_aggregation_is_never_proposed():
    """Under token-mean, empty_rows changes nothing: a wrong token mean is not 'empty_rows'."""
    def off_by_one(loss, mask, n_tokens_global=None):
        n = int(mask.sum()) if n_tokens_global is None else n_tokens_global
        m = mask.to(loss.dtype)
        return (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum() / \
            (n + 1)
    report = audit(off_by_one, "aggregate", profile="verl", cases=N)
    assert finding(report, "value").status == "fail"          # so a diagnosis was sought
    for f in report.findings:
        assert "empty_rows" not in f.diagnosis, f.diagnosis


def test_the_diagnosis_is_given_only_when_the_declared_conventions_fail_on_the_case():
    """Asked about a case the function gets right, the diagnosis says nothing."""
    aud, case = auditor_for(grpo(1, 1e-4), "group_advantages", profile="trl",
                            want=lambda aud, c: c.params.get("group_size", 0) >= 2)
    assert diagnose(aud, case, "value", "trl") == ("", False)


def test_a_deviation_names_the_profile_that_declared_the_convention():
    report = audit(whiten(0, 1e-8, "var"), "whiten", profile="verl", cases=N)
    assert finding(report, "value").diagnosis == (
        "deviates: it computes whiten with ddof=0 (the verl profile declares ddof=1)")
    report = audit(whiten(0, 1e-8, "var"), "whiten", ddof=1, eps=1e-8, cases=N)
    assert finding(report, "value").diagnosis == (
        "deviates: it computes whiten with ddof=0 (the declared conventions are ddof=1)")
    assert "not a bug" not in finding(report, "value").diagnosis


def test_a_nan_gradient_at_padding_is_not_explained_by_a_convention():
    def row_mean_nan(loss, mask):
        m = mask.to(loss.dtype)
        return ((loss * m).sum(1) / m.sum(1)).mean()          # 0/0 on an empty row
    report = audit(row_mean_nan, "aggregate", mode="seq-mean-token-mean", accumulation="mean",
                   cases=N)
    grad = finding(report, "grad")
    assert grad.status == "fail" and grad.diagnosis == ""


def test_nan_never_changes_into_nan():
    def all_nan(logp, ref_logp, mask):
        return kl("k3")(logp, ref_logp, mask) * float("nan")
    report = audit(all_nan, "kl_penalty", kind="k3", cases=N)
    assert "finite" in {f.check for f in report.failures}
    text = str(report)
    assert "nan → nan" not in text and "nan -> nan" not in text


def test_a_known_bug_and_the_convention_it_amounts_to_are_both_named():
    def adds_back(x, mask):
        m = mask.bool()
        v = x[m]
        mean = v.mean()
        return torch.where(m, (x - mean) * torch.rsqrt(v.var(unbiased=False) + 1e-8) + mean,
                           torch.zeros_like(x))
    report = audit(adds_back, "whiten", profile="openrlhf", shift_mean=False, eps_mode="var",
                   cases=N)
    d = finding(report, "value").diagnosis
    assert d.startswith("matches a known bug: shift_mean=False adds the mean back")
    assert "whiten with restore_mean=True (the openrlhf profile declares restore_mean=False)" in d


@pytest.mark.parametrize("fn, ref, conventions, says", [
    ("dppo_undetached", "dppo_loss", {}, "DPPO's weight min(r, C) is not detached"),
    ("vespo_undetached", "vespo_loss", {}, "VESPO's weight φ(w) is not detached"),
], ids=["dppo", "vespo"])
def test_a_missing_stop_gradient_in_the_newer_losses_is_diagnosed_as_detach(fn, ref,
                                                                             conventions, says):
    """As CISPO's: the stop-gradient factor differentiated is named as not detached, on every
    probe (extreme log-ratios included), not only where finite differences of the value hold."""
    from tests.audit import trust_region_bugs as bugs
    report = audit(getattr(bugs, fn), ref, cases=40, **conventions)
    f = finding(report, "detach")
    assert f.status == "fail" and f.diagnosis.startswith("matches a known bug: " + says), \
        str(report)


def test_dppo_with_its_binary_kl_swapped_is_not_given_an_unsound_convention():
    from tests.audit import trust_region_bugs as bugs
    report = audit(bugs.dppo_kl_swapped, "dppo_loss", divergence="kl", cases=200)
    assert not report.ok
    assert all("divergence='tv'" not in f.diagnosis for f in report.findings)


def test_sapo_with_its_temperatures_swapped_is_named():
    from tests.audit import trust_region_bugs as bugs
    report = audit(bugs.sapo_swapped, "sapo_loss", cases=60)
    assert "tau_pos=1.05, tau_neg=1.0" in finding(report, "value").diagnosis


def test_a_kl_reward_with_another_coefficient_is_diagnosed_by_its_beta():
    def kl_rewards_beta_01(scores, logp, ref_logp, mask):
        m = mask.to(logp.dtype)
        if scores.dim() == 1:                 # one score per sequence, at its last valid token
            last = (m * torch.arange(m.shape[1], dtype=m.dtype)).argmax(-1)
            scores = torch.zeros_like(logp).scatter(1, last[:, None], scores[:, None]) * m
        return (scores - 0.1 * (logp - ref_logp)) * m
    report = audit(kl_rewards_beta_01, "kl_rewards", beta=0.05, kind="k1", cases=N)
    assert finding(report, "value").diagnosis == (
        "deviates: it computes kl_rewards with beta=0.1 (the declared conventions are "
        "beta=0.05)")


def test_a_dppo_with_a_narrower_low_bound_is_diagnosed_by_its_clip_low():
    import ref_torch

    def dppo_low_01(logp, old_logp, advantages, mask):
        return ref_torch.dppo_loss(logp, old_logp, advantages, mask, clip_low=0.1, clip_high=0.2,
                                   clip_c=None, log_ratio_clamp=None)
    report = audit(dppo_low_01, "dppo_loss", clip_low=0.2, clip_high=0.2, clip_c=None,
                   log_ratio_clamp=None, cases=N)
    f = finding(report, "value")
    assert f.status == "fail" and "clip_low=0.1" in f.diagnosis, f.diagnosis


def test_a_kl_against_the_old_policy_is_named_as_kl_anchor():
    import ref_torch

    def anchored_old(logp, old_logp, advantages, mask, ref_logp):
        return ref_torch.policy_objective(logp, old_logp, advantages, mask, ref_logp, beta=0.1,
                                          kl_anchor="old")
    report = audit(anchored_old, "policy_objective", beta=0.1, cases=30, accumulation="none")
    assert "with kl_anchor='old' (the declared conventions are kl_anchor='ref')" in \
        finding(report, "value").diagnosis, str(report)


def test_dppos_log_ratio_clamp_is_named_under_policy_objective():
    """The chosen policy loss's own conventions are varied too: DPPO's log_ratio_clamp (20 by
    default) under loss='dppo', where the cases keep tokens with log r > 20."""
    import ref_torch

    def clamps(logp, old_logp, advantages, mask):
        return ref_torch.policy_objective(logp, old_logp, advantages, mask, loss="dppo",
                                          clip_c=None, log_ratio_clamp=20.0)
    report = audit(clamps, "policy_objective", loss="dppo", clip_c=None, log_ratio_clamp=None,
                   cases=100, accumulation="none")
    assert "with log_ratio_clamp=20.0 (the declared conventions are log_ratio_clamp=None)" in \
        finding(report, "value").diagnosis, str(report)


def test_trls_ratio_weighted_kl_with_its_arguments_swapped_is_named():
    import ref_torch

    def swapped(logp, old_logp, advantages, mask, ref_logp):
        m = mask.bool()
        policy = ref_torch.ppo_clip_loss(logp, old_logp, advantages, mask)
        r = torch.exp(torch.where(m, logp - old_logp, torch.zeros_like(logp)))
        kl = ref_torch.kl_penalty(ref_logp, logp, mask, kind="k3")          # swapped
        return ref_torch.aggregate(policy + 0.1 * r * kl, mask)
    report = audit(swapped, "policy_objective", beta=0.1, kl_weight="ratio", cases=30,
                   accumulation="none")
    assert finding(report, "value").diagnosis.startswith(
        "matches a known bug: the KL estimator's arguments swapped"), str(report)
