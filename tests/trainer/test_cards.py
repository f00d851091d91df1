"""Report cards of the pinned trainers (installed by .ci/run with --no-deps), a fork with an edited
loss, a fork whose signature changed, MiniMind's statement blocks, and the published cards.

The expected verdicts come from reading each trainer's code at its pinned version (the rows'
`Known` entries cite it), not from running the card."""
import importlib.util
import os
import re
import shutil
import sys
import textwrap

import pytest

from crosscheck import trainer as trainers
from crosscheck.trainer import card, loading
from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import render_examples  # noqa: E402

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cards")

# row name -> [(check, grade, known entry's kind)] at the pinned version, read from each trainer's
# code (robustness notes of the garbage-padding check are asserted apart: see below)
EXPECTED = {
    "verl": {"compute_policy_loss [ppo, deprecated]": [("microbatch", "documented choice")],
             "compute_policy_loss_vanilla [ppo_kl]": [("value", "documented choice")],
             "compute_rollout_correction_weights [token IcePop mask]": [("raises", "robustness")],
             "compute_rollout_correction_weights [sequence IcePop mask]":
                 [("raises", "robustness")]},
    # (SAPO's float32 temperatures stay within the float64 row on one advantage per sequence)
    "trl": {"GRPOTrainer._compute_loss [bnpo]": [("microbatch", "documented choice")]},
    # bnpo's local token count, TRL's documented choice, which ms-swift keeps; the rollout
    # weights' ±20 clamp of each token's log-ratio before a sequence's geometric mean
    "ms-swift": {"GRPOTrainer._compute_loss_and_metrics [bnpo]":
                 [("microbatch", "documented choice")],
                 **{f"{cls}._apply_rollout_importance_sampling [sequence_{mode}]":
                    [("value", "documented choice")]
                    for cls in ("GRPOTrainer", "MegatronGRPOTrainer")
                    for mode in ("truncate", "mask")}},
    # GAE and the 'reinforce' returns discount through a multi-turn row's masked steps: seen
    # only below γλ = 1 (at 1 a step of reward 0 changes nothing)
    "openrlhf": {"RemoteExperienceMaker.get_advantages_and_returns": [("value", "deviation")],
                 "RemoteExperienceMaker.get_cumulative_returns [γ 0.99]":
                     [("value", "deviation")],
                 # the KL loss aggregated token-mean whatever loss_agg_mode (ppo_actor.py)
                 "ActorPPOTrainer.training_step [ppo + k2 KL loss, seq-mean-token-mean]":
                     [("value", "deviation"), ("grad", "deviation"),
                      ("microbatch", "deviation")]},
    # REINFORCE++'s reset at masked tokens bites only on a mask with holes; SkyRL gives the
    # estimator response_mask, left-padded with none: a robustness note, not a deviation
    "skyrl": {"compute_reinforce_plus_plus_outcome_advantage [a mask with holes]":
                  [("value", "robustness")],
              # the KL loss a per-sequence mean whatever loss_reduction (worker.py's NOTE)
              "PolicyWorkerBase._forward_backward_micro [regular + k3 KL loss, token_mean]":
                  [("value", "documented choice"), ("grad", "documented choice")]},
    # luspo's unmasked L_i / T aggregation (TRL's form before huggingface/trl#6654)
    "liger": {"LigerFusedLinearGRPOLoss.forward [luspo]":
              [("value", "deviation"), ("grad", "deviation"), ("mask", "deviation"),
               ("microbatch", "deviation")],
              "LigerFusedLinearGRPOLoss.forward [bnpo]": [("microbatch", "documented choice")]},
    # SAPO's gate detached as a policy-gradient weight: the gradient is A·f(r)·∇log π, not the
    # A·f'(r)·r·∇log π of the objective its docstring states (sapo_policy_loss.py); its value
    # −A·sg(f(r))·log π is another surrogate than −A·f(r): a convention, the gradient the defect
    "trinity": {"SAPOPolicyLossFn [sapo]": [("value", "surrogate convention"),
                                            ("grad", "deviation")]},
    # CISPO's clipped ratio left attached (zero gradient outside the band), and the KL term's
    # .mean() over all B·T positions (grpo.py); CISPO's value −w·A is another surrogate than
    # −sg(w)·A·log π (a convention: the gradient carries the defect), while the KL term's value
    # (β > 0) is no surrogate and stays a deviation
    "torchrl": {"CISPOLoss._compute_policy_objective [cispo]":
                [("value", "surrogate convention"), ("grad", "deviation")],
                "GRPOLoss._kl_to_ref [token_mean, kl_to_ref_coeff 0.1]":
                [("value", "deviation"), ("grad", "deviation")]},
    # k3's exp overflows in float32 past a log-ratio of 88.7 (NaN gradient under the clamp);
    # the decoupled loss without rejection_sampling applies no behaviour weight (functional.py)
    "areal": {"KLEstimator._compute_approx_kl [k3]": [("grad", "robustness")],
              "ppo_actor_loss_fn [decoupled, rejection_sampling None]":
                  [("value", "documented choice"), ("grad", "documented choice")]},
    # bnpo's local token count (as TRL's); the custom backward ignores the incoming gradient
    "unsloth": {"grpo_compute_loss [bnpo]": [("microbatch", "documented choice")],
                "UnslothEfficientGRPO.forward [dapo, β = 0.04, the trainer's path]":
                [("grad", "robustness")]},
    # the token mean's count + 1e-6 (loss.py:129), reproduced at the rows whose cases reach the
    # float64 tolerance's edge (one or two tokens); with kl_penalty_coef the KL's mean has it
    # too, within float32's precision
    "art": {f"loss_fn [{row}]": [("value", "precision")] + (
        [("grad", "precision")] if row.startswith("ppo") or "kl" in row else [])
        for row in ("sequence", "average", "geometric_average", "ppo sequence",
                    "ppo geometric_average", "kl_penalty_coef",
                    "ppo kimi_k2_tau kl_penalty_coef", "trajectory weights")},
    # (where jax is installed) low_var_kl's exp overflows float32 past a log-ratio of 88.7
    "tunix": {"compute_kl_divergence [low_var_kl]": [("finite", "robustness"),
                                                     ("grad", "robustness")]},
}
# the new deviations a pinned card carries: defects no known entry reproduces (the card exits 1)
NEW = {"trinity": {"SAPOPolicyLossFn [sapo]"},
       "torchrl": {"CISPOLoss._compute_policy_objective [cispo]",
                   "GRPOLoss._kl_to_ref [token_mean, kl_to_ref_coeff 0.1]"}}
# rows whose loss masks by multiplying after exp of every position's log-ratio (or sums padding
# into a product): garbage at padding leaks into them, a robustness note only
MULTIPLY_MASKED = {
    "trl": {"GRPOTrainer._compute_loss [" + t + "]" for t in
            ("dapo", "dapo, β = 0.04", "dapo, β = 0.04, bias-corrected KL", "grpo", "bnpo", "dr_grpo", "luspo", "cispo", "gspo",
             "sapo", "vespo", "sapo, sequence")},
    "torchrl": {"GRPOLoss.forward [prompt_mean]"},
    "areal": {"Normalization.__call__ [batch (adv_norm)]"},
    "unsloth": {"grpo_compute_loss [" + t + "]" for t in
                ("dapo", "dapo, ε 0.2/0.28", "dapo, β = 0.04", "grpo", "bnpo", "dr_grpo",
                 "luspo", "cispo", "gspo", "sapo")},
    "art": {"loss_fn [" + t + "]" for t in
            ("default", "ppo", "ppo 0.2/0.28", "sequence", "average", "geometric_average",
             "ppo sequence", "ppo geometric_average", "kimi_k2_tau",
             "kl_penalty_coef", "ppo kimi_k2_tau kl_penalty_coef", "sum",
             "trajectory weights")},
    "tunix": {"grpo_loss_fn [grpo]", "grpo_loss_fn [token-mean, ε 0.2/0.28, dual clip 3]",
              "aggregate_loss [token-mean]", "aggregate_loss [sequence-mean-token-scale]"},
}
INSTALLED = [n for n in EXPECTED
             if importlib.util.find_spec(trainers.get(n).package) is not None]
needs = pytest.mark.skipif  # a skip names the missing trainer; CI installs all three


def _installed(name):
    return needs(importlib.util.find_spec(trainers.get(name).package) is None,
                 reason=f"{name} is not installed (.ci/run installs it with --no-deps)")


class _Cards(dict):
    """Each installed trainer's card, computed on first use: inside that trainer's own test, so
    that mutmut's per-test call records tie each adapter to the test that checks its verdicts."""

    def __contains__(self, name):
        return name in INSTALLED

    def __missing__(self, name):
        self[name] = c = card.run(trainers.get(name))
        return c


