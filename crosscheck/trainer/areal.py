"""AReaL's report card: areal/utils/functional/functional.py (the actor, SAPO and critic losses)
areal/utils/data.py (`KLEstimator`, `Normalization`) and M2PO's mask in
areal/trainer/ppo/actor.py.

Facts read in areal 1.0.4:
- `import areal` runs `areal.infra` (aiohttp, ray, launchers); the math files import
  `areal.api.cli_args` (hydra, omegaconf, uvloop) and `current_platform`, an object that
  `areal/infra/platforms/__init__.py` builds itself, so the card loads them by file and runs
  only that `__init__` (crosscheck/trainer/loading.py);
- `ppo_actor_loss_fn(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip,
  loss_mask, eps_clip_higher, c_clip, rejection_sampling, importance_sampling_level)`: PPO's
  clipped loss with r = π_θ / π_prox, no log-ratio clamp, the dual clip only when c_clip is
  set, summed over the (bool) mask and divided by the call's valid-token count; the behaviour
  weight π_prox / π_behave enters only with `rejection_sampling` (None by default: then
  `old_logprobs` is unused, and without the decoupled loss the actor passes the behaviour
  log-probs as the proximal ones); at importance_sampling_level 'sequence' the ratio is the
  exp of each sequence's mean log-ratio (GSPO), the loss still a token mean;
- `_apply_m2po_masking(old_logp, prox_logp, loss_mask, m2_threshold)`: M2PO's mask over the
  call's valid tokens, the squared behaviour-to-proximal log-ratio, the largest dropped until
  the mean of the rest is below the threshold (`grpo_loss_fn` replaces loss_mask with it);
- `sapo_loss_fn`: SAPO's gate σ(τ(r − 1))·4/τ times A, a token mean;
- `ppo_critic_loss_fn` asserts float32 inputs; `KLEstimator` computes in float32 and clamps
  every estimator's output to ±10; `Normalization` computes in float64 and returns float32.
"""
import inspect

import torch

from .card import Known, Row, StandInSelf, Trainer, per_sequence, per_token, zero_padding

F = "areal.utils.functional.functional"
A = "areal.trainer.ppo.actor"
D = "areal.utils.data"


def _ppo(**settings):
    def make(fn):
        def adapter(logp, old_logp, advantages, mask):
            loss, _ = fn(logprobs=logp, proximal_logprobs=old_logp, old_logprobs=old_logp,
                         advantages=per_sequence(advantages, logp), eps_clip=0.2,
                         loss_mask=mask.bool(), **settings)
            return loss
        return adapter
    return make


def _decoupled(**rejection):
    """ppo_actor_loss_fn with the decoupled loss's three log-prob inputs and, where `rejection`
    is given, RejectionSamplingConfig(**rejection). Its output is a token mean J = Σ_t l_t / N;
    the adapter returns the per-token loss. Each l_t is positively homogeneous of degree 1 in
    its own advantage A_t (the clip, the dual clip and the behaviour weight do not scale with
    A), so by Euler's identity l_t = N·A_t·∂J/∂A_t: one call, and its gradient in A kept
    differentiable in logp (create_graph). N is the call's valid-token count (AReaL counts
    them before any rejection)."""
    def make(fn):
        config = fn.__globals__["RejectionSamplingConfig"]

        def adapter(logp, prox_logp, behave_logp, advantages, mask):
            import torch
            m = mask.bool()
            a = per_sequence(advantages, logp).detach().clone().requires_grad_(True)
            loss, _ = fn(logprobs=logp, proximal_logprobs=prox_logp, old_logprobs=behave_logp,
                         advantages=a, eps_clip=0.2, loss_mask=m,
                         rejection_sampling=config(**rejection) if rejection else None)
            (d,) = torch.autograd.grad(loss, a, create_graph=True, allow_unused=True)
            if d is None:                        # no valid token: the loss reads no advantage
                return logp.new_zeros(logp.shape) * logp
            n = max(int(m.sum()), 1)
            return torch.where(m, n * a.detach() * d, logp.new_zeros(()))
        return adapter
    return make


