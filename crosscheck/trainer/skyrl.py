"""SkyRL's report card: skyrl/backends/skyrl_train/utils/ppo_utils.py.

Facts read in SkyRL 0.4.0 (the package index's `skyrl`, Requires-Python ≥ 3.12; its math runs
on 3.11, so CI installs it with `--no-deps --ignore-requires-python`):
- a verl-style registry: `@register_policy_loss` / `@register_advantage_estimator` replace each
  function by a `functools.wraps` wrapper (the card calls the wrapper, as the registry does);
  the module imports ray at the top, which the loader stands in;
- the losses return a masked **sum** (`reduce_loss`): the trainer has already divided the
  advantages by the mini-batch's counts (`apply_loss_reduction_to_advantages_minibatch`,
  called from `RayPPOTrainer._normalize_advantages` on the whole mini-batch before it is
  split), so summing the micro-batches' losses gives the `loss_reduction` it names; the
  worker sums micro-batch gradients (no division by their number);
- the losses are positively homogeneous in the advantages they are given (PPO's and GSPO's
  min and dual clip, CISPO's detached weight, SAPO's gate chosen by the sign of A), so the
  scaled sum equals the aggregation of the unscaled loss.
"""
import inspect
import sys

import torch

from .card import (DoesNotFit, Known, NotInVersion, Row, StandInSelf, Trainer, per_sequence,
                   per_token, source_of)
from .verl import _OUTCOME, _outcome, _whiten

PPO = "skyrl.backends.skyrl_train.utils.ppo_utils"


def _config(fn, **fields):
    """The AlgorithmConfig the function's module uses, with its defaults and `fields` set
    (nested sections as dicts of their own fields)."""
    cls = inspect.unwrap(fn).__globals__["AlgorithmConfig"]
    cfg = cls()
    for k, v in fields.items():
        if isinstance(v, dict):
            for kk, vv in v.items():
                setattr(getattr(cfg, k), kk, vv)
        else:
            setattr(cfg, k, v)
    return cfg


def _scaled(reduce_fn, advantages, mask, reduction, n_tokens_global, max_seq_len=None):
    """The advantages as the trainer hands them to the loss: scaled by SkyRL's own
    apply_loss_reduction_to_advantages_minibatch over the batch given and, for one
    micro-batch of a larger batch under token_mean, brought to that batch's token count (the
    trainer scales the whole mini-batch before splitting it)."""
    m = mask.to(advantages.dtype)
    B, T = mask.shape
    scaled = reduce_fn(advantages, m, reduction, B, max_seq_len or T)
    if reduction == "token_mean" and n_tokens_global is not None:
        # SkyRL's A / (this batch's tokens), brought to A / (the whole batch's tokens)
        scaled = scaled * (max(float(m.sum()), 1.0) / max(float(n_tokens_global), 1.0))
    return scaled


def _policy(reduction="token_mean", **fields):
    def make(fn):
        reduce_fn = fn.__globals__["apply_loss_reduction_to_advantages_minibatch"]

        def adapter(logp, old_logp, advantages, mask, n_tokens_global=None):
            a = _scaled(reduce_fn, per_sequence(advantages, logp), mask, reduction,
                        n_tokens_global)
            loss, _ = fn(logp, old_logp, a, _config(fn, loss_reduction=reduction, **fields),
                         loss_mask=mask.to(logp.dtype))
            return loss

        def whole(logp, old_logp, advantages, mask):     # sequence_mean: see _aggregate
            return adapter(logp, old_logp, advantages, mask)
        return adapter if reduction == "token_mean" else whole
    return make


def _aggregate(reduction, max_seq_len=None):
    """reduce_loss of a per-token loss whose tokens carry SkyRL's scale factors: the factor of
    each token is apply_loss_reduction_to_advantages_minibatch applied to ones, which the
    losses carry through their advantages. token_mean takes the batch's token count
    for a micro-batch; the per-sequence modes divide by the mini-batch's number of rows, empty
    ones included, which no global count the audit passes gives, so those rows are judged on
    the whole batch (accumulation 'none': the trainer scales before it splits)."""
    def make(fn):
        reduce_fn = fn.__globals__["apply_loss_reduction_to_advantages_minibatch"]

        def adapter(loss, mask, n_tokens_global=None):
            factor = _scaled(reduce_fn, torch.ones_like(loss), mask, reduction,
                             n_tokens_global, max_seq_len)
            return fn(loss * factor, mask.to(loss.dtype))

        def whole(loss, mask):
            return adapter(loss, mask)
        return adapter if reduction == "token_mean" else whole
    return make


