"""TRL's report card: the GRPO loss, `GRPOTrainer._compute_loss` in trl/trainer/grpo_trainer.py.

Facts read in TRL 1.16.0 (TRL's PPO trainer is no longer in the package; its GRPO advantages
are statements inside `_generate_and_score_completions`, not a function):
- `_compute_loss(self, model, inputs)` takes the log-probs from
  `self._get_per_token_logps_and_entropies(...)`; the card calls it unbound with a stand-in
  `self` whose method returns the log-probs under test, so autograd runs through TRL's own
  loss code;
- `loss_type` chooses the clip and the aggregation: 'grpo' (per-sequence token mean over all
  rows, divided by the accumulation steps), 'bnpo' (local token mean), 'dr_grpo' (sum over
  B·max_completion_length), 'dapo' and 'cispo' (sum over `num_items_in_batch`, the generation
  batch's token count), 'luspo' (per-sequence token sum, mean over rows);
- `importance_sampling_level='sequence'` with loss_type 'grpo' is GSPO.
"""
import collections
import math
import types

import numpy as np
import torch

from .card import DoesNotFit, Known, NotInVersion, Row, StandInSelf, Trainer, owner_class, source_of, unpacked

GRPO = "trl.trainer.grpo_trainer"
MAX_LEN = 8.0          # max_completion_length, the Dr. GRPO constant


class _Accelerator:
    """One process: gather and reduce are the identity."""
    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def _stand_in(logp, loss_type, level="token", beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
              returns=3, bias_kl=False):
    args = StandInSelf(use_bias_correction_kl=bias_kl, delta=None, steps_per_generation=1,
                       sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0,
                       vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
    me = StandInSelf(
        loss_type=loss_type, importance_sampling_level=level, beta=beta,
        epsilon_low=epsilon_low, epsilon_high=epsilon_high, args=args,
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, aux_loss_enabled=False,
        use_vllm=False, vllm_importance_sampling_correction=False, tools=None,
        _entropy_bonus_enabled=False, model=StandInSelf(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=MAX_LEN,
        accelerator=_Accelerator(),
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)))
    given = (logp, torch.zeros_like(logp).detach(), None)[:returns]    # as many as it unpacks
    method = lambda *a, **k: given if returns > 1 else logp               # noqa: E731
    me._get_per_token_logps_and_entropies = me._get_per_token_logps = method   # (before 0.20)
    return me


def _arity(fn):
    """How many values _compute_loss unpacks from the log-prob method it calls (its name
    before 0.20: _get_per_token_logps)."""
    try:
        return unpacked(fn, "_get_per_token_logps_and_entropies")   # 2 before 1.7, then 3
    except DoesNotFit:
        return unpacked(fn, "_get_per_token_logps")


def _static_helpers(me, fn):
    """The class's static helpers the loss calls on self (get_gamma_weights, ...)."""
    cls = owner_class(fn)
    for name in ("get_gamma_weights", "get_sapo_token_loss"):
        if hasattr(cls, name):
            setattr(me, name, getattr(cls, name))


