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

import numpy as np

from .card import Known, Row, Trainer, per_sequence, per_token

CA = "verl.trainer.ppo.core_algos"
TF = "verl.utils.torch_functional"
GAMMA, LAM = 0.99, 0.95       # the profile's defaults (1, 1) would hide any discounting error


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


def _gae(fn):
    def adapter(rewards, values, mask):
        _, returns = fn(token_level_rewards=rewards, values=values,
                        response_mask=_float(mask, rewards), gamma=GAMMA, lam=LAM)
        return returns - values, returns
    return adapter


def _returns(fn):
    class Config:                       # the AlgoConfig field the estimator reads
        gamma = 1.0

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
    values = dict(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                  tau_pos=1.0, tau_neg=1.05, global_batch_info=info, **fields)
    for k, v in values.items():
        object.__setattr__(cfg, k, v)
    return cfg


def _policy(fn, output=None):
    config_class = inspect.unwrap(fn).__globals__["ActorConfig"]

    def adapter(logp, old_logp, advantages, mask, n_tokens_global=None,
                n_sequences_global=None):
        loss, metrics = fn(old_log_prob=old_logp, log_prob=logp,
                           advantages=per_sequence(advantages, logp),
                           response_mask=mask.bool(), loss_agg_mode="token-mean",
                           config=_actor_config(config_class, n_tokens_global,
                                                n_sequences_global))
        return loss if output is None else metrics[output]
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
        return adapter
    return make


SCALE = 4.0        # loss_scale_factor: "set this to a constant" (agg_loss's docstring)


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return fn(logp, ref_logp, kind) * _float(mask, logp)
        return adapter
    return make


_CLAMPED = Known(
    "value", "documented choice",
    "verl clamps the log-ratio to ±20 before exp (core_algos.py: 'Clamp negative_approx_kl for "
    "stability') and logs ppo_kl from the clamped values, so the metric saturates once "
    "|log π − log π_old| > 20; ordinary updates never reach it")

_MICRO_MEAN = Known(
    "microbatch", "defect",
    "the deprecated compute_policy_loss aggregates each micro-batch by its own token count "
    "(agg_loss without batch_num_tokens), so averaging micro-batch losses weights a token of a "
    "short micro-batch more than one of a long micro-batch; the registered 'vanilla' loss "
    "normalises by the global count (global_batch_info) and is exact. It bites whenever "
    "micro-batches hold different numbers of valid tokens")

ROWS = (
    Row(f"{CA}:compute_gae_advantage_return", "gae", _gae,
        choices=(f"γ = {GAMMA}, λ = {LAM} passed to both (the profile's 1, 1 hide discounting)",
                 "response_mask as a float tensor, as verl builds it",
                 "advantages read as returns − values: the function whitens its advantages "
                 "inside and defines returns = advantages + values; the whitening is "
                 "masked_whiten's row"),
        conventions=dict(gamma=GAMMA, lam=LAM),
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
    Row(f"{CA}:compute_value_loss", "value_loss", _value,
        choices=("evaluated one valid token at a time (a [1, 1] batch, where agg_loss is the "
                 "identity), the losses assembled into [B, T]; its aggregation is agg_loss's rows",
                 "cliprange_value = 0.5, as the profile's"),
        params=("vpreds", "returns", "values", "response_mask", "cliprange_value")),
    Row(f"{TF}:masked_whiten", "whiten", _whiten,
        choices=("mask as a float tensor",), params=("values", "mask")),
    Row(f"{CA}:compute_policy_loss_vanilla", "policy_objective", _policy, label="ppo",
        choices=_POLICY, conventions=dict(loss="ppo", beta=0.0),
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
        choices=_POLICY, conventions=dict(loss="gspo", beta=0.0),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
    Row(f"{CA}:compute_policy_loss_sapo", "policy_objective", _policy, label="sapo",
        choices=_POLICY + ("tau_pos 1.0, tau_neg 1.05 (ActorConfig's defaults); it aggregates "
                           "seq-mean-token-mean whatever loss_agg_mode says",),
        conventions=dict(loss="sapo", beta=0.0, agg="seq-mean-token-mean"),
        params=("old_log_prob", "log_prob", "advantages", "response_mask", "config")),
) + tuple(
    Row(f"{CA}:agg_loss", "aggregate", _agg(mode), label=mode,
        choices=("the global counts passed as batch_num_tokens / global_batch_size, as "
                 "ppo_loss does through global_batch_info",),
        conventions=dict(mode=mode),
        params=("loss_mat", "loss_mask", "loss_agg_mode", "batch_num_tokens",
                "global_batch_size"))
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
) + (
    Row(f"{CA}:agg_loss", "aggregate", _agg("seq-mean-token-sum-norm", loss_scale_factor=SCALE),
        label="seq-mean-token-sum-norm",
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

TRAINER = Trainer(
    name="verl", package="verl", dist="verl", profile="verl", pinned="0.9.1",
    modules=(CA, TF), rows=ROWS, version_file="version/version",
    inventory=((CA, r"compute_.*|agg_loss|kl_penalty"), (TF, r"masked_whiten")),
    not_covered_why="no reference function yet",
    notes=("agg_loss's 'token-sum' mode and kl_penalty's straight-through '+' forms (k3+: k3's "
           "value, k2's gradient) have no reference yet",
           "verl/workers/utils/losses.py::ppo_loss composes the policy loss, agg_loss and "
           "kl_penalty rows above on TensorDict batches; it is not called directly"),
)
