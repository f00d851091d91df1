"""The audit: correct trainer-style implementations pass under each profile (no false alarms over
several seeds), and every bug class of bug_classes.md that concerns these functions is flagged
by the right check. The implementations here are written as trainers write them (torch, masks
multiplied in), not by calling ref_torch."""
import json
import os
import re
import sys

import numpy as np
import pytest
import torch

from _util import run_cli
from crosscheck import assert_conforms, audit
from crosscheck.audit import AuditUsageError

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
sys.path.insert(0, EXAMPLES)
import buggy  # noqa: E402
import minimind_style  # noqa: E402
import trl_style  # noqa: E402
import verl_style  # noqa: E402

SEEDS = (0, 1)
N = 30


def failing(report):
    return {f.check for f in report.failures}


def finding(report, check):
    return next(f for f in report.findings if f.check == check)


# ================================================================ correct implementations
def grpo(ddof, eps):
    def fn(rewards, group_ids, valid=None):
        out = torch.zeros_like(rewards)
        keep = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
        for g in torch.unique(group_ids[keep]):
            idx = (group_ids == g) & keep
            r = rewards[idx]
            if r.numel() > 1:
                out[idx] = (r - r.mean()) / (r.std(unbiased=bool(ddof)) + eps)
        return out
    return fn


def whiten(ddof, eps, mode):
    def fn(x, mask):
        m = mask.to(x.dtype)
        n = m.sum()
        xm = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype))
        mean = (xm * m).sum() / n
        var = (((xm - mean) * m) ** 2).sum() / (n - ddof)
        if mode == "var":
            out = (xm - mean) * torch.rsqrt(var + eps)
        elif mode == "clamp":
            out = (xm - mean) * torch.rsqrt(torch.clamp(var, min=eps))
        else:
            out = (xm - mean) / (torch.sqrt(var) + eps)
        return out * m
    return fn


def ppo(lo=0.2, hi=0.2, c=None, clamp=None):
    def fn(logp, old_logp, advantages, mask):
        m = mask.bool()
        zero = torch.zeros((), dtype=logp.dtype)
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        A = torch.where(m, A, zero)
        lr = torch.where(m, logp - old_logp, zero)
        if clamp:
            lr = torch.clamp(lr, -clamp, clamp)
        ratio = torch.exp(lr)
        loss1, loss2 = -A * ratio, -A * torch.clamp(ratio, 1 - lo, 1 + hi)
        loss = torch.maximum(loss1, loss2)
        if c is not None:
            loss = torch.where(A < 0, torch.minimum(loss, -A * c), loss)
        return loss * m
    return fn


def kl(kind, clamp_in=None, clamp_out=None):
    def fn(logp, ref_logp, mask):
        m = mask.bool()
        zero = torch.zeros((), dtype=logp.dtype)
        x = torch.where(m, ref_logp - logp, zero)
        if clamp_in:
            x = torch.clamp(x, -clamp_in, clamp_in)
        k = {"k1": -x, "k2": 0.5 * x ** 2, "k3": torch.exp(x) - x - 1}[kind]
        if clamp_out:
            k = torch.clamp(k, -clamp_out, clamp_out)
        return k * m
    return fn


def value_loss(clip):
    def fn(values, old_values, returns, mask):
        m = mask.to(values.dtype)
        zero = torch.zeros((), dtype=values.dtype)
        v, vo, R = (torch.where(mask.bool(), t, zero) for t in (values, old_values, returns))
        clipped = vo + torch.clamp(v - vo, -clip, clip)
        return 0.5 * torch.maximum((v - R) ** 2, (clipped - R) ** 2) * m
    return fn


def gae_loop(gamma, lam):
    def fn(rewards, values, mask, dones=None, last_value=None):
        B, T = rewards.shape
        m = mask.to(rewards.dtype)
        d = torch.zeros_like(rewards) if dones is None else dones.to(rewards.dtype)
        nextvalue = torch.zeros(B, dtype=rewards.dtype) if last_value is None else last_value
        lastgaelam = torch.zeros(B, dtype=rewards.dtype)
        out = []
        zero = torch.zeros((), dtype=rewards.dtype)
        r = torch.where(mask.bool(), rewards, zero)
        v = torch.where(mask.bool(), values, zero)
        for t in reversed(range(T)):
            delta = r[:, t] + gamma * (1 - d[:, t]) * nextvalue - v[:, t]
            new = delta + gamma * lam * (1 - d[:, t]) * lastgaelam
            lastgaelam = new * m[:, t] + (1 - m[:, t]) * lastgaelam
            nextvalue = v[:, t] * m[:, t] + (1 - m[:, t]) * nextvalue
            out.append(lastgaelam)
        adv = torch.stack(out[::-1], dim=1) * m
        return adv, (adv + v) * m
    return fn


