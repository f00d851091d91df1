"""Every bug class that concerns these functions is flagged by the right check, and named."""
import re

import pytest
import torch

from crosscheck import audit
from crosscheck.audit.diagnose import diagnose
from tests.audit.corpus import (N, auditor_for, buggy, failing, finding, gae_loop,
                                 global_token_mean, grpo, kl, minimind_style, ppo,
                                 seq_mean_all_rows, value_loss)


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


def test_mean_of_micro_batch_means_is_flagged():
    report = audit(buggy.local_token_mean, "aggregate", profile="verl", cases=N)
    assert failing(report) == {"microbatch"}


def test_biased_vs_unbiased_std_is_named_as_a_deviation_from_the_profile():
    report = audit(grpo(0, 1e-4, alone="keep"), "group_advantages", profile="verl", cases=N)
    assert "value" in failing(report)
    assert finding(report, "value").diagnosis == (
        "deviates: it computes group_advantages with ddof=0, eps=0.0001 (the verl profile "
        "declares ddof=1, eps=1e-06)")


@pytest.mark.filterwarnings("ignore::UserWarning")      # the planted bug warns: std of one
def test_nan_for_a_one_sample_group_is_flagged():
    def trl_nanstd(rewards, group_ids):          # unbiased std of one sample is NaN
        out = torch.zeros_like(rewards)
        for g in torch.unique(group_ids):
            idx = group_ids == g
            r = rewards[idx]
            out[idx] = (r - r.mean()) / (r.std() + 1e-4)
        return out
    # TRL itself never sees a group of one (its profile's domain); under its conventions without
    # that domain, the NaN of a one-sample std is caught
    assert "finite" in failing(audit(trl_nanstd, "group_advantages", ddof=1, eps=1e-4, cases=N))
    assert audit(trl_nanstd, "group_advantages", profile="trl", cases=N).ok


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
    assert {"mask", "value"} <= failing(report)
    assert "statistics over padding too" in finding(report, "value").diagnosis
    grad = finding(report, "grad")            # trainers never differentiate a whitening
    assert grad.status == "warn" and "gradient wrt x reaches padding" in grad.message
    assert grad.message.endswith("(trainers do not differentiate through this function: a "
                                 "warning only)")


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
        "(its gradient is gspo_loss's with form='sequence')")


def test_log_probs_detached_by_accident_are_flagged():
    fn = ppo(c=3.0, clamp=20.0)
    report = audit(lambda logp, **kw: fn(logp.detach(), **kw), "ppo_clip_loss", profile="verl",
                   cases=N)
    assert failing(report) == {"grad"}
    assert "does not depend on logp" in finding(report, "grad").message


def test_a_wrong_lambda_is_named_in_the_value_and_the_gradient_diagnosis():
    """gae returns a pair: the gradient diagnosis contracts both outputs with cotangents. (The
    audit reports gae's gradient as a warning only, trainers never differentiate it; the
    diagnosis is asked directly.)"""
    report = audit(gae_loop(1.0, 0.95), "gae", profile="verl", cases=N)
    assert failing(report) == {"value"} and finding(report, "grad").status == "warn"
    assert "deviates: it computes gae with lam=0.95 (the verl profile declares lam=1.0)" in \
        finding(report, "value").diagnosis
    aud, case = auditor_for(gae_loop(1.0, 0.95), "gae", profile="verl")      # the first case
    assert diagnose(aud, case, "grad", "verl") == (
        "deviates: its gradient is that of gae with lam=0.95 (the verl profile declares "
        "lam=1.0)", False)


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
    report = audit(kl("k1", None, 10.0), "kl_penalty", profile="openrlhf", kl_use="loss",
                   cases=N)
    assert report.ok
    assert finding(report, "kl_direction").status == "warn"


def test_different_kl_clamps_are_a_convention_difference():
    report = audit(kl("k3"), "kl_penalty", profile="verl", cases=N)
    assert "value" in failing(report)
    assert "clamp=None" in finding(report, "value").diagnosis


