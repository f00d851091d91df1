"""Trainer profiles: the conventions each trainer uses, per reference function.

Every value was read from the trainer's own source at the commit or release its profile names; the file
and function it comes from is stated beside it (`Rule.source`), and docs/conventions.md prints
them all (`python -m crosscheck audit --list-profiles`). A profile sets the *reference's*
conventions; the user's own hyper-parameters stay bound inside their adapter.

Beside the conventions, a profile states:
- its domain per function: the inputs that trainer's code is ever given (TRL's and MiniMind's
  PPO only see right-padded masks; MiniMind's GRPO one advantage per sequence). Audit cases
  outside it are skipped and counted, never failed;
- how it accumulates micro-batch gradients ("sum" of losses normalised by global counts,
  "mean" of micro-batch losses, or "none": an optimizer step per batch), which the micro-batch
  check simulates; a loss that accumulates unlike the rest states its own;
- what a value a user may set means in that trainer (verl's shift_mean=False re-adds the mean);
- whether its KL term is a loss or a detached reward, which the KL-direction check judges;
- for policy_objective, one rule per policy loss: the keywords of the chosen loss only.
"""
import dataclasses
import math
from typing import Dict, Mapping, Optional, Tuple

# the domain tags a rule may declare, and what a case outside each looks like
DOMAINS = {
    "right_padded": "a mask with holes (this trainer's code only sees right-padded rows)",
    "left_padded": "a mask with holes or trailing padding (this trainer's code only sees "
                   "left-padded rows: each row's valid tokens one block at its end)",
    "per_sequence_advantages": "per-token advantages (this trainer's code takes one per "
                               "sequence)",
    "per_token_advantages": "per-sequence advantages [B] (this code takes one per token, "
                            "[B, T]: they are broadcast over the row's tokens)",
    "groups_of_two": "a group of one (this trainer requires at least two per group)",
    "per_sequence_scores": "per-token scores (this trainer's code takes one per sequence)",
    "pass_rates": "a negative reward (this function's rewards are pass rates, ≥ 0: MaxRL)",
    "outcome_rewards": "token rewards away from a response's last valid token (this trainer's "
                       "token rewards are one outcome score per response, at its last token)",
    "nonempty_rows": "a response with no valid token (every response this trainer builds keeps "
                     "at least one: nothing masks a whole response)",
}


@dataclasses.dataclass(frozen=True)
class Rule:
    """A trainer's conventions for one reference function, and where they come from."""
    conventions: Mapping[str, object]
    source: str                               # file and function (or config) in the trainer
    domain: Tuple[str, ...] = ()              # DOMAINS tags: the inputs the trainer ever sees
    # ("sum" | "mean", its source) where this loss accumulates unlike the profile's default
    accumulation: Optional[Tuple[str, str]] = None
    # what the trainer means by a value a user may set: ((key, value, {implied conventions}),)
    # e.g. verl's shift_mean=False re-adds the mean: restore_mean=True comes with it
    implies: Tuple[Tuple[str, object, Mapping[str, object]], ...] = ()

    def settle(self, params: Dict[str, object], given: Mapping[str, object]) -> None:
        """Add to `params` what the user's `given` values imply in this trainer (never
        overriding a value the user gave)."""
        for key, value, implied in self.implies:
            if key in given and params.get(key) == value:
                params.update({k: v for k, v in implied.items() if k not in given})


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    about: str                                # its conventions in one sentence
    snapshot: str                             # the repository and commit (or release) read
    rules: Mapping[str, Rule]
    objective: Mapping[str, Rule]             # policy_objective, one rule per policy loss
    default_loss: str                         # the policy loss the trainer uses by default
    accumulation: Tuple[str, str]             # ("sum" | "mean" | "none", its source)
    kl_use: Tuple[Optional[str], str]         # ("loss" | "reward" | None, its source)

    def defines(self):
        return list(self.rules) + (["policy_objective"] if self.objective else [])


def _rule(source, domain=(), accumulation=None, implies=(), **conventions):
    return Rule(conventions, source, tuple(domain), accumulation, tuple(implies))


