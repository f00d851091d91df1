"""Profiles match the trainers: groups of one, input domains, aggregation variants, what a
value means in a trainer, accumulation, and the source of every value."""
import os
import re

import numpy as np
import pytest
import torch

from crosscheck import audit
from crosscheck.audit.profiles import PROFILES, describe, rule
from tests.audit.corpus import N, finding, grpo, ppo
from tests.helpers import ROOT


# ================================================================ groups of one
def test_verls_grpo_keeps_a_singletons_reward_and_a_zero_is_a_deviation():
    assert audit(grpo(1, 1e-6, alone="keep"), "group_advantages", profile="verl", cases=N).ok
    report = audit(grpo(1, 1e-6, alone="zero"), "group_advantages", profile="verl", cases=N)
    assert finding(report, "value").diagnosis == (
        "deviates: it computes group_advantages with singleton='zero' (the verl profile "
        "declares singleton='keep')")


def rloo_loop(rewards, group_ids):
    """verl's compute_rloo_outcome_advantage: a group of one keeps its score."""
    out = rewards.clone()
    for g in torch.unique(group_ids):
        i = group_ids == g
        n = int(i.sum())
        if n > 1:
            out[i] = rewards[i] * n / (n - 1) - rewards[i].mean() * n / (n - 1)
    return out


def rloo_vectorised(rewards, group_ids):
    """verl's compute_rloo_vectorized_outcome_advantage: a group of one gets 0."""
    inv = torch.unique(group_ids, return_inverse=True)[1]
    c = torch.bincount(inv)[inv].to(rewards.dtype)
    total = torch.zeros(int(inv.max()) + 1, dtype=rewards.dtype).index_add(0, inv, rewards)[inv]
    return (c * rewards - total) / (c - 1).clamp(min=1) * (c > 1)


@pytest.mark.parametrize("fn, singleton", [(rloo_loop, "keep"), (rloo_vectorised, "zero")])
def test_verls_two_rloo_implementations_each_conform_to_their_own_singleton(fn, singleton):
    rloo = dict(baseline="leave_one_out", scale="none")
    assert audit(fn, "group_advantages", profile="verl", singleton=singleton, cases=N,
                 **rloo).ok
    other = {"keep": "zero", "zero": "keep"}[singleton]
    report = audit(fn, "group_advantages", profile="verl", singleton=other, cases=N, **rloo)
    assert report.verdict == "DOES NOT CONFORM"


def openrlhf_group_norm(rewards, group_ids):
    """OpenRLHF asserts at least two samples per prompt."""
    out = torch.zeros_like(rewards)
    for g in torch.unique(group_ids):
        i = group_ids == g
        assert int(i.sum()) >= 2, "n_samples_per_prompt must be > 1"
        r = rewards[i]
        out[i] = (r - r.mean()) / (r.std() + 1e-9)
    return out


def test_openrlhf_never_sees_a_group_of_one_so_those_rows_are_dropped_and_counted():
    report = audit(openrlhf_group_norm, "group_advantages", profile="openrlhf", cases=N)
    assert report.ok, str(report)
    assert report.moved == {"groups of one dropped": report.moved["groups of one dropped"]}
    assert report.moved["groups of one dropped"] > 0
    assert (f"  note: {report.moved['groups of one dropped']} cases moved into the openrlhf "
            f"profile's domain (groups of one dropped)") in str(report)
    assert set(report.skipped) <= {      # a batch of groups of one only; no invalid rows there
        "outside the openrlhf profile's domain: a group of one (this trainer requires at least "
        "two per group)", "your function does not accept valid="}


# ================================================================ input domains
def ppo_right_padded(logp, old_logp, advantages, mask):
    """A loss that rebuilds its mask from the row lengths: right that padding is at the end."""
    T = logp.shape[1]
    lengths = mask.sum(1, keepdim=True)
    m = torch.arange(T)[None, :] < lengths
    return ppo()(logp, old_logp, advantages, m)


def test_a_right_padded_trainer_is_audited_on_right_padded_rows_only():
    report = audit(ppo_right_padded, "ppo_clip_loss", profile="minimind", cases=N)
    assert report.ok and report.n_cases == N, str(report)
    assert report.moved.get("right-padded", 0) > 0
    anywhere = audit(ppo_right_padded, "ppo_clip_loss", clip_low=0.2, cases=N)
    assert anywhere.verdict == "DOES NOT CONFORM"       # holes in the mask: the lengths lie


def ppo_left_padded(logp, old_logp, advantages, mask):
    """A loss that rebuilds its mask from the row lengths: right that padding is at the start."""
    T = logp.shape[1]
    lengths = mask.sum(1, keepdim=True)
    m = torch.arange(T)[None, :] >= T - lengths
    return ppo()(logp, old_logp, advantages, m)


