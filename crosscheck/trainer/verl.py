"""verl's report card: verl/trainer/ppo/core_algos.py and verl/utils/torch_functional.py.

Facts read in verl 0.9.1 (`volcengine/verl`); each adapter only renames and reshapes:
- the outcome estimators take `token_level_rewards` [B, T], `response_mask` and `index` (a NumPy
  array of prompt uids) and return (advantages, returns) broadcast over the response;
- the policy losses take an `ActorConfig` (clip_ratio, clip_ratio_low/high, clip_ratio_c,
  global_batch_info) and aggregate with `agg_loss` themselves; `ppo_loss`
  (verl/workers/utils/losses.py) passes the global token count in `global_batch_info`;
- `compute_gae_advantage_return` whitens its advantages inside and returns
  returns = advantages + values (before whitening).
"""
import inspect
import os
import sys

import numpy as np
import torch

from .card import (DoesNotFit, Known, NotInVersion, Row, Trainer, per_sequence, per_token,
                   source_of, zero_padding)

CA = "verl.trainer.ppo.core_algos"
TF = "verl.utils.torch_functional"
# not verl's defaults (AlgoConfig gamma = lam = 1.0, the verl profile's): at 1, 1 a missing or
# misplaced discount factor changes nothing, so the card checks GAE where discounting shows
GAMMA, LAM = 0.99, 0.95


def _float(mask, like):
    return mask.to(like.dtype)


# ---- advantage estimators -------------------------------------------------------------------

def _outcome(fn, **kwargs):
    """An outcome estimator on one reward per sequence: the reward as a one-token response."""
    def adapter(rewards, group_ids):
        r = rewards[:, None]
        adv, _ = fn(token_level_rewards=r, response_mask=r.new_ones(r.shape),
                    index=np.asarray(group_ids), **kwargs)
        return adv[:, 0]
    return adapter


_OUTCOME = ("one reward per sequence, placed as a one-token response (verl sums "
            "token_level_rewards over the response)",
            "index = group_ids as a NumPy array (verl passes prompt uids; equal ids, one group)",
            "the advantage read from that token")


def _gae(fn, gamma=GAMMA, lam=LAM):
    def adapter(rewards, values, mask):
        m = _float(mask, rewards)
        # verl's batches hold 0 there: the critic's values times response_mask, and token
        # rewards only at the reward token
        zero = values.new_zeros(())
        values, rewards = torch.where(mask.bool(), values, zero), \
            torch.where(mask.bool(), rewards, zero)
        _, returns = fn(token_level_rewards=rewards, values=values, response_mask=m,
                        gamma=gamma, lam=lam)
        return returns - values, returns
    return adapter


def _returns(fn, discount=1.0):
    class Config:                       # the AlgoConfig field the estimator reads
        gamma = discount

    def adapter(rewards, mask):
        _, returns = fn(token_level_rewards=rewards, response_mask=_float(mask, rewards),
                        config=Config())
        return returns
    return adapter


def _whiten(fn):
    def adapter(x, mask):
        return fn(x, _float(mask, x))
    return adapter


# ---- losses ---------------------------------------------------------------------------------

def _actor_config(cls, n_tokens_global=None, n_sequences_global=None, **fields):
    """An ActorConfig holding only the fields the policy losses read (its __init__, which
    validates a whole training configuration, is not run)."""
    cfg = cls.__new__(cls)
    info = {} if n_tokens_global is None else {"batch_num_tokens": n_tokens_global, "dp_size": 1}
    if n_sequences_global is not None:
        info.update(global_batch_size=n_sequences_global, dp_size=1)
    values = dict(dict(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None,
                       clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05, global_batch_info=info),
                  **fields)
    for k, v in values.items():
        object.__setattr__(cfg, k, v)
    return cfg


def _policy(fn, output=None, **fields):
    config_class = inspect.unwrap(fn).__globals__["ActorConfig"]

    def adapter(logp, old_logp, advantages, mask, n_tokens_global=None,
                n_sequences_global=None):
        loss, metrics = _loss_and_metrics(fn(
            old_log_prob=old_logp, log_prob=logp, advantages=per_sequence(advantages, logp),
            response_mask=mask.bool(), loss_agg_mode="token-mean",
            config=_actor_config(config_class, n_tokens_global, n_sequences_global, **fields)))
        return loss if output is None else metrics[output]
    return adapter


def _loss_and_metrics(out):
    """(loss, metrics) of a registered policy loss: it returns (loss, a metrics dict) from
    0.6.1 on, and the 4-tuple (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) in 0.6.0."""
    if len(out) == 2:
        return out
    if len(out) != 4:
        raise DoesNotFit(f"the policy loss returned {len(out)} values: neither (loss, metrics) "
                         f"nor (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)")
    loss, clipfrac, kl, lower = out
    return loss, {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": kl,
                  "actor/pg_clipfrac_lower": lower}


class _Fields(dict):
    """A config section read both as config.key and config.get(key) (verl's BaseConfig)."""
    __getattr__ = dict.__getitem__


def _token_policy(fn, weights=None, **fields):
    """A policy loss evaluated one valid token at a time (a [1, 1] batch, where agg_loss is
    the identity); its aggregation is agg_loss's rows. `weights(logp, old_logp, mask)`, if
    given, computes rollout_is_weights on the whole batch first, each token then passed its
    own."""
    config_class = inspect.unwrap(fn).__globals__["ActorConfig"]
    policy_loss = fields.pop("policy_loss", None)
    extra = {} if policy_loss is None else {"policy_loss": _Fields(policy_loss)}
    first = "rollout_log_prob" if "rollout_log_prob" in inspect.signature(fn).parameters \
        else "old_log_prob"

    def adapter(logp, old_logp, advantages, mask):
        config = _actor_config(config_class, 1, 1, **extra, **fields)

        def one(lp, old, adv, *w):
            more = {"rollout_is_weights": w[0]} if w else {}
            return fn(**{first: old}, log_prob=lp, advantages=adv,
                      response_mask=lp.new_ones((1, 1)), loss_agg_mode="token-mean",
                      config=config, **more)[0]
        tensors = (logp, old_logp, per_sequence(advantages, logp))
        if weights is not None:
            tensors += (weights(logp, old_logp, mask),)
        return per_token(one, mask, *tensors)
    return adapter


