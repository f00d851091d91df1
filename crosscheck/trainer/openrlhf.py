"""OpenRLHF's report card: openrlhf/models/{loss,utils}.py and the advantage code of
openrlhf/trainer/ppo_utils/experience_maker.py.

Facts read in OpenRLHF 0.11.2; each adapter only renames and reshapes:
- the package init imports flash_attn (a GPU build), so the card loads these modules by file;
- `PolicyLoss` / `ValueLoss` are modules configured in `__init__` (clip_eps_low/high,
  dual_clip, token_level_loss, policy_loss_type) whose forward aggregates with `aggregate_loss`
  and the global counts (`batch_num_tokens`, `global_batch_size`, from
  openrlhf/utils/loss_utils.py::get_loss_batch_info);
- the group baselines and the final whitening are statements inside
  `RemoteExperienceMaker.compute_advantages_and_returns`, which the card calls with a stand-in
  `self` (strategy.args, kl_ctl) on Experience-like batches of one-token responses.
"""
import inspect
import types

import numpy as np
import torch

from .card import (DoesNotFit, Known, NotInVersion, Row, StandInSelf, Trainer, owner_class,
                   per_sequence, per_token, source_of)

LOSS = "openrlhf.models.loss"
UTILS = "openrlhf.models.utils"
EM = "openrlhf.trainer.ppo_utils.experience_maker"
GAMMA, LAM = 0.99, 0.95


def _ns(**kw):
    return types.SimpleNamespace(**kw)


# ---- advantages -----------------------------------------------------------------------------

def _gae(fn, gamma=GAMMA, lam=LAM):
    def adapter(rewards, values, mask):
        return fn(None, values, rewards, mask, gamma, lam)
    return adapter


def _returns(fn, gamma=1.0):
    def adapter(rewards, mask):
        return fn(None, rewards, mask, gamma)
    return adapter


def _grouped(estimator):
    """compute_advantages_and_returns on one-token responses: each experience holds one
    sequence, its reward lands on its only token and, with γ = 1 and no KL, the advantage of
    that token is the shaped reward."""
    def make(fn):
        cls = owner_class(fn)
        flat = _flat_config(fn)

        def adapter(rewards, group_size):
            B = rewards.shape[0]
            if flat:
                args = StandInSelf(n_samples_per_prompt=int(group_size),
                                   advantage_estimator=estimator, gamma=1.0, lambd=1.0,
                                   no_advantage_std_norm=False, reward_clip_range=None,
                                   overlong_buffer_len=None)
            else:
                args = _ns(rollout=_ns(n_samples_per_prompt=int(group_size)),
                           algo=_ns(advantage=_ns(estimator=estimator, gamma=1.0, lambd=1.0,
                                                  no_std_norm=False)),
                           reward=_ns(clip_range=None, overlong_buffer_len=None,
                                      stop_properly_penalty_coef=None))
            me = StandInSelf(strategy=_ns(args=args), args=args, kl_ctl=_ns(value=0.0),
                             advantage_estimator=estimator)
            me.get_cumulative_returns = types.MethodType(cls.get_cumulative_returns, me)
            exps = [_ns(rewards=rewards[i:i + 1], index=[i], info={},
                        kl=rewards.new_zeros((1, 1)), action_mask=rewards.new_ones((1, 1)),
                        values=None) for i in range(B)]
            out = fn(me, exps)
            if isinstance(out, tuple):                    # (experiences, rewards) before 0.9
                out = out[0]
            return torch.cat([e.advantages[:, 0] for e in out])
        return adapter
    return make


def _flat_config(fn) -> bool:
    """Whether this release reads a flat strategy.args (args.n_samples_per_prompt, before
    0.10.2) rather than the nested one (args.rollout.n_samples_per_prompt)."""
    return "args.rollout." not in source_of(fn)


def _fits_grouped(fn):
    source = source_of(fn)
    if "n_samples_per_prompt" not in source:
        raise DoesNotFit("compute_advantages_and_returns does not read n_samples_per_prompt in "
                         "this version")
    if _flat_config(fn):
        return dict(choice="this release's flat strategy.args (before 0.10.2): "
                           "n_samples_per_prompt, advantage_estimator, gamma, lambd, "
                           "reward_clip_range")
    return {}


