"""The ms-swift and EasyR1 report cards: their pinned code raises no alarm at the rows the
planted bugs target, and each planted one-line bug (a γ, a group of one, unequal groups, a
composition on the training path, a clip or a KL) is caught at its row as a new deviation.
Patches apply to copies made in a temporary directory at test time (never committed).

ms-swift runs where ms-swift 4.6.0 is installed (.ci/run installs it with --no-deps); EasyR1 is
a checkout only (no package index): its tests run where CROSSCHECK_EASYR1 names one."""
import importlib.util
import os
import shutil

import pytest

from crosscheck import trainer as trainers
from crosscheck.trainer import card
from tests.trainer.planting import CASES, ascii_id, assert_caught, assert_no_alarm, patched
ADV = "swift/rl_core/advantage.py"
HF = "swift/rlhf_trainers/grpo_trainer.py"
MG = "swift/megatron/trainers/grpo_trainer.py"
CORE = "verl/trainer/core_algos.py"
ACTOR = "verl/workers/actor/dp_actor.py"
HF_LOSS = "GRPOTrainer._compute_loss_and_metrics"

# (trainer, file, text, replacement, which occurrence, the row that must catch it)
PATCHES = [
    # ms-swift 4.6.0
    ("ms-swift", HF, "torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)",
     "torch.clamp(coef_1, 1 - self.epsilon_high, 1 + self.epsilon_low)", 0,
     f"{HF_LOSS} [dapo, ε 0.2/0.28]"),
    ("ms-swift", HF, "decay_block = torch.pow(gamma, distance.clamp(min=0))",   # FIPO's γ
     "decay_block = torch.pow(gamma, distance.clamp(min=0) + 1)", 0,
     "GRPOTrainer._compute_fipo_influence [decay 2, clip ±0.2, delta 10]"),
    ("ms-swift", ADV, "request_advantages[idx_t] = r_group - r_group.mean()",  # a group of one
     "request_advantages[idx_t] = r_group", 0, "compute_advantages_dynamic [rloo]"),
    ("ms-swift", ADV, "            K = len(idxs)\n",                        # unequal groups
     "            K = len(unique_rewards) // len(prompt_to_indices)\n", 0,
     "compute_advantages_dynamic [rloo]"),
    ("ms-swift", HF, "            loss = loss * gradient_accumulation_steps",   # the trainer's path
     "            loss = loss", 0, "GRPOTrainer.compute_loss [dapo, the trainer's path]"),
    ("ms-swift", HF, "                per_token_loss = per_token_loss * fipo_weight",
     "                per_token_loss = per_token_loss", 0, f"{HF_LOSS} [fipo]"),  # composition
    ("ms-swift", MG, "(micro_batch_size * self.max_completion_length)",
     "(micro_batch_size + self.max_completion_length)", 0,
     "MegatronGRPOTrainer.loss_func [dr_grpo]"),
    ("ms-swift", HF, "advantage_estimator=self.advantage_estimator,\n"     # a composition:
     "                scale_rewards=self.scale_rewards,",                      # a setting lost
     "advantage_estimator=self.advantage_estimator,\n                scale_rewards='none',", 0,
     "GRPOTrainer._compute_advantages [grpo, group]"),
    ("ms-swift", ADV, "std = grouped.std(dim=1).repeat_interleave(K) if K > 1",
     "std = grouped.std(dim=1, correction=0).repeat_interleave(K) if K > 1", 0,
     "compute_advantages [grpo, group]"),
    # EasyR1 (a checkout)
    ("easyr1", CORE, "running_return = token_level_rewards[:, t] + gamma * running_return",
     "running_return = token_level_rewards[:, t] + running_return", 0,
     "compute_reinforce_plus_plus_outcome_advantage [γ 0.99]"),          # a dropped γ
    ("easyr1", CORE, "baseline = (id2sum[index[i]] - scores[i]) / (sample_num - 1)",
     "baseline = (id2sum[index[i]] - scores[i]) / sample_num", 0,
     "compute_rloo_outcome_advantage"),
    ("easyr1", CORE, "sample_num = len(id2score[index[i]])",      # unequal groups: a mean size
     "sample_num = bsz // len(id2score)", 0, "compute_rloo_outcome_advantage"),
    ("easyr1", CORE, "id2std[idx] = torch.std(torch.tensor(id2score[idx]))",
     "id2std[idx] = torch.std(torch.tensor(id2score[idx]), correction=0)", 0,
     "compute_grpo_outcome_advantage"),
    ("easyr1", ACTOR,
     "loss = loss * torch.sum(response_mask) * self.world_size / total_response_tokens",
     "loss = loss * self.world_size", 0,
     "DataParallelPPOActor.update_policy [the actor's averaging, token]"),  # composition
    ("easyr1", CORE, "clipped_pg_loss_lower = torch.min(clipped_pg_loss_higher, pg_loss3)",
     "clipped_pg_loss_lower = torch.max(clipped_pg_loss_higher, pg_loss3)", 0,
     "compute_policy_loss [ppo, token]"),
    ("easyr1", CORE, "kld = (kl.exp() - kl - 1).contiguous()",
     "kld = (kl.exp() + kl - 1).contiguous()", 0, "compute_kl [low_var_kl]"),
    ("easyr1", CORE, "vf_loss = 0.5 * average_loss(", "vf_loss = average_loss(", 0,
     "compute_value_loss"),
]
NAMES = ("ms-swift", "easyr1")