def global_token_mean(loss, mask, n_tokens_global=None):
    m = mask.to(loss.dtype)
    n = int(mask.sum()) if n_tokens_global is None else n_tokens_global
    return (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum() / max(n, 1)


def seq_mean_all_rows(loss, mask):
    m = mask.to(loss.dtype)
    rows = (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum(1)
    return (rows / m.sum(1).clamp(min=1)).mean()


CORRECT = [
    ("verl", "group_advantages", grpo(1, 1e-6), {}),
    ("trl", "group_advantages", grpo(1, 1e-4), {}),
    ("openrlhf", "group_advantages", grpo(1, 1e-9), {}),
    ("minimind", "group_advantages", grpo(0, 1e-4), {}),
    ("verl", "whiten", whiten(1, 1e-8, "var"), {}),
    ("openrlhf", "whiten", whiten(0, 1e-8, "clamp"), {}),
    ("minimind", "whiten", whiten(0, 1e-8, "var"), {}),
    ("cleanrl", "whiten", whiten(1, 1e-8, "std"), {}),
    ("verl", "ppo_clip_loss", ppo(c=3.0, clamp=20.0), {}),
    ("openrlhf", "ppo_clip_loss", ppo(clamp=20.0), {}),
    ("trl", "ppo_clip_loss", ppo(), {}),
    ("cleanrl", "ppo_clip_loss", ppo(), {}),
    ("verl", "kl_penalty", kl("k3", 20.0, 10.0), {}),
    ("openrlhf", "kl_penalty", kl("k1", None, 10.0), {}),
    ("minimind", "kl_penalty", kl("k3"), {}),
    ("verl", "value_loss", value_loss(0.5), {}),
    ("trl", "value_loss", value_loss(0.2), {}),
    ("cleanrl", "gae", gae_loop(0.99, 0.95), {}),
    ("verl", "gae", gae_loop(1.0, 1.0), {}),
    ("verl", "aggregate", global_token_mean, {"accumulation": "sum"}),
    ("minimind", "aggregate", seq_mean_all_rows, {}),
    ("verl", "policy_objective", verl_style.adapter, {"accumulation": "sum"}),
    ("trl", "policy_objective", trl_style.adapter, {"accumulation": "sum", "beta": 0.04}),
    ("minimind", "policy_objective", minimind_style.cispo_objective, {}),
    ("minimind", "group_advantages", minimind_style.grpo_advantages, {}),
]


@pytest.mark.parametrize("profile, ref, fn, extra", CORRECT,
                         ids=[f"{p}-{r}-{i}" for i, (p, r, _, _) in enumerate(CORRECT)])
def test_correct_implementations_conform_under_their_profile(profile, ref, fn, extra):
    for seed in SEEDS:
        report = audit(fn, ref, profile=profile, cases=N, seed=seed, **extra)
        assert report.ok, str(report)
        if fn is minimind_style.grpo_advantages:     # takes group_size only: by design, the
            assert report.n_cases >= N // 3          # cases with shuffled group_ids are skipped
        else:                                        # every case runs: none silently skipped
            assert report.n_cases == N and not report.skipped, report.skipped


def test_numpy_backend():
    def fn(x, mask):
        m = mask.astype(bool)
        v = x[m]
        return np.where(m, (x - v.mean()) / np.sqrt(v.var() + 1e-8), 0.0)
    assert audit(fn, "whiten", profile="minimind", backend="numpy", cases=N).ok


# ================================================================ planted bugs, by class
def test_aggregation_mode_changed_is_flagged_with_its_convention():
    report = audit(seq_mean_all_rows, "aggregate", profile="verl", cases=N, accumulation="sum")
    assert "value" in failing(report)
    assert "mode='seq-mean-token-mean'" in finding(report, "value").diagnosis


def test_policy_and_kl_terms_normalised_differently_are_flagged():
    # trl #2881: the policy term per-sequence mean, the KL term a global token mean
    def mixed(logp, old_logp, advantages, mask, ref_logp):
        m = mask.to(logp.dtype)
        policy = minimind_style.cispo_objective(logp, old_logp, advantages, mask, ref_logp * 0 +
                                                logp.detach())            # policy part only
        x = torch.where(mask.bool(), ref_logp - logp, torch.zeros_like(logp))
        kl = ((torch.exp(x) - x - 1) * m).sum() / m.sum()
        return policy + 0.1 * kl
    report = audit(mixed, "policy_objective", profile="minimind", cases=N)
    assert "value" in failing(report)


def test_the_reference_undefined_on_a_case_is_skipped_not_a_crash():
    report = audit(grpo(0, 0.0), "group_advantages", profile="minimind", cases=N, eps=0.0)
    assert any("reference is undefined" in why for why in report.skipped)


def test_mean_of_micro_batch_means_is_flagged():
    report = audit(buggy.local_token_mean, "aggregate", profile="verl", cases=N)
    assert failing(report) == {"microbatch"}


def test_biased_vs_unbiased_std_is_a_convention_difference():
    report = audit(grpo(0, 1e-4), "group_advantages", profile="verl", cases=N)
    assert "value" in failing(report)
    assert "ddof=0, eps=0.0001: a convention difference" in finding(report, "value").diagnosis


@pytest.mark.filterwarnings("ignore::UserWarning")      # the planted bug warns: std of one
def test_nan_for_a_one_sample_group_is_flagged():
    def trl_nanstd(rewards, group_ids):          # unbiased std of one sample is NaN
        out = torch.zeros_like(rewards)
        for g in torch.unique(group_ids):
            idx = group_ids == g
            r = rewards[idx]
            out[idx] = (r - r.mean()) / (r.std() + 1e-4)
        return out
    assert "finite" in failing(audit(trl_nanstd, "group_advantages", profile="trl", cases=N))


def test_groups_by_reshaping_an_interleaved_batch_are_flagged():
    report = audit(buggy.grpo_by_reshape, "group_advantages", profile="minimind", cases=N)
    assert {"permutation", "value"} <= failing(report)
    assert "consecutive blocks" in finding(report, "value").diagnosis
    assert re.fullmatch(r"shuffling rows with their group_ids changed an advantage: row \d+ was "
                        r"\S+, became \S+ \(groups taken by position\?\)",
                        finding(report, "permutation").message)


def test_groups_by_reshaping_are_flagged_under_the_audited_conventions_too():
    """The known-bug variant is evaluated with the audit's conventions (here eps = 1e-6), not the
    reference's defaults, or a reshape bug under another eps would go unnamed."""
    def by_reshape(rewards, group_ids):
        g = rewards.view(len(torch.unique(group_ids)), -1)
        return ((g - g.mean(1, keepdim=True)) /
                (g.std(1, unbiased=False, keepdim=True) + 1e-6)).view(-1)
    report = audit(by_reshape, "group_advantages", profile="minimind", cases=N, eps=1e-6)
    assert "consecutive blocks" in finding(report, "value").diagnosis


def test_invalid_rows_kept_in_the_baseline_are_flagged():
    inner = grpo(0, 1e-4)

    def keeps_them(rewards, group_ids, valid):
        out = inner(torch.nan_to_num(rewards), group_ids)     # bug: valid read but not used
        return out * valid
    report = audit(keeps_them, "group_advantages", profile="minimind", cases=N)
    assert "value" in failing(report)
    assert "invalid rows kept" in finding(report, "value").diagnosis


def test_gae_bootstrapping_from_padding_is_flagged_by_mask_invariance():
    def no_carry(rewards, values, mask):          # V(t+1) read even where t+1 is padding
        B, T = rewards.shape
        m = mask.to(rewards.dtype)
        last, out = torch.zeros(B, dtype=rewards.dtype), []
        for t in reversed(range(T)):
            nv = values[:, t + 1] if t + 1 < T else torch.zeros(B, dtype=rewards.dtype)
            delta = rewards[:, t] + nv - values[:, t]
            last = (delta + last) * m[:, t]
            out.append(last)
        adv = torch.stack(out[::-1], 1)
        return adv, (adv + values) * m
    report = audit(no_carry, "gae", profile="verl", cases=N)
    assert "mask" in failing(report)


def test_unmasked_whitening_statistics_are_flagged():
    def unmasked(x, mask):
        return (x - x.mean()) / (x.std() + 1e-8) * mask
    report = audit(unmasked, "whiten", profile="verl", cases=N)
    assert {"mask", "value", "grad"} <= failing(report)
    assert "statistics over padding too" in finding(report, "value").diagnosis
    assert "gradient wrt x reaches padding" in finding(report, "grad").message


def test_shift_mean_false_adding_the_mean_back_is_flagged():
    def adds_back(x, mask):
        m = mask.bool()
        v = x[m]
        mean, var = v.mean(), v.var(unbiased=False)
        return torch.where(m, (x - mean) * torch.rsqrt(var + 1e-8) + mean, torch.zeros_like(x))
    report = audit(adds_back, "whiten", profile="minimind", cases=N, shift_mean=False)
    assert "value" in failing(report)
    assert "adds the mean back" in finding(report, "value").diagnosis


def test_value_clip_around_the_returns_is_flagged():
    def around_returns(values, old_values, returns, mask):
        clipped = returns + torch.clamp(values - returns, -0.2, 0.2)
        return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2) * mask
    report = audit(around_returns, "value_loss", profile="minimind", cases=N)
    assert "value" in failing(report)
    assert "around the returns" in finding(report, "value").diagnosis


def test_clip_fraction_defined_backwards_is_flagged():
    def backwards(logp, old_logp, advantages, mask):        # trl #3175: signs of A swapped
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        r = torch.exp(logp - old_logp)
        hit = ((r < 0.8) & (A > 0)) | ((r > 1.2) & (A < 0))
        m = mask.bool()
        return (hit & m).sum().double() / m.sum()
    report = audit(backwards, "clip_fraction", profile="trl", cases=N)
    assert "value" in failing(report)


def test_dual_clip_on_positive_advantages_is_flagged():
    def dual_everywhere(logp, old_logp, advantages, mask):
        base = ppo(clamp=20.0)(logp, old_logp, advantages, mask)
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return torch.minimum(base, -A * 3.0) * mask
    report = audit(dual_everywhere, "ppo_clip_loss", profile="verl", cases=N)
    assert "value" in failing(report)
    assert "dual clip applied to positive advantages" in finding(report, "value").diagnosis


def test_swapped_clip_bounds_are_flagged():
    report = audit(ppo(lo=0.28, hi=0.2), "ppo_clip_loss", profile="trl", cases=N,
                   clip_high=0.28)
    assert "value" in failing(report)
    assert "clip bounds swapped" in finding(report, "value").diagnosis


def test_swapped_clip_bounds_are_named_under_any_bounds():
    """The known-bug variant swaps the audited bounds (here 0.1 and 0.3), not the defaults."""
    report = audit(ppo(lo=0.3, hi=0.1), "ppo_clip_loss", cases=N, clip_low=0.1, clip_high=0.3)
    assert "clip bounds swapped" in finding(report, "value").diagnosis


def test_gspo_product_of_token_ratios_is_flagged():
    def product(logp, old_logp, advantages, mask):
        m = mask.to(logp.dtype)
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        s = torch.exp((torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp)) * m)
                      .sum(1, keepdim=True))                    # bug: Σ, not mean
        loss = torch.maximum(-A * s, -A * torch.clamp(s, 1 - 3e-4, 1 + 4e-4))
        return loss * m
    report = audit(product, "gspo_loss", profile="trl", cases=N)
    assert "value" in failing(report)
    assert "product of token ratios" in finding(report, "value").diagnosis


