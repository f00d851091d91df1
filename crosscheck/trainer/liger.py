"""Liger-Kernel's report card: the fused chunked GRPO loss,
liger_kernel/chunked_loss/grpo_loss.py (`LigerFusedLinearGRPOLoss`).

Facts read in liger-kernel 0.8.5:
- the loss takes hidden states [B, T, H] and an lm_head (weight [V, H], bias [V]) and computes
  each token's log-prob itself, chunk by chunk over the batch, in float32 whatever the inputs'
  dtype (fused_linear_ppo.py: float32 buffers, `.float()` logits); its autograd.Function
  computes the gradients during the forward pass and `backward` only scales them;
- its loss types are TRL's GRPO loss types (grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo,
  vespo; `importance_sampling_level` token or sequence) with the same hyper-parameters, but its
  own defaults: beta 0.04, use_bias_correction_kl False, and no division by gradient
  accumulation steps;
- advantages are one per sequence ([B], used as advantages.unsqueeze(1)).

The card feeds each log-prob under test through an identity lm_head over a two-token
vocabulary: hidden state [0, c] with c = log(expm1(−log p)) = log(−expm1(log p)) − log p
gives the selected token 0 the log-softmax −softplus(c) = log p, so autograd carries Liger's
own gradient back to the log-probs by the chain rule (∂ log p / ∂c = −(1 − p),
∂c / ∂ log p = −1 / (1 − p)).
"""
import dataclasses
import math

import torch

from .card import Known, Row, Trainer, owner_class
from .trl import _LOCAL, MAX_LEN

GRPO = "liger_kernel.chunked_loss.grpo_loss"
ROW = f"{GRPO}:LigerFusedLinearGRPOLoss.forward"


def _hidden(logp):
    """Hidden states [B, T, 2] whose log-softmax at token 0 through the identity is `logp`.
    log p = 0 (a certain token) enters as −1e-30, which float32 holds and the derivative keeps.
    A value no hidden state gives (NaN, ±inf, > 0: garbage padding) becomes the state of
    log p = −log 2: Liger computes its log-probs from the model's finite hidden states, so it
    never meets one."""
    ok = torch.isfinite(logp) & (logp <= 0)
    at_zero = torch.where(logp == 0, logp.new_full((), -1e-30), logp.new_zeros(()))
    safe = torch.where(ok, logp + at_zero, logp.new_full((), -math.log(2.0)))
    c = torch.log(-torch.expm1(safe)) - safe          # log(expm1(−log p)), finite for −1e4
    return torch.stack([torch.zeros_like(c), c], dim=-1)


def _loss(loss_type, level="token", beta=0.0, chunk_size=64, **settings):
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
            module = cls(beta=beta, compiled=False, use_ref_model=bool(beta),
                         chunk_size=chunk_size, loss_type=loss_type,
                         importance_sampling_level=level, max_completion_length=int(MAX_LEN),
                         **settings)
            B, T = logp.shape
            n = mask.sum() if n_tokens_global is None else n_tokens_global
            loss, _ = module(_hidden(logp), torch.eye(2, dtype=logp.dtype),
                             torch.zeros((B, T), dtype=torch.long), mask.to(torch.long),
                             advantages if advantages.dim() == 1 else advantages[:, 0],
                             ref_per_token_logps=ref_logp if beta else None,
                             old_per_token_logps=old_logp,
                             num_items_in_batch=torch.as_tensor(n, dtype=logp.dtype))
            return loss
        adapter.loss_globals = fn.__globals__      # where the loss looks up k3_loss_fn
        return adapter
    return make