def test_a_left_padded_trainer_is_audited_on_left_padded_rows_only():
    report = audit(ppo_left_padded, "ppo_clip_loss", clip_low=0.2, cases=N,
                   domain=("left_padded",))
    assert report.ok and report.n_cases == N, str(report)
    assert report.moved.get("left-padded", 0) > 0
    anywhere = audit(ppo_left_padded, "ppo_clip_loss", clip_low=0.2, cases=N)
    assert anywhere.verdict == "DOES NOT CONFORM"       # holes or trailing padding: lengths lie


def minimind_sequence_advantages(logp, old_logp, advantages, mask, ref_logp):
    """MiniMind's GRPO objective takes one advantage per sequence (advantages.unsqueeze(1))."""
    assert advantages.dim() == 1
    m = mask.bool()
    zero = torch.zeros((), dtype=logp.dtype)
    lp, olp, rlp = (torch.where(m, x, zero) for x in (logp, old_logp, ref_logp))
    w = torch.exp(lp - olp).clamp(max=5.0).detach()
    kl = torch.exp(rlp - lp) - (rlp - lp) - 1
    per_token = -(w * advantages.unsqueeze(1) * lp - 0.1 * kl)
    return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()


def test_a_case_outside_the_domain_without_a_projection_is_skipped_and_counted():
    report = audit(minimind_sequence_advantages, "policy_objective", profile="minimind", cases=N)
    assert report.ok, str(report)
    why = ("outside the minimind profile's domain: per-token advantages (this trainer's code "
           "takes one per sequence)")
    assert report.skipped == {why: N - report.n_cases} and report.n_cases > 0


def seq_mean_counting_every_row(loss, mask):
    """verl 0.5's seq-mean-token-mean: torch.mean over every row of its token means, an empty
    row's 0/0 included."""
    m = mask.to(loss.dtype)
    return ((loss * m).sum(-1) / m.sum(-1)).mean()


def test_a_trainer_that_never_builds_an_empty_row_is_not_judged_on_one():
    kw = dict(profile="verl", mode="seq-mean-token-mean", accumulation="mean", cases=N)
    plain = audit(seq_mean_counting_every_row, "aggregate", **kw)
    assert not plain.ok and finding(plain, "finite") is not None   # 0/0 on an empty row
    report = audit(seq_mean_counting_every_row, "aggregate", domain=("nonempty_rows",), **kw)
    assert report.ok, str(report)
    assert "empty rows dropped" in str(report)


# ================================================================ TRL's aggregations
def trl_loss(loss_type, max_completion_length=None):
    """TRL's PPO-clip per-token loss and its aggregation by loss_type."""
    def fn(logp, old_logp, advantages, mask):
        m = mask.to(logp.dtype)
        per_token = ppo()(logp, old_logp, advantages, mask)
        if loss_type == "grpo":
            return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
        return (per_token * m).sum() / (per_token.size(0) * max_completion_length)
    return fn


def test_trls_grpo_loss_counts_empty_rows_in_its_mean():
    report = audit(trl_loss("grpo"), "policy_objective", profile="trl", agg="seq-mean-token-mean",
                   empty_rows="include", accumulation="mean", cases=N)
    assert report.ok, str(report)
    excluded = audit(trl_loss("grpo"), "policy_objective", profile="trl",
                     agg="seq-mean-token-mean", empty_rows="exclude", accumulation="mean",
                     cases=N)
    assert excluded.verdict == "DOES NOT CONFORM"


def test_trls_dr_grpo_divides_by_batch_size_times_the_maximum_completion_length():
    report = audit(trl_loss("dr_grpo", 64), "policy_objective", profile="trl",
                   agg="seq-mean-token-sum", norm=64, empty_rows="include", accumulation="mean",
                   cases=N)
    assert report.ok, str(report)


# ================================================================ what a value means in a trainer
def masked_whiten_readding(x, mask):
    """verl's and TRL's masked_whiten(shift_mean=False): scale the centred values, re-add μ."""
    m = mask.to(x.dtype)
    xz = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype))
    n = m.sum()
    mean = (xz * m).sum() / n
    var = (((xz - mean) ** 2) * m).sum() / (n - 1)
    return ((xz - mean) * torch.rsqrt(var + 1e-8) + mean) * m


@pytest.mark.parametrize("profile", ["verl", "trl"])
def test_shift_mean_false_in_verl_and_trl_re_adds_the_mean(profile):
    report = audit(masked_whiten_readding, "whiten", profile=profile, shift_mean=False, cases=N)
    assert report.ok, str(report)
    assert report.conventions["restore_mean"] is True


