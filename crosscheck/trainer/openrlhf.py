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
import types

import numpy as np
import torch

from .card import Known, Row, Trainer, owner_class, per_sequence, per_token, source_of

LOSS = "openrlhf.models.loss"
UTILS = "openrlhf.models.utils"
EM = "openrlhf.trainer.ppo_utils.experience_maker"
GAMMA, LAM = 0.99, 0.95


def _ns(**kw):
    return types.SimpleNamespace(**kw)


# ---- advantages -----------------------------------------------------------------------------

def _gae(fn):
    def adapter(rewards, values, mask):
        return fn(None, values, rewards, mask, GAMMA, LAM)
    return adapter


def _returns(fn):
    def adapter(rewards, mask):
        return fn(None, rewards, mask, 1.0)
    return adapter


def _grouped(estimator):
    """compute_advantages_and_returns on one-token responses: each experience holds one
    sequence, its reward lands on its only token and, with γ = 1 and no KL, the advantage of
    that token is the shaped reward."""
    def make(fn):
        cls = owner_class(fn)

        def adapter(rewards, group_size):
            B = rewards.shape[0]
            args = _ns(rollout=_ns(n_samples_per_prompt=int(group_size)),
                       algo=_ns(advantage=_ns(estimator=estimator, gamma=1.0, lambd=1.0,
                                              no_std_norm=False)),
                       reward=_ns(clip_range=None, overlong_buffer_len=None,
                                  stop_properly_penalty_coef=None))
            me = _ns(strategy=_ns(args=args), kl_ctl=_ns(value=0.0),
                     advantage_estimator=estimator)
            me.get_cumulative_returns = types.MethodType(cls.get_cumulative_returns, me)
            exps = [_ns(rewards=rewards[i:i + 1], index=[i], info={},
                        kl=rewards.new_zeros((1, 1)), action_mask=rewards.new_ones((1, 1)),
                        values=None) for i in range(B)]
            out = fn(me, exps)
            return torch.cat([e.advantages[:, 0] for e in out])
        return adapter
    return make


_GROUPED = ("RemoteExperienceMaker.compute_advantages_and_returns called with a stand-in self "
            "(strategy.args: n_samples_per_prompt = group_size, the estimator, γ = 1, no reward "
            "clip or length penalty; kl_ctl.value = 0; its own get_cumulative_returns)",
            "each sequence an Experience of one token whose reward is its score; the advantage "
            "read from that token",
            "groups are consecutive blocks of group_size, as OpenRLHF reshapes the rewards")


# ---- losses ---------------------------------------------------------------------------------