def test_missing_cispo_detach_is_flagged_by_the_detach_check():
    report = audit(buggy.cispo_without_detach, "cispo_loss", profile="minimind", cases=N)
    assert failing(report) == {"detach"}
    assert "not detached" in finding(report, "detach").diagnosis


def test_gspo_token_without_the_stop_gradient_is_flagged_by_the_detach_check():
    def sequence_gradient(logp, old_logp, advantages, mask):   # verl's form minus the sg()
        m = mask.to(logp.dtype)
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        lr = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp)) * m
        log_s = torch.clamp(lr.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1),
                            max=10.0)
        s = torch.exp(log_s).expand_as(logp)
        return torch.maximum(-A * s, -A * torch.clamp(s, 0.8, 1.2)) * m
    report = audit(sequence_gradient, "gspo_loss", profile="verl", cases=N)
    assert failing(report) == {"detach"}
    assert finding(report, "detach").diagnosis.startswith(
        "GSPO-token's sequence factor is not detached: the gradient flows through the mean "
        "(matches gspo_loss's gradient with form='sequence')")


def test_log_probs_detached_by_accident_are_flagged():
    fn = ppo(c=3.0, clamp=20.0)
    report = audit(lambda logp, **kw: fn(logp.detach(), **kw), "ppo_clip_loss", profile="verl",
                   cases=N)
    assert failing(report) == {"grad"}
    assert "does not depend on logp" in finding(report, "grad").message


