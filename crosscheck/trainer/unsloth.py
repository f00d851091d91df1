"""Unsloth's report card: the GRPO loss of unsloth_zoo/rl_replacements.py (`grpo_compute_loss`
and the custom-gradient `UnslothEfficientGRPO` the trainer calls it through).

Facts read in unsloth-zoo 2026.10.9:
- `grpo_compute_loss(ref, new, old, sampling_per_token_logps, input_ids, mask, beta,
  advantages, **kwargs)` takes per-token log-probs [B, T] and returns (loss, completion_length,
  mean_kl, delta, flat_is_ratio, coef_1, mask); its loss types and aggregations are TRL's
  (grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo, vespo; `importance_sampling_level`), with
  TRL's hyper-parameter names passed as keywords;
- its k3 term clamps ref − new to ±20 and the term to ≤ 10 (commented "TRL does not clamp"):
  verl's low_var_kl;
- the masked columns of new, old and ref are set to 0 (torch.where) before any exp;
- `UnslothEfficientGRPO.apply(new, old, ref, sampling, lm_head, input_ids, mask, advantages,
  beta, scaler, n_chunks, extra_kwargs, upstream_scale)` computes the gradient in its forward
  pass with `torch.func.grad_and_value` over `n_chunks` chunks (the trainer passes 1), behind
  `torch_compile_with_fallback`; its backward returns that gradient, scaled by the incoming
  one only when `upstream_scale` is set (DeepSpeed); its loss accumulator is float32;
- `import unsloth_zoo` refuses to run without unsloth installed, so the card loads the file by
  itself; the file asserts on transformers' `Unpack` type at import, so transformers is
  imported, not stood in.
"""
import dataclasses
import sys
from unittest import mock

import torch

from .card import Known, Row, Trainer, owner_class
from .trl import _LOCAL, MAX_LEN

RL = "unsloth_zoo.rl_replacements"
UTILS = "unsloth_zoo.temporary_patches.utils"


def _kwargs(loss_type, level, mask, n_tokens_global, **settings):
    n = mask.sum() if n_tokens_global is None else n_tokens_global
    return dict(loss_type=loss_type, importance_sampling_level=level,
                max_completion_length=MAX_LEN, current_gradient_accumulation_steps=1,
                num_items_in_batch=torch.as_tensor(n), **settings)


