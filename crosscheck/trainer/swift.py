"""ms-swift's report card: its GRPO advantages (swift/rl_core/advantage.py) and its GRPO losses on
the HF backend (`GRPOTrainer`, swift/rlhf_trainers/grpo_trainer.py) and the Megatron backend
(`MegatronGRPOTrainer`, swift/megatron/trainers/grpo_trainer.py).

Facts read in ms-swift 4.6.0:
- `compute_advantages(rewards_per_func, reward_weights, num_generations, advantage_estimator,
  scale_rewards, ...)` is a pure function of the gathered rewards: groups are consecutive blocks
  of `num_generations`; the std is torch's (ddof 1), added to 1e-4; a group of one has
  advantage 0 (its std is set to 0 and r − mean = 0). `compute_advantages_dynamic` groups by
  `prompt_ids` (any sizes), its group means and stds held in float32 buffers
  (`torch.zeros(n)`);
- the HF loss is `_compute_loss_and_metrics(self, model, model_inputs, grpo_batch)`: log-probs
  from `self._get_per_token_logps_and_entropies`, the loss's inputs in `grpo_batch`
  (completion_mask, advantages [B, T], old/ref log-probs, num_items_in_batch); 'dapo', 'cispo'
  and 'fipo' divide by num_items_in_batch / num_processes and multiply by the accumulation
  steps (`_undo_gradient_accumulation_scaling`, 4.6.0 on), which `Trainer.training_step` then
  divides by;
- the Megatron loss is `loss_func(self, output_tensor, data)`: the log-probs are
  `output_tensor`, the same per-token losses; 'bnpo', 'dapo', 'cispo', 'fipo' divide by
  num_items_in_batch / dp_size and multiply by `args.num_microbatches` (Megatron divides each
  micro-batch's loss by it); 'dr_grpo' divides by micro_batch_size · max_completion_length;
- FIPO (arXiv 2603.19835) multiplies the clipped PPO loss by `_compute_fipo_influence`'s
  detached weight, with γ = 2^(−1/fipo_decay_rate) (`_prepare_algorithm_params`).
"""
import collections
import types

import numpy as np
import torch

from .card import Known, NotInVersion, Row, StandInSelf, Trainer, owner_class, source_of

ADV = "swift.rl_core.advantage"
HF = "swift.rlhf_trainers.grpo_trainer"
MG = "swift.megatron.trainers.grpo_trainer"
MAX_LEN = 8.0            # max_completion_length, the Dr. GRPO constant
# FIPO's settings: GRPOConfig's defaults (fipo_decay_rate 32, fipo_clip_range 0.2 one-sided,
# fipo_safety_threshold 4.0); a decay of 2 tokens as well, where a wrong γ shows in short rows
FIPO_DEFAULTS = dict(decay_rate=32.0, clip_range=0.2, high_only=True, safety=4.0, delta=None)
FIPO_SYMMETRIC = dict(decay_rate=2.0, clip_range=0.2, high_only=False, safety=4.0, delta=10.0)


def _fipo_conventions(decay_rate, clip_range, high_only, safety, delta):
    return dict(decay_rate=decay_rate, lower=1.0 if high_only else 1.0 - clip_range,
                upper=1.0 + clip_range, ratio_threshold=delta, safety_threshold=safety)


# ---- advantages ------------------------------------------------------------------------------

def _advantages(estimator, scale):
    def make(fn):
        def adapter(rewards, group_size):
            adv, _ = fn(rewards_per_func=rewards[:, None], reward_weights=rewards.new_ones(1),
                        num_generations=int(group_size), advantage_estimator=estimator,
                        scale_rewards=scale)
            return adv
        return adapter
    return make


def _dynamic(estimator, scale):
    def make(fn):
        def adapter(rewards, group_ids):
            ids = [str(int(g)) for g in np.asarray(group_ids)]
            r = rewards.to(torch.float32)[:, None]   # as compute_rewards_per_func builds them
            adv, _ = fn(rewards_per_func=r, reward_weights=r.new_ones(1),
                        prompt_ids=ids, request_ids=[str(i) for i in range(len(ids))],
                        advantage_estimator=estimator, scale_rewards=scale)
            return adv
        return adapter
    return make


