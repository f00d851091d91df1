"""The live audit of ms-swift's GRPOTrainer (swift/rlhf_trainers/grpo_trainer.py, read at
ms-swift 4.6.0 and 4.5.3). It subclasses TRL's GRPOTrainer and keeps TRL's loop (Trainer.
training_step, `_get_per_token_logps_and_entropies`, `_metrics`), so the watch is TRL's
(crosscheck/live/trl.py) with ms-swift's own `_compute_loss` signature, settings, loss and
provenance.

What it wraps beyond TRL's training_step and log-probs: `_generate_and_score_completions` (a
list of micro-batches, `model_inputs` and `grpo_batch`: the rows, their advantages and token
counts), `_compute_advantages` (the rewards, after dynamic sampling), `_dynamic_sampling` (the
batch it keeps) and `_compute_loss(model, model_inputs, grpo_batch, origin_data=None)`.

What differs from TRL, read from ms-swift's code (`_compute_loss_and_metrics`):
- the loss's inputs travel in `grpo_batch` (completion_mask, advantages [B, T], old/ref
  log-probs, num_items_in_batch); with `overlong_filter` the truncated rows leave the mask;
  old log-probs are computed at every generation (`_prepare_batch_inputs`);
- the returned loss is *not* divided by the accumulation steps: `Trainer.training_step`
  divides it (`model_accepts_loss_kwargs = False`, set in `GRPOTrainer.__init__`);
- the KL term is β · k3(ref, logp) (`exp(ref − logp) − (ref − logp) − 1`, the log ratio
  clamped to ±20 and k3 to ≤ 10), with no importance weight (TRL's use_bias_correction_kl has
  no ms-swift counterpart); a step where a clamp binds is not checked;
- `importance_sampling_level` 'sequence' is GSPO (the reference's gspo form 'sequence'),
  'sequence_token' GSPO-token (form 'token');
- loss types and their aggregation over the step are TRL's (grpo, sapo, bnpo, dr_grpo, and
  'dapo', 'cispo', 'fipo' by the token count of the accumulation window on all processes:
  `WINDOW_NORMALIZED_LOSS_TYPES`). Per micro-batch those three divide by
  `num_items_in_batch / num_processes` (the generation batch's completion tokens before the
  overlong filter, `_prepare_batch_inputs`) and, from 4.6.0 (#10116), multiply by the
  accumulation steps (`_undo_gradient_accumulation_scaling`); 4.5.3 and earlier do not, so their
  gradient is 1/G of the documented objective's (#10117), which the gradient check reports, as
  it reports the generation's count where it spans several windows (steps_per_generation above
  the accumulation steps) or counts rows the overlong filter removed;
- 'fipo' (arXiv 2603.19835): the clipped PPO loss times the stop-gradient influence weight of
  `_compute_fipo_influence`, the reference's `fipo_influence_weights` at the run's
  `fipo_decay_rate`, `fipo_clip_range`, `fipo_clip_high_only`, `fipo_safety_threshold` and
  `delta`; the weight multiplies the advantage of each token (the same as the loss, the weight
  being positive);
- the advantages are `swift/rl_core/advantage.py::compute_advantages`: the group mean,
  `torch.std` (ddof 1), + 1e-4;
- SAPO's temperatures are `tau_pos`/`tau_neg`.
"""
from typing import List

import numpy as np
import torch

import ref_numpy

from .. import bridge
from . import checks, provenance, trl
from .objective import MicroBatch, Objective

C = "swift/rlhf_trainers/grpo_trainer.py::_compute_loss_and_metrics"
GEN = "swift/rlhf_trainers/rollout_mixin.py::_generate_and_score_completions"
PREP = "swift/rlhf_trainers/grpo_trainer.py::_prepare_inputs"
ADV = "swift/rl_core/advantage.py::compute_advantages (grpo_trainer.py::_compute_advantages)"
DYN = "swift/rlhf_trainers/grpo_trainer.py::_dynamic_sampling"
LOGPS = ("swift/rlhf_trainers/grpo_trainer.py::_get_logps_via_local_forward: logits ÷ "
         "temperature")