def _m2po(fn):
    """_apply_m2po_masking(old_logp, prox_logp, loss_mask, m2_threshold) as grpo_loss_fn calls
    it: the behaviour log-probs first, the proximal second, the mask as bool, τ 0.04; its bool
    mask as 0/1."""
    def adapter(logp, old_logp, mask):
        return fn(old_logp, logp, mask.bool(), 0.04).to(logp.dtype)
    return adapter


def _sapo(fn):
    def adapter(logp, old_logp, advantages, mask):
        loss, _ = fn(logprobs=logp, old_logprobs=old_logp,
                     advantages=per_sequence(advantages, logp), tau_pos=1.0, tau_neg=1.05,
                     loss_mask=mask.bool())
        return loss
    return adapter


def _critic(fn):
    """Token by token (a one-token mask each), in float32 as the function asserts."""
    def adapter(values, old_values, returns, mask):
        def one(v, o, r):
            loss, _ = fn(value=v.float(), old_value=o.float(), target_value=r.float(),
                         value_eps_clip=0.5, loss_mask=v.new_ones(v.shape, dtype=bool))
            return loss
        return per_token(one, mask, values, old_values, returns)
    return adapter


def _kl(kind):
    def make(fn):
        cls = fn.__globals__["KLEstimator"]

        def adapter(logp, ref_logp, mask):
            return cls(kind)(logp, ref_logp)
        return adapter
    return make


def _normalization(grouped, **config):
    """Normalization built from NormConfig(**config): on one reward per sequence with the
    case's group size (`grouped`), or on masked [B, T] values."""
    def make(fn):
        g = inspect.unwrap(fn).__globals__             # __call__ is wrapped by torch.no_grad
        cls, norm_config = g["Normalization"], g["NormConfig"]

        def by_group(rewards, group_size):
            return cls(norm_config(group_size=int(group_size), **config))(rewards)

        def masked(x, mask):
            return cls(norm_config(**config))(x, loss_mask=mask.bool())
        return by_group if grouped else masked
    return make


_CALL = ("the proximal and the behaviour log-probs both the old log-probs (the actor passes "
         "the behaviour log-probs as the proximal ones without the decoupled loss); "
         "rejection_sampling None (its default: no behaviour weight); the mask as bool; "
         "advantages broadcast to [B, T]; the loss output of (loss, stats)",
         "[B, T] padded inputs (training packs them into 1-D streams with cu_seqlens; the "
         "2-D branch computes the same)",
         "judged on whole batches: the loss is a token mean over the call, which the engine "
         "weights by each micro-batch's share of the global valid tokens")
_WHOLE = dict(accumulation="none")
_NORM_PADDING = Known(
    "garbage", "robustness",
    "Normalization masks by multiplying (x_centered * loss_mask, data.py:1452, and the masked "
    "sums of _compute_mean and _compute_std), so a NaN or infinite value at padding gives "
    "NaN · 0 = NaN in the statistics and every output is NaN. The advantages it normalises "
    "are finite at every masked position (GAE over the padded batch), so it bites only when "
    "padding holds such values")
_K3_OVERFLOW = Known(
    "grad", "robustness",
    "k3 is exp(−δ) − 1 + δ computed in float32 (data.py:1647-1650) with the clamp to ±10 "
    "applied to its output only: where log π_ref − log π exceeds 88.7 the exp overflows to "
    "inf, the clamp returns 10, and the gradient is inf · 0 = NaN. It bites only on a token "
    "e^88 times less likely under the policy than under the reference")
_F32 = dict(precision="float32")
# decoupled PPO is in no other trainer's profile: its rows set every convention themselves
_F32_OWN = dict(_F32, profile=None)
_PPO = dict(loss="ppo", beta=0.0, agg="token-mean", clip_low=0.2, clip_high=0.2, clip_c=None,
            log_ratio_clamp=None)
_PARAMS = ("logprobs", "proximal_logprobs", "old_logprobs", "advantages", "eps_clip",
           "loss_mask")
