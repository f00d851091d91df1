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

from .card import Known, Row, Trainer, owner_class, per_sequence, per_token

LOSS = "nemo_rl.algorithms.loss.loss_functions"
UTILS = "nemo_rl.algorithms.utils"

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


def _pg(**settings):
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask):
            loss_fn = cls(SimpleNamespace(**dict(_PG, **settings)))
            m = mask.to(logp.dtype)
            data = dict(token_mask=_shifted(m), sample_mask=m.new_ones(m.shape[0]),
                        advantages=_shifted(per_sequence(advantages, logp)),
                        prev_logprobs=_shifted(old_logp), generation_logprobs=_shifted(old_logp))
            loss, _ = fn(loss_fn, logp, data, global_valid_seqs=m.new_tensor(m.shape[0]),
                         global_valid_toks=m.sum())
            return loss
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


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            out = fn(logp, ref_logp, kl_type=kind)
            return torch.where(mask.bool(), out, out.new_zeros(()))
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
    pinned="commit 7ea279abf", installable=False, modules=(LOSS, UTILS), rows=ROWS,
    stand_in=("torch.utils.tensorboard",),
    inventory=((LOSS, r"ClippedPGLossFn\.__call__|MseValueLossFn\.__call__"),
               (UTILS, r"calculate_kl|calculate_baseline_and_std_per_prompt|masked_mean")),
    not_run=(("calculate_baseline_and_std_per_prompt",
              "groups rows by their prompt's tokens (torch.unique over the prompt rows), and "
              "with leave_one_out_baseline divides by the others' std only where it is > 0: no "
              "reference takes that"),
             ("masked_mean", "reached through the loss functions, which the rows call")),
    runs=("ClippedPGLossFn: PPO 0.2/0.2; 0.2/0.28 with dual clip 3; CISPO; GSPO at sequence "
          "level", "MseValueLossFn with cliprange 0.2", "calculate_kl k1, k2, k3"),
    does_not_run=("the KL penalty in the loss (its weight exp(logp − sg(logp)) adds the score "
                  "term k·∇logp to the gradient, which no reference takes yet)",
                  "importance-sampling correction (tis, icepop, seq-mask-tis)",
                  "disable_ppo_ratio (REINFORCE)", "force_on_policy_ratio",
                  "positive_example_nll_weight", "the advantage estimators "
                  "(advantage_estimator.py)"),
    notes=("judged under the verl profile with every convention the rows need set explicitly: "
           "NeMo-RL's losses clamp no log-ratio",),
)