# ms-swift's advantage conventions (compute_advantages): the group mean, torch.std (ddof 1),
# + 1e-4; rewards summed with nansum, so a row every function left NaN stays in its group at 0
ADV_CONVENTIONS = dict(ddof=1, eps=1e-4, baseline="mean")
WINDOW = ("dapo", "cispo", "fipo")           # ms-swift's WINDOW_NORMALIZED_LOSS_TYPES
AGGREGATION = {**trl.AGGREGATION, "fipo": trl.AGGREGATION["dapo"]}
# the settings ms-swift's GRPOTrainer copies from its configuration into attributes its loss,
# advantages or sampling read (`_prepare_algorithm_params`, `__init__`): (attribute, field)
SETTINGS = (
    ("loss_type", "loss_type"), ("importance_sampling_level", "importance_sampling_level"),
    ("beta", "beta"), ("epsilon_low", "epsilon"), ("epsilon_high", "epsilon_high"),
    ("scale_rewards", "scale_rewards"), ("num_generations", "num_generations"),
    ("num_iterations", "num_iterations"), ("max_completion_length", "max_completion_length"),
    ("top_entropy_quantile", "top_entropy_quantile"), ("tau_pos", "tau_pos"),
    ("tau_neg", "tau_neg"), ("overlong_filter", "overlong_filter"),
    ("dynamic_sample", "dynamic_sample"), ("kl_in_reward", "kl_in_reward"),
    ("advantage_estimator", "advantage_estimator"),
    ("off_policy_sequence_mask_delta", "off_policy_sequence_mask_delta"),
    ("rollout_importance_sampling_mode", "rollout_importance_sampling_mode"),
    ("fipo_clip_range", "fipo_clip_range"), ("fipo_clip_high_only", "fipo_clip_high_only"),
    ("fipo_safety_threshold", "fipo_safety_threshold"), ("sdar_loss_coef", "sdar_loss_coef"),
    ("temperature", "temperature"), ("reward_weights", "reward_weights"),
)
KL_LOG_CLAMP, KL_CLAMP = 20.0, 10.0          # `safe_ratio` and `per_token_kl` clamps
# what each check compares, where ms-swift's differs from TRL's (trl.WORDS, provenance.WORDS)
WORDS = {
    "advantages": "the advantages each of this process's rows carries at generation, against "
                  "group_advantages (group mean, std with ddof 1, + 1e-4, at scale_rewards) of "
                  "Σ reward_weights·rewards_per_func as _compute_advantages received them "
                  "(after dynamic sampling)",
    "dynamic sampling": "with dynamic_sample, every group of the batch _compute_advantages "
                        "receives has reward spread > 0 (the groups of spread 0 replaced by "
                        "resampling, _dynamic_sampling)",
    "rows": "each completion, identified by a hash of its input ids under the attention mask, "
            "reaches the loss once in every pass of steps_per_generation micro-steps over its "
            "generation, for num_iterations passes, and no row of another generation does "
            "(every micro-step is hashed, sampled or not)",
    "row advantages": "the advantage each row carries into the loss, against the one "
                      "_generate_and_score_completions placed on that completion",
    "global counts": "num_items_in_batch, against the completion-mask count of the micro-"
                     "batch's generation on every process (_prepare_batch_inputs)",
    "old log-probs": "old_per_token_logps (computed at every generation, _prepare_batch_inputs) "
                     "at a micro-step with no optimizer step since the generation, against the "
                     "log-probs the loss received (ratio 1)",
    "temperature": "the sampler's temperature (request_config) against the configured "
                   "temperature, and one row's log-probs in the loss against log-softmax(the "
                   "policy's logits ÷ temperature) (one forward without gradient per sampled "
                   "step)",
}
MASK_TRUSTED = ("the completion mask, as ms-swift's template builds it from its labels (labels "
                "≠ −100), and the truncation flags the overlong filter reads (the sampler's "
                "finish reason): the loss and gradient checks drop the flagged rows from that "
                "mask as overlong_filter does")


def is_swift_grpo(trainer) -> bool:
    return any(c.__name__ == "GRPOTrainer" and c.__module__.startswith("swift.")
               for c in type(trainer).__mro__)


