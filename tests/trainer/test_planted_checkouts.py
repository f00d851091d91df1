"""Planted bugs in the checkout-only trainers (ROLL, prime-rl, slime, rLLM, NeMo-RL, MiniMind,
open-instruct): one-token or one-operator text patches, applied to a copy of the user's checkout
made in a temporary directory at test time (never committed). Each checkout is named by an
environment variable (ENV below) and must be at the card's pinned commit; without one, that
trainer's tests are skipped with the reason.

Each bug is caught at its row by a new, unexplained deviation; a bug at a row that already
fails at the pinned commit (ROLL's GAE, NeMo-RL's GRPO advantages) is caught through a
baseline, where the row's old finding is held and the planted one is new; and the unpatched
copies raise no alarm at the patched rows."""
import glob
import os
import shutil
import subprocess

import pytest

from crosscheck import trainer as trainers
from crosscheck.trainer import card
from tests.trainer.planting import CASES, Planted, ascii_id, assert_caught, assert_no_alarm

ENV = {"roll": "CROSSCHECK_ROLL", "prime-rl": "CROSSCHECK_PRIME_RL", "slime": "CROSSCHECK_SLIME",
       "rllm": "CROSSCHECK_RLLM", "nemo-rl": "CROSSCHECK_NEMO_RL",
       "minimind": "CROSSCHECK_MINIMIND", "open-instruct": "CROSSCHECK_OPEN_INSTRUCT"}
SKIP = shutil.ignore_patterns("__pycache__", "*.pdf", "*.png", "*.gif", "*.jpg")


def _copy(name, src, dst):
    """The trainer's package folder from each source root of the checkout (the top, src/ and
    packages/*/src/, where the loader looks), into dst at the same relative places."""
    package = trainers.get(name).package
    roots = [src, os.path.join(src, "src")] + sorted(
        glob.glob(os.path.join(src, "packages", "*", "src")))
    copied = 0
    for root in roots:
        folder = os.path.join(root, package)
        if os.path.isdir(folder):
            shutil.copytree(folder, os.path.join(dst, os.path.relpath(folder, src)), ignore=SKIP)
            copied += 1
    assert copied, f"{src} holds no {package}/ folder"

ROLL = "roll/utils/functionals.py"
PRIME_LOSS = "src/prime_rl/trainer/rl/loss.py"
PRIME_GRPO = "src/prime_rl/orchestrator/algo/grpo.py"
PRIME_MAXRL = "src/prime_rl/orchestrator/algo/max_rl.py"
SLIME = "slime/utils/ppo_utils.py"
SLIME_ROLLOUT = "slime/ray/rollout.py"
RLLM = "rllm/trainer/algorithms/rl_algo.py"
NEMO_LOSS = "nemo_rl/algorithms/loss/loss_functions.py"
NEMO_UTILS = "nemo_rl/algorithms/utils.py"
NEMO_ADV = "nemo_rl/algorithms/advantage_estimator.py"
GRPO_MM = "trainer/train_grpo.py"
PPO_MM = "trainer/train_ppo.py"
NEMO_GRPO = "GRPOAdvantageEstimator.compute_advantage [leave-one-out (the default)]"
NEMO_GRPO_MEAN = "GRPOAdvantageEstimator.compute_advantage [group mean]"
GU = "open_instruct/grpo_utils.py"
MU = "open_instruct/model_utils.py"
RL = "open_instruct/rl_utils.py"
FAST = "open_instruct/grpo_fast.py"
DATA = "open_instruct/data_loader.py"
STEP = "PolicyTrainerRayProcess.step [dapo 0.2/0.272, k3 KL 0.05 (the defaults)]"