_DECOUPLED = ("the decoupled loss's inputs: logprobs, proximal_logprobs (recomputed) and "
              "old_logprobs (the behaviour's, from the inference engine); eps_clip 0.2 (its "
              "default); the mask as bool; advantages broadcast to [B, T]",
              "the per-token loss l_t = N·A_t·∂J/∂A_t from the token mean J over the call's N "
              "valid tokens (Euler's identity: each token's loss is positively homogeneous of "
              "degree 1 in its advantage)",
              "judged at float32 tolerance: apply_rejection_sampling forms the behaviour weight "
              "from float32 log-ratios (functional.py:231, to keep bf16 inputs exact)")
_UNWEIGHTED_WHAT = (
    "with use_decoupled_loss and rejection_sampling None (1.0.4's default) ppo_actor_loss_fn "
    "applies no behaviour weight: pg_loss is multiplied by π_prox/π_behave only inside `if "
    "rejection_sampling is not None` (functional.py:535-539), so the loss is PPO around the "
    "proximal policy on the behaviour policy's samples with no correction between the two. The "
    "decoupled objective of AReaL's own write-up (blog/AReaL_v0_3.md, the decoupled PPO "
    "objective figure) carries π_prox/π_behave, and releases up to 1.0.0 always applied it; "
    "1.0.4's warning for this setting says only that 'staleness filtering is disabled'. It "
    "bites whenever the behaviour policy lags the proximal one (asynchronous rollouts)")
_UNWEIGHTED = tuple(Known(
    check, "documented choice", _UNWEIGHTED_WHAT, variant=dict(conventions=dict(is_level=None)),
    cite="cli_args.py, PPOActorConfig.rejection_sampling: 'None disables filtering "
         "(equivalent to old behave_imp_weight_mode='disabled')'; in 1.0.3 mode 'disabled' "
         "was commented 'no behavioural correction applied'") for check in ("value", "grad"))
_DEC_PARAMS = _PARAMS + ("rejection_sampling",)

# ---- compositions on the training path -------------------------------------------------------
# PPOActor._compute_advantages (the KL-regularised token rewards, the score at the last token,
# GAE over the rolled loss mask) and grpo_loss_fn (the actor's loss around ppo_actor_loss_fn),
# called as the trainer calls them

GAMMA, LAM = 0.99, 0.95
KL_CTL = 0.1


def _sequences(mask):
    """AReaL's batch layout for a [B, T] response mask: each sequence a one-token prompt and T
    response positions (S = T + 1), attention through the row's last valid token (right
    padding), loss_mask 1 at the valid response tokens; the trainer rolls loss_mask and the
    inference log-probs by −1, so that column t of the rolled frame is response token t."""
    B, T = mask.shape
    m = mask.bool()
    position = torch.arange(T)
    last = torch.where(m, position, -1).max(dim=-1).values            # −1: an empty row
    attention = torch.cat([torch.ones((B, 1), dtype=torch.long),
                           (position[None, :] <= last[:, None]).long()], dim=1)
    loss_mask = torch.cat([torch.zeros((B, 1), dtype=torch.long), m.long()], dim=1)
    return dict(input_ids=torch.zeros((B, T + 1), dtype=torch.long), attention_mask=attention,
                loss_mask=loss_mask)


def _token_aligned(x):
    """[B, T] response values in AReaL's unrolled frame: prompt column first."""
    return torch.cat([x.new_zeros((x.shape[0], 1)), x], dim=1)


def _rolled(x):
    """[B, T] response values in the rolled frame (column t: response token t), with the wrap
    column T (the prompt's, 0)."""
    return torch.cat([x, x.new_zeros((x.shape[0], 1))], dim=1)


def _actor_self(kl_ctl, kl_estimator, gamma=GAMMA, lam=LAM):
    return StandInSelf(
        config=StandInSelf(overlong_reward_penalty=False, use_decoupled_loss=False,
                           recompute_logprob=False),
        reward_bias=0.0, reward_scaling=1.0, reward_clip=float("inf"), reward_norm=None,
        kl_ctl=kl_ctl, kl_estimator=kl_estimator, mask_no_eos_with_zero=False,
        discount=gamma, gae_lambda=lam, adv_norm=None)