def _verl_tis(logp, old_logp, mask):
    """verl's own compute_rollout_correction_weights (token TIS at 2.0) of logp against
    old_logp read as the rollout's, as compute_policy_loss_bypass_mode computes them."""
    helper = sys.modules[RC].compute_rollout_correction_weights
    w, _ = helper(log_ratio=zero_padding(mask, logp - old_logp),
                  response_mask=_float(mask, logp), rollout_is="token", rollout_is_threshold=2.0)
    return w


def _kl_cov(fn, ratio):
    """Each token's loss read through rollout_is_weights: verl multiplies pg_losses by them
    after selecting its tokens and before agg_loss, so a weight of N at one token (0
    elsewhere) and token-mean over the N valid tokens give that token's loss."""
    config_class = inspect.unwrap(fn).__globals__["ActorConfig"]

    def adapter(logp, old_logp, advantages, mask):
        B, T = mask.shape
        n = int(mask.sum())
        config = _actor_config(config_class, n, B, policy_loss=_Fields(
            kl_cov_ratio=ratio, ppo_kl_coef=0.1))
        out = []
        for b in range(B):
            for t in range(T):
                if not bool(mask[b, t]):
                    out.append(logp.new_zeros(()))
                    continue
                w = logp.new_zeros((B, T))
                w[b, t] = n
                out.append(fn(old_log_prob=old_logp, log_prob=logp,
                              advantages=per_sequence(advantages, logp),
                              response_mask=mask.bool(), loss_agg_mode="token-mean",
                              config=config, rollout_is_weights=w)[0])
        return torch.stack(out).reshape(B, T) if out else logp.new_zeros((B, T))
    return adapter


def _otb(fn):
    def adapter(rewards, old_logp, sum_pi_squared, mask, group_ids):
        adv, _ = fn(token_level_rewards=zero_padding(mask, rewards),
                    response_mask=_float(mask, rewards), index=np.asarray(group_ids),
                    old_log_probs=zero_padding(mask, old_logp),
                    sum_pi_squared=zero_padding(mask, sum_pi_squared))
        return zero_padding(mask, adv)
    return adapter


_TOKEN = ("evaluated one valid token at a time (a [1, 1] batch, where agg_loss is the "
          "identity), the losses assembled into [B, T]; its aggregation is agg_loss's rows",
          "an ActorConfig made without running its __init__ (clip_ratio 0.2, clip_ratio_c 3.0, "
          "the ActorConfig defaults)")


def _geo_mean(fn):
    config_class = inspect.unwrap(fn).__globals__["ActorConfig"]

    def adapter(logp, old_logp, advantages, mask):
        loss, _ = _loss_and_metrics(fn(
            old_log_prob=old_logp, log_prob=logp, advantages=per_sequence(advantages, logp),
            response_mask=_float(mask, logp), loss_agg_mode="token-mean",
            config=_actor_config(config_class)))
        return loss
    return adapter


def _fits_icepop(fn):
    """IcePop's mask mode comes with the 'lower_upper' threshold string (0.8.0 on); before,
    rollout_is_threshold is one float, the truncation's upper bound, and masking is the separate
    rejection sampler (rollout_rs)."""
    if "_parse_rollout_is_threshold(" not in source_of(fn):
        raise NotInVersion("compute_rollout_correction_weights takes one float threshold (the "
                           "truncation) in this version: no IcePop mask mode")
    return {}


def _rollout_weights(level, threshold):
    def make(fn):
        def adapter(logp, rollout_logp, mask):
            log_ratio = zero_padding(mask, logp - rollout_logp)
            weights, _ = fn(log_ratio=log_ratio, response_mask=_float(mask, logp),
                            rollout_is=level, rollout_is_threshold=threshold)
            return weights
        return adapter
    return make


def _entropy(fn):
    def adapter(logits, mask):
        return per_token(lambda z: fn(z, z.new_ones(z.shape[:-1]), "token-mean"), mask, logits)
    return adapter


def _rewards(fn):
    def adapter(scores, logp, ref_logp, mask):
        if scores.dim() == 1:                      # the score at the last valid token
            m = mask.bool()
            position = torch.arange(m.shape[-1])
            last = torch.where(m, position, -1).max(dim=-1).values
            scores = (position == last[:, None]).to(logp.dtype) * \
                zero_padding(m.any(-1), scores)[:, None]
        out = fn(scores, zero_padding(mask, logp), zero_padding(mask, ref_logp), KL_RATIO)
        return zero_padding(mask, out)
    return adapter


KL_RATIO = 0.1      # passed as kl_ratio (verl's kl_ctrl.kl_coef default 0.001 hides errors)


def _responses(rewards, lengths):
    """One reward per sequence as verl's token_level_rewards: a response of L_i tokens, the
    reward at its last one."""
    L = lengths.to(torch.long)
    T = max(int(L.max()), 1) if len(L) else 1
    position = torch.arange(T)[None, :]
    mask = (position < L[:, None]).to(rewards.dtype)
    r = (position == (L[:, None] - 1)).to(rewards.dtype) * rewards[:, None]
    return r, mask


def _opo(fn):
    def adapter(rewards, lengths, group_ids):
        r, mask = _responses(rewards, lengths)
        adv, _ = fn(token_level_rewards=r, response_mask=mask, index=np.asarray(group_ids))
        return adv[:, 0]
    return adapter


def _passk(fn):
    def adapter(rewards, group_ids):
        r = rewards[:, None]
        adv, _ = fn(token_level_rewards=r, response_mask=r.new_ones(r.shape),
                    index=np.asarray(group_ids), epsilon=1e-6,
                    config={"norm_adv_by_std_in_grpo": True})
        return adv[:, 0]
    return adapter


def _remax(fn):
    def adapter(rewards, baselines, mask):
        adv, _ = fn(token_level_rewards=zero_padding(mask, rewards), reward_baselines=baselines,
                    response_mask=_float(mask, rewards))
        return zero_padding(mask, adv)
    return adapter