def _policy(kind, output=0, **keywords):
    keywords = dict(dict(clip_eps_low=0.2, clip_eps_high=0.2), **keywords)

    def make(forward):
        cls = owner_class(forward)

        def adapter(logp, old_logp, advantages, mask, n_tokens_global=None,
                    n_sequences_global=None):
            loss = cls(policy_loss_type=kind, **keywords)
            out = loss(logp, old_logp, per_sequence(advantages, logp),
                       action_mask=mask.to(logp.dtype), batch_num_tokens=n_tokens_global,
                       global_batch_size=n_sequences_global)
            return out[output]
        return adapter
    return make


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

        def adapter(logp, rollout_logp, mask):
            B, T = mask.shape
            zero = logp.new_zeros(())
            old = torch.where(mask.bool(), logp, zero)
            rollout = torch.where(mask.bool(), rollout_logp, zero)
            m = mask.to(logp.dtype)
            n = int(mask.sum())
            loss = cls(clip_eps_low=0.2, clip_eps_high=0.2, policy_loss_type="ppo",
                       is_correction_level=level, is_correction_mode=mode,
                       is_correction_threshold=(0.5, 5.0))
            out = logp.new_zeros((B, T))
            for b in range(B):
                for t in range(T):
                    if bool(mask[b, t]):
                        adv = logp.new_zeros((B, T))
                        adv[b, t] = -1.0
                        out[b, t] = loss(old, old, adv, action_mask=m, rollout_log_probs=rollout,
                                         batch_num_tokens=n)[0] * n
            return out
        return adapter
    return make


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
    """compute_entropy is wrapped by torch.compile; the adapter runs the Python function it
    wraps, eagerly (the same statements, without a compiler)."""
    eager = getattr(fn, "_torchdynamo_orig_callable", fn)

    def adapter(logits, mask):
        zero = logits.new_zeros(())
        return torch.where(mask.bool(), eager(torch.where(mask.bool()[..., None], logits, zero)),
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

def _kl_clamp(fn):
    """The clamp compute_approx_kl applies: ±10 on the estimate since 0.8.6, none before."""
    if "clamp(min=-10, max=10)" in source_of(fn):
        return dict(conventions=dict(clamp=(None, 10.0)))
    return dict(conventions=dict(clamp=None),
                choice="this release does not clamp the estimate: judged unclamped")


_FORWARD = ("log_probs", "old_log_probs", "advantages", "action_mask", "batch_num_tokens",
            "global_batch_size")

ROWS = (
    Row(f"{EM}:RemoteExperienceMaker.get_advantages_and_returns", "gae", _gae,
        choices=("called unbound with self = None (it does not read self)",
                 f"γ = {GAMMA}, λ = {LAM} passed to both"),
        conventions=dict(gamma=GAMMA, lam=LAM),
        params=("values", "rewards", "action_mask", "gamma", "lambd"), known=(_HOLES,)),
    Row(f"{EM}:RemoteExperienceMaker.get_cumulative_returns", "discounted_returns", _returns,
        choices=("called unbound with self = None (it does not read self)",
                 "γ = 1, which OpenRLHF forces for every estimator but 'reinforce'"),
        conventions=dict(gamma=1.0), params=("rewards", "action_mask", "gamma")),
    Row(f"{EM}:RemoteExperienceMaker.compute_advantages_and_returns", "group_advantages",
        _grouped("group_norm"), label="group_norm", choices=_GROUPED,
        params=("experiences",)),
    Row(f"{EM}:RemoteExperienceMaker.compute_advantages_and_returns", "group_advantages",
        _grouped("rloo"), label="rloo", choices=_GROUPED,
        conventions=dict(baseline="leave_one_out", scale="none"), params=("experiences",)),
    Row(f"{EM}:RemoteExperienceMaker.compute_advantages_and_returns", "group_advantages",
        _grouped("dr_grpo"), label="dr_grpo", choices=_GROUPED,
        conventions=dict(scale="none"), params=("experiences",)),
    Row(f"{UTILS}:compute_entropy", "entropy", _entropy,
        choices=("the function torch.compile wraps, run eagerly (_torchdynamo_orig_callable)",
                 "logits 0 at padding, the entropy read at valid tokens"),
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
          params=("log_probs", "old_log_probs", "advantages", "action_mask",
                  "rollout_log_probs", "batch_num_tokens"))
      for level, mode in (("token", "mask"), ("seq", "mask"), ("token", "clip"))),
    Row(f"{LOSS}:ValueLoss.forward", "value_loss", _value,
        audit=dict(padding_checks=False),
        choices=("ValueLoss(clip_eps=0.5) evaluated one valid token at a time (a [1, 1] batch, "
                 "where aggregate_loss is the identity), the losses assembled into [B, T]; its "
                 "aggregation is aggregate_loss's rows",),
        params=("values", "old_values", "returns", "action_mask")),
    Row(f"{LOSS}:PolicyLoss.forward", "policy_objective", _policy("ppo"), label="ppo",
        choices=_LOSS, conventions=dict(loss="ppo", beta=0.0), params=_FORWARD),
    Row(f"{LOSS}:PolicyLoss.forward", "policy_objective",
        _policy("ppo", clip_eps_high=0.28, dual_clip=3.0), label="ppo, 0.2/0.28, dual clip 3",
        choices=_LOSS + ("clip_eps_high 0.28 (clip-higher) and dual_clip 3.0: the bounds apart "
                         "and the dual-clip branch run",),
        conventions=dict(loss="ppo", beta=0.0, clip_low=0.2, clip_high=0.28, clip_c=3.0),
        params=_FORWARD),
    Row(f"{LOSS}:PolicyLoss.forward", "policy_objective", _policy("gspo"), label="gspo",
        choices=_LOSS + ("policy_loss_type='gspo' forces token_level_loss=False (a "
                         "per-sequence mean)",),
        conventions=dict(loss="gspo", beta=0.0), params=_FORWARD),
    Row(f"{LOSS}:PolicyLoss.forward", "clip_fraction", _metric(1), label="clip_ratio",
        choices=("the clip_ratio metric forward returns",), params=_FORWARD),
    Row(f"{LOSS}:PolicyLoss.forward", "approx_kl", _ppo_kl, label="ppo_kl",
        choices=("the ppo_kl metric forward returns (advantages of 1: it does not read them)",),
        params=_FORWARD),
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


TRAINER = Trainer(
    name="openrlhf", package="openrlhf", dist="openrlhf", profile="openrlhf", pinned="0.11.2",
    modules=(LOSS, UTILS, EM), rows=ROWS,
    inventory=((LOSS, r"aggregate_loss|PolicyLoss\.forward|ValueLoss\.forward"),
               (UTILS, r"compute_approx_kl|compute_reward|masked_normalize|compute_entropy"),
               (EM, r"RemoteExperienceMaker\.(get_advantages_and_returns|"
                    r"get_cumulative_returns|compute_advantages_and_returns)")),
    runs=("PolicyLoss ppo symmetric (0.2/0.2) and clip-higher (0.2/0.28) with dual_clip 3.0, "
          "gspo", "the rollout correction token / sequence mask and token clip",
          "aggregate_loss in both modes with global counts", "GAE on right-padded rows and on "
          "multi-turn rows with holes", "group_norm, rloo and dr_grpo baselines (near-degenerate "
          "groups included)", "compute_approx_kl k1, k2, k3"),
    does_not_run=("dp_size > 1", "the token-level gspo variant", "masked_normalize"),
    notes=("PolicyLoss's rollout importance-sampling correction multiplies the PPO loss by the "
           "coefficients of its is_correction rows (the policy rows run with it off, "
           "OpenRLHF's default); its 'binary_kl' and 'tv' gating have no reference yet",
           "compute_advantages_and_returns also whitens the advantages of 'gae', 'reinforce' "
           "and 'reinforce_baseline' over the batch (biased variance, rsqrt(max(var, 1e-8))); "
           "that statement block is not reached as a function"),
)
