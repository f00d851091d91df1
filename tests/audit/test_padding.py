"""Padding inside each input's domain: the main and mask checks pad as trainers do; garbage is
the robustness check's alone and never fails an audit."""
import numpy as np
import torch

from crosscheck.audit import audit
from crosscheck.audit.calls import (LOGP_PAD, finite_padding, log_probs_in_domain, pad_logits,
                                    pad_value)
from crosscheck.check import cases as cases_mod


def finding(report, check):
    return next(f for f in report.findings if f.check == check)


def test_padding_fills_empty_rows_and_shares_one_plausible_log_prob():
    m = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]], dtype=bool)
    adv = np.array([0.5, np.nan, -2.0])
    logp = np.where(m, -1.0, np.nan)
    old = np.where(m, -2.0, np.inf)
    out = finite_padding(cases_mod.Case("c", dict(advantages=adv, logp=logp, old_logp=old,
                                                  mask=m), {})).arrays
    assert LOGP_PAD <= 0
    np.testing.assert_array_equal(out["advantages"], [0.5, pad_value("advantages"), -2.0])
    np.testing.assert_array_equal(out["logp"], np.where(m, -1.0, LOGP_PAD))
    np.testing.assert_array_equal(out["old_logp"], np.where(m, -2.0, LOGP_PAD))


def test_padding_gives_masked_logits_finite_values():
    m = np.array([[True, False, False]])
    logits = np.full((1, 3, 4), np.nan)
    logits[0, 0] = [0.0, 1.0, 2.0, 3.0]
    out = finite_padding(cases_mod.Case("c", dict(logits=logits, mask=m), {})).arrays
    assert np.isfinite(out["logits"]).all()
    np.testing.assert_array_equal(out["logits"][0, 0], [0.0, 1.0, 2.0, 3.0])


def test_positive_log_probs_are_shifted_below_zero_keeping_every_log_ratio():
    m = np.array([[True, True, False]])
    arrays = dict(logp=np.array([[3.0, -1.0, 50.0]]), old_logp=np.array([[1.0, 2.5, 0.0]]),
                  advantages=np.array([1.0]), mask=m)
    out = log_probs_in_domain(arrays)
    assert out["logp"][m].max() <= 0 and out["old_logp"][m].max() <= 0
    np.testing.assert_allclose(out["logp"] - out["old_logp"],
                               arrays["logp"] - arrays["old_logp"])
    assert out["advantages"] is arrays["advantages"]
    same = log_probs_in_domain(dict(logp=np.array([[-1.0]]), mask=np.array([[True]])))
    np.testing.assert_array_equal(same["logp"], [[-1.0]])


def _per_token(advantages, like):
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def masked_by_multiplying(logp, old_logp, advantages, mask):
    """Textbook CleanRL/TRL-style PPO: exp of the log-ratio everywhere, masked by a product."""
    r = torch.exp(logp - old_logp)
    a = _per_token(advantages, logp)
    loss = -torch.min(r * a, torch.clamp(r, 0.8, 1.2) * a)
    m = mask.to(logp.dtype)
    return (loss * m).sum() / m.sum()


def test_a_textbook_ppo_masking_by_product_conforms_with_a_robustness_note():
    report = audit(masked_by_multiplying, "policy_objective", loss="ppo", agg="token-mean",
                   beta=0.0, cases=48, accumulation="none")
    assert report.ok, str(report)
    g = finding(report, "garbage")
    assert g.status == "warn" and g.grade == "robustness", str(report)
    assert finding(report, "mask").status == "pass"
    # its counterexample holds the garbage it was given, and replays as printed
    ce = g.counterexample
    mask = np.array(ce["mask"], dtype=bool)
    logp = np.array(ce["logp"], dtype=np.float64)
    assert (~mask).any() and not np.isfinite(logp[~mask]).all() or (np.abs(logp[~mask]) >= 5).all()
    again = masked_by_multiplying(torch.tensor(logp), torch.tensor(np.array(ce["old_logp"],
                                                                            dtype=np.float64)),
                                  torch.tensor(np.array(ce["advantages"], dtype=np.float64)),
                                  torch.tensor(mask))
    printed = ce["your output"]
    assert (np.isnan(float(again)) and (printed is None or not np.isfinite(float(printed))
                                         if not isinstance(printed, str) else True)) or \
        np.isclose(float(again), float(printed))


def leaks_a_log_ratio(logp, old_logp, advantages, mask):
    """Right on valid tokens, plus a log-ratio term summed over the padding: zero wherever the
    padding shares one log-prob, as the main checks pad."""
    m = mask.to(logp.dtype)
    return masked_by_multiplying(logp, old_logp, advantages, mask) + \
        0.1 * ((logp - old_logp) * (1 - m)).sum() / m.sum()


def test_an_unmasked_term_fails_the_mask_check_with_in_domain_padding():
    report = audit(leaks_a_log_ratio, "policy_objective", loss="ppo", agg="token-mean", beta=0.0,
                   cases=48, accumulation="none")
    assert finding(report, "value").status == "pass", str(report)
    f = finding(report, "mask")
    assert f.status == "fail" and f.grade == "deviation", str(report)
    assert "differing log-probs" in f.message
    ce = f.counterexample
    mask = np.array(ce["mask"], dtype=bool)
    padded = np.array(ce["logp"], dtype=np.float64)[~mask]
    assert np.isfinite(padded).all() and (padded <= 0).all()
    assert report.verdict == "DOES NOT CONFORM"


def test_the_second_padding_scales_the_first_except_for_log_probs():
    for name in ("advantages", "values", "returns", "rewards"):
        assert pad_value(name, 3.0) == 3.0 * pad_value(name)
    assert pad_value("logp", 3.0) == pad_value("logp") == LOGP_PAD


def test_padding_logits_are_a_ramp_centred_on_zero_spanning_the_base():
    """Finite, distinct and centred, so a masked row's softmax is spread evenly about its middle
    token whatever the vocabulary size; one token gets half the base."""
    for V in (2, 3, 7):
        for base in (1.0, 4.0):
            row = pad_logits((2, 3, V), base)
            assert row.shape == (V,) and len(set(row.tolist())) == V
            assert row.min() == -base and row.max() == base
            assert abs(row.sum()) < 1e-12 * base * V
    np.testing.assert_array_equal(pad_logits((1, 1), 4.0), [2.0])
