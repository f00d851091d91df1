"""Planted bugs in the pinned trainers' own code: one-token or one-operator text patches, applied
to copies made in a temporary directory at test time (never committed). Each is caught at its
row by a new, unexplained deviation, also where it fails the same check as a known deviation
(the known entry's variant does not reproduce it), and the unpatched copies raise no alarm."""
import importlib.util
import os
import shutil

import pytest

from crosscheck import trainer as trainers
from crosscheck.trainer import card
from tests.trainer.planting import CASES, ascii_id, assert_caught, assert_no_alarm, patched

TRL = "trl/trainer/grpo_trainer.py"
CORE = "verl/trainer/ppo/core_algos.py"
TORCH_F = "verl/utils/torch_functional.py"
VLOSS = "verl/workers/utils/losses.py"
VRT = "verl/trainer/ppo/ray_trainer.py"
EM = "openrlhf/trainer/ppo_utils/experience_maker.py"
LOSS = "openrlhf/models/loss.py"
UTILS = "openrlhf/models/utils.py"
ACTOR = "openrlhf/trainer/ray/ppo_actor.py"
SKY = "skyrl/backends/skyrl_train/utils/ppo_utils.py"
SKYW = "skyrl/backends/skyrl_train/workers/worker.py"
LIGER = "liger_kernel/chunked_loss/grpo_loss.py"
TPL = "trinity/algorithm/policy_loss_fn/"
TKL = "trinity/algorithm/kl_fn/kl_fn.py"
TUT = "trinity/algorithm/utils.py"
TRL_GRPO = "torchrl/objectives/llm/grpo.py"
AF = "areal/utils/functional/functional.py"
AD = "areal/utils/data.py"
AA = "areal/trainer/ppo/actor.py"
UZ = "unsloth_zoo/rl_replacements.py"
LIGER_ROW = "LigerFusedLinearGRPOLoss.forward"
ART = "art/loss.py"
TX = "tunix/rl/algo_core.py"
TXC = "tunix/rl/common.py"