def test_a_wrong_lambda_is_named_in_the_value_and_the_gradient_diagnosis():
    """gae returns a pair: the gradient diagnosis contracts both outputs with cotangents."""
    report = audit(gae_loop(1.0, 0.95), "gae", profile="verl", cases=N)
    assert {"value", "grad"} <= failing(report)
    assert "matches gae with lam=0.95" in finding(report, "value").diagnosis
    assert "matches gae's gradient with lam=0.95: a convention difference" in \
        finding(report, "grad").diagnosis


def test_value_and_gradient_failures_quote_both_numbers():
    report = audit(ppo(lo=0.1, hi=0.1), "ppo_clip_loss", profile="trl", cases=N)
    for check in ("value", "grad"):
        msg = finding(report, check).message
        assert re.search(r"yours -?[0-9.e+-]+, reference -?[0-9.e+-]+", msg), msg
    assert finding(report, "grad").message.startswith("d/dlogp[")


def test_dual_clip_on_positive_advantages_is_flagged_under_any_c():
    """The known-bug variant takes the profile's c (5 here), not the usual 3."""
    def dual_everywhere(logp, old_logp, advantages, mask):
        base = ppo(clamp=20.0)(logp, old_logp, advantages, mask)
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return torch.minimum(base, -A * 5.0) * mask
    report = audit(dual_everywhere, "ppo_clip_loss", profile="verl", clip_c=5.0, cases=N)
    assert "value" in failing(report)
    assert "dual clip applied to positive advantages" in finding(report, "value").diagnosis


def test_kl_arguments_swapped_are_flagged():
    def swapped(logp, ref_logp, mask):
        return kl("k3")(ref_logp, logp, mask)
    report = audit(swapped, "kl_penalty", profile="trl", cases=N)
    assert "value" in failing(report)
    assert "arguments swapped" in finding(report, "value").diagnosis


