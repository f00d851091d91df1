"""EasyR1's report card: verl/trainer/core_algos.py and verl/utils/torch_functional.py of a
checkout of hiyouga/EasyR1 (a fork of verl whose package is still `verl`), and the actor's loss
averaging in verl/workers/actor/dp_actor.py. A checkout only: `--path`.

Facts read in EasyR1 at commit b44b311b (each adapter only renames and reshapes; the verl
card's adapters are reused where EasyR1 kept verl's signature):
- the advantage estimators take `token_level_rewards` [B, T], `response_mask` and `index`
  (prompt uids) and return (advantages, returns); GRPO and RLOO assert that every group holds
  at least two responses ("GRPO needs rollout.n > 1.");
- `compute_policy_loss(old_log_probs, log_probs, advantages, response_mask, clip_ratio_low,
  clip_ratio_high, clip_ratio_dual, tau_positive, tau_negative, loss_type, loss_avg_mode)`
  averages each micro-batch by its own tokens ("token") or sequences ("seq") with
  `average_loss`; `DataParallelPPOActor.update_policy` then multiplies each micro-batch's loss by
  its token count · world size / the mini-batch's token count, so the summed micro-batch
  gradients are the mini-batch's token mean;
- `compute_kl` casts its inputs to float32.
"""
import sys

import torch

from . import verl as verl_card
from .verl import _float, _kl          # EasyR1's compute_kl(logp, ref_logp, kind) is verl's
from .card import NotInVersion, Row, StandInSelf, Trainer, per_token, zero_padding

CA = "verl.trainer.core_algos"
TF = "verl.utils.torch_functional"
ACTOR = "verl.workers.actor.dp_actor"
GAMMA, LAM = verl_card.GAMMA, verl_card.LAM


def _returns(gamma):
    def make(fn):
        def adapter(rewards, mask):
            _, returns = fn(token_level_rewards=zero_padding(mask, rewards),
                            response_mask=_float(mask, rewards),
                            gamma=gamma)
            return returns
        return adapter
    return make


def _policy(loss_type="default", mode="token", low=0.2, high=0.2, dual=3.0):
    def make(fn):
        def adapter(logp, old_logp, advantages, mask):
            adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
            loss, _ = fn(old_log_probs=old_logp, log_probs=logp, advantages=adv,
                         response_mask=_float(mask, logp), clip_ratio_low=low,
                         clip_ratio_high=high, clip_ratio_dual=dual, tau_positive=1.0,
                         tau_negative=1.05, loss_type=loss_type, loss_avg_mode=mode)
            return loss
        return adapter
    return make


def _value(fn):
    def adapter(values, old_values, returns, mask):
        one = values.new_ones((1, 1))
        return per_token(lambda v, o, r: fn(vpreds=v, returns=r, values=o, response_mask=one,
                                            cliprange_value=0.5, loss_avg_mode="token")[0],
                         mask, values, old_values, returns)
    return adapter


def _average(mode):
    def make(fn):
        def adapter(loss, mask):
            return fn(loss, _float(mask, loss), mode=mode)
        return adapter
    return make


def _actor(loss_type="default", mode="token"):
    """The statements of update_policy from compute_policy_loss to the rescaled loss, run on
    one micro-batch with the mini-batch's token count as total_response_tokens."""
    def make(block):
        def adapter(logp, old_logp, advantages, mask, n_tokens_global=None):
            ca = sys.modules[CA]
            config = StandInSelf(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_dual=3.0,
                                 tau_positive=1.0, tau_negative=1.05, loss_type=loss_type,
                                 loss_avg_mode=mode, use_kl_loss=False)
            m = _float(mask, logp)
            total = m.sum() if n_tokens_global is None else \
                torch.as_tensor(n_tokens_global, dtype=logp.dtype)
            adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
            return block(old_log_probs=old_logp, log_probs=logp, advantages=adv,
                         response_mask=m, model_inputs={}, metrics={},
                         self=StandInSelf(config=config, world_size=1),
                         total_response_tokens=total, compute_policy_loss=ca.compute_policy_loss,
                         compute_kl=ca.compute_kl, average_loss=ca.average_loss)
        return adapter
    return make


def _fits_loss_type(loss_type):
    def fit(fn):
        if f'"{loss_type}"' not in verl_card.source_of(fn):
            raise NotInVersion(f"compute_policy_loss has no loss_type {loss_type!r} in this "
                               f"version")
        return {}
    return fit


_GROUPS = ("one reward per sequence, placed as a one-token response (EasyR1 sums "
           "token_level_rewards over the response)",
           "index = group_ids as a NumPy array (EasyR1 passes prompt uids)",
           "the advantage read from that token")
_TWO = dict(domain=("groups_of_two",))
_LOSS = ("the whole micro-batch in one call, averaged by EasyR1's own average_loss",
         "clip_ratio_dual 3.0, tau_positive 1.0, tau_negative 1.05 (ActorConfig's defaults)")