def _advantages_gae(fn, gamma=GAMMA, lam=LAM):
    def adapter(rewards, values, mask):
        m = mask.bool()
        zero = rewards.new_zeros(())
        data = dict(_sequences(mask), rewards=rewards.new_zeros(rewards.shape[0]),
                    logprobs=_token_aligned(torch.zeros_like(rewards)),
                    ref_logp=_rolled(torch.where(m, rewards, zero)),
                    values=_rolled(values))        # as given at padding: AReaL skips it
        me = _actor_self(1.0, lambda old, ref: old - ref, gamma, lam)
        out = fn(me, data)
        T = mask.shape[-1]
        return (zero_padding(mask, out["advantages"][:, :T]),
                zero_padding(mask, out["returns"][:, :T]))
    return adapter


def _advantages_rewards(fn):
    estimator = fn.__globals__["KLEstimator"]

    def adapter(scores, logp, ref_logp, mask):
        m = mask.bool()
        zero = logp.new_zeros(())
        data = dict(_sequences(mask), rewards=torch.where(m.any(-1), scores, zero),
                    logprobs=_token_aligned(torch.where(m, logp, zero)),
                    ref_logp=_rolled(ref_logp))          # as given at padding: AReaL masks it
        out = fn(_actor_self(KL_CTL, estimator("k1")), data)
        return zero_padding(mask, out["tot_rewards"][:, :mask.shape[-1]])
    return adapter


_LAYOUT = ("called unbound with a stand-in self (no overlong penalty, reward bias 0, scaling 1, "
           "no reward clip or reward_norm, mask_no_eos_with_zero False, adv_norm None: its row "
           "is Normalization's; recompute_logprob and the decoupled loss off, so the inference "
           "log-probs are the old ones)",
           "data as AReaL's batches hold it: each sequence a one-token prompt and the response, "
           "right-padded (attention through the row's last valid token), loss_mask 1 at the "
           "valid response tokens, the inference log-probs token-aligned (the trainer rolls "
           "them by −1, 0 at padding as the inference engine gives them), ref_logp in the "
           "rolled frame (as compute_logp gives it) with the case's padding values",
           "outputs read at the valid response tokens (the rolled frame's first T columns)")

def _grpo_loss(**settings):
    def make(fn):
        def adapter(logp, old_logp, advantages, mask):
            m = mask.bool()
            logp, old_logp = logp.float(), old_logp.float()     # AReaL's log-probs: float32
            input_data = dict(logprobs=old_logp, prox_logp=old_logp, loss_mask=m,
                              advantages=per_sequence(advantages.float(), logp))
            return fn(logp, torch.zeros_like(logp), input_data, **settings)
        return adapter
    return make


_GRPO_LOSS = ("called as PPOActor._ppo_update binds it (functools.partial of the config's "
              "eps_clip, eps_clip_higher, c_clip, rejection_sampling None, m2_threshold None, "
              "importance_sampling_level 'token', prox_logp_method 'recompute', "
              "use_sapo_loss and use_decoupled_loss False) on one micro-batch",
              "input_data: logprobs (the old ones), prox_logp = the old log-probs (what "
              "_compute_advantages stores without the decoupled loss), loss_mask as bool, "
              "advantages broadcast to [B, T]; entropy 0 (only logged); no teacher_logp",
              "inputs cast to float32 and judged at float32: its stats_tracker.stat calls "
              "refuse float64 tensors (AReaL's log-probs are float32)")