def _version() -> str:
    try:
        from swift.version import __version__
        return __version__
    except Exception:                                    # pragma: no cover
        return "?"


class SwiftWatch(trl.TRLWatch):
    """`crosscheck.live.watch` for an ms-swift GRPOTrainer (see the module docstring)."""
    SETTINGS = SETTINGS

    def _provenance(self):
        return SwiftProvenance(self.t, self.rank)

    def _configured(self) -> dict:
        a, t = self.t.args, self.t
        out = {attr: getattr(a, field) for attr, field in SETTINGS if hasattr(a, field)}
        out["epsilon_high"] = a.epsilon_high if a.epsilon_high is not None else a.epsilon
        out.pop("reward_weights", None)
        n = len(getattr(t, "reward_funcs", []) or [])
        w = [float(x) for x in (a.reward_weights if a.reward_weights is not None else [1.0] * n)]
        if len(w) == len(trl._weights(t)):
            out["reward_weights"] = w
        return out

    def _read_config(self):
        t, a = self.t, self.t.args
        conf = self._configured()
        lt, level = conf["loss_type"], conf["importance_sampling_level"]
        beta = float(conf["beta"])
        kl_in_reward = bool(getattr(a, "kl_in_reward", False))
        lo, hi = float(conf["epsilon_low"]), float(conf["epsilon_high"])
        gas, spg = int(a.gradient_accumulation_steps), int(a.steps_per_generation)
        config = [
            ("loss_type", lt, "GRPOConfig.loss_type → " + C),
            ("importance_sampling_level", level, "GRPOConfig → " + C),
            ("epsilon_low", lo, "GRPOConfig.epsilon → trainer.epsilon_low"),
            ("epsilon_high", hi, "GRPOConfig.epsilon_high → trainer.epsilon_high"),
            ("delta", a.delta, "GRPOConfig.delta: coef_1 clamped above, " + C),
            ("beta", beta, "GRPOConfig.beta: β·k3 added per token, " + C),
            ("kl_in_reward", kl_in_reward, "GRPOConfig: the KL in the reward, not the loss"),
            ("scale_rewards", a.scale_rewards, "GRPOConfig.scale_rewards"),
            ("num_generations", int(a.num_generations), "GRPOConfig"),
            ("gradient_accumulation_steps", gas, "TrainingArguments"),
            ("steps_per_generation", spg, "GRPOConfig → _prepare_inputs"),
            ("num_iterations", int(a.num_iterations), "GRPOConfig → _prepare_inputs"),
            ("overlong_filter", bool(a.overlong_filter), "GRPOConfig → " + C),
            ("dynamic_sample", bool(a.dynamic_sample),
             "GRPOConfig → _score_completions (the rows the loss receives)"),
            ("world size", self.world, "accelerator.num_processes"),
        ]
        if lt == "dr_grpo":
            config.append(("max_completion_length", a.max_completion_length,
                           "GRPOConfig → " + C + " (loss_type 'dr_grpo')"))
        if lt == "sapo":
            config.append(("tau_pos/tau_neg", (a.tau_pos, a.tau_neg), "GRPOConfig"))
        if lt == "fipo":
            config.append(("fipo_decay_rate/clip_range/clip_high_only/safety_threshold",
                           (a.fipo_decay_rate, a.fipo_clip_range, a.fipo_clip_high_only,
                            a.fipo_safety_threshold), "GRPOConfig → _compute_fipo_influence"))
        no: List[str] = []
        kw = self._swift_policy(lt, level, lo, hi, a, no)
        LOSS, GRAD = "micro-batch loss", "gradient"
        blocks = {LOSS: list(no), GRAD: list(no), "metrics": list(no)}

        def cannot(what, *affected):
            no.append(what)
            for c in affected:
                blocks[c].append(what)
        if a.top_entropy_quantile < 1.0:
            cannot(f"top_entropy_quantile={a.top_entropy_quantile} (the entropy mask)", LOSS,
                   GRAD)
        if getattr(a, "off_policy_sequence_mask_delta", None) is not None:
            cannot("off_policy_sequence_mask_delta (the off-policy sequence mask)", LOSS, GRAD)
        if getattr(a, "rollout_importance_sampling_mode", None) is not None:
            cannot("rollout_importance_sampling_mode (the rollout correction in the loss)",
                   LOSS, GRAD)
        if getattr(a, "sdar_loss_coef", 0) or getattr(t, "chord_sft_iterator", None) is not None:
            cannot("an auxiliary loss (SDAR, CHORD) added to the policy loss", LOSS, GRAD)
        explicit = getattr(t, "_has_teacher_explicit", None)
        if callable(explicit) and explicit():
            # (the dynamic self-distillation of a batch with a teacher_prompt gives per-token
            # advantages too: a micro-batch with them is an audit error, never a guess)
            cannot("a teacher (OPD-RL): per-token advantages from the teacher's KL", LOSS, GRAD)
        if getattr(t, "use_liger_loss", False):
            cannot("use_liger_loss (the loss is computed inside the fused kernel)", LOSS, GRAD)
        if getattr(t.template, "padding_free", False) or \
                getattr(t.template, "sequence_parallel_size", 1) > 1:
            cannot("padding_free or sequence parallelism (log-probs unpadded per rank)",
                   LOSS, GRAD)
        if getattr(t, "dynamic_num_samples", False):
            cannot("a dynamic number of samples per prompt (chunked loss)", LOSS, GRAD)
        self._blocks = {c: w for c, w in blocks.items() if w}
        self._kw = None if kw is None else {**kw, "beta": 0.0 if kl_in_reward else beta,
                                            "kl_kind": "k3"}
        scope, agg, words = AGGREGATION.get(lt, ("step", {}, f"loss_type {lt!r}"))
        if lt == "dr_grpo":
            agg = {**agg, "norm": float(a.max_completion_length)}
        self._scope, self._agg = scope, agg
        self._spg, self._lt = spg, lt
        # ms-swift logs kl and clip_ratio/region_mean as the mean over processes of each
        # process's token mean: the reference's token mean over every rank equals it on one
        self._metrics_ok = lt in ("grpo", "bnpo", "dr_grpo", "dapo") and level == "token" \
            and self.world == 1
        report = trl.Report("ms-swift " + _version(), config, f"loss_type {lt!r}: {words}",
                            "", self.every, self.world, not_expressed=no)
        self._finish_report(report)
        return report

    def _finish_report(self, report):
        """The scope: what each check compares in ms-swift's terms, and what is trusted."""
        report.words.update({k: v.replace("TRL", "ms-swift") for k, v in trl.WORDS.items()})
        report.words.update(provenance.WORDS)
        report.words.update(WORDS)
        report.trusted = list(trl.TRUSTED) + [MASK_TRUSTED]
        report.not_applicable.update(self.prov.not_applicable)
        if self._kw and self._kw.get("beta") and getattr(self.t, "ref_model", None) is None:
            report.trusted.append(trl.REF_TRUSTED)
        self._rank_scope(report)

    @staticmethod
    def _swift_policy(lt, level, lo, hi, a, no):
        """The documented per-token policy loss of `loss_type` at `importance_sampling_level`
        (`_compute_loss_and_metrics`): 'sequence' takes the length-normalised sequence ratio
        and differentiates through it (GSPO, the reference's form 'sequence'); 'sequence_token'
        is GSPO-token, exp(logp − sg(logp) + sg(log s)), its gradient reaching each token
        through its own log-prob only (form 'token')."""
        if level not in ("token", "sequence", "sequence_token"):
            no.append(f"importance_sampling_level {level!r}")
            return None
        if lt in ("grpo", "bnpo", "dr_grpo", "dapo", "fipo"):
            if lt == "fipo" and level != "token":
                no.append(f"loss_type 'fipo' with importance_sampling_level={level!r}")
                return None
            if level == "token":
                return dict(loss="ppo", clip_low=lo, clip_high=hi, delta=a.delta)
            if a.delta is not None:
                no.append(f"delta with importance_sampling_level={level!r}")
                return None
            return dict(loss="gspo", form="sequence" if level == "sequence" else "token",
                        clip_low=lo, clip_high=hi)
        if lt == "cispo":
            return trl.TRLWatch._policy("cispo", level, lo, hi, a, no)
        if lt == "sapo":
            if level == "sequence_token":
                no.append("loss_type 'sapo' with importance_sampling_level='sequence_token'")
                return None
            return dict(loss="sapo", tau_pos=float(a.tau_pos), tau_neg=float(a.tau_neg),
                        level=level)
        no.append(f"loss_type {lt!r}")
        return None

    def _documented(self) -> Objective:
        return Objective({**self._kw, **self._agg}, self._scope,
                         f"GRPOConfig.loss_type={self._lt!r}; {C}")

    def _formula(self, mb: MicroBatch):
        """ms-swift's loss for one micro-batch, as Trainer.training_step receives it before
        dividing by the accumulation steps: (aggregate keywords, factor, source)."""
        gas = mb.meta["gas"]
        if self._lt in WINDOW:
            norm = max(mb.meta["num_items_in_batch"], 1.0) / self.world
            return ({**self._kw, "agg": "seq-mean-token-sum-norm", "norm": norm}, float(gas),
                    C + ": ÷ (num_items_in_batch / num_processes) × accumulation steps "
                        "(_undo_gradient_accumulation_scaling)")
        return {**self._kw, **self._agg}, 1.0, C + " (Trainer.training_step ÷ accumulation)"

    def _alternatives(self):
        return []

    # ------------------------------------------------------------------ wrapping
    def __enter__(self):
        self._wrap("training_step", self._training_step)
        self._wrap("_generate_and_score_completions", self._generate)
        self._wrap("_compute_advantages", self._compute_advantages)
        self._wrap("_dynamic_sampling", self._dynamic_sampling)
        self._wrap("_compute_loss", self._compute_loss)
        self._wrap("_get_per_token_logps_and_entropies", self._logps)
        if self.stream is not None and self.rank == 0 and self.report.not_expressed:
            self.stream.write("crosscheck live: not checked: "
                              + "; ".join(self.report.not_expressed) + "\n")
        return self

    def _generate(self, orig):
        def generate(*args, **kwargs):
            self._rewards = None
            out = orig(*args, **kwargs)
            if self.t.model.training:
                with self._own():
                    self.prov.generated_swift(out)
                    if self._sampled and self._rewards is not None:
                        adv = [bridge.to_numpy(m["grpo_batch"].advantages)[:, 0] for m in out]
                        self._adv.append((self.rank, np.concatenate(adv), self._rewards))
            return out
        return generate

    def _compute_advantages(self, orig):
        def compute_advantages(samples, rewards_per_func, *args, **kwargs):
            if self._sampled and self.t.model.training:
                with self._own():
                    self._rewards = bridge.to_numpy(rewards_per_func).astype(np.float64)
            return orig(samples, rewards_per_func, *args, **kwargs)
        return compute_advantages

    def _dynamic_sampling(self, orig):
        def dynamic_sampling(samples, rewards_per_func, *args, **kwargs):
            out = orig(samples, rewards_per_func, *args, **kwargs)
            if self._sampled and self.t.model.training and self.rank == 0:
                with self._own():
                    self.prov.dynamic(out[1], kept_first=out[1] is rewards_per_func)
            return out
        return dynamic_sampling

    def _compute_loss(self, orig):
        def compute_loss(model, model_inputs, grpo_batch, *args, **kwargs):
            keys = None
            if self.t.model.training:
                with self._own():
                    keys = self.prov.use_keys(swift_row_keys(model_inputs))
            if not (self._sampled and self.t.model.training and self._kw is not None):
                return orig(model, model_inputs, grpo_batch, *args, **kwargs)
            metrics = self.t._metrics["train"]
            before = {k: len(v) for k, v in metrics.items()}
            self._capture = cap = {}
            try:
                loss = orig(model, model_inputs, grpo_batch, *args, **kwargs)
            finally:
                self._capture = None
            if "logp" in cap:
                with self._own():
                    cap["logged"] = {k: float(v[-1]) for k, v in metrics.items()
                                     if k in trl.METRICS and len(v) > before.get(k, 0)}
                    self._record(grpo_batch, loss, cap)
                    self.prov.micro_batch_swift(model, model_inputs, grpo_batch, keys,
                                                cap["logp"], len(self._mbs) - 1, cap["dtype"])
            return loss
        return compute_loss

    def _adv_unchecked(self):
        """Why ms-swift's advantages are outside the reference's group_advantages, or None."""
        a, t = self.t.args, self.t
        if getattr(a, "advantage_estimator", "grpo") != "grpo":
            return f"advantage_estimator {a.advantage_estimator!r}"
        if a.scale_rewards not in ("group", "batch", "none"):
            return f"scale_rewards {a.scale_rewards!r}"
        if getattr(a, "kl_in_reward", False) and float(a.beta):
            return "kl_in_reward (the KL subtracted from the rewards before normalising)"
        if getattr(t, "dynamic_num_samples", False):
            return "a dynamic number of samples per prompt (compute_advantages_dynamic)"
        if int(a.num_generations) < 2:
            return "groups of one completion"
        if any(w for w in ("advantage_reweight",) if getattr(t, w, None) == "rlsd"):
            return "RLSD's token reweighting of the advantages"
        return None

    def _check_advantages(self, res, gathered, tol):
        why = self._adv_unchecked()
        if why:
            res.skipped["advantages"] = why
            return
        a = self.t.args
        conv = dict(ADV_CONVENTIONS, scale=a.scale_rewards, group_size=int(a.num_generations))
        weights = np.asarray(self._configured().get("reward_weights", trl._weights(self.t)),
                             dtype=np.float64)
        for p in gathered:
            for rank, got, per_func in p["adv"]:
                with np.errstate(invalid="ignore"):
                    rewards = np.nansum(per_func * weights[None, :], axis=1)
                n = got.shape[0]
                at = slice(rank * n, (rank + 1) * n)
                checks.advantages(res, got, rewards, at, conv,
                                  ADV + f" (scale_rewards={a.scale_rewards!r})", tol, rank)
                provenance.reward_weights(res, per_func, weights, got, at, conv, tol, rank,
                                          source=ADV)

    def _record(self, b, loss, cap):
        mask = bridge.to_numpy(b.completion_mask) != 0
        if self.t.overlong_filter and b.truncated_mask is not None:
            mask = mask & ~(bridge.to_numpy(b.truncated_mask)[:, None] != 0)
        logp = cap["logp"]
        old = logp if b.old_per_token_logps is None else bridge.to_numpy(b.old_per_token_logps)
        ref = None
        if self._kw.get("beta"):
            ref = bridge.to_numpy(b.ref_per_token_logps)
            d = np.where(mask, ref - logp, 0.0)
            if np.abs(d).max(initial=0.0) > KL_LOG_CLAMP or \
                    (np.exp(d) - d - 1).max(initial=0.0) > KL_CLAMP:
                raise ValueError("a KL clamp of ms-swift binds at this step (|ref − logp| > 20 "
                                 "or k3 > 10): the reference's k3 has no clamp")
        adv = bridge.to_numpy(b.advantages)
        if adv.ndim == 2:
            rows = np.where(mask, adv, np.nan)
            first = np.nanmax(np.where(mask.any(1)[:, None], rows, 0.0), axis=1)
            if not np.all(np.where(mask, adv == first[:, None], True)):
                raise ValueError("per-token advantages that differ within a completion")
            adv = np.where(mask.any(1), first, adv[:, 0])
        if self._lt == "fipo":
            adv = adv[:, None] * self._fipo_weights(logp, old, adv, mask)
        mb = MicroBatch(
            rank=self.rank, index=len(self._mbs), logp=logp, old_logp=old, advantages=adv,
            mask=mask, ref_logp=ref, loss=float(loss.detach()), dtype=cap["dtype"],
            meta=dict(gas=int(self.t.current_gradient_accumulation_steps),
                      num_items_in_batch=float(b.num_items_in_batch),
                      logged=cap.get("logged", {}), entropy=None))
        self._mbs.append(mb)
        self._holders.append(cap)

    def _fipo_weights(self, logp, old, adv, mask):
        """`_compute_fipo_influence`'s weight by the reference (fipo_influence_weights)."""
        a = self.t.args
        c = a.fipo_clip_range
        lower = (1.0 if a.fipo_clip_high_only else 1.0 - c) if c else None
        upper = 1.0 + c if c else None
        return ref_numpy.fipo_influence_weights(
            logp, old, np.broadcast_to(adv[:, None], logp.shape), mask,
            decay_rate=float(a.fipo_decay_rate), lower=lower, upper=upper,
            ratio_threshold=a.delta, safety_threshold=a.fipo_safety_threshold)