# masked_whiten(shift_mean=False) in verl and TRL scales the centred values and re-adds the mean
_READDS_MEAN = (("shift_mean", False, {"restore_mean": True}),)


V = "verl/trainer/ppo/core_algos.py::"
S = "skyrl/backends/skyrl_train/utils/ppo_utils.py::"
PROFILES: Dict[str, Profile] = {p.name: p for p in (
    Profile(
        "verl", "unbiased group std + 1e-6 (a group of one keeps its reward), dual clip c = 3 "
        "always on, log-ratio clamp ±20, k3 KL clamped (20, 10), token-mean aggregation",
        "volcengine/verl 0.9.1", {
            "gae": _rule("verl/trainer/config/algorithm.py: gamma, lam", gamma=1.0, lam=1.0),
            "discounted_returns": _rule(V + "compute_reinforce_plus_plus_outcome_advantage",
                                        gamma=1.0),
            "whiten": _rule("verl/utils/torch_functional.py::masked_whiten",
                            implies=_READDS_MEAN, ddof=1, eps=1e-8,
                            eps_mode="var", shift_mean=True),
            "group_advantages": _rule(V + "compute_grpo_outcome_advantage", ddof=1, eps=1e-6,
                                      scale="group", baseline="mean", singleton="keep"),
            "ppo_clip_loss": _rule(V + "compute_policy_loss_vanilla", clip_low=0.2,
                                   clip_high=0.2, clip_c=3.0, log_ratio_clamp=20.0),
            "cispo_loss": _rule(V + "compute_policy_loss_cispo", bound="relative",
                                clip_low=0.2, clip_high=0.2, log_ratio_clamp=20.0),
            "gspo_loss": _rule(V + "compute_policy_loss_gspo", form="token", clip_low=0.2,
                               clip_high=0.2, log_ratio_max=10.0),
            "sapo_loss": _rule(V + "compute_policy_loss_sapo; verl/workers/config/actor.py: "
                               "tau_pos, tau_neg", tau_pos=1.0, tau_neg=1.05,
                               log_ratio_clamp=20.0),
            "value_loss": _rule(V + "compute_value_loss; verl/trainer/config/critic/"
                                "critic.yaml: cliprange_value", clip=0.5),
            "kl_penalty": _rule(V + "kl_penalty_forward (low_var_kl)", kind="k3",
                                clamp=(20.0, 10.0)),
            "aggregate": _rule(V + "agg_loss", mode="token-mean", empty_rows="exclude"),
            "approx_kl": _rule(V + "compute_policy_loss_vanilla: ppo_kl", kind="k1"),
            "clip_fraction": _rule(V + "compute_policy_loss_vanilla: pg_clipfrac",
                                   definition="loss", clip_low=0.2, clip_high=0.2),
            "rollout_is_weights": _rule(
                "verl/trainer/ppo/rollout_corr_helper.py::compute_rollout_correction_weights "
                "(SAFETY_BOUND 20; a float threshold truncates, 'lower_upper' masks)",
                level="token", mode="truncate", lower=None, upper=2.0, seq_stat="sum",
                kept="unit", log_ratio_clamp=20.0),
            "reinforce_loss": _rule(V + "compute_policy_loss_reinforce, _gpg, _dro "
                                    "(policy_loss.dro_beta), _bypass_mode (rollout_correction: "
                                    "rollout_is_threshold 2.0)", beta=0.0, is_level=None,
                                    is_mode="truncate", is_lower=None, is_upper=2.0,
                                    is_log_ratio_clamp=20.0),
            "dppo_loss": _rule(V + "compute_policy_loss_dppo_tv / _dppo_kl; C = "
                               "config.get('clip_ratio_c', 20.0), which is ActorConfig's "
                               "clip_ratio_c (default 3.0)", divergence="tv", clip_low=0.2,
                               clip_high=0.2, clip_c=3.0, log_ratio_clamp=20.0, kl_eps=1e-8),
            "gmpo_loss": _rule(V + "compute_policy_loss_geo_mean", clip_low=0.2, clip_high=0.2,
                               eps=1e-8),
            "entropy": _rule(V + "compute_entropy_loss; verl/utils/torch_functional.py::"
                             "entropy_from_logits"),
            "kl_rewards": _rule(V + "compute_rewards (kl = old_log_prob − ref_log_prob; "
                                "algorithm.kl_ctrl.kl_coef 0.001)", beta=0.001, kind="k1",
                                clamp=None),
            "kl_cov_loss": _rule(V + "compute_policy_loss_kl_cov; verl/workers/config/actor.py:"
                                 " PolicyLossConfig.kl_cov_ratio, ppo_kl_coef", ratio=2e-4,
                                 coef=0.1),
            "optimal_token_baseline_advantages": _rule(
                V + "compute_optimal_token_baseline_advantage", zero_tail=True, eps=1e-8),
            "opo_advantages": _rule(V + "compute_opo_outcome_advantage"),
            "gpg_advantages": _rule(V + "compute_gpg_outcome_advantage", f_norm=1.0),
            "passk_advantages": _rule(V + "compute_grpo_passk_outcome_advantage", eps=1e-6,
                                      scale="group"),
            "remax_advantages": _rule(V + "compute_remax_outcome_advantage"),
            "whitened_group_advantages": _rule(
                V + "compute_reinforce_plus_plus_baseline_outcome_advantage (scale 'none'); "
                "compute_gdpo_outcome_advantage (scale 'group')", scale="none", eps=1e-6,
                whiten_eps=1e-8),
        },
        objective={
            "ppo": _rule("verl/workers/utils/losses.py::ppo_loss with "
                         "compute_policy_loss_vanilla, agg_loss and kl_penalty", loss="ppo",
                         agg="token-mean", kl_kind="k3", kl_clamp=(20.0, 10.0), clip_low=0.2,
                         clip_high=0.2, clip_c=3.0, log_ratio_clamp=20.0),
            "cispo": _rule("verl/workers/utils/losses.py::ppo_loss with "
                           "compute_policy_loss_cispo", loss="cispo", agg="token-mean",
                           kl_kind="k3", kl_clamp=(20.0, 10.0), bound="relative", clip_low=0.2,
                           clip_high=0.2, log_ratio_clamp=20.0),
            "gspo": _rule("verl/workers/utils/losses.py::ppo_loss with compute_policy_loss_gspo "
                          "(aggregated by actor.loss_agg_mode, default token-mean)", loss="gspo",
                          agg="token-mean", kl_kind="k3", kl_clamp=(20.0, 10.0), form="token",
                          clip_low=0.2, clip_high=0.2, log_ratio_max=10.0),
            "sapo": _rule("verl/workers/utils/losses.py::ppo_loss with compute_policy_loss_sapo "
                          "(aggregated seq-mean-token-mean whatever actor.loss_agg_mode says)",
                          loss="sapo", agg="seq-mean-token-mean", kl_kind="k3",
                          kl_clamp=(20.0, 10.0), tau_pos=1.0, tau_neg=1.05,
                          log_ratio_clamp=20.0),
            "dppo": _rule("verl/workers/utils/losses.py::ppo_loss with "
                          "compute_policy_loss_dppo_tv (aggregated by actor.loss_agg_mode, "
                          "default token-mean)", loss="dppo", agg="token-mean", kl_kind="k3",
                          kl_clamp=(20.0, 10.0), divergence="tv", clip_low=0.2,
                          clip_high=0.2, clip_c=3.0, log_ratio_clamp=20.0, kl_eps=1e-8,
                          form="logp"),
        },
        default_loss="ppo",
        accumulation=("sum", "verl/workers/utils/losses.py::ppo_loss: each micro-batch's "
                             "loss is normalised by the global token count (agg_loss's "
                             "batch_num_tokens) and the gradients add up"),
        kl_use=("loss", "verl/workers/utils/losses.py::ppo_loss: use_kl_loss (low_var_kl); the "
                        "in-reward KL (use_kl_in_reward) is k1"),
    ),
    Profile(
        "trl", "unbiased group std + 1e-4, symmetric ε = 0.2 (δ off), CISPO absolute cap 5.0, "
        "k3 unclamped, token-mean (loss_type='dapo')",
        "huggingface/trl f2cd57710", {
            "gae": _rule("trl/experimental/ppo/ppo_config.py: gamma, lam", ("right_padded",),
                         gamma=1.0, lam=0.95),
            "whiten": _rule("trl/experimental/ppo/ppo_trainer.py::masked_whiten",
                            implies=_READDS_MEAN, ddof=1,
                            eps=1e-8, eps_mode="var", shift_mean=True),
            "group_advantages": _rule("trl/trainer/grpo_trainer.py (scale_rewards='group', "
                                      "nanstd)", ("groups_of_two",), ddof=1, eps=1e-4,
                                      scale="group", baseline="mean"),
            "ppo_clip_loss": _rule("trl/trainer/grpo_trainer.py::_compute_loss", clip_low=0.2,
                                   clip_high=None, delta=None),
            "cispo_loss": _rule("trl/trainer/grpo_trainer.py::_compute_loss "
                                "(loss_type='cispo', epsilon_high=5.0)", bound="absolute",
                                clip_high=5.0),
            "gspo_loss": _rule("trl/trainer/grpo_trainer.py::_compute_loss "
                               "(importance_sampling_level='sequence')", form="sequence",
                               clip_low=3e-4, clip_high=4e-4),
            "rollout_is_weights": _rule(
                "trl/trainer/grpo_trainer.py::_generate_and_score_completions; grpo_config.py: "
                "vllm_importance_sampling_mode (sequence_mask), clip_max 3.0, clip_min None",
                level="sequence", mode="mask", lower=None, upper=3.0, seq_stat="sum",
                kept="unit", log_ratio_clamp=None),
            "vespo_loss": _rule("trl/trainer/grpo_trainer.py::get_gamma_weights; grpo_config.py: "
                                "vespo_k_pos/neg, vespo_lambda_pos/neg", k_pos=2.0,
                                lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, log_ratio_clamp=20.0,
                                log_w_min=math.log(1e-8), log_w_max=20.0),
            "sapo_loss": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='sapo'); "
                               "grpo_config.py: sapo_temperature_pos, sapo_temperature_neg",
                               tau_pos=1.0, tau_neg=1.05, log_ratio_clamp=None),
            "value_loss": _rule("trl/experimental/ppo/ppo_config.py: cliprange_value",
                                ("right_padded",), clip=0.2),
            "kl_penalty": _rule("trl/trainer/grpo_trainer.py::_compute_loss: per_token_kl",
                                kind="k3", clamp=None),
            "aggregate": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='dapo')",
                               mode="token-mean", empty_rows="exclude"),
            "approx_kl": _rule("trl/experimental/ppo/ppo_trainer.py: approxkl",
                               ("right_padded",), kind="k2"),
            "clip_fraction": _rule("trl/trainer/grpo_trainer.py::_compute_loss: clip_ratio "
                                   "low/high", definition="sign", clip_low=0.2),
        },
        objective={
            "ppo": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='dapo'; "
                         "use_bias_correction_kl, default True since 1.10: per_token_kl * coef_1)",
                         loss="ppo", agg="token-mean", kl_kind="k3", kl_weight="ratio",
                         clip_low=0.2),
            "cispo": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='cispo'; "
                           "use_bias_correction_kl)", loss="cispo", agg="token-mean",
                           kl_kind="k3", kl_weight="ratio", bound="absolute", clip_high=5.0),
            "vespo": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='vespo', "
                           "get_gamma_weights; aggregated as 'dapo')", loss="vespo",
                           agg="token-mean", kl_kind="k3", kl_weight="ratio", k_pos=2.0,
                           lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, log_ratio_clamp=20.0,
                           log_w_min=math.log(1e-8), log_w_max=20.0),
            "gspo": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='grpo', "
                          "importance_sampling_level='sequence'; with beta > 0 its default "
                          "use_bias_correction_kl weights the KL by the sequence ratio, which "
                          "the reference does not express)", loss="gspo",
                          agg="seq-mean-token-mean", empty_rows="include", kl_kind="k3",
                          form="sequence", clip_low=3e-4, clip_high=4e-4,
                          accumulation=("mean", "trl/trainer/grpo_trainer.py::_compute_loss: "
                                                "loss_type 'grpo' divides by the gradient "
                                                "accumulation steps")),
            "sapo": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='sapo', "
                          "aggregated as 'grpo')", loss="sapo", agg="seq-mean-token-mean",
                          empty_rows="include", kl_kind="k3", kl_weight="ratio", tau_pos=1.0,
                          tau_neg=1.05,
                          accumulation=("mean", "trl/trainer/grpo_trainer.py::_compute_loss: "
                                                "loss_type 'sapo' divides by the gradient "
                                                "accumulation steps")),
        },
        default_loss="ppo",
        accumulation=("sum", "trl/trainer/grpo_trainer.py::_compute_loss: loss_type 'dapo' "
                             "divides by num_items_in_batch, the loss tokens of the whole "
                             "generation batch"),
        kl_use=("loss", "trl/trainer/grpo_trainer.py::_compute_loss: beta·per_token_kl added "
                        "to the per-token loss"),
    ),
    Profile(
        "openrlhf", "unbiased group std + 1e-9 (groups of at least two), biased whitening with "
        "max(var, 1e-8), ε = 0.2 with log-ratio clamp ±20, KL k1 clamped to ±10, token-level "
        "loss", "OpenRLHF/OpenRLHF 3c3be623", {
            "gae": _rule("openrlhf/cli/train_ppo_ray.py: gamma, lambd", gamma=1.0, lam=1.0),
            "discounted_returns": _rule(
                "openrlhf/trainer/ppo_utils/experience_maker.py::get_cumulative_returns",
                gamma=1.0),
            "whiten": _rule("openrlhf/trainer/ppo_utils/experience_maker.py (advantage "
                            "normalisation)", ddof=0, eps=1e-8, eps_mode="clamp",
                            shift_mean=True),
            "group_advantages": _rule("openrlhf/trainer/ppo_utils/experience_maker.py "
                                      "(group_norm; n_samples_per_prompt > 1 asserted)",
                                      ("groups_of_two",), ddof=1, eps=1e-9, scale="group",
                                      baseline="mean", singleton="error"),
            "ppo_clip_loss": _rule("openrlhf/models/loss.py::PolicyLoss (ppo)", clip_low=0.2,
                                   clip_high=0.2, clip_c=None, log_ratio_clamp=20.0),
            "gspo_loss": _rule("openrlhf/models/loss.py::PolicyLoss (gspo)", form="sequence",
                               clip_low=0.2, clip_high=0.2),
            "value_loss": _rule("openrlhf/cli/train_ppo_ray.py: critic.value_clip", clip=0.5),
            "kl_penalty": _rule("openrlhf/models/utils.py::compute_approx_kl", kind="k1",
                                clamp=(None, 10.0)),
            "aggregate": _rule("openrlhf/utils/loss_utils.py (token_level_loss=True)",
                               mode="token-mean", empty_rows="exclude"),
            "approx_kl": _rule("openrlhf/models/loss.py::PolicyLoss: ppo_kl", kind="k1"),
            "entropy": _rule("openrlhf/models/utils.py::compute_entropy"),
            "kl_rewards": _rule("openrlhf/models/utils.py::compute_reward with "
                                "compute_approx_kl (k1, clamped to ±10); cli/train_ppo_ray.py: "
                                "algo.kl.init_coef 0.01",
                                ("per_sequence_scores",), beta=0.01, kind="k1",
                                clamp=(None, 10.0)),
            "rollout_is_weights": _rule(
                "openrlhf/models/loss.py::PolicyLoss (is_correction_level, is_correction_mode "
                "'mask', gating 'ratio', threshold [0.5, 5.0])", level="token", mode="mask",
                lower=0.5, upper=5.0, seq_stat="mean", kept="token", log_ratio_clamp=None),
            "clip_fraction": _rule("openrlhf/models/loss.py::PolicyLoss: clip_ratio",
                                   definition="loss", clip_low=0.2, clip_high=0.2),
        },
        objective={
            "ppo": _rule("openrlhf/models/loss.py::PolicyLoss with compute_approx_kl",
                         loss="ppo", agg="token-mean", kl_kind="k1", kl_clamp=(None, 10.0),
                         clip_low=0.2, clip_high=0.2, log_ratio_clamp=20.0),
            "gspo": _rule("openrlhf/models/loss.py::PolicyLoss (gspo, sample-level)",
                          loss="gspo", agg="seq-mean-token-mean", kl_kind="k1",
                          kl_clamp=(None, 10.0), form="sequence", clip_low=0.2,
                          clip_high=0.2),
        },
        default_loss="ppo",
        accumulation=("sum", "openrlhf/utils/loss_utils.py::get_loss_batch_info: the loss is "
                             "normalised by the global batch_num_tokens"),
        kl_use=("reward", "openrlhf/trainer/ppo_utils/experience_maker.py: −kl_coef·kl in the "
                          "token rewards (kl.use_loss off by default)"),
    ),
    Profile(
        "skyrl", "unbiased group std + 1e-6 (a group of one keeps its reward), ε = 0.2 with "
        "the log-ratio clamped to ±20, advantages pre-scaled for token_mean and the losses "
        "summed, k3 KL clamped (20, 10) in the loss",
        "NovaSky-AI/SkyRL 0.4.0", {
            "discounted_returns": _rule(S + "compute_reinforce_plus_plus_outcome_advantage; "
                                        "AlgorithmConfig.gamma", gamma=1.0),
            "whiten": _rule(S + "masked_whiten", ddof=1, eps=1e-8, eps_mode="var",
                            shift_mean=True),
            "group_advantages": _rule(S + "compute_grpo_outcome_advantage", ddof=1, eps=1e-6,
                                      scale="group", baseline="mean", singleton="keep"),
            "ppo_clip_loss": _rule(S + "ppo_policy_loss; AlgorithmConfig.eps_clip_low / "
                                   "_high", clip_low=0.2, clip_high=0.2, log_ratio_clamp=20.0),
            "cispo_loss": _rule(S + "compute_policy_loss_cispo; CISPOConfig", bound="relative",
                                clip_low=1.0, clip_high=4.0, log_ratio_clamp=20.0),
            "value_loss": _rule(S + "ppo_critic_loss; AlgorithmConfig.value_clip", clip=0.2),
            "kl_penalty": _rule(S + "compute_approx_kl; AlgorithmConfig.kl_estimator_type",
                                kind="k3", clamp=(20.0, 10.0)),
            "aggregate": _rule(S + "apply_loss_reduction_to_advantages_minibatch and "
                               "reduce_loss; AlgorithmConfig.loss_reduction", mode="token-mean",
                               empty_rows="include"),
        },
        objective={
            "ppo": _rule(S + "ppo_policy_loss (policy_loss_type 'regular'), token_mean",
                         loss="ppo", agg="token-mean", kl_kind="k3", kl_clamp=(20.0, 10.0),
                         clip_low=0.2, clip_high=0.2, log_ratio_clamp=20.0),
            "gspo": _rule(S + "gspo_policy_loss (which warns unless loss_reduction is "
                          "sequence_mean)", loss="gspo", agg="seq-mean-token-mean",
                          empty_rows="include", kl_kind="k3", kl_clamp=(20.0, 10.0),
                          form="token", clip_low=0.2, clip_high=0.2, log_ratio_max=10.0),
            "sapo": _rule(S + "sapo_policy_loss (which warns unless loss_reduction is "
                          "sequence_mean); SAPOConfig: tau_pos, tau_neg", loss="sapo",
                          agg="seq-mean-token-mean", empty_rows="include", kl_kind="k3",
                          kl_clamp=(20.0, 10.0), tau_pos=1.0, tau_neg=1.05,
                          log_ratio_clamp=20.0),
            "cispo": _rule(S + "compute_policy_loss_cispo, token_mean", loss="cispo",
                           agg="token-mean", kl_kind="k3", kl_clamp=(20.0, 10.0),
                           bound="relative", clip_low=1.0, clip_high=4.0,
                           log_ratio_clamp=20.0),
        },
        default_loss="ppo",
        accumulation=("sum", S + "apply_loss_reduction_to_advantages_minibatch: the trainer "
                             "scales the advantages by the whole mini-batch's counts and the "
                             "worker sums the micro-batches' loss sums"),
        kl_use=("loss", "AlgorithmConfig.use_kl_loss (True), kl_loss_coef 0.001; the worker "
                        "adds the per-sequence mean of k3, averaged over the batch"),
    ),
    Profile(
        "minimind", "biased group std + 1e-4, CISPO (absolute cap 5.0) with β = 0.1 k3, "
        "per-sequence token mean over all rows; its PPO: ε = 0.2, β = 0.02 k3, token mean",
        "jingyaogong/minimind d65ef2c", {
            "gae": _rule("trainer/train_ppo.py: gamma, lam", ("right_padded",), gamma=1.0,
                         lam=0.95),
            "whiten": _rule("trainer/train_ppo.py (advantage whitening)", ddof=0, eps=1e-8,
                            eps_mode="var", shift_mean=True),
            "group_advantages": _rule("trainer/train_grpo.py (group advantages)", ddof=0,
                                      eps=1e-4, scale="group", baseline="mean"),
            "ppo_clip_loss": _rule("trainer/train_ppo.py: clip_epsilon", ("right_padded",),
                                   clip_low=0.2),
            "cispo_loss": _rule("trainer/train_grpo.py: epsilon_high", bound="absolute",
                                clip_high=5.0),
            "value_loss": _rule("trainer/train_ppo.py: cliprange_value", ("right_padded",),
                                clip=0.2),
            "kl_penalty": _rule("trainer/train_grpo.py and train_ppo.py (k3)", kind="k3",
                                clamp=None),
            "aggregate": _rule("trainer/train_grpo.py (per-sequence mean, then batch mean)",
                               mode="seq-mean-token-mean", empty_rows="include"),
            "approx_kl": _rule("trainer/train_ppo.py: approx_kl (k2)", ("right_padded",),
                               kind="k2"),
            "clip_fraction": _rule("trainer/train_ppo.py: clipfrac", ("right_padded",),
                                   definition="ratio", clip_low=0.2),
        },
        objective={
            "cispo": _rule("trainer/train_grpo.py (loss_type='cispo', beta=0.1)",
                           ("per_sequence_advantages",), loss="cispo",
                           agg="seq-mean-token-mean", empty_rows="include", beta=0.1,
                           kl_kind="k3", bound="absolute", clip_high=5.0),
            "ppo": _rule("trainer/train_ppo.py (clip_epsilon=0.2, kl_coef=0.02, token mean)",
                         ("right_padded",), loss="ppo", agg="token-mean", beta=0.02,
                         kl_kind="k3", clip_low=0.2),
        },
        default_loss="cispo",
        accumulation=("none", "trainer/train_grpo.py, train_ppo.py: --accumulation_steps "
                              "defaults to 1, an optimizer step per batch; raised, each loss is "
                              "divided by it: accumulation='mean'"),
        kl_use=("loss", "trainer/train_grpo.py, train_ppo.py: β·k3 in the loss"),
    ),
    Profile(
        "cleanrl", "GAE γ = 0.99, λ = 0.95, per-minibatch whitening (A − mean)/(std_unbiased "
        "+ 1e-8), ε = 0.2 for policy and value, plain mean",
        "vwxyzjn/cleanrl fe8d8a03", {
            "gae": _rule("cleanrl/ppo.py: gamma, gae_lambda", gamma=0.99, lam=0.95),
            "whiten": _rule("cleanrl/ppo.py: norm_adv", ddof=1, eps=1e-8, eps_mode="std",
                            shift_mean=True),
            "ppo_clip_loss": _rule("cleanrl/ppo.py: clip_coef", clip_low=0.2),
            "value_loss": _rule("cleanrl/ppo.py: clip_vloss, clip_coef", clip=0.2),
            "aggregate": _rule("cleanrl/ppo.py: .mean()", mode="token-mean",
                               empty_rows="exclude"),
            "approx_kl": _rule("cleanrl/ppo.py: approx_kl", kind="k3"),
            "clip_fraction": _rule("cleanrl/ppo.py: clipfracs", definition="ratio",
                                   clip_low=0.2),
        },
        objective={
            "ppo": _rule("cleanrl/ppo.py: pg_loss", loss="ppo", agg="token-mean",
                         clip_low=0.2),
        },
        default_loss="ppo",
        accumulation=("none", "cleanrl/ppo.py: one optimizer step per minibatch"),
        kl_use=(None, "cleanrl/ppo.py: no KL term against a reference"),
    ),
)}