def _whitened(fn, **kwargs):
    def adapter(rewards, mask, group_ids):
        r = rewards[:, None] * (torch.arange(mask.shape[-1]) == 0).to(rewards.dtype)
        adv, _ = fn(token_level_rewards=r, response_mask=_float(mask, rewards),
                    index=np.asarray(group_ids), **kwargs)
        return adv
    return adapter


def _deprecated(fn):
    def adapter(logp, old_logp, advantages, mask):
        loss, *_ = fn(old_log_prob=old_logp, log_prob=logp,
                      advantages=per_sequence(advantages, logp),
                      response_mask=_float(mask, logp), cliprange=0.2, clip_ratio_c=3.0,
                      loss_agg_mode="token-mean")
        return loss
    return adapter


def _metric(fn, output):
    inner = _policy(fn, output)

    def adapter(logp, old_logp, advantages, mask):
        return inner(logp, old_logp, advantages, mask)
    return adapter


def _approx_kl(fn):
    inner = _policy(fn, "actor/ppo_kl")

    def adapter(logp, old_logp, mask):
        return inner(logp, old_logp, logp.new_ones(logp.shape), mask)
    return adapter


_POLICY = ("the loss aggregated by verl's own agg_loss (loss_agg_mode='token-mean')",
           "an ActorConfig holding clip_ratio 0.2, clip_ratio_c 3.0 and global_batch_info, made "
           "without running its __init__",
           "global_batch_info = {batch_num_tokens, global_batch_size: the whole batch's token "
           "and sequence counts, dp_size: 1}, as verl/workers/utils/losses.py::ppo_loss fills it")


def _value(fn):
    def adapter(values, old_values, returns, mask):
        one = values.new_ones((1, 1))
        return per_token(lambda v, o, r: fn(vpreds=v, returns=r, values=o, response_mask=one,
                                            cliprange_value=0.5,
                                            loss_agg_mode="token-mean")[0],
                         mask, values, old_values, returns)
    return adapter


def _agg(mode, **fixed):
    def make(fn):
        def adapter(loss, mask, n_tokens_global=None, n_sequences_global=None):
            return fn(loss_mat=loss, loss_mask=_float(mask, loss), loss_agg_mode=mode,
                      batch_num_tokens=n_tokens_global, global_batch_size=n_sequences_global,
                      **fixed)

        def local(loss, mask):                   # before 0.7.0: no global counts
            return fn(loss_mat=loss, loss_mask=_float(mask, loss), loss_agg_mode=mode, **fixed)
        return adapter if "batch_num_tokens" in inspect.signature(fn).parameters else local
    return make


SCALE = 4.0        # loss_scale_factor: "set this to a constant" (agg_loss's docstring)


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return fn(logp, ref_logp, kind) * _float(mask, logp)
        return adapter
    return make


