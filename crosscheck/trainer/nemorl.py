"""NeMo-RL's report card (NVIDIA-NeMo/RL, a checkout: `--path`): the policy and value losses of
nemo_rl/algorithms/loss/loss_functions.py and `calculate_kl` of nemo_rl/algorithms/utils.py.

Facts read at commit 7ea279abf:
- the package declares Python ≥ 3.13, but these files and the modules they import parse on
  3.11: no syntax stops a by-file load;
- `ClippedPGLossFn(cfg)(next_token_logprobs [B, S − 1], data, global_valid_seqs,
  global_valid_toks)`: `data` holds [B, S] tensors aligned with the input ids, which the loss
  slices `[:, 1:]` (token_mask, advantages, prev_logprobs, generation_logprobs; sample_mask
  [B]); the loss is a partial sum over the micro-batch divided by the step's global counts
  (`masked_mean`: Σ x·mask / (N + 1e-8)), token-level over valid tokens or sequence-level
  over valid sequences of each sequence's token mean;
- PPO's clip 1 ∓ ratio_clip_min/max on r = exp(logp − prev), dual clip `ratio_clip_c`;
  `use_cispo`: −sg(clip(r))·A·logp; `sequence_level_importance_ratios` (GSPO): the ratio of each
  sequence's mean log-ratio over its tokens, gradient through the mean;
- `MseValueLossFn`: ½·max((v − R)², (clip(v, v_old ± c) − R)²) over the valid tokens, no slice;
- `calculate_kl(logprobs, logprobs_reference, kl_type, input_clamp_value=20,
  output_clamp_value=10)`: k1, k2, k3 of the log-ratio clamped to ±20, the estimate to ±10.
"""
from types import SimpleNamespace

import torch

from .card import Known, Row, Trainer, owner_class, per_sequence, per_token, zero_padding

LOSS = "nemo_rl.algorithms.loss.loss_functions"
UTILS = "nemo_rl.algorithms.utils"
ADV = "nemo_rl.algorithms.advantage_estimator"

# ClippedPGLossConfig's keys, with the values every row sets (no KL, no IS correction)
_PG = dict(disable_ppo_ratio=False, ratio_clip_min=0.2, ratio_clip_max=0.2, ratio_clip_c=None,
           reference_policy_kl_penalty=0.0, use_kl_in_reward=False,
           reference_policy_kl_type="k3", kl_input_clamp_value=20.0, kl_output_clamp_value=10.0,
           use_importance_sampling_correction=False, truncated_importance_sampling_type=None,
           truncated_importance_sampling_ratio=None, truncated_importance_sampling_ratio_min=None,
           use_on_policy_kl_approximation=False, force_on_policy_ratio=False,
           sequence_level_importance_ratios=False, positive_example_nll_weight=0.0,
           token_level_loss=True, use_cispo=False)


def _shifted(x):
    """A [B, T] tensor as a [B, T + 1] one aligned with the input ids: the loss reads [:, 1:]."""
    return torch.cat([x.new_zeros((x.shape[0], 1)), x], dim=1)


def _call(fn, loss_fn, logp, old_logp, advantages, mask, **more):
    """ClippedPGLossFn on `data` as NeMo-RL builds it: [B, T + 1] tensors it reads [:, 1:]
    (`more`: further [B, T] inputs, shifted as the others), the call's own global counts."""
    m = mask.to(logp.dtype)
    data = dict(token_mask=_shifted(m), sample_mask=m.new_ones(m.shape[0]),
                advantages=_shifted(per_sequence(advantages, logp)),
                prev_logprobs=_shifted(old_logp), generation_logprobs=_shifted(old_logp),
                **{k: _shifted(v) for k, v in more.items()})
    loss, _ = fn(loss_fn, logp, data, global_valid_seqs=m.new_tensor(m.shape[0]),
                 global_valid_toks=m.sum())
    return loss