def _trainer_advantages(estimator, scale, dynamic=False):
    """GRPOTrainer._compute_advantages (or MegatronGRPOTrainer's) as the trainer calls it after
    scoring: one process, the trainer's settings on a stand-in self, no kl_in_reward."""
    def make(fn):
        megatron = "megatron" in owner_class(fn).__module__

        def run(rewards, samples):
            r = rewards.to(torch.float32)[:, None]      # compute_rewards_per_func's dtype
            logs = collections.defaultdict(list)
            logs["rewards"] = collections.defaultdict(list)
            me = StandInSelf(
                reward_weights=r.new_ones(1), advantage_estimator=estimator,
                scale_rewards=scale, kl_in_reward=False, beta=0.0, reward_func_names=["r"],
                dynamic_num_samples=dynamic, model=StandInSelf(training=True),
                unwrapped_models=[StandInSelf(training=True)], process_index=0,
                device=r.device, num_generations=samples[0].n if samples else 1,
                _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
                _logs=logs, _get_last_indices=lambda ids: list(range(len(ids))),
                args=StandInSelf(report_to=[]))
            if megatron:
                return fn(me, samples, r)
            return fn(me, samples, r, [])
        def adapter(rewards, group_size):
            K = int(group_size)
            return run(rewards, [StandInSelf(n=K, prompt_id=str(i // K), request_id=str(i))
                                 for i in range(rewards.shape[0])])
        return adapter
    return make


_ADV = ("one reward function of weight 1: rewards_per_func = rewards[:, None]",
        "num_generations = group_size: groups are consecutive blocks of equal size (groups of one "
        "included: their advantage is 0), as "
        "compute_advantages reshapes them (view(-1, K))")
# groups of one are inputs ms-swift produces (num_generations 1; a prompt with one request on
# the multi-turn path) and handles on purpose ("if K > 1"): the trl profile's domain, which
# drops them, is overridden
_SINGLETONS = dict(domain=())
_DYN = ("one reward function of weight 1: rewards_per_func = rewards[:, None] in float32, as "
        "compute_rewards_per_func builds it (its group statistics live in float32 buffers, "
        "torch.zeros(n), so float64 rewards raise at the index put): judged at float32",
        "prompt_ids = the group ids (as strings), request_ids all distinct: groups of any size "
        "and order, as the multi-turn path gathers them")


# ---- the HF loss -----------------------------------------------------------------------------

class _Accelerator:
    """One process: gathers are the identity."""
    num_processes = 1
    is_main_process = True

    @staticmethod
    def gather_for_metrics(x):
        return x


def _hf_self(cls, logp, loss_type, level="token", beta=0.0, epsilon_low=0.2,
             epsilon_high=0.2, fipo=FIPO_DEFAULTS, steps=1):
    me = StandInSelf(
        loss_type=loss_type, importance_sampling_level=level, beta=beta, kl_in_reward=False,
        epsilon_low=epsilon_low, epsilon_high=epsilon_high, tau_pos=1.0, tau_neg=1.05,
        compute_entropy=False, overlong_filter=False, rollout_importance_sampling_mode=None,
        log_rollout_offpolicy_metrics=False, disable_rollout_importance_sampling=False,
        _has_teacher=False, off_policy_sequence_mask_delta=None,
        max_completion_length=MAX_LEN, accelerator=_Accelerator(), sdar_loss_coef=0.0,
        chord_sft_iterator=None, model=StandInSelf(training=True),
        model_accepts_loss_kwargs=False, compute_loss_func=None,
        current_gradient_accumulation_steps=steps, use_liger_loss=False,
        dynamic_num_samples=False, template=StandInSelf(padding_free=False),
        fipo_gamma=2 ** (-1 / fipo["decay_rate"]), fipo_clip_range=fipo["clip_range"],
        fipo_clip_high_only=fipo["high_only"], fipo_safety_threshold=fipo["safety"],
        args=StandInSelf(delta=fipo["delta"], top_entropy_quantile=1.0, log_entropy=False,
                         report_to=[],
                         per_device_train_batch_size=logp.shape[0],
                         gradient_accumulation_steps=steps),
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
        _logs=collections.defaultdict(list))
    me._get_per_token_logps_and_entropies = lambda *a, **k: (logp, None)
    for name in ("_compute_fipo_influence", "_undo_gradient_accumulation_scaling",
                 "_compute_loss", "_compute_loss_single", "_compute_loss_and_metrics",
                 "_update_metrics"):
        if hasattr(cls, name):
            setattr(me, name, types.MethodType(getattr(cls, name), me))
    return me


def _grpo_batch(logp, old_logp, advantages, mask, ref_logp, n_tokens_global):
    B = logp.shape[0]
    m = mask.bool()
    n = m.sum() if n_tokens_global is None else n_tokens_global
    adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
    return StandInSelf(completion_mask=m, truncated_mask=torch.zeros(B, dtype=torch.bool),
                       advantages=adv, old_per_token_logps=old_logp,
                       ref_per_token_logps=ref_logp, rollout_per_token_logps=None,
                       teacher_per_token_logps=None, seq_lengths=torch.zeros(B),
                       num_items_in_batch=torch.as_tensor(n, dtype=logp.dtype))


def _hf(loss_type, **settings):
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
            me = _hf_self(cls, logp, loss_type, **settings)
            loss, _ = fn(me, None, {}, _grpo_batch(logp, old_logp, advantages, mask,
                                                   ref_logp, n_tokens_global))
            return loss
        return adapter
    return make


STEPS = 2      # gradient_accumulation_steps of the trainer-path row


def _hf_path(loss_type, **settings):
    """GRPOTrainer.compute_loss as Trainer.training_step calls it, with gradient accumulation
    over STEPS micro-batches: the loss it returns, divided by STEPS as training_step divides it
    (transformers' Trainer, model_accepts_loss_kwargs False)."""
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
            me = _hf_self(cls, logp, loss_type, steps=STEPS, **settings)
            inputs = dict(model_inputs={"input_ids": torch.zeros(logp.shape, dtype=torch.long)},
                          grpo_batch=_grpo_batch(logp, old_logp, advantages, mask, ref_logp,
                                                 n_tokens_global))
            return fn(me, None, inputs) / STEPS
        return adapter
    return make


def _fits_hf(loss_type, level="token"):
    def fit(fn):
        source = source_of(fn)
        if f"'{loss_type}'" not in source and f'"{loss_type}"' not in source:
            raise NotInVersion(f"this version's loss has no loss_type {loss_type!r}")
        if level != "token" and "importance_sampling_level" not in source:
            raise NotInVersion("this version's loss has no importance_sampling_level")
        return _PER_SEQUENCE
    return fit


_PER_SEQUENCE = dict(domain=("per_sequence_advantages",),
                     choice="advantages one per sequence, broadcast over the response as "
                            "expand_advantage_to_per_token writes them ([B, T]) without a "
                            "teacher: per-token advantages are outside its domain")
_HF_SELF = ("called unbound with a stand-in self: _get_per_token_logps_and_entropies returns "
            "the log-probs under test; one process, no entropy mask, no rollout correction, no "
            "teacher, no overlong filter, model.training True",
            "grpo_batch: completion_mask = mask, advantages [B, T], old_per_token_logps = "
            "old_logp, truncated_mask all False")
_GLOBAL = ("num_items_in_batch = the whole batch's token count (the generation batch's "
           "completion tokens, as _prepare_batch_inputs passes it); "
           "current_gradient_accumulation_steps = 1",)
_PARAMS_HF = ("self", "model", "model_inputs", "grpo_batch")
_LOCAL = Known(
    "microbatch", "documented choice",
    "loss_type 'bnpo' normalises by the local micro-batch's token count "
    "(completion_mask.sum()), so averaged micro-batches weight tokens unequally when they hold "
    "different numbers of tokens; 'dapo' normalises by the generation batch's count instead",
    variant=dict(microbatch="local"),
    cite="GRPOConfig (TRL's, which ms-swift's extends) loss_type help: 'bnpo' normalises by the "
         "number of active tokens in the local batch")
_PADDING = Known(
    "garbage", "robustness",
    "the clipped loss types take exp(log π − log π_old) at every position and mask by "
    "multiplying ((per_token_loss * completion_mask).sum()), so a padded position whose "
    "log-ratio overflows exp (garbage log-probs at padding) gives inf · 0 = NaN; valid "
    "positions are exact, and ms-swift's padding holds finite log-probs")


def _fipo_composed(settings):
    """The reference composition of loss_type 'fipo': PPO's clipped objective with the
    advantage of each token multiplied by fipo_influence_weights (a stop-gradient weight)."""
    from ref_numpy import fipo_influence_weights
    conventions = _fipo_conventions(**settings)

    def inputs(data):
        adv = np.asarray(data["advantages"], dtype=float)
        adv = adv[:, None] * np.ones(np.shape(data["logp"])) if adv.ndim == 1 else adv
        w = fipo_influence_weights(data["logp"], data["old_logp"], adv, data.get("mask"),
                                   **conventions)
        return dict(data, advantages=adv * w)
    return inputs


# ---- the Megatron loss -----------------------------------------------------------------------

def _mg_self(cls, logp, loss_type, epsilon_low=0.2, epsilon_high=0.2, fipo=FIPO_DEFAULTS,
             beta=0.0, level="token"):
    me = StandInSelf(
        loss_type=loss_type, importance_sampling_level=level, beta=beta, kl_in_reward=False,
        epsilon_low=epsilon_low, epsilon_high=epsilon_high, tau_pos=1.0, tau_neg=1.05,
        micro_batch_size=logp.shape[0], max_completion_length=MAX_LEN,
        disable_rollout_importance_sampling=False, rollout_importance_sampling_mode=None,
        log_rollout_offpolicy_metrics=False, _has_teacher=False,
        off_policy_sequence_mask_delta=None, compute_entropy=False, log_entropy=False,
        top_entropy_quantile=1.0, unwrapped_models=[StandInSelf(training=True)],
        fipo_gamma=2 ** (-1 / fipo["decay_rate"]), fipo_clip_range=fipo["clip_range"],
        fipo_clip_high_only=fipo["high_only"], fipo_safety_threshold=fipo["safety"],
        args=StandInSelf(delta=fipo["delta"], overlong_filter=False, num_microbatches=1,
                         report_to=[]),
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
        _step=2, steps_per_generation=2, _all_reduce_metric=lambda metric, *a, **k: metric)
    if hasattr(cls, "_compute_fipo_influence"):
        me._compute_fipo_influence = types.MethodType(cls._compute_fipo_influence, me)
    return me


def _megatron(loss_type, **settings):
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask, ref_logp=None, n_tokens_global=None):
            me = _mg_self(cls, logp, loss_type, **settings)
            batch = _grpo_batch(logp, old_logp, advantages, mask, ref_logp, n_tokens_global)
            loss, _ = fn(me, logp, {"grpo_batch": batch})
            return loss
        return adapter
    return make


_MG_SELF = ("called unbound with a stand-in self: output_tensor = the log-probs under test; "
            "one rank (Megatron's parallel state: world sizes 1), args.num_microbatches = 1, "
            "micro_batch_size = B, _all_reduce_metric the identity",
            "data['grpo_batch']: completion_mask = mask, advantages [B, T], "
            "old_per_token_logps = old_logp, truncated_mask all False")
_PARAMS_MG = ("self", "output_tensor", "data")


def _influence(settings):
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, old_logp, advantages, mask):
            me = (_hf_self if "rlhf_trainers" in cls.__module__ else _mg_self)(
                cls, logp, "fipo", fipo=settings)
            adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
            log_ratio = logp - old_logp
            w, _ = fn(me, log_ratio, torch.exp(log_ratio), adv, mask.bool())
            return torch.where(mask.bool(), w, w.new_zeros(()))
        return adapter
    return make