class ProfileError(ValueError):
    pass


def get(profile: str) -> Profile:
    if profile not in PROFILES:
        raise ProfileError(f"profile is {profile!r}; expected one of {', '.join(PROFILES)}")
    return PROFILES[profile]


def rule(profile: str, ref: str, loss: Optional[str] = None) -> Rule:
    """The rule `profile` states for `ref` (for policy_objective, for the policy `loss`: the
    profile's default loss when None)."""
    p = get(profile)
    if ref == "policy_objective":
        loss = p.default_loss if loss is None else loss
        if loss not in p.objective:
            raise ProfileError(f"profile {profile!r} has no policy_objective with loss "
                               f"{loss!r}; it has: {', '.join(p.objective)}")
        return p.objective[loss]
    if ref not in p.rules:
        raise ProfileError(f"profile {profile!r} defines no conventions for {ref!r} (that "
                           f"trainer has no such function); it defines: "
                           f"{', '.join(p.defines())}")
    return p.rules[ref]


def _line(ref, r, note=""):
    dom = f" (domain: {', '.join(r.domain)})" if r.domain else ""
    return [f"    {ref:<20} " + ", ".join(f"{k}={v!r}" for k, v in r.conventions.items()) + dom
            + note, f"    {'':<20} from {r.source}"] + (
        [f"    {'':<20} micro-batches: {r.accumulation[0]}: {r.accumulation[1]}"]
        if r.accumulation else []) + [
        f"    {'':<20} with {key}={value!r}: " +
        ", ".join(f"{k}={v!r}" for k, v in implied.items())
        for key, value, implied in r.implies]