_GROUPED = ("RemoteExperienceMaker.compute_advantages_and_returns called with a stand-in self "
            "(strategy.args: n_samples_per_prompt = group_size, the estimator, γ = 1, no reward "
            "clip or length penalty; kl_ctl.value = 0; its own get_cumulative_returns)",
            "each sequence an Experience of one token whose reward is its score; the advantage "
            "read from that token",
            "groups are consecutive blocks of group_size, as OpenRLHF reshapes the rewards")


# ---- losses ---------------------------------------------------------------------------------

def _takes_counts(forward) -> bool:
    """Whether this release's PolicyLoss.forward takes the global counts (0.10.3 on); before,
    it normalises each micro-batch by its own tokens (masked_mean)."""
    return "batch_num_tokens" in inspect.signature(forward).parameters


def _policy(kind, output=0, **keywords):
    keywords = dict(dict(clip_eps_low=0.2, clip_eps_high=0.2), **keywords)

    def make(forward):
        cls = owner_class(forward)

        typed = dict(policy_loss_type=kind) if _init_takes(cls, "policy_loss_type") else {}

        def adapter(logp, old_logp, advantages, mask, n_tokens_global=None,
                    n_sequences_global=None):
            loss = cls(**typed, **keywords)
            out = loss(logp, old_logp, per_sequence(advantages, logp),
                       action_mask=mask.to(logp.dtype), batch_num_tokens=n_tokens_global,
                       global_batch_size=n_sequences_global)
            return out[output]

        def local(logp, old_logp, advantages, mask):          # before 0.10.3: no counts
            loss = cls(**typed, **keywords)
            return loss(logp, old_logp, per_sequence(advantages, logp),
                        action_mask=mask.to(logp.dtype))[output]
        return adapter if _takes_counts(forward) else local
    return make


def _init_takes(cls, name) -> bool:
    return name in inspect.signature(cls.__init__).parameters


def _fits_policy(kind, output=0, keywords=()):
    """What this release's PolicyLoss computes, where it differs from 0.11.2's:
    - before 0.10.3 forward takes no global counts: each micro-batch is normalised by its own
      tokens (masked_mean) and DeepSpeed averages the micro-batches' gradients (its backward
      divides the loss by the accumulation steps), so the row is judged under mean
      accumulation;
    - before 0.10.3 the ppo log-ratio is not clamped to ±20: judged unclamped."""
    def fits(forward):
        cls = owner_class(forward)
        if kind != "ppo" and not _init_takes(cls, "policy_loss_type"):
            raise NotInVersion(f"PolicyLoss has no policy_loss_type {kind!r} in this version "
                               f"(PPO only; policy_loss_type from 0.8.8)")
        for k in keywords:
            if not _init_takes(cls, k):
                raise NotInVersion(f"PolicyLoss has no {k} in this version")
        if output == 2 and "ppo_kl" not in source_of(forward):
            raise NotInVersion("PolicyLoss.forward returns no ppo_kl in this version")
        out, said = {}, []
        if output != 0:           # a metric: one micro-batch's, whatever the counts
            return out
        if not _takes_counts(forward):
            out["audit"] = dict(accumulation="mean")
            said.append("this release's PolicyLoss.forward takes no global counts (added in "
                        "0.10.3): each micro-batch is normalised by its own tokens and the "
                        "micro-batches' gradients are averaged (DeepSpeed's accumulation)")
        if kind == "ppo" and "clamp(min=-20.0, max=20.0)" not in source_of(forward):
            out["conventions"] = dict(log_ratio_clamp=None)
            said.append("this release does not clamp the ppo log-ratio: judged unclamped")
        if said:
            out["choice"] = "; ".join(said)
        return out
    return fits


def _metric(output):
    def make(forward):
        inner = _policy("ppo", output)(forward)

        def adapter(logp, old_logp, advantages, mask):
            return inner(logp, old_logp, advantages, mask)
        return adapter
    return make


def _ppo_kl(forward):
    inner = _policy("ppo", 2)(forward)

    def adapter(logp, old_logp, mask):
        return inner(logp, old_logp, logp.new_ones(logp.shape), mask)
    return adapter


def _value(forward):
    cls = owner_class(forward)

    def adapter(values, old_values, returns, mask):
        loss = cls(clip_eps=0.5)
        one = values.new_ones((1, 1))
        return per_token(lambda v, o, r: loss(v, o, r, action_mask=one), mask, values,
                         old_values, returns)
    return adapter


