"""TorchRL's report card: the LLM losses of torchrl/objectives/llm/grpo.py (`GRPOLoss`, `DAPO`,
`CISPOLoss`).

Facts read in torchrl 0.14.1:
- a loss is an `nn.Module` called on a TensorDict: the current log-probs come from the actor's
  distribution (`actor_network.get_dist(td).log_prob(tokens)`), the sampling policy's from
  `("log_probs", "full")`, the advantage from `"advantage"` as [B, T, 1] (one value per token);
  the valid tokens are the distribution's mask, and a non-finite sampled log-prob is dropped too;
- the ratio's log is clamped to [log(1 − ε_low), log(1 + ε_high)] (`_clip_bounds`); the policy
  objective is PPO's min (`GRPOLoss._compute_policy_objective`) or CISPO's clipped ratio
  (`CISPOLoss._compute_policy_objective`); `DAPO` is `GRPOLoss` under another name;
- `aggregation` "token_mean" divides by the call's valid-token count, "prompt_mean" averages
  each sample's token mean over the call's samples (an empty one counts 0), "none" returns the
  per-token loss;
- `kl_to_ref_coeff` adds a separate output `loss_kl_to_ref`: coeff · the k3 estimate of
  KL(π ‖ π_ref), whose per-token values are averaged by `.mean()` (`_kl_to_ref`); the caller sums
  the `loss_*` outputs.

The card's adapter is a stand-in actor whose distribution returns the log-probs under test and
carries the mask, so autograd runs through TorchRL's own loss code from the log-probs on.
"""
import inspect

import torch

from .card import Known, Row, Trainer, owner_class, per_sequence

GRPO = "torchrl.objectives.llm.grpo"


class _Distribution:
    """What the loss reads of the actor's distribution: log_prob(tokens) and its mask."""

    def __init__(self, logp, mask):
        self._logp, self.mask = logp, mask

    def log_prob(self, tokens):
        return self._logp


class _Actor:
    """An actor with only `get_dist`: the loss then takes the generic distribution path."""

    def __init__(self, logp, mask):
        self._distribution = _Distribution(logp, mask)

    def get_dist(self, tensordict, logits_key=None):
        return self._distribution


def _batch(logp, old_logp, advantages, mask, ref_logp=None):
    from tensordict import TensorDict
    B, T = logp.shape
    data = {("tokens", "full"): torch.zeros((B, T), dtype=torch.long),
            ("log_probs", "full"): old_logp,
            "advantage": per_sequence(advantages, logp).unsqueeze(-1)}
    if ref_logp is not None:
        data[("next", "ref_log_probs", "full")] = ref_logp
    return TensorDict(data, batch_size=[B])


def _loss(cls_name=None, kl=None, **settings):
    """The loss class (the function's own, or `cls_name` of its module) built with `settings`
    around the stand-in actor, called on one batch; its loss_objective, plus loss_kl_to_ref
    when `kl` (the coefficient) is given."""
    def make(fn):
        cls = inspect.unwrap(fn).__globals__[cls_name] if cls_name else owner_class(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp=None):
            loss = cls(_Actor(logp, mask.bool()), entropy_bonus=False,
                       masking_strategy="generic", kl_to_ref_coeff=kl, **settings)
            out = loss(_batch(logp, old_logp, advantages, mask,
                              ref_logp if kl is not None else None))
            loss = out.loss_objective + (out.loss_kl_to_ref if kl is not None else 0.0)
            return loss.reshape(()) if loss.shape == (1,) else loss   # prompt_mean's (1,)
        return adapter
    return make


_SETUP = ("a stand-in actor whose get_dist returns the log-probs under test with the mask as its "
          "mask; masking_strategy 'generic'; old log-probs at ('log_probs', 'full'); advantages "
          "at 'advantage' as [B, T, 1]; the loss_objective output",
          "entropy_bonus False (the entropy term needs the model's distribution)",
          "judged on whole batches: the aggregation is the call's, and TorchRL's training loop "
          "calls the loss on each mini-batch")
_WHOLE = dict(accumulation="none")
_PROMPT_MEAN_PADDING = Known(
    "garbage", "robustness",
    "aggregation 'prompt_mean' masks by multiplying ((value * mask_exp).sum, grpo.py:807), so a "
    "NaN or infinite advantage at padding gives NaN · 0 = NaN. The log-probs at padding never "
    "reach it (_log_weight replaces them by 0 with torch.where, grpo.py:961-967) and the "
    "advantages are padded with 0, so it bites only when padding holds such an advantage")
_PPO = dict(loss="ppo", beta=0.0, agg="token-mean", clip_low=0.2, clip_high=0.2, clip_c=None,
            log_ratio_clamp=None)
_PARAMS = ("tensordict",)