def _agg_as_coded(fn):
    """The aggregation a policy loss applies: the loss_agg_mode it hard-codes in its agg_loss
    call where it does (GSPO until 0.9.0, SAPO: 'we need to aggregate the loss at the sequence
    level'), else the adapter's token-mean."""
    import ast
    for node in ast.walk(ast.parse(source_of(fn))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "agg_loss":
            for kw in node.keywords:
                if kw.arg == "loss_agg_mode" and isinstance(kw.value, ast.Constant):
                    return dict(conventions=dict(agg=kw.value.value),
                                choice=f"it hard-codes loss_agg_mode={kw.value.value!r} in its "
                                       f"agg_loss call, whatever loss_agg_mode says: judged so")
    return dict(conventions=dict(agg="token-mean"))


def _counts_as_coded(fn):
    """The accumulation a policy loss's (or agg_loss's) release applies: before 0.7 agg_loss
    takes no global
    counts, each micro-batch is normalised by its own tokens and the actor scales each loss by
    1 / gradient_accumulation (dp_actor.py: loss_scale_factor), so the row is judged under
    mean accumulation."""
    agg = fn if fn.__name__ == "agg_loss" else inspect.unwrap(fn).__globals__.get("agg_loss")
    if agg is not None and "batch_num_tokens" in inspect.signature(agg).parameters:
        return {}
    return dict(audit=dict(accumulation="mean"),
                choice="this release's agg_loss takes no global counts (they came in 0.7.0): "
                       "each micro-batch is normalised by its own tokens and the actor averages "
                       "the micro-batches' losses (1 / gradient_accumulation)")


def _fits_all(*fits):
    """One fits of several: their conventions and audit keywords merged, choices joined."""
    def fit(fn):
        out = {}
        for f in fits:
            got = f(fn) or {}
            for key in ("conventions", "audit"):
                if key in got:
                    out[key] = dict(out.get(key, {}), **got[key])
            if got.get("choice"):
                out["choice"] = "; ".join(c for c in (out.get("choice"), got["choice"]) if c)
        return out
    return fit


# an adapter that evaluates one valid token at a time: padding never reaches the function
_VALID_ONLY = dict(padding_checks=False)


def _norm_as_coded(fn):
    """The row judges 0.9's seq-mean-token-sum-norm (the per-sequence mean divided by
    loss_scale_factor); a release dividing the sum over sequences instead is another
    convention, which the row has no adapter for."""
    if "torch.sum(seq_losses) / loss_scale_factor" in source_of(fn):
        raise DoesNotFit("this release's seq-mean-token-sum-norm divides the sum over sequences "
                         "by loss_scale_factor, not their mean: no adapter for that convention")
    return {}


def _clamped_log_ratio(data):
    """ppo_kl as verl logs it: from log-ratios clamped to ±20 (old_logp moved to match)."""
    x = np.clip(data["logp"] - data["old_logp"], -20.0, 20.0)
    return dict(data, old_logp=data["logp"] - x)


def _zero_when_all_rejected(adapter):
    """compute_rollout_correction_weights as it would be without its metric's ZeroDivisionError:
    no weight survives, so every weight is 0."""
    def variant(logp, rollout_logp, mask):
        try:
            return adapter(logp, rollout_logp, mask)
        except ZeroDivisionError:
            return torch.zeros_like(logp)
    return variant


_CLAMPED = Known(
    "value", "documented choice",
    "verl clamps the log-ratio to ±20 before exp and logs ppo_kl from the clamped values, so "
    "the metric saturates once |log π − log π_old| > 20; ordinary updates never reach it",
    variant=dict(inputs=_clamped_log_ratio),
    cite="core_algos.py: 'Clamp negative_approx_kl for stability'")

_ALL_REJECTED = Known(
    "raises", "robustness",
    "when IcePop rejects every token of the batch (all weights 0), compute_is_metrics computes "
    "the effective sample size as 1.0 / masked_mean(0).item() and raises ZeroDivisionError "
    "instead of returning the weights; on batches where any weight survives the weights equal "
    "the reference's. verl computes the weights over the whole training batch, where every "
    "weight is rejected only once the rollout and training policies have diverged entirely",
    variant=dict(adapt=_zero_when_all_rejected))

_MICRO_MEAN = Known(
    "microbatch", "documented choice",
    "the deprecated compute_policy_loss aggregates each micro-batch by its own token count "
    "(agg_loss without batch_num_tokens), so averaging micro-batch losses weights a token of a "
    "short micro-batch more than one of a long micro-batch; the registered 'vanilla' loss that "
    "replaces it normalises by the global count (global_batch_info) and is exact",
    variant=dict(microbatch="local"),
    cite="core_algos.py: @deprecated('verl.trainer.ppo.core_algos.compute_policy_loss_vanilla')")

ROWS = (
    Row(f"{CA}:compute_gae_advantage_return", "gae", _gae,
        choices=(f"γ = {GAMMA}, λ = {LAM} passed to both, not verl's config defaults γ = λ = "
                 f"1.0 (AlgoConfig; the verl profile's), under which a missing or misplaced "
                 f"discount changes nothing; the function takes γ and λ as arguments, so these "
                 f"audit the same code",
                 "response_mask as a float tensor, as verl builds it; values and token rewards 0 "
                 "at masked positions, as verl's critic and reward managers leave them",
                 "advantages read as returns − values: the function whitens its advantages "
                 "inside and defines returns = advantages + values; the whitening is "
                 "masked_whiten's row"),
        conventions=dict(gamma=GAMMA, lam=LAM),
        params=("token_level_rewards", "values", "response_mask", "gamma", "lam")),
    Row(f"{CA}:compute_gae_advantage_return", "gae", lambda fn: _gae(fn, 1.0, 1.0),
        label="γ 1, λ 1",
        choices=("γ = λ = 1.0, verl's config defaults (AlgoConfig), passed to both",
                 "response_mask as a float tensor; values and token rewards 0 at masked "
                 "positions, as verl leaves them", "advantages read as returns − values"),
        conventions=dict(gamma=1.0, lam=1.0),
        params=("token_level_rewards", "values", "response_mask", "gamma", "lam")),
    Row(f"{CA}:compute_grpo_outcome_advantage", "group_advantages",
        lambda fn: _outcome(fn, epsilon=1e-6), choices=_OUTCOME,
        params=("token_level_rewards", "response_mask", "index", "epsilon")),
    Row(f"{CA}:compute_grpo_vectorized_outcome_advantage", "group_advantages",
        lambda fn: _outcome(fn, epsilon=1e-6),
        audit=dict(precision="float32"),
        choices=_OUTCOME + ("judged at float32: verl/utils/groupwise.py::group_mean_std casts "
                            "the scores to float32 for the group statistics",),
        params=("token_level_rewards", "response_mask", "index", "epsilon")),
    Row(f"{CA}:compute_grpo_outcome_advantage", "group_advantages",
        lambda fn: _outcome(fn, epsilon=1e-6, norm_adv_by_std_in_grpo=False),
        label="Dr. GRPO", choices=_OUTCOME + ("norm_adv_by_std_in_grpo=False",),
        conventions=dict(scale="none"),
        params=("token_level_rewards", "response_mask", "index", "norm_adv_by_std_in_grpo")),
    Row(f"{CA}:compute_rloo_outcome_advantage", "group_advantages", _outcome,
        choices=_OUTCOME, conventions=dict(baseline="leave_one_out", scale="none"),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{CA}:compute_rloo_vectorized_outcome_advantage", "group_advantages", _outcome,
        choices=_OUTCOME, conventions=dict(baseline="leave_one_out", scale="none",
                                           singleton="zero"),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{CA}:compute_reinforce_plus_plus_outcome_advantage", "discounted_returns", _returns,
        choices=("the returns output (its advantages are these returns whitened by "
                 "masked_whiten, whose row is below)", "an AlgoConfig-like object with gamma 1.0"),
        conventions=dict(gamma=1.0), params=("token_level_rewards", "response_mask", "config")),
    Row(f"{CA}:compute_reinforce_plus_plus_outcome_advantage", "discounted_returns",
        lambda fn: _returns(fn, GAMMA), label=f"γ {GAMMA}",
        choices=("the returns output", f"an AlgoConfig-like object with gamma {GAMMA}: a "
                 "dropped or misplaced discount shows only below 1"),
        conventions=dict(gamma=GAMMA), params=("token_level_rewards", "response_mask", "config")),
    Row(f"{CA}:compute_value_loss", "value_loss", _value,
        audit=_VALID_ONLY,
        choices=("evaluated one valid token at a time (a [1, 1] batch, where agg_loss is the "
                 "identity), the losses assembled into [B, T]; its aggregation is agg_loss's rows",
                 "cliprange_value = 0.5, as the profile's"),
        params=("vpreds", "returns", "values", "response_mask", "cliprange_value")),
    Row(f"{TF}:masked_whiten", "whiten", _whiten,
        choices=("mask as a float tensor",), params=("values", "mask")),
    Row(f"{CA}:compute_policy_loss_vanilla", "policy_objective", _policy, label="ppo",
        choices=_POLICY, conventions=dict(loss="ppo", beta=0.0), fits=_counts_as_coded,
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode",
                "config")),
    Row(f"{CA}:compute_policy_loss_vanilla", "policy_objective",
        lambda fn: _policy(fn, clip_ratio_low=0.2, clip_ratio_high=0.28),
        label="ppo, clip-higher 0.2/0.28",
        choices=_POLICY + ("clip_ratio_low 0.2, clip_ratio_high 0.28 (DAPO's clip-higher): "
                           "the two bounds apart, so a swap shows",),
        conventions=dict(loss="ppo", beta=0.0, clip_low=0.2, clip_high=0.28),
        fits=_counts_as_coded,
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode",
                "config")),
    Row(f"{CA}:compute_policy_loss", "policy_objective", lambda fn: _deprecated(fn),
        label="ppo, deprecated", choices=("cliprange 0.2, clip_ratio_c 3.0, token-mean",
                                          "it takes no global count: micro-batch losses "
                                          "averaged"),
        conventions=dict(loss="ppo", beta=0.0), audit=dict(accumulation="mean"),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "cliprange"),
        known=(_MICRO_MEAN,)),
    Row(f"{CA}:compute_policy_loss_vanilla", "clip_fraction",
        lambda fn: _metric(fn, "actor/pg_clipfrac"), label="pg_clipfrac",
        choices=("the pg_clipfrac metric the loss returns",),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_vanilla", "approx_kl", _approx_kl, label="ppo_kl",
        choices=("the ppo_kl metric the loss returns (advantages of 1: it does not read them)",),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config"),
        known=(_CLAMPED,)),
    Row(f"{CA}:compute_policy_loss_cispo", "policy_objective", _policy, label="cispo",
        choices=_POLICY, conventions=dict(loss="cispo", beta=0.0),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_gspo", "policy_objective", _policy, label="gspo",
        choices=_POLICY, conventions=dict(loss="gspo", beta=0.0), fits=_fits_all(_agg_as_coded, _counts_as_coded),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_sapo", "policy_objective", _policy, label="sapo",
        choices=_POLICY + ("tau_pos 1.0, tau_neg 1.05 (ActorConfig's defaults)",),
        conventions=dict(loss="sapo", beta=0.0), fits=_agg_as_coded,
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
) + tuple(
    Row(f"{CA}:agg_loss", "aggregate", _agg(mode), label=mode,
        choices=("the global counts passed as batch_num_tokens / global_batch_size, as "
                 "ppo_loss does through global_batch_info",),
        conventions=dict(mode=mode), fits=_counts_as_coded,
        params=("loss_mat", "loss_mask", "loss_agg_mode"))
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
) + (
    Row(f"{CA}:agg_loss", "aggregate", _agg("seq-mean-token-sum-norm", loss_scale_factor=SCALE),
        label="seq-mean-token-sum-norm", fits=_norm_as_coded,
        choices=("the global counts passed as batch_num_tokens / global_batch_size",
                 f"loss_scale_factor = {SCALE:g}, a constant as its docstring advises (left None "
                 "it is the padded length T); verl 0.9 divides the per-sequence mean by it, so "
                 "the reference's mode is seq-mean-token-sum with norm = loss_scale_factor"),
        conventions=dict(mode="seq-mean-token-sum", norm=SCALE),
        params=("loss_mat", "loss_mask", "loss_agg_mode", "loss_scale_factor")),
) + tuple(
    Row(f"{CA}:kl_penalty", "kl_penalty", _kl(name), label=name,
        choices=("the per-token estimate times the mask (verl masks it in agg_loss)",),
        conventions=dict(kind=kind, clamp=clamp), params=("logprob", "ref_logprob"))
    for name, kind, clamp in (("k1", "k1", None), ("abs", "abs", None), ("k2", "k2", None),
                              ("low_var_kl", "k3", (20.0, 10.0)))
)