def test_kl_arguments_swapped_are_flagged_under_the_profiles_estimator():
    """OpenRLHF's k1 with its clamp: the swapped variant must be computed with the profile's
    kind and clamp, not the reference defaults."""
    def swapped(logp, ref_logp, mask):
        return kl("k1", None, 10.0)(ref_logp, logp, mask)
    report = audit(swapped, "kl_penalty", profile="openrlhf", cases=N)
    assert "value" in failing(report)
    assert "arguments swapped" in finding(report, "value").diagnosis


def test_kl_sign_flipped_is_flagged_by_the_direction_check():
    report = audit(buggy.kl_sign_flipped, "kl_penalty", profile="trl", cases=N)
    assert "kl_direction" in failing(report)


def test_k1_as_a_loss_gets_a_direction_warning():
    report = audit(kl("k1", None, 10.0), "kl_penalty", profile="openrlhf", cases=N)
    assert report.ok
    assert finding(report, "kl_direction").status == "warn"


def test_different_kl_clamps_are_a_convention_difference():
    report = audit(kl("k3"), "kl_penalty", profile="verl", cases=N)
    assert "value" in failing(report)
    assert "clamp=None" in finding(report, "value").diagnosis


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


def test_usage_errors():
    with pytest.raises(AuditUsageError, match="ref is 'grpo'"):
        audit(grpo(0, 1e-4), "grpo")
    with pytest.raises(AuditUsageError, match="profile is 'deepspeed'"):
        audit(grpo(0, 1e-4), "group_advantages", profile="deepspeed")
    with pytest.raises(AuditUsageError, match="profile 'cleanrl' defines no conventions for "
                                              "'group_advantages'") as exc:
        audit(grpo(0, 1e-4), "group_advantages", profile="cleanrl")
    from crosscheck.profiles import PROFILES      # it lists what the profile does define
    defined = [k for k in PROFILES["cleanrl"] if not k.startswith("_")]
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


# ================================================================ the command line
def run(argv):
    return run_cli(argv)


def test_cli_pass_fail_and_json():
    ex = os.path.join(EXAMPLES, "minimind_style.py")
    code, out, _ = run(["audit", f"{ex}:grpo_advantages", "--ref", "group_advantages",
                        "--profile", "minimind", "--cases", "20"])
    assert code == 0 and "verdict: CONFORMS" in out
    code, out, _ = run(["audit", os.path.join(EXAMPLES, "buggy.py") + ":cispo_without_detach",
                        "--ref", "cispo_loss", "--profile", "minimind", "--cases", "20", "--json"])
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and any(f["check"] == "detach" and f["status"] == "fail"
                                      for f in doc["findings"])


@pytest.mark.parametrize("argv, message", [
    (["audit", "missing.py:f", "--ref", "whiten"], "does not exist"),
    (["audit", "examples/buggy.py:nope", "--ref", "whiten"], "has no function 'nope'"),
    (["audit", "examples/buggy.py", "--ref", "whiten"], "expected path/to/file.py:function"),
    (["audit", "examples/buggy.py:kl_sign_flipped", "--ref", "klx"], "ref is 'klx'"),
    (["audit", "examples/buggy.py:kl_sign_flipped", "--ref", "kl_penalty", "--set", "kind"],
     "expected key=value"),
])
def test_cli_usage_errors_exit_2_with_a_message(argv, message):
    code, _, err = run(argv)
    assert code == 2 and message in err


def test_cli_list_profiles():
    code, out, _ = run(["audit", "--list-profiles"])
    assert code == 0
    for name in ("verl", "trl", "openrlhf", "minimind", "cleanrl"):
        assert f"{name}:" in out


# ================================================================ the report itself
def test_a_detached_kl_term_gets_the_no_gradient_warning():
    """autograd.grad finds no path to θ at all (allow_unused gives None): a warning, not a
    crash or a failure."""
    def detached(logp, ref_logp, mask):
        return kl("k3")(logp, ref_logp, mask).detach()

    report = audit(detached, "kl_penalty", cases=4)
    f = finding(report, "kl_direction")
    assert f.status == "warn" and "no expected gradient" in f.message


def test_the_report_counts_the_cases_it_ran_and_states_its_verdict():
    report = audit(kl("k3"), "kl_penalty", cases=7, seed=3)
    assert report.ok and report.n_cases == 7 and report.seed == 3
    lines = str(report).splitlines()
    assert "7 cases, seed 3" in lines[0]
    assert lines[-1] == "verdict: CONFORMS"
    bad = audit(buggy.kl_sign_flipped, "kl_penalty", cases=7)
    assert str(bad).splitlines()[-1].startswith("verdict: DOES NOT CONFORM (")