def _aggregate(token_level):
    def make(fn):
        def adapter(loss, mask, n_tokens_global=None, n_sequences_global=None):
            return fn(loss, mask.to(loss.dtype), token_level_loss=token_level,
                      batch_num_tokens=n_tokens_global, global_batch_size=n_sequences_global)
        return adapter
    return make


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return fn(logp, ref_logp, kl_estimator=kind) * mask
        return adapter
    return make


def _is_weights(level, mode):
    """PolicyLoss's rollout-correction coefficient of each token, read through its loss: with
    log_probs = old_log_probs the PPO ratio is 1, so an advantage of −1 at one valid token (0
    elsewhere) makes that token's PPO loss 1 and every other 0, and the token-mean over the
    batch's N valid tokens is coef/N. The coefficient itself reads old_log_probs against
    rollout_log_probs only, so the probe does not move it."""
    def make(forward):
        cls = owner_class(forward)

        keywords = _is_form(forward, level, mode)[0]
        counts = dict(batch_num_tokens=None) if _takes_counts(forward) else {}

        def adapter(logp, rollout_logp, mask):
            B, T = mask.shape
            zero = logp.new_zeros(())
            old = torch.where(mask.bool(), logp, zero)
            rollout = torch.where(mask.bool(), rollout_logp, zero)
            m = mask.to(logp.dtype)
            n = int(mask.sum())
            loss = cls(clip_eps_low=0.2, clip_eps_high=0.2, policy_loss_type="ppo", **keywords)
            out = logp.new_zeros((B, T))
            for b in range(B):
                for t in range(T):
                    if bool(mask[b, t]):
                        adv = logp.new_zeros((B, T))
                        adv[b, t] = -1.0
                        out[b, t] = loss(old, old, adv, action_mask=m, rollout_log_probs=rollout,
                                         **{k: n for k in counts})[0] * n
            return out
        return adapter
    return make


# How each release range configures the correction; _is_form gives, for one row, the
# constructor keywords, the conventions that differ from the row's and the choice in words.
# - 0.11.2 on: is_correction_level / _mode / _threshold;
# - 0.9.3-0.11.1: vllm_is_correction_type 'icepop' (token mask), 'tis' (token clamp) or
#   'seq-mask-tis' ('mis' in 0.9.3: the sequence's geometric-mean ratio gates, survivors keep
#   their token ratio), [low, high] as vllm_is_truncated_threshold;
# - 0.9.2: use_icepop (token mask) or not (token clamp), [low, high];
# - 0.8.9-0.9.1: vllm_is_truncated_threshold, an upper bound of the token truncation only
#   (0.8.9 turns it on by the threshold, 0.8.10 by enable_vllm_is_correction).
_OLD_IS_TYPE = {("token", "mask"): "icepop", ("token", "clip"): "tis",
                ("seq", "mask"): "seq-mask-tis"}


def _is_form(forward, level, mode):
    cls = owner_class(forward)
    if "rollout_log_probs" not in inspect.signature(forward).parameters:
        raise NotInVersion("PolicyLoss has no rollout importance-sampling correction in this "
                           "version (forward takes no rollout_log_probs)")
    if _init_takes(cls, "is_correction_level"):
        return dict(is_correction_level=level, is_correction_mode=mode,
                    is_correction_threshold=(0.5, 5.0)), {}, ""
    old = dict(enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 5.0])
    if _init_takes(cls, "vllm_is_correction_type"):
        kind = _OLD_IS_TYPE[level, mode]
        if kind == "seq-mask-tis" and '"seq-mask-tis"' not in source_of(cls):
            kind = "mis"                                     # its name in 0.9.3
        return dict(old, vllm_is_correction_type=kind), {}, \
            (f"this release's form (0.9.3-0.11.1): enable_vllm_is_correction, "
             f"vllm_is_correction_type={kind!r}, vllm_is_truncated_threshold [0.5, 5.0]")
    if _init_takes(cls, "use_icepop"):
        if level != "token":
            raise NotInVersion("this release's correction is token-level only (use_icepop or "
                               "the token clamp)")
        return dict(old, use_icepop=mode == "mask"), {}, \
            (f"this release's form (0.9.2): enable_vllm_is_correction, use_icepop="
             f"{mode == 'mask'}, vllm_is_truncated_threshold [0.5, 5.0]")
    if not _init_takes(cls, "vllm_is_truncated_threshold"):
        raise DoesNotFit("PolicyLoss.__init__ takes none of is_correction_level, "
                         "vllm_is_correction_type, use_icepop, vllm_is_truncated_threshold in "
                         "this version")
    if (level, mode) != ("token", "clip"):
        raise NotInVersion("this release's correction is the token-level truncation only "
                           "(vllm_is_truncated_threshold, an upper bound)")
    # 0.8.9 turns it on by the threshold alone; 0.8.10 added enable_vllm_is_correction
    on = dict(enable_vllm_is_correction=True) if _init_takes(cls, "enable_vllm_is_correction") \
        else {}
    return dict(on, vllm_is_truncated_threshold=5.0), dict(lower=None), \
        (f"this release's form (0.8.9-0.9.1): {'enable_vllm_is_correction, ' if on else ''}"
         f"vllm_is_truncated_threshold = 5.0, an upper bound only (no lower)")