def test_a_value_the_user_gives_is_never_overridden_by_what_a_profile_implies():
    report = audit(masked_whiten_readding, "whiten", profile="verl", shift_mean=False,
                   restore_mean=False, cases=N)
    assert report.conventions["restore_mean"] is False
    assert report.verdict == "DOES NOT CONFORM"


# ================================================================ MiniMind's PPO path
def minimind_ppo_objective(logp, old_logp, advantages, mask, ref_logp):
    """MiniMind train_ppo.py: PPO-clip token mean plus 0.02 × the k3 token mean."""
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    pg = (ppo()(logp, old_logp, advantages, mask) * m).sum() / n
    x = torch.where(mask.bool(), ref_logp - logp, torch.zeros((), dtype=logp.dtype))
    return pg + 0.02 * ((torch.exp(x) - x - 1) * m).sum() / n


def test_minimind_profile_covers_its_ppo_path():
    report = audit(minimind_ppo_objective, "policy_objective", profile="minimind", loss="ppo",
                   cases=N)
    assert report.ok, str(report)
    assert report.conventions["beta"] == 0.02 and report.conventions["agg"] == "token-mean"
    assert report.notes[0].startswith("micro-batches: none, as minimind trains")
    assert "microbatch" not in {f.check for f in report.findings}      # nothing accumulates


# ================================================================ sources
def test_every_profile_value_cites_its_source_in_the_conventions_doc():
    """docs/conventions.md prints every profile with the trainer file and function of each
    value (the output of `audit --list-profiles`, kept current by the docs test)."""
    with open(os.path.join(ROOT, "docs", "conventions.md"), encoding="utf-8") as f:
        doc = f.read()
    assert describe() in doc
    for p in PROFILES.values():
        for r in list(p.rules.values()) + list(p.objective.values()):
            assert r.source and re.search(r"\w+/[\w/.]+\.py|\.yaml", r.source), r.source
        assert re.match(r"[\w-]+/[\w-]+ ([0-9a-f]{7,9}|\d+\.\d+\.\d+)$", p.snapshot), p.snapshot


def test_every_domain_a_rule_declares_is_known():
    from crosscheck.audit.profiles import DOMAINS
    for p in PROFILES.values():
        for r in list(p.rules.values()) + list(p.objective.values()):
            assert set(r.domain) <= set(DOMAINS), (p.name, r.domain)


def test_the_verl_cispo_objective_takes_cispos_own_log_ratio_clamp():
    """verl's compute_policy_loss_cispo clamps the log-ratio to ±20 itself; PPO's dual clip
    never reaches it."""
    r = rule("verl", "policy_objective", "cispo")
    assert r.conventions["log_ratio_clamp"] == 20.0 and "clip_c" not in r.conventions


def test_profiles_as_data_carry_every_field():
    from crosscheck.audit.profiles import to_dict
    doc = to_dict()
    assert set(doc) == set(PROFILES)
    trl = doc["trl"]["policy_objective"]["gspo"]
    assert trl["accumulation"]["mode"] == "mean"
    assert doc["verl"]["rules"]["whiten"]["implies"] == [
        dict(key="shift_mean", value=False, conventions={"restore_mean": True})]
    assert np.all([isinstance(v["domain"], list) for v in doc["trl"]["rules"].values()])


def maxrl(rewards, group_ids):
    """SkyRL's MaxRL advantage as written: (r − μ)/(μ + 1e-6) per group, any sign of μ; a
    group of one keeps its reward."""
    out = torch.zeros_like(rewards)
    for g in torch.unique(group_ids):
        rows = group_ids == g
        r = rewards[rows]
        out[rows] = r if r.numel() == 1 else (r - r.mean()) / (r.mean() + 1e-6)
    return out


def test_maxrl_on_negative_rewards_is_moved_to_pass_rates_not_judged_or_skipped():
    # the reference refuses a negative group mean under scale="mean" (it would flip the signs):
    # without the domain those cases are skipped as undefined; with "pass_rates" each such case
    # is shifted to rewards ≥ 0 and run
    kw = dict(scale="mean", baseline="mean", eps=1e-6, singleton="keep", ddof=0, cases=N)
    plain = audit(maxrl, "group_advantages", **kw)
    assert plain.ok, str(plain)
    assert any("undefined there" in why and "mean is" in why for why in plain.skipped)
    report = audit(maxrl, "group_advantages", domain=("pass_rates",), **kw)
    assert report.ok, str(report)
    assert not any("undefined there" in why for why in report.skipped), report.skipped
    assert "rewards shifted to ≥ 0" in str(report)
    assert report.n_cases > plain.n_cases