def _inputs(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
    B = logp.shape[0]
    inputs = dict(prompt_ids=torch.zeros((B, 0), dtype=torch.long),
                  prompt_mask=torch.zeros((B, 0), dtype=torch.long),
                  completion_ids=torch.zeros(logp.shape, dtype=torch.long),
                  completion_mask=mask.to(torch.long), advantages=advantages,
                  old_per_token_logps=old_logp)
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    n = mask.sum() if n_tokens_global is None else n_tokens_global
    inputs["num_items_in_batch"] = torch.as_tensor(n, dtype=logp.dtype)
    return inputs


def _loss(loss_type, level="token", beta=0.0, bias_kl=False, **eps):
    def make(fn):
        returns = _arity(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
            me = _stand_in(logp, loss_type, level, beta, returns=returns, bias_kl=bias_kl,
                           **eps)
            _static_helpers(me, fn)
            return fn(me, None, _inputs(logp, old_logp, advantages, mask,
                                        ref_logp if beta else None, n_tokens_global))
        return adapter
    return make


def _clip_metric(fn):
    returns = _arity(fn)

    def adapter(logp, old_logp, advantages, mask):
        me = _stand_in(logp, "dapo", returns=returns)
        with torch.no_grad():
            fn(me, None, _inputs(logp, old_logp, advantages, mask))
        return me._metrics["train"]["clip_ratio/region_mean"][-1]
    return adapter


def _fits(loss_type, level="token"):
    return lambda fn: _fits_loss(fn, loss_type, level)


def _fits_loss(fn, loss_type, level):
    """What this release's _compute_loss has: the loss type and, for a sequence-level row, the
    importance_sampling_level switch (NOT IN THIS VERSION where it never names them)."""
    source = source_of(fn)
    if f'"{loss_type}"' not in source and f"'{loss_type}'" not in source:
        raise NotInVersion(f"_compute_loss has no loss_type {loss_type!r} in this version")
    if level != "token" and "importance_sampling_level" not in source:
        raise NotInVersion("_compute_loss has no importance_sampling_level in this version")
    return _ONE_PER_SEQUENCE


def _fits_bias_kl(fn):
    """The bias-corrected KL row: NOT IN THIS VERSION where _compute_loss has no
    use_bias_correction_kl."""
    if "use_bias_correction_kl" not in source_of(fn):
        raise NotInVersion("_compute_loss has no use_bias_correction_kl in this version")
    return _fits_loss(fn, "dapo", "token")


# GRPOTrainer computes one advantage per completion (and releases before 0.26 multiply by
# advantages.unsqueeze(1), taking nothing else): per-token advantages are outside its domain
_ONE_PER_SEQUENCE = dict(domain=("per_sequence_advantages",),
                         choice="advantages one per sequence ([B]), as GRPOTrainer computes "
                                "them: cases with per-token advantages are outside its domain")


_STAND_IN = ("called unbound with a stand-in self: _get_per_token_logps_and_entropies returns "
             "the log-probs under test; one process, no vLLM, no entropy mask or bonus, "
             "current_gradient_accumulation_steps = steps_per_generation = 1",
             "inputs: empty prompts, completion_mask = mask, old_per_token_logps = old_logp, "
             "advantages as given (TRL takes [B] or [B, T])")
_GLOBAL = ("num_items_in_batch = the whole batch's token count, as TRL's trainer passes it",)
_PARAMS = ("self", "model", "inputs")
_PADDING = Known(
    "garbage", "robustness",
    "for the clipped loss types TRL takes exp(log π − log π_old) at every position and masks "
    "by multiplying ((per_token_loss * mask).sum()), so a padded position whose log-ratio "
    "overflows exp (> 88 in float32, > 709 in float64: garbage log-probs at padding) gives "
    "inf · 0 = NaN and the whole loss is NaN. Valid positions are exact; it bites only when "
    "padding holds extreme log-probs. CISPO detaches the clamped ratio and GSPO masks the "
    "log-ratio before exp, so they are immune")
_LOCAL = Known(
    "microbatch", "documented choice",
    "loss_type 'bnpo' normalises by the local micro-batch's token count, so averaged "
    "micro-batches weight tokens unequally when micro-batches hold different numbers of tokens; "
    "'dapo' normalises by the generation batch's count instead",
    variant=dict(microbatch="local"),
    cite="GRPOConfig's loss_type help: 'bnpo' normalises by the number of active tokens in the "
         "local batch, so results may vary with the local batch size")
_FLOAT32_TAU = Known(
    "value", "precision",
    "loss_type 'sapo' builds its temperatures with torch.where(advantages > 0, "
    "sapo_temperature_pos, sapo_temperature_neg) on Python floats: a float32 tensor whatever "
    "the log-probs' dtype, so sapo_temperature_neg = 1.05 enters as 1.0499999523. float64 losses "
    "and gradients then differ from SAPO's by about 1e-6 relative where A ≤ 0; in float32 or "
    "bfloat16 training it is below the rounding",
    variant=dict(conventions=dict(tau_neg=float(np.float32(1.05)))))
ROW = f"{GRPO}:GRPOTrainer._compute_loss"
GENERATE = f"{GRPO}:GRPOTrainer._generate_and_score_completions"
CLIP_MAX = 3.0           # GRPOConfig's vllm_importance_sampling_clip_max (clip_min: None)


def _vllm_is(mode):
    """The vLLM importance-sampling block of _generate_and_score_completions (from
    per_token_logps_diff to the truncated or masked vllm_importance_sampling_ratio), given the
    train-engine log-probs as old_per_token_logps and the sampler's as sampling_per_token_logps."""
    def make(block):
        def adapter(logp, rollout_logp, mask):
            me = StandInSelf(vllm_importance_sampling_mode=mode,
                             vllm_importance_sampling_clip_min=None,
                             vllm_importance_sampling_clip_max=CLIP_MAX,
                             vllm_importance_sampling_cap=CLIP_MAX)          # (before 1.6)
            ratio = block(old_per_token_logps=logp, sampling_per_token_logps=rollout_logp,
                          mask=mask.to(logp.dtype), math=math, self=me)
            return torch.where(mask.bool(), ratio.expand(logp.shape), logp.new_zeros(()))
        return adapter
    return make

# the reward functions' weights (GRPOConfig.reward_weights) and how the case's reward is split
# between two reward functions: w₀·2(r − 2s) + w₁·s = r for every s, so the weighted sum is the
# case's reward, while a dropped, swapped or misplaced weight is not an affine map of r
REWARD_WEIGHTS = (0.5, 2.0)


def _group_advantages(block):
    """The advantage block of _generate_and_score_completions ('sum_then_normalize'), given
    rewards_per_func of two reward functions whose weighted sum is the case's reward; an
    unscorable row (valid 0) has every reward function return None (NaN)."""
    def adapter(rewards, group_size, valid=None):
        import sys
        B = rewards.shape[0]
        s = (torch.arange(B, dtype=rewards.dtype) % 3) * 0.5        # the second function's
        per_func = torch.stack([2.0 * (rewards - 2.0 * s), s], dim=1)
        if valid is not None:
            per_func = torch.where(torch.as_tensor(valid).bool()[:, None], per_func,
                                   per_func.new_full((), float("nan")))
        me = StandInSelf(multi_objective_aggregation="sum_then_normalize",
                         reward_weights=torch.tensor(REWARD_WEIGHTS, dtype=rewards.dtype),
                         scale_rewards="group", reward_funcs=[None, None],
                         accelerator=StandInSelf(process_index=0))
        return block(rewards_per_func=per_func, self=me, device=rewards.device,
                     num_generations=int(group_size), nanstd=sys.modules[GRPO].nanstd,
                     prompts=[None] * B)
    return adapter


# TRL 0.23-0.25 wrote the correction as one token-level truncation, before the modes existed:
# importance_sampling_ratio = clamp(exp(old − sampling), max=vllm_importance_sampling_cap)
_OLDER_IS = ((("importance_sampling_ratio", "importance_sampling_ratio",
               ("importance_sampling_ratio",)),
              "this release's form (before 0.26): importance_sampling_ratio = "
              "exp(old − sampling) "
              f"clamped at vllm_importance_sampling_cap = {CLIP_MAX:g}, token truncation being "
              "its only mode"),)

ROWS = (
    Row(ROW, "policy_objective", _loss("dapo"), label="dapo", choices=_STAND_IN + _GLOBAL,
        conventions=dict(loss="ppo", beta=0.0, clip_high=0.2), params=_PARAMS, fits=_fits("dapo"),
        known=(_PADDING,)),
    Row(ROW, "policy_objective", _loss("dapo", beta=0.04), label="dapo, β = 0.04",
        choices=_STAND_IN + _GLOBAL + ("beta = 0.04: the k3 term added to the per-token loss",
                                       "use_bias_correction_kl = False"),
        conventions=dict(loss="ppo", beta=0.04, clip_high=0.2, kl_weight=None), params=_PARAMS,
        fits=_fits("dapo"), known=(_PADDING,)),
    Row(ROW, "policy_objective", _loss("dapo", beta=0.04, bias_kl=True),
        label="dapo, β = 0.04, bias-corrected KL",
        choices=_STAND_IN + _GLOBAL + ("beta = 0.04, use_bias_correction_kl = True (GRPOConfig's "
                                       "default since 1.10): per_token_kl * coef_1, the ratio "
                                       "attached",),
        conventions=dict(loss="ppo", beta=0.04, clip_high=0.2, kl_weight="ratio"),
        params=_PARAMS, fits=_fits_bias_kl, known=(_PADDING,)),
    Row(ROW, "policy_objective", _loss("dapo", epsilon_high=0.28), label="dapo, ε 0.2/0.28",
        choices=_STAND_IN + _GLOBAL + ("epsilon 0.2, epsilon_high 0.28 (DAPO's clip-higher): "
                                       "the two bounds apart, so a swap shows",),
        conventions=dict(loss="ppo", beta=0.0, clip_low=0.2, clip_high=0.28), params=_PARAMS,
        fits=_fits("dapo"), known=(_PADDING,)),
    Row(ROW, "policy_objective", _loss("grpo"), label="grpo", choices=_STAND_IN,
        conventions=dict(loss="ppo", beta=0.0, clip_high=0.2, agg="seq-mean-token-mean",
                         empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS, fits=_fits("grpo"), known=(_PADDING,)),
    Row(ROW, "policy_objective", _loss("bnpo"), label="bnpo", choices=_STAND_IN,
        conventions=dict(loss="ppo", beta=0.0, clip_high=0.2, agg="token-mean"),
        audit=dict(accumulation="mean"),
        params=_PARAMS, fits=_fits("bnpo"), known=(_PADDING, _LOCAL)),
    Row(ROW, "policy_objective", _loss("dr_grpo"), label="dr_grpo",
        choices=_STAND_IN + (f"max_completion_length = {MAX_LEN:g}",),
        conventions=dict(loss="ppo", beta=0.0, clip_high=0.2, agg="seq-mean-token-sum",
                         norm=MAX_LEN, empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS, fits=_fits("dr_grpo"), known=(_PADDING,)),
    Row(ROW, "policy_objective", _loss("luspo"), label="luspo", choices=_STAND_IN,
        conventions=dict(loss="ppo", beta=0.0, clip_high=0.2, agg="seq-mean-token-sum",
                         empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS, fits=_fits("luspo"), known=(_PADDING,)),
    Row(ROW, "policy_objective", _loss("cispo", epsilon_high=5.0), label="cispo",
        choices=_STAND_IN + _GLOBAL + ("epsilon_high = 5.0",),
        conventions=dict(loss="cispo", beta=0.0), params=_PARAMS, fits=_fits("cispo")),
    Row(ROW, "policy_objective", _loss("grpo", level="sequence", epsilon_low=3e-4,
                                       epsilon_high=4e-4), label="gspo",
        choices=_STAND_IN + ("importance_sampling_level = 'sequence', loss_type 'grpo', "
                             "epsilon 3e-4 / 4e-4, as TRL documents GSPO",),
        conventions=dict(loss="gspo", beta=0.0), audit=dict(accumulation="mean"),
        params=_PARAMS, fits=_fits("grpo", "sequence")),
    Row(ROW, "policy_objective", _loss("sapo"), label="sapo",
        choices=_STAND_IN + ("sapo_temperature_pos 1.0, sapo_temperature_neg 1.05 (GRPOConfig's "
                             "defaults)",),
        conventions=dict(loss="sapo", beta=0.0, agg="seq-mean-token-mean", empty_rows="include"),
        audit=dict(accumulation="mean"),
        params=_PARAMS, fits=_fits("sapo"), known=(_FLOAT32_TAU,)),
    Row(ROW, "policy_objective", _loss("vespo"), label="vespo",
        choices=_STAND_IN + _GLOBAL + ("vespo_k_pos 2.0, vespo_lambda_pos 3.0, vespo_k_neg "
                                       "3.0, vespo_lambda_neg 2.0 (GRPOConfig's defaults); no "
                                       "importance_sampling_ratio (no vLLM)",),
        conventions=dict(loss="vespo", beta=0.0), params=_PARAMS, fits=_fits("vespo")),
    *(Row(GENERATE, "rollout_is_weights", _vllm_is(mode), label=mode,
          block=("per_token_logps_diff", "vllm_importance_sampling_ratio",
                 ("vllm_importance_sampling_ratio",), True),
          older_blocks=_OLDER_IS if mode == "token_truncate" else (),
          choices=("the statements from per_token_logps_diff to the last assignment of "
                   "vllm_importance_sampling_ratio, run with the train-engine log-probs as "
                   "old_per_token_logps, the sampler's as sampling_per_token_logps and a "
                   f"stand-in self: mode {mode!r}, clip_max {CLIP_MAX:g} (named "
                   "vllm_importance_sampling_cap before 1.6), clip_min None (GRPOConfig's "
                   "defaults)", "the ratio read at valid tokens (a sequence's [B, 1] ratio "
                   "broadcast over its tokens)"),
          conventions=dict(level=mode.split("_")[0], mode=mode.split("_")[1], lower=None,
                           upper=CLIP_MAX),
          params=())
      for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")),
    Row(ROW, "policy_objective", _loss("sapo", level="sequence"), label="sapo, sequence",
        choices=_STAND_IN + ("importance_sampling_level = 'sequence': the soft gate on the "
                             "sequence's exp(mean log-ratio)", "sapo_temperature_pos 1.0, "
                             "sapo_temperature_neg 1.05 (GRPOConfig's defaults)"),
        conventions=dict(loss="sapo", level="sequence", beta=0.0, agg="seq-mean-token-mean",
                         empty_rows="include"),
        audit=dict(accumulation="mean"),
        params=_PARAMS, fits=_fits("sapo", "sequence"), known=(_FLOAT32_TAU,)),
    Row(GENERATE, "group_advantages", _group_advantages, label="group advantages, two rewards",
        block=("unscorable_mask", "advantages", ("advantages",), True),
        choices=("the statements from unscorable_mask to the last assignment of advantages "
                 "(the reward functions' weighted sum, the group mean and nanstd over each "
                 "prompt's num_generations completions, the division by std + 1e-4, unscorable "
                 "completions' advantage 0, one process's slice), run with a stand-in self "
                 "(process_index 0 of one process, prompts the batch's): "
                 "multi_objective_aggregation 'sum_then_normalize' and scale_rewards 'group' "
                 f"(GRPOConfig's defaults), reward_weights {REWARD_WEIGHTS}",
                 "two reward functions whose weighted sum is the case's reward: "
                 "rewards_per_func = [2(r − 2s), s] with s = 0, 0.5, 1, 0, ... by row; an "
                 "invalid row (unscorable) has both NaN",
                 "num_generations = the case's group size: groups are consecutive blocks, as "
                 "TRL's sampler repeats each prompt"),
        params=()),
    Row(ROW, "clip_fraction", _clip_metric, label="clip_ratio/region_mean",
        choices=_STAND_IN + ("the clip_ratio/region_mean metric it logs (loss_type 'dapo')",),
        params=_PARAMS, fits=_fits("dapo")),
)

TRAINER = Trainer(
    name="trl", package="trl", dist="trl", profile="trl", pinned="1.16.0",
    modules=(GRPO,), rows=ROWS,
    inventory=((GRPO, r"GRPOTrainer\.(_compute_loss|get_gamma_weights|get_off_policy_mask|"
                      r"get_high_entropy_mask)"),),
    runs=("loss types dapo, grpo, bnpo, dr_grpo, luspo, cispo, sapo, vespo at token level; "
          "GSPO and SAPO at sequence level", "clip symmetric (0.2/0.2) and clip-higher "
          "(0.2/0.28)", "β 0 and 0.04 (the k3 term), use_bias_correction_kl off and on",
          "the vLLM importance-sampling ratio in its four modes",
          "one process, steps_per_generation = gradient accumulation = 1"),
    does_not_run=("delta (two-sided clipping)", "the entropy mask and bonus",
                  "the off-policy mask", "several processes",
                  "luspo at sequence level", "vLLM correction folded into the loss"),
    notes=("the off-policy sequence mask (get_off_policy_mask) has no reference yet",
           "TRL's group advantages are statements inside _generate_and_score_completions, "
           "which generates text: the card runs that statement block (its 'sum_then_normalize' "
           "branch); crosscheck.live checks them with several processes in a real run "
           "(docs/live.md)"),
)