def _fits_is(level, mode):
    def fits(forward):
        _, conventions, choice = _is_form(forward, level, mode)
        return dict(conventions=conventions, choice=choice)
    return fits


KL_COEF = 0.1


def _reward(fn):
    """compute_reward given one score per sequence and kl = logp − ref_logp (k1, as
    compute_approx_kl gives it before its ±10 clamp, whose rows are below)."""
    def adapter(scores, logp, ref_logp, mask):
        zero = logp.new_zeros(())
        kl = torch.where(mask.bool(), logp - ref_logp, zero)
        r = torch.where(mask.bool().any(-1), scores, zero)
        out = fn(r, KL_COEF, kl, action_mask=mask)
        return torch.where(mask.bool(), out, zero)
    return adapter


def _entropy(fn):
    """compute_entropy (the eager function torch.compile wraps: the card unwraps it)."""
    def adapter(logits, mask):
        zero = logits.new_zeros(())
        return torch.where(mask.bool(), fn(torch.where(mask.bool()[..., None], logits, zero)),
                           zero)
    return adapter


_LOSS = ("PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, policy_loss_type=...) called with "
         "action_mask as a float tensor",
         "the global counts passed as batch_num_tokens / global_batch_size, as "
         "openrlhf/utils/loss_utils.py::get_loss_batch_info computes them",
         "a per-sequence advantage broadcast over the response")

def _through_holes(data):
    """GAE as OpenRLHF computes it: a masked step before a row's last valid token is a step of
    reward 0 and value 0 (values and rewards multiplied by the mask, no skipping)."""
    m = np.asarray(data["mask"], dtype=bool)
    T = m.shape[-1]
    last = np.where(m.any(-1), T - 1 - np.argmax(m[..., ::-1], axis=-1), -1)
    filled = np.arange(T) <= last[..., None]
    return dict(data, mask=filled, rewards=np.where(m, data["rewards"], 0.0),
                values=np.where(m, data["values"], 0.0))


_HOLES = Known(
    "value", "defect",
    "get_advantages_and_returns multiplies values and rewards by the mask and bootstraps from "
    "values[:, t + 1] whatever the mask, so a masked step inside a row (a multi-turn "
    "observation span) counts as a step of reward 0 and value 0: the advantage before the "
    "hole is discounted by γλ per masked token and bootstraps from 0 instead of the next "
    "valid value. Right-padded rows are exact; OpenRLHF's agent mode builds such rows "
    "(samples_generator.py sets action_mask over several action ranges of one sample)",
    variant=dict(inputs=_through_holes))

def _returns_through_holes(data):
    """The discounted returns as OpenRLHF computes them: a masked step before a row's last
    valid token is a step of reward 0 (rewards multiplied by the mask, no skipping)."""
    m = np.asarray(data["mask"], dtype=bool)
    T = m.shape[-1]
    last = np.where(m.any(-1), T - 1 - np.argmax(m[..., ::-1], axis=-1), -1)
    filled = np.arange(T) <= last[..., None]
    return dict(data, mask=filled, rewards=np.where(m, data["rewards"], 0.0))


_RETURN_HOLES = Known(
    "value", "defect",
    "get_cumulative_returns multiplies the rewards by the mask and discounts through every "
    "position (cumulative_return = rewards[:, t] + gamma * cumulative_return, no skipping), "
    "so a masked step inside a row (a multi-turn observation span) is a step of reward 0: the "
    "return before the hole is discounted by γ once per masked token. At γ = 1 (what OpenRLHF "
    "forces for every estimator but 'reinforce') it is exact; under 'reinforce' with γ < 1, "
    "on the rows with holes OpenRLHF's agent mode builds, it is not",
    variant=dict(inputs=_returns_through_holes))


