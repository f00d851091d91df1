"""What the default run's cases cover, and the promises the fd stage relies on.

`python -m crosscheck` runs 12 cases per function. These tests pin that those 12 reach every
mask kind, every convention a generator rotates through and every special input (dones, a
bootstrap value, off-policy samples, an all-equal group...), so that editing a generator cannot
silently drop a path from the check. They also check the distances from kinks that make a finite
difference meaningful, on more cases than the default run draws."""
import math
import re

import numpy as np
import pytest

from crosscheck.check import cases as cases_mod
from crosscheck.check import registry, report, stages

DEFAULT = 12
ENTRIES = registry.build()


def drawn(name, n=DEFAULT, seed=0):
    entry = ENTRIES[name]
    return [entry.case(cases_mod.rng_for(seed, name, i), i) for i in range(n)]


def mask_kind(m):
    if m is None or m.all():
        return "full"
    valid_prefix = np.array_equal(m, np.arange(m.shape[-1]) < m.sum(-1, keepdims=True))
    return "ragged" if valid_prefix else "holed"


@pytest.mark.parametrize("name", list(ENTRIES))
def test_every_case_is_labelled_and_reproducible(name):
    for c, again in zip(drawn(name), drawn(name)):
        assert isinstance(c.label, str) and c.label
        assert c.label == again.label and c.params == again.params
        for k, v in c.arrays.items():
            assert (v is None and again.arrays[k] is None) or \
                np.array_equal(v, again.arrays[k], equal_nan=True)


@pytest.mark.parametrize("name", [n for n in ENTRIES if "mask" in
                                  ENTRIES[n].case(cases_mod.rng_for(0, n, 1), 1).arrays])
def test_the_default_cases_reach_every_mask_kind(name):
    kinds = {mask_kind(c.arrays["mask"]) for c in drawn(name) if c.arrays["mask"] is not None}
    assert kinds == {"full", "ragged", "holed"}


def test_gae_cases_reach_dones_a_bootstrap_value_and_a_single_trajectory():
    cs = drawn("gae")
    assert any(c.arrays["dones"] is not None and
               (c.arrays["dones"] & c.arrays["mask"]).any() for c in cs)
    batches = [c for c in cs if c.arrays["rewards"].ndim == 2]
    assert {c.arrays["last_value"] is None for c in batches} == {True, False}
    # a single [T] trajectory, bootstrapped by a 0-d last_value
    assert any(c.arrays["rewards"].ndim == 1 and c.arrays["last_value"] is not None and
               c.arrays["last_value"].shape == () for c in cs)
    assert {c.params["gamma"] for c in cs} >= {0.0, 1.0} and \
        {c.params["lam"] for c in cs} >= {0.0, 1.0}


def test_gae_labels_say_when_a_case_has_dones_or_a_bootstrap_value():
    """A failing case is identified by its label; a gae label names its dones and its
    last_value when it has them."""
    for c in drawn("gae", 40):
        assert (", dones" in c.label) == (c.arrays["dones"] is not None), c.label
        assert (", last_value" in c.label) == (c.arrays["last_value"] is not None), c.label


def test_estimator_gradient_cases_reach_the_kl_term_as_loss_and_as_reward():
    assert {c.params["use"] for c in drawn("kl_estimator_gradient")} == {"loss", "reward"}