def _prompt_mean(fn):
    """reduce_loss under prompt_mean: the rows put in prompt order (a sum over tokens does not
    depend on it), each prompt's rows one (start, end) slice of prompt_boundaries, as SkyRL's
    trainer builds them; the factors are apply_loss_reduction_to_advantages_minibatch applied
    to ones."""
    reduce_fn = fn.__globals__["apply_loss_reduction_to_advantages_minibatch"]

    def adapter(loss, mask, group_size=None, group_ids=None):
        B, T = mask.shape
        ids = torch.arange(B) // group_size if group_size is not None else \
            torch.as_tensor(group_ids).reshape(-1)
        order = torch.argsort(ids, stable=True)
        loss, mask, ids = loss[order], mask[order], ids[order]
        starts = [0] + [b for b in range(1, B) if ids[b] != ids[b - 1]]
        bounds = list(zip(starts, starts[1:] + [B]))
        m = mask.to(loss.dtype)
        factor = reduce_fn(torch.ones_like(loss), m, "prompt_mean", B, T,
                           prompt_boundaries=bounds)
        return fn(loss * factor, m)
    return adapter


def _fits_scaling(fn):
    """The losses and reduce_loss rows read apply_loss_reduction_to_advantages_minibatch (0.2
    on); 0.1 reduces inside the loss, a form the rows have no adapter for."""
    if "apply_loss_reduction_to_advantages_minibatch" not in fn.__globals__:
        raise DoesNotFit("this release has no apply_loss_reduction_to_advantages_minibatch: "
                         "its losses reduce themselves (no adapter for that form yet)")
    return {}


def _fits_prompts(fn):
    """prompt_mean came with prompt_boundaries (0.4.0)."""
    _fits_scaling(fn)
    reduce_fn = fn.__globals__["apply_loss_reduction_to_advantages_minibatch"]
    if "prompt_boundaries" not in inspect.signature(reduce_fn).parameters:
        raise NotInVersion("apply_loss_reduction_to_advantages_minibatch has no "
                           "prompt_boundaries (no prompt_mean reduction) in this release")
    return {}


def _fits_kl(fn):
    """The KL rows judge a differentiated term; a release that computes the estimate under
    torch.no_grad uses it in the reward only."""
    if "@torch.no_grad" in source_of(fn):
        raise DoesNotFit("compute_approx_kl runs under torch.no_grad in this release (a KL "
                         "reward, not a loss term): the row judges its gradient")
    return {}


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return fn(logp, ref_logp, loss_mask=mask.to(logp.dtype), kl_estimator_type=kind)
        return adapter
    return make


def _returns(gamma):
    def make(fn):
        def adapter(rewards, mask):
            _, returns = fn(token_level_rewards=rewards, response_mask=mask.to(rewards.dtype),
                            gamma=gamma)
            return returns
        return adapter
    return make


def _gae(gamma, lambd):
    def make(fn):
        def adapter(rewards, values, mask):
            _, returns = fn(token_level_rewards=rewards, values=values,
                            response_mask=mask.to(rewards.dtype), gamma=gamma, lambd=lambd)
            return returns - values, returns
        return adapter
    return make


def _value(fn):
    def adapter(values, old_values, returns, mask):
        cfg = _config(fn, value_clip=0.2)
        one = values.new_ones((1, 1))
        return per_token(lambda v, o, r: fn(v, o, r, cfg, loss_mask=one)[0], mask, values,
                         old_values, returns)
    return adapter


def _holes_filled(adapter):
    """The REINFORCE++ returns with each row's masked steps before its last valid token given
    as valid steps of reward 0 (the running return then runs through them, as in verl 0.9),
    read at the valid tokens: where SkyRL's reset at masked tokens is the only difference,
    this equals the reference."""
    def variant(rewards, mask):
        m = mask.bool()
        position = torch.arange(m.shape[-1])
        last = torch.where(m, position, -1).max(dim=-1).values
        filled = (position <= last[:, None]).to(mask.dtype)
        out = adapter(torch.where(m, rewards, rewards.new_zeros(())), filled)
        return torch.where(m, out, out.new_zeros(()))
    return variant


