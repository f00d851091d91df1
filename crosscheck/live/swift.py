"""The live audit of ms-swift's GRPOTrainer (swift/rlhf_trainers/grpo_trainer.py, read at
ms-swift 4.6.0 and 4.5.3). It subclasses TRL's GRPOTrainer and keeps TRL's loop (Trainer.
training_step, `_get_per_token_logps_and_entropies`, `_metrics`), so the watch is TRL's
(crosscheck/live/trl.py) with ms-swift's own `_compute_loss` signature, settings and loss.

What differs from TRL, read from ms-swift's code (`_compute_loss_and_metrics`):
- `_compute_loss(model, model_inputs, grpo_batch, origin_data=None)`: the loss's inputs travel
  in `grpo_batch` (completion_mask, advantages [B, T], old/ref_per_token_logps,
  num_items_in_batch); with `overlong_filter` the truncated rows leave the mask;
- the returned loss is *not* divided by the accumulation steps: `Trainer.training_step`
  divides it (`model_accepts_loss_kwargs = False`, set in `GRPOTrainer.__init__`);
- the KL term is β · k3(ref, logp) (`exp(ref − logp) − (ref − logp) − 1`, the log ratio
  clamped to ±20 and k3 to ≤ 10), with no importance weight (TRL's use_bias_correction_kl has
  no ms-swift counterpart); a step where a clamp binds is not checked;
- loss types and their aggregation over the step are TRL's (grpo, sapo, bnpo, dr_grpo, and
  'dapo', 'cispo', 'fipo' by the token count of the accumulation window on all processes:
  `WINDOW_NORMALIZED_LOSS_TYPES`). Per micro-batch those three divide by
  `num_items_in_batch / num_processes` (the generation batch's completion tokens,
  `_prepare_batch_inputs`) and, from 4.6.0 (#10116), multiply by the accumulation steps
  (`_undo_gradient_accumulation_scaling`: "dividing them would shrink the loss and its
  gradient by that factor"); 4.5.3 and earlier do not, so their gradient is 1/G of the
  documented objective's (#10117), which the gradient check reports;
- 'fipo' (arXiv 2603.19835): the clipped PPO loss times the stop-gradient influence weight of
  `_compute_fipo_influence`, the reference's `fipo_influence_weights` at the run's
  `fipo_decay_rate`, `fipo_clip_range`, `fipo_clip_high_only`, `fipo_safety_threshold` and
  `delta`; the weight multiplies the advantage of each token (the same as the loss, the weight
  being positive);
- SAPO's temperatures are `tau_pos`/`tau_neg`.
"""
from typing import List

import numpy as np

import ref_numpy

from .. import bridge
from . import trl
from .objective import MicroBatch, Objective

C = "swift/rlhf_trainers/grpo_trainer.py::_compute_loss_and_metrics"
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
)
KL_LOG_CLAMP, KL_CLAMP = 20.0, 10.0          # `safe_ratio` and `per_token_kl` clamps


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

    def _configured(self) -> dict:
        a = self.t.args
        out = {attr: getattr(a, field) for attr, field in SETTINGS if hasattr(a, field)}
        out["epsilon_high"] = a.epsilon_high if a.epsilon_high is not None else a.epsilon
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
        report.not_expressed.append("advantages: ms-swift's _compute_advantages is not read "
                                    "(its rows reach the loss as given)")
        report.not_expressed.append("provenance (rows, their advantages, the mask, the old and "
                                    "reference log-probs, the temperature, the reward weights): "
                                    "ms-swift generates and scores in its own code, which the "
                                    "audit does not wrap")
        return report

    def _finish_report(self, report):
        """The scope (what is compared, what is trusted) in TRL's words: the same checks on
        the same tensors."""
        report.words.update({k: v.replace("TRL", "ms-swift") for k, v in trl.WORDS.items()
                             if k != "advantages"})
        report.trusted = list(trl.TRUSTED)
        if self._kw and self._kw.get("beta"):
            report.trusted.append(trl.REF_TRUSTED)
        self._rank_scope(report)

    @staticmethod
    def _swift_policy(lt, level, lo, hi, a, no):
        if level not in ("token", "sequence"):
            no.append(f"importance_sampling_level {level!r} (GSPO-token)")
            return None
        if lt in ("grpo", "bnpo", "dr_grpo", "dapo", "fipo"):
            if lt == "fipo" and level != "token":
                no.append("loss_type 'fipo' with importance_sampling_level='sequence'")
                return None
            return trl.TRLWatch._policy("dapo", level, lo, hi, a, no)
        if lt == "cispo":
            return trl.TRLWatch._policy("cispo", level, lo, hi, a, no)
        if lt == "sapo":
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
        self._wrap("_compute_loss", self._compute_loss)
        self._wrap("_get_per_token_logps_and_entropies", self._logps)
        if self.stream is not None and self.rank == 0 and self.report.not_expressed:
            self.stream.write("crosscheck live: not checked: "
                              + "; ".join(self.report.not_expressed) + "\n")
        return self

    def _compute_loss(self, orig):
        def compute_loss(model, model_inputs, grpo_batch, *args, **kwargs):
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
            return loss
        return compute_loss

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