def _loss(loss_type, level="token", beta=0.0, **settings):
    """grpo_compute_loss itself: autograd differentiates it."""
    def make(fn):
        def adapter(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
            out = fn(ref_logp if beta else None, logp, old_logp, None,
                     torch.zeros(logp.shape, dtype=torch.long), mask.to(torch.long), beta,
                     advantages,
                     **_kwargs(loss_type, level, mask, n_tokens_global, **settings))
            return out[0]
        return adapter
    return make


def _eager():
    """torch_compile_with_fallback returning the function itself (UNSLOTH_COMPILE_DISABLE),
    for the duration of one call."""
    return mock.patch.object(sys.modules[UTILS], "UNSLOTH_COMPILE_DISABLE", True)


def _efficient(loss_type, beta=0.0, **settings):
    """The trainer's path: UnslothEfficientGRPO.apply with n_chunks 1, its loss output."""
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
            with _eager():
                out = cls.apply(logp, old_logp, ref_logp if beta else None, None,
                                torch.zeros((2, 2), dtype=logp.dtype),
                                torch.zeros(logp.shape, dtype=torch.long), mask.to(torch.long),
                                advantages, beta, None, 1,
                                _kwargs(loss_type, "token", mask, n_tokens_global, **settings),
                                None)
            return out[0]
        return adapter
    return make


def _cotangent_one(adapter):
    """The loss with its gradient taken at cotangent 1 and re-attached so that it scales with
    the cotangent: where this conforms, ignoring the incoming gradient was the only
    difference."""
    def variant(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
        out = adapter(logp, old_logp, advantages, mask, ref_logp, n_tokens_global)
        if not (torch.is_grad_enabled() and logp.requires_grad and out.requires_grad):
            return out
        grad, = torch.autograd.grad(out, logp)
        return out.detach() + (grad.detach() * (logp - logp.detach())).sum()
    return variant


_COTANGENT = Known(
    "grad", "robustness",
    "UnslothEfficientGRPO.backward returns the gradient its forward computed and ignores the "
    "incoming gradient unless upstream_scale is set (rl_replacements.py:1427-1432): exact where "
    "the loss is backpropagated as it is returned, as the trainer does (its loss scaler and "
    "DeepSpeed's scale are passed in), wrong by the factor of anything applied to the loss "
    "after it (a weighted sum with another loss, a division by the accumulation steps)",
    variant=dict(adapt=_cotangent_one))
_PADDING = Known(
    "garbage", "robustness",
    "the masked columns of new, old and ref are set to 0 first (rl_replacements.py:995-1001), "
    "but the advantages are not, and the per-token loss is masked by multiplying: a NaN "
    "advantage at padding gives NaN · 0 = NaN. TRL's advantages are one per sequence, finite, "
    "so it bites only when padding holds such an advantage")

_SETUP = ("grpo_compute_loss called with the log-probs under test (ref, new, old; no vLLM "
          "sampling log-probs), input_ids zeros (it only reshapes them), the mask as int64, "
          "advantages one per sequence ([B]) or per token, TRL's keywords "
          "(current_gradient_accumulation_steps 1); its loss output",)
_GLOBAL = ("num_items_in_batch = the whole batch's token count",)
_PARAMS = ("ref", "new", "old", "sampling_per_token_logps", "input_ids", "mask", "beta",
           "advantages")
_MEAN = dict(accumulation="mean")
_PPO = dict(loss="ppo", beta=0.0, clip_low=0.2, clip_high=0.2, agg="token-mean",
            kl_weight=None, kl_clamp=(20.0, 10.0))
_DAPO_KL = dict(_PPO, beta=0.04)

ROWS = (
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("dapo"), label="dapo",
        choices=_SETUP + _GLOBAL, conventions=_PPO, params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("dapo", epsilon_high=0.28),
        label="dapo, ε 0.2/0.28",
        choices=_SETUP + _GLOBAL + ("epsilon_low 0.2, epsilon_high 0.28: the bounds apart, so "
                                    "a swap shows",),
        conventions=dict(_PPO, clip_high=0.28), params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("dapo", beta=0.04),
        label="dapo, β = 0.04",
        choices=_SETUP + _GLOBAL + ("beta 0.04 with the reference log-probs; "
                                    "use_bias_correction_kl False (its default)",),
        conventions=_DAPO_KL, params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("grpo"), label="grpo",
        choices=_SETUP, conventions=dict(_PPO, agg="seq-mean-token-mean", empty_rows="include"),
        audit=_MEAN, params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("bnpo"), label="bnpo",
        choices=_SETUP, conventions=_PPO, audit=_MEAN, params=_PARAMS, known=(_LOCAL,)),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("dr_grpo"), label="dr_grpo",
        choices=_SETUP + (f"max_completion_length {MAX_LEN:g}",),
        conventions=dict(_PPO, agg="seq-mean-token-sum", norm=MAX_LEN, empty_rows="include"),
        audit=_MEAN, params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("luspo"), label="luspo",
        choices=_SETUP, conventions=dict(_PPO, agg="seq-mean-token-sum", empty_rows="include"),
        audit=_MEAN, params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("cispo", epsilon_high=5.0),
        label="cispo",
        choices=_SETUP + _GLOBAL + ("epsilon_high 5.0 (the cap, as TRL documents CISPO)",),
        conventions=dict(loss="cispo", beta=0.0, agg="token-mean", kl_weight=None,
                         bound="absolute", clip_high=5.0), params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective",
        _loss("grpo", level="sequence", epsilon_low=3e-4, epsilon_high=4e-4), label="gspo",
        choices=_SETUP + ("importance_sampling_level 'sequence', loss_type 'grpo', epsilon "
                          "3e-4 / 4e-4 (GSPO's)",),
        conventions=dict(loss="gspo", beta=0.0, agg="seq-mean-token-mean",
                         empty_rows="include", form="sequence", clip_low=3e-4, clip_high=4e-4),
        audit=dict(_MEAN, domain=("per_sequence_advantages",)), params=_PARAMS),
    Row(f"{RL}:grpo_compute_loss", "policy_objective", _loss("sapo"), label="sapo",
        choices=_SETUP + ("sapo_temperature_pos 1.0, sapo_temperature_neg 1.05 (its "
                          "defaults)",),
        conventions=dict(loss="sapo", beta=0.0, agg="seq-mean-token-mean",
                         empty_rows="include", kl_weight=None, tau_pos=1.0, tau_neg=1.05),
        audit=_MEAN, params=_PARAMS),
    Row(f"{RL}:UnslothEfficientGRPO.forward", "policy_objective", _efficient("dapo", beta=0.04),
        label="dapo, β = 0.04, the trainer's path",
        choices=("UnslothEfficientGRPO.apply as the trainer calls it (n_chunks 1, no scaler, "
                 "no upstream_scale), its compile turned off for the call "
                 "(UNSLOTH_COMPILE_DISABLE: the same function, eager); its loss output, a "
                 "float32 accumulator",) + _GLOBAL + ("beta 0.04",),
        conventions=_DAPO_KL, audit=dict(precision="float32"), known=(_COTANGENT,),
        params=("_new_logps", "_old_logps", "_ref_logps", "_sampling_per_token_logps",
                "lm_head", "_input_ids", "_mask", "_advantages", "beta")),
)