@pytest.fixture(scope="module")
def cards():
    return _Cards()


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_row_of_a_pinned_trainer_runs_and_gives_the_expected_verdict(name, cards):
    if name not in cards:
        pytest.skip(f"{name} is not installed (.ci/run installs it with --no-deps)")
    c = cards[name]
    t = trainers.get(name)
    assert c.source.version == t.pinned
    assert [r.row.name for r in c.rows] == [r.name for r in t.rows]
    for r in c.rows:
        new = r.row.name in NEW.get(name, ())
        assert r.verdict in (("DOES NOT CONFORM",) if new else
                             ("CONFORMS", "KNOWN DEVIATION")), (r.row.name, r.verdict, r.reason)
        assert r.report.n_cases > 0
        graded = [(f["check"], f["grade"]) for f in r.findings if f["check"] != "garbage"]
        assert graded == EXPECTED[name].get(r.row.name, []), (r.row.name, r.findings)
        for f in r.findings:                     # nothing else on a pinned card is new
            assert f["known"] or new and f["grade"] == "deviation", (r.row.name, f)
            assert f["check"] != "garbage" or f["grade"] == "robustness"
        if r.row.name in MULTIPLY_MASKED.get(name, ()):
            assert any(f["check"] == "garbage" for f in r.findings), r.row.name
    if NEW.get(name):
        assert c.exit_code == 1 and c.verdict == "DOES NOT CONFORM"
    else:
        assert c.exit_code == 0 and c.verdict == (
            "KNOWN DEVIATIONS" if any(g == "deviation" for rows in EXPECTED[name].values()
                                      for _, g in rows) else "CONFORMS")
    assert t.runs and t.does_not_run and "## Branches" in c.markdown()
    assert c.not_covered                          # verl's SAPO & co., TRL's vespo, ...
    ran, listed = c.functions()
    assert 0 < ran < listed


@pytest.mark.parametrize("name", ["art", "tunix"])
def test_every_function_a_card_does_not_run_has_its_own_reason_and_each_reason_a_function(
        name, cards):
    if name not in cards:
        pytest.skip(f"{name} is not installed (.ci/run installs it with --no-deps)")
    c, t = cards[name], trainers.get(name)
    not_covered = {q for _, q, _ in c.not_covered}
    assert not_covered
    for q in not_covered:
        assert c.reason(q) and not c.reason(q).startswith("new in this release"), q
    assert set(dict(t.not_run)) == not_covered      # no reason left for a function not listed


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_card_names_its_trainer_first_and_each_row_by_function_and_time(name, cards):
    if name not in cards:
        pytest.skip(f"{name} is not installed (.ci/run installs it with --no-deps)")
    c = cards[name]
    assert c.text().splitlines()[0].startswith(f"report card: {name} {c.source.version}")
    if any(f.get("counterexample") for r in c.rows for f in r.findings):
        assert "    minimal counterexample (the inputs as passed, padding included):" in \
            c.text().splitlines()
    d = c.to_dict()
    assert d["root"] == c.source.root and os.path.isdir(os.path.join(d["root"],
                                                                     trainers.get(name).package))
    assert [r["function"] for r in d["rows"]] == [r.row.qualname for r in c.rows]
    assert all(0.0 <= r.seconds <= c.seconds for r in c.rows)
    assert sum(r.seconds for r in c.rows) <= c.seconds


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_published_card_is_what_the_command_prints(name, cards):
    if name not in cards:
        pytest.skip(f"{name} is not installed (.ci/run installs it with --no-deps)")
    c = cards[name]
    path = os.path.join(DOCS, f"{name}-{c.source.version}.md")
    with open(path, encoding="utf-8") as fh:
        published = fh.read()

    def stable(text):          # the stand-ins depend on what else is installed here
        return "\n".join(line for line in text.splitlines() if not line.startswith("- loaded:"))
    # verdicts and findings exactly, numbers to what another CPU's kernels can change
    assert render_examples.same(stable(published), stable(c.markdown())), \
        f"regenerate: python -m crosscheck trainer {name} --markdown {path}"


@_installed("verl")
def test_a_fork_with_an_edited_loss_shows_an_unexplained_deviation(tmp_path):
    src = os.path.dirname(importlib.util.find_spec("verl").origin)
    shutil.copytree(src, tmp_path / "verl")
    f = tmp_path / "verl" / "trainer" / "ppo" / "core_algos.py"
    text = f.read_text()
    edited = text.replace("id2std[idx] = torch.std(scores_tensor)",
                          "id2std[idx] = torch.std(scores_tensor, unbiased=False)")
    edited = edited.replace("    index: np.ndarray,\n    epsilon: float = 1e-6,\n    config: "
                            "Optional[AlgoConfig] = None,\n    **kwargs,",
                            "    uid: np.ndarray,\n    epsilon: float = 1e-6,\n    config: "
                            "Optional[AlgoConfig] = None,\n    **kwargs,")
    assert edited.count("unbiased=False") > text.count("unbiased=False") and "uid:" in edited
    f.write_text(edited)
    c = card.run(trainers.get("verl"), path=str(tmp_path),
                 only=["compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage"])
    assert c.source.origin == "checkout"
    grpo = [r for r in c.rows if r.row.name == "compute_grpo_outcome_advantage"][0]
    assert grpo.verdict == "DOES NOT CONFORM"
    assert grpo.findings[0]["check"] == "value" and grpo.findings[0]["kind"] == "new"
    rloo = [r for r in c.rows if r.row.name == "compute_rloo_outcome_advantage"][0]
    assert rloo.verdict == "COULD NOT ADAPT" and "no parameter index" in rloo.reason
    assert c.exit_code == 1 and "could not adapt: the signature changed" in c.text()


MINIMIND_GRPO = '''
    import torch


    def grpo_train_epoch(rewards, args):
        grouped_rewards = torch.stack(torch.split(rewards, args.num_generations))
        centre = grouped_rewards.mean(-1, keepdim=True)
        spread = (grouped_rewards - centre).pow(2).mean(-1, keepdim=True).sqrt()
        advantages = ((grouped_rewards - centre) / (spread + 1e-4)).flatten()
        return advantages
    '''
MINIMIND_PPO = '''
    def ppo_train_epoch(advantages, resp_policy_mask):
        adv_mean = (advantages * resp_policy_mask).sum() / resp_policy_mask.sum().clamp(min=1)
        n = resp_policy_mask.sum().clamp(min=1)
        centred = (advantages - adv_mean) * resp_policy_mask
        advantages = centred / (centred.pow(2).sum() / n + 1e-8).sqrt()
        return advantages
    '''


def test_minimind_blocks_run_from_a_checkout_and_missing_blocks_are_reported(tmp_path):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "train_grpo.py").write_text(textwrap.dedent(MINIMIND_GRPO))
    (tmp_path / "trainer" / "train_ppo.py").write_text(textwrap.dedent(MINIMIND_PPO))
    c = card.run(trainers.get("minimind"), path=str(tmp_path))
    verdicts = {r.row.name: r.verdict for r in c.rows}
    assert verdicts["grpo_train_epoch [advantages]"] == "CONFORMS"
    assert verdicts["ppo_train_epoch [whitening]"] == "CONFORMS"
    # the script never assigns the GAE block's first variable: that block is not in it
    assert verdicts["ppo_train_epoch [GAE]"] == "NOT IN THIS VERSION"
    gae = [r for r in c.rows if r.row.name == "ppo_train_epoch [GAE]"][0]
    assert "no statement block from gen_len" in gae.reason
    assert "ppo_train_epoch never assigns gen_len" in gae.reason
    whiten = [r for r in c.rows if r.row.name == "ppo_train_epoch [whitening]"][0]
    assert (whiten.line, whiten.end_line) == (3, 6)
    assert c.exit_code == 0 and c.verdict == "INCOMPLETE"      # nothing new: a gap


def test_minimind_needs_a_path():
    with pytest.raises(loading.TrainerNotFound, match="--path"):
        card.run(trainers.get("minimind"))


@_installed("trl")
def test_trls_sapo_deviation_is_its_float32_temperature():
    """TRL's SAPO temperatures are float32 (the card's Known defect, under the float64 audit
    tolerance on its cases): with τ_neg = float32(1.05) the reference gives TRL's loss to the
    last bits, with 1.05 it does not."""
    import numpy as np
    import torch

    import ref_numpy
    from crosscheck.trainer import loading, trl
    t = trainers.get("trl")
    row = next(r for r in t.rows if r.name.endswith("[sapo]"))
    source = loading.locate(t.package, t.dist, None, t.version_of, needs=t.modules)
    lp = np.array([[-0.3, -0.2, -0.3, -0.7], [-0.6, -0.6, -0.7, -0.3]])
    old = np.array([[-0.5, 0.1, -0.6, -1.9], [-0.2, 0.0, -1.9, -0.4]])
    A, m = np.array([-1.2, 1.4]), np.array([[1, 1, 1, 0], [1, 1, 0, 1]], bool)
    with loading.Loaded(source, t.modules, t.real, t.stand_in) as loaded, loading.quiet_warnings():
        fn = loaded.module(trl.GRPO).GRPOTrainer._compute_loss
        got = float(row.adapt(fn)(torch.tensor(lp), torch.tensor(old), torch.tensor(A),
                                  torch.tensor(m)))
    kw = dict(loss="sapo", agg="seq-mean-token-mean", empty_rows="include", tau_pos=1.0)
    exact = ref_numpy.policy_objective(lp, old, A, m, tau_neg=1.05, **kw)
    as_f32 = ref_numpy.policy_objective(lp, old, A, m, tau_neg=float(np.float32(1.05)), **kw)
    assert abs(got - exact) > 1e-8 * abs(exact)
    assert got == pytest.approx(as_f32, rel=1e-14)


