"""No false alarms: correct implementations conform, every check runs on every case."""

import numpy as np
import pytest

from crosscheck import audit
from tests.audit.corpus import (CORRECT, N, SEEDS, finding, global_seq_mean, grpo, kl,
                                 minimind_style)


@pytest.mark.parametrize("profile, ref, fn, extra", CORRECT,
                         ids=[f"{p}-{r}-{i}" for i, (p, r, _, _) in enumerate(CORRECT)])
def test_correct_implementations_conform_under_their_profile(profile, ref, fn, extra):
    for seed in SEEDS:
        report = audit(fn, ref, profile=profile, cases=N, seed=seed, **extra)
        assert report.ok, str(report)
        domain = {why: n for why, n in report.skipped.items() if "profile's domain" in why}
        if fn is minimind_style.grpo_advantages:     # takes group_size only: by design, the
            assert report.n_cases >= N // 3          # cases with shuffled group_ids are skipped
        else:                  # every case runs but those outside the trainer's domain
            assert report.skipped == domain and report.n_cases + sum(domain.values()) == N
            assert report.n_cases >= N // 5, report.skipped


def test_numpy_backend():
    def fn(x, mask):
        m = mask.astype(bool)
        v = x[m]
        return np.where(m, (x - v.mean()) / np.sqrt(v.var() + 1e-8), 0.0)
    assert audit(fn, "whiten", profile="minimind", backend="numpy", cases=N).ok


def test_a_correct_audit_reports_every_check_on_every_case():
    report = audit(kl("k3"), "kl_penalty", kind="k3", cases=20)
    assert report.ok and report.skipped == {}
    checks = {f.check: f for f in report.findings}
    for check in ("raises", "shape", "finite", "value", "grad"):
        assert checks[check].status == "pass" and checks[check].cases == 20, check
    report = audit(grpo(1, 1e-6, alone="keep"), "group_advantages", profile="verl",
                   cases=N)                                                        # ids only
    assert report.ok and report.skipped == {} and finding(report, "value").cases == N


def test_micro_batches_receive_the_global_sequence_count():
    report = audit(global_seq_mean, "aggregate", mode="seq-mean-token-mean",
                   empty_rows="exclude", accumulation="sum", cases=N)
    assert report.ok, str(report)
    assert finding(report, "microbatch").status == "pass"
    assert finding(report, "microbatch").cases > 0