# (trainer, file, text, replacement, which occurrence, the row that must catch it)
PATCHES = [
    # ROLL at 8eb27cc2
    ("roll", ROLL, "cumulative_reward = local_reward + gamma * cumulative_reward",
     "cumulative_reward = local_reward + cumulative_reward", 0,
     "compute_reinforce_return [γ 0.99]"),              # a dropped γ: seen only below 1
    ("roll", ROLL, "reward_std = torch.std(reshape_reward, dim=-1, keepdim=True)",
     "reward_std = torch.std(reshape_reward, dim=-1, keepdim=True, unbiased=False)", 0,
     "reward_norm"),
    ("roll", ROLL, "kld = (ratio - kl - 1).contiguous()", "kld = (ratio + kl - 1).contiguous()",
     0, "compute_approx_kl [k3]"),
    ("roll", ROLL, "seq_losses = masked_mean(loss_mat, loss_mask, dim=-1)",
     "seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)", 0,
     "agg_loss [seq-mean-token-mean]"),
    ("roll", ROLL, "/ loss_mask.shape[-1]  # The divisor", "/ loss_mask.shape[0]  # The divisor",
     0, "agg_loss [seq-mean-token-sum-norm]"),
    ("roll", ROLL, "bessel_correction = mask_sum / (mask_sum - 1)",
     "bessel_correction = mask_sum / mask_sum", 0, "masked_whiten"),
    # prime-rl at 559b44772
    ("prime-rl", PRIME_LOSS,
     "torch.where(positive_advantages, dppo_invalid_mask_high, dppo_invalid_mask_low)",
     "torch.where(positive_advantages, dppo_invalid_mask_low, dppo_invalid_mask_high)", 0,
     "compute_loss [default loss]"),
    ("prime-rl", PRIME_LOSS, "kl_loss = loss_mask * log_importance_ratio**2",
     "kl_loss = keep_mask * log_importance_ratio**2", 0, "compute_loss [default loss]"),
    ("prime-rl", PRIME_LOSS, "pg_loss = keep_mask * advantages * importance_ratio",
     "pg_loss = keep_mask * advantages * importance_ratio.detach()", 0,
     "compute_loss [default loss]"),
    ("prime-rl", PRIME_LOSS, "scaled_loss = rl_loss / rl_scale", "scaled_loss = rl_loss / n", 0,
     "compute_loss [default loss]"),     # the composition: per-sample sums over the step's tokens
    ("prime-rl", PRIME_GRPO, "advantages = rewards - rewards.mean()",
     "advantages = rewards - rewards.median()", 0, "GRPOAlgorithm.score_group"),
    ("prime-rl", PRIME_MAXRL, "else (rewards - mean) / mean",
     "else (rewards - mean) / rewards.max()", 0, "MaxRLAlgorithm.score_group"),
    # slime at 624b824a8
    ("slime", SLIME, "advantages = chunked_discounted_returns(deltas, gamma * lambd, chunk_size)",
     "advantages = chunked_discounted_returns(deltas, gamma, chunk_size)", 0,
     "chunked_gae [γ 0.99, λ 0.95]"),                   # the composition drops λ
    ("slime", SLIME, "S_global = S_local + s_prev.unsqueeze(1) * pow_vec[:Lc]",
     "S_global = S_local + s_prev.unsqueeze(1)", 0,
     "chunked_discounted_returns [γ 0.99]"),            # the carry across chunks
    ("slime", SLIME, "delta = rewards[:, t] + gamma * next_value - values[:, t]",
     "delta = rewards[:, t] + next_value - values[:, t]", 0,
     "vanilla_gae [γ 0.99, λ 0.95]"),                   # a dropped γ: seen only below 1
    ("slime", SLIME, "pg_losses2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages",
     "pg_losses2 = -ratio.clamp(1 - eps_clip_high, 1 + eps_clip) * advantages", 0,
     "compute_policy_loss [ε 0.2/0.28]"),
    ("slime", SLIME, "clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)",
     "clip_pg_losses2 = torch.max(pg_losses3, clip_pg_losses1)", 0,
     "compute_policy_loss [dual clip 3]"),
    ("slime", SLIME,
     "((old_logprob - log_prob) * loss_mask).sum() / torch.clamp_min(loss_mask.sum(), 1)",
     "((old_logprob - log_prob) * loss_mask).sum()", 0,
     "compute_gspo_kl [GSPO]"),           # the composition: a sum, not a mean, into the PPO loss
    ("slime", SLIME, "pg_losses = -ratio_truncated.detach() * advantages * log_probs",
     "pg_losses = -ratio_truncated * advantages * log_probs", 0, "compute_cispo_loss [ε 0.2/0.28]"),
    ("slime", SLIME_ROLLOUT, "std = rewards.std(dim=-1, keepdim=True)",
     "std = rewards.std(dim=-1, keepdim=True, unbiased=False)", 0,
     "RolloutManager._post_process_rewards"),
    ("slime", SLIME, "kl = log_ratio**2 / 2.0", "kl = log_ratio**2", 0, "compute_approx_kl [k2]"),
    ("slime", SLIME, "                gamma=gamma,\n", "                gamma=lambd,\n", 1,
     "get_advantages_and_returns_batch [γ 0.99, λ 0.95]"),   # the composition's arguments
    # rLLM at 9beb6e0f
    ("rllm", RLLM, "    if len(rewards) <= 1:\n        group_mean, group_std = 0.0, 1.0",
     "    if len(rewards) < 1:\n        group_mean, group_std = 0.0, 1.0", 0,
     "calculate_grpo_advantages [std-normalised]"),     # a group of one: its own mean and std
    ("rllm", RLLM, "    if num_trajs <= 1:\n        return rewards, rewards",
     "    if num_trajs < 1:\n        return rewards, rewards", 0,
     "calculate_rloo_advantages [RLOO]"),               # a group of one: n/(n − 1) at n = 1
    ("rllm", RLLM, "group_std = np.std(rewards)", "group_std = np.std(rewards, ddof=1)", 0,
     "calculate_grpo_advantages [std-normalised]"),
    ("rllm", RLLM, "advantages = rewards - group_mean", "advantages = group_mean - rewards", 0,
     "calculate_grpo_advantages [Dr. GRPO]"),
    ("rllm", RLLM, "num_trajs / (num_trajs - 1) * (rewards - rewards.mean())",
     "num_trajs / (num_trajs + 1) * (rewards - rewards.mean())", 0,
     "calculate_rloo_advantages [RLOO]"),
    # NeMo-RL at 7ea279abf (its GRPO rows already fail: their bugs are in the baseline tests)
    ("nemo-rl", NEMO_LOSS, "1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max",
     "1.0 - self.ratio_clip_max, 1.0 + self.ratio_clip_min", 0,
     "ClippedPGLossFn.__call__ [0.2/0.28, dual clip 3]"),
    ("nemo-rl", NEMO_LOSS, "advantages < 0, torch.min(clip_loss, loss3), clip_loss",
     "advantages < 0, torch.max(clip_loss, loss3), clip_loss", 0,
     "ClippedPGLossFn.__call__ [0.2/0.28, dual clip 3]"),
    ("nemo-rl", NEMO_LOSS, "clip_loss = -advantages * ratios_clamped.detach() * curr_logprobs",
     "clip_loss = -advantages * ratios_clamped * curr_logprobs", 0,
     "ClippedPGLossFn.__call__ [cispo]"),
    ("nemo-rl", NEMO_LOSS, "                    token_mask,\n                    dim=-1,\n"
                           "                ).unsqueeze(-1)\n                seq_ratio",
     "                    token_mask * 0 + 1,\n                    dim=-1,\n"
     "                ).unsqueeze(-1)\n                seq_ratio", 0,
     "ClippedPGLossFn.__call__ [gspo]"),                 # padding in the sequence ratio
    ("nemo-rl", NEMO_LOSS, "curr_logprobs_unfiltered - curr_logprobs_unfiltered.detach()",
     "curr_logprobs_unfiltered.detach() - curr_logprobs_unfiltered.detach()", 0,
     "ClippedPGLossFn.__call__ [ppo, k3 KL 0.04]"),      # the KL's score weight
    ("nemo-rl", NEMO_UTILS, "kl = torch.square(logr) / 2", "kl = torch.square(logr)", 0,
     "calculate_kl [k2]"),
    ("nemo-rl", NEMO_ADV, "new_gae_lam = delta + self.gae_gamma * lam * last_gae_lam",
     "new_gae_lam = delta + self.gae_gamma * last_gae_lam", 0,
     "GeneralizedAdvantageEstimator._compute_gae [γ 0.99, λ 0.95]"),   # λ: seen only below 1
    ("nemo-rl", NEMO_ADV, "next_values = values[:, t] * m + (1 - m) * next_values",
     "next_values = values[:, t]", 0,
     "GeneralizedAdvantageEstimator._compute_gae [γ 1, λ 1]"),   # a multi-turn row's holes
    # MiniMind at d65ef2c
    ("minimind", GRPO_MM, "grouped_rewards.std(dim=1, unbiased=False)",
     "grouped_rewards.std(dim=1, unbiased=True)", 0, "grpo_train_epoch [advantages]"),
    ("minimind", PPO_MM, "lastgaelam = delta + args.gamma * args.lam * lastgaelam",
     "lastgaelam = delta + args.gamma * lastgaelam", 0, "ppo_train_epoch [GAE]"),
    ("minimind", PPO_MM, "delta = token_rewards[:, t] + args.gamma * nv - old_resp_values[:, t]",
     "delta = token_rewards[:, t] + nv - old_resp_values[:, t]", 0,
     "ppo_train_epoch [GAE]"),                           # a dropped γ: seen only below 1
    ("minimind", GRPO_MM, "clamped_ratio = torch.clamp(ratio, max=args.epsilon_high).detach()",
     "clamped_ratio = torch.clamp(ratio, max=args.epsilon_high)", 0,
     "grpo_train_epoch [cispo loss]"),
    ("minimind", GRPO_MM, "per_token_loss = -(torch.min(per_token_loss1, per_token_loss2)",
     "per_token_loss = -(torch.max(per_token_loss1, per_token_loss2)", 0,
     "grpo_train_epoch [grpo loss]"),
    ("minimind", GRPO_MM, ".sum(dim=1) / completion_mask.sum(dim=1).clamp(min=1)).mean()",
     ".sum(dim=1) / completion_mask.sum().clamp(min=1)).mean()", 0,
     "grpo_train_epoch [grpo loss]"),
    ("minimind", GRPO_MM, "per_token_kl = torch.exp(kl_div) - kl_div - 1",
     "per_token_kl = torch.exp(kl_div) + kl_div - 1", 0, "grpo_train_epoch [grpo loss]"),
    ("minimind", PPO_MM, "torch.rsqrt(adv_var + 1e-8)", "torch.rsqrt(adv_var + 1e-2)", 0,
     "ppo_train_epoch [whitening]"),
    # open-instruct at e6c3044aa
    ("open-instruct", GU, "1.0 - config.clip_lower, 1.0 + config.clip_higher",
     "1.0 - config.clip_higher, 1.0 + config.clip_lower", 0, STEP),
    ("open-instruct", GU, "pg_loss = torch.max(pg_losses, pg_losses2)",
     "pg_loss = torch.min(pg_losses, pg_losses2)", 0, STEP),
    ("open-instruct", GU, "torch.clamp(ratio.detach(), max=1.0 + config.clip_higher)",
     "torch.clamp(ratio, max=1.0 + config.clip_higher)", 0,
     "PolicyTrainerRayProcess.step [cispo]"),
    ("open-instruct", GU, "pg_loss *= rho_weights", "pg_loss *= rho_weights.clamp(max=1.0)", 0,
     "compute_grpo_loss [dapo × ρ weights (the defaults)]"),
    ("open-instruct", FAST, "per_token_loss_BT = pg_loss_BT + self.args.beta * kl_BT",
     "per_token_loss_BT = pg_loss_BT - self.args.beta * kl_BT", 0, STEP),
    ("open-instruct", MU, "torch.expm1(-ref_logprobs_diff) + ref_logprobs_diff",
     "torch.expm1(ref_logprobs_diff) - ref_logprobs_diff", 0, "estimate_kl [2 (k3)]"),
    ("open-instruct", MU, "ratio * ref_logprobs_diff,", "ratio.detach() * ref_logprobs_diff,", 0,
     "estimate_kl [3 (ratio·k1)]"),
    ("open-instruct", GU, "torch.sign(logprob_diff) * advantages > 0",
     "torch.sign(logprob_diff) * advantages < 0", 0,
     "compute_rho_correction [TV filter 0.3/1.5, one response per row]"),
    ("open-instruct", GU,
     "rho_clamped = torch.clamp(rho_clamped, max=config.rho_clamp_upper_bound)",
     "rho_clamped = torch.clamp(rho_clamped, min=config.rho_clamp_upper_bound)", 0,
     "compute_rho_correction [truncation at 2 (the default)]"),
    ("open-instruct", GU, "dropped_low = (rho < lower) & response_mask",
     "dropped_low = (rho > lower) & response_mask", 0,
     "compute_rho_correction [token mask 0.5/5]"),
    ("open-instruct", GU, "seq_count = valid.sum(dim=-1, keepdim=True).clamp_min(1.0)",
     "seq_count = torch.full_like(seq_sum, values.shape[-1])", 0,
     "compute_rho_correction [sequence mask 0.5/2, one response per row]"),
    ("open-instruct", RL, "denom = mask.sum(dim=axis) if denominator is None else denominator",
     "denom = mask.numel() if denominator is None else denominator", 0,
     "masked_mean [token mean]"),
    ("open-instruct", DATA, "std_grouped_rewards = scores_per_prompt.std(axis=-1)",
     "std_grouped_rewards = scores_per_prompt.std(axis=-1, ddof=1)", 0,
     "DataPreparationActor._data_preparation_loop [standard]"),
]
NAMES = sorted({t for t, *_ in PATCHES})