def _influence_rows(where):
    return tuple(
        Row(f"{where}._compute_fipo_influence", "fipo_influence_weights", _influence(s),
            label=label,
            choices=("called unbound with a stand-in self holding fipo_gamma = "
                     "2^(−1/fipo_decay_rate), as _prepare_algorithm_params sets it",
                     f"fipo_decay_rate {s['decay_rate']:g}, fipo_clip_range "
                     f"{s['clip_range']:g}, fipo_clip_high_only {s['high_only']}, "
                     f"fipo_safety_threshold {s['safety']:g}, delta {s['delta']}",
                     "log_ratio = logp − old_logp, coef_1 its exp (token level), the weight "
                     "read at valid tokens"),
            conventions=_fipo_conventions(**s), audit=dict(profile=None),
            params=("self", "log_ratio", "coef_1", "advantages", "completion_mask"))
        for label, s in (("GRPOConfig defaults", FIPO_DEFAULTS),
                         ("decay 2, clip ±0.2, delta 10", FIPO_SYMMETRIC)))


IS_THRESHOLD = 2.0       # rollout_importance_sampling_threshold
OPSM_DELTA = 1e-3        # off_policy_sequence_mask_delta


def _rollout_is(mode):
    """_apply_rollout_importance_sampling in one of its four modes, given the train engine's
    log-probs as old_per_token_logps and the sampler's as rollout_per_token_logps (its caller
    passes their difference)."""
    def make(fn):
        cls = owner_class(fn)

        def adapter(logp, rollout_logp, mask):
            me = StandInSelf(rollout_importance_sampling_mode=mode,
                             rollout_importance_sampling_threshold=IS_THRESHOLD)
            if hasattr(cls, "_compute_sequence_level_ratios"):
                me._compute_sequence_level_ratios = types.MethodType(
                    cls._compute_sequence_level_ratios, me)
            w = fn(me, logp - rollout_logp, mask.bool())
            return torch.where(mask.bool(), w, w.new_zeros(()))
        return adapter
    return make