def _kl_clamp(fn):
    """The clamp compute_approx_kl applies: ±10 on the estimate since 0.8.6, none before."""
    if "clamp(min=-10, max=10)" in source_of(fn):
        return dict(conventions=dict(clamp=(None, 10.0)))
    return dict(conventions=dict(clamp=None),
                choice="this release does not clamp the estimate: judged unclamped")


# ---- the actor's loss on the training path ---------------------------------------------------
# ActorPPOTrainer.training_step (openrlhf/trainer/ray/ppo_actor.py) composes PolicyLoss, the KL
# loss (compute_approx_kl, aggregate_loss, times kl_ctl) and the entropy bonus, and hands the sum
# to strategy.backward: the card calls it unbound with a stand-in self whose strategy keeps the
# loss it is given.

ACTOR = "openrlhf.trainer.ray.ppo_actor"
KL_CTL = 0.1           # kl_ctl as ppo_train passes it (the KL controller's value)


class _Strategy:
    """DeepSpeed's strategy as training_step uses it on one process: backward keeps the loss
    (the card's output), the optimizer step does nothing."""
    ring_attn_group = None

    def __init__(self):
        self.loss = None

    def backward(self, loss, model, optimizer, **kwargs):
        self.loss = loss

    def optimizer_step(self, *args, **kwargs):
        pass

    def get_grad_norm(self, model):
        return 0.0


class _Actor:
    """The actor model: train() does nothing; called, it returns the log-probs under test (and
    an output without aux_loss or entropy)."""

    def __init__(self, logp):
        self.logp = logp

    def train(self):
        pass

    def __call__(self, *args, **kwargs):
        return self.logp, {}


class _Scheduler:
    @staticmethod
    def get_last_lr():
        return [0.0]


def _training_step(agg="token-mean", estimator="k3"):
    def make(fn):
        g = inspect.unwrap(fn).__globals__
        policy_loss, experience_class = g["PolicyLoss"], g["Experience"]

        def adapter(logp, old_logp, advantages, mask, ref_logp, n_tokens_global=None,
                    n_sequences_global=None):
            B, T = logp.shape
            args = _ns(actor=_ns(entropy_coef=None, aux_loss_coef=0.0),
                       train=_ns(dynamic_batch_enable=False),
                       algo=_ns(kl=_ns(use_loss=True, init_coef=KL_CTL, estimator=estimator,
                                       unbiased_gradient=False)))
            strategy = _Strategy()
            me = StandInSelf(
                args=args, strategy=strategy, actor=_Actor(logp), aux_loss=False,
                ema_model=None, actor_optim=None, actor_scheduler=_Scheduler(),
                actor_loss_fn=policy_loss(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None,
                                          token_level_loss=agg == "token-mean",
                                          policy_loss_type="ppo"))
            experience = experience_class(
                sequences=torch.zeros((B, 1 + T), dtype=torch.long),
                attention_mask=torch.ones((B, 1 + T), dtype=torch.long),
                action_mask=mask.bool(), action_log_probs=old_logp,
                base_action_log_probs=ref_logp, advantages=per_sequence(advantages, logp))
            fn(me, experience, KL_CTL, 0, dict(
                batch_num_tokens=mask.sum() if n_tokens_global is None else n_tokens_global,
                global_batch_size=B if n_sequences_global is None else n_sequences_global))
            return strategy.loss
        return adapter
    return make


def _kl_by_loss_agg_mode(adapter):
    """training_step as it would be with its KL term aggregated by loss_agg_mode (sequence mean
    of token means) like its policy term: the trainer's own loss, its token-mean KL term
    (compute_approx_kl and aggregate_loss, OpenRLHF's own) taken out and the sequence-mean one
    put in."""
    import sys

    def variant(logp, old_logp, advantages, mask, ref_logp, n_tokens_global=None,
                n_sequences_global=None):
        kl = sys.modules[UTILS].compute_approx_kl(logp, ref_logp, kl_estimator="k2")
        aggregate = sys.modules[LOSS].aggregate_loss
        n = mask.sum() if n_tokens_global is None else n_tokens_global
        B = mask.shape[0] if n_sequences_global is None else n_sequences_global
        m = mask.to(logp.dtype)
        token = aggregate(kl, m, token_level_loss=True, batch_num_tokens=n, global_batch_size=B)
        seq = aggregate(kl, m, token_level_loss=False, batch_num_tokens=n, global_batch_size=B)
        return adapter(logp, old_logp, advantages, mask, ref_logp, n_tokens_global,
                       n_sequences_global) + KL_CTL * (seq - token)
    return variant