_LOCAL = ("judged without micro-batches (accumulation 'none'): the function averages over "
          "the micro-batch it is given; the actor's rescaling to the mini-batch's token mean "
          "is DataParallelPPOActor.update_policy's row",)
_NO_MICRO = dict(accumulation="none")
LOSS_PARAMS = ("old_log_probs", "log_probs", "advantages", "response_mask", "clip_ratio_low",
               "clip_ratio_high", "clip_ratio_dual", "loss_type", "loss_avg_mode")
_PPO = dict(loss="ppo", beta=0.0, clip_c=3.0, log_ratio_clamp=20.0)
BLOCK = ("pg_loss", "loss", ("loss",))

ROWS = (
    Row(f"{CA}:compute_gae_advantage_return", "gae", verl_card._gae,
        label=f"γ {GAMMA}, λ {LAM}",
        choices=(f"γ = {GAMMA}, λ = {LAM}: discounting that a dropped or misplaced factor "
                 "changes", "values and token rewards 0 at masked positions; response_mask a "
                 "float tensor", "advantages read as returns − values (it whitens its "
                 "advantages inside; masked_whiten has its own row)"),
        conventions=dict(gamma=GAMMA, lam=LAM),
        params=("token_level_rewards", "values", "response_mask", "gamma", "lam")),
    Row(f"{CA}:compute_gae_advantage_return", "gae", lambda fn: verl_card._gae(fn, 1.0, 1.0),
        label="γ 1, λ 1", choices=("γ = λ = 1.0 (AlgorithmConfig's defaults)",
                                   "advantages read as returns − values"),
        conventions=dict(gamma=1.0, lam=1.0),
        params=("token_level_rewards", "values", "response_mask", "gamma", "lam")),
    Row(f"{CA}:compute_grpo_outcome_advantage", "group_advantages",
        lambda fn: verl_card._outcome(fn, eps=1e-6), choices=_GROUPS + ("eps 1e-6",),
        conventions=dict(ddof=1, eps=1e-6, scale="group"), audit=dict(domain=("groups_of_two",)),
        params=("token_level_rewards", "response_mask", "index", "eps")),
    Row(f"{CA}:compute_grpo_passk_outcome_advantage", "passk_advantages",
        lambda fn: verl_card._outcome(fn, eps=1e-6), choices=_GROUPS + ("eps 1e-6",),
        conventions=dict(eps=1e-6, scale="group"), audit=dict(domain=("groups_of_two",)),
        params=("token_level_rewards", "response_mask", "index", "eps")),
    Row(f"{CA}:compute_rloo_outcome_advantage", "group_advantages", verl_card._outcome,
        choices=_GROUPS, conventions=dict(baseline="leave_one_out", scale="none"),
        audit=dict(domain=("groups_of_two",)),
        params=("token_level_rewards", "response_mask", "index")),
    Row(f"{CA}:compute_reinforce_plus_plus_outcome_advantage", "discounted_returns",
        _returns(GAMMA), label=f"γ {GAMMA}",
        choices=("the returns output (its advantages are these whitened by masked_whiten)",
                 f"gamma {GAMMA}", "token rewards 0 at padding, as EasyR1's reward managers "
                 "leave them; right-padded responses (single-turn: no holes)"),
        conventions=dict(gamma=GAMMA), audit=dict(domain=("right_padded",)),
        params=("token_level_rewards", "response_mask", "gamma")),
    Row(f"{CA}:compute_remax_outcome_advantage", "remax_advantages", verl_card._remax,
        choices=("token rewards 0 at padding; the advantages read at valid tokens",
                 "one outcome reward per response at its last valid token, as EasyR1's reward "
                 "managers place it (ReMax's sum − baseline at every token is the "
                 "reward-to-go − baseline only there)"),
        audit=dict(domain=("outcome_rewards",)),
        params=("token_level_rewards", "reward_baselines", "response_mask")),
    Row(f"{CA}:compute_rewards", "kl_rewards", verl_card._rewards,
        choices=(f"kl_ratio = {verl_card.KL_RATIO}; a score per sequence placed at its last "
                 "valid token as token_level_scores", "log-probs 0 at padding"),
        conventions=dict(beta=verl_card.KL_RATIO, kind="k1"),
        params=("token_level_scores", "log_probs", "ref_log_probs", "kl_ratio")),
    Row(f"{CA}:compute_policy_loss", "policy_objective", _policy(), label="ppo, token",
        choices=_LOSS + ("loss_type 'default', clip 0.2/0.2, loss_avg_mode 'token'",) + _LOCAL,
        conventions=_PPO, audit=_NO_MICRO, params=LOSS_PARAMS),
    Row(f"{CA}:compute_policy_loss", "policy_objective", _policy(high=0.28),
        label="ppo, 0.2/0.28", choices=_LOSS + ("clip 0.2/0.28",) + _LOCAL,
        conventions=dict(_PPO, clip_low=0.2, clip_high=0.28), audit=_NO_MICRO,
        params=LOSS_PARAMS),
    Row(f"{CA}:compute_policy_loss", "policy_objective", _policy(mode="seq"),
        label="ppo, seq", choices=_LOSS + ("loss_avg_mode 'seq'",) + _LOCAL,
        conventions=dict(_PPO, agg="seq-mean-token-mean", empty_rows="include"),
        audit=_NO_MICRO,
        params=LOSS_PARAMS),
    Row(f"{CA}:compute_policy_loss", "policy_objective", _policy("cispo", high=4.0),
        label="cispo", choices=_LOSS + ("loss_type 'cispo', clip_ratio_high 4.0: the weight "
                                        "clipped to [0.8, 5.0] and detached",) + _LOCAL,
        conventions=dict(loss="cispo", beta=0.0, bound="relative", clip_low=0.2,
                         clip_high=4.0), audit=_NO_MICRO, params=LOSS_PARAMS,
        fits=_fits_loss_type("cispo")),
    Row(f"{CA}:compute_policy_loss", "policy_objective", _policy("sapo"), label="sapo",
        choices=_LOSS + ("loss_type 'sapo'",) + _LOCAL,
        conventions=dict(loss="sapo", beta=0.0, log_ratio_clamp=20.0, agg="token-mean"),
        audit=_NO_MICRO,
        params=LOSS_PARAMS, fits=_fits_loss_type("sapo")),
    Row(f"{ACTOR}:DataParallelPPOActor.update_policy", "policy_objective", _actor(),
        label="the actor's averaging, token", block=BLOCK,
        choices=("the statements from compute_policy_loss's call to the rescaled loss "
                 "(loss · Σ response_mask · world_size / total_response_tokens), run on each "
                 "micro-batch with a stand-in self (world_size 1, ActorConfig's loss fields, "
                 "use_kl_loss False)", "total_response_tokens = the mini-batch's token count, "
                 "as update_policy all-reduces it"),
        conventions=_PPO, params=()),
    Row(f"{CA}:compute_value_loss", "value_loss", _value, audit=dict(padding_checks=False),
        choices=("evaluated one valid token at a time (a [1, 1] batch, where average_loss is "
                 "the identity)", "cliprange_value 0.5"),
        conventions=dict(clip=0.5),
        params=("vpreds", "returns", "values", "response_mask", "cliprange_value")),
) + tuple(
    Row(f"{CA}:compute_kl", "kl_penalty", _kl(name), label=name,
        choices=("the per-token estimate times the mask", "judged at float32: compute_kl "
                 "casts its inputs with .float()"),
        conventions=dict(kind=kind, clamp=clamp), audit=dict(precision="float32"),
        params=("log_probs", "ref_log_probs", "kl_penalty"))
    for name, kind, clamp in (("kl", "k1", None), ("abs", "abs", None), ("mse", "k2", None),
                              ("low_var_kl", "k3", (20.0, 10.0)))
) + tuple(
    Row(f"{CA}:average_loss", "aggregate", _average(mode), label=mode,
        choices=("eps 1e-8 (its default) in the denominators",),
        conventions=dict(mode=agg, empty_rows="include"), audit=_NO_MICRO,
        params=("values", "mask", "mode"))
    for mode, agg in (("token", "token-mean"), ("seq", "seq-mean-token-mean"))
) + (
    Row(f"{TF}:masked_whiten", "whiten", verl_card._whiten,
        choices=("mask as a float tensor",), params=("values", "mask")),
)