# (trainer, file, text, replacement, which occurrence, the row that must catch it)
PATCHES = [
    # TRL 1.16.0
    ("trl", TRL, "self.args.sapo_temperature_pos, self.args.sapo_temperature_neg)",
     "self.args.sapo_temperature_neg, self.args.sapo_temperature_pos)", 0,
     "GRPOTrainer._compute_loss [sapo, sequence]"),        # where a precision note is known
    ("trl", TRL, "* 4 / temperatures", "* 2 / temperatures", 0, "GRPOTrainer._compute_loss [sapo]"),
    ("trl", TRL, "torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)",
     "torch.clamp(coef_1, 1 - self.epsilon_high, 1 + self.epsilon_low)", 0,
     "GRPOTrainer._compute_loss [dapo, ε 0.2/0.28]"),
    ("trl", TRL, "per_token_loss = -torch.min(per_token_loss1, per_token_loss2)",
     "per_token_loss = -torch.max(per_token_loss1, per_token_loss2)", 0,
     "GRPOTrainer._compute_loss [dapo]"),
    ("trl", TRL, "clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()",
     "clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high)", 0,
     "GRPOTrainer._compute_loss [cispo]"),
    ("trl", TRL, "loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
     "loss = ((per_token_loss * mask).sum(-1) / mask.sum().clamp(min=1.0)).mean()", 0,
     "GRPOTrainer._compute_loss [grpo]"),
    ("trl", TRL, "loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)",
     "loss = (per_token_loss * mask).sum() / mask.size(0)", 0,
     "GRPOTrainer._compute_loss [bnpo]"),                  # where a documented choice is known
    ("trl", TRL, "(per_token_loss.size(0) * self.max_completion_length)",
     "(per_token_loss.size(1) * self.max_completion_length)", 0,
     "GRPOTrainer._compute_loss [dr_grpo]"),
    ("trl", TRL, "log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1)",
     "log_importance_weights = (log_ratio * mask).sum(-1) * mask.sum(-1)", 0,
     "GRPOTrainer._compute_loss [gspo]"),
    ("trl", TRL, "- (ref_per_token_logps - per_token_logps) - 1",
     "+ (ref_per_token_logps - per_token_logps) - 1", 0,
     "GRPOTrainer._compute_loss [dapo, β = 0.04]"),
    ("trl", TRL, "per_token_loss = per_token_loss + self.beta * per_token_kl",
     "per_token_loss = per_token_loss - self.beta * per_token_kl", 0,
     "GRPOTrainer._compute_loss [dapo, β = 0.04]"),
    ("trl", TRL, "per_token_loss = -phi_seq * advantages * per_token_logps",
     "per_token_loss = phi_seq * advantages * per_token_logps", 0,
     "GRPOTrainer._compute_loss [vespo]"),
    ("trl", TRL, "loss = (per_token_loss * mask).sum(-1).mean()",
     "loss = (per_token_loss * mask).sum(-1).sum()", 0, "GRPOTrainer._compute_loss [luspo]"),
    ("trl", TRL, "loss = (per_token_loss * mask).sum() / normalizer",
     "loss = (per_token_loss * mask).mean() / normalizer", 0, "GRPOTrainer._compute_loss [dapo]"),
    ("trl", TRL, "per_token_logps_diff.sum(dim=-1, keepdim=True)",
     "per_token_logps_diff.mean(dim=-1, keepdim=True)", 0,
     "GRPOTrainer._generate_and_score_completions [sequence_truncate]"),
    ("trl", TRL, "invalid_mis_mask, value=0.0", "invalid_mis_mask, value=1.0", 0,
     "GRPOTrainer._generate_and_score_completions [token_mask]"),
    ("trl", TRL, "(old_per_token_logps - sampling_per_token_logps) * mask",
     "(sampling_per_token_logps - old_per_token_logps) * mask", 0,
     "GRPOTrainer._generate_and_score_completions [token_truncate]"),
    ("trl", TRL, "rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0))"
     ".nansum(dim=1)", "rewards = rewards_per_func.nansum(dim=1)", 0,   # the weights dropped
     "GRPOTrainer._generate_and_score_completions [group advantages, two rewards]"),
    ("trl", TRL, "torch.nanmean(rewards.view(-1, num_generations), dim=1)",
     "torch.nanmean(rewards.view(num_generations, -1), dim=0)", 0,     # groups interleaved
     "GRPOTrainer._generate_and_score_completions [group advantages, two rewards]"),
    ("trl", TRL, "rewards[unscorable_mask] = torch.nan", "rewards[unscorable_mask] = 0.0", 0,
     "GRPOTrainer._generate_and_score_completions [group advantages, two rewards]"),
    ("trl", TRL, "advantages = advantages / (std_rewards + 1e-4)",
     "advantages = advantages / (std_rewards + 1e-2)", 0,
     "GRPOTrainer._generate_and_score_completions [group advantages, two rewards]"),
    # verl 0.9.1
    ("verl", CORE, "lastgaelam_ = delta + gamma * lam * lastgaelam",
     "lastgaelam_ = delta + gamma * lastgaelam", 0, "compute_gae_advantage_return"),
    ("verl", CORE, "delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]",
     "delta = token_level_rewards[:, t] + nextvalues - values[:, t]", 0,
     "compute_gae_advantage_return"),                       # a dropped γ: seen only below 1
    ("verl", CORE, "new_running_return = token_level_rewards[:, t] + gamma * running_return",
     "new_running_return = token_level_rewards[:, t] + running_return", 0,
     "compute_reinforce_plus_plus_outcome_advantage [γ 0.99]"),
    ("verl", CORE, "id2mean[idx] = torch.tensor(0.0)",         # a group of one: its mean
     "id2mean[idx] = torch.mean(torch.stack(id2score[idx]))", 0,
     "compute_grpo_outcome_advantage"),
    ("verl", CORE, "response_num = len(id2score[index[i]])",   # unequal groups: a mean size
     "response_num = len(scores) // len(id2score)", 0, "compute_rloo_outcome_advantage"),
    ("verl", CORE, "response_num = len(id2score[index[i]])",   # the largest group's size for
     "response_num = max(map(len, id2score.values())) if len(id2score[index[i]]) > 1 else 1",
     0, "compute_rloo_outcome_advantage"),                 # every group: only unequal sizes
    ("verl", CORE, "scores[i] * response_num / (response_num - 1)",
     "scores[i] * response_num / (response_num + 1)", 0, "compute_rloo_outcome_advantage"),
    ("verl", CORE, "ratio, 1 - cliprange_low, 1 + cliprange_high",
     "ratio, 1 - cliprange_high, 1 + cliprange_low", 1,
     "compute_policy_loss_vanilla [ppo, clip-higher 0.2/0.28]"),
    ("verl", CORE, "clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)",
     "clip_pg_losses2 = torch.max(pg_losses3, clip_pg_losses1)", 1,
     "compute_policy_loss_vanilla [ppo]"),
    ("verl", CORE, "ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)",
     "ppo_kl = verl_F.masked_mean(negative_approx_kl, response_mask)", 1,
     "compute_policy_loss_vanilla [ppo_kl]"),               # where a documented choice is known
    ("verl", CORE, "/ (seq_mask + 1e-8)  # token-mean", "/ (seq_mask + 1.0)  # token-mean", 0,
     "agg_loss [seq-mean-token-mean]"),
    ("verl", CORE, "loss /= loss_scale_factor", "loss *= loss_scale_factor", 0,
     "agg_loss [seq-mean-token-sum-norm]"),
    ("verl", CORE, "return 0.5 * (logprob - ref_logprob).square()",
     "return (logprob - ref_logprob).square()", 0, "kl_penalty [k2]"),
    ("verl", CORE, "kld = (ratio - kl - 1).contiguous()", "kld = (ratio + kl - 1).contiguous()", 0,
     "kl_penalty [low_var_kl]"),
    ("verl", CORE, "vf_losses2 = (vpredclipped - returns) ** 2", "vf_losses2 = (vpreds - returns) ** 2",
     0, "compute_value_loss"),
    ("verl", TORCH_F, "torch.rsqrt(var + 1e-8)", "torch.rsqrt(var + 1e-2)", 0, "masked_whiten"),
    ("verl", TORCH_F, "torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)",
     "torch.logsumexp(logits, dim=-1) + torch.sum(pd * logits, dim=-1)", 0,
     "compute_entropy_loss"),
    # verl 0.9.1: compositions on the training path (the actor's loss, KL in reward, dispatch)
    ("verl", VLOSS, "policy_loss += kl_loss * config.kl_loss_coef", "policy_loss += kl_loss", 0,
     "ppo_loss [vanilla + low_var_kl loss, token-mean]"),  # the KL coefficient dropped
    ("verl", VLOSS, "policy_loss += kl_loss * config.kl_loss_coef",
     "policy_loss -= kl_loss * config.kl_loss_coef", 0,
     "ppo_loss [vanilla + low_var_kl loss, token-mean]"),  # the KL term's sign
    ("verl", VLOSS, "kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob,",
     "kl_penalty(logprob=ref_log_prob, ref_logprob=log_prob,", 0,
     "ppo_loss [vanilla + k1 loss, seq-mean-token-sum-norm]"),   # the KL's arguments swapped
    ("verl", VLOSS, "loss_mat=kld, loss_mask=response_mask",
     "loss_mat=kld, loss_mask=torch.ones_like(response_mask)", 0,
     "ppo_loss [vanilla + low_var_kl loss, token-mean]"),  # the KL term not masked
    ("verl", VLOSS, 'config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor',
     'config.global_batch_info["loss_scale_factor"] = None', 0,
     "ppo_loss [vanilla + k1 loss, seq-mean-token-sum-norm]"),   # loss_scale_factor lost
    ("verl", VRT, "token_level_rewards = token_level_scores - beta * kld",
     "token_level_rewards = token_level_scores - beta * beta * kld", 0, "apply_kl_penalty"),
    ("verl", VRT, 'data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty',
     'data.batch["ref_log_prob"], data.batch["old_log_probs"], kl_penalty', 0,
     "apply_kl_penalty"),
    ("verl", VRT, "gamma=gamma,\n            lam=lam,", "gamma=lam,\n            lam=gamma,", 0,
     "compute_advantage [GAE γ 0.99, λ 0.95]"),           # γ and λ swapped at the call
    ("verl", VRT, "norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,\n        )",
     "\n        )", 0, "compute_advantage [Dr. GRPO]"),   # the switch not passed on
    ("verl", VRT, 'adv_kwargs["index"] = data.non_tensor_batch["uid"]',
     'adv_kwargs["index"] = data.non_tensor_batch["uid"][:1]'
     '.repeat(len(data.non_tensor_batch["uid"]))', 0,
     "compute_advantage [RLOO]"),                          # every group merged into one
    # OpenRLHF 0.11.2
    ("openrlhf", ACTOR, "loss = actor_loss + kl_loss * kl_ctl", "loss = actor_loss + kl_loss", 0,
     "ActorPPOTrainer.training_step [ppo + k3 KL loss, token-mean]"),   # kl_ctl dropped
    ("openrlhf", ACTOR, "loss = actor_loss + kl_loss * kl_ctl",
     "loss = actor_loss + kl_loss * kl_ctl * kl_ctl", 0,    # where a known defect is at value
     "ActorPPOTrainer.training_step [ppo + k2 KL loss, seq-mean-token-mean]"),
    ("openrlhf", ACTOR, "kl_loss = aggregate_loss(kl, experience.action_mask,",
     "kl_loss = aggregate_loss(kl, torch.ones_like(experience.action_mask),", 0,
     "ActorPPOTrainer.training_step [ppo + k3 KL loss, token-mean]"),   # the KL not masked
    ("openrlhf", ACTOR, "action_log_probs,\n                    base_action_log_probs,",
     "base_action_log_probs,\n                    action_log_probs,", 0,
     "ActorPPOTrainer.training_step [ppo + k3 KL loss, token-mean]"),   # the KL reversed
    ("openrlhf", EM, "lastgaelam = delta + gamma * lambd * lastgaelam",
     "lastgaelam = delta + gamma * lastgaelam", 0,
     "RemoteExperienceMaker.get_advantages_and_returns"),  # where a known defect is at value
    ("openrlhf", EM, "cumulative_return = rewards[:, t] + gamma * cumulative_return",
     "cumulative_return = rewards[:, t] + cumulative_return", 0,
     "RemoteExperienceMaker.get_cumulative_returns [γ 0.99]"),  # where a known defect is
    ("openrlhf", EM, "(rewards.std(-1, keepdim=True) + 1e-9)", "(rewards.std(-1, keepdim=True) + 1e-3)",
     0, "RemoteExperienceMaker.compute_advantages_and_returns [group_norm]"),
    ("openrlhf", EM, "/ (args.rollout.n_samples_per_prompt - 1)",
     "/ (args.rollout.n_samples_per_prompt + 1)", 0,
     "RemoteExperienceMaker.compute_advantages_and_returns [rloo]"),
    ("openrlhf", LOSS, "ratio.clamp(1 - self.clip_eps_low, 1 + self.clip_eps_high)",
     "ratio.clamp(1 - self.clip_eps_high, 1 + self.clip_eps_low)", 0,
     "PolicyLoss.forward [ppo, 0.2/0.28, dual clip 3]"),
    ("openrlhf", LOSS, "clip2 = torch.max(clip1, self.dual_clip * advantages)",
     "clip2 = torch.min(clip1, self.dual_clip * advantages)", 0,
     "PolicyLoss.forward [ppo, 0.2/0.28, dual clip 3]"),
    ("openrlhf", LOSS, "return 0.5 * loss", "return loss", 0, "ValueLoss.forward"),
    ("openrlhf", UTILS, "value = log_ratio**2 / 2.0", "value = log_ratio**2 / 4.0", 0,
     "compute_approx_kl [k2]"),
    ("openrlhf", UTILS, "value = (-k3_log_ratio).exp() - 1 + k3_log_ratio",
     "value = (k3_log_ratio).exp() - 1 + k3_log_ratio", 0, "compute_approx_kl [k3]"),
    # SkyRL 0.4.0
    ("skyrl", SKYW, "kl_loss_term = kl_loss * self.cfg.algorithm.kl_loss_coef",
     "kl_loss_term = kl_loss", 0,                            # the KL coefficient dropped
     "PolicyWorkerBase._forward_backward_micro [regular + k3 KL loss, sequence_mean]"),
    ("skyrl", SKYW, "(kl_loss_term - entropy_loss_term) * microbatch_weight",
     "(-kl_loss_term - entropy_loss_term) * microbatch_weight", 0,  # where a choice is known
     "PolicyWorkerBase._forward_backward_micro [regular + k3 KL loss, token_mean]"),
    ("skyrl", SKYW, "kl_loss = masked_mean(kl_loss, loss_mask, dim=-1).mean()",
     "kl_loss = masked_mean(kl_loss, loss_mask, dim=-1).sum()", 0,   # a sum over rows
     "PolicyWorkerBase._forward_backward_micro [regular + k3 KL loss, sequence_mean]"),
    ("skyrl", SKYW, "action_log_probs,\n                    base_action_log_probs,",
     "base_action_log_probs,\n                    action_log_probs,", 0,   # the KL reversed
     "PolicyWorkerBase._forward_backward_micro [regular + k3 KL loss, sequence_mean]"),
    ("skyrl", SKY, "ratio.clamp(1 - config.eps_clip_low, 1 + config.eps_clip_high)",
     "ratio.clamp(1 - config.eps_clip_high, 1 + config.eps_clip_low)", 0,
     "ppo_policy_loss [regular, 0.2/0.28]"),
    ("skyrl", SKY, "pg_losses3 = -advantages * config.clip_ratio_c",
     "pg_losses3 = advantages * config.clip_ratio_c", 0, "ppo_policy_loss [dual_clip]"),
    ("skyrl", SKY, "normalized_advantages = advantages / loss_mask.sum().clamp(min=1)",
     "normalized_advantages = advantages / loss_mask.sum(dim=-1, keepdim=True).clamp(min=1)",
     0, "ppo_policy_loss [regular]"),
    ("skyrl", SKY, "(id2std[index[i]] + epsilon)", "(id2std[index[i]] ** 2 + epsilon)", 0,
     "compute_grpo_outcome_advantage [GRPO]"),
    ("skyrl", SKY, "lastgaelam = delta + gamma * lambd * lastgaelam",
     "lastgaelam = delta + lambd * lastgaelam", 0,
     "compute_gae_advantage_return [γ 0.99, λ 0.95]"),     # a dropped γ: seen only below 1
    ("skyrl", SKY, "running_return = token_level_rewards[:, t] + gamma * running_return",
     "running_return = token_level_rewards[:, t] + running_return", 0,
     "compute_reinforce_plus_plus_outcome_advantage [γ 0.99]"),
    ("skyrl", SKY, "id2std[idx] = torch.tensor(1.0)",          # a group of one: std NaN
     "id2std[idx] = torch.std(torch.tensor([id2score[idx]]))", 0,
     "compute_grpo_outcome_advantage [GRPO]"),
    ("skyrl", SKY, "response_num = len(id2score[index[i]])",   # unequal groups: a mean size
     "response_num = len(scores) // len(id2score)", 0, "compute_rloo_outcome_advantage"),
    ("skyrl", SKY, "response_num = len(id2score[index[i]])",   # the largest group's size
     "response_num = max(map(len, id2score.values())) if len(id2score[index[i]]) > 1 else 1",
     0, "compute_rloo_outcome_advantage"),                 # (seen only on unequal groups)
    ("skyrl", SKY, "/ (id2mean[index[i]] + epsilon)", "/ (id2mean[index[i]] + 1.0)", 0,
     "compute_maxrl_advantage [MaxRL]"),
    ("skyrl", SKY, "advantages[p_start:p_end] / (num_prompts * prompt_tokens)",
     "advantages[p_start:p_end] / (num_prompts * (p_end - p_start))", 0,
     "reduce_loss [prompt_mean]"),
    ("skyrl", SKY, "torch.rsqrt(var + 1e-8)", "torch.rsqrt(var) + 1e-8", 0, "masked_whiten"),
    ("skyrl", SKY, "return torch.sigmoid(tau * (x - 1.0)) * (4.0 / tau)",
     "return torch.sigmoid(tau * (x - 1.0)) * (2.0 / tau)", 0,
     "sapo_policy_loss [sapo, sequence_mean]"),
    ("skyrl", SKY, "input=tau_pos,", "input=tau_neg,", 0,
     "sapo_policy_loss [sapo, sequence_mean]"),
    ("skyrl", SKY, "masked_mean(log_ratio, loss_mask, dim=-1).unsqueeze(-1)",
     "masked_mean(log_ratio, loss_mask, dim=None)", 0, "gspo_policy_loss [gspo, sequence_mean]"),
    ("skyrl", SKY, "returns[:, t] = running_return", "returns[:, t] = token_level_rewards[:, t]",
     0, "compute_reinforce_plus_plus_outcome_advantage"),     # at the known deviation's check
    ("skyrl", SKY, "kld = 0.5 * (log_probs - log_probs_base).square()",
     "kld = (log_probs - log_probs_base).square()", 0, "compute_approx_kl [k2]"),
    # Liger-Kernel 0.8.5
    ("liger", LIGER, "upper_bound = 1 + epsilon_high\n        lower_bound = 1 - epsilon_low",
     "upper_bound = 1 + epsilon_low\n        lower_bound = 1 - epsilon_high", 0,
     f"{LIGER_ROW} [dapo, ε 0.2/0.28]"),
    ("liger", LIGER, "per_token_loss = -torch.min(per_token_loss1, per_token_loss2)",
     "per_token_loss = -torch.max(per_token_loss1, per_token_loss2)", 0,
     f"{LIGER_ROW} [dapo, chunk_size 2]"),
    ("liger", LIGER, "sapo_loss_fn(coef_1, sapo_temperature_pos),",
     "sapo_loss_fn(coef_1, sapo_temperature_neg),", 0, f"{LIGER_ROW} [sapo]"),
    ("liger", LIGER, "kl_div = kl_div * torch.exp(log_importance_weights)",
     "kl_div = kl_div * torch.exp(log_importance_weights).detach()", 0,
     f"{LIGER_ROW} [dapo, β = 0.04, bias-corrected KL]"),
    ("liger", LIGER, "clipped_coef = torch.clamp(coef, lower_bound, upper_bound).detach()",
     "clipped_coef = torch.clamp(coef, lower_bound, upper_bound)", 0, f"{LIGER_ROW} [cispo]"),
    ("liger", LIGER, "/ attention_mask.sum(-1).clamp(min=1.0)",
     "/ attention_mask.shape[-1]", 0, f"{LIGER_ROW} [gspo]"),
    ("liger", LIGER, "(full_attention_mask.shape[0] * max_completion_length)",
     "(full_attention_mask.shape[1] * max_completion_length)", 0, f"{LIGER_ROW} [dr_grpo]"),
    ("liger", LIGER, "weighted = per_token_loss * attention_mask.sum(1, keepdim=True)",
     "weighted = per_token_loss * attention_mask.sum(1, keepdim=True) ** 2", 0,
     f"{LIGER_ROW} [luspo]"),                     # at the known deviation's checks
    # Trinity-RFT 0.6.0
    ("trinity", TPL + "ppo_policy_loss.py",
     "ratio, 1.0 - self.clip_range_low, 1.0 + self.clip_range_high",
     "ratio, 1.0 - self.clip_range_high, 1.0 + self.clip_range_low", 0,
     "PPOPolicyLossFn [ppo, 0.2/0.28]"),
    ("trinity", TPL + "ppo_policy_loss.py", "pg_losses3 = -advantages * self.clip_ratio_c",
     "pg_losses3 = advantages * self.clip_ratio_c", 0, "PPOPolicyLossFn [ppo]"),
    ("trinity", TPL + "gspo_policy_loss.py", "negative_approx_kl_seq.detach().unsqueeze(-1)",
     "negative_approx_kl_seq.unsqueeze(-1)", 0, "GSPOLossFn [gspo]"),
    ("trinity", TPL + "cispo_policy_loss.py", "max=1.0 + self.clip_range_high",
     "max=1.0 + self.clip_range_low", 0, "CISPOPolicyLossFn [cispo]"),
    ("trinity", TKL, "return (logprob - ref_logprob).square() * 0.5",
     "return (logprob - ref_logprob).square()", 0, "K2Fn.calculate_kl [k2]"),
    ("trinity", TUT, "seq_losses = masked_mean(values, mask, axis=-1)",
     "seq_losses = masked_sum(values, mask, axis=-1)", 0, "aggregate_loss [seq-mean-token-mean]"),
    ("trinity", TUT, "bessel_correction = mask_sum / (mask_sum - 1)",
     "bessel_correction = mask_sum / mask_sum", 0, "masked_whiten"),
    # TorchRL 0.14.1
    ("torchrl", TRL_GRPO, "(-self.clip_epsilon_low).log1p(),\n            self.clip_epsilon_high.log1p()",
     "(-self.clip_epsilon_high).log1p(),\n            self.clip_epsilon_low.log1p()", 0,
     "GRPOLoss.forward [token_mean, ε 0.2/0.28]"),
    ("torchrl", TRL_GRPO, "gain = torch.stack([gain1, gain2], -1).min(dim=-1).values",
     "gain = torch.stack([gain1, gain2], -1).max(dim=-1).values", 0, "GRPOLoss.forward [DAPO]"),
    ("torchrl", TRL_GRPO, "token_count = mask_exp.sum(dim=-2, keepdim=False).clamp_min(1.0)",
     "token_count = mask_exp.sum().clamp_min(1.0)", 0, "GRPOLoss.forward [prompt_mean]"),
    ("torchrl", TRL_GRPO, "attention_mask = dist.mask & torch.isfinite(prev_log_prob)",
     "attention_mask = torch.isfinite(prev_log_prob)", 0, "GRPOLoss.forward [token_mean]"),
    ("torchrl", TRL_GRPO, "log_weight = (cur_log_prob - prev_log_prob).unsqueeze(-1)",
     "log_weight = (cur_log_prob - prev_log_prob.detach()).unsqueeze(-1).detach()", 0,
     "GRPOLoss.forward [token_mean]"),
    # AReaL 1.0.4
    ("areal", AA, "suffix_sums = sorted_m2.flip(0).cumsum(0).flip(0)",
     "suffix_sums = sorted_m2.cumsum(0)", 0, "_apply_m2po_masking"),
    ("areal", AF, "pg_loss = pg_loss * behave_imp_weight", "pg_loss = pg_loss * behave_imp_weight.sqrt()",
     0, "ppo_actor_loss_fn [decoupled, token mask 5]"),
    ("areal", AF, "seq_log_mean = masked_agg.sum(dim=-1, keepdim=True) / valid_count",
     "seq_log_mean = masked_agg.sum(dim=-1, keepdim=True)", 0,
     "ppo_actor_loss_fn [decoupled, sequence mask 2]"),
    ("areal", AF, "1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher),",
     "1.0 + eps_clip,", 0, "ppo_actor_loss_fn [ppo, 0.2/0.28, dual clip 3]"),
    ("areal", AF, "pg_loss3 = torch.sign(advantages) * c_clip * advantages",
     "pg_loss3 = c_clip * advantages", 0, "ppo_actor_loss_fn [ppo, 0.2/0.28, dual clip 3]"),
    ("areal", AF, "pg_loss = torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count",
     "pg_loss = pg_loss.sum() / loss_mask_count", 0, "ppo_actor_loss_fn [ppo]"),
    ("areal", AF, "soft_gate = torch.where(is_positive, scaled_gate_pos, scaled_gate_neg)",
     "soft_gate = torch.where(is_positive, scaled_gate_neg, scaled_gate_pos)", 0,
     "sapo_loss_fn [sapo]"),
    ("areal", AF, "value_loss = torch.max(value_loss_original, value_loss_clipped)",
     "value_loss = torch.min(value_loss_original, value_loss_clipped)", 0,
     "ppo_critic_loss_fn"),
    ("areal", AD, "log_ratio = log_ratio**2 / 2.0", "log_ratio = log_ratio**2", 0,
     "KLEstimator._compute_approx_kl [k2]"),
    ("areal", AA, "delta = rewards[:, t] + self.discount * nextvalues - values[:, t]",
     "delta = rewards[:, t] + nextvalues - values[:, t]", 0,
     "PPOActor._compute_advantages [GAE γ 0.99, λ 0.95]"),   # a dropped γ: seen only below 1
    ("areal", AA, "newgaelam = delta + self.discount * self.gae_lambda * lastgaelam",
     "newgaelam = delta + self.discount * lastgaelam", 0,
     "PPOActor._compute_advantages [GAE γ 0.99, λ 0.95]"),   # a dropped λ
    ("areal", AA, "lastgaelam = lastgaelam * (1 - mask) + newgaelam * mask",
     "lastgaelam = newgaelam", 0,
     "PPOActor._compute_advantages [GAE γ 0.99, λ 0.95]"),   # masked steps not skipped
    ("areal", AA, "rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp)",
     "rewards = -self.kl_ctl * self.kl_estimator(ref_logp, old_logp)", 0,
     "PPOActor._compute_advantages [tot_rewards, k1, kl_ctl 0.1]"),
    ("areal", AA, "indices = torch.clip(seqlens - 2, min=0)",
     "indices = torch.clip(seqlens - 1, min=0)", 0,         # the score one token late
     "PPOActor._compute_advantages [tot_rewards, k1, kl_ctl 0.1]"),
    ("areal", AA, "loss_mask = torch.roll(loss_mask, shifts=-1, dims=-1)",
     "loss_mask = loss_mask", 0,                             # the mask one token off
     "PPOActor._compute_advantages [GAE γ 0.99, λ 0.95]"),
    ("areal", AA, "eps_clip=eps_clip,\n            eps_clip_higher=eps_clip_higher,",
     "eps_clip=eps_clip_higher,\n            eps_clip_higher=eps_clip,", 0,
     "grpo_loss_fn [ppo, 0.2/0.28, dual clip 3]"),           # the two bounds swapped at the call
    ("areal", AA, "            c_clip=c_clip,\n            proximal_logprobs=prox_logp,",
     "            c_clip=None,\n            proximal_logprobs=prox_logp,", 0,
     "grpo_loss_fn [ppo, 0.2/0.28, dual clip 3]"),           # the dual clip not passed on
    # unsloth-zoo 2026.10.9
    ("unsloth", UZ, "coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)",
     "coef_2 = torch.clamp(coef_1, 1 - epsilon_high, 1 + epsilon_low)", 0,
     "grpo_compute_loss [dapo, ε 0.2/0.28]"),
    ("unsloth", UZ, "kl_i = torch.expm1(kl_log_ratio) - kl_log_ratio",
     "kl_i = torch.expm1(kl_log_ratio) + kl_log_ratio", 0, "grpo_compute_loss [dapo, β = 0.04]"),
    ("unsloth", UZ, "clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()",
     "clamped_ratios = torch.clamp(coef_1, max=epsilon_high)", 0, "grpo_compute_loss [cispo]"),
    ("unsloth", UZ, "loss = (loss_i * mask).sum() / (loss_i.size(0) * max_completion_length)",
     "loss = (loss_i * mask).sum() / (loss_i.size(1) * max_completion_length)", 0,
     "grpo_compute_loss [dr_grpo]"),
    ("unsloth", UZ, "log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)",
     "log_importance_weights = (log_ratio * mask).sum(-1)", 0, "grpo_compute_loss [gspo]"),
    ("unsloth", UZ, "temperatures = torch.where(advantages > 0, sapo_temperature_pos, sapo_temperature_neg)",
     "temperatures = torch.where(advantages > 0, sapo_temperature_neg, sapo_temperature_pos)", 0,
     "grpo_compute_loss [sapo]"),
    ("unsloth", UZ, "grad_inputs                  .div_(n_chunks)",
     "grad_inputs                  .div_(n_chunks + 1)", 0,
     "UnslothEfficientGRPO.forward [dapo, β = 0.04, the trainer's path]"),
    # openpipe-art 0.5.18
    ("art", ART, "epsilon_high_default = 4.0", "epsilon_high_default = 2.0", 0,
     "loss_fn [default]"),
    ("art", ART, "torch.clip(prob_ratio.detach(), 1 - epsilon, 1 + epsilon_high)",
     "torch.clip(prob_ratio, 1 - epsilon, 1 + epsilon_high)", 0, "loss_fn [default]"),
    ("art", ART, "reduce=\"mean\",", "reduce=\"sum\",", 0, "loss_fn [sequence]"),
    ("art", ART, "prob_ratio = (prob_ratio + sequence_prob_ratio) / 2",
     "prob_ratio = (prob_ratio * sequence_prob_ratio) / 2", 0, "loss_fn [average]"),
    ("art", ART, "(sequence_prob_ratio**0.5)", "(sequence_prob_ratio**2)", 0,
     "loss_fn [ppo geometric_average]"),
    ("art", ART, "policy_loss = -torch.min(", "policy_loss = -torch.max(", 0, "loss_fn [ppo]"),
    ("art", ART, "torch.clip(prob_ratio, 1 - epsilon, 1 + epsilon_high) * advantages",
     "torch.clip(prob_ratio, 1 - epsilon_high, 1 + epsilon) * advantages", 0,
     "loss_fn [ppo 0.2/0.28]"),
    ("art", ART, "advantages -= tau * logprob_diff.detach()",
     "advantages += tau * logprob_diff.detach()", 0, "loss_fn [kimi_k2_tau]"),
    ("art", ART, "kl_penalty_coef * (avg_kl - kl_per_token)",
     "kl_penalty_coef * (kl_per_token - avg_kl)", 0, "loss_fn [kl_penalty_coef]"),
    ("art", ART, "denominator = assistant_mask.sum() + 1e-6",
     "denominator = assistant_mask.sum() + 1.0", 0, "loss_fn [default]"),
    ("art", ART, "if reduction == \"mean\" else 1.0", "if reduction == \"mean\" else 2.0", 0,
     "loss_fn [sum]"),
    # google-tunix 0.1.7 (where jax is installed: Trainer.requires)
    ("tunix", TX, "jnp.clip(seq_importance_ratio, max=20.0, min=-20.0)",
     "jnp.clip(seq_importance_ratio, max=2.0, min=-2.0)", 0, "grpo_loss_fn [grpo]"),
    ("tunix", TX, "per_token_loss = jnp.maximum(pg_loss_1, pg_loss_2)",
     "per_token_loss = jnp.minimum(pg_loss_1, pg_loss_2)", 0, "grpo_loss_fn [grpo]"),
    ("tunix", TX, "loss = loss + beta * kl_loss", "loss = loss - beta * kl_loss", 0,
     "grpo_loss_fn [grpo]"),
    ("tunix", TX, "jnp.clip(is_ratio, 1 - epsilon, 1 + epsilon_high)",
     "jnp.clip(is_ratio, 1 - epsilon_high, 1 + epsilon)", 0,
     "grpo_loss_fn [token-mean, ε 0.2/0.28, dual clip 3]"),
    ("tunix", TXC, "loss = (per_token_loss * completion_mask).sum() / (",
     "loss = (per_token_loss).sum() / (", 0, "aggregate_loss [token-mean]"),
    ("tunix", TXC, "loss = seq_loss.sum() / non_zero_rows",
     "loss = seq_loss.sum() / per_token_loss.shape[0]", 1,
     "aggregate_loss [sequence-mean-token-scale]"),
    ("tunix", TXC, "kl = jnp.exp(diff) - diff - 1", "kl = jnp.exp(diff) + diff - 1", 0,
     "compute_kl_divergence [low_var_kl]"),
    ("tunix", TX, "axis=-1, ddof=1", "axis=-1, ddof=0", 0, "compute_advantages [grpo]"),
]
NAMES = sorted({t for t, *_ in PATCHES})