RC = "verl.trainer.ppo.rollout_corr_helper"
ROWS = ROWS + (
    Row(f"{CA}:compute_policy_loss_reinforce", "reinforce_loss", _token_policy,
        audit=_VALID_ONLY,
        choices=_TOKEN + ("rollout_is_weights None: plain REINFORCE",),
        params=("rollout_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_reinforce", "reinforce_loss",
        lambda fn: _token_policy(fn, weights=_verl_tis),
        label="token TIS weights",
        choices=_TOKEN + ("rollout_is_weights from verl's compute_rollout_correction_weights "
                          "(rollout_is 'token', threshold 2.0) of log_prob against "
                          "old_log_prob read as the rollout's, computed on the whole batch "
                          "first, as compute_policy_loss_bypass_mode does",),
        conventions=dict(is_level="token", is_upper=2.0),
        params=("rollout_log_prob", "log_prob", "advantages", "response_mask", "config",
                "rollout_is_weights")),
    Row(f"{CA}:compute_policy_loss_gpg", "reinforce_loss", _token_policy,
        audit=_VALID_ONLY,
        choices=_TOKEN + ("GPG's change is in its advantages (compute_gpg_outcome_advantage's "
                          "row); its loss is REINFORCE's",),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_dro", "reinforce_loss",
        lambda fn: _token_policy(fn, policy_loss={"dro_beta": 0.5}),
        audit=_VALID_ONLY,
        choices=_TOKEN + ("policy_loss.dro_beta = 0.5",), conventions=dict(beta=0.5),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_dppo_tv", "dppo_loss", _token_policy,
        audit=_VALID_ONLY,
        choices=_TOKEN + ("DPPO's truncation C is config.get('clip_ratio_c', 20.0): the "
                          "ActorConfig field, 3.0 by default",),
        conventions=dict(divergence="tv"),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_dppo_kl", "dppo_loss", _token_policy,
        audit=_VALID_ONLY,
        choices=_TOKEN + ("DPPO's truncation C is config.get('clip_ratio_c', 20.0): the "
                          "ActorConfig field, 3.0 by default",),
        conventions=dict(divergence="kl"),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_kl_cov", "kl_cov_loss", lambda fn: _kl_cov(fn, 0.1),
        choices=("the whole batch in each call (its token selection spans the batch); each "
                 "token's loss read through rollout_is_weights = N at that token, 0 elsewhere, "
                 "with token-mean over the batch's N valid tokens",
                 "policy_loss.kl_cov_ratio = 0.1 (the default 2e-4 selects one token of "
                 "batches under 10,000 tokens), ppo_kl_coef = 0.1 (PolicyLossConfig's default)"),
        conventions=dict(ratio=0.1), audit=dict(cases=24),    # a whole-batch call per token
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config",
                "rollout_is_weights")),
    Row(f"{CA}:compute_policy_loss_geo_mean", "gmpo_loss", _geo_mean,
        choices=("the whole batch in one call: GMPO takes the mean over sequences itself, "
                 "whatever loss_agg_mode says", "an ActorConfig holding clip_ratio 0.2"),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_entropy_loss", "entropy", _entropy,
        audit=_VALID_ONLY,
        choices=("evaluated one valid token at a time ([1, 1, V] logits, where agg_loss is the "
                 "identity): the entropy per token; its aggregation is agg_loss's rows",),
        params=("logits", "response_mask", "loss_agg_mode")),
    Row(f"{CA}:compute_rewards", "kl_rewards", _rewards,
        choices=(f"kl_ratio = {KL_RATIO} (beta); a score per sequence placed at its last valid "
                 "token as token_level_scores (verl's reward managers place it there)",
                 "log-probs 0 at padding, the output read at valid tokens"),
        conventions=dict(beta=KL_RATIO),
        params=("token_level_scores", "old_log_prob", "ref_log_prob", "kl_ratio")),
    Row(f"{CA}:compute_optimal_token_baseline_advantage", "optimal_token_baseline_advantages",
        _otb, choices=("token rewards, old_log_probs and sum_pi_squared 0 at padding (finite in "
                       "verl's batches); the advantages read at valid tokens",
                       "index = group_ids as a NumPy array; rollout_is_weights None, "
                       "handle_zero_tail and epsilon at their defaults"),
        params=("token_level_rewards", "response_mask", "index", "old_log_probs",
                "sum_pi_squared")),
    Row(f"{CA}:compute_opo_outcome_advantage", "opo_advantages", _opo,
        choices=("each sequence a right-padded response of L_i tokens with its reward at the "
                 "last one (OPO's length is the response_mask count)",
                 "index = group_ids as a NumPy array", "the advantage read from token 0"),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{CA}:compute_gpg_outcome_advantage", "gpg_advantages", _outcome,
        choices=_OUTCOME + ("f_norm 1.0 (its default); alpha is recomputed inside as "
                            "B / #non-zero scores",),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{CA}:compute_grpo_passk_outcome_advantage", "passk_advantages", _passk,
        choices=_OUTCOME + ("config = {norm_adv_by_std_in_grpo: True}, epsilon 1e-6",),
        params=("token_level_rewards", "response_mask", "index", "epsilon", "config")),
    Row(f"{CA}:compute_remax_outcome_advantage", "remax_advantages", _remax,
        choices=("token rewards 0 at padding; the advantages read at valid tokens (verl's "
                 "reverse cumulative sum leaves the reward-to-go at holes)",),
        params=("token_level_rewards", "reward_baselines", "response_mask")),
    Row(f"{CA}:compute_reinforce_plus_plus_baseline_outcome_advantage",
        "whitened_group_advantages", _whitened,
        choices=("one reward per sequence at token 0 of token_level_rewards (verl sums the "
                 "row, masked or not)", "response_mask = the [B, T] mask: the whitening is "
                 "over its tokens", "index = group_ids as a NumPy array"),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{CA}:compute_gdpo_outcome_advantage", "whitened_group_advantages",
        lambda fn: _whitened(fn, epsilon=1e-6),
        choices=("one reward dimension: token_level_rewards (no gdpo_reward_keys), weight 1",
                 "one reward per sequence at token 0 of token_level_rewards",
                 "response_mask = the [B, T] mask", "index = group_ids as a NumPy array"),
        conventions=dict(scale="group"),
        params=("token_level_rewards", "response_mask", "index", "epsilon")),
) + tuple(
    Row(f"{RC}:compute_rollout_correction_weights", "rollout_is_weights",
        _rollout_weights(level, threshold), label=f"{level} {kind}",
        choices=("log_ratio = logp − rollout_logp, 0 at padding (verl's padding is finite)",
                 f"rollout_is = {level!r}, rollout_is_threshold = {threshold!r}"),
        conventions=dict(level=level, mode=mode, lower=lower, upper=2.0),
        params=("log_ratio", "response_mask", "rollout_is", "rollout_is_threshold"),
        known=(_ALL_REJECTED,) if mode == "mask" else (),
        fits=_fits_icepop if mode == "mask" else None)
    for level in ("token", "sequence")
    for kind, mode, threshold, lower in (("TIS", "truncate", 2.0, None),
                                         ("IcePop mask", "mask", "0.5_2.0", 0.5))
)