def test_a_nested_block_ends_at_the_compound_statement_that_assigns_its_last_name(tmp_path):
    """A block may end inside an if/elif chain (TRL's vLLM weights): with nested, the chain is
    part of it; without, the block stops at the last direct assignment."""
    from crosscheck.trainer import blocks
    f = tmp_path / "script.py"
    f.write_text("def step(x, mode):\n"
                 "    y = x + 1\n"
                 "    w = y * 2\n"
                 "    if mode == 'a':\n"
                 "        w = w + 10\n"
                 "    else:\n"
                 "        w = w - 10\n"
                 "    return w\n")
    run, lo, hi = blocks.compile_block(str(f), "Trainer.step", "y", "w", ("w",), True)
    assert (lo, hi) == (2, 7)
    assert run(x=1.0, mode="a") == 14.0 and run(x=1.0, mode="b") == -6.0
    _, lo, hi = blocks.compile_block(str(f), "step", "y", "w", ("w",))
    assert (lo, hi) == (2, 3)


def test_a_block_is_found_in_an_else_branch_and_a_finally_clause(tmp_path):
    # MiniMind's loops put math under if/else; a try's finally body is searched too
    from crosscheck.trainer import blocks
    f = tmp_path / "script.py"
    f.write_text("def step(x, warm):\n"
                 "    if warm:\n"
                 "        return x\n"
                 "    else:\n"
                 "        y = x + 1\n"
                 "        w = y * 2\n"
                 "    try:\n"
                 "        pass\n"
                 "    finally:\n"
                 "        u = x - 1\n"
                 "        v = u * 3\n"
                 "    return w + v\n")
    run, lo, hi = blocks.compile_block(str(f), "step", "y", "w", ("w",))
    assert (lo, hi) == (5, 6) and run(x=1.0) == 4.0
    run, lo, hi = blocks.compile_block(str(f), "step", "u", "v", ("v",))
    assert (lo, hi) == (10, 11) and run(x=1.0) == 0.0


