"""The live report's verdict rule and scope, on hand-built steps: CONFORMS only when the checks
that carry the verdict ran; what was checked and what was trusted, in one place."""
import json

from crosscheck.live.report import Finding, Report, StepResult


def _report(*steps, errors=()):
    r = Report("t", [], "objective", "row", 10, 1, steps=list(steps), errors=list(errors))
    r.trusted = ["the rewards, as your reward functions returned them"]
    return r


def _step(n, **counts):
    s = StepResult(n)
    for check, (k, bad) in counts.items():
        s.count({"micro_batch_loss": "micro-batch loss"}.get(check, check), k, bad)
    return s


def test_a_run_conforms_only_when_loss_and_gradient_were_each_checked():
    both = _report(_step(1, micro_batch_loss=(2, 0), gradient=(96, 0)))
    assert both.ok is True and both.verdict() == "CONFORMS" and both.inconclusive is None
    # on different steps is enough: each ran on at least one sampled step
    split = _report(_step(1, micro_batch_loss=(2, 0)), _step(2, gradient=(96, 0)))
    assert split.ok is True


def test_a_run_whose_gradient_never_ran_is_inconclusive_with_the_reason():
    s1 = _step(1, advantages=(8, 0), micro_batch_loss=(2, 0))
    s1.skipped["gradient"] = "top_entropy_quantile=0.5 (the entropy mask)"
    s2 = _step(2, advantages=(8, 0), micro_batch_loss=(2, 0))
    s2.skipped["gradient"] = "top_entropy_quantile=0.5 (the entropy mask)"
    r = _report(s1, s2)
    assert r.ok is None and r.verdict() == "INCONCLUSIVE"
    assert r.inconclusive == ("gradient checked at no sampled step (top_entropy_quantile=0.5 "
                              "(the entropy mask))")
    assert "INCONCLUSIVE" in r.text().splitlines()[0]
    assert "  inconclusive: gradient checked at no sampled step" in r.text()
    d = json.loads(r.json())
    assert d["ok"] is None and d["verdict"] == "INCONCLUSIVE"
    assert d["inconclusive"].startswith("gradient checked at no sampled step")


def test_advantages_alone_never_make_a_run_conform():
    r = _report(_step(1, advantages=(8, 0)))
    assert r.ok is None
    assert "micro-batch loss checked at no sampled step" in r.inconclusive
    assert "gradient checked at no sampled step" in r.inconclusive


def test_a_run_with_no_checked_step_is_inconclusive_and_names_the_audit_errors():
    r = _report(errors=["step 1: RuntimeError: planted"])
    assert r.ok is None
    assert r.inconclusive.endswith("no step was checked); 1 audit error")


def test_a_deviation_fails_the_run_even_when_the_gradient_never_ran():
    s = _step(1, advantages=(8, 1))
    s.findings.append(Finding(1, "advantages", "deviation", "differ"))
    r = _report(s)
    assert r.ok is False and r.verdict() == "DEVIATES"
    assert json.loads(r.json())["inconclusive"] is None


def test_the_report_says_in_one_place_what_it_checked_and_what_it_trusted():
    s = _step(1, micro_batch_loss=(2, 0), gradient=(96, 0))
    s.skipped["metrics"] = "logged metrics are checked for token-level clipped losses"
    r = _report(s, _step(2, micro_batch_loss=(2, 0), gradient=(96, 0)))
    checked = r.checked()
    assert any(c.startswith("gradient: ") and c.endswith("(192 comparisons on 2 steps)")
               for c in checked)
    assert ("metrics: not checked (logged metrics are checked for token-level clipped "
            "losses)") in checked
    assert not any(c.startswith("advantages") for c in checked)      # neither ran nor skipped
    text = r.text()
    assert text.index("  checked:") < text.index("  trusted without checking:")
    assert "    the rewards, as your reward functions returned them" in text
    d = json.loads(r.json())
    assert d["checked"] == checked and d["trusted"] == r.trusted