# ---- compositions on the training path --------------------------------------------------------
# verl/workers/utils/losses.py::ppo_loss (the actor's loss: policy loss + entropy + KL loss, each
# through agg_loss with global_batch_info) and verl/trainer/ppo/ray_trainer.py::apply_kl_penalty /
# compute_advantage (the KL folded into the rewards, the estimator dispatch), called as the
# trainer calls them with stand-in batches

LOSSES = "verl.workers.utils.losses"
RT = "verl.trainer.ppo.ray_trainer"
KL_LOSS_COEF = 0.1      # actor.kl_loss_coef (default 0.001, under which a dropped or doubled
# coefficient moves the loss by less than the audit sees)


class _Batch(dict):
    """A TensorDict batch as ppo_loss and the ray trainer read it: keys, get, select(...)
    .to_padded_tensor() (the tensors are already padded [B, T]) and batch_size."""

    def __init__(self, size, **tensors):
        super().__init__(**tensors)
        self.batch_size = (size,)

    def select(self, *keys):
        return _Batch(self.batch_size[0], **{k: self[k] for k in keys})

    def to_padded_tensor(self):
        return self


def _packed(logp):
    """The actor's output as verl's engine returns it, no padding: each sequence a one-token
    prompt and its T response positions, the log-prob of response token t at sequence position
    t (the model's output left-shifted by one), then the last position's (unused) output;
    no_padding_2_padding slices the responses back out."""
    B, T = logp.shape
    return torch.cat([logp, logp.new_zeros((B, 1))], dim=1).reshape(B * (T + 1))