def describe() -> str:
    """Every profile, the conventions it sets, and the trainer code each comes from."""
    lines = []
    for p in PROFILES.values():
        lines.append(f"{p.name} ({p.snapshot}): {p.about}")
        for ref, r in p.rules.items():
            lines += _line(ref, r)
        for loss, r in p.objective.items():
            lines += _line(f"policy_objective[{loss}]", r,
                           " (the default loss)" if loss == p.default_loss else "")
        lines.append(f"    {'micro-batches':<20} {p.accumulation[0]}: {p.accumulation[1]}")
        lines.append(f"    {'KL term':<20} {p.kl_use[0] or 'none'}: {p.kl_use[1]}")
    return "\n".join(lines)


def to_dict():
    """The profiles as plain data (for --json)."""
    def rule_dict(r):
        return dict(conventions=dict(r.conventions), source=r.source, domain=list(r.domain),
                    accumulation=None if r.accumulation is None else
                    dict(mode=r.accumulation[0], source=r.accumulation[1]),
                    implies=[dict(key=k, value=v, conventions=dict(c)) for k, v, c in r.implies])
    return {p.name: dict(about=p.about, snapshot=p.snapshot,
                         rules={k: rule_dict(r) for k, r in p.rules.items()},
                         policy_objective={k: rule_dict(r) for k, r in p.objective.items()},
                         default_loss=p.default_loss,
                         accumulation=dict(mode=p.accumulation[0], source=p.accumulation[1]),
                         kl_use=dict(use=p.kl_use[0], source=p.kl_use[1]))
            for p in PROFILES.values()}