def _rows_unpadded(adapter):
    """The loss of each row called alone on its valid tokens (no padding: T = L_i, B = 1),
    averaged over the batch's rows, empty ones counting 0. Without padding Liger's LUSPO
    form Σ_t ℓ_t · L_i / (1 · T) is the row's token sum, so where this conforms the padding
    and the L_i / T weighting were the only difference."""
    def variant(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
        total = logp.new_zeros(())
        for i in range(logp.shape[0]):
            keep = mask[i].bool()
            if bool(keep.any()):
                row = (lambda x: None if x is None else x[i][keep][None])     # noqa: E731
                total = total + adapter(row(logp), row(old_logp), advantages[i:i + 1],
                                        mask[i][keep][None], row(ref_logp))
        return total / logp.shape[0]
    return variant


_LUSPO_WHAT = (
    "loss_type 'luspo' aggregates (per_token_loss * attention_mask.sum(1, keepdim=True)).sum() "
    "/ (B · per_token_loss.shape[1]) with no elementwise mask (grpo_loss.py:243-245, commented "
    "'Match TRL exactly'): that is TRL's form before huggingface/trl#6654, which TRL replaced by "
    "(per_token_loss * mask).sum(-1).mean(). Whenever the per-token loss is [B, T] (token-level "
    "importance sampling, Liger's default; or beta > 0; or a per-token vLLM ratio), each "
    "sequence is weighted by L_i² / T instead of L_i, and the losses of padded positions "
    "(computed from the model's hidden states there) enter the sum and the gradient. At "
    "sequence level with beta = 0 the loss is [B, 1] and the two forms agree; every row "
    "called on its valid tokens alone conforms")
_LUSPO = tuple(Known(check, "defect", _LUSPO_WHAT, variant=dict(adapt=_rows_unpadded))
               for check in ("value", "grad", "mask", "microbatch"))


def _k3_rounded_once(adapter):
    """The loss with its k3 term evaluated in float64 and rounded once to the loss's float32:
    where this passes what the row failed, the difference was the rounding of
    exp(x) − x − 1 in float32, not the formula."""
    def variant(*args, **kwargs):
        g = adapter.loss_globals
        coded = g["k3_loss_fn"]

        def k3(log_p, log_q):
            x = (log_p - log_q).double()
            return (torch.expm1(x) - x).to(log_p.dtype)
        g["k3_loss_fn"] = k3
        try:
            return adapter(*args, **kwargs)
        finally:
            g["k3_loss_fn"] = coded
    return variant


_K3_WHAT = (
    "k3_loss_fn (grpo_loss.py:10) computes exp(x) − x − 1 with x = log π_ref − log π in "
    "float32, the loss's precision: where π_ref ≈ π (|x| ~ 0.04) the subtraction cancels "
    "and the KL term carries a relative error of about u / x² ≈ 1e-4 (u = 2^-24), beyond "
    "the float32 row's 1.5e-5. It "
    "shows only where that term dominates the loss (a ratio near e^20 multiplies it under "
    "use_bias_correction_kl); evaluated as expm1(x) − x it conforms. TRL's k3 is the same "
    "formula, so float32 TRL training shares it")
_K3 = tuple(Known(check, "precision", _K3_WHAT, variant=dict(adapt=_k3_rounded_once))
            for check in ("value", "grad"))
_PADDING = Known(
    "garbage", "robustness",
    "the loss masks by multiplying (per_token_loss * attention_mask, grpo_loss.py:224-245), so "
    "a NaN old or reference log-prob at padding, or one whose exp overflows, gives NaN · 0 = "
    "NaN and the whole loss is NaN. Valid positions are exact; it bites only when padding "
    "holds such values")
_SETUP = ("the log-probs fed as hidden states [0, c], c = log(expm1(−log p)), through an "
          "identity lm_head over two tokens, token 0 selected, temperature 1 (the module's own "
          "log-softmax returns log p; autograd carries its gradient back by the chain rule)",
          "compiled=False (the same loss function, not torch.compile'd), one process",
          "chunk_size 64 (the whole batch in one chunk) unless the row says otherwise: the "
          "dapo rows judge the chunking",
          "advantages one per sequence ([B]), as the module takes them: cases with per-token "
          "advantages are outside its domain")
_GLOBAL = ("num_items_in_batch = the whole batch's token count",)
_PARAMS = ("_input", "lin_weight", "selected_token_ids", "attention_mask", "advantages",
           "ref_per_token_logps", "old_per_token_logps", "num_items_in_batch")
# every value and gradient is computed in float32 (fused_linear_ppo.py), so each row is judged
# at the float32 row of the tolerance table; the card says so
_F32 = dict(precision="float32", domain=("per_sequence_advantages",))
_MEAN = dict(_F32, accumulation="mean")
_PPO = dict(loss="ppo", beta=0.0, clip_low=0.2, clip_high=0.2)

ROWS = (
    Row(ROW, "policy_objective", _loss("dapo", chunk_size=1), label="dapo",
        choices=_SETUP + _GLOBAL + ("chunk_size 1 (its default): one chunk per sequence",),
        conventions=_PPO, audit=_F32, params=_PARAMS),
    Row(ROW, "policy_objective", _loss("dapo", chunk_size=2), label="dapo, chunk_size 2",
        choices=_SETUP + _GLOBAL + ("chunk_size 2: the batch split into chunks of two "
                                    "sequences, each chunk's loss and gradients summed",),
        conventions=_PPO, audit=_F32, params=_PARAMS),
    Row(ROW, "policy_objective", _loss("dapo", beta=0.04), label="dapo, β = 0.04",
        choices=_SETUP + _GLOBAL + ("beta = 0.04 (its default), use_ref_model, "
                                    "ref_per_token_logps given: the k3 term added to the "
                                    "per-token loss", "use_bias_correction_kl = False (its "
                                                      "default)"),
        conventions=dict(_PPO, beta=0.04, kl_weight=None), audit=_F32, params=_PARAMS,
        known=_K3),
    Row(ROW, "policy_objective", _loss("dapo", beta=0.04, use_bias_correction_kl=True),
        label="dapo, β = 0.04, bias-corrected KL",
        choices=_SETUP + _GLOBAL + ("beta = 0.04, use_bias_correction_kl = True: the k3 term "
                                    "times the ratio, attached",),
        conventions=dict(_PPO, beta=0.04, kl_weight="ratio"), audit=_F32, params=_PARAMS,
        known=_K3),
    Row(ROW, "policy_objective", _loss("dapo", epsilon_high=0.28), label="dapo, ε 0.2/0.28",
        choices=_SETUP + _GLOBAL + ("epsilon_low 0.2, epsilon_high 0.28: the bounds apart, so "
                                    "a swap shows",),
        conventions=dict(_PPO, clip_high=0.28), audit=_F32, params=_PARAMS),
    Row(ROW, "policy_objective", _loss("grpo"), label="grpo", choices=_SETUP,
        conventions=dict(_PPO, agg="seq-mean-token-mean", empty_rows="include"), audit=_MEAN,
        params=_PARAMS),
    Row(ROW, "policy_objective", _loss("bnpo"), label="bnpo", choices=_SETUP,
        conventions=dict(_PPO, agg="token-mean"), audit=_MEAN, params=_PARAMS,
        known=(_LOCAL,)),
    Row(ROW, "policy_objective", _loss("dr_grpo"), label="dr_grpo",
        choices=_SETUP + (f"max_completion_length = {MAX_LEN:g}",),
        conventions=dict(_PPO, agg="seq-mean-token-sum", norm=MAX_LEN, empty_rows="include"),
        audit=_MEAN, params=_PARAMS),
    Row(ROW, "policy_objective", _loss("luspo"), label="luspo", choices=_SETUP + (
        "importance_sampling_level 'token' (its default)",),
        conventions=dict(_PPO, agg="seq-mean-token-sum", empty_rows="include"), audit=_MEAN,
        params=_PARAMS, known=_LUSPO),
    Row(ROW, "policy_objective", _loss("cispo", epsilon_high=5.0), label="cispo",
        choices=_SETUP + _GLOBAL + ("epsilon_high = 5.0 (the cap, as TRL documents CISPO)",),
        conventions=dict(loss="cispo", beta=0.0), audit=_F32, params=_PARAMS),
    Row(ROW, "policy_objective", _loss("grpo", level="sequence", epsilon_low=3e-4,
                                       epsilon_high=4e-4), label="gspo",
        choices=_SETUP + ("importance_sampling_level 'sequence', loss_type 'grpo', epsilon "
                          "3e-4 / 4e-4 (GSPO's)",),
        conventions=dict(loss="gspo", beta=0.0), audit=_MEAN, params=_PARAMS),
    Row(ROW, "policy_objective", _loss("sapo"), label="sapo",
        choices=_SETUP + ("sapo_temperature_pos 1.0, sapo_temperature_neg 1.05 (its "
                          "defaults)",),
        conventions=dict(loss="sapo", beta=0.0, agg="seq-mean-token-mean",
                         empty_rows="include"), audit=_MEAN, params=_PARAMS),
    Row(ROW, "policy_objective", _loss("vespo"), label="vespo",
        choices=_SETUP + _GLOBAL + ("vespo_k_pos 2.0, vespo_lambda_pos 3.0, vespo_k_neg 3.0, "
                                    "vespo_lambda_neg 2.0 (its defaults); no vllm_is_ratio",),
        conventions=dict(loss="vespo", beta=0.0), audit=_F32, params=_PARAMS),
)

# every row masks by multiplying: the garbage check's notes carry _PADDING's explanation
ROWS = tuple(dataclasses.replace(r, known=r.known + (_PADDING,)) for r in ROWS)

TRAINER = Trainer(
    name="liger", package="liger_kernel", dist="liger-kernel", profile="trl", pinned="0.8.5",
    modules=(GRPO,), rows=ROWS,
    inventory=((GRPO, r"LigerFusedLinearGRPOLoss\.forward|"
                      r"LigerFusedLinearGRPOFunction\.(ppo_loss_fn|forward)"),),
    not_run=(("LigerFusedLinearGRPOFunction.ppo_loss_fn",
              "reached through LigerFusedLinearGRPOLoss.forward, which every row calls"),
             ("LigerFusedLinearGRPOFunction.forward",
              "reached through LigerFusedLinearGRPOLoss.forward, which every row calls")),
    runs=("loss types dapo, grpo, bnpo, dr_grpo, luspo, cispo, sapo, vespo at token level; "
          "GSPO (grpo at sequence level)", "clip symmetric (0.2/0.2) and clip-higher "
          "(0.2/0.28)", "β 0 and 0.04 (the k3 term against ref_per_token_logps), "
          "use_bias_correction_kl off and on", "chunk_size 1, 2 and 64 (one chunk)",
          "value and gradient through the fused linear layer, in its float32"),
    does_not_run=("delta (two-sided clipping)", "vllm_is_ratio", "ref_input (the reference "
                  "log-probs computed from reference hidden states)", "temperature ≠ 1",
                  "torch.compile (compiled=True, its default)", "several processes",
                  "sapo and vespo at sequence level (the module refuses them)",
                  "the metrics it returns (kl_mean, clip_ratio)"),
    notes=("TRL 1.16.0 does not route its GRPO loss through this module (its use_liger_kernel "
           "applies Liger's layer kernels only): the card judges Liger's loss against the "
           "references, under TRL's profile, whose loss types it implements",
           "judged at float32 tolerance: the module computes every log-prob, loss and gradient "
           "in float32 whatever the inputs' dtype (fused_linear_ppo.py)"),
)