def _pg(**settings):
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask):
            return _call(fn, cls(SimpleNamespace(**dict(_PG, **settings))), logp, old_logp,
                         advantages, mask)
        return adapter
    return make


def _pg_kl(**settings):
    """_pg with the KL penalty: data's reference_policy_logprobs; curr_logprobs_unfiltered
    defaults to the logprobs (no top-k/top-p filtering)."""
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp):
            return _call(fn, cls(SimpleNamespace(**dict(_PG, **settings))), logp, old_logp,
                         advantages, mask, reference_policy_logprobs=ref_logp)
        return adapter
    return make


def _value(fn):
    cls = owner_class(fn)

    def adapter(values, old_values, returns, mask):
        loss_fn = cls(SimpleNamespace(scale=1.0, cliprange=0.2))
        one = values.new_ones((1, 1))

        def token(v, o, r):
            data = dict(token_mask=one, sample_mask=one[0], returns=r, values=o)
            return fn(loss_fn, v, data, global_valid_seqs=one.sum(), global_valid_toks=one.sum())[0]
        return per_token(token, mask, values, old_values, returns)
    return adapter


def _grpo(leave_one_out):
    def make(fn):
        cls = owner_class(fn)

        def adapter(rewards, group_ids):
            B = rewards.shape[0]
            estimator = cls(SimpleNamespace(use_leave_one_out_baseline=leave_one_out,
                                            normalize_rewards=True), None)
            prompts = torch.as_tensor(group_ids).reshape(B, 1)
            out = fn(estimator, prompts, rewards.to(torch.float32),
                     torch.ones((B, 1), dtype=torch.float32))
            return out[:, 0]
        return adapter
    return make


def _gae(gamma, lam):
    """_compute_gae on an estimator holding γ and λ (its __init__ reads a whole config), the
    mask as the values' dtype; the outputs read at the valid tokens (compute_advantage zeroes
    the advantages at masked positions)."""
    def make(fn):
        cls = owner_class(fn)

        def adapter(rewards, values, mask):
            estimator = cls.__new__(cls)
            estimator.gae_gamma, estimator.gae_lambda = gamma, lam
            m = mask.to(values.dtype)
            adv, ret = fn(estimator, rewards * m, values, m)
            return zero_padding(mask, adv), zero_padding(mask, ret)
        return adapter
    return make


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return zero_padding(mask, fn(logp, ref_logp, kl_type=kind))
        return adapter
    return make


_PADDING = Known(
    "garbage", "robustness",
    "masked_mean masks by multiplying (Σ values·mask / (N + 1e-8), utils.py:212), so a NaN or "
    "infinite value at a masked position gives NaN · 0 = NaN; NeMo-RL's batches hold finite "
    "log-probs and advantages at padding")
_SETUP = ("the config as a namespace of ClippedPGLossConfig's keys: no KL penalty, no "
          "importance-sampling correction", "data's tensors shifted one column right, as the "
          "loss reads them [:, 1:]; sample_mask 1; generation_logprobs = prev_logprobs",
          "the global counts the call's own (global_valid_toks its valid tokens, "
          "global_valid_seqs its rows): judged on whole batches")
_GROUPS = ("each group a prompt of one token (its group id): calculate_baseline_and_std_per_"
           "prompt groups rows by their prompt's tokens, in any order and of any size (a group "
           "of one gets baseline = its reward, advantage 0); the rewards as float32 "
           "(NeMo-RL's; its group statistics build float32 matrices); the advantage read from "
           "a one-token mask",)
_PPO = dict(loss="ppo", beta=0.0, agg="token-mean", clip_low=0.2, clip_high=0.2, clip_c=None,
            log_ratio_clamp=None)
_PARAMS = ("next_token_logprobs", "data", "global_valid_seqs", "global_valid_toks")