ROWS = (
    Row(f"{GRPO}:GRPOLoss.forward", "policy_objective", _loss(), label="token_mean",
        choices=_SETUP + ("clip_epsilon 0.2, aggregation 'token_mean' (its defaults)",),
        conventions=_PPO, audit=_WHOLE, params=_PARAMS),
    Row(f"{GRPO}:GRPOLoss.forward", "policy_objective", _loss(clip_epsilon=(0.2, 0.28)),
        label="token_mean, ε 0.2/0.28",
        choices=_SETUP + ("clip_epsilon (0.2, 0.28): the bounds apart, so a swap shows",),
        conventions=dict(_PPO, clip_high=0.28), audit=_WHOLE, params=_PARAMS),
    Row(f"{GRPO}:GRPOLoss.forward", "policy_objective", _loss(aggregation="prompt_mean"),
        label="prompt_mean",
        choices=_SETUP + ("aggregation 'prompt_mean': each sample's token mean, averaged over "
                          "the call's samples", "its output of shape (1,) read as a scalar "
                          "(the mean over dim 0 of [B, 1])"),
        conventions=dict(_PPO, agg="seq-mean-token-mean", empty_rows="include"), audit=_WHOLE,
        params=_PARAMS, known=(_PROMPT_MEAN_PADDING,)),
    Row(f"{GRPO}:GRPOLoss.forward", "policy_objective", _loss("DAPO",
                                                              clip_epsilon=(0.2, 0.28)),
        label="DAPO", choices=_SETUP + ("the DAPO class, clip_epsilon (0.2, 0.28) (DAPO's "
                                        "recommended bounds)",),
        conventions=dict(_PPO, clip_high=0.28), audit=_WHOLE, params=_PARAMS),
    Row(f"{GRPO}:CISPOLoss._compute_policy_objective", "policy_objective",
        _loss(clip_epsilon=(0.2, 0.28)), label="cispo",
        choices=_SETUP + ("the CISPOLoss class, clip_epsilon (0.2, 0.28), token_mean",),
        conventions=dict(loss="cispo", beta=0.0, agg="token-mean", bound="relative",
                         clip_low=0.2, clip_high=0.28),
        audit=_WHOLE, params=("log_weight", "advantage")),
    Row(f"{GRPO}:GRPOLoss._kl_to_ref", "policy_objective", _loss(kl=0.1),
        label="token_mean, kl_to_ref_coeff 0.1",
        choices=_SETUP + ("kl_to_ref_coeff 0.1, the reference log-probs at ('next', "
                          "'ref_log_probs', 'full'); loss_objective + loss_kl_to_ref, as the "
                          "caller sums the loss_* outputs",),
        conventions=dict(_PPO, beta=0.1, kl_kind="k3", kl_clamp=None, kl_weight=None),
        audit=_WHOLE,
        params=("tensordict", "key", "mask")),
)

TRAINER = Trainer(
    name="torchrl", package="torchrl", dist="torchrl", profile="trl", pinned="0.14.1",
    requires=("tensordict==0.14.3", "pyvers==0.2.3", "hoptorch==0.1.4", "cloudpickle==3.1.3",
              "packaging==26.4"),
    modules=(GRPO,), rows=ROWS,
    inventory=((GRPO, r"GRPOLoss\.(forward|_compute_policy_objective|_aggregate_loss_value|"
                      r"_kl_to_ref|_log_weight)|CISPOLoss\._compute_policy_objective|"
                      r"MCAdvantage\._trajectory_advantage"),),
    not_run=(("GRPOLoss._compute_policy_objective",
              "reached through GRPOLoss.forward, which the PPO rows call"),
             ("GRPOLoss._aggregate_loss_value",
              "reached through GRPOLoss.forward (token_mean and prompt_mean rows)"),
             ("GRPOLoss._log_weight", "reached through GRPOLoss.forward, which every row calls"),
             ("MCAdvantage._trajectory_advantage",
              "divides by the group's Bessel std clamped below at 1e-6 (std().clamp_min(1e-6)): "
              "no reference takes a clamped std")),
    runs=("GRPOLoss (clip 0.2/0.2 and 0.2/0.28) under token_mean and prompt_mean", "DAPO",
          "CISPOLoss", "kl_to_ref_coeff 0.1 (loss_kl_to_ref added to loss_objective)"),
    does_not_run=("the entropy bonus (loss_entropy)", "kl_to_inference_coeff",
                  "kl_mask_threshold (a mask on ½(log π − log π_old)², which no reference takes)",
                  "aggregation 'none'", "masking strategies 'sft' and 'rlhf' (the model's own "
                  "masks; the rows give the mask directly)", "the MC advantage transform"),
    notes=("CISPOLoss._compute_policy_objective returns −clip(r, 1 − ε_low, 1 + ε_high) · A with "
           "the clipped ratio attached (grpo.py:1013-1016): its gradient is r·A·∇log π inside "
           "the band and 0 outside, which is PPO's clipped surrogate without the min. CISPO "
           "(MiniMax-M1, arXiv:2506.13585, the paper its docstring cites) is −sg(clip(r))·A·log "
           "π, whose gradient clip(r)·A·∇log π keeps every token, those outside the band "
           "included: that is what CISPO is for. The card's counterexample is r = e^0.7 above "
           "1.28 with A = −0.2, where TorchRL's gradient is 0 and CISPO's 0.256. A defect to "
           "file upstream; the card exits 1 for it",
           "GRPOLoss._kl_to_ref averages the per-token k3 values with .mean() over the whole "
           "[B, T] tensor (grpo.py:915), after setting the masked positions to 0: it divides by "
           "B·T, not by the valid tokens. The KL term is then scaled by the fraction of valid "
           "positions, which changes with the padding of each batch; and under the default "
           "masking_strategy 'sft' the ('…', 'full') tensors span prompt and response, so the "
           "prompt's positions dilute it too. The policy term beside it is a masked token mean. "
           "The card's counterexample is one sequence of one valid token padded to two, whose "
           "KL term is halved. A defect to file upstream; the card exits 1 for it",
           "judged under the TRL profile with every convention the rows need set explicitly: "
           "TorchRL's GRPOLoss is a PPO-clip loss with no dual clip and no log-ratio clamp",),
)