@_installed("openrlhf")
def test_the_command_splits_a_card_over_two_processes_and_prints_the_same_card():
    # run as a program on two cores the card forks a child for every other row; the card it
    # prints is the one a single process computes, row for row, finding for finding
    import json
    import subprocess
    import sys
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the command runs the card in one process")
    proc = subprocess.run([sys.executable, "-m", "crosscheck", "trainer", "openrlhf", "--cases",
                           "12", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    forked = json.loads(proc.stdout)
    one = card.run(trainers.get("openrlhf"), cases=12).to_dict()

    def stable(d):
        d = dict(d, seconds=None, loaded=None)
        d["rows"] = [dict(r, seconds=None) for r in d["rows"]]
        return d
    assert stable(forked) == stable(json.loads(json.dumps(one)))
    assert [r["function"] for r in forked["rows"]][:3] == \
        [r.qualname for r in trainers.get("openrlhf").rows][:3]


def test_per_token_maps_a_call_over_the_valid_tokens_and_gives_0_elsewhere():
    import torch
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = torch.tensor([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]])
    mask = torch.tensor([[True, False, True], [False, False, False]])
    calls = []

    def call(x, y):
        calls.append(tuple(x.shape))
        return (x * y + 1).sum()
    got = card.per_token(call, mask, a, b)
    assert torch.equal(got, torch.tensor([[11.0, 0.0, 91.0], [0.0, 0.0, 0.0]]))
    assert calls == [(1, 1), (1, 1)]
    assert card.per_token(call, mask[:, :0], a[:, :0], b[:, :0]).shape == (2, 0)
    assert card.per_token(call, mask[:0], a[:0], b[:0]).shape == (0, 3)


# ROLL (a checkout only): fixture files written here in the shape of roll/utils/functionals.py
# at commit 8eb27cc2 (its signatures and call conventions), not its code
ROLL_FUNCTIONALS = '''
import torch
from roll.platforms import current_platform          # an object its package __init__ builds
from roll.utils.logging import get_logger

logger = get_logger()


def _msum(x, m, dim=None):
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def agg_loss(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None,
             global_valid_samples=None, weights=None):
    n = loss_mask.sum() if batch_num_tokens is None else batch_num_tokens
    rows = loss_mat.shape[0] if global_valid_samples is None else global_valid_samples
    if loss_agg_mode == "token-mean":
        return NUMERATOR / n
    per_row = _msum(loss_mat, loss_mask, -1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_row = per_row / (loss_mask.sum(-1) + 1e-8)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return per_row.sum() / loss_mask.shape[-1]
    return per_row.sum() / (rows + 1e-8)


def masked_whiten(values, mask, shift_mean=True):
    n = mask.sum()
    mean = _msum(values, mask) / n
    var = _msum((values - mean) ** 2, mask) / n * n / (n - 1)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    return out if shift_mean else out + mean


def compute_approx_kl(log_probs, log_probs_base, action_mask=None, kl_penalty="kl"):
    d = log_probs - log_probs_base
    if kl_penalty == "kl":
        k = d
    elif kl_penalty == "abs":
        k = d.abs()
    elif kl_penalty == "mse":
        k = 0.5 * d * d
    else:
        k = (torch.exp(-d) - 1 + d).clamp(-10, 10)
    return k if action_mask is None else k * action_mask


def compute_gae_advantage_return(token_level_rewards, values, gamma, lambd):
    with torch.no_grad():
        T = token_level_rewards.shape[-1]
        running, out = 0.0, [None] * T
        for t in range(T - 1, -1, -1):
            after = values[:, t + 1] if t + 1 < T else 0.0
            running = token_level_rewards[:, t] + gamma * after - values[:, t] + \\
                gamma * lambd * running
            out[t] = running
        adv = torch.stack(out, dim=1)
    return adv, adv + values


def compute_reinforce_return(token_level_rewards, gamma, lambd):
    with torch.no_grad():
        running, out = 0.0, []
        for t in range(token_level_rewards.shape[-1] - 1, -1, -1):
            running = token_level_rewards[:, t] + gamma * running
            out.append(running)
        returns = torch.stack(out[::-1], dim=1)
    return returns, returns


def reward_norm(response_level_rewards, n_sample=-1, running_ctrl={}, norm_mean_type=None,
                norm_std_type=None):
    g = response_level_rewards.reshape(-1, n_sample)
    return ((g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True) + 1e-6)).reshape(-1)
'''
ROLL_PACKAGE = {
    "roll/__init__.py": "import os\nos.environ.setdefault('RAY_DEDUP_LOGS', '1')\n",
    "roll/platforms/__init__.py": "class _Cpu:\n    device_type = 'cpu'\n\n\ncurrent_platform = _Cpu()\n",
    "roll/utils/__init__.py": "",
    "roll/utils/logging.py": (
        "import logging, os\n\n\ndef get_logger():\n"
        "    d = os.environ.get('ROLL_LOG_DIR', './output/logs')\n"
        "    os.makedirs(d, exist_ok=True)\n    print('Created or verified log directory:', d)\n"
        "    return logging.getLogger('roll')\n"),
}


def _checkout(root, files):
    """A fake checkout: each file (a path relative to root) written with its text."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _roll_checkout(root, numerator):
    _checkout(root, ROLL_PACKAGE)
    (root / "roll/utils/functionals.py").write_text(ROLL_FUNCTIONALS.replace("NUMERATOR",
                                                                            numerator))


@pytest.mark.parametrize("numerator, token_mean", [
    ("_msum(loss_mat, loss_mask)", "CONFORMS"),
    ("loss_mat.sum()", "DOES NOT CONFORM")])          # ROLL 8eb27cc2's token-mean
def test_roll_cards_a_checkout_and_finds_an_unmasked_token_mean_and_a_mask_free_gae(
        tmp_path, monkeypatch, capsys, numerator, token_mean):
    _roll_checkout(tmp_path, numerator)
    monkeypatch.chdir(tmp_path)
    c = card.run(trainers.get("roll"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    assert verdicts.pop("agg_loss [token-mean]") == token_mean
    # no mask: the critic's value at the first padding position is bootstrapped from
    for gae in ("compute_gae_advantage_return [γ 1, λ 0.95]",
                "compute_gae_advantage_return [γ 0.99, λ 0.95]"):
        assert verdicts.pop(gae) == "DOES NOT CONFORM"
    assert set(verdicts.values()) == {"CONFORMS"}, verdicts
    assert c.exit_code == 1
    assert capsys.readouterr().out == ""                  # its import-time print is dropped
    assert not (tmp_path / "output").exists()             # ROLL_LOG_DIR was a temporary dir


def test_roll_needs_a_path():
    with pytest.raises(loading.TrainerNotFound):
        card.run(trainers.get("roll"))


# prime-rl (a checkout only): fixture files written here in the shape of prime-rl at commit
# 559b44772 (two source roots, namespace packages, its signatures and imports), not its code
PRIMERL_LOSS = '''
from dataclasses import dataclass
from typing import Callable

import torch
from beartype import beartype as typechecker               # not installed: stood in
from jaxtyping import Bool, Float, jaxtyped
from torch import Tensor

from prime_rl.configs.trainer import CustomLossConfig, DefaultLossConfig, IPOLossConfig
from prime_rl.utils.utils import import_object


@dataclass
class LossInputs:
    trainer_logprobs: Float[Tensor, " seq"]
    inference_logprobs: Float[Tensor, " seq"]
    ref_logprobs: Float[Tensor, " seq"] | None
    advantages: Float[Tensor, " seq"]
    loss_mask: Bool[Tensor, " seq"]
    loss_weights: Float[Tensor, " seq"] | None = None


@dataclass
class LossOutputs:
    loss: Tensor
    metrics: dict


@jaxtyped(typechecker=typechecker)
def selective_log_softmax(logits, index):
    return torch.log_softmax(logits, -1).gather(-1, index[..., None])[..., 0]


def default_loss_fn(inputs, loss_config):
    lp, q = inputs.trainer_logprobs, inputs.inference_logprobs
    log_r = lp - q
    r = torch.exp(log_r)
    moved = torch.exp(lp) - torch.exp(q)
    out = torch.where(inputs.advantages > 0, moved > loss_config.dppo_mask_high,
                      moved < -loss_config.dppo_mask_low)
    keep = inputs.loss_mask & ~out
    pg = keep * (loss_config.adv_tau * inputs.advantages) * r
    kl = KL_MASK * log_r ** 2
    per_token = -pg + loss_config.kl_tau * kl
    if inputs.loss_weights is not None:
        per_token = per_token * inputs.loss_weights
    return LossOutputs(loss=per_token.sum(), metrics={})


def setup_rl_loss_fn(loss_config) -> Callable:
    if isinstance(loss_config, CustomLossConfig):
        fn = import_object(loss_config.import_path)
        return lambda inputs: fn(inputs, **loss_config.kwargs)
    return lambda inputs: default_loss_fn(inputs, loss_config)


def compute_loss(trainer_logprobs, inference_logprobs, ref_logprobs, advantages, loss_mask,
                 rl_weights, ce_weights, ref_kl_weights, rl_loss_fn, rl_scale, ce_scale,
                 ref_kl_scale):
    n = len(trainer_logprobs)
    ref_logprobs = [None] * n if ref_logprobs is None else ref_logprobs
    total = trainer_logprobs[0].sum() * 0.0
    for t, i, ref, a, m in zip(trainer_logprobs, inference_logprobs, ref_logprobs, advantages,
                               loss_mask):
        total = total + rl_loss_fn(LossInputs(t, i, ref, a, m)).loss
    return total / rl_scale, {}
'''
PRIMERL_GRPO = '''
from __future__ import annotations

import torch
import verifiers.v1 as vf

from prime_rl.configs.algorithm import GRPOAlgoConfig
from prime_rl.orchestrator.algo.base import Algorithm, iter_trainable_traces
from prime_rl.orchestrator.algo.routing import assign_advantages


class GRPOAlgorithm(Algorithm):
    def __init__(self, config: GRPOAlgoConfig, policy_pool):
        super().__init__(config, policy_pool)
        self.length_penalty = config.length_penalty

    async def score_group(self, episodes: list[vf.Episode]) -> None:
        traces = [trace for _, trace in iter_trainable_traces(episodes)]
        rewards = torch.tensor([t.reward for t in traces], dtype=torch.float32)
        advantages = SHAPE
        for trace, advantage in zip(traces, advantages.tolist(), strict=True):
            assign_advantages(trace, advantage)
'''
PRIMERL_MAXRL = '''
import torch
import verifiers.v1 as vf

from prime_rl.orchestrator.algo.base import Algorithm, iter_trainable_traces
from prime_rl.orchestrator.algo.routing import assign_advantages


class MaxRLAlgorithm(Algorithm):
    async def score_group(self, episodes: list[vf.Episode]) -> None:
        traces = [trace for _, trace in iter_trainable_traces(episodes)]
        rewards = torch.tensor([t.reward for t in traces], dtype=torch.float32)
        mean = rewards.mean()
        advantages = torch.zeros_like(rewards) if mean <= 0 else (rewards - mean) / mean
        for trace, advantage in zip(traces, advantages.tolist(), strict=True):
            assign_advantages(trace, advantage)
'''
PRIMERL_PACKAGE = {
    "packages/prime-rl-configs/src/prime_rl/configs/__init__.py": "",
    "packages/prime-rl-configs/src/prime_rl/configs/trainer.py": (
        "from pydantic import Field\nfrom pydantic_config import BaseConfig\n\n\n"
        "class DefaultLossConfig(BaseConfig):\n    dppo_mask_low: float = Field(0.2, ge=0)\n\n\n"
        "class IPOLossConfig(BaseConfig):\n    ipo_threshold: float = Field(0.1, ge=0)\n\n\n"
        "class CustomLossConfig(BaseConfig):\n    import_path: str\n"),
    "packages/prime-rl-configs/src/prime_rl/configs/algorithm.py": (
        "import verifiers.v1 as vf\nfrom renderers import RendererConfig\n"
        "from pydantic_config import BaseConfig\n\n\n"
        "class GRPOAlgoConfig(BaseConfig):\n    length_penalty: None = None\n"),
    "src/prime_rl/utils/utils.py": (
        "import importlib\n\nimport torch.distributed as dist\nimport wandb\n\n\n"
        "def import_object(path):\n    module, _, name = path.rpartition('.')\n"
        "    return getattr(importlib.import_module(module), name)\n"),
    "src/prime_rl/trainer/rl/__init__.py": "",
    "src/prime_rl/orchestrator/__init__.py": "",
    "src/prime_rl/orchestrator/algo/__init__.py": "from .grpo import GRPOAlgorithm\n",
    "src/prime_rl/orchestrator/algo/base.py": (
        "import verifiers.v1 as vf\n\n\n"
        "def iter_trainable_traces(episodes):\n    for episode in episodes:\n"
        "        for trace in episode.traces:\n"
        "            if trace.has_error or not trace.agent.trainable:\n                continue\n"
        "            if any(any(node.mask) for node in trace.nodes):\n"
        "                yield episode, trace\n\n\n"
        "class Algorithm:\n    def __init__(self, config, policy_pool):\n"
        "        self.policy_pool = policy_pool\n"),
    "src/prime_rl/orchestrator/algo/routing.py": (
        "import verifiers.v1 as vf\n\nfrom prime_rl.transports.rollouts import TrainingSample\n\n\n"
        "def assign_advantages(trace, value):\n"
        "    for node in trace.nodes:\n        node.advantages = [float(value)] * sum(node.mask)\n"),
    "src/prime_rl/transports/rollouts.py": (
        "import msgspec\n\n\nclass TrainingSample(msgspec.Struct, array_like=True, gc=False):\n"
        "    token_ids: list\n"),
}


def _primerl_checkout(root, kl_mask, shape):
    _checkout(root, PRIMERL_PACKAGE)
    (root / "src/prime_rl/trainer/rl/loss.py").write_text(PRIMERL_LOSS.replace("KL_MASK", kl_mask))
    (root / "src/prime_rl/orchestrator/algo/grpo.py").write_text(
        PRIMERL_GRPO.replace("SHAPE", shape))
    (root / "src/prime_rl/orchestrator/algo/max_rl.py").write_text(PRIMERL_MAXRL)


@pytest.mark.parametrize("kl_mask, shape, loss, grpo", [
    ("inputs.loss_mask", "rewards - rewards.mean()", "CONFORMS", "CONFORMS"),
    # the KL pull-back only inside the trust region; a std the default does not divide by
    ("keep", "(rewards - rewards.mean()) / (rewards.std() + 1e-6)", "DOES NOT CONFORM",
     "DOES NOT CONFORM")])
def test_primerl_cards_a_checkout_of_two_source_roots(tmp_path, kl_mask, shape, loss, grpo):
    _primerl_checkout(tmp_path, kl_mask, shape)
    c = card.run(trainers.get("prime-rl"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    assert verdicts == {"compute_loss [default loss]": loss,
                        "GRPOAlgorithm.score_group": grpo,
                        "MaxRLAlgorithm.score_group": "CONFORMS"}, [r.reason for r in c.rows]
    assert c.exit_code == (0 if loss == "CONFORMS" else 1)
    # the --json card says how it loaded the code and what it stood in
    loaded = " ".join(c.to_dict()["loaded"])
    assert "loaded by file" in loaded
    assert re.search(r"stand-ins: (\w+ \([^)]*\), )*msgspec \(not installed\)", loaded), loaded


REGISTRY = '''
from prime_rl.orchestrator.algo.grpo import GRPOAlgorithm
from .max_rl import MaxRLAlgorithm
from .planted import PlantedAlgorithm

ALGORITHM_CLASSES = {"grpo": GRPOAlgorithm, "max_rl": MaxRLAlgorithm,
                     "planted": PlantedAlgorithm, "sft": SFTDistillAlgorithm}
LOADERS = {"by_path": "prime_rl.orchestrator.algo.planted.PathAlgorithm", "other": "json.dumps",
           "short": "prime_rl.x"}
'''


def test_registry_entries_are_read_as_data_dotted_paths_and_imported_names(tmp_path):
    path = tmp_path / "registry.py"
    path.write_text(REGISTRY)
    got = card._registry_entries(str(path), "prime_rl.orchestrator.algo", "prime_rl")
    assert got == [("grpo", "prime_rl.orchestrator.algo.grpo", "GRPOAlgorithm"),
                   ("max_rl", "prime_rl.orchestrator.algo.max_rl", "MaxRLAlgorithm"),
                   ("planted", "prime_rl.orchestrator.algo.planted", "PlantedAlgorithm"),
                   ("by_path", "prime_rl.orchestrator.algo.planted", "PathAlgorithm")]


def test_a_registry_entry_with_no_row_and_no_reason_is_new_in_this_release(tmp_path):
    _primerl_checkout(tmp_path, "inputs.loss_mask", "rewards - rewards.mean()")
    algo = tmp_path / "src/prime_rl/orchestrator/algo"
    (algo / "planted.py").write_text(
        "from prime_rl.orchestrator.algo.base import Algorithm\n\n\n"
        "class PlantedAlgorithm(Algorithm):\n    async def score_group(self, episodes):\n"
        "        pass\n")
    (algo / "__init__.py").write_text(
        "from .grpo import GRPOAlgorithm\nfrom .max_rl import MaxRLAlgorithm\n"
        "from .planted import PlantedAlgorithm\n\nALGORITHM_CLASSES = {'grpo': GRPOAlgorithm, "
        "'max_rl': MaxRLAlgorithm, 'planted': PlantedAlgorithm}\n")
    c = card.run(trainers.get("prime-rl"), path=str(tmp_path), cases=4,
                 only=["GRPOAlgorithm.score_group"])
    said = c.reason("PlantedAlgorithm")
    assert said.startswith("new in this release") and "'planted'" in said, said
    assert ("prime_rl/orchestrator/algo/planted.py", "PlantedAlgorithm", 4) in c.not_covered
    # the registered classes with a row (GRPO, MaxRL) are not listed
    assert not {q for _, q, _ in c.not_covered} & {"GRPOAlgorithm", "MaxRLAlgorithm"}


def test_primerl_needs_a_path():
    with pytest.raises(loading.TrainerNotFound):
        card.run(trainers.get("prime-rl"))


# slime (a checkout only): fixture files written here in the shape of slime at commit 624b824a8
# (torch.compile'd losses, Megatron's parallel state, a ray actor), not its code
SLIME_PPO = '''
import torch


@torch.compile(dynamic=True)
def compute_approx_kl(log_probs, log_probs_base, kl_loss_type, importance_ratio=None):
    d = log_probs.float() - log_probs_base.float()
    kl = {"k1": d, "k2": d * d / 2}.get(kl_loss_type)
    if kl is None:
        kl = torch.exp(-d) - 1 + d
    return torch.clamp(kl, -10, 10) if kl_loss_type == "low_var_kl" else kl


@torch.compile(dynamic=True)
def compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=None):
    r = torch.exp(-ppo_kl)
    a, b = -r * advantages, -r.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    loss = PESSIMISTIC(a, b)
    if eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.min(-eps_clip_c * advantages, loss), loss)
    return loss, (b > a).float()


@torch.compile(dynamic=True)
def compute_cispo_loss(ppo_kl, log_probs, advantages, eps_clip, eps_clip_high):
    w = torch.clamp(torch.exp(-ppo_kl), 1 - eps_clip, 1 + eps_clip_high)
    return -w.detach() * advantages * log_probs, w


def compute_opsm_mask(args, full_log_probs, full_old_log_probs, advantages, loss_masks):
    keep, frac = [], torch.tensor(0.0)
    for n, o, a, m in zip(full_log_probs, full_old_log_probs, advantages, loss_masks):
        drift = (OPSM_DRIFT * m).sum() / torch.clamp_min(m.sum(), 1)
        off = ((a < 0) & (drift > args.opsm_delta)).float()
        frac += off.sum() / torch.clamp_min(m.sum(), 1)
        keep.append(1 - off)
    return torch.cat(keep, dim=0), frac


def compute_gspo_kl(full_log_probs, full_old_log_probs, local_log_probs, loss_masks):
    kl = [((o - n) * m).sum() / torch.clamp_min(m.sum(), 1)
          for n, o, m in zip(full_log_probs, full_old_log_probs, loss_masks)]
    return torch.cat([k.expand_as(x) for k, x in zip(kl, local_log_probs)])


def vanilla_gae(rewards, values, gamma, lambd):
    last, out = torch.zeros_like(rewards[:, 0]), []
    for t in reversed(range(rewards.shape[1])):
        nxt = values[:, t + 1] if t + 1 < rewards.shape[1] else 0.0
        last = rewards[:, t] + gamma * nxt - values[:, t] + gamma * lambd * last
        out.append(last)
    adv = torch.stack(out[::-1], 1)
    return adv, adv + values


def chunked_gae(rewards, values, gamma, lambd, chunk_size=128):
    return vanilla_gae(rewards, values, gamma, lambd)


def get_advantages_and_returns_batch(total_lengths, response_lengths, values_list,
                                     rewards_list, gamma, lambd, chunked=True):
    T = max(response_lengths)
    pad = lambda xs: torch.stack([torch.cat([x, x.new_zeros(T - len(x))]) for x in xs])  # noqa
    adv, ret = chunked_gae(pad(rewards_list), pad(values_list), gamma, lambd)
    return ([a[:n] for a, n in zip(adv, response_lengths)],
            [r[:n] for r, n in zip(ret, response_lengths)])


def chunked_discounted_returns(rewards, discount, chunk_size=128):
    out, g = [], torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        g = rewards[:, t] + discount * g
        out.append(g)
    return torch.stack(out[::-1], 1)
'''
SLIME_PACKAGE = {
    "slime/__init__.py": "raise ImportError('the package init needs the GPU stack')\n",
    "slime/utils/__init__.py": "",
    "slime/backends/__init__.py": "",
    "slime/backends/megatron_utils/__init__.py": "import megatron.training\n",
    "slime/backends/megatron_utils/cp_utils.py": (
        "import torch\nfrom megatron.core import mpu\n\n\n"
        "def get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks,\n"
        "                           sample_denoms=None, calculate_per_token_loss=False):\n"
        "    denoms = [m.sum() for m in loss_masks] if sample_denoms is None else sample_denoms\n"
        "    if mpu.get_context_parallel_world_size() != 1:\n"
        "        raise RuntimeError('context parallel')\n"
        "    def f(x):\n"
        "        return sum((x_i * m).sum() / torch.clamp_min(d, 1) for x_i, m, d in\n"
        "                   zip(x.split(response_lengths), loss_masks, denoms))\n"
        "    return f\n"),
    "slime/backends/megatron_utils/loss.py": (
        "import torch\nfrom megatron.core import mpu\n\n\n"
        "def vanilla_tis_function(args, *, pg_loss, train_log_probs, rollout_log_probs,\n"
        "                         loss_masks, **kwargs):\n"
        "    w = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))\n"
        "    return pg_loss * w.clamp(args.tis_clip_low, args.tis_clip), loss_masks, {}\n\n\n"
        "def icepop_function(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks,\n"
        "                    **kwargs):\n"
        "    w = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))\n"
        "    w = torch.where((w >= args.tis_clip_low) & (w <= args.tis_clip), w, 0 * w)\n"
        "    return pg_loss * w, loss_masks, {}\n"),
    "slime/ray/__init__.py": "",
    "slime/ray/rollout.py": (
        "import ray\nimport torch\n\n\n@ray.remote\nclass RolloutManager:\n"
        "    def _post_process_rewards(self, samples):\n"
        "        raw = [s.get_reward_value(self.args) for s in samples]\n"
        "        r = torch.tensor(raw, dtype=torch.float).reshape(-1, "
        "self.args.n_samples_per_prompt)\n"
        "        r = r - r.mean(dim=-1, keepdim=True)\n"
        "        r = r / (r.std(dim=-1, keepdim=True) + 1e-6)\n"
        "        return raw, r.flatten().tolist()\n"),
}


def _slime_checkout(root, pessimistic, drift="(o - n)"):
    _checkout(root, SLIME_PACKAGE)
    (root / "slime/utils/ppo_utils.py").write_text(
        SLIME_PPO.replace("PESSIMISTIC", pessimistic).replace("OPSM_DRIFT", drift))


@pytest.mark.parametrize("pessimistic, ppo", [
    ("torch.maximum", "CONFORMS"),
    ("torch.minimum", "DOES NOT CONFORM")])           # the optimistic branch of the clip
def test_slime_cards_compiled_losses_eagerly_under_a_one_process_megatron(tmp_path, pessimistic,
                                                                          ppo):
    _slime_checkout(tmp_path, pessimistic)
    c = card.run(trainers.get("slime"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    for name in ("compute_policy_loss [ε 0.2/0.28]", "compute_policy_loss [dual clip 3]",
                 "compute_gspo_kl [GSPO]"):
        assert verdicts.pop(name) == ppo, name
    assert set(verdicts.values()) == {"CONFORMS"}, [(r.row.name, r.reason) for r in c.rows]
    compiled = {r.row.name for r in c.rows if card.EAGER in r.choices}
    assert compiled == {r.row.name for r in c.rows if r.row.qualname in (
        "compute_approx_kl", "compute_policy_loss", "compute_cispo_loss")}
    assert c.exit_code == (0 if ppo == "CONFORMS" else 1)


def test_slime_card_catches_an_off_policy_mask_that_reads_the_drift_backwards(tmp_path):
    # log(π/π_old) for log(π_old/π): sequences the policy moved *toward* get masked
    _slime_checkout(tmp_path, "torch.maximum", drift="(n - o)")
    c = card.run(trainers.get("slime"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    assert verdicts.pop("compute_opsm_mask") == "DOES NOT CONFORM"
    assert set(verdicts.values()) == {"CONFORMS"}
    assert c.exit_code == 1


def test_megatrons_parallel_state_stands_in_as_one_process():
    state = loading.ParallelState("megatron.core.mpu")
    assert state.get_context_parallel_world_size() == 1
    assert state.get_data_parallel_world_size(with_context_parallel=True) == 1
    assert state.get_tensor_model_parallel_rank() == 0
    assert state.get_data_parallel_group(with_context_parallel=True) is None
    assert state.is_pipeline_last_stage() is True
    assert isinstance(state.initialize_model_parallel, type)       # anything else: a stand-in
    core = loading.StandInModule("megatron.core")
    assert isinstance(core.mpu, loading.ParallelState)
    assert isinstance(core.tensor_parallel, type)


def test_a_stood_in_base_takes_class_keywords():
    base = loading.StandInModule("msgspec").Struct

    class Sample(base, array_like=True, gc=False):
        token_ids: list

    assert issubclass(Sample, base)


# rLLM (a checkout only): fixture files written here in the shape of rLLM at commit 9beb6e0f
RLLM_PACKAGE = {
    "rllm/__init__.py": "import rllm.engine\n",
    "rllm/trainer/__init__.py": "",
    "rllm/trainer/algorithms/__init__.py": "",
    "rllm/trainer/algorithms/config.py": (
        "from omegaconf import DictConfig\n\n\nclass AlgorithmConfig:\n"
        "    norm_adv_by_std_in_grpo = True\n"),
    "rllm/trainer/algorithms/advantage.py": (
        "import numpy as np\n\n"
        "from rllm.trainer.algorithms.config import AlgorithmConfig\n"
        "from rllm.trainer.algorithms.rl_algo import (calculate_grpo_advantages_per_group,\n"
        "                                             calculate_rloo_advantages_per_group)\n\n\n"
        "def calculate_grpo_advantages(rewards, algorithm_config, **kwargs):\n"
        "    out = [calculate_grpo_advantages_per_group(r, algorithm_config."
        "norm_adv_by_std_in_grpo)[0]\n"
        "           for r in rewards]\n"
        "    return out, out\n\n\n"
        "def calculate_rloo_advantages(rewards, algorithm_config, **kwargs):\n"
        "    out = [calculate_rloo_advantages_per_group(r)[0] for r in rewards]\n"
        "    return out, out\n"),
}
RLLM_ALGO = '''
import numpy as np


def calculate_grpo_advantages_per_group(rewards, norm_adv_by_std_in_grpo=True, episilon=1e-6):
    mean, std = (0.0, 1.0) if len(rewards) <= 1 else (np.mean(rewards), STD)
    a = rewards - mean
    return (a / (std + episilon) if norm_adv_by_std_in_grpo else a), None


def calculate_rloo_advantages_per_group(rewards):
    n = len(rewards)
    return (rewards if n <= 1 else n / (n - 1) * (rewards - rewards.mean())), None
'''


@pytest.mark.parametrize("std, verdict", [
    ("np.std(rewards)", "CONFORMS"),
    ("np.std(rewards, ddof=1)", "DOES NOT CONFORM")])     # Bessel's, where rLLM's is ddof 0
def test_rllm_cards_a_checkout_of_its_numpy_estimators(tmp_path, std, verdict):
    _checkout(tmp_path, RLLM_PACKAGE)
    (tmp_path / "rllm/trainer/algorithms/rl_algo.py").write_text(RLLM_ALGO.replace("STD", std))
    c = card.run(trainers.get("rllm"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    assert verdicts == {"calculate_grpo_advantages [std-normalised]": verdict,
                        "calculate_grpo_advantages [Dr. GRPO]": "CONFORMS",
                        "calculate_rloo_advantages [RLOO]": "CONFORMS"}, \
        [r.reason for r in c.rows]


# NeMo-RL (a checkout only): fixture files written here in the shape of NeMo-RL at commit
# 7ea279abf (a loss class called on a data dict with global counts), not its code
NEMORL_UTILS = '''
import torch
from torch.utils.tensorboard import SummaryWriter      # tensorboard: stood in


def masked_mean(values, mask, dim=None, global_normalization_factor=None):
    n = mask.sum(dim) if global_normalization_factor is None else global_normalization_factor
    return (values * mask).sum(dim) / (n + 1e-8)


def calculate_baseline_and_std_per_prompt(prompts, rewards, valid_mask,
                                          leave_one_out_baseline=True):
    baseline, std = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for p in torch.unique(prompts, dim=0):
        idx = torch.nonzero((prompts == p).all(1))[:, 0]
        r, n = rewards[idx], len(idx)
        if n <= 1:                                   # a group of one: its own baseline
            baseline[idx] = r
            continue
        others = (1 - torch.eye(n)) if leave_one_out_baseline else torch.ones((n, n))
        k = torch.tensor(float(n - int(leave_one_out_baseline)))   # a tensor: 1/0 is inf
        mean = others @ r / k
        baseline[idx] = mean
        std[idx] = (VARIANCE * (k / (k - 1))).sqrt().nan_to_num(0)
    return baseline, std


def calculate_kl(logprobs, logprobs_reference, kl_type="k3", input_clamp_value=20.0,
                 output_clamp_value=10.0, importance_sampling_weights=None):
    x = logprobs_reference - logprobs
    inside = x.abs() <= input_clamp_value
    x = x.clamp(-input_clamp_value, input_clamp_value)
    kl = {"k1": -x, "k2": x * x / 2}.get(kl_type)
    kl = torch.exp(x) - 1 - x if kl is None else kl
    if importance_sampling_weights is not None:
        w = importance_sampling_weights
        kl = torch.where(inside, w, w.detach()) * kl
    return kl.clamp(-output_clamp_value, output_clamp_value)
'''
NEMORL_LOSS = '''
import torch

from nemo_rl.algorithms.utils import calculate_kl, masked_mean


class ClippedPGLossFn:
    def __init__(self, cfg):
        self.cfg = cfg

    def __call__(self, next_token_logprobs, data, global_valid_seqs, global_valid_toks):
        c = self.cfg
        lp = next_token_logprobs
        token_mask, adv = data["token_mask"][:, 1:], data["advantages"][:, 1:]
        mask = token_mask * data["sample_mask"].unsqueeze(-1)
        log_r = lp - data["prev_logprobs"][:, 1:]
        if c.sequence_level_importance_ratios:
            log_r = masked_mean(log_r, token_mask, dim=-1).unsqueeze(-1).repeat(1, lp.shape[1])
        r = log_r.exp()
        clipped = r.clamp(1 - c.ratio_clip_min, 1 + c.ratio_clip_max)
        if c.use_cispo:
            loss = -clipped.detach() * adv * lp
        else:
            loss = PESSIMISTIC(-adv * r, -adv * clipped)
        if c.ratio_clip_c is not None:
            loss = torch.where(adv < 0, torch.min(loss, -c.ratio_clip_c * adv), loss)
        if c.reference_policy_kl_penalty != 0:
            loss = loss + c.reference_policy_kl_penalty * calculate_kl(
                lp, data["reference_policy_logprobs"][:, 1:], c.reference_policy_kl_type,
                c.kl_input_clamp_value, c.kl_output_clamp_value,
                importance_sampling_weights=KL_WEIGHT)
        if c.token_level_loss:
            return masked_mean(loss, mask, global_normalization_factor=global_valid_toks), {}
        per_seq = masked_mean(loss, token_mask, dim=-1)
        return masked_mean(per_seq, data["sample_mask"],
                           global_normalization_factor=global_valid_seqs), {}


class MseValueLossFn:
    def __init__(self, cfg):
        self.cliprange = cfg.cliprange

    def __call__(self, values, data, global_valid_seqs, global_valid_toks):
        mask = data["token_mask"] * data["sample_mask"].unsqueeze(-1)
        v_old, ret = data["values"], data["returns"]
        clipped = v_old + (values - v_old).clamp(-self.cliprange, self.cliprange)
        loss = 0.5 * torch.maximum((values - ret) ** 2, (clipped - ret) ** 2)
        return masked_mean(loss, mask, global_normalization_factor=global_valid_toks), {}
'''


NEMORL_ADV = '''
import torch

from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt


class GRPOAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.use_leave_one_out_baseline = estimator_config.use_leave_one_out_baseline
        self.normalize_rewards = estimator_config.normalize_rewards

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        baseline, std = calculate_baseline_and_std_per_prompt(
            prompt_ids, rewards, torch.ones_like(rewards),
            leave_one_out_baseline=self.use_leave_one_out_baseline)
        adv = (rewards - baseline).unsqueeze(-1)
        if self.normalize_rewards:
            spread = std > 0
            adv[spread] = adv[spread] / (std.unsqueeze(-1)[spread] + 1e-6)
        return adv.expand(mask.shape)


class GeneralizedAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.gae_gamma = estimator_config["gae_gamma"]
        self.gae_lambda = estimator_config["gae_lambda"]

    def _compute_gae(self, token_level_rewards, values, mask, gae_lambda=None):
        lam = self.gae_lambda if gae_lambda is None else gae_lambda
        after, running, out = torch.zeros_like(values[:, 0]), torch.zeros_like(values[:, 0]), []
        for t in range(values.shape[1] - 1, -1, -1):       # masked steps carry both forward
            m = mask[:, t]
            step = token_level_rewards[:, t] + self.gae_gamma * after - values[:, t] + \\
                self.gae_gamma * lam * running
            running = torch.where(m > 0, step, running)
            after = torch.where(m > 0, values[:, t], after)
            out.append(running)
        adv = torch.stack(out[::-1], dim=1)
        return adv, adv + values
'''
TWO_PASS = "(others * (r[None, :] - mean[:, None]).square()).sum(1) / k"   # Σ (r_j − m_i)²
ONE_PASS = "(others @ r.square() / k - mean.square())"                       # E[r²] − E[r]²
_GRPO_ROWS = ("GRPOAdvantageEstimator.compute_advantage [leave-one-out (the default)]",
              "GRPOAdvantageEstimator.compute_advantage [group mean]")


def _nemorl_loss(pessimistic, kl_weight="torch.exp(lp - lp.detach())"):
    return NEMORL_LOSS.replace("PESSIMISTIC", pessimistic).replace("KL_WEIGHT", kl_weight)


@pytest.mark.parametrize("pessimistic, variance, ppo, grpo", [
    ("torch.maximum", TWO_PASS, "CONFORMS", "CONFORMS"),
    ("torch.minimum", TWO_PASS, "DOES NOT CONFORM", "CONFORMS"),   # the clip's optimistic side
    # NeMo-RL 7ea279abf's E[r²] − E[r]² in float32: cancels for rewards such as 1 ± 1e-4
    ("torch.maximum", ONE_PASS, "CONFORMS", "DOES NOT CONFORM")],
    ids=["as coded", "optimistic clip", "one-pass variance"])
def test_nemorl_cards_a_checkout_whose_losses_take_a_data_dict_and_global_counts(
        tmp_path, pessimistic, variance, ppo, grpo):
    _checkout(tmp_path, {
        "nemo_rl/__init__.py": "import ray\n", "nemo_rl/algorithms/__init__.py": "",
        "nemo_rl/algorithms/loss/__init__.py": "from .loss_functions import ClippedPGLossFn\n",
        "nemo_rl/algorithms/utils.py": NEMORL_UTILS.replace("VARIANCE", variance),
        "nemo_rl/algorithms/advantage_estimator.py": NEMORL_ADV,
        "nemo_rl/algorithms/loss/loss_functions.py": _nemorl_loss(pessimistic)})
    modules = dict(sys.modules)
    c = card.run(trainers.get("nemo-rl"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    for name in ("ClippedPGLossFn.__call__ [ppo]", "ClippedPGLossFn.__call__ [0.2/0.28, dual "
                 "clip 3]", "ClippedPGLossFn.__call__ [gspo]",
                 "ClippedPGLossFn.__call__ [ppo, k3 KL 0.04]",
                 "ClippedPGLossFn.__call__ [gspo, k3 KL 0.04]"):
        assert verdicts.pop(name) == ppo, name
    for name in _GRPO_ROWS:
        assert verdicts.pop(name) == grpo, name
    assert set(verdicts.values()) == {"CONFORMS"}, [(r.row.name, r.reason) for r in c.rows]
    assert "torch.utils.tensorboard" not in set(sys.modules) - set(modules)   # restored


def test_nemorl_card_catches_a_kl_penalty_whose_gradient_lacks_the_score_term(tmp_path):
    # the weight left out (None): the KL term's value is the same, its gradient loses k·∇logp
    _checkout(tmp_path, {
        "nemo_rl/__init__.py": "import ray\n", "nemo_rl/algorithms/__init__.py": "",
        "nemo_rl/algorithms/loss/__init__.py": "",
        "nemo_rl/algorithms/utils.py": NEMORL_UTILS.replace("VARIANCE", TWO_PASS),
        "nemo_rl/algorithms/advantage_estimator.py": NEMORL_ADV,
        "nemo_rl/algorithms/loss/loss_functions.py": _nemorl_loss("torch.maximum", "None")})
    c = card.run(trainers.get("nemo-rl"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    for label in ("ppo, k3 KL 0.04", "gspo, k3 KL 0.04"):
        assert verdicts.pop(f"ClippedPGLossFn.__call__ [{label}]") == "DOES NOT CONFORM"
        row = next(r for r in c.rows if r.row.label == label)
        assert {f["check"] for f in row.findings if f["grade"] == "deviation"} == {"grad"}
    assert set(verdicts.values()) == {"CONFORMS"}


def test_liger_k3_variant_evaluates_the_term_in_float64_rounds_it_once_and_restores_the_coded():
    """The variant of Liger's k3 precision note: k3 = expm1(x) − x, x = log p − log q, computed
    in float64 and rounded once to the loss's float32, in place of the module's k3_loss_fn for
    the duration of the call only."""
    import torch
    from crosscheck.trainer.liger import _k3_rounded_once
    seen = {}

    def adapter(log_p, log_q):
        seen["k3"] = adapter.loss_globals["k3_loss_fn"](log_p, log_q)
        return "called"
    adapter.loss_globals = {"k3_loss_fn": "coded"}
    log_p = torch.tensor([-1.0, -0.25], dtype=torch.float32)
    log_q = torch.tensor([-1.5, -0.25], dtype=torch.float32)
    assert _k3_rounded_once(adapter)(log_p, log_q) == "called"
    x = log_p.double() - log_q.double()
    assert seen["k3"].dtype == torch.float32
    assert torch.equal(seen["k3"], (torch.expm1(x) - x).float())
    assert seen["k3"][1] == 0.0 and abs(float(seen["k3"][0]) - 0.1487212707) < 1e-7
    assert adapter.loss_globals["k3_loss_fn"] == "coded"


def test_the_verl_gae_row_says_its_gamma_and_lambda_are_not_verls_defaults():
    from crosscheck.audit import profiles
    from crosscheck.trainer import verl
    row = next(r for r in verl.ROWS if r.ref == "gae")
    defaults = profiles.rule("verl", "gae", None).conventions
    assert defaults == {"gamma": 1.0, "lam": 1.0}          # verl's AlgoConfig
    assert row.conventions == {"gamma": 0.99, "lam": 0.95}  # where discounting shows
    assert row.choices[0].startswith("γ = 0.99, λ = 0.95 passed to both, not verl's config "
                                     "defaults γ = λ = 1.0 (AlgoConfig; the verl profile's), "
                                     "under which a missing or misplaced discount changes "
                                     "nothing")


# open-instruct (a checkout only): fixture files written here in the shape of open-instruct at
# commit e6c3044aa (by-file modules importing ray and wandb, a torch.compile'd helper, a config
# dataclass, the loss composed inside a Ray actor's step and the advantages inside a data
# actor's loop), not its code
OI_GRPO_UTILS = '''
import ray
import torch
import wandb

from open_instruct.rl_utils import masked_mean

PAD_LOGP = 1.0


def mask_logprobs(lp, mask):
    return torch.nan_to_num(lp.masked_fill(~mask, PAD_LOGP), nan=PAD_LOGP)


def _row_mean(x, mask):
    m = mask.float()
    return ((x * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1.0)).expand_as(x)


class Correction:
    def __init__(self, weights):
        self.weights = weights
        self.metrics = {}
        self.histogram_metrics = {}


def compute_rho_correction(old_logprob, vllm_logprobs, response_mask, advantages, config):
    d = torch.where(response_mask, (old_logprob - vllm_logprobs).clamp(-10.0, 10.0),
                    torch.zeros_like(old_logprob))
    rho = d.exp()
    if not config.use_rho_correction:
        return Correction(torch.ones_like(rho))
    unit = ROW_RATIO if config.rho_mask_sequence_level else rho
    lo, hi = config.rho_mask_lower_bound, config.rho_mask_upper_bound
    if config.rho_mask_tv_divergence:
        tv = _row_mean((rho - 1.0).abs(), response_mask)
        out = ((tv < lo) if lo > 0 else torch.zeros_like(response_mask)) | \\
            ((tv > hi) if hi > 0 else torch.zeros_like(response_mask))
        drop = out & (torch.sign(d) * advantages > 0)
    else:
        drop = ((unit < lo) if lo > 0 else torch.zeros_like(response_mask)) | \\
            ((unit > hi) if hi > 0 else torch.zeros_like(response_mask))
    w = unit
    if config.rho_clamp_lower_bound > 0:
        w = w.clamp(min=config.rho_clamp_lower_bound)
    if config.rho_clamp_upper_bound > 0:
        w = w.clamp(max=config.rho_clamp_upper_bound)
    return Correction(torch.where(response_mask & ~drop, w, torch.zeros_like(w)))


def accumulate_rho_histograms(acc, correction):
    acc.update(correction.histogram_metrics)


def compute_vllm_local_debug_metrics(local_logprobs, vllm_logprobs, response_mask):
    return {}


def resolve_old_logprob(cache, i, epoch, n_mini, use_vllm, vllm_lp, new_lp):
    return cache[i] if n_mini > 1 else new_lp.detach()


def compute_grpo_loss(new_logprobs, ratio, advantages, ref_logprobs, config, rho_weights):
    if config.loss_fn == "dapo":
        a = -advantages * ratio
        b = -advantages * ratio.clamp(1.0 - config.clip_lower, 1.0 + config.clip_higher)
        pg = torch.max(a, b)
    else:
        pg = -advantages * ratio.detach().clamp(max=1.0 + config.clip_higher) * new_logprobs
    pg = pg * rho_weights
    if ref_logprobs is None:
        return pg, pg, torch.zeros_like(pg)
    d = (new_logprobs - ref_logprobs).clamp(-40.0, 40.0)
    from open_instruct import model_utils
    return pg, pg, model_utils.estimate_kl(d, ratio)[config.kl_estimator]
'''
OI_MODEL_UTILS = '''
import deepspeed
import torch


@torch.compile(dynamic=True)
def log_softmax_and_gather(logits, index):
    return torch.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits):
    p = torch.softmax(logits, -1)
    return torch.logsumexp(logits, -1) - (p * logits).sum(-1)


def estimate_kl(ref_logprobs_diff, ratio):
    d = ref_logprobs_diff
    return torch.stack([d, d * d / 2, torch.expm1(-d) + d, RATIO_KL])
'''
OI_RL_UTILS = '''
import numpy as np
import torch


def calculate_advantages(values, rewards, gamma, lam):
    T = values.shape[1]
    running, out = 0.0, [None] * T
    for t in reversed(range(T)):
        after = values[:, t + 1] if t + 1 < T else 0.0
        running = rewards[:, t] + gamma * after - values[:, t] + gamma * lam * running
        out[t] = running
    adv = np.stack(out, axis=1)
    return adv, adv + values


def masked_mean(values, mask, axis=None, denominator=None):
    num = (values * mask).sum()
    den = mask.sum() if denominator is None else denominator
    return num / den if den > 0 else num * 0
'''
OI_GRPO_FAST = '''
import ray
import torch

from open_instruct import grpo_utils
from open_instruct.rl_utils import masked_mean


class PolicyTrainerRayProcess:
    def step(self):
        data_BT = self.next_batch()
        for i in range(len(data_BT.query_responses)):
            response_mask_BT = data_BT.response_masks[i][:, 1:]
            batch_start = (i // accumulation_steps) * accumulation_steps
            loss_denominator = accumulation_token_counts[batch_start]
            local_logprobs_BT, entropy_BT = grpo_utils.forward_for_logprobs(
                self.model, data_BT.query_responses[i], None, data_BT.position_ids[i],
                self.pad_token_id, self.streaming_config.temperature)
            local_logprobs_BT = grpo_utils.mask_logprobs(local_logprobs_BT, response_mask_BT)
            vllm_logprobs_BT = grpo_utils.mask_logprobs(data_BT.vllm_logprobs[i][:, 1:],
                                                        response_mask_BT)
            new_logprobs_BT = local_logprobs_BT
            old_logprob_BT = grpo_utils.resolve_old_logprob(
                old_logprobs_BT, i, epoch_idx, num_mini_batches, False, vllm_logprobs_BT,
                local_logprobs_BT)
            ratio_BT = torch.exp(new_logprobs_BT - old_logprob_BT)
            rho_BT = grpo_utils.compute_rho_correction(
                old_logprob_BT, vllm_logprobs_BT, response_mask_BT,
                data_BT.advantages[i][:, 1:], self.args)
            pg_loss_BT, clipfrac_BT, kl_BT = grpo_utils.compute_grpo_loss(
                new_logprobs_BT, ratio_BT, data_BT.advantages[i][:, 1:],
                ref_logprobs_BT[i] if self.args.load_ref_policy else None, self.args,
                rho_BT.weights)
            loss = masked_mean(pg_loss_BT + self.args.beta * kl_BT, response_mask_BT, None,
                               loss_denominator)
            loss *= self.args.world_size // self.args.sequence_parallel_size
            self.model.backward(loss)
'''
OI_DATA_LOADER = '''
import numpy as np
import ray


class DataPreparationActor:
    def _data_preparation_loop(self):
        while True:
            batch = self.next()
            scores = np.array(batch.scores)
            per_prompt = scores.reshape(-1, self.config.num_samples_per_prompt_rollout)
            mean_grouped_rewards = np.repeat(per_prompt.mean(axis=-1),
                                             self.config.num_samples_per_prompt_rollout)
            std_grouped_rewards = np.repeat(per_prompt.std(axis=-1),
                                            self.config.num_samples_per_prompt_rollout)
            if self.config.advantage_normalization_type == "standard":
                advantages = (scores - mean_grouped_rewards) / (std_grouped_rewards + 1e-8)
            elif self.config.advantage_normalization_type == "centered":
                advantages = scores - mean_grouped_rewards
            self.publish(advantages)
'''


def _oi_checkout(root, row_ratio, ratio_kl):
    _checkout(root, {
        "open_instruct/__init__.py": "",
        "open_instruct/grpo_utils.py": OI_GRPO_UTILS.replace("ROW_RATIO", row_ratio),
        "open_instruct/model_utils.py": OI_MODEL_UTILS.replace("RATIO_KL", ratio_kl),
        "open_instruct/rl_utils.py": OI_RL_UTILS,
        "open_instruct/grpo_fast.py": OI_GRPO_FAST,
        "open_instruct/data_loader.py": OI_DATA_LOADER})


@pytest.mark.parametrize("row_ratio, ratio_kl, seq_rows, ratio_rows", [
    # the sequence ratio over the row's mask (a pack: its rows say so), the ratio attached
    ("_row_mean(d, response_mask).exp()", "ratio * d", "CONFORMS", "CONFORMS"),
    # the sequence ratio over every position of the row (padding counted); the ratio detached
    ("d.mean(-1, keepdim=True).exp().expand_as(d)", "ratio.detach() * d", "DOES NOT CONFORM",
     "DOES NOT CONFORM")])
def test_openinstruct_cards_a_checkout_whose_loss_is_composed_inside_an_actor_step(
        tmp_path, row_ratio, ratio_kl, seq_rows, ratio_rows):
    _oi_checkout(tmp_path, row_ratio, ratio_kl)
    c = card.run(trainers.get("open-instruct"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    seq = "compute_rho_correction [sequence mask 0.5/2, one response per row]"
    assert verdicts.pop(seq) == seq_rows, [r.reason for r in c.rows if r.row.name == seq]
    assert verdicts.pop("estimate_kl [3 (ratio·k1)]") == ratio_rows
    assert verdicts.pop("PolicyTrainerRayProcess.step [dapo, KL estimator 3 (ratio·k1)]") == \
        ratio_rows
    # packed two responses to a row, the per-row mean is the pack's: the known defect (with a
    # per-position mean, the packed rows fail beyond what the known variant explains)
    for label in ("sequence mask 0.5/2, packed", "TV filter 0.3/1.5, packed"):
        got = verdicts.pop(f"compute_rho_correction [{label}]")
        assert got == ("KNOWN DEVIATION" if seq_rows == "CONFORMS" or "TV" in label
                       else "DOES NOT CONFORM"), label
    assert set(verdicts.values()) == {"CONFORMS"}, verdicts
    assert c.exit_code == (0 if seq_rows == "CONFORMS" else 1)
    loaded = " ".join(c.to_dict()["loaded"])
    assert "loaded by file" in loaded and "wandb (not installed)" in loaded, loaded


def test_openinstruct_needs_a_path():
    with pytest.raises(loading.TrainerNotFound):
        card.run(trainers.get("open-instruct"))


@_installed("openrlhf")
def test_a_variant_shared_by_known_entries_at_several_checks_is_audited_once(monkeypatch):
    audit_pkg = sys.modules["crosscheck.audit"]       # (the package: its name is a function too)
    calls = []
    real = audit_pkg.audit

    def counted(*args, **kwargs):
        calls.append(kwargs.get("variant"))
        return real(*args, **kwargs)
    monkeypatch.setattr(audit_pkg, "audit", counted)
    row = "ActorPPOTrainer.training_step [ppo + k2 KL loss, seq-mean-token-mean]"
    c = card.run(trainers.get("openrlhf"), cases=8, only=[row])
    (r,) = c.rows
    explained = [f["check"] for f in r.findings if f["kind"] == "defect"]
    assert set(explained) == {"value", "grad", "microbatch"}    # three entries, one variant
    assert len(calls) == 2                    # the row's audit, and its variant's once