def _root(name):
    """The directory holding the trainer's package, or a reason to skip."""
    if name == "easyr1":
        path = os.environ.get("CROSSCHECK_EASYR1")
        if not path:
            return None, "CROSSCHECK_EASYR1 does not name an EasyR1 checkout (GitHub only)"
        return path, ""
    from importlib import metadata
    t = trainers.get(name)
    if importlib.util.find_spec(t.package) is None or metadata.version(t.dist) != t.pinned:
        return None, f"{name} is not installed at its pinned version (.ci/run installs it)"
    return os.path.dirname(os.path.dirname(importlib.util.find_spec(t.package).origin)), ""


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """A copy of each trainer's package (EasyR1: its verl/), made once for the module."""
    out = {}
    for name in NAMES:
        root, _ = _root(name)
        if root is None:
            continue
        package = trainers.get(name).package
        dest = tmp_path_factory.mktemp(name.replace("-", ""))
        shutil.copytree(os.path.join(root, package), dest / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
        out[name] = dest
    return out


def test_each_new_card_has_at_least_five_planted_bugs():
    for name in NAMES:
        assert sum(p[0] == name for p in PATCHES) >= 5, name


@pytest.mark.parametrize("name", NAMES)
def test_the_unpatched_copy_raises_no_alarm_at_any_patched_row(name, copies):
    if name not in copies:
        pytest.skip(_root(name)[1])
    assert_no_alarm(name, copies[name], sorted({row for t, *_, row in PATCHES if t == name}))


@pytest.mark.parametrize("name, rel, old, new, nth, row", PATCHES,
                         ids=[ascii_id(p) for p in PATCHES])
def test_a_planted_bug_is_caught_at_its_row_as_a_new_deviation(name, rel, old, new, nth, row,
                                                                copies):
    if name not in copies:
        pytest.skip(_root(name)[1])
    assert_caught(name, copies[name], rel, old, new, nth, row)


def test_ms_swift_4_5_3s_unscaled_window_loss_shows_on_the_trainers_path_row(copies):
    """4.5.3 divides dapo's window-normalised loss by the accumulation steps (#10117); 4.6.0
    multiplies it back (_undo_gradient_accumulation_scaling). The planted revert above is that
    release's code: the trainer-path row sees the loss halved at 2 accumulation steps."""
    if "ms-swift" not in copies:
        pytest.skip(_root("ms-swift")[1])
    path = copies["ms-swift"] / HF
    original = path.read_text(encoding="utf-8")
    path.write_text(patched(original, "            loss = loss * gradient_accumulation_steps",
                             "            loss = loss", 0), encoding="utf-8")
    try:
        c = card.run(trainers.get("ms-swift"), path=str(copies["ms-swift"]), cases=CASES,
                     only=["GRPOTrainer.compute_loss"])
    finally:
        path.write_text(original, encoding="utf-8")
    (r,) = c.rows
    value = [f for f in r.findings if f["check"] == "value"]
    assert value and "×0.5" in value[0]["signature"], r.findings


# EasyR1 (a checkout only): fixture files written here in the shape of EasyR1 at commit b44b311b
# (its module paths, signatures and call conventions), not its code. GAE_MASK and REMAX_ADV are
# the two places where the fixture can take the checkout's shape (see the test below).
EASYR1_TF = '''
import torch


def masked_mean(values, mask, dim=None, eps=1e-8):
    return (values * mask).sum(dim=dim) / (mask.sum(dim=dim) + eps)


def masked_whiten(values, mask, eps=1e-8):
    n = mask.sum()
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask) * n / (n - 1)
    return (values - mean) * torch.rsqrt(var + eps)
'''
EASYR1_CORE = '''
from collections import defaultdict

import numpy as np
import torch

from ..utils import torch_functional as VF


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam,
                                 **kwargs):
    B, T = token_level_rewards.shape
    carry_v = torch.zeros(B, dtype=values.dtype)
    carry_a = torch.zeros(B, dtype=values.dtype)
    out = [None] * T
    for t in range(T - 1, -1, -1):
        td = token_level_rewards[:, t] + gamma * carry_v - values[:, t]
        a = td + gamma * lam * carry_a
        keep = GAE_MASK
        carry_v = torch.where(keep, values[:, t], carry_v)
        carry_a = torch.where(keep, a, carry_a)
        out[t] = carry_a
    adv = torch.stack(out, dim=1)
    return VF.masked_whiten(adv, response_mask), adv + values


def _groups(index):
    by = defaultdict(list)
    for i, key in enumerate(index):
        by[key].append(i)
    return by


def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, eps=1e-6,
                                   **kwargs):
    s = token_level_rewards.sum(-1)
    out = torch.zeros_like(s)
    for rows in _groups(index).values():
        assert len(rows) > 1, "a group needs two responses"
        g = s[rows]
        out[rows] = (g - g.mean()) / (g.std() + eps)
    return out[:, None] * response_mask, out[:, None] * response_mask


def compute_grpo_passk_outcome_advantage(token_level_rewards, response_mask, index, eps=1e-6,
                                         **kwargs):
    s = token_level_rewards.sum(-1)
    out = torch.zeros_like(s)
    for rows in _groups(index).values():
        assert len(rows) > 1, "a group needs two responses"
        g = s[rows]
        top, at = torch.topk(g, k=2)
        out[rows[int(at[0])]] = (top[0] - top[1]) / (g.std() + eps)
    return out[:, None] * response_mask, out[:, None] * response_mask


def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, **kwargs):
    s = token_level_rewards.sum(-1)
    out = torch.zeros_like(s)
    for rows in _groups(index).values():
        assert len(rows) > 1, "a group needs two responses"
        g = s[rows]
        out[rows] = g - (g.sum() - g) / (len(rows) - 1)
    return out[:, None] * response_mask, out[:, None] * response_mask


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma,
                                                  **kwargs):
    returns = torch.zeros_like(token_level_rewards)
    acc = torch.zeros(token_level_rewards.shape[0], dtype=token_level_rewards.dtype)
    for t in range(token_level_rewards.shape[1] - 1, -1, -1):
        acc = token_level_rewards[:, t] + gamma * acc
        returns[:, t] = acc
        acc = acc * response_mask[:, t]
    return VF.masked_whiten(returns, response_mask), returns


def compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask,
                                    **kwargs):
    adv = REMAX_ADV
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    return adv, returns


def compute_rewards(token_level_scores, log_probs, ref_log_probs, kl_ratio):
    return token_level_scores - kl_ratio * (log_probs - ref_log_probs)


def average_loss(values, mask, mode, eps=1e-8):
    if mode == "token":
        return VF.masked_mean(values, mask, eps=eps)
    return ((values * mask).sum(-1) / (mask.sum(-1) + eps)).mean()


def compute_policy_loss(old_log_probs, log_probs, advantages, response_mask, clip_ratio_low,
                        clip_ratio_high, clip_ratio_dual, tau_positive, tau_negative, loss_type,
                        loss_avg_mode, **kwargs):
    log_r = log_probs - old_log_probs
    r = torch.exp(log_r.clamp(-20.0, 20.0))
    r_clip = torch.exp(log_r.clamp(np.log(1 - clip_ratio_low), np.log(1 + clip_ratio_high)))
    if loss_type == "cispo":
        per_token = -advantages * log_probs * r_clip.detach()
    elif loss_type == "sapo":
        tau = torch.where(advantages >= 0, torch.full_like(r, tau_positive),
                          torch.full_like(r, tau_negative))
        per_token = -advantages * 4.0 / tau * torch.sigmoid(tau * (r - 1.0))
    else:
        upper = torch.maximum(-advantages * r, -advantages * r_clip)
        lower = torch.minimum(upper, -advantages * clip_ratio_dual)
        per_token = torch.where(advantages < 0, lower, upper)
    return average_loss(per_token, response_mask, mode=loss_avg_mode), {}


def compute_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_avg_mode):
    clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    worst = torch.maximum((vpreds - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * average_loss(worst, response_mask, mode=loss_avg_mode), {}


def compute_kl(log_probs, ref_log_probs, kl_penalty):
    d = log_probs.float() - ref_log_probs.float()
    if kl_penalty == "kl":
        return d
    if kl_penalty == "abs":
        return d.abs()
    if kl_penalty == "mse":
        return 0.5 * d * d
    x = (-d).clamp(-20.0, 20.0)
    return (torch.exp(x) - x - 1).clamp(-10.0, 10.0)
'''
EASYR1_ACTOR = '''
import torch

from ...trainer.core_algos import average_loss, compute_kl, compute_policy_loss


class DataParallelPPOActor:
    def update_policy(self, data):
        metrics = {}
        for micro_batch, total_response_tokens in data:
            model_inputs = dict(micro_batch)
            response_mask = model_inputs["response_mask"]
            old_log_probs = model_inputs["old_log_probs"]
            advantages = model_inputs["advantages"]
            log_probs = model_inputs["log_probs"]
            pg_loss, pg_metrics = compute_policy_loss(
                old_log_probs=old_log_probs, log_probs=log_probs, advantages=advantages,
                response_mask=response_mask, clip_ratio_low=self.config.clip_ratio_low,
                clip_ratio_high=self.config.clip_ratio_high,
                clip_ratio_dual=self.config.clip_ratio_dual,
                tau_positive=self.config.tau_positive, tau_negative=self.config.tau_negative,
                loss_type=self.config.loss_type, loss_avg_mode=self.config.loss_avg_mode)
            if self.config.use_kl_loss:
                kld = compute_kl(log_probs, model_inputs["ref_log_probs"], "low_var_kl")
                loss = pg_loss + average_loss(kld, response_mask, "token") * self.config.kl_coef
            else:
                loss = pg_loss
            loss = loss * torch.sum(response_mask) * self.world_size / total_response_tokens
            loss.backward()
        return metrics
'''
# the fixture's correct forms, and the shapes EasyR1 b44b311b ships (module docstring of
# crosscheck/trainer/easyr1.py: GAE tests a [B] mask with `if`, ReMax multiplies a [B]
# difference by the [B, T] mask)
GAE_OK, GAE_AS_SHIPPED = "response_mask[:, t].bool()", "torch.tensor(bool(response_mask[:, t]))"
REMAX_OK = "(token_level_rewards.sum(-1) - reward_baselines)[:, None] * response_mask"
REMAX_AS_SHIPPED = "(token_level_rewards.sum(-1) - reward_baselines) * response_mask"


def _easyr1_checkout(root, gae=GAE_OK, remax=REMAX_OK):
    files = {"verl/__init__.py": "raise ImportError('the package __init__ is never run')\n",
             "verl/trainer/__init__.py": "", "verl/utils/__init__.py": "",
             "verl/workers/__init__.py": "", "verl/workers/actor/__init__.py": "",
             "verl/utils/torch_functional.py": EASYR1_TF,
             "verl/trainer/core_algos.py": EASYR1_CORE.replace("GAE_MASK", gae).replace(
                 "REMAX_ADV", remax),
             "verl/workers/actor/dp_actor.py": EASYR1_ACTOR}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_easyr1_cards_a_checkout_in_its_shape_and_every_row_runs(tmp_path):
    _easyr1_checkout(tmp_path)
    c = card.run(trainers.get("easyr1"), path=str(tmp_path), cases=24)
    verdicts = {r.row.name: r.verdict for r in c.rows}
    assert set(verdicts.values()) == {"CONFORMS"}, {k: v for k, v in verdicts.items()
                                                    if v != "CONFORMS"}
    ran, listed = c.functions()          # the fixture holds only functions that have rows
    assert ran == listed == 13 and not c.not_covered and c.exit_code == 0


@pytest.mark.parametrize("gae, remax, row", [
    (GAE_AS_SHIPPED, REMAX_OK, "compute_gae_advantage_return"),
    (GAE_OK, REMAX_AS_SHIPPED, "compute_remax_outcome_advantage")])
def test_easyr1_cards_the_shipped_gae_mask_test_and_remax_broadcast_as_new_deviations(
        tmp_path, gae, remax, row):
    _easyr1_checkout(tmp_path, gae, remax)
    c = card.run(trainers.get("easyr1"), path=str(tmp_path), cases=24, only=[row])
    assert c.rows and all(r.verdict == "DOES NOT CONFORM" for r in c.rows), \
        [(r.row.name, r.verdict, r.reason) for r in c.rows]
    assert c.exit_code == 1


def test_easyr1_needs_a_path():
    from crosscheck.trainer import loading
    with pytest.raises(loading.TrainerNotFound):
        card.run(trainers.get("easyr1"))
