"""No false alarms on correct code: outputs that carry no gradient by design, float32 code,
float32 noise in the KL direction, a KL used as a reward, deliberate refusals of degenerate
batches, micro-batches without a valid token, and the trainer's own accumulation."""
import numpy as np
import pytest
import torch

from crosscheck import audit, tolerances
from crosscheck.audit import AuditUsageError
from crosscheck.audit.properties import microbatch_check
from tests.audit.corpus import (N, auditor_for, finding, gae_loop, global_token_mean, kl, ppo)
from tests.audit.styles import grpo_float32, token_mean_global


# ================================================================ no gradient by design
def test_advantages_computed_under_no_grad_are_information_not_a_failure():
    report = audit(torch.no_grad()(gae_loop(0.99, 0.95)), "gae", profile="cleanrl", cases=N)
    assert report.ok, str(report)
    grad = finding(report, "grad")
    assert grad.status == "info" and grad.cases == N
    assert grad.message == ("not checked: your output carries no gradient, as trainers compute "
                            "it (this reference is not differentiated by trainers)")
    assert "INFO grad" in str(report)


def test_a_metric_returned_as_a_python_float_is_information():
    def approx_kl(logp, old_logp, mask):
        m = mask.bool()
        n = int(m.sum())
        k1 = torch.where(m, old_logp - logp, torch.zeros((), dtype=logp.dtype))
        return float(k1.detach().sum()) / n if n else 0.0
    report = audit(approx_kl, "approx_kl", profile="verl", cases=N)
    assert report.ok and finding(report, "grad").status == "info", str(report)


def test_a_loss_without_a_gradient_still_fails():
    report = audit(torch.no_grad()(ppo()), "ppo_clip_loss", profile="cleanrl", cases=N)
    assert report.verdict == "DOES NOT CONFORM"
    grad = finding(report, "grad")
    assert grad.status == "fail" and grad.message.startswith("your output does not depend on "
                                                             "logp")


def grpo_sqrt_of_variance(rewards, group_ids):
    """Group advantages with σ = sqrt(mean of squared deviations): at σ = 0 autograd gives
    sqrt's infinite slope times a zero, NaN."""
    out = torch.zeros_like(rewards)
    for g in torch.unique(group_ids):
        i = group_ids == g
        r = rewards[i]
        if r.numel() > 1:
            out[i] = (r - r.mean()) / (((r - r.mean()) ** 2).mean().sqrt() + 1e-4)
    return out


def test_a_nan_gradient_where_the_reference_has_a_kink_is_no_failure():
    """At σ = 0 (an all-equal group) the reference is not differentiable either: that position
    is not judged; everywhere else the gradient must agree."""
    from crosscheck.audit.calls import reference_args

    def kinked(aud, case):                      # an all-equal group of two or more
        data, _ = aud.inputs_for(case)
        return data is not None and aud.entry.kinks(reference_args(data), aud.params)[
            "rewards"].any()
    aud, case = auditor_for(grpo_sqrt_of_variance, "group_advantages", want=kinked, ddof=0,
                            eps=1e-4)
    assert "an all-equal group" in case.label
    data, _ = aud.inputs_for(case)
    raw, leaves = aud.call(data, grad_wrt=("rewards",))
    raw.backward(torch.ones_like(raw))
    assert torch.isnan(leaves["rewards"].grad).any()           # the function's own NaN
    grad = [o for o in aud.run_case(case) if o.check == "grad"]
    assert grad and all(o.ok and not o.warn for o in grad), grad


# ================================================================ precision
def f32_cast_back(rewards, group_ids):
    """float32 arithmetic whose result is cast back to float64: its dtype hides its precision."""
    return grpo_float32(1, 1e-4)(rewards, group_ids).double()


def test_float32_arithmetic_cast_back_is_judged_at_float32_when_declared():
    undeclared = audit(f32_cast_back, "group_advantages", profile="trl", cases=N)
    assert undeclared.verdict == "DOES NOT CONFORM"       # float64 tolerance: float32 rounding
    declared = audit(f32_cast_back, "group_advantages", profile="trl", cases=N,
                     precision="float32")
    assert declared.ok, str(declared)
    assert declared.tolerance["why"] == ("the float32 row of the tolerance table: "
                                         "precision='float32' declared")