_RESET = Known(
    "value", "robustness",
    "compute_reinforce_plus_plus_outcome_advantage resets the running return at every masked "
    "token (running_return = running_return * response_mask[:, t], commented 'reset after "
    "EOS'), so a mask with a hole would stop an outcome reward at the hole. SkyRL passes it "
    "response_mask (trainer.py compute_advantages_and_returns; the all-ones mask under "
    "step-wise trajectories), which convert_prompts_responses_to_batch_tensors builds "
    "left-padded with no hole (col_resp >= resp_pad); the holes of a multi-turn rollout's "
    "observation tokens are in loss_mask, which the estimator is not given. On the masks SkyRL "
    "builds the returns are exact (the rows above)",
    variant=dict(adapt=_holes_filled))

# the masks SkyRL's estimators are given: response_mask, left-padded (right-aligned responses)
_LEFT = dict(domain=("left_padded",))
_RESPONSE_MASK = ("response_mask as SkyRL builds it (convert_prompts_responses_to_batch_tensors:"
                  " right-aligned responses, so each row's valid tokens are one block at its "
                  "end): cases moved into that layout",)
GAMMA, LAMBD = 0.99, 0.95

_PPO = dict(eps_clip_low=0.2, eps_clip_high=0.2, clip_ratio_c=3.0)
_LOSS = ("SkyRL's AlgorithmConfig with eps_clip 0.2/0.2 and clip_ratio_c 3.0 set (its defaults)",
         "advantages one per sequence broadcast over the response, scaled by "
         "apply_loss_reduction_to_advantages_minibatch as the trainer does before the loss (a "
         "micro-batch: by the whole batch's counts, which the trainer's mini-batch holds)",
         "the loss: reduce_loss's masked sum of the scaled per-token loss")
_LOSS_PARAMS = ("log_probs", "old_log_probs", "advantages", "config", "loss_mask")
_LOSS_SEQ = (_LOSS[0], "loss_reduction 'sequence_mean', which SkyRL recommends for this loss "
             "(it warns otherwise): advantages scaled by "
             "apply_loss_reduction_to_advantages_minibatch, A / (B · the row's tokens), judged on "
             "whole batches (the trainer divides by the mini-batch's rows, empty ones included, "
             "before it splits it)", _LOSS[2])
_AGG = ("the per-token loss times the factors apply_loss_reduction_to_advantages_minibatch "
        "gives unit advantages (the losses are linear in their advantages), summed by "
        "reduce_loss",)
MAX_SEQ_LEN = 8