_AREAL_ROWS = (
    Row(f"{A}:PPOActor._compute_advantages", "gae", _advantages_gae,
        label=f"GAE γ {GAMMA}, λ {LAM}",
        choices=_LAYOUT + (f"discount {GAMMA}, gae_lambda {LAM} (AReaL's defaults are 1.0, "
                           f"under which a dropped or misplaced discount changes nothing)",
                           "the case's token rewards fed through the KL-reward channel: "
                           "kl_ctl 1, self.kl_estimator = log π_old − log π_ref in the inputs' "
                           "dtype, old log-probs 0 and ref_logp = the token rewards, so "
                           "−kl_ctl·k = the token rewards; the score 0 (the score's placement "
                           "is the tot_rewards row's)",
                           "values in the rolled frame as given at padding (the critic's "
                           "values there are not 0), 0 in the wrap column (the value a "
                           "sequence without EOS bootstraps from: the reference's none)"),
        conventions=dict(gamma=GAMMA, lam=LAM), params=("self", "data")),
    Row(f"{A}:PPOActor._compute_advantages", "gae", lambda fn: _advantages_gae(fn, 1.0, 1.0),
        label="GAE γ 1, λ 1",
        choices=_LAYOUT + ("discount 1.0, gae_lambda 1.0 (AReaL's defaults)",
                           "the case's token rewards fed through the KL-reward channel, as in "
                           "the γ 0.99 row", "values as in the γ 0.99 row"),
        conventions=dict(gamma=1.0, lam=1.0), params=("self", "data")),
    Row(f"{A}:PPOActor._compute_advantages", "kl_rewards", _advantages_rewards,
        label=f"tot_rewards, k1, kl_ctl {KL_CTL}",
        choices=_LAYOUT + (f"kl_ctl {KL_CTL} (its default), self.kl_estimator = "
                           f"KLEstimator('k1') (AReaL's "
                           f"own, float32, clamped to ±10); one score per sequence as "
                           f"data['rewards']; the tot_rewards output",),
        conventions=dict(beta=KL_CTL, kind="k1", clamp=(None, 10.0)),
        audit=dict(_F32, domain=("per_sequence_scores",)), params=("self", "data")),
    Row(f"{A}:grpo_loss_fn", "policy_objective",
        _grpo_loss(eps_clip=0.2, eps_clip_higher=0.28, c_clip=3.0),
        label="ppo, 0.2/0.28, dual clip 3",
        choices=_GRPO_LOSS + ("eps_clip 0.2, eps_clip_higher 0.28, c_clip 3.0: the bounds "
                              "apart and the dual clip on, so that a swap or a dropped "
                              "setting at the call shows",) + _CALL[1:],
        conventions=dict(_PPO, clip_high=0.28, clip_c=3.0), audit=dict(_WHOLE, **_F32),
        params=("logprobs", "entropy", "input_data", "eps_clip", "eps_clip_higher", "c_clip")),
)