# every row masks by multiplying: the garbage check's notes carry _PADDING's explanation
ROWS = tuple(dataclasses.replace(r, known=r.known + (_PADDING,)) for r in ROWS)

TRAINER = Trainer(
    name="unsloth", package="unsloth_zoo", dist="unsloth-zoo", profile="trl",
    pinned="2026.10.9", modules=(RL,), rows=ROWS, real=("transformers",),
    stand_in=("datasets",),         # its dataset_utils (SFT data preparation): ~0.6 s to import
    inventory=((RL, r"grpo_compute_loss|UnslothEfficientGRPO\.(forward|backward)|"
                    r"grpo_entropy_bonus_weights"),),
    not_run=(("UnslothEfficientGRPO.backward",
              "reached through UnslothEfficientGRPO.forward's row, whose gradient it returns"),
             ("grpo_entropy_bonus_weights", "the entropy bonus's weights: no reference for "
                                            "the entropy bonus yet")),
    runs=("loss types dapo (ε 0.2/0.2 and 0.2/0.28; β 0 and 0.04), grpo, bnpo, dr_grpo, luspo, "
          "cispo, sapo at token level; GSPO (grpo at sequence level)",
          "UnslothEfficientGRPO's custom gradient (dapo, β 0.04, one chunk, eager)"),
    does_not_run=("vespo (its γ weights are TRL's GRPOTrainer.get_gamma_weights, passed in by "
                  "the trainer)", "delta (two-sided clipping)", "use_bias_correction_kl",
                  "the vLLM importance-sampling modes and rollout rejection", "sample_weight "
                  "(ScaleRL)", "the off-policy and entropy masks", "n_chunks > 1 (the "
                  "trainer passes 1)", "torch.compile", "the log-probs from hidden states "
                  "(grpo_accumulated_loss)"),
    notes=("the KL term clamps ref − new to ±20 and k3 to at most 10 (rl_replacements.py, "
           "commented 'TRL does not clamp'): judged with verl's low_var_kl clamps; a token "
           "whose k3 exceeds 10 (log π_ref − log π above about 2.6) gets no KL gradient, "
           "where TRL's unclamped k3 gives one",
           "judged under TRL's profile, whose loss types it implements, with every convention "
           "the rows need set explicitly"),
)