ROWS = (
    Row(f"{LOSS}:ClippedPGLossFn.__call__", "policy_objective", _pg(), label="ppo",
        choices=_SETUP + ("ratio_clip_min and ratio_clip_max 0.2, token-level loss",),
        conventions=_PPO, audit=dict(accumulation="none"), params=_PARAMS,
        known=(_PADDING,)),
    Row(f"{LOSS}:ClippedPGLossFn.__call__", "policy_objective",
        _pg(ratio_clip_max=0.28, ratio_clip_c=3.0), label="0.2/0.28, dual clip 3",
        choices=_SETUP + ("ratio_clip_max 0.28 (the bounds apart, so a swap shows), "
                          "ratio_clip_c 3",),
        conventions=dict(_PPO, clip_high=0.28, clip_c=3.0), audit=dict(accumulation="none"),
        params=_PARAMS, known=(_PADDING,)),
    Row(f"{LOSS}:ClippedPGLossFn.__call__", "policy_objective",
        _pg(use_cispo=True, ratio_clip_max=0.28), label="cispo",
        choices=_SETUP + ("use_cispo, ratio_clip_min 0.2, ratio_clip_max 0.28",),
        conventions=dict(loss="cispo", beta=0.0, agg="token-mean", bound="relative",
                         clip_low=0.2, clip_high=0.28, log_ratio_clamp=None),
        audit=dict(accumulation="none"), params=_PARAMS, known=(_PADDING,)),
    Row(f"{LOSS}:ClippedPGLossFn.__call__", "policy_objective",
        _pg(sequence_level_importance_ratios=True, token_level_loss=False,
            ratio_clip_min=3e-4, ratio_clip_max=4e-4), label="gspo",
        choices=_SETUP + ("sequence_level_importance_ratios with a sequence-level loss, "
                          "ratio_clip_min 3e-4, ratio_clip_max 4e-4 (GSPO's bounds)",),
        conventions=dict(loss="gspo", beta=0.0, agg="seq-mean-token-mean", form="sequence",
                         clip_low=3e-4, clip_high=4e-4, log_ratio_max=None,
                         empty_rows="include"),
        audit=dict(accumulation="none"), params=_PARAMS, known=(_PADDING,)),
    Row(f"{LOSS}:ClippedPGLossFn.__call__", "policy_objective",
        _pg_kl(reference_policy_kl_penalty=0.04), label="ppo, k3 KL 0.04",
        choices=_SETUP[1:] + ("the config as a namespace of ClippedPGLossConfig's keys: no "
                              "importance-sampling correction; reference_policy_kl_penalty "
                              "0.04, k3, its clamps (input ±20, output ±10); "
                              "reference_policy_logprobs in data, shifted",),
        conventions=dict(_PPO, beta=0.04, kl_kind="k3", kl_clamp=(20.0, 10.0),
                         kl_weight="score"),
        audit=dict(accumulation="none"), params=_PARAMS, known=(_PADDING,)),
    Row(f"{LOSS}:ClippedPGLossFn.__call__", "policy_objective",
        _pg_kl(reference_policy_kl_penalty=0.04, sequence_level_importance_ratios=True,
               token_level_loss=False, ratio_clip_min=3e-4, ratio_clip_max=4e-4),
        label="gspo, k3 KL 0.04",
        choices=_SETUP[1:] + ("sequence_level_importance_ratios with a sequence-level loss "
                              "(GSPO's bounds 3e-4/4e-4) and reference_policy_kl_penalty 0.04, "
                              "k3, its clamps: the KL a per-sequence token mean too; "
                              "reference_policy_logprobs in data, shifted",),
        conventions=dict(loss="gspo", beta=0.04, agg="seq-mean-token-mean", form="sequence",
                         clip_low=3e-4, clip_high=4e-4, log_ratio_max=None,
                         empty_rows="include", kl_kind="k3", kl_clamp=(20.0, 10.0),
                         kl_weight="score"),
        audit=dict(accumulation="none"), params=_PARAMS, known=(_PADDING,)),
    Row(f"{ADV}:GRPOAdvantageEstimator.compute_advantage", "group_advantages", _grpo(True),
        label="leave-one-out (the default)",
        choices=_GROUPS + ("use_leave_one_out_baseline and normalize_rewards (grpo_math_1B's "
                           "defaults)",),
        conventions=dict(baseline="leave_one_out", scale="leave_one_out", ddof=1, eps=1e-6,
                         singleton="zero"),
        params=("prompt_ids", "rewards", "mask")),
    Row(f"{ADV}:GRPOAdvantageEstimator.compute_advantage", "group_advantages", _grpo(False),
        label="group mean",
        choices=_GROUPS + ("normalize_rewards without the leave-one-out baseline",),
        conventions=dict(baseline="mean", scale="group", ddof=1, eps=1e-6, singleton="zero"),
        params=("prompt_ids", "rewards", "mask")),
) + tuple(
    Row(f"{ADV}:GeneralizedAdvantageEstimator._compute_gae", "gae", _gae(gamma, lam),
        label=label,
        choices=("the estimator's gae_gamma and gae_lambda set on a bare instance (__init__ "
                 "reads the whole estimator and loss config); token rewards 0 at masked "
                 "positions, as _build_token_level_rewards multiplies them by the mask; the "
                 "mask as the values' dtype, holes included (its carry-forward masking skips "
                 "a multi-turn row's non-response tokens); read at the valid tokens, as "
                 f"compute_advantage zeroes the rest; γ {gamma}, λ {lam}",),
        conventions=dict(gamma=gamma, lam=lam),
        params=("token_level_rewards", "values", "mask", "gae_lambda"))
    for gamma, lam, label in ((1.0, 1.0, "γ 1, λ 1"), (0.99, 0.95, "γ 0.99, λ 0.95"))
) + (
    Row(f"{LOSS}:MseValueLossFn.__call__", "value_loss", _value,
        choices=("scale 1, cliprange 0.2; evaluated one valid token at a time (a [1, 1] batch "
                 "whose global count is 1)",),
        conventions=dict(clip=0.2), audit=dict(padding_checks=False),
        params=("data", "global_valid_seqs", "global_valid_toks")),
) + tuple(
    Row(f"{UTILS}:calculate_kl", "kl_penalty", _kl(kind), label=kind,
        choices=("its default clamps (input ±20, output ±10); read at the valid tokens",),
        conventions=dict(kind=kind, clamp=(20.0, 10.0)),
        params=("logprobs", "logprobs_reference", "kl_type"))
    for kind in ("k1", "k2", "k3")
)