ROWS = (
    Row(f"{F}:ppo_actor_loss_fn", "policy_objective", _ppo(), label="ppo",
        choices=_CALL + ("eps_clip 0.2, eps_clip_higher and c_clip None (its defaults)",),
        conventions=_PPO, audit=_WHOLE, params=_PARAMS),
    Row(f"{F}:ppo_actor_loss_fn", "policy_objective",
        _ppo(eps_clip_higher=0.28, c_clip=3.0), label="ppo, 0.2/0.28, dual clip 3",
        choices=_CALL + ("eps_clip 0.2, eps_clip_higher 0.28, c_clip 3.0",),
        conventions=dict(_PPO, clip_high=0.28, clip_c=3.0), audit=_WHOLE,
        params=_PARAMS + ("eps_clip_higher", "c_clip")),
    Row(f"{F}:ppo_actor_loss_fn", "policy_objective",
        _ppo(importance_sampling_level="sequence"), label="gspo (sequence level)",
        choices=_CALL + ("importance_sampling_level 'sequence', eps_clip 0.2: the ratio of "
                         "each sequence's mean log-ratio, the loss a token mean",),
        conventions=dict(loss="gspo", beta=0.0, agg="token-mean", form="sequence",
                         clip_low=0.2, clip_high=0.2),
        audit=dict(_WHOLE, domain=("per_sequence_advantages",)),
        params=_PARAMS + ("importance_sampling_level",)),
    Row(f"{F}:ppo_actor_loss_fn", "decoupled_ppo_loss", _decoupled(),
        label="decoupled, rejection_sampling None",
        choices=_DECOUPLED + ("rejection_sampling None (its default)",),
        conventions=dict(clip_low=0.2, clip_high=None, clip_c=None, is_level="token",
                         is_mode="truncate", is_lower=None, is_upper=None),
        audit=_F32_OWN, params=_PARAMS, known=_UNWEIGHTED),
    Row(f"{F}:ppo_actor_loss_fn", "decoupled_ppo_loss",
        _decoupled(level="token", action="mask", metric="ratio", upper=5.0),
        label="decoupled, token mask 5",
        choices=_DECOUPLED + ("RejectionSamplingConfig(level='token', action='mask', "
                              "metric='ratio', upper=5.0): the setting 1.0.4's warning "
                              "recommends (the earlier default)",),
        conventions=dict(clip_low=0.2, clip_high=None, clip_c=None, is_level="token",
                         is_mode="mask", is_lower=None, is_upper=5.0),
        audit=_F32_OWN, params=_DEC_PARAMS),
    Row(f"{F}:ppo_actor_loss_fn", "decoupled_ppo_loss",
        _decoupled(level="token", action="clamp", metric="ratio", lower=0.5, upper=2.0),
        label="decoupled, token clamp 0.5..2",
        choices=_DECOUPLED + ("RejectionSamplingConfig(level='token', action='clamp', "
                              "metric='ratio', lower=0.5, upper=2.0)",),
        conventions=dict(clip_low=0.2, clip_high=None, clip_c=None, is_level="token",
                         is_mode="truncate", is_lower=0.5, is_upper=2.0),
        audit=_F32_OWN, params=_DEC_PARAMS),
    Row(f"{F}:ppo_actor_loss_fn", "decoupled_ppo_loss",
        _decoupled(level="sequence", action="mask", metric="ratio", agg="mean", upper=2.0),
        label="decoupled, sequence mask 2",
        choices=_DECOUPLED + ("RejectionSamplingConfig(level='sequence', action='mask', "
                              "metric='ratio', agg='mean', upper=2.0): a sequence's weight and "
                              "its test are the geometric mean of its token weights",),
        conventions=dict(clip_low=0.2, clip_high=None, clip_c=None, is_level="sequence",
                         is_mode="mask", is_lower=None, is_upper=2.0, is_seq_stat="mean"),
        audit=_F32_OWN, params=_DEC_PARAMS),
    Row(f"{A}:_apply_m2po_masking", "m2po_mask", _m2po,
        choices=("called as grpo_loss_fn calls it: old_logp (the behaviour's) and prox_logp, "
                 "the loss mask as bool, m2_threshold 0.04 (M2PO's τ; AReaL's default is None, "
                 "off); its bool mask read as 0/1",),
        conventions=dict(threshold=0.04), audit=dict(profile=None),
        params=("old_logp", "prox_logp", "loss_mask", "m2_threshold")),
    Row(f"{F}:sapo_loss_fn", "policy_objective", _sapo, label="sapo",
        choices=("tau_pos 1.0, tau_neg 1.05 (its defaults); the mask as bool; advantages "
                 "broadcast to [B, T]; the loss output of (loss, stats)",) + _CALL[1:],
        conventions=dict(loss="sapo", beta=0.0, agg="token-mean", tau_pos=1.0, tau_neg=1.05,
                         log_ratio_clamp=None),
        audit=_WHOLE, params=("logprobs", "old_logprobs", "advantages", "tau_pos", "tau_neg",
                              "loss_mask")),
    Row(f"{F}:ppo_critic_loss_fn", "value_loss", _critic,
        choices=("called token by token with a one-token mask, inputs cast to float32 (it "
                 "asserts float32), value_eps_clip 0.5 (the critic's default), mse",),
        conventions=dict(clip=0.5), audit=_F32,
        params=("value", "old_value", "target_value", "value_eps_clip", "loss_mask")),
) + tuple(
    Row(f"{D}:KLEstimator._compute_approx_kl", "kl_penalty", _kl(kind), label=kind,
        choices=(f"KLEstimator({kind!r}) (apply_clamp True, the actor's); it computes in "
                 "float32; read at the valid tokens",),
        conventions=dict(kind=kind, clamp=(None, 10.0)), audit=_F32,
        params=("log_probs", "log_probs_base", "kl_estimator", "apply_clamp"),
        known=(_K3_OVERFLOW,) if kind == "k3" else ())
    for kind in ("k1", "k2", "k3")
) + (
    Row(f"{D}:Normalization.__call__", "group_advantages",
        _normalization(True, mean_level="group", std_level="group"), label="group (reward_norm)",
        choices=("Normalization(NormConfig(mean_level='group', std_level='group', group_size)) "
                 "on one reward per sequence, as the actor's reward_norm is called; std "
                 "unbiased and eps 1e-5 (its defaults); its float32 output",),
        conventions=dict(ddof=1, eps=1e-5, scale="group", baseline="mean", singleton="zero"),
        audit=_F32, params=("x", "loss_mask")),
    Row(f"{D}:Normalization.__call__", "whiten",
        _normalization(False, mean_level="batch", std_level="batch"), label="batch (adv_norm)",
        choices=("Normalization(NormConfig()) (batch mean and std, its defaults) on [B, T] "
                 "values with the mask as bool, as the actor's adv_norm is called; its float32 "
                 "output",),
        conventions=dict(ddof=1, eps=1e-5, eps_mode="std", shift_mean=True), audit=_F32,
        params=("x", "loss_mask"), known=(_NORM_PADDING,)),
)