TRAINER = Trainer(
    name="easyr1", package="verl", dist="EasyR1", profile="verl", pinned="b44b311b",
    installable=False, modules=(CA, TF, ACTOR), rows=ROWS,
    inventory=((CA, r"compute_.*|average_loss|\w+KLController\.update"), (TF, r"masked_whiten"),
               (ACTOR, r"DataParallelPPOActor\.update_policy")),
    not_run=(("compute_advantage_return", "dispatches to the estimators by name (each has a "
              "row)"),),
    runs=(f"GAE at γ {GAMMA}, λ {LAM} and at 1, 1", "GRPO, pass@k and RLOO on groups of any "
          "sizes ≥ 2",
          f"REINFORCE++'s returns at γ {GAMMA}", "PPO with dual clip 3, clip 0.2/0.2 and "
          "0.2/0.28, token and seq averaging; CISPO, SAPO", "the actor's rescaling "
          "of micro-batch losses to the mini-batch's token mean",
          "KL kl, abs, mse, low_var_kl", "the value loss with cliprange 0.5"),
    does_not_run=("groups of one (GRPO and RLOO assert on them)", "gspo and gspo_token: "
                  "EasyR1 clamps the sequence log-ratio to ±20 before exp, which the "
                  "reference's gspo_loss has no convention for (its log_ratio_max is 10 or "
                  "none); a row awaits that convention",
                  "compute_kl's 'full' (on logits)", "use_kl_loss in the actor's block",
                  "world_size > 1"),
    notes=("EasyR1 keeps verl's package name: the checkout's verl/ is loaded by file, never an "
           "installed verl",),
)