_KL_BY_MODE = dict(adapt=_kl_by_loss_agg_mode)     # one variant, re-audited once for all three
_KL_TOKEN_MEAN = tuple(Known(
    check, "defect",
    "training_step aggregates the KL loss with aggregate_loss(kl, action_mask, "
    "**loss_batch_info) (ppo_actor.py:331), without token_level_loss, so it is a token mean "
    "whatever actor.loss_agg_mode says (the entropy bonus likewise, :347), while the policy "
    "loss follows "
    "loss_agg_mode. Under 'seq-mean-token-mean' ('every sequence weighs the same', its help) "
    "a long response's KL weighs more than a short one's, and the gradient of the sum is not "
    "that of one objective aggregated one way; under 'token-mean' (the default) it is exact",
    variant=_KL_BY_MODE) for check in ("value", "grad", "microbatch"))


_STEP = ("called unbound with a stand-in self: the actor returns the log-probs under test, "
         "strategy.backward keeps the loss it is given (the card's output); one process, no "
         "dynamic batch, no aux loss (a dense model), entropy_coef None (its default)",
         "actor_loss_fn = PolicyLoss(clip_eps_low 0.2, clip_eps_high 0.2, dual_clip None, "
         "token_level_loss = loss_agg_mode == 'token-mean', policy_loss_type 'ppo'), as "
         "ActorPPOTrainer.__init__ builds it; no rollout log-probs (no IS correction)",
         f"algo.kl.use_loss True, init_coef {KL_CTL}, kl_ctl {KL_CTL} (the controller's value "
         f"ppo_train passes), unbiased_gradient False",
         "loss_batch_info = the whole batch's token and sequence counts, as "
         "iter_grad_accum_global_norm gives them for the optimizer step's window",
         "an Experience of a one-token prompt and the response: action_log_probs = old_logp, "
         "base_action_log_probs = ref_logp, advantages broadcast over the response",
         "judged at float32: compute_approx_kl casts the log-probs to float32 (.float())")


_FORWARD = ("log_probs", "old_log_probs", "advantages", "action_mask")

