"""What lies at padding is looked at: a non-finite output there fails (a trainer's
(loss * mask).sum() turns it into NaN), finite values there are fine, log-probs share one
plausible padding as trainers pad them, and the mask check's differing log-probs catch a term
left unmasked between two of them."""
import re

import numpy as np
import torch

from crosscheck import audit
from crosscheck.audit.calls import LOGP_PAD, PAD_VALUES, finite_padding
from tests.audit.corpus import N, auditor_for, finding, kl
from tests.audit.styles import objective_kl_unmasked, per_token_nan_at_padding


def padded(aud, case):
    return not np.asarray(case.arrays["mask"]).all()


def test_a_non_finite_output_at_padding_fails_and_says_why():
    report = audit(per_token_nan_at_padding, "ppo_clip_loss", profile="cleanrl", cases=N)
    f = finding(report, "finite")
    assert f.status == "fail"
    assert re.search(r"^output\[\d+, \d+\] is nan at a masked position: masking by "
                     r"multiplication \(\(loss \* mask\)\.sum\(\)\) would turn the sum into "
                     r"NaN; padding may hold finite values only$", f.message)
    ce = f.counterexample
    assert not np.asarray(ce["mask"]).all()                  # the padding is shown
    assert "nan" in str(ce["your output"])


def test_finite_values_at_padding_are_fine():
    """verl's kl_penalty returns the estimate at every position; masking comes later."""
    def unmasked_k3(logp, ref_logp, mask):
        x = ref_logp - logp
        return torch.exp(x) - x - 1
    report = audit(unmasked_k3, "kl_penalty", kind="k3", cases=N)
    assert report.ok, str(report)


def test_log_probs_share_one_plausible_padding_and_other_inputs_each_their_own():
    aud, case = auditor_for(kl("k3"), "kl_penalty", want=padded, kind="k3")
    m = case.arrays["mask"]
    pads = {k: set(np.unique(case.arrays[k][~m])) for k in ("logp", "ref_logp")}
    assert pads == {"logp": {LOGP_PAD}, "ref_logp": {LOGP_PAD}} and LOGP_PAD <= 0
    assert len(set(PAD_VALUES.values())) == len(PAD_VALUES)
    again = finite_padding(case)
    assert all(np.array_equal(again.arrays[k], case.arrays[k]) for k in ("logp", "ref_logp"))


def test_a_kl_term_left_unmasked_in_an_objective_is_caught():
    """The unmasked KL is 0 at padding where logp equals ref_logp there, as the main checks pad:
    the mask check's differing log-probs make it add to the objective."""
    report = audit(objective_kl_unmasked, "policy_objective", loss="ppo", agg="token-mean",
                   beta=0.1, kl_kind="k3", clip_low=0.2, cases=N)
    f = finding(report, "mask")
    assert f.status == "fail" and "differing log-probs" in f.message, str(report)
    assert finding(report, "value").status == "pass"


def test_a_ratio_left_unmasked_in_a_clip_fraction_is_caught():
    """|ratio − 1| > ε counted over padding too: the ratio there is 1 only where logp and
    old_logp are padded alike."""
    def clipfrac_unmasked(logp, old_logp, advantages, mask):
        ratio = torch.exp(logp - old_logp)
        return float(((ratio - 1).abs() > 0.2).sum() / mask.sum().clamp(min=1))
    report = audit(clipfrac_unmasked, "clip_fraction", profile="cleanrl", cases=N)
    assert finding(report, "mask").status == "fail", str(report)