def _opsm(fn):
    def adapter(logp, old_logp, advantages, mask):
        me = StandInSelf(off_policy_sequence_mask_delta=OPSM_DELTA)
        keep = fn(me, logp, old_logp, mask.to(logp.dtype), advantages)
        return (keep[:, None] & mask.bool()).to(logp.dtype)
    return adapter


def _token_clamped(data):
    """The reference given each token's log-ratio clamped to ±20 (rollout_logp moved to
    match), as ms-swift clamps before a sequence's geometric mean."""
    x = np.clip(np.asarray(data["logp"]) - np.asarray(data["rollout_logp"]), -20.0, 20.0)
    return dict(data, rollout_logp=np.asarray(data["logp"]) - x)


_TOKEN_CLAMP = Known(
    "value", "documented choice",
    "_apply_rollout_importance_sampling clamps every token's log-ratio to ±20 before the "
    "sequence's geometric mean, so a sequence holding a token whose engines disagree by more "
    "than e^20 gets the mean of the clamped log-ratios, not the clamped mean; no token of an "
    "ordinary rollout comes near it",
    variant=dict(inputs=_token_clamped),
    cite="grpo_trainer.py: 'Clamp log_ratio to prevent numerical overflow from padding values "
         "(-1e10)' (SAFETY_BOUND = 20.0)")