def test_the_cli_passes_every_option_to_the_audit(tmp_path):
    target = tmp_path / "mine.py"
    target.write_text("import torch\n"
                      "def k3(logp, ref_logp, mask):\n"
                      "    x = torch.where(mask.bool(), ref_logp - logp, torch.zeros(()))\n"
                      "    return (torch.exp(x) - x - 1) * mask\n")
    code, out, _ = run_cli(["audit", f"{target}:k3", "--ref", "kl_penalty", "--cases", "5",
                            "--seed", "2", "--json"])
    doc = json.loads(out)
    assert code == 0 and doc["cases"] == 5 and doc["seed"] == 2 and doc["ok"]
    code, out, _ = run_cli(["audit", f"{target}:k3", "--ref", "kl_penalty", "--cases", "3",
                            "--backend", "numpy", "--json"])
    assert code == 1 and json.loads(out)["backend"] == "numpy"   # torch code given NumPy


def test_conventions_with_numpy_values_serialise():
    report = audit(kl("k3"), "kl_penalty", cases=2, clamp=(np.float64(10.0), None))
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["conventions"]["clamp"] == [10.0, None]


def test_a_function_raising_on_a_micro_batch_is_a_microbatch_failure_that_quotes_it():
    """Only split batches make it raise (it asserts it runs on one rank): the raises check
    passes, microbatch fails and says why (the exception's type and text)."""
    def single_rank_only(loss, mask, n_tokens_global=None):
        n_local = int(mask.sum())
        if n_tokens_global is not None and n_tokens_global != n_local:
            raise RuntimeError(f"global count {n_tokens_global} != local {n_local}")
        return global_token_mean(loss, mask)

    report = audit(single_rank_only, "aggregate", profile="verl", cases=N)
    assert "raises" not in failing(report) and "microbatch" in failing(report)
    assert re.fullmatch(r"RuntimeError: global count \d+ != local \d+",
                        finding(report, "microbatch").message)


def test_an_adapter_whose_signature_cannot_be_read_is_offered_every_keyword():
    class Opaque:                    # e.g. a compiled extension: inspect.signature raises
        __signature__ = "not a signature"

        def __call__(self, logp, ref_logp, mask=None, **_):
            return kl("k3")(logp, ref_logp, mask)

    report = audit(Opaque(), "kl_penalty", profile="minimind", cases=6)
    assert report.ok, str(report)


def test_a_wrong_second_output_is_named_by_its_index():
    """gae returns (advantages, returns): a function whose returns forget + V is blamed on
    output[1], its advantages pass."""
    inner = gae_loop(1.0, 1.0)

    def returns_without_values(rewards, values, mask, **kw):
        adv, _ = inner(rewards, values, mask, **kw)
        return adv, adv
    report = audit(returns_without_values, "gae", profile="verl", cases=N)
    assert finding(report, "value").message.startswith("output[1][")


def test_a_function_that_raises_on_nan_padding_gets_a_mask_warning_not_a_failure():
    """Most trainers pad with finite values, so raising on NaN padding is a warning."""
    inner = kl("k3")

    def refuses_nan(logp, ref_logp, mask):
        if torch.isnan(logp).any() or torch.isnan(ref_logp).any():
            raise ValueError("NaN in input")
        return inner(logp, ref_logp, mask)
    report = audit(refuses_nan, "kl_penalty", profile="minimind", cases=N)
    assert report.ok
    f = finding(report, "mask")
    assert f.status == "warn" and f.message == \
        "NaN at masked positions makes your function raise ValueError"


def test_a_function_that_raises_on_large_finite_padding_fails_the_mask_check():
    """Padding may hold anything; raising on ±1e4 there (finite values every trainer pads with)
    is a failure of the mask check, named as such."""
    inner = kl("k3")

    def refuses_large(logp, ref_logp, mask):
        if (logp.abs() > 1e3).any():
            raise ValueError("log-prob out of range")
        return inner(logp, ref_logp, mask)
    report = audit(refuses_large, "kl_penalty", profile="minimind", cases=N)
    assert not report.ok and "mask" in failing(report)
    assert finding(report, "mask").message == \
        "1e4 at masked positions makes your function raise ValueError: log-prob out of range"


def global_seq_mean(loss, mask, n_sequences_global=None):
    """Mean over sequences of each sequence's token mean, divided by the global sequence count
    when the caller gives it (DAPO-style global normalisation, gradients summed)."""
    m = mask.to(loss.dtype)
    rows = (torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype)) * m).sum(1)
    per_seq = rows / m.sum(1).clamp(min=1)
    n = int(mask.any(1).sum()) if n_sequences_global is None else n_sequences_global
    return per_seq.sum() / max(n, 1)


def test_micro_batches_receive_the_global_sequence_count():
    report = audit(global_seq_mean, "aggregate", mode="seq-mean-token-mean",
                   empty_rows="exclude", accumulation="sum", cases=N)
    assert report.ok, str(report)
    assert finding(report, "microbatch").status == "pass"
    assert finding(report, "microbatch").cases > 0