def _installed_at_pin(name):
    from importlib import metadata
    t = trainers.get(name)
    if importlib.util.find_spec(t.package) is None:
        return False
    return metadata.version(t.dist) == t.pinned


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """A copy of each pinned trainer's installed package, made once for the module."""
    out = {}
    for name in NAMES:
        if not _installed_at_pin(name):
            continue
        root = tmp_path_factory.mktemp(name)
        package = trainers.get(name).package
        src = os.path.dirname(importlib.util.find_spec(package).origin)
        shutil.copytree(src, root / package, ignore=shutil.ignore_patterns("__pycache__"))
        out[name] = root
    return out


def test_there_are_at_least_thirty_planted_bugs_across_the_pinned_trainers():
    assert len(PATCHES) >= 30 and set(NAMES) == {"verl", "trl", "openrlhf", "skyrl",
                                                            "liger", "trinity", "torchrl", "areal", "unsloth",
                                                            "art", "tunix"}


@pytest.mark.parametrize("name", NAMES)
def test_the_unpatched_copy_raises_no_alarm_at_any_patched_row(name, copies):
    if name not in copies:
        pytest.skip(f"{name} is not installed at its pinned version (.ci/run installs it)")
    assert_no_alarm(name, copies[name], sorted({row for t, *_, row in PATCHES if t == name}))