# (trainer, file, text, replacement, row): bugs at a row that already fails at the pinned commit
BASELINED = [
    ("roll", ROLL, "lastgaelam = delta + gamma * lambd * lastgaelam",
     "lastgaelam = delta + gamma * lastgaelam", "compute_gae_advantage_return [γ 0.99, λ 0.95]"),
    ("nemo-rl", NEMO_UTILS, "num_valid = valid_mask[prompt_idx].float().sum() - int(",
     "num_valid = valid_mask.float().sum() / len(unique_prompts) - int(",
     NEMO_GRPO_MEAN),                                   # unequal groups: a mean group size
    ("nemo-rl", NEMO_UTILS, "if valid_mask[prompt_idx].sum() <= 1:",
     "if valid_mask[prompt_idx].sum() < 1:", NEMO_GRPO),  # a group of one: its own baseline
]


def _checkout(name):
    """The checkout named by the trainer's environment variable, or skip with why."""
    var = ENV[name]
    path = os.environ.get(var, "")
    pinned = trainers.get(name).pinned.replace("commit ", "")
    if not path:
        pytest.skip(f"{var} is not set: point it at a checkout of {name} at {pinned}")
    if not os.path.isdir(path):
        pytest.fail(f"{var} is {path!r}, which is not a folder")
    if os.path.exists(os.path.join(path, ".git")):
        head = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        if not head.startswith(pinned):
            pytest.skip(f"{var} is at {head[:12]}, not at the card's pinned commit {pinned}")
    return path


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """name -> a copy of its checkout (made on first use, once for the module)."""
    made = {}

    def get(name):
        if name not in made:
            src = _checkout(name)
            root = tmp_path_factory.mktemp(name.replace("-", "_")) / "checkout"
            _copy(name, src, root)
            made[name] = root
        return made[name]
    return get