def test_the_shrinker_never_splits_a_group():
    """A candidate drops whole groups of `group_size` rows, never a single row of one."""
    from crosscheck import cases as cases_mod
    from crosscheck.audit import _smaller
    case = cases_mod.Case("six rewards in groups of 2",
                          dict(rewards=np.arange(6.0), group_ids=None), dict(group_size=2))
    sizes = [c.arrays["rewards"].shape[0] for c in _smaller(case)]
    assert 4 in sizes and all(n % 2 == 0 for n in sizes)


def test_a_target_path_holding_a_colon_is_split_at_the_last_one(tmp_path):
    folder = tmp_path / "run:3"
    folder.mkdir()
    (folder / "mine.py").write_text(
        "import torch\n"
        "def k3(logp, ref_logp, mask):\n"
        "    x = torch.where(mask.bool(), ref_logp - logp, torch.zeros(()))\n"
        "    return (torch.exp(x) - x - 1) * mask\n")
    code, out, err = run_cli(["audit", f"{folder / 'mine.py'}:k3", "--ref", "kl_penalty",
                              "--cases", "3"])
    assert code == 0 and "verdict: CONFORMS" in out, err


# ================================================================ the audit's own plumbing
def test_the_reference_takes_group_size_over_the_equivalent_ids():
    from crosscheck.audit import reference_args
    ids, r = np.array([0, 0, 1, 1]), np.arange(4.0)
    assert set(reference_args(dict(rewards=r, group_size=2, group_ids=ids))) == \
        {"rewards", "group_size"}
    assert set(reference_args(dict(rewards=r, group_ids=ids))) == {"rewards", "group_ids"}


def test_trainer_padding_fills_per_sequence_values_of_empty_rows():
    """A [B] input (per-sequence advantages) is padded where its row has no valid token; B ≠ T."""
    from crosscheck import cases as cases_mod
    from crosscheck.audit import _finite_padding
    m = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]], dtype=bool)
    adv = np.array([0.5, np.nan, -2.0])
    logp = np.where(m, -1.0, np.nan)
    out = _finite_padding(cases_mod.Case("c", dict(advantages=adv, logp=logp, mask=m), {}),
                          value=7.0).arrays
    np.testing.assert_array_equal(out["advantages"], [0.5, 7.0, -2.0])
    np.testing.assert_array_equal(out["logp"], np.where(m, -1.0, 7.0))


def test_an_output_detached_from_one_input_is_named():
    """Values detached in GAE (a detach mistake): the output has no path to them at all."""
    inner = gae_loop(1.0, 1.0)

    def detached_values(rewards, values, mask, dones=None, last_value=None):
        return inner(rewards, values.detach(), mask, dones, last_value)
    report = audit(detached_values, "gae", profile="verl", cases=10)
    assert failing(report) == {"grad"}
    assert "your output does not depend on values" in finding(report, "grad").message


def test_the_permutation_check_hides_group_size_so_the_ids_must_be_used():
    by_ids = grpo(1, 1e-6)

    def either(rewards, group_ids=None, group_size=None, valid=None):   # positional if given a size
        if group_size is not None:
            group_ids = torch.arange(len(rewards)) // group_size
        return by_ids(rewards, group_ids, valid)
    report = audit(either, "group_advantages", profile="verl", cases=N)
    assert report.ok
    assert finding(report, "permutation").status == "pass"


def test_a_function_raising_on_shuffled_rows_fails_the_permutation_check_with_its_message():
    by_ids = grpo(1, 1e-6)

    def sorted_only(rewards, group_ids, valid=None):
        if bool((group_ids[1:] < group_ids[:-1]).any()):
            raise ValueError("group_ids must be sorted")
        return by_ids(rewards, group_ids, valid)
    report = audit(sorted_only, "group_advantages", profile="verl", cases=N)
    assert "permutation" in failing(report)
    assert finding(report, "permutation").message == "ValueError: group_ids must be sorted"


def test_a_bug_on_every_token_shrinks_to_one_token():
    def k1_doubled(logp, ref_logp, mask):
        return torch.where(mask.bool(), 2 * (logp - ref_logp), torch.zeros((), dtype=logp.dtype))
    report = audit(k1_doubled, "kl_penalty", kind="k1", cases=10)
    ce = finding(report, "value").counterexample
    assert np.asarray(ce["logp"]).shape == (1, 1) and np.asarray(ce["mask"]).tolist() == [[True]]


def k3_half_detached(logp, ref_logp, mask):
    """k3 = e^x − x − 1 with e^x detached: right values, gradient g·1 instead of g·(1 − e^x)."""
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    x = torch.where(m, ref_logp - logp, zero)
    return torch.where(m, torch.exp(x).detach() - x - 1, zero)


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


def test_an_unknown_profile_lists_the_known_ones():
    from crosscheck.profiles import PROFILES
    with pytest.raises(AuditUsageError) as exc:
        audit(grpo(0, 1e-4), "group_advantages", profile="deepspeed")
    assert str(exc.value).endswith("expected one of " + ", ".join(PROFILES))