# ================================================================ the report itself
def test_a_detached_kl_term_gets_the_no_gradient_warning():
    """autograd.grad finds no path to θ at all (allow_unused gives None): a warning, not a
    crash or a failure."""
    def detached(logp, ref_logp, mask):
        return kl("k3")(logp, ref_logp, mask).detach()

    report = audit(detached, "kl_penalty", cases=4)
    f = finding(report, "kl_direction")
    assert f.status == "warn" and "no expected gradient" in f.message


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


def test_a_function_that_raises_on_garbage_padding_gets_a_robustness_warning():
    """No trainer pads with NaN or ±1e4: raising there is a robustness note, never a failure."""
    inner = kl("k3")

    def refuses_nan(logp, ref_logp, mask):
        if torch.isnan(logp).any() or torch.isnan(ref_logp).any():
            raise ValueError("NaN in input")
        return inner(logp, ref_logp, mask)

    def refuses_large(logp, ref_logp, mask):
        if (logp.abs() > 1e3).any():
            raise ValueError("log-prob out of range")
        return inner(logp, ref_logp, mask)
    for fn, said in ((refuses_nan, "NaN at padding makes your function raise ValueError: NaN "
                                   "in input"),
                     (refuses_large, "1e4 at padding makes your function raise ValueError: "
                                     "log-prob out of range")):
        report = audit(fn, "kl_penalty", profile="minimind", cases=N)
        assert report.ok, str(report)
        f = finding(report, "garbage")
        assert f.status == "warn" and f.grade == "robustness" and f.message.startswith(said)
        assert finding(report, "mask").status == "pass"


def test_a_function_that_raises_on_plausible_padding_fails_the_mask_check():
    """Padding a trainer really produces (log-probs that differ there) must not make it raise."""
    inner = kl("k3")

    def refuses_differing(logp, ref_logp, mask):
        if (logp != ref_logp)[~mask.bool()].any():
            raise ValueError("padding differs")
        return inner(logp, ref_logp, mask)
    report = audit(refuses_differing, "kl_penalty", profile="minimind", cases=N)
    assert not report.ok and "mask" in failing(report)
    assert finding(report, "mask").message == \
        "padding with differing log-probs makes your function raise ValueError: padding differs"


def test_an_output_detached_from_one_input_is_named():
    """Values detached in a loss: the output has no path to them at all."""
    def detached_old(values, old_values, returns, mask):
        return value_loss(0.5)(values.detach(), old_values, returns, mask)
    report = audit(detached_old, "value_loss", profile="verl", cases=10)
    assert failing(report) == {"grad"}
    assert "your output does not depend on values" in finding(report, "grad").message


def test_values_detached_in_gae_as_trainers_do_is_only_a_warning():
    """Trainers compute advantages from detached critic values: a gradient that differs from
    the reference's is a warning for a function trainers never differentiate."""
    inner = gae_loop(1.0, 1.0)

    def detached_values(rewards, values, mask, dones=None, last_value=None):
        return inner(rewards, values.detach(), mask, dones, last_value)
    report = audit(detached_values, "gae", profile="verl", cases=10)
    assert report.ok, str(report)
    grad = finding(report, "grad")
    assert grad.status == "warn" and "your output does not depend on values" in grad.message


def test_the_permutation_check_hides_group_size_so_the_ids_must_be_used():
    by_ids = grpo(1, 1e-6, alone="keep")

    def either(rewards, group_ids=None, group_size=None, valid=None):   # positional if given a size
        if group_size is not None:
            group_ids = torch.arange(len(rewards)) // group_size
        return by_ids(rewards, group_ids, valid)
    report = audit(either, "group_advantages", profile="verl", cases=N)
    assert report.ok
    assert finding(report, "permutation").status == "pass"