def _correction_rows(where, cls):
    return tuple(
        Row(f"{where}:{cls}._apply_rollout_importance_sampling", "rollout_is_weights",
            _rollout_is(mode), label=mode,
            choices=("called unbound with a stand-in self: rollout_importance_sampling_mode "
                     f"{mode!r}, rollout_importance_sampling_threshold {IS_THRESHOLD:g}",
                     "rollout_log_ratio = logp − rollout_logp (the train engine's log-probs "
                     "against the sampler's, as _get_rollout_is_correction passes them); the "
                     "weights read at valid tokens") +
            (("a sequence's ratio is the geometric mean of its tokens' "
              "(_compute_sequence_level_ratios)",) if mode.startswith("sequence") else ()),
            conventions=dict(level=mode.split("_")[0], mode=mode.split("_")[1], lower=None,
                             upper=IS_THRESHOLD, seq_stat="mean", log_ratio_clamp=20.0,
                             kept="token" if mode == "sequence_mask" else "unit"),
            audit=dict(profile=None), params=("self", "rollout_log_ratio", "completion_mask"),
            known=(_TOKEN_CLAMP,) if mode.startswith("sequence") else ())
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    ) + (
        Row(f"{where}:{cls}._compute_off_policy_sequence_mask", "opsm_mask", _opsm,
            choices=(f"off_policy_sequence_mask_delta {OPSM_DELTA:g}; advantages one per "
                     "sequence, as the loss passes them (seq_advantages)",
                     "the [B] keep mask read at each valid token"),
            conventions=dict(delta=OPSM_DELTA),
            audit=dict(profile=None, domain=("per_sequence_advantages",)),
            params=("self", "per_token_logps", "old_policy_per_token_logps", "completion_mask",
                    "advantages")),
    )


HF_LOSS = f"{HF}:GRPOTrainer._compute_loss_and_metrics"
MG_LOSS = f"{MG}:MegatronGRPOTrainer.loss_func"
_PPO = dict(loss="ppo", beta=0.0, clip_high=0.2)