def _ppo_loss(agg="token-mean", kl_type="low_var_kl", scale=None):
    def make(fn):
        config_class = fn.__globals__["ActorConfig"]

        def adapter(logp, old_logp, advantages, mask, ref_logp, n_tokens_global=None,
                    n_sequences_global=None):
            B, T = logp.shape
            config = _actor_config(
                config_class, policy_loss=_Fields(loss_mode="vanilla"), loss_agg_mode=agg,
                loss_scale_factor=scale, use_kl_loss=True, kl_loss_type=kl_type,
                kl_loss_coef=KL_LOSS_COEF, entropy_coeff=0.0)
            n = mask.sum() if n_tokens_global is None else n_tokens_global
            data = _Batch(
                B, dp_size=1, batch_num_tokens=n,
                global_batch_size=B if n_sequences_global is None else n_sequences_global,
                prompts=torch.zeros((B, 1), dtype=torch.long),
                responses=torch.zeros((B, T), dtype=torch.long),
                attention_mask=torch.ones((B, 1 + T), dtype=torch.long),
                response_mask=mask.bool(), old_log_probs=old_logp,
                advantages=per_sequence(advantages, logp), ref_log_prob=ref_logp)
            loss, _ = fn(config, {"log_probs": _packed(logp)}, data)
            return loss
        return adapter
    return make


_PPO_LOSS = ("called as the engine calls it: model_output = {'log_probs': the actor's "
             "unpadded output} (each sequence a one-token prompt and T response positions, "
             "sliced back by verl's own no_padding_2_padding), no 'entropy' (verl computes it "
             "only when calculate_entropy or entropy_coeff ≠ 0)",
             "data: a dict-like batch with dp_size 1, batch_num_tokens and global_batch_size "
             "the whole batch's token and sequence counts (as the engine fills them), "
             "response_mask, old_log_probs, advantages, ref_log_prob",
             f"ActorConfig (its __init__ not run): policy_loss.loss_mode 'vanilla', clip_ratio "
             f"0.2, clip_ratio_c 3.0, use_kl_loss True, kl_loss_coef {KL_LOSS_COEF} (the "
             f"default 0.001 hides a dropped or doubled coefficient), entropy_coeff 0 (its "
             f"default)")


class _KLController:
    """kl_ctrl as apply_kl_penalty reads it: its value; update() records nothing."""

    def __init__(self, value):
        self.value = value

    def update(self, current_kl, n_steps):
        pass


def _kl_in_reward(fn):
    from .card import StandInSelf

    def adapter(scores, logp, ref_logp, mask):
        m = mask.bool()
        if scores.dim() == 1:                      # the score at the last valid token
            position = torch.arange(m.shape[-1])
            last = torch.where(m, position, -1).max(dim=-1).values
            scores = (position == last[:, None]).to(logp.dtype) * \
                zero_padding(m.any(-1), scores)[:, None]
        data = StandInSelf(batch=_Batch(
            m.shape[0], response_mask=_float(mask, logp), token_level_scores=scores,
            old_log_probs=zero_padding(mask, logp), ref_log_prob=zero_padding(mask, ref_logp)))
        out, _ = fn(data, _KLController(KL_RATIO), kl_penalty="kl")
        return zero_padding(mask, out.batch["token_level_rewards"])
    return adapter


def _advantage_data(**tensors):
    from .card import StandInSelf
    uid = tensors.pop("uid", None)
    size = next(iter(tensors.values())).shape[0]
    return StandInSelf(batch=_Batch(size, **tensors),
                       non_tensor_batch={} if uid is None else {"uid": uid})


def _dispatch_gae(fn):
    estimator = fn.__globals__["AdvantageEstimator"]

    def adapter(rewards, values, mask):
        zero = values.new_zeros(())
        values, rewards = torch.where(mask.bool(), values, zero), \
            torch.where(mask.bool(), rewards, zero)
        out = fn(_advantage_data(token_level_rewards=rewards, values=values,
                                 response_mask=_float(mask, rewards)),
                 adv_estimator=estimator.GAE, gamma=GAMMA, lam=LAM,
                 config=_Fields(use_pf_ppo=False))
        returns = out.batch["returns"]
        return returns - values, returns
    return adapter


def _dispatch_outcome(name, **kwargs):
    def make(fn):
        estimator = getattr(fn.__globals__["AdvantageEstimator"], name)

        def adapter(rewards, group_ids):
            r = rewards[:, None]
            out = fn(_advantage_data(token_level_rewards=r, response_mask=r.new_ones(r.shape),
                                     uid=np.asarray(group_ids)),
                     adv_estimator=estimator, config=_Fields(), **kwargs)
            return out.batch["advantages"][:, 0]
        return adapter
    return make


def _norm_as_coded_in_agg(fn):
    """ppo_loss's seq-mean-token-sum-norm is its agg_loss's: judged as _norm_as_coded judges
    agg_loss."""
    return _norm_as_coded(fn.__globals__["agg_loss"])


_DISPATCH = ("called as the trainer calls it (v1 trainer_base._compute_advantage through "
             "compute_advantage_for_multi_trajectories): a DataProto-like data with batch = "
             "{token_level_rewards, response_mask[, values]} and non_tensor_batch = {uid}",)