def test_every_checkout_card_has_at_least_five_planted_bugs():
    counts = {n: sum(1 for t, *_ in PATCHES + BASELINED if t == n) for n in ENV}
    assert all(c >= 5 for c in counts.values()), counts
    known = {r.name for n in ENV for r in trainers.get(n).rows}
    missing = [row for *_, row in PATCHES + BASELINED if row not in known]
    assert not missing, missing                      # each names a row of its card


@pytest.mark.parametrize("name", NAMES)
def test_the_unpatched_checkout_raises_no_alarm_at_any_patched_row(name, copies):
    assert_no_alarm(name, copies(name), sorted({row for t, *_, row in PATCHES if t == name}))


@pytest.mark.parametrize("name, rel, old, new, nth, row", PATCHES,
                         ids=[ascii_id(p) for p in PATCHES])
def test_a_planted_bug_is_caught_at_its_row_as_a_new_deviation(name, rel, old, new, nth, row,
                                                                copies):
    assert_caught(name, copies(name), rel, old, new, nth, row)


@pytest.mark.parametrize("name, rel, old, new, row", BASELINED,
                         ids=[ascii_id(p) for p in BASELINED])
def test_a_second_bug_at_an_already_failing_row_is_new_since_the_baseline(name, rel, old, new,
                                                                          row, copies):
    root = copies(name)
    t = trainers.get(name)
    before = card.run(t, path=str(root), cases=CASES, only=[row])
    (r,) = before.rows
    assert r.verdict == "DOES NOT CONFORM" and before.exit_code == 1   # the pinned row's defect
    saved = {name: before.to_dict()}
    again = card.run(t, path=str(root), cases=CASES, only=[row]).against(saved, "card.json")
    assert again.exit_code == 0 and not again.comparison.new     # its own baseline holds it
    with Planted(root, rel, old, new):
        after = card.run(t, path=str(root), cases=CASES, only=[row]).against(saved, "card.json")
    assert after.exit_code == 1, after.text()
    assert after.comparison.new and {n for n, _ in after.comparison.new} == {row}
    assert all(not f["known"] for _, f in after.comparison.new)