@pytest.mark.parametrize("name, rel, old, new, nth, row", PATCHES,
                         ids=[ascii_id(p) for p in PATCHES])
def test_a_planted_bug_is_caught_at_its_row_as_a_new_deviation(name, rel, old, new, nth, row,
                                                                copies):
    if name not in copies:
        pytest.skip(f"{name} is not installed at its pinned version (.ci/run installs it)")
    assert_caught(name, copies[name], rel, old, new, nth, row)


def test_a_trainer_function_that_raises_on_every_input_is_a_release_defect_at_its_line(copies):
    if "verl" not in copies:
        pytest.skip("verl is not installed at its pinned version (.ci/run installs it)")
    path = copies["verl"] / CORE
    original = path.read_text(encoding="utf-8")
    old = "    scores = token_level_rewards.sum(dim=-1)\n"
    # the first occurrence is compute_grpo_outcome_advantage's: `.to()` given a module where it
    # wants a device or a dtype raises a TypeError on every input, from the trainer's own line
    broken = patched(original, old, "    scores = token_level_rewards.sum(dim=-1).to("
                                     "torch.nn.Module())\n", 0)
    line = original[:original.find(old)].count("\n") + 1
    path.write_text(broken, encoding="utf-8")
    try:
        c = card.run(trainers.get("verl"), path=str(copies["verl"]), cases=CASES,
                     only=["compute_grpo_outcome_advantage"])
    finally:
        path.write_text(original, encoding="utf-8")
    assert c.rows                       # GRPO and Dr. GRPO: the same function, both raise
    for r in c.rows:
        assert r.verdict == "DOES NOT CONFORM", (r.verdict, r.reason)
        (f,) = r.findings
        assert f["check"] == "raises" and f["grade"] == "deviation" and f["kind"] == "new"
        assert f"{CORE}:{line}" in f["message"] and "TypeError" in f["message"]
        assert "release defect" in f["explanation"]
    assert c.exit_code == 1