def test_float32_rounding_is_not_mistaken_for_groups_taken_by_position():
    report = audit(grpo_float32(1, 1e-4), "group_advantages", profile="trl", cases=N)
    assert report.ok and finding(report, "permutation").status == "pass", str(report)


def test_float32_rounding_judged_by_the_value_check_is_not_counted_again_by_permutation():
    # float32 arithmetic cast back to float64, judged at float64: the value check fails with
    # the float32 hint; the shuffle's own float32 rounding is that same finding, not a second
    inner = grpo_float32(0, 1e-4)

    def cast_back(rewards, group_ids):
        return inner(rewards, group_ids).double()
    report = audit(cast_back, "group_advantages", profile="minimind", cases=200)
    assert finding(report, "value").status == "fail" and "float32 row" in \
        finding(report, "value").message
    assert finding(report, "permutation").status == "pass", str(report)
    assert report.verdict_line() == "verdict: DOES NOT CONFORM (1 failing check: value)"


def test_given_tolerances_replace_the_rows():
    report = audit(kl("k3"), "kl_penalty", cases=4, rtol=1e-3)
    assert report.tolerance["rtol"] == 1e-3
    assert report.tolerance["atol"] == tolerances.get("audit", "float64").atol
    assert report.tolerance["why"] == "as given"


@pytest.mark.parametrize("given, said, scale, shift", [
    (dict(rtol=1e9), "rtol 1e+09", 1.001, 0.0), (dict(atol=0.5), "atol 0.5", 1.0, 0.01),
    (dict(rtol=1e-3, atol=1e-3), "rtol 0.001, atol 0.001", 1.001, 0.0)])
def test_a_tolerance_too_wide_to_tell_conventions_apart_is_said_in_the_verdict(given, said,
                                                                             scale, shift):
    def wrong(logp, ref_logp, mask):                   # k3 off by 1e-3 or by 0.01: wrong
        return (kl("k3")(logp, ref_logp, mask) * scale + shift) * mask
    report = audit(wrong, "kl_penalty", kind="k3", cases=4, **given)
    warning = (f"the tolerance given ({said}) is wider than 0.0001, the smallest difference "
               f"between two conventions the audit must tell apart: a wrong function can pass")
    assert report.verdict_line() == f"verdict: CONFORMS, but {warning}"
    assert f"  WARN tolerance: {warning}" in str(report).splitlines()
    assert report.to_dict()["tolerance"]["warning"] == warning
    assert audit(wrong, "kl_penalty", kind="k3", cases=4, rtol=1e-4).tolerance.get(
        "warning") is None                       # at the bound: no warning
    assert audit(wrong, "kl_penalty", kind="k3", cases=4).verdict == "DOES NOT CONFORM"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_code_is_refused_with_what_to_do(dtype):
    def half(logp, ref_logp, mask):
        return kl("k3")(logp, ref_logp, mask).to(dtype)
    with pytest.raises(AuditUsageError, match="judges float64 and float32 code; cast its outputs "
                                              "to float32 and pass precision='float32'"):
        audit(half, "kl_penalty", cases=2)


# ================================================================ the KL direction
def k1_float32(logp, ref_logp, mask):
    return (logp.float() - ref_logp.float()) * mask


def k3_float32(logp, ref_logp, mask):
    x = ref_logp.float() - logp.float()
    return (torch.exp(x) - x - 1) * mask


def test_float32_noise_in_a_k1_loss_is_no_gradient_not_a_flipped_sign():
    report = audit(k1_float32, "kl_penalty", kind="k1", cases=N)
    f = finding(report, "kl_direction")
    assert f.status == "warn" and "no expected gradient (k1 used as a loss?)" in f.message
    assert report.ok


def test_k1_used_as_a_reward_pulls_toward_the_reference():
    report = audit(k1_float32, "kl_penalty", kind="k1", kl_use="reward", cases=N)
    assert finding(report, "kl_direction").status == "pass" and report.ok
    assert "KL term: judged as a reward" in str(report)


def k3_clamped_float32(logp, ref_logp, mask):
    """verl's low_var_kl in float32: the log-ratio clamped to ±20, the estimate to ±10."""
    x = (ref_logp.float() - logp.float()).clamp(-20, 20)
    return (torch.exp(x) - x - 1).clamp(-10, 10) * mask