ROWS = (
    Row(f"{EM}:RemoteExperienceMaker.get_advantages_and_returns", "gae", _gae,
        choices=("called unbound with self = None (it does not read self)",
                 f"γ = {GAMMA}, λ = {LAM} passed to both"),
        conventions=dict(gamma=GAMMA, lam=LAM),
        params=("values", "rewards", "action_mask", "gamma", "lambd"), known=(_HOLES,)),
    Row(f"{EM}:RemoteExperienceMaker.get_advantages_and_returns", "gae",
        lambda fn: _gae(fn, 1.0, 1.0), label="γ 1, λ 1",
        choices=("called unbound with self = None (it does not read self)",
                 "γ = λ = 1 passed to both (OpenRLHF's defaults for γ; a λ of 1 is allowed)"),
        conventions=dict(gamma=1.0, lam=1.0),
        params=("values", "rewards", "action_mask", "gamma", "lambd"), known=(_HOLES,)),
    Row(f"{EM}:RemoteExperienceMaker.get_cumulative_returns", "discounted_returns", _returns,
        choices=("called unbound with self = None (it does not read self)",
                 "γ = 1, which OpenRLHF forces for every estimator but 'reinforce'"),
        conventions=dict(gamma=1.0), params=("rewards", "action_mask", "gamma")),
    Row(f"{EM}:RemoteExperienceMaker.get_cumulative_returns", "discounted_returns",
        lambda fn: _returns(fn, GAMMA), label=f"γ {GAMMA}",
        choices=("called unbound with self = None (it does not read self)",
                 f"γ = {GAMMA}: the 'reinforce' estimator passes args.gamma as set, and a "
                 f"dropped discount shows only below 1"),
        conventions=dict(gamma=GAMMA), params=("rewards", "action_mask", "gamma"),
        known=(_RETURN_HOLES,)),
    Row(f"{EM}:RemoteExperienceMaker.compute_advantages_and_returns", "group_advantages",
        _grouped("group_norm"), label="group_norm", choices=_GROUPED,
        params=("experiences",), fits=_fits_grouped),
    Row(f"{EM}:RemoteExperienceMaker.compute_advantages_and_returns", "group_advantages",
        _grouped("rloo"), label="rloo", choices=_GROUPED,
        conventions=dict(baseline="leave_one_out", scale="none"), params=("experiences",),
        fits=_fits_grouped),
    Row(f"{EM}:RemoteExperienceMaker.compute_advantages_and_returns", "group_advantages",
        _grouped("dr_grpo"), label="dr_grpo", choices=_GROUPED,
        conventions=dict(scale="none"), params=("experiences",), fits=_fits_grouped),
    Row(f"{UTILS}:compute_entropy", "entropy", _entropy,
        choices=("logits 0 at padding, the entropy read at valid tokens",),
        params=("logits",)),
    Row(f"{UTILS}:compute_reward", "kl_rewards", _reward,
        choices=(f"kl_coef = {KL_COEF} (beta); kl = logp − ref_logp at valid tokens (k1)",
                 "one score per sequence (OpenRLHF's r); the output read at valid tokens (an "
                 "empty row's score lands on its last, masked position)"),
        conventions=dict(beta=KL_COEF, clamp=None),
        params=("r", "kl_coef", "kl", "action_mask")),
    *(Row(f"{LOSS}:PolicyLoss.forward", "rollout_is_weights", _is_weights(level, mode),
          label=f"is_correction {level} {mode}",
          choices=(f"PolicyLoss(is_correction_level={level!r}, is_correction_mode={mode!r}, "
                   "gating 'ratio', threshold (0.5, 5.0))", "each token's coefficient read "
                   "through the loss: log_probs = old_log_probs (ratio 1), advantage −1 at that "
                   "token and 0 elsewhere, token-mean over the batch's N valid tokens, times N",
                   "log-probs 0 at padding (finite in OpenRLHF's batches)"),
          conventions=dict(level={"token": "token", "seq": "sequence"}[level],
                           mode={"mask": "mask", "clip": "truncate"}[mode]),
          fits=_fits_is(level, mode),
          params=("log_probs", "old_log_probs", "advantages", "action_mask"))
      for level, mode in (("token", "mask"), ("seq", "mask"), ("token", "clip"))),
    Row(f"{LOSS}:ValueLoss.forward", "value_loss", _value,
        audit=dict(padding_checks=False),
        choices=("ValueLoss(clip_eps=0.5) evaluated one valid token at a time (a [1, 1] batch, "
                 "where aggregate_loss is the identity), the losses assembled into [B, T]; its "
                 "aggregation is aggregate_loss's rows",),
        params=("values", "old_values", "returns", "action_mask")),
    Row(f"{LOSS}:PolicyLoss.forward", "policy_objective", _policy("ppo"), label="ppo",
        choices=_LOSS, conventions=dict(loss="ppo", beta=0.0), params=_FORWARD,
        fits=_fits_policy("ppo")),
    Row(f"{LOSS}:PolicyLoss.forward", "policy_objective",
        _policy("ppo", clip_eps_high=0.28, dual_clip=3.0), label="ppo, 0.2/0.28, dual clip 3",
        choices=_LOSS + ("clip_eps_high 0.28 (clip-higher) and dual_clip 3.0: the bounds apart "
                         "and the dual-clip branch run",),
        conventions=dict(loss="ppo", beta=0.0, clip_low=0.2, clip_high=0.28, clip_c=3.0),
        params=_FORWARD, fits=_fits_policy("ppo", keywords=("dual_clip",))),
    Row(f"{LOSS}:PolicyLoss.forward", "policy_objective", _policy("gspo"), label="gspo",
        choices=_LOSS + ("policy_loss_type='gspo' forces token_level_loss=False (a "
                         "per-sequence mean)",),
        conventions=dict(loss="gspo", beta=0.0), params=_FORWARD, fits=_fits_policy("gspo")),
    Row(f"{LOSS}:PolicyLoss.forward", "clip_fraction", _metric(1), label="clip_ratio",
        choices=("the clip_ratio metric forward returns",), params=_FORWARD,
        fits=_fits_policy("ppo", 1)),
    Row(f"{LOSS}:PolicyLoss.forward", "approx_kl", _ppo_kl, label="ppo_kl",
        choices=("the ppo_kl metric forward returns (advantages of 1: it does not read them)",),
        params=_FORWARD, fits=_fits_policy("ppo", 2)),
) + tuple(
    Row(f"{LOSS}:aggregate_loss", "aggregate", _aggregate(token_level), label=mode,
        choices=(f"token_level_loss={token_level}", "the global counts passed as "
                 "batch_num_tokens / global_batch_size"),
        conventions=dict(mode=mode),
        params=("loss", "loss_mask", "token_level_loss", "batch_num_tokens",
                "global_batch_size"))
    for token_level, mode in ((True, "token-mean"), (False, "seq-mean-token-mean"))
) + tuple(
    Row(f"{UTILS}:compute_approx_kl", "kl_penalty", _kl(kind), label=kind,
        choices=("the per-token estimate times the mask (OpenRLHF masks it where it "
                 "aggregates)",),
        conventions=dict(kind=kind), fits=_kl_clamp,
        params=("log_probs", "log_probs_base", "kl_estimator"))
    for kind in ("k1", "k2", "k3")
)