ROWS = (
    Row(f"{PPO}:compute_grpo_outcome_advantage", "group_advantages",
        lambda fn: _outcome(fn, epsilon=1e-6), label="GRPO", choices=_OUTCOME,
        params=("token_level_rewards", "response_mask", "index", "epsilon")),
    Row(f"{PPO}:compute_grpo_outcome_advantage", "group_advantages",
        lambda fn: _outcome(fn, epsilon=1e-6, grpo_norm_by_std=False), label="Dr. GRPO",
        choices=_OUTCOME + ("grpo_norm_by_std=False",), conventions=dict(scale="none"),
        params=("token_level_rewards", "response_mask", "index", "grpo_norm_by_std")),
    Row(f"{PPO}:compute_rloo_outcome_advantage", "group_advantages", _outcome,
        choices=_OUTCOME, conventions=dict(baseline="leave_one_out", scale="none",
                                           singleton="zero"),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{PPO}:compute_maxrl_advantage", "group_advantages", _outcome, label="MaxRL",
        choices=_OUTCOME + ("epsilon 1e-6 (its default)",),
        conventions=dict(scale="mean", baseline="mean", eps=1e-6, singleton="keep"),
        audit=dict(domain=("pass_rates",)),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{PPO}:compute_reinforce_plus_plus_outcome_advantage", "discounted_returns",
        _returns(1.0),
        choices=("the returns output (its advantages are these returns whitened by "
                 "masked_whiten, whose row is below)", "gamma = 1.0 (AlgorithmConfig's)")
        + _RESPONSE_MASK, conventions=dict(gamma=1.0), audit=_LEFT,
        params=("token_level_rewards", "response_mask", "gamma")),
    Row(f"{PPO}:compute_reinforce_plus_plus_outcome_advantage", "discounted_returns",
        _returns(GAMMA), label=f"γ {GAMMA}",
        choices=("the returns output", f"gamma = {GAMMA}: a dropped or misplaced discount "
                 "shows (at 1 it changes nothing)") + _RESPONSE_MASK,
        conventions=dict(gamma=GAMMA), audit=_LEFT,
        params=("token_level_rewards", "response_mask", "gamma")),
    Row(f"{PPO}:compute_reinforce_plus_plus_outcome_advantage", "discounted_returns",
        _returns(1.0), label="a mask with holes",
        choices=("the returns output", "gamma = 1.0", "masks with holes and trailing padding, "
                 "which SkyRL never passes this estimator: a robustness check"),
        conventions=dict(gamma=1.0),
        params=("token_level_rewards", "response_mask", "gamma"), known=(_RESET,)),
) + tuple(
    Row(f"{PPO}:compute_gae_advantage_return", "gae", _gae(gamma, lambd),
        label=f"γ {gamma}, λ {lambd}",
        choices=(f"gamma = {gamma}, lambd = {lambd} passed as the trainer passes its config's",
                 "advantages read as returns − values: the function whitens its advantages "
                 "with masked_whiten (its own row) and defines returns = advantages + values")
        + _RESPONSE_MASK + ("its recursion reads no mask: on left-padded rows no padding "
                            "follows a valid token, so none enters a valid one",),
        conventions=dict(gamma=gamma, lam=lambd), audit=dict(_LEFT, profile=None),
        params=("token_level_rewards", "values", "response_mask", "gamma", "lambd"))
    for gamma, lambd in ((1.0, 1.0), (GAMMA, LAMBD))
) + (
    Row(f"{PPO}:masked_whiten", "whiten", _whiten, choices=("mask as a float tensor",),
        params=("values", "mask")),
    Row(f"{PPO}:ppo_critic_loss", "value_loss", _value, audit=dict(padding_checks=False),
        choices=("value_clip = 0.2 (AlgorithmConfig's)", "evaluated one valid token at a time "
                 "(a [1, 1] batch, where its per-sequence mean is the identity), the losses "
                 "assembled into [B, T]"),
        params=("values", "old_values", "returns", "config", "loss_mask")),
    Row(f"{PPO}:ppo_policy_loss", "policy_objective", _policy(**_PPO), label="regular",
        choices=_LOSS + ("policy_loss_type 'regular'",),
        conventions=dict(loss="ppo", beta=0.0), params=_LOSS_PARAMS, fits=_fits_scaling),
    Row(f"{PPO}:ppo_policy_loss", "policy_objective", _policy(**dict(_PPO, eps_clip_high=0.28)),
        label="regular, 0.2/0.28",
        choices=_LOSS + ("eps_clip_low 0.2, eps_clip_high 0.28: the bounds apart, so a swap "
                         "shows",),
        conventions=dict(loss="ppo", beta=0.0, clip_low=0.2, clip_high=0.28),
        params=_LOSS_PARAMS, fits=_fits_scaling),
    Row(f"{PPO}:ppo_policy_loss", "policy_objective",
        _policy(**dict(_PPO, policy_loss_type="dual_clip")),
        label="dual_clip", choices=_LOSS + ("policy_loss_type 'dual_clip', clip_ratio_c 3.0",),
        conventions=dict(loss="ppo", beta=0.0, clip_c=3.0), params=_LOSS_PARAMS,
        fits=_fits_scaling),
    Row(f"{PPO}:gspo_policy_loss", "policy_objective", _policy("sequence_mean", **_PPO),
        label="gspo, sequence_mean",
        choices=_LOSS_SEQ + ("GSPO's own log-weight cap at 10 (clamp(max=10))",),
        conventions=dict(loss="gspo"), audit=dict(accumulation="none"),
        params=_LOSS_PARAMS, fits=_fits_scaling),
    Row(f"{PPO}:sapo_policy_loss", "policy_objective",
        _policy("sequence_mean", sapo=dict(tau_pos=1.0, tau_neg=1.05)),
        label="sapo, sequence_mean",
        choices=_LOSS_SEQ + ("tau_pos 1.0, tau_neg 1.05 (SAPOConfig's defaults), set",),
        conventions=dict(loss="sapo"), audit=dict(accumulation="none"),
        params=_LOSS_PARAMS, fits=_fits_scaling),
    Row(f"{PPO}:compute_policy_loss_cispo", "policy_objective",
        _policy(cispo=dict(cispo_eps_clip_low=1.0, cispo_eps_clip_high=4.0,
                           cispo_anchor="old")),
        label="cispo", choices=_LOSS + ("cispo_eps_clip_low 1.0, cispo_eps_clip_high 4.0, "
                                        "cispo_anchor 'old' (CISPOConfig's defaults in 0.4.0; "
                                        "0.2 and 0.3 default to 0.0 and 5.0), set",),
        conventions=dict(loss="cispo", beta=0.0), params=_LOSS_PARAMS, fits=_fits_scaling),
) + tuple(
    Row(f"{PPO}:reduce_loss", "aggregate", _aggregate(reduction, MAX_SEQ_LEN), label=reduction,
        choices=_AGG + ((f"max_seq_len = {MAX_SEQ_LEN}",) if norm else ()) + (
            () if reduction == "token_mean" else
            ("judged on whole batches: the trainer divides by the mini-batch's rows, empty "
             "ones included, before it splits it",)),
        conventions=dict(mode=mode, **(dict(norm=float(MAX_SEQ_LEN)) if norm else {})),
        audit={} if reduction == "token_mean" else dict(accumulation="none"),
        params=("loss", "loss_mask"), fits=_fits_scaling)
    for reduction, mode, norm in (("token_mean", "token-mean", False),
                                  ("sequence_mean", "seq-mean-token-mean", False),
                                  ("seq_mean_token_sum_norm", "seq-mean-token-sum", True))
) + (
    Row(f"{PPO}:reduce_loss", "aggregate", _prompt_mean, label="prompt_mean",
        choices=_AGG + ("the rows in prompt order, each prompt's rows one (start, end) slice "
                        "of prompt_boundaries, as the trainer passes them",
                        "judged on whole batches: the trainer scales the mini-batch before it "
                        "splits it"),
        conventions=dict(mode="prompt-mean-token-mean", empty_rows="include"),
        audit=dict(accumulation="none"), params=("loss", "loss_mask"), fits=_fits_prompts),
) + tuple(
    Row(f"{PPO}:compute_approx_kl", "kl_penalty", _kl(kind), label=kind,
        choices=("loss_mask passed: the estimate is 0 at padding",),
        conventions=dict(kind=kind, clamp=(20.0, 10.0) if kind == "k3" else None),
        fits=_fits_kl, params=("log_probs", "log_probs_base", "loss_mask", "kl_estimator_type"))
    for kind in ("k1", "abs", "k2", "k3")
)