TRAINER = Trainer(
    name="nemo-rl", package="nemo_rl", dist="nemo-rl", profile="verl",
    pinned="commit 7ea279abf", installable=False, modules=(LOSS, UTILS, ADV), rows=ROWS,
    stand_in=("torch.utils.tensorboard",),
    inventory=((LOSS, r"\w+LossFn\.__call__"),
               (UTILS, r"calculate_kl|calculate_baseline_and_std_per_prompt|masked_mean|"
                       r"masked_var"),
               (ADV, r"\w+AdvantageEstimator\.compute_advantage|"
                     r"GeneralizedAdvantageEstimator\.(_compute_gae|_reward_whiten|"
                     r"_build_token_level_rewards)")),
    not_run=(("calculate_baseline_and_std_per_prompt",
              "reached through GRPOAdvantageEstimator.compute_advantage, which two rows call"),
             ("masked_mean", "reached through the loss functions, which the rows call"),
             ("masked_var", "the variance of GAE's optional whitening (_reward_whiten, not "
                            "run)"),
             ("NLLLossFn.__call__", "a masked negative log-likelihood (SFT), not an RL "
                                    "function"),
             ("DraftCrossEntropyLossFn.__call__", "a draft model's soft-target cross-entropy, not "
                                                  "an RL function"),
             ("PreferenceLossFn.__call__", "a pairwise preference (reward-model) loss, not an "
                                           "RL policy-gradient function"),
             ("DPOLossFn.__call__", "DPO's pairwise preference loss, not an RL policy-gradient "
                                    "function"),
             ("DistillationLossFn.__call__", "a forward, reverse or mixed KL to a teacher's "
                                             "top-k logits (distillation): no reference yet"),
             ("CrossTokenizerDistillationLossFn.__call__", "distillation across tokenizers: "
                                                           "no reference yet"),
             ("GDPOAdvantageEstimator.compute_advantage",
              "per-component GRPO advantages summed, then divided by the batch's std over "
              "samples: no reference yet"),
             ("ReinforcePlusPlusAdvantageEstimator.compute_advantage",
              "the group-centred reward minus β·KL per token, whitened with the biased "
              "variance clamped at 1e-8: no reference takes that combination"),
             ("RawRewardAdvantageEstimator.compute_advantage", "the reward itself"),
             ("GeneralizedAdvantageEstimator.compute_advantage",
              "the terminal reward placed on the last mask token (plus the optional KL in the "
              "reward) around _compute_gae, which two rows run; its VAPO options (a policy λ "
              "apart from the value λ, a length-adaptive λ) have no reference"),
             ("GeneralizedAdvantageEstimator._reward_whiten",
              "the optional advantage whitening (normalize_advantages): no row yet"),
             ("GeneralizedAdvantageEstimator._build_token_level_rewards",
              "the terminal reward on the last mask token minus the optional per-token KL: no "
              "reference yet"),
             ("OPDAdvantageEstimator.compute_advantage",
              "on-policy distillation's teacher log-probs: no reference yet")),
    runs=("ClippedPGLossFn: PPO 0.2/0.2; 0.2/0.28 with dual clip 3; CISPO; GSPO at sequence "
          "level; the k3 KL penalty in the loss (its score weight) with PPO per token and with GSPO "
          "per sequence", "MseValueLossFn with cliprange 0.2", "calculate_kl k1, k2, k3",
          "GRPOAdvantageEstimator with and without the leave-one-out baseline, on prompt ids "
          "of any group size, one included",
          "GeneralizedAdvantageEstimator._compute_gae at γ, λ 1 and 0.99, 0.95, on masks with "
          "holes"),
    does_not_run=("use_on_policy_kl_approximation (the KL weight exp(logp − generation_logp), "
                  "multiplied before the output clamp)",
                  "importance-sampling correction (tis, icepop, seq-mask-tis)",
                  "disable_ppo_ratio (REINFORCE)", "force_on_policy_ratio",
                  "positive_example_nll_weight", "the advantage estimators other than "
                  "GRPO's (see not covered)"),
    notes=("calculate_baseline_and_std_per_prompt takes each group's variance as E[r²] − E[r]² "
           "(utils.py:177-196), one pass, in the rewards' float32: where the rewards share an "
           "offset much larger than their spread (a constant format or correctness reward plus "
           "a small continuous term, or a reward model's scores 1 ± 1e-4) the two terms cancel, "
           "the variance comes out 0 or negative (sqrt gives NaN, nan_to_num 0), and "
           "GRPOAdvantageEstimator then skips the division (std > 0 only, "
           "advantage_estimator.py:93), leaving advantages ~1e4 times too small; at a spread of "
           "1e-3 of the offset the variance is already ~10 % off. The card's counterexample is "
           "rewards 1.00018, 1.00017, 1.00009, 1.00020: NeMo-RL gives 3.2e-5 where the "
           "leave-one-out GRPO advantage is 0.52. A two-pass variance (or torch.var) is exact to "
           "float32. NVIDIA-NeMo/RL#4158, merged after this commit, flags the groups whose "
           "rewards are all one value, where the same rounding made the std spuriously non-zero; "
           "rewards that differ slightly are a different case. A defect to file upstream; the "
           "card exits 1 for it",
           "judged under the verl profile with every convention the rows need set explicitly: "
           "NeMo-RL's losses clamp no log-ratio",),
)