ROWS = ROWS + _AREAL_ROWS

TRAINER = Trainer(
    name="areal", package="areal", dist="areal", profile="verl", pinned="1.0.4",
    modules=(F, D, A), rows=ROWS,
    inventory=((F, r"masked_normalization|apply_rejection_sampling|ppo_actor_loss_fn|"
                   r"sapo_loss_fn|ppo_critic_loss_fn|_compute_sequence_level_ratio_and_"
                   r"advantages"),
               (D, r"KLEstimator\._compute_approx_kl|Normalization\.__call__"),
               (A, r"_apply_m2po_masking|_get_m2po_loss_mask|grpo_loss_fn|"
                   r"PPOActor\._compute_advantages")),
    not_run=(("masked_normalization", "not called anywhere in areal 1.0.4 (only exported)"),
             ("_compute_sequence_level_ratio_and_advantages",
              "reached through ppo_actor_loss_fn at importance_sampling_level 'sequence'"),
             ("_get_m2po_loss_mask", "reached through _apply_m2po_masking"),
             ("apply_rejection_sampling",
              "reached through ppo_actor_loss_fn's rejection_sampling (the decoupled rows)")),
    runs=("ppo_actor_loss_fn at token level (0.2/0.2; 0.2/0.28 with dual clip 3) and at "
          "sequence level (GSPO)", "the decoupled loss (proximal and behaviour log-probs): "
          "without rejection sampling, with a token mask at 5, a token clamp to [0.5, 2] and a "
          "sequence mask at 2 on the ratio metric",
          "M2PO's mask (_apply_m2po_masking, τ 0.04)", "sapo_loss_fn",
          "ppo_critic_loss_fn (float32)",
          "KLEstimator k1, k2, k3 with the ±10 clamp (float32)",
          "Normalization: group mean and std on per-sequence rewards; batch mean and std on "
          "masked [B, T] values"),
    does_not_run=("rejection sampling on the KL metrics (kl_k1/k2/k3: the test reads an "
                  "estimator, the weight stays the token ratio) or with agg 'sum'/'max' at "
                  "sequence level (the test and the weight are different statistics): no "
                  "reference takes those", "the 1-D packed "
                  "layout with cu_seqlens", "PPOActor._compute_advantages with adv_norm, "
                  "reward_norm or the overlong penalty (their own rows, or none)",
                  "Normalization with leave-one-out means or mixed levels",
                  "the distillation terms of grpo_loss_fn, and grpo_loss_fn with m2_threshold "
                  "set (M2PO's mask then the PPO loss: no reference composes the two; each "
                  "has its row)"),
    notes=("judged under the verl profile with every convention the rows need set explicitly: "
           "AReaL's PPO loss has no log-ratio clamp and its dual clip is off unless c_clip is "
           "set",),
)