def swift_row_keys(model_inputs):
    """One key per row of an ms-swift micro-batch: its input ids (prompt and completion) under
    the attention mask."""
    ids = model_inputs["input_ids"]
    am = model_inputs.get("attention_mask")
    if am is None:
        am = torch.ones_like(ids)
    return provenance.row_keys(ids, am, ids[:, :0])


class SwiftProvenance(provenance.Provenance):
    """crosscheck.live.provenance on ms-swift's structures: a generation is the list of micro-
    batches `_generate_and_score_completions` returns (`model_inputs`, `grpo_batch`), buffered
    and served by `_prepare_inputs` one per micro-step, regenerated every steps_per_generation ·
    num_iterations micro-steps; old log-probs are computed at every generation."""
    G, P, C, LOGPS = GEN, PREP, C, LOGPS
    SAMPLER = "swift/rlhf_trainers/rollout_mixin.py: request_config.temperature"

    def __init__(self, trainer, rank):
        super().__init__(trainer, rank)
        self.old_given = True
        self.not_applicable.pop("old log-probs", None)
        self.mask_why = MASK_TRUSTED

    def generated_swift(self, mbs):
        keys, adv, total = [], [], 0.0
        for m in mbs:
            b = m["grpo_batch"]
            keys += swift_row_keys(m["model_inputs"])
            adv += list(bridge.to_numpy(b.advantages))
            total += float(b.completion_mask.sum().item())
        self.new_generation(keys, adv, total)

    def micro_batch_swift(self, model, model_inputs, b, keys, logp, index, dtype):
        inputs = dict(advantages=b.advantages, completion_mask=b.completion_mask,
                      old_per_token_logps=b.old_per_token_logps,
                      ref_per_token_logps=b.ref_per_token_logps,
                      num_items_in_batch=b.num_items_in_batch, model_inputs=model_inputs,
                      logits_to_keep=b.logits_to_keep)
        self.micro_batch(model, inputs, keys, logp, index, dtype)

    def _row_logits(self, model, inputs, row):
        """`_get_logps_via_local_forward`'s frame: the logits before each of the last
        logits_to_keep input ids, from the model's own forward."""
        mi, k = inputs["model_inputs"], int(inputs["logits_to_keep"])
        kw = {name: mi[name][row:row + 1] for name in ("input_ids", "attention_mask",
                                                       "position_ids")
              if mi.get(name) is not None}
        with torch.no_grad(), self.t.accelerator.autocast():
            z = model(**kw).logits[:, -(k + 1):-1]
        return z.detach(), kw["input_ids"][0, -k:]

    def _sampler_temperature(self):
        return getattr(getattr(self.t, "request_config", None), "temperature", None)

    def dynamic(self, per_func, kept_first):
        """The batch dynamic sampling returned: every group's reward spread > 0 (the criterion
        of `_dynamic_sampling`, `compute_std` > 0), unless it kept the first batch."""
        if kept_first:
            self._skip("dynamic sampling", "ms-swift ran out of max_resample_times and kept the "
                       "first batch (its documented fallback, logged as a warning)")
            return
        t = self.t
        w = np.asarray(trl._weights(t), dtype=np.float64)
        r = np.nansum(bridge.to_numpy(per_func).astype(np.float64) * w[None, :], axis=1)
        k = int(t.num_generations)
        std = r.reshape(-1, k).std(axis=1, ddof=1)
        flat = int((std == 0).sum())
        f = None if not flat else provenance.Finding(
            self.step, "dynamic sampling", "deviation",
            f"{flat} of {std.size} groups in the batch after dynamic sampling have reward "
            f"spread 0 (every completion of the prompt scored alike): dynamic sampling "
            f"replaces them", rank=self.rank, got=float(flat), expected=0.0, source=DYN)
        self._add("dynamic sampling", std.size, flat, finding=f)