ROWS = (
    Row(f"{ADV}:compute_advantages", "group_advantages", _advantages("grpo", "group"),
        label="grpo, group", choices=_ADV + ("advantage_estimator 'grpo', scale_rewards "
                                             "'group'",),
        conventions=dict(ddof=1, eps=1e-4, scale="group", singleton="zero"),
        audit=_SINGLETONS, params=("rewards_per_func", "reward_weights", "num_generations",
                "advantage_estimator", "scale_rewards")),
    Row(f"{ADV}:compute_advantages", "group_advantages", _advantages("grpo", "batch"),
        label="grpo, batch", choices=_ADV + ("scale_rewards 'batch': the std of every reward",),
        conventions=dict(ddof=1, eps=1e-4, scale="batch", singleton="zero"),
        audit=_SINGLETONS, params=("rewards_per_func", "num_generations", "scale_rewards")),
    Row(f"{ADV}:compute_advantages", "group_advantages", _advantages("grpo", "none"),
        label="grpo, none", choices=_ADV + ("scale_rewards 'none' (Dr. GRPO)",),
        conventions=dict(scale="none", singleton="zero"),
        audit=_SINGLETONS, params=("rewards_per_func", "num_generations", "scale_rewards")),
    Row(f"{ADV}:compute_advantages", "group_advantages", _advantages("rloo", "none"),
        label="rloo", choices=_ADV + ("advantage_estimator 'rloo', scale_rewards 'none' (its "
                                      "default for rloo)",),
        conventions=dict(baseline="leave_one_out", scale="none", singleton="zero"),
        audit=_SINGLETONS,
        params=("rewards_per_func", "num_generations", "advantage_estimator")),
    Row(f"{ADV}:compute_advantages", "group_advantages",
        _advantages("reinforce_plus_plus", "group"), label="reinforce_plus_plus, group",
        choices=_ADV + ("advantage_estimator 'reinforce_plus_plus', scale_rewards 'group': the "
                        "std of the centred rewards, which is the group's",),
        conventions=dict(ddof=1, eps=1e-4, scale="group", singleton="zero"),
        audit=_SINGLETONS, params=("rewards_per_func", "num_generations", "advantage_estimator")),
    Row(f"{ADV}:compute_advantages_dynamic", "group_advantages", _dynamic("grpo", "group"),
        label="grpo, group", choices=_DYN + ("scale_rewards 'group'",),
        conventions=dict(ddof=1, eps=1e-4, scale="group", singleton="zero"),
        audit=dict(_SINGLETONS, precision="float32"),
        params=("rewards_per_func", "reward_weights", "prompt_ids", "request_ids")),
    Row(f"{ADV}:compute_advantages_dynamic", "group_advantages", _dynamic("rloo", "none"),
        label="rloo", choices=_DYN + ("advantage_estimator 'rloo', scale_rewards 'none'",),
        conventions=dict(baseline="leave_one_out", scale="none", singleton="zero"),
        audit=dict(_SINGLETONS, precision="float32"),
        params=("rewards_per_func", "prompt_ids", "request_ids", "advantage_estimator")),
    # ---- the trainers' advantage step (gathers, settings, then compute_advantages)
    *(Row(f"{where}._compute_advantages", "group_advantages",
          _trainer_advantages("grpo", "group", dynamic), label=label,
          choices=("called unbound as the trainer calls it after scoring, on a stand-in self "
                   "with GRPOConfig's defaults (advantage_estimator 'grpo', scale_rewards "
                   "'group', kl_in_reward False, one reward function of weight 1); one "
                   "process, so its gathers are the identity",
                   "rewards_per_func in float32, as compute_rewards_per_func builds it") + (
              ("dynamic_num_samples True: each prompt's num_generations requests, one sample "
               "each (prompt_id = its group, distinct request_ids): its reward metrics "
               "reshape the requests' rewards by num_generations, so groups are equal",)
              if dynamic else
              ("num_generations = group_size: consecutive groups of equal size",)),
          conventions=dict(ddof=1, eps=1e-4, scale="group", singleton="zero"),
          audit=dict(_SINGLETONS, precision="float32"), params=("self", "samples",
                                                                 "rewards_per_func"))
      for where, label, dynamic in ((f"{HF}:GRPOTrainer", "grpo, group", False),
                                    (f"{HF}:GRPOTrainer", "grpo, group, dynamic", True),
                                    (f"{MG}:MegatronGRPOTrainer", "grpo, group", False))),
    # ---- HF backend
    Row(HF_LOSS, "policy_objective", _hf("dapo"), label="dapo", choices=_HF_SELF + _GLOBAL,
        conventions=_PPO, params=_PARAMS_HF, fits=_fits_hf("dapo"), known=(_PADDING,)),
    Row(HF_LOSS, "policy_objective", _hf("dapo", epsilon_high=0.28), label="dapo, ε 0.2/0.28",
        choices=_HF_SELF + _GLOBAL + ("epsilon 0.2, epsilon_high 0.28",),
        conventions=dict(_PPO, clip_low=0.2, clip_high=0.28), params=_PARAMS_HF,
        fits=_fits_hf("dapo"), known=(_PADDING,)),
    Row(HF_LOSS, "policy_objective", _hf("dapo", beta=0.04), label="dapo, β = 0.04",
        choices=_HF_SELF + _GLOBAL + ("beta 0.04: k3(ref, logp), its log-ratio clamped to ±20 "
                                      "and k3 to ≤ 10, added to the per-token loss",),
        conventions=dict(_PPO, beta=0.04, kl_clamp=(20.0, 10.0), kl_weight=None),
        params=_PARAMS_HF,
        fits=_fits_hf("dapo"), known=(_PADDING,)),
    Row(HF_LOSS, "policy_objective", _hf("grpo"), label="grpo", choices=_HF_SELF,
        conventions=dict(_PPO, agg="seq-mean-token-mean", empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS_HF, fits=_fits_hf("grpo"),
        known=(_PADDING,)),
    Row(HF_LOSS, "policy_objective", _hf("bnpo"), label="bnpo", choices=_HF_SELF,
        conventions=dict(_PPO, agg="token-mean"), audit=dict(accumulation="mean"),
        params=_PARAMS_HF, fits=_fits_hf("bnpo"), known=(_PADDING, _LOCAL)),
    Row(HF_LOSS, "policy_objective", _hf("dr_grpo"), label="dr_grpo",
        choices=_HF_SELF + (f"max_completion_length = {MAX_LEN:g}",),
        conventions=dict(_PPO, agg="seq-mean-token-sum", norm=MAX_LEN, empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS_HF, fits=_fits_hf("dr_grpo"),
        known=(_PADDING,)),
    Row(HF_LOSS, "policy_objective", _hf("cispo", epsilon_high=5.0), label="cispo",
        choices=_HF_SELF + _GLOBAL + ("epsilon_high 5.0",),
        conventions=dict(loss="cispo", beta=0.0), params=_PARAMS_HF, fits=_fits_hf("cispo")),
    Row(HF_LOSS, "policy_objective", _hf("sapo"), label="sapo",
        choices=_HF_SELF + ("tau_pos 1.0, tau_neg 1.05 (GRPOConfig's defaults)",),
        conventions=dict(loss="sapo", beta=0.0, agg="seq-mean-token-mean",
                         empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS_HF, fits=_fits_hf("sapo")),
    Row(HF_LOSS, "policy_objective", _hf("grpo", level="sequence", epsilon_low=3e-4,
                                         epsilon_high=4e-4), label="gspo",
        choices=_HF_SELF + ("importance_sampling_level 'sequence', loss_type 'grpo', epsilon "
                            "3e-4 / 4e-4 (GSPO)",),
        conventions=dict(loss="gspo", beta=0.0), audit=dict(accumulation="mean"),
        params=_PARAMS_HF, fits=_fits_hf("grpo", "sequence")),
    Row(HF_LOSS, "policy_objective", _hf("fipo"), label="fipo",
        choices=_HF_SELF + _GLOBAL + (
            "loss_type 'fipo' at GRPOConfig's FIPO defaults (fipo_decay_rate 32, "
            "fipo_clip_range 0.2 with fipo_clip_high_only, fipo_safety_threshold 4.0, no delta)",
            "judged against the reference composition: policy_objective (PPO, clip 0.2) with "
            "each token's advantage times fipo_influence_weights (a stop-gradient weight) at "
            "the same settings"),
        conventions=_PPO, compose=_fipo_composed(FIPO_DEFAULTS),
        params=_PARAMS_HF, fits=_fits_hf("fipo"), known=(_PADDING,)),
    Row(f"{HF}:GRPOTrainer.compute_loss", "policy_objective", _hf_path("dapo"),
        label="dapo, the trainer's path",
        choices=("compute_loss → _compute_loss → _compute_loss_single → "
                 "_compute_loss_and_metrics, called as Trainer.training_step calls it, with a "
                 "stand-in self (as for _compute_loss_and_metrics) and "
                 f"gradient_accumulation_steps "
                 f"= {STEPS}: the returned loss divided by {STEPS}, as training_step divides it "
                 "(model_accepts_loss_kwargs False)",) + _GLOBAL[:1],
        conventions=_PPO, params=("self", "model", "inputs"), fits=lambda fn: _PER_SEQUENCE,
        known=(_PADDING,)),
    # ---- Megatron backend
    Row(MG_LOSS, "policy_objective", _megatron("dapo"), label="dapo", choices=_MG_SELF + (
        "num_items_in_batch = the whole batch's token count, as "
        "_generate_and_score_completions all-reduces it over the step's micro-batches",),
        conventions=_PPO, params=_PARAMS_MG, fits=_fits_hf("dapo"), known=(_PADDING,)),
    Row(MG_LOSS, "policy_objective", _megatron("grpo"), label="grpo", choices=_MG_SELF,
        conventions=dict(_PPO, agg="seq-mean-token-mean", empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS_MG, fits=_fits_hf("grpo"),
        known=(_PADDING,)),
    Row(MG_LOSS, "policy_objective", _megatron("dr_grpo"), label="dr_grpo",
        choices=_MG_SELF + (f"max_completion_length = {MAX_LEN:g}",),
        conventions=dict(_PPO, agg="seq-mean-token-sum", norm=MAX_LEN, empty_rows="include"),
        audit=dict(accumulation="mean"), params=_PARAMS_MG, fits=_fits_hf("dr_grpo"),
        known=(_PADDING,)),
    Row(MG_LOSS, "policy_objective", _megatron("fipo"), label="fipo",
        choices=_MG_SELF + ("loss_type 'fipo' at GRPOConfig's FIPO defaults; judged against "
                            "the reference composition (PPO with the advantage times "
                            "fipo_influence_weights)",),
        conventions=_PPO, compose=_fipo_composed(FIPO_DEFAULTS),
        params=_PARAMS_MG, fits=_fits_hf("fipo"), known=(_PADDING,)),
) + _influence_rows(f"{HF}:GRPOTrainer") + _influence_rows(f"{MG}:MegatronGRPOTrainer") + \
    _correction_rows(HF, "GRPOTrainer") + _correction_rows(MG, "MegatronGRPOTrainer")


TRAINER = Trainer(
    name="ms-swift", package="swift", dist="ms-swift", profile="trl", pinned="4.6.0",
    modules=(ADV, HF, MG), rows=ROWS,
    # trl: GRPOTrainer's base class, none of whose code runs here; datasets and pandas
    # (swift.utils imports them): unused by the math, seconds to import
    stand_in=("trl", "datasets", "pandas"),
    by_file=True,       # its package's normal import needs modelscope and costs seconds
    inventory=((ADV, r"compute_advantages(_dynamic)?|compute_teacher_\w+|"
                     r"expand_advantage_to_per_token|apply_rlsd_reweight|compute_sdar_loss|"
                     r"_sdar_agg_loss"),
               (HF, r"GRPOTrainer\.(compute_loss|_compute_loss_and_metrics|_compute_advantages|"
                    r"compute_std|compute_liger_loss|_get_rollout_is_correction|"
                    r"_compute_fipo_influence|_undo_gradient_accumulation_scaling|"
                    r"_compute_sequence_level_ratios|_apply_rollout_importance_sampling|"
                    r"_compute_off_policy_sequence_mask)"),
               (MG, r"MegatronGRPOTrainer\.(loss_func|_compute_fipo_influence|_compute_advantages|"
                    r"_compute_kl_from_batches|"
                    r"_compute_sequence_level_ratios|_apply_rollout_importance_sampling|"
                    r"_compute_off_policy_sequence_mask)")),
    not_run=tuple((f"{cls}._compute_sequence_level_ratios",
                   "the geometric mean of a sequence's token ratios, run inside the "
                   "_apply_rollout_importance_sampling rows [sequence_truncate, sequence_mask]")
                  for cls in ("GRPOTrainer", "MegatronGRPOTrainer")) + (
             ("GRPOTrainer._undo_gradient_accumulation_scaling",
              "a factor of the accumulation steps, run inside the compute_loss row [dapo, the "
              "trainer's path], whose loss it scales"),
             ("GRPOTrainer.compute_std",
              "the per-group reward std that dynamic sampling (DAPO's filter) thresholds: a "
              "resampling criterion, not an advantage or a loss"),
             ("GRPOTrainer.compute_liger_loss",
              "the liger-kernel fused loss (use_liger_loss): Liger's own card audits "
              "LigerFusedLinearGRPOLoss"),
             ("GRPOTrainer._get_rollout_is_correction",
              "old − rollout log-ratio passed to _apply_rollout_importance_sampling, whose rows "
              "run"),
             ("MegatronGRPOTrainer._compute_kl_from_batches",
              "kl_in_reward's per-sequence KL gathered over Megatron's micro-batches: no row "
              "runs kl_in_reward"),
             ("expand_advantage_to_per_token",
              "without a teacher a broadcast of [B] over [B, T], the HF loss rows' adapters' "
              "input; with a teacher (OPD-RL) no reference yet"),
             ("compute_teacher_kl_per_token", "a monitoring metric (OPD-RL): not in the loss"),
             ("compute_teacher_logratio", "OPD-RL's teacher signal: no reference yet"),
             ("apply_rlsd_reweight", "RLSD's teacher reweighting: no reference yet"),
             ("compute_sdar_loss", "SDAR's distillation loss: no reference yet"),
             ("_sdar_agg_loss", "SDAR's aggregation: no reference yet")),
    runs=("advantages: grpo at scale group, batch and none, rloo, reinforce_plus_plus at group "
          "scale, on equal consecutive groups (groups of one included); the dynamic form on "
          "groups of any size and order",
          "HF loss types dapo (ε 0.2/0.2 and 0.2/0.28, β 0 and 0.04), grpo, bnpo, dr_grpo, "
          "cispo, sapo, GSPO (sequence level) and fipo; compute_loss with gradient accumulation "
          f"{STEPS} as the Trainer calls it", "Megatron loss_func: dapo, grpo, dr_grpo, fipo",
          "FIPO's influence weight at GRPOConfig's defaults and with a symmetric clip, a decay "
          "of 2 tokens and delta 10, on both backends", "the rollout importance-sampling "
          f"weights in their four modes (threshold {IS_THRESHOLD:g}) and the off-policy "
          f"sequence mask (delta {OPSM_DELTA:g}), on both backends"),
    does_not_run=("scale_rewards 'gdpo' (several reward functions)", "kl_in_reward",
                  "the rollout importance-sampling weights and the off-policy sequence mask "
                  "inside the loss (each runs as its own row)", "the entropy mask",
                  "loss_type 'real'", "OPD-RL teachers, RLSD, SDAR",
                  "several processes or data-parallel ranks", "the liger loss path"),
    notes=("GRPOTrainer.compute_loss is also run whole (the trainer-path row): a loss whose "
           "accumulation is wrong for the Trainer's division by gradient_accumulation_steps "
           "shows there as a common factor",),
)