def test_policy_objective_cases_reach_every_loss_aggregation_and_kl_term():
    cs = drawn("policy_objective")
    assert {(c.params["loss"]) for c in cs} == {"ppo", "cispo", "gspo", "sapo", "vespo", "dppo"}
    assert {c.params["agg"] for c in cs} == {"token-mean", "seq-mean-token-mean",
                                             "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                             "prompt-mean-token-mean"}
    # the prompt mean over consecutive groups of rows and over shuffled ids
    grouped = [c for c in cs if c.params["agg"] == "prompt-mean-token-mean"]
    assert any("group_size" in c.params for c in grouped)
    assert any("group_ids" in c.arrays for c in grouped)
    assert {c.params["kl_kind"] for c in cs if c.params["beta"] > 0} == {"k1", "k2", "k3", "abs"}
    # each loss runs under its own conventions, not only its defaults
    assert any(c.params.get("form") == "sequence" for c in cs)
    assert any(c.params.get("bound") == "relative" for c in cs)
    assert any(c.params.get("clip_c") == 3.0 for c in cs)
    assert any(c.params.get("tau_pos", 1.0) != 1.0 for c in cs if c.params["loss"] == "sapo")
    # the KL to the sampling policy, beside DPPO's loss and beside a frozen ratio (CISPO's)
    anchored = {c.params["loss"] for c in cs if c.params.get("kl_anchor") == "old" and
                c.params["beta"] > 0}
    assert anchored == {"dppo", "cispo"}


def test_dppo_cases_reach_both_forms_and_keep_the_attached_ratio_off_its_truncation():
    cs = drawn("dppo_loss", 48)
    assert {c.params["form"] for c in cs} == {"logp", "ratio"}
    for c in cs:
        if c.params["form"] == "ratio" and c.params["clip_c"] is not None:
            m = c.arrays["mask"]
            with np.errstate(invalid="ignore"):               # garbage at padding
                x = np.where(m, c.arrays["logp"] - c.arrays["old_logp"], np.inf)
            assert np.abs(x - math.log(c.params["clip_c"])).min() >= 0.05, c.label


def test_policy_objective_abs_kl_keeps_the_log_ratio_off_its_kink():
    for c in drawn("policy_objective", 48):
        if c.params["kl_kind"] == "abs" and "fd" in c.stages:
            m = c.arrays["mask"]
            with np.errstate(invalid="ignore"):               # garbage at padding
                x = np.where(m, c.arrays["ref_logp"] - c.arrays["logp"], np.inf)
            assert np.abs(x).min() >= cases_mod.MARGIN, c.label


def test_ratio_losses_reach_the_log_ratio_clamp_under_every_bound():
    ppo = drawn("ppo_clip_loss")
    assert {c.params["log_ratio_clamp"] for c in ppo} == {None, 20.0}
    for key, on in (("clip_high", 0.28), ("clip_c", 3.0), ("delta", 2.5)):   # and TRL's cap
        assert {c.params[key] for c in ppo} == {None, on}, key
    cispo = {(c.params["bound"], c.params["log_ratio_clamp"]) for c in drawn("cispo_loss")}
    assert cispo == {("absolute", None), ("absolute", 20.0), ("relative", None),
                     ("relative", 20.0)}


def test_kl_penalty_cases_reach_every_kind_and_clamp():
    cs = drawn("kl_penalty")
    assert {c.params["kind"] for c in cs} == {"k1", "k2", "k3", "abs"}
    assert {c.params["clamp"] for c in cs} == {None, (20.0, 10.0), (None, 10.0), (1.0, None)}


def test_kl_penalty_cases_keep_the_log_ratio_off_every_kink_where_fd_runs():
    """|x| has a kink at x = 0, and the clamp of x at ±c one at each bound: the fd stage
    differentiates across none of them."""
    checked = set()
    for c in drawn("kl_penalty", 48):
        if "fd" not in c.stages:
            continue
        kind, clamp = c.params["kind"], c.params["clamp"]
        edges = ([0.0] if kind == "abs" else []) + \
            ([] if clamp is None or clamp[0] is None else [-clamp[0], clamp[0]])
        m = c.arrays["mask"]
        with np.errstate(invalid="ignore"):                   # garbage at padding
            x = np.where(m, c.arrays["ref_logp"] - c.arrays["logp"], np.inf)
        for e in edges:
            assert np.abs(x - e).min() >= cases_mod.MARGIN, c.label
            checked.add((kind, e))
    assert ("abs", 0.0) in checked and ("k3", 1.0) in checked


LOG_RATIOS = {"approx_kl": ("logp", "old_logp"), "ppo_clip_loss": ("logp", "old_logp"),
              "cispo_loss": ("logp", "old_logp"), "kl_penalty": ("ref_logp", "logp")}


@pytest.mark.parametrize("name", LOG_RATIOS)
def test_a_case_is_labelled_extreme_exactly_when_its_log_ratios_are(name):
    """Extreme cases draw every valid log-ratio at 15..30 in size (and, from case 12 on, every
    other one past float32's exp overflow, 90..120), of both signs; the label says which (a
    failing case is known by its label, and policy_objective keeps labelled extremes from the
    fd stage); other cases stay far below."""
    a, b = LOG_RATIOS[name]
    extremes, beyond = 0, 0
    for c in drawn(name, 48):
        m = c.arrays["mask"]
        with np.errstate(invalid="ignore"):                   # garbage at padding
            x = np.where(m, c.arrays[a] - c.arrays[b], 0.0)[m]
        if x.size == 0:
            continue
        found = re.search(r"extreme log-ratios ±(\d+)\.\.(\d+)", c.label)
        if found:
            lo, hi = float(found[1]), float(found[2])
            extremes += 1
            beyond += lo > 89
            assert np.all((np.abs(x) >= lo) & (np.abs(x) <= hi)), c.label
            if x.size >= 8:
                assert (x > 0).any() and (x < 0).any(), c.label
        else:
            assert np.abs(x).max() < 15, c.label
    assert extremes >= 5 and beyond >= 2


def test_off_policy_estimator_cases_carry_their_sampling_logits():
    cs = drawn("kl_estimator_gradient")
    off = [c for c in cs if "another policy" in c.label]
    on = [c for c in cs if "on-policy" in c.label]
    assert off and on and len(off) + len(on) == len(cs)
    assert all(c.arrays["sample_logits"] is None for c in on)
    for c in off:
        zs, z = c.arrays["sample_logits"], c.arrays["logits"]
        assert zs.shape == z.shape and not np.allclose(zs, z)
        # another policy: another softmax, not the same logits shifted by a constant
        p, q = (np.exp(x - x.max(-1, keepdims=True)) for x in (zs, z))
        p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
        assert not np.allclose(p, q, atol=1e-3)
    assert {c.params["is_weight"] for c in off} == {None, "detached", "attached"}


def test_group_cases_reach_an_all_equal_group_under_sizes_and_under_ids():
    reached = set()
    for c in drawn("group_advantages"):
        r, ids = c.arrays["rewards"], c.arrays["group_ids"]
        if ids is None:
            G = c.params["group_size"]
            groups = [r[k:k + G] for k in range(0, r.size, G)]
        else:
            groups = [r[ids == g] for g in np.unique(ids)]
        for g in groups:
            g = g[~np.isnan(g)]
            if g.size >= 2 and np.all(g == g[0]):
                reached.add("ids" if ids is not None else "size")
                assert "all-equal group" in c.label and "fd" not in c.stages
    assert reached == {"size", "ids"}


def test_gspo_rows_keep_their_mean_log_ratio_off_the_clip_edges():
    """GSPO clips the row's mean log-ratio: the generator draws that mean away from both edges
    and centres the token noise exactly, so no row sits on a kink (1-token rows included)."""
    for c in drawn("gspo_loss", 48):
        m = c.arrays["mask"]
        with np.errstate(invalid="ignore"):                   # garbage at padding
            rho = np.where(m, c.arrays["logp"] - c.arrays["old_logp"], 0.0)
        rows = m.any(axis=1)
        mean = rho.sum(axis=1)[rows] / m.sum(axis=1)[rows]
        for edge in (math.log(1 - c.params["clip_low"]), math.log(1 + c.params["clip_high"])):
            assert np.abs(mean - edge).min() >= cases_mod.MARGIN, c.label


def test_policy_objective_extremes_are_kept_from_the_stages_that_cannot_judge_them():
    """Cases 13 and 14 draw log-ratios of ±15..30 (SAPO, VESPO with the five-loss cycle): the
    value and vjp stages judge them, finite differences of a sum that includes e^30-sized terms
    cannot (see cases.py), and every stage the generator does assign them passes."""
    entry = ENTRIES["policy_objective"]
    extremes = [c for c in drawn("policy_objective", 18) if "extreme" in c.label]
    assert extremes and "gspo" not in {c.params["loss"] for c in extremes}  # GSPO has none
    assert all(c.stages == ("value", "vjp") for c in extremes)
    results = stages.run_entry(entry, 0, 18)
    assert all(r.passed for r in results), [report.failure_message(r) for r in results
                                            if not r.passed]


def test_away_keeps_each_value_on_its_side_of_every_edge():
    x = np.array([0.999, 1.0, 1.0004, -0.2, 3.0, 1.19999, 1.2])
    edges = [1.0, 1.2]
    y = cases_mod.away(x, edges, margin=1e-3)
    for e in edges:
        assert np.all(np.abs(y - e) >= 1e-3)
        assert np.array_equal(y >= e, x >= e)
    np.testing.assert_array_equal(y[[3, 4]], x[[3, 4]])        # far from both: untouched


@pytest.mark.parametrize("name", ["group_advantages", "whiten"])
def test_from_case_12_a_sixth_of_the_cases_sit_on_a_large_common_offset(name):
    """Values 1000 ± 0.1 expose a one-pass float32 variance; the default 12 cases have none."""
    key = "rewards" if name == "group_advantages" else "x"
    for i, c in enumerate(drawn(name, 48)):
        valid = c.arrays.get("mask", c.arrays.get("valid"))
        v = c.arrays[key] if valid is None else c.arrays[key][np.asarray(valid, bool)]
        if "offset 1000 ± 0.1" in c.label:
            assert i >= 12 and np.all(np.abs(v - 1000) < 1.0) and np.ptp(v) < 2.0, c.label
        else:
            assert np.all(np.abs(v[np.isfinite(v)]) < 100), c.label
    assert sum("offset" in c.label for c in drawn(name, 48)) >= 5


@pytest.mark.parametrize("name", ["ppo_clip_loss", "aggregate", "policy_objective"])
def test_from_case_12_some_cases_leave_a_first_micro_batch_without_a_valid_token(name):
    found = 0
    for i, c in enumerate(drawn(name, 48)):
        m = np.asarray(c.arrays["mask"], bool)
        if "first half of the rows empty" in c.label:
            found += 1
            assert i >= 12 and not m[: m.shape[0] // 2].any(), c.label
    assert found >= 3


def test_from_case_12_some_advantages_lie_well_beyond_five():
    big = [c for c in drawn("ppo_clip_loss", 96)
           if np.nanmax(np.abs(np.where(c.arrays["mask"] if c.arrays["advantages"].ndim == 2
                                        else c.arrays["mask"].any(1),
                                        c.arrays["advantages"], 0.0))) > 5]
    assert len(big) >= 3



@pytest.mark.parametrize("name", ["ppo_clip_loss", "cispo_loss", "gspo_loss"])
def test_from_case_12_some_cases_draw_advantages_well_beyond_five(name):
    found = 0
    for i, c in enumerate(drawn(name, 48)):
        adv = c.arrays["advantages"]
        m = np.asarray(c.arrays["mask"], bool)
        if "advantages ×20" in c.label:
            found += 1
            assert i >= 12 and adv.ndim == 2
            if m.sum() >= 4:
                assert np.abs(adv[m]).max() > 5, c.label
        elif adv.ndim == 2 and m.any():
            assert np.abs(adv[m]).max() < 8, c.label
    assert found >= 2


def test_only_gspo_token_form_has_an_undetached_variant_the_sequence_form():
    undetached = registry.REGISTRY["gspo_loss"].undetached
    assert undetached({"form": "token"}) == {"form": "sequence"}
    assert undetached({"form": "sequence"}) is None
    objective = registry.REGISTRY["policy_objective"].undetached
    assert objective({"loss": "gspo", "form": "sequence"}) is None
    assert objective({"loss": "ppo"}) is None


def test_kl_kinks_of_an_output_clamp_alone_are_where_each_estimator_reaches_it():
    # clamp (None, 10): no input clamp; k1 and abs reach ±10 at x = ±10, k2 = x²/2 at ±√20,
    # k3 = e^x − 1 − x at its two roots of e^x − 1 − x = 10
    assert cases_mod._kl_edges("k1", (None, 10.0)) == [-10.0, 10.0]
    assert cases_mod._kl_edges("k2", (None, 10.0)) == pytest.approx([-math.sqrt(20),
                                                                     math.sqrt(20)])
    lo, hi = cases_mod._kl_edges("k3", (None, 10.0))
    for x in (lo, hi):
        assert math.expm1(x) - x == pytest.approx(10.0, rel=1e-9)
    assert lo < 0 < hi
    assert cases_mod._kl_edges("abs", (None, 10.0)) == [-10.0, 10.0, 0.0]
    assert cases_mod._kl_edges("k3", (20.0, 10.0))[:2] == [-20.0, 20.0]


def test_kl_cov_cases_keep_the_k_th_and_next_covariance_apart_at_every_seed():
    """Many tokens pack the covariance terms densely (seed 151, case 7: 206 tokens, a gap of
    5e-4 at the cut), where a finite-difference step can change which tokens are penalised."""
    entry = registry.build()["kl_cov_loss"]
    for seed in range(300):
        for i in range(12):
            c = entry.case(cases_mod.rng_for(seed, entry.name, i), i)
            lp, adv, m = (c.arrays[k] for k in ("logp", "advantages", "mask"))
            adv = adv if adv.shape == lp.shape else np.repeat(adv[:, None], lp.shape[1], 1)
            m = m.astype(bool)
            cov, k = cases_mod.kl_cov_ranking(lp, adv, m, c.params["ratio"])
            assert m.sum() < 2 or k >= len(cov) or \
                cov[k - 1] - cov[k] > 0.05 * (1 + abs(cov[k - 1])), (seed, i)
            assert (lp[m] <= 0).all() and (np.abs(lp - c.arrays["old_logp"])[m] > 0).all()


@pytest.mark.parametrize("name", ["group_advantages", "opo_advantages", "gpg_advantages",
                                  "passk_advantages", "whitened_group_advantages"])
def test_group_cases_by_ids_hold_groups_of_unequal_sizes_beside_a_group_of_one(name):
    # a trainer that groups by ids (verl's index, SkyRL's uids) takes groups of any sizes: a
    # case whose groups all have one size cannot tell a per-group size from a mean size
    unequal = one = False
    for c in drawn(name):
        ids = c.arrays.get("group_ids")
        if ids is None:
            continue
        sizes = np.unique(ids, return_counts=True)[1]
        unequal |= len(set(sizes[sizes > 1].tolist())) > 1
        one |= bool((sizes == 1).any())
        if name == "passk_advantages":          # its groups need two members
            assert (sizes >= 2).all(), c.label
    assert unequal
    assert one or name == "passk_advantages"