NEW_LOSS = '''

@register_policy_loss("crosscheck_planted")
def planted_policy_loss(log_probs, old_log_probs, advantages, config, loss_mask=None,
                        rollout_logprobs=None):
    return reduce_loss(-advantages * log_probs, loss_mask), {}
'''


def test_a_release_that_registers_a_new_loss_shows_it_as_new_on_its_card(copies):
    if "skyrl" not in copies:
        pytest.skip("skyrl is not installed at its pinned version (.ci/run installs it)")
    t = trainers.get("skyrl")
    plain = card.run(t, path=str(copies["skyrl"]), cases=4, only=["masked_whiten"])
    assert plain.why == {}                   # every registered function: a row or its reason
    assert all(plain.reason(q) for _, q, _ in plain.not_covered)
    path = copies["skyrl"] / SKY
    original = path.read_text(encoding="utf-8")
    path.write_text(original + NEW_LOSS, encoding="utf-8")
    try:
        c = card.run(t, path=str(copies["skyrl"]), cases=4, only=["masked_whiten"])
    finally:
        path.write_text(original, encoding="utf-8")
    assert [q for _, q, _ in c.not_covered if q not in
            {q for _, q, _ in plain.not_covered}] == ["planted_policy_loss"]
    said = c.reason("planted_policy_loss")
    assert said.startswith("new in this release") and "register_policy_loss" in said
    assert "planted_policy_loss" in c.text() and "planted_policy_loss" in c.markdown()
    (entry,) = [e for e in c.to_dict()["not_covered"] if e["function"] == "planted_policy_loss"]
    assert entry["why"] == said