# ---- the actor's loss on the training path ---------------------------------------------------
# PolicyWorkerBase._forward_backward_micro (workers/worker.py) composes the policy loss (on
# advantages the trainer pre-scaled), the KL loss (compute_approx_kl, a per-sequence token mean
# averaged over the rows, times kl_loss_coef and the micro-batch's weight) and the entropy
# bonus, and hands the sum to strategy.backward: called unbound with a stand-in self whose
# strategy keeps the loss.

WORKER = "skyrl.backends.skyrl_train.workers.worker"
KL_LOSS_COEF = 0.1       # algorithm.kl_loss_coef (default 0.001: a dropped or doubled
# coefficient moves the loss by less than the audit sees)


class _Strategy:
    def __init__(self):
        self.loss = None

    def backward(self, loss, model, optimizer, **kwargs):
        self.loss = loss


class _Model:
    """The policy model: called, it returns the log-probs under test and an output whose
    entropy covers the sequence (0: use_entropy_loss is off, the entropy only logged)."""

    def __init__(self, logp):
        self.logp = logp

    def train(self):
        pass

    def __call__(self, sequences, num_actions, **kwargs):
        return self.logp, {"entropy": self.logp.new_zeros(sequences.shape)}


class _Experience:
    """A micro-batch as the worker reads it (SkyRL's Experience fields); to_device keeps it."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def to_device(self, device):
        pass


def _on_cpu():
    """torch.cuda.current_device, which the worker calls to place the micro-batch, stood in
    by the CPU for the call (one CPU process: the micro-batch stays where it is)."""
    from unittest import mock
    return mock.patch.object(torch.cuda, "current_device", lambda: "cpu")


def _forward_backward(reduction="token_mean"):
    def make(fn):
        losses = sys.modules[PPO]
        reduce_fn = losses.apply_loss_reduction_to_advantages_minibatch
        policy_loss = losses.PolicyLossRegistry.get("regular")

        def adapter(logp, old_logp, advantages, mask, ref_logp):
            B, T = mask.shape
            m = mask.to(logp.dtype)
            a = _scaled(reduce_fn, per_sequence(advantages, logp), mask, reduction, None)
            cfg = StandInSelf(algorithm=_config(
                policy_loss, policy_loss_type="regular", loss_reduction=reduction,
                use_kl_loss=True, kl_loss_coef=KL_LOSS_COEF, kl_estimator_type="k3",
                use_entropy_loss=False))
            strategy = _Strategy()
            me = StandInSelf(cfg=cfg, model=_Model(logp), policy_loss_fn=policy_loss,
                             strategy=strategy, mesh_rank=StandInSelf(dp_size=1),
                             optimizer=None, scheduler=StandInSelf(get_last_lr=lambda: [0.0]))
            experience = _Experience(
                sequences=torch.zeros((B, 1 + T), dtype=torch.long),
                action_log_probs=old_logp, base_action_log_probs=ref_logp, advantages=a,
                num_actions=T, attention_mask=torch.ones((B, 1 + T), dtype=torch.long),
                loss_mask=m, response_mask=m, rollout_logprobs=None, pixel_values=None,
                image_grid_thw=None, rollout_sample_support=None)
            with _on_cpu():
                fn(me, experience, 1.0)         # the whole batch: one micro-batch
            return strategy.loss
        return adapter
    return make


def _kl_by_loss_reduction(adapter):
    """_forward_backward_micro as it would be with its KL term under loss_reduction
    token_mean like its policy term: the trainer's own loss, its per-sequence KL mean (SkyRL's
    compute_approx_kl and masked_mean) taken out and the token mean put in."""
    def variant(logp, old_logp, advantages, mask, ref_logp):
        losses = sys.modules[PPO]
        m = mask.to(logp.dtype)
        kl = losses.compute_approx_kl(logp, ref_logp, loss_mask=m, kl_estimator_type="k3")
        per_row = (kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        return adapter(logp, old_logp, advantages, mask, ref_logp) + \
            KL_LOSS_COEF * ((kl * m).sum() / m.sum().clamp(min=1.0) - per_row.mean())
    return variant


_KL_BY_REDUCTION = dict(adapt=_kl_by_loss_reduction)
_KL_SEQ_MEAN = tuple(Known(
    check, "documented choice",
    "the worker aggregates the KL loss as masked_mean(kl, loss_mask, dim=-1).mean() "
    "(worker.py:1232: a per-sequence token mean averaged over the rows) whatever "
    "loss_reduction says, while the "
    "policy loss follows loss_reduction through the advantages the trainer pre-scales; under "
    "token_mean (the default, with use_kl_loss on by default) a short response's KL tokens "
    "weigh more than a long one's, and the gradient of the sum is not that of one objective "
    "aggregated one way",
    variant=_KL_BY_REDUCTION,
    cite="worker.py, _forward_backward_micro: 'NOTE: The KL and entropy loss terms are not "
         "pre-scaled, so we just average them across microbatches and DP workers.'")
    for check in ("value", "grad"))

_MICRO = ("called unbound with a stand-in self: the model returns the log-probs under test, "
          "strategy.backward keeps the loss it is given (the card's output); dp_size 1; "
          "torch.cuda.current_device stood in by the CPU for the call",
          "cfg.algorithm: SkyRL's AlgorithmConfig with policy_loss_type 'regular', "
          f"use_kl_loss True (its default), kl_estimator_type 'k3' (its default), "
          f"kl_loss_coef {KL_LOSS_COEF} (the default 0.001 hides a dropped or doubled "
          f"coefficient), use_entropy_loss False (its default)",
          "advantages pre-scaled by SkyRL's own apply_loss_reduction_to_advantages_minibatch "
          "over the whole batch, as the trainer does before splitting it",
          "judged on whole batches (one micro-batch, microbatch_weight 1): the trainer "
          "scales the mini-batch's advantages before it splits it and weights each "
          "micro-batch's KL term by its share of the rows, empty ones included, which no "
          "global count the audit passes gives",
          "an Experience of a one-token prompt and the response: action_log_probs = old_logp, "
          "base_action_log_probs = ref_logp, loss_mask = response_mask = the mask, no rollout "
          "log-probs")
_MICRO_PARAMS = ("self", "experience", "microbatch_weight")


ROWS = ROWS + (
    Row(f"{WORKER}:PolicyWorkerBase._forward_backward_micro", "policy_objective",
        _forward_backward("sequence_mean"), label="regular + k3 KL loss, sequence_mean",
        choices=_MICRO + ("loss_reduction 'sequence_mean': the policy term's aggregation is "
                          "then the KL term's",),
        conventions=dict(loss="ppo", agg="seq-mean-token-mean", empty_rows="include",
                         beta=KL_LOSS_COEF, kl_kind="k3", kl_clamp=(20.0, 10.0)),
        audit=dict(accumulation="none"), params=_MICRO_PARAMS),
    Row(f"{WORKER}:PolicyWorkerBase._forward_backward_micro", "policy_objective",
        _forward_backward("token_mean"), label="regular + k3 KL loss, token_mean",
        choices=_MICRO + ("loss_reduction 'token_mean' (its default)",),
        conventions=dict(loss="ppo", agg="token-mean", beta=KL_LOSS_COEF, kl_kind="k3",
                         kl_clamp=(20.0, 10.0)),
        audit=dict(accumulation="none"), known=_KL_SEQ_MEAN, params=_MICRO_PARAMS),
)

TRAINER = Trainer(
    name="skyrl", package="skyrl", dist="skyrl", profile="skyrl", pinned="0.4.0",
    modules=(PPO, WORKER), rows=ROWS,
    inventory=((PPO, r"compute_.*|masked_whiten|ppo_critic_loss|ppo_policy_loss|"
                     r"sapo_policy_loss|gspo_policy_loss|rollout_is_policy_loss|"
                     r"dppo_policy_loss|importance_sampling_loss|cross_entropy_loss|reduce_loss"),
               (WORKER, r"PolicyWorkerBase\._forward_backward_micro")),
    not_run=(("compute_policy_loss_clip_cov",
              "draws the tokens it un-clips with torch.randperm: not a deterministic function "
              "of its inputs"),
             ("compute_policy_loss_kl_cov",
              "a reference exists (kl_cov_loss, verl's KL-Cov row) but no adapter yet: it "
              "returns only reduce_loss's masked sum and takes no per-token weight through "
              "which a card reads each token's loss (verl's row reads them through "
              "rollout_is_weights)"),
             ("dppo_policy_loss",
              "a reference exists (dppo_loss, verl's DPPO rows) but no adapter yet for "
              "DPPOConfig (dppo_type, delta_low, delta_high) and its rollout_logprobs"),
             ("rollout_is_policy_loss",
              "no adapter yet: it requires rollout_logprobs (it asserts them) and applies "
              "apply_off_policy_correction, which no row of this card passes"),
             ("importance_sampling_loss",
              "no row yet: Tinker's unclipped −exp(log π − log q)·A, summed"),
             ("cross_entropy_loss",
              "supervised fine-tuning's −log π summed over the mask: not RL math"),
             ("compute_advantages_and_returns",
              "the registry's dispatcher: it calls the estimator the configuration names "
              "with the trainer's arguments, each estimator a row above")),
    runs=("GRPO (std-normalised and Dr. GRPO), RLOO, MaxRL, the REINFORCE++ returns (γ 1 and "
          "0.99), GAE (γ, λ 1 and 0.99, 0.95), each on the left-padded response_mask SkyRL "
          "builds; masked_whiten",
          "the REINFORCE++ returns on masks with holes, which SkyRL never passes it (a "
          "robustness check)",
          "the PPO loss regular (0.2/0.2 and 0.2/0.28) and dual clip, CISPO, each through "
          "SkyRL's token_mean advantage scaling and reduce_loss; GSPO and SAPO under "
          "sequence_mean", "reduce_loss under "
          "token_mean, sequence_mean, seq_mean_token_sum_norm and prompt_mean scaling",
          "compute_approx_kl k1, abs, k2, k3", "the critic loss per token"),
    does_not_run=("GAE on right-padded rows (SkyRL builds none: its recursion reads no "
                  "mask)", "DPPO, KL-Cov, rollout_is and importance_sampling losses",
                  "SAPO and GSPO under token_mean",
                  "token_mean_legacy scaling", "off-policy correction",
                  "dp_size > 1", "the KL in the reward (use_kl_in_reward: "
                  "RayPPOTrainer.apply_reward_kl_penalty in skyrl/train/trainer.py, which the "
                  "card does not load: rewards − kl_loss_coef · compute_approx_kl, whose own "
                  "rows run)", "the worker's entropy bonus (use_entropy_loss False, its "
                  "default)"),
)