@pytest.mark.parametrize("kind", ["k2", "k3"])
def test_k2_and_k3_used_as_rewards_are_judged_against_the_same_use_of_the_reference(kind):
    """As a detached reward, k2's and k3's expected gradients are biased (they need not lower
    KL(π‖ref) + KL(ref‖π) at every step): that is their nature, not a flipped sign."""
    def openrlhf_style(logp, ref_logp, mask):
        x = logp.float() - ref_logp.float()
        value = 0.5 * x ** 2 if kind == "k2" else (-x.clamp(min=-10)).exp() - 1 + x.clamp(min=-10)
        return value.clamp(-10, 10) * mask
    report = audit(openrlhf_style, "kl_penalty", profile="openrlhf", kind=kind, cases=N)
    assert report.ok and finding(report, "kl_direction").status == "pass", str(report)

    def flipped(logp, ref_logp, mask):
        return -openrlhf_style(logp, ref_logp, mask)
    report = audit(flipped, "kl_penalty", profile="openrlhf", kind=kind, cases=N)
    f = finding(report, "kl_direction")
    assert f.status == "fail" and f.message.endswith("a flipped sign")


def test_a_float32_k3_loss_moves_toward_the_reference():
    report = audit(k3_clamped_float32, "kl_penalty", profile="verl", cases=N)
    assert finding(report, "kl_direction").status == "pass" and report.ok, str(report)


def test_a_float32_value_beyond_float32s_range_is_named_as_such():
    """Unclamped k3 at a log-ratio of 90..120 is ~1e39..1e52: float32 overflows there."""
    report = audit(k3_float32, "kl_penalty", kind="k3", cases=N)
    f = finding(report, "finite")
    # inputs no trainer produces, at the edge of float32's range: a robustness note
    assert f.status == "warn" and f.grade == "robustness"
    assert "(beyond float32's range: float32 code overflows here)" in f.message


def test_float32_ppo_without_a_log_ratio_clamp_overflows_only_beyond_float32s_range():
    from tests.audit.styles import ppo_float32_overflow
    report = audit(ppo_float32_overflow, "ppo_clip_loss", profile="trl", cases=N)
    f = finding(report, "finite")
    assert f.status == "warn" and f.grade == "robustness"
    assert report.verdict == "CONFORMS", str(report)


def test_each_profile_states_how_its_trainer_uses_the_kl_term():
    report = audit(lambda logp, ref_logp, mask: (logp - ref_logp).clamp(-10, 10) * mask,
                   "kl_penalty", profile="openrlhf", cases=6)
    assert report.ok, str(report)
    assert any(n.startswith("KL term: judged as a reward (openrlhf: ") for n in report.notes)
    assert finding(report, "kl_direction").status == "pass"


# ================================================================ deliberate refusals
def refuses_short_rows(x, mask):
    """Whitening that refuses rows with fewer than two valid tokens, and empty batches."""
    if not mask.any():
        raise AssertionError("empty batch")
    if mask.sum(-1).min() < 2:
        raise ValueError("every row needs two valid tokens")
    m = mask.bool()
    v = x[m]
    return torch.where(m, (x - v.mean()) / torch.sqrt(v.var(unbiased=False) + 1e-8),
                       torch.zeros((), dtype=x.dtype))


def test_a_clear_refusal_of_a_degenerate_batch_is_a_warning_listing_each_exception():
    report = audit(refuses_short_rows, "whiten", profile="minimind", cases=N)
    assert report.ok, str(report)
    f = finding(report, "raises")
    assert f.status == "warn"
    assert f.message.startswith("your function refuses degenerate batches (")
    here = "tests/audit/test_false_alarms.py"
    where = {e["where"].split(":")[0] for e in f.exceptions}
    assert where == {here}
    kinds = {(e["type"], e["message"]) for e in f.exceptions}
    assert ("ValueError", "every row needs two valid tokens") in kinds
    assert all(e["degenerate"] and e["cases"] >= 1 for e in f.exceptions)
    text = str(report)
    for e in f.exceptions:
        assert f"{e['type']}: {e['message']} at {e['where']} (" in text


def test_an_unclear_error_on_a_degenerate_batch_is_still_a_failure():
    def crashes(x, mask):
        if mask.sum(-1).min() < 2:
            raise RuntimeError("index out of range")
        return refuses_short_rows(x, mask)
    report = audit(crashes, "whiten", profile="minimind", cases=N)
    assert finding(report, "raises").status == "fail"