ROWS = ROWS + (
    Row(f"{LOSSES}:ppo_loss", "policy_objective", _ppo_loss(),
        label="vanilla + low_var_kl loss, token-mean",
        choices=_PPO_LOSS + ("loss_agg_mode 'token-mean' (its default), kl_loss_type "
                             "'low_var_kl' (its default)",),
        conventions=dict(loss="ppo", agg="token-mean", beta=KL_LOSS_COEF, kl_kind="k3",
                         kl_clamp=(20.0, 10.0)),
        params=("config", "model_output", "data")),
    Row(f"{LOSSES}:ppo_loss", "policy_objective",
        _ppo_loss("seq-mean-token-sum-norm", "k1", SCALE),
        label="vanilla + k1 loss, seq-mean-token-sum-norm", fits=_norm_as_coded_in_agg,
        choices=_PPO_LOSS + (f"loss_agg_mode 'seq-mean-token-sum-norm', loss_scale_factor "
                             f"{SCALE:g} (ppo_loss puts it in global_batch_info for both the "
                             f"policy and the KL term's agg_loss), kl_loss_type 'k1'",),
        conventions=dict(loss="ppo", agg="seq-mean-token-sum", norm=SCALE, beta=KL_LOSS_COEF,
                         kl_kind="k1", kl_clamp=None),
        params=("config", "model_output", "data")),
    Row(f"{RT}:apply_kl_penalty", "kl_rewards", _kl_in_reward,
        choices=(f"kl_ctrl.value = {KL_RATIO} (a fixed controller), kl_penalty 'kl' (k1, "
                 "algorithm.kl_penalty's default)", "data: a DataProto-like batch of "
                 "token_level_scores (a score per sequence at its last valid token), "
                 "old_log_probs and ref_log_prob (0 at padding, as verl's padded batches hold "
                 "them), response_mask", "the output read at valid tokens"),
        conventions=dict(beta=KL_RATIO, kind="k1"),
        params=("data", "kl_ctrl", "kl_penalty")),
    Row(f"{RT}:compute_advantage", "gae", _dispatch_gae, label=f"GAE γ {GAMMA}, λ {LAM}",
        choices=_DISPATCH + (f"adv_estimator GAE, gamma {GAMMA}, lam {LAM} (as "
                             f"algorithm.gamma / .lam reach it); values and token rewards 0 at "
                             f"masked positions; advantages read as returns − values (they are "
                             f"whitened inside, masked_whiten's row)",),
        conventions=dict(gamma=GAMMA, lam=LAM),
        params=("data", "adv_estimator", "gamma", "lam", "config")),
    Row(f"{RT}:compute_advantage", "group_advantages", _dispatch_outcome("GRPO"),
        label="GRPO",
        choices=_DISPATCH + ("adv_estimator GRPO, norm_adv_by_std_in_grpo True (its default); "
                             "one reward per sequence as a one-token response, uid = group_ids",),
        params=("data", "adv_estimator", "norm_adv_by_std_in_grpo")),
    Row(f"{RT}:compute_advantage", "group_advantages",
        _dispatch_outcome("GRPO", norm_adv_by_std_in_grpo=False), label="Dr. GRPO",
        choices=_DISPATCH + ("adv_estimator GRPO, norm_adv_by_std_in_grpo False",),
        conventions=dict(scale="none"),
        params=("data", "adv_estimator", "norm_adv_by_std_in_grpo")),
    Row(f"{RT}:compute_advantage", "group_advantages", _dispatch_outcome("RLOO"),
        label="RLOO",
        choices=_DISPATCH + ("adv_estimator RLOO: dispatched through get_adv_estimator_fn with "
                             "index = uid and config = algorithm",),
        conventions=dict(baseline="leave_one_out", scale="none"),
        params=("data", "adv_estimator", "config")),
)


def _domain(source):
    """Before 0.6.0 verl has no rollout rejection (mismatch_helper.py, later
    rollout_corr_helper.py, which can mask out a whole response): every response it builds
    keeps at least its first token, so a batch never holds an empty row."""
    ppo = os.path.join(source.root, "verl", "trainer", "ppo")
    if any(os.path.isfile(os.path.join(ppo, f)) for f in ("mismatch_helper.py",
                                                             "rollout_corr_helper.py")):
        return None
    return (("nonempty_rows",), "this release has no rollout rejection, so no response is "
                                "ever empty: cases with an empty row have it dropped")


TRAINER = Trainer(
    name="verl", package="verl", dist="verl", profile="verl", pinned="0.9.1", domain=_domain,
    stand_in=("tensordict",),       # verl.protocol's DataProto: no row uses it; ~1 s to import
    modules=(CA, TF, RC, LOSSES, RT), rows=ROWS, version_file="version/version",
    inventory=((CA, r"compute_.*|agg_loss|kl_penalty"), (TF, r"masked_whiten"),
               (LOSSES, r"ppo_loss|value_loss"), (RT, r"apply_kl_penalty|compute_advantage")),
    not_covered_why="no reference function yet",
    not_run=(("compute_policy_loss_bypass_mode",
              "wraps its weights in a DataProto (a TensorDict batch), which no row's adapter "
              "builds; its REINFORCE branch is compute_policy_loss_reinforce's loss with the weights of "
              "compute_rollout_correction_weights [token TIS], both rows below"),
             ("compute_policy_loss_clip_cov",
              "draws the tokens it un-clips with torch.randperm among its candidates: not a "
              "deterministic function of its inputs"),
             ("compute_multi_turn_optimal_token_baseline_advantage",
              "the optimal token baseline's multi-turn form (with rollout_is_weights and "
              "handle_zero_tail): a reference exists (optimal_token_baseline_advantages, the "
              "single-turn estimator's row) but no row yet runs this form"),
             ("value_loss",
              "the critic's loss on the training path: compute_value_loss (its row, per token) "
              "aggregated by loss_agg_mode with the global counts; no row runs this "
              "composition yet"),
             ("compute_pf_ppo_reweight_data",
              "resamples the batch with torch.multinomial on DataProto objects: a sampler, not "
              "a loss or an estimator")),
    runs=("PPO clip symmetric (0.2/0.2) and clip-higher (0.2/0.28), with the dual clip "
          "clip_ratio_c 3.0", "token-mean aggregation through global_batch_info, and agg_loss's "
          "token-mean, seq-mean-token-mean, seq-mean-token-sum and -sum-norm",
          "group advantages on ordinary, offset (1000 ± 0.1) and near-degenerate groups (σ 1e-4 to "
          "1e-2 around 0 and 1), groups of one, invalid rows", "GSPO and GMPO with sequence "
          "log-ratios up to ±30", "rollout correction token and sequence, TIS and IcePop mask",
          "multi-turn masks with holes for GAE and the returns"),
    does_not_run=("agg_loss's 'token-sum' mode", "dp_size > 1 (one rank)",
                  "the bypass-mode policy loss (its weights travel in a DataProto)",
                  "KL-Cov's default kl_cov_ratio 2e-4 (0.1 is run)", "clip-cov (random)"),
    notes=("agg_loss's 'token-sum' mode and kl_penalty's straight-through '+' forms (k3+: k3's "
           "value, k2's gradient) have no reference yet",
           "ppo_loss's entropy term (−entropy_coeff·agg_loss(entropy)) is not run: the rows "
           "pass no entropy, as the engine computes none at entropy_coeff 0 (its default); "
           "the entropy's own row is compute_entropy_loss"),
)