ROWS = ROWS + (
    Row(f"{ACTOR}:ActorPPOTrainer.training_step", "policy_objective", _training_step(),
        label="ppo + k3 KL loss, token-mean",
        choices=_STEP + ("actor.loss_agg_mode 'token-mean' (its default), algo.kl.estimator "
                         "'k3' (the estimator its help recommends for a KL loss)",),
        conventions=dict(loss="ppo", agg="token-mean", beta=KL_CTL, kl_kind="k3",
                         kl_clamp=(None, 10.0)),
        audit=dict(precision="float32"),
        params=("self", "experience", "kl_ctl", "step", "loss_batch_info")),
    Row(f"{ACTOR}:ActorPPOTrainer.training_step", "policy_objective",
        _training_step("seq-mean-token-mean", "k2"),
        label="ppo + k2 KL loss, seq-mean-token-mean",
        choices=_STEP + ("actor.loss_agg_mode 'seq-mean-token-mean', algo.kl.estimator 'k2'",),
        conventions=dict(loss="ppo", agg="seq-mean-token-mean", beta=KL_CTL, kl_kind="k2",
                         kl_clamp=(None, 10.0)),
        known=_KL_TOKEN_MEAN,
        audit=dict(precision="float32"),
        params=("self", "experience", "kl_ctl", "step", "loss_batch_info")),
)


TRAINER = Trainer(
    name="openrlhf", package="openrlhf", dist="openrlhf", profile="openrlhf", pinned="0.11.2",
    modules=(LOSS, UTILS, EM, ACTOR), rows=ROWS,
    inventory=((LOSS, r"aggregate_loss|PolicyLoss\.forward|ValueLoss\.forward"),
               (UTILS, r"compute_approx_kl|compute_reward|masked_normalize|compute_entropy"),
               (EM, r"RemoteExperienceMaker\.(get_advantages_and_returns|"
                    r"get_cumulative_returns|compute_advantages_and_returns)"),
               (ACTOR, r"ActorPPOTrainer\.training_step")),
    runs=("PolicyLoss ppo symmetric (0.2/0.2) and clip-higher (0.2/0.28) with dual_clip 3.0, "
          "gspo", "the rollout correction token / sequence mask and token clip",
          "aggregate_loss in both modes with global counts", "GAE on right-padded rows and on "
          "multi-turn rows with holes", "group_norm, rloo and dr_grpo baselines (near-degenerate "
          "groups included)", "compute_approx_kl k1, k2, k3"),
    does_not_run=("dp_size > 1", "the token-level gspo variant", "masked_normalize",
                  "compute_advantages_and_returns with kl_ctl > 0 (the KL folded into the "
                  "rewards by compute_reward, whose own row runs: the estimator rows pass "
                  "kl_ctl.value 0)", "training_step's entropy bonus (entropy_coef None, its "
                  "default) and aux loss (a dense model)"),
    notes=("PolicyLoss's rollout importance-sampling correction multiplies the PPO loss by the "
           "coefficients of its is_correction rows (the policy rows run with it off, "
           "OpenRLHF's default); its 'binary_kl' and 'tv' gating have no reference yet",
           "compute_advantages_and_returns also whitens the advantages of 'gae', 'reinforce' "
           "and 'reinforce_baseline' over the batch (biased variance, rsqrt(max(var, 1e-8))); "
           "that statement block is not reached as a function"),
)