def test_a_refusal_of_an_ordinary_batch_is_a_failure():
    def refuses_all(x, mask):
        raise ValueError("not today")
    report = audit(refuses_all, "whiten", profile="minimind", cases=N)
    assert finding(report, "raises").status == "fail"


# ================================================================ micro-batches
def test_a_micro_batch_without_a_valid_token_adds_nothing_and_fails_nothing():
    aud, case = auditor_for(token_mean_global, "aggregate", profile="verl",
                            want=lambda aud, c: "first half of the rows empty" in c.label and
                            c.shape()[0] % 2 == 0)
    assert not np.asarray(case.arrays["mask"])[: case.shape()[0] // 2].any()
    outcomes = microbatch_check(aud, case)
    assert outcomes and all(o.ok and not o.warn for o in outcomes), outcomes


def test_the_profiles_accumulation_is_simulated_and_stated():
    report = audit(token_mean_global, "aggregate", profile="verl", cases=N)
    assert report.ok and finding(report, "microbatch").cases > 0
    assert report.notes[0].startswith("micro-batches: sum of micro-batch gradients, as verl "
                                      "accumulates (verl/workers/utils/losses.py")
    assert "global counts: your function receives n_tokens_global" in report.notes[1]


def test_under_a_summing_trainer_a_function_without_global_counts_is_told_how_to_get_them():
    report = audit(lambda loss, mask: global_token_mean(loss, mask), "aggregate",
                   profile="verl", cases=N)
    f = finding(report, "microbatch")
    assert f.status == "fail"
    assert f.message.endswith("your function takes no global count: a trainer that sums "
                              "micro-batch gradients normalises each by the whole batch's "
                              "counts, which the audit passes to a function that names "
                              "n_tokens_global or n_sequences_global")
    assert ("global counts: your function names neither n_tokens_global nor "
            "n_sequences_global, so each micro-batch can only normalise by its own counts"
            ) in report.notes


def test_without_a_declared_accumulation_a_split_dependent_function_fails_under_every_model():
    # a token mean over its own tokens: under the sum (each micro-batch given the whole
    # batch's counts, which it cannot take) and under the mean of micro-batches, the gradient
    # differs from the full batch's: wrong under any trainer that splits batches
    report = audit(lambda loss, mask: global_token_mean(loss, mask), "aggregate",
                   mode="token-mean", cases=N)
    assert report.notes[0].startswith("micro-batches: not declared")
    f = finding(report, "microbatch")
    assert f.status == "fail" and f.message.startswith(
        "split-dependent under every accumulation a trainer uses (none declared)")
    assert "by summing" in f.message and "by averaging" in f.message
    assert f.message.endswith("declare accumulation='none'")
    assert not report.ok
    single = audit(lambda loss, mask: global_token_mean(loss, mask), "aggregate",
                   mode="token-mean", accumulation="none", cases=N)
    assert single.ok and all(f.check != "microbatch" for f in single.findings)


def test_a_loss_that_takes_the_global_count_but_divides_locally_fails_undeclared():
    def local(loss, mask, n_tokens_global=None):
        return global_token_mean(loss, mask)          # n_tokens_global ignored
    report = audit(local, "aggregate", mode="token-mean", cases=N)
    assert finding(report, "microbatch").status == "fail" and not report.ok


def test_undeclared_a_function_that_fits_one_accumulation_conforms_and_says_which():
    report = audit(token_mean_global, "aggregate", mode="token-mean", cases=N)
    f = finding(report, "microbatch")
    assert f.status == "info" and report.ok
    assert f.message.startswith("conforms if your trainer accumulates by summing micro-batch "
                                "gradients, each normalised by the whole batch's counts")


def test_each_micro_batch_gets_its_own_counts_under_mean_accumulation():
    seen = []

    def recording(loss, mask, n_tokens_global):
        seen.append((int(mask.sum()), n_tokens_global))
        return global_token_mean(loss, mask, n_tokens_global)
    audit(recording, "aggregate", mode="seq-mean-token-sum", accumulation="mean", cases=6)
    assert seen and all(local == given for local, given in seen)
    seen.clear()
    audit(recording, "aggregate", mode="token-mean", accumulation="sum", cases=6)
    assert any(local < given for local, given in seen)       # the whole batch's count


def test_a_profile_loss_that_accumulates_unlike_its_profile_is_simulated_its_way():
    """TRL's loss_type='grpo' (its GSPO objective) divides by the accumulation steps."""
    from crosscheck.audit.profiles import rule
    r = rule("trl", "policy_objective", "gspo")
    assert r.accumulation[0] == "mean"
    report = audit(lambda **kw: kw["logp"].sum() * 0, "policy_objective", profile="trl",
                   loss="gspo", cases=2)
    assert report.notes[0].startswith("micro-batches: mean of micro-batch gradients, as trl "
                                      "accumulates (trl/trainer/grpo_trainer.py::_compute_loss:"
                                      " loss_type 'grpo'")


def test_numpy_arrays_stay_numpy():
    seen = []

    def fn(x, mask):
        seen.append(type(x))
        m = mask.astype(bool)
        v = x[m]
        return np.where(m, (x - v.mean()) / np.sqrt(v.var() + 1e-8), 0.0)
    assert audit(fn, "whiten", profile="minimind", backend="numpy", cases=4).ok
    assert set(seen) == {np.ndarray}


def _kl_cov_last_of_ties(logp, old_logp, advantages, mask, ratio=0.1, coef=0.1):
    """KL-Cov choosing, among tied covariances, the last token (the reference takes the
    first): both are right."""
    import torch
    adv = advantages if advantages.dim() == logp.dim() else advantages[:, None].expand_as(logp)
    m = mask.bool()
    n = int(m.sum())
    cov = torch.where(m, (adv - adv[m].mean()) * (logp - logp[m].mean()),
                      torch.tensor(-float("inf"), dtype=logp.dtype)).detach().reshape(-1)
    k = max(1, int(n * ratio))
    idx = torch.arange(cov.numel(), dtype=logp.dtype)
    order = sorted(range(cov.numel()), key=lambda j: (-float(cov[j]), -float(idx[j])))[:k]
    chosen = torch.zeros(cov.numel(), dtype=torch.bool)
    chosen[order] = True
    chosen = chosen.reshape(logp.shape) & m
    log_r = logp - old_logp
    loss = -adv * torch.exp(log_r) + coef * log_r.abs() * chosen
    return torch.where(m, loss, torch.zeros_like(loss))


def test_a_kl_cov_selection_that_breaks_ties_otherwise_is_not_flagged():
    import numpy as np
    from crosscheck.check.registry import REGISTRY
    tie = REGISTRY["kl_cov_loss"].ambiguous
    one_row = dict(logp=np.array([[-0.5, -1.0, -2.0]]), advantages=np.array([1.0]),
                   mask=np.ones((1, 3), bool))
    assert "tie at the selection's boundary" in tie(one_row, dict(ratio=0.4))
    assert tie(dict(one_row, advantages=np.array([[1.0, -1.0, 0.5]])), dict(ratio=0.4)) is None
    # one advantage per sequence: a case with one non-empty row ties every covariance at 0
    report = audit(_kl_cov_last_of_ties, "kl_cov_loss", ratio=0.1, coef=0.1, cases=200,
                   domain=("per_sequence_advantages",))
    assert report.ok, str(report)
    assert any("tie at the selection's boundary" in why for why in report.skipped)


def test_a_float32_value_saturated_beyond_float32s_range_is_a_robustness_note():
    """k3 in float32 whose overflow is caught and saturated at float32's largest value: finite,
    but not the reference's 1e39..1e52 there. That difference lies only beyond float32's range,
    so at precision='float32' it is a robustness note, not a deviation."""
    def k3_saturated(logp, ref_logp, mask):
        x = (ref_logp - logp).float()
        big = torch.finfo(torch.float32).max
        return (torch.nan_to_num(torch.exp(x), posinf=big) - x - 1).clamp(max=big).double() * mask
    report = audit(k3_saturated, "kl_penalty", kind="k3", cases=N, precision="float32")
    f = finding(report, "value")
    assert f.status == "warn" and f.grade == "robustness", str(report)
    assert report.verdict == "CONFORMS", str(report)


def _decoupled_ppo_float32(logp, prox_logp, behave_logp, advantages, mask):
    """Decoupled PPO (dual clip 3, behaviour weight truncated at 5) computed in float32, its
    ratio exp(logp − prox_logp) overflowing where that log-ratio passes 88.7."""
    lp, px, bh = logp.float(), prox_logp.float(), behave_logp.float()
    A = advantages.float()
    A = A[:, None].expand_as(lp) if A.dim() == 1 else A
    r = torch.exp(lp - px)
    w = torch.exp(px - bh).detach().clamp(max=5.0)
    s = torch.minimum(A * r, A * r.clamp(0.8, 1.2))
    s = torch.where(A < 0, torch.maximum(s, 3.0 * A), s)
    return torch.where(mask.bool(), -w * s, torch.zeros_like(s)).double()


def test_float32_overflow_of_any_log_prob_inputs_ratio_is_a_robustness_note():
    """Which inputs are log-probs is the registry's fact (Entry.logprobs): decoupled PPO's
    prox_logp and behave_logp count, so an overflow of exp(logp − prox_logp) past float32's
    range is a robustness note, as PPO's exp(logp − old_logp) is."""
    from crosscheck.check.registry import REGISTRY
    assert REGISTRY["decoupled_ppo_loss"].logprobs == ("logp", "prox_logp", "behave_logp")
    report = audit(_decoupled_ppo_float32, "decoupled_ppo_loss", cases=60, precision="float32",
                   clip_c=3.0, is_level="token", is_mode="truncate", is_upper=5.0)
    f = finding(report, "grad")
    assert f.status == "warn" and f.grade == "robustness", str(report)
    assert report.verdict == "CONFORMS", str(report)


def _kl_cov_by(select):
    """A correct KL-Cov whose top-k is `select(cov, k)` (indices), its covariance formed in
    its own arithmetic (means as sums over counts)."""
    def fn(logp, old_logp, advantages, mask):
        adv = advantages if advantages.dim() == logp.dim() else \
            advantages[:, None].expand_as(logp)
        m = mask.bool()
        a, lp = adv[m].detach(), logp[m].detach()
        cov = (a - a.sum() / len(a)) * (lp - lp.sum() / len(lp))
        chosen = torch.zeros(len(cov), dtype=torch.bool)
        chosen[select(cov, max(1, int(len(cov) * 0.25)))] = True
        flat = torch.zeros_like(m)
        flat[m] = chosen
        log_r = logp - old_logp
        loss = -adv * torch.exp(log_r) + 0.1 * log_r.abs() * flat
        return torch.where(m, loss, torch.zeros_like(loss))
    return fn


KL_COV_TIE_BREAKS = dict(
    topk=lambda c, k: torch.topk(c, k).indices,
    argsort_descending_stable=lambda c, k: torch.argsort(c, descending=True, stable=True)[:k],
    argsort_of_negative=lambda c, k: torch.argsort(-c, stable=True)[:k],
    ascending_reversed=lambda c, k: torch.argsort(c, stable=True).flip(0)[:k],
    numpy_argsort=lambda c, k: torch.as_tensor(np.argsort(c.numpy())[::-1][:k].copy()))


@pytest.mark.parametrize("style", list(KL_COV_TIE_BREAKS))
@pytest.mark.parametrize("A", [0.1, 0.7, 1 / 3])
def test_kl_cov_ties_in_exact_arithmetic_are_not_judged_whatever_the_rounding(style, A):
    """One advantage for every token: every covariance is 0 in exact arithmetic, a tie, though
    the reference's float64 mean of 0.1s is not 0.1 exactly (its covariances are rounding
    noise): no tie-break and no arithmetic of a correct implementation is a failure."""
    from crosscheck.audit.api import prepare
    from crosscheck.check import cases as cases_mod
    aud, _, _ = prepare(_kl_cov_by(KL_COV_TIE_BREAKS[style]), "kl_cov_loss", ratio=0.25,
                        coef=0.1)
    lp = np.array([[-0.5, -1.0, -2.0, -0.3], [-1.5, -0.7, -0.9, -2.2], [-0.1, -0.4, -3.0, -1.1]])
    case = cases_mod.Case("one advantage", dict(logp=lp, old_logp=lp - 0.3,
                                                advantages=np.full(3, A),
                                                mask=np.ones((3, 4), bool)), {})
    outcomes = aud.run_case(case)
    assert all(o.ok for o in outcomes), [o.message for o in outcomes if not o.ok]
    assert outcomes[0].check == "skip" and "tie" in outcomes[0].message


@pytest.mark.parametrize("style", list(KL_COV_TIE_BREAKS))
def test_kl_cov_selections_breaking_ties_in_any_order_conform(style):
    report = audit(_kl_cov_by(KL_COV_TIE_BREAKS[style]), "kl_cov_loss", ratio=0.25, coef=0.1,
                   cases=60, domain=("per_sequence_advantages",))
    assert report.ok, str(report)