def test_an_undetached_relative_cispo_weight_is_diagnosed_with_clipped_tokens():
    """verl's relative clip [0.8, 1.2] binds on many tokens; the diagnosis's gradient must hold
    there too (the clipped weight contributes no ratio term)."""
    def undetached(logp, old_logp, advantages, mask):
        m = mask.bool()
        zero = torch.zeros((), dtype=logp.dtype)
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        w = torch.clamp(torch.exp(torch.where(m, logp - old_logp, zero)), 0.8, 1.2)   # no detach
        return torch.where(m, -w * torch.where(m, A, zero) * torch.where(m, logp, zero), zero)
    report = audit(undetached, "cispo_loss", profile="verl", cases=N)
    assert failing(report) == {"detach"}
    assert "not detached" in finding(report, "detach").diagnosis


def test_closeness_matches_equal_infinities_and_nothing_else_against_an_inf():
    """Found by a mutant: a diagnosis whose gradient was inf on clipped tokens matched the user's
    finite one, since rtol·|inf| allows any difference."""
    from crosscheck import registry
    from crosscheck.audit import Auditor
    aud = Auditor(None, registry.build()["kl_penalty"], {}, "torch", 1e-6, 1e-8, "mean")
    inf, nan = np.inf, np.nan
    ref = np.array([inf, -inf, inf, 1.0, nan, 2.0])
    for i, yours_i, ok in ((0, inf, True), (1, -inf, True), (2, 1e300, False), (2, -inf, False),
                           (3, inf, False), (3, nan, False), (4, nan, False), (4, 0.0, False),
                           (5, 2.0 + 1e-7, True)):
        yours = ref.copy()
        yours[i] = yours_i
        keep = np.zeros(6, dtype=bool)
        keep[i] = True
        assert aud.close(yours, ref, keep)[0] is ok, (i, yours_i)
    masked = np.array([1.0, 5.0, inf])
    assert aud.close(masked, np.array([1.0, nan, 0.0]), np.array([True, False, False]))[0]


def test_a_correct_audit_reports_every_check_on_every_case():
    report = audit(kl("k3"), "kl_penalty", kind="k3", cases=20)
    assert report.ok and report.skipped == {}
    checks = {f.check: f for f in report.findings}
    for check in ("raises", "shape", "finite", "value", "grad"):
        assert checks[check].status == "pass" and checks[check].cases == 20, check
    report = audit(grpo(1, 1e-6), "group_advantages", profile="verl", cases=N)   # ids only
    assert report.ok and report.skipped == {} and finding(report, "value").cases == N


def test_an_adapter_without_group_ids_runs_the_consecutive_cases_and_skips_the_rest():
    by_ids = grpo(1, 1e-6)

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


def test_a_non_finite_output_is_shown_in_the_counterexample():
    r = audit(lambda logp, ref_logp, mask: logp * float("nan"), "kl_penalty", cases=5)
    ce = finding(r, "finite").counterexample
    assert np.isnan(np.asarray(ce["your output"], dtype=float)).any()
    assert np.isfinite(np.asarray(ce["reference output"], dtype=float)).all()


def test_padding_that_changes_valid_outputs_fails_and_a_nan_leak_only_warns():
    def whiten_unmasked_mean(x, mask):              # 1e4 in the padding moves the mean
        m = mask.to(x.dtype)
        xm = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype))
        mu = torch.where(mask.bool(), x, x).nan_to_num(0.0).mean()
        return (xm - mu) * m
    r = audit(whiten_unmasked_mean, "whiten", ddof=0, eps=1e-8, cases=N)
    assert finding(r, "mask").status == "fail"
    assert re.fullmatch(r"1e4 at masked positions changes a valid output: output\[\d+, \d+\] "
                        r"\S+ → \S+", finding(r, "mask").message)
    inner = gae_loop(1.0, 1.0)

    def gae_nan_in_returns(rewards, values, mask, dones=None, last_value=None):
        adv, ret = inner(rewards, values, mask, dones, last_value)
        return adv, ret + 0.0 * (values * 0).sum()  # 0·(padding) is 0, unless it holds NaN
    r = audit(gae_nan_in_returns, "gae", profile="verl", cases=N)
    assert r.ok and finding(r, "mask").status == "warn"
    assert finding(r, "mask").message.startswith(
        "NaN at masked positions leaks into valid outputs (output[1][")


def test_an_unknown_convention_lists_the_known_ones():
    with pytest.raises(AuditUsageError) as exc:
        audit(whiten(0, 1e-8, "var"), "whiten", gamma_x=1)
    assert str(exc.value).endswith("its keywords are ddof, eps, eps_mode, shift_mean")


@pytest.mark.parametrize("timeout", ["1", True, 0, -1.0, float("nan"), float("inf")])
def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout):
    with pytest.raises(AuditUsageError, match=r"timeout is .*; expected a positive number"):
        audit(kl("k1"), "kl_penalty", kind="k1", cases=2, timeout=timeout)