def test_a_function_raising_on_shuffled_rows_fails_the_permutation_check_with_its_message():
    by_ids = grpo(1, 1e-6, alone="keep")

    def sorted_only(rewards, group_ids, valid=None):
        if bool((group_ids[1:] < group_ids[:-1]).any()):
            raise ValueError("group_ids must be sorted")
        return by_ids(rewards, group_ids, valid)
    report = audit(sorted_only, "group_advantages", profile="verl", cases=N)
    assert "permutation" in failing(report)
    assert finding(report, "permutation").message == "ValueError: group_ids must be sorted"


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


def test_plausible_padding_that_changes_valid_outputs_fails_and_a_nan_leak_only_warns():
    def whiten_unmasked_mean(x, mask):              # 1e4 in the padding moves the mean
        m = mask.to(x.dtype)
        xm = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype))
        mu = torch.where(mask.bool(), x, x).nan_to_num(0.0).mean()
        return (xm - mu) * m
    r = audit(whiten_unmasked_mean, "whiten", ddof=0, eps=1e-8, cases=N)
    assert finding(r, "mask").status == "fail"
    # whiten has no log-prob input: the message names what it pads
    assert re.fullmatch(r"padding with a second finite padding of x \(in every input's domain\) "
                        r"changes a valid output: output\[\d+, \d+\] \S+ → \S+",
                        finding(r, "mask").message)
    inner = gae_loop(1.0, 1.0)

    def gae_nan_in_returns(rewards, values, mask, dones=None, last_value=None):
        adv, ret = inner(rewards, values, mask, dones, last_value)
        return adv, ret + 0.0 * (values * 0).sum()  # 0·(padding) is 0, unless it holds NaN
    r = audit(gae_nan_in_returns, "gae", profile="verl", cases=N)
    assert r.ok and finding(r, "garbage").status == "warn"
    assert finding(r, "garbage").message.startswith(
        "NaN at padding leaks into a valid output (returns[")


def test_a_dppo_clamping_its_log_ratio_at_20_is_caught_where_the_reference_does_not():
    """The DPPO cases keep tokens with |log r| > 20 (from case 12 on), where a clamp at 20
    changes min(r, C)·logp."""
    import ref_torch

    def clamps(logp, old_logp, advantages, mask):
        return ref_torch.dppo_loss(logp, old_logp, advantages, mask, log_ratio_clamp=20.0)
    report = audit(clamps, "dppo_loss", log_ratio_clamp=None, cases=60)
    assert "value" in failing(report), str(report)


def test_an_opsm_that_compares_the_drift_with_0_not_delta_is_caught_at_a_small_delta():
    """At slime's δ = 1e-4 the cases put rows' mean log-ratio D at 0.2·δ and 3·δ (outside the
    band the registry leaves undecided): D > 0 in place of D > δ drops a row it must keep."""
    def ignores_delta(logp, old_logp, advantages, mask):
        m = mask.bool()
        A = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        d = torch.where(m, old_logp - logp, torch.zeros_like(logp)).sum(-1, keepdim=True) / \
            m.sum(-1, keepdim=True).clamp(min=1)
        return (m & ~((A < 0) & (d > 0))).to(logp.dtype)
    report = audit(ignores_delta, "opsm_mask", delta=1e-4, cases=200)
    assert "value" in failing(report), str(report)


def test_the_mask_check_of_gae_speaks_of_its_own_inputs():
    def gae_reading_padding(rewards, values, mask):      # bootstraps from the padding's value
        B, T = rewards.shape
        adv, last = torch.zeros_like(rewards), torch.zeros(B, dtype=rewards.dtype)
        for t in reversed(range(T)):
            nv = values[:, t + 1] if t + 1 < T else torch.zeros(B, dtype=rewards.dtype)
            last = rewards[:, t] + nv - values[:, t] + 0.95 * last
            adv[:, t] = last
        return adv, adv + values
    f = finding(audit(gae_reading_padding, "gae", gamma=1.0, lam=0.95, cases=20), "mask")
    assert f.status == "fail" and "log-prob" not in f.message
    assert f.message.startswith("padding with a second finite padding of rewards, values (in "
                                "every input's domain) changes a valid output: advantages[")
