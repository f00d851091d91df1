"""The live audit of TRL's GRPOTrainer (trl/trainer/grpo_trainer.py, read at TRL 1.16.0).

What it wraps, on the trainer instance only (restored on exit):
- `training_step`: counts the micro-steps of each accumulation window; the window's step is
  `state.global_step + 1`, and a sampled window is checked once its last micro-step returned;
- `_calculate_rewards`: the rewards of every process (TRL gathers them before normalising);
- `_generate_and_score_completions`: the advantages it returns (this process's slice);
- `_compute_loss`: its inputs and the loss it returns, and what it logs in `_metrics`;
- `_get_per_token_logps_and_entropies`, while `_compute_loss` runs with gradients on: the
  log-probs the loss receives, with a tensor hook that records ∂(what is back-propagated)/∂logp
  during the trainer's own backward (no extra pass through the model).
The provenance of the loss's inputs (rows by content hash at every micro-step, their advantages,
the mask and num_items_in_batch, old and reference log-probs, the temperature, the reward
weighting) is crosscheck.live.provenance's; this module calls it from the wrappers above.

TRL's conventions, read from `trainer.args`, the configuration the user wrote (the
trainer's own copies of them are compared to it at each sampled step: `configured`):
- the policy loss: `loss_type` with `importance_sampling_level`, `epsilon_low`/`epsilon_high`,
  `delta`, the SAPO temperatures and the VESPO shape; the fixed constants (VESPO's clamps)
  from the TRL profile (crosscheck.audit.profiles);
- the KL term: `beta` · k3(ref, logp), added to the per-token loss before aggregation;
- the aggregation (GRPOConfig.loss_type's help and _compute_loss):
    grpo, sapo   each sequence's token mean, averaged over all sequences of the step
                 (per micro-batch: its mean ÷ the accumulation steps);
    bnpo         each micro-batch's token mean, averaged over the step's micro-batches
                 ("the local batch");
    dr_grpo      Σ over the step's tokens ÷ (its sequences · max_completion_length);
    luspo        each sequence's token sum, averaged over the step's sequences;
    dapo, cispo, vespo   Σ over the step's tokens ÷ its token count ("the global accumulated
                 batch"). Per micro-batch TRL divides by num_items_in_batch (the generation
                 batch's tokens on all processes) ÷ processes · accumulation steps ÷
                 steps_per_generation: the same count only when steps_per_generation equals
                 the accumulation steps, else the generation batch's mean count per window (a
                 documented choice: "rescale it to one accumulation window");
- the advantages: `group_advantages` with the profile's conventions (nanstd, + 1e-4) at
  `scale_rewards`, groups of `num_generations`, unscorable rows (every reward NaN) set to 0.
"""
import contextlib
import time
from typing import Dict, List, Optional

import numpy as np
import torch

import ref_numpy
from ref_numpy.objective import kl_term

from .. import bridge, tolerances
from ..audit.profiles import PROFILES
from . import checks, provenance
from .objective import MicroBatch, Objective, formula_gradient, stacked
from .report import Finding, LiveDeviation, Report, StepResult

C = "trl/trainer/grpo_trainer.py::_compute_loss"
G = "trl/trainer/grpo_trainer.py::_generate_and_score_completions"
PPO_FAMILY = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
BY_TOKEN_COUNT = ("dapo", "cispo", "vespo")
# the documented aggregation of each loss type: (scope, aggregate keywords, in words)
AGGREGATION = {
    "grpo": ("step", dict(agg="seq-mean-token-mean", empty_rows="include"),
             "each sequence's token mean, averaged over the step's sequences"),
    "sapo": ("step", dict(agg="seq-mean-token-mean", empty_rows="include"),
             "each sequence's token mean, averaged over the step's sequences"),
    "bnpo": ("micro-batch", dict(agg="token-mean"),
             "each micro-batch's token mean, averaged over the step's micro-batches"),
    "dr_grpo": ("step", dict(agg="seq-mean-token-sum", empty_rows="include"),
                "the step's token sum ÷ (its sequences · max_completion_length)"),
    "luspo": ("step", dict(agg="seq-mean-token-sum", empty_rows="include"),
              "each sequence's token sum, averaged over the step's sequences"),
    **{k: ("step", dict(agg="token-mean"), "the step's token sum ÷ its token count, on all "
                                           "processes") for k in BY_TOKEN_COUNT},
}
METRICS = ("entropy", "kl", "clip_ratio/region_mean")
# what each check compares, for TRL, and what the audit takes as given (the report's scope)
WORDS = {
    "advantages": "the advantages _generate_and_score_completions returned, against "
                  "group_advantages on the rewards each reward function returned, weighted by "
                  "reward_weights and summed",
    "micro-batch loss": "the loss _compute_loss returned for each micro-batch, against the "
                        "reference objective of the tensors it received (log-probs, old "
                        "log-probs, advantages, mask, and reference log-probs where β > 0), "
                        "under TRL's aggregation",
    "gradient": "∂(what each micro-batch back-propagated)/∂logp at every completion token, "
                "summed over the step and ÷ processes, against ∂J/∂logp of the documented "
                "objective over the step's rows on every process",
    "metrics": "the entropy, kl and clip_ratio/region_mean TRL logged, against the reference's "
               "on the same tensors",
}
TRUSTED = (
    "the rewards, as your reward functions returned them",
    "the completions, and the sampler's truncation of the distribution (top_p, top_k, min_p, "
    "repetition_penalty): the loss scores the untruncated distribution at the temperature",
    "the log-probs the loss received, as the trainer's forward pass computed them (model, "
    "logits ÷ temperature, log-softmax), but for one row per sampled step recomputed from the "
    "policy's own logits (the temperature check)",
    "the old log-probs after an optimizer step since their generation (a later window of "
    "steps_per_generation, a later pass of num_iterations): they are checked in the first "
    "window after each generation only",
    "the backward below the log-probs (∂logp/∂parameters, autograd through the model) and the "
    "optimizer's update (learning rate, gradient clipping, weight decay)",
)
REF_TRUSTED = ("the reference log-probs after step 1 where the reference is the policy with its "
               "adapters disabled (PEFT: no separate reference model to recompute or "
               "checksum)")
SHARDED = "gradients sharded across processes (FSDP, DeepSpeed)"
ALL_REDUCE_TRUSTED = ("the all-reduce: each process's gradient is taken to be averaged over "
                      "the processes")
# the methods wrapped: the first three are needed for the loss and gradient checks
REQUIRED = ("training_step", "_compute_loss", "_get_per_token_logps_and_entropies")
OPTIONAL = ("_calculate_rewards", "_generate_and_score_completions")


def _profile(name):
    return dict(PROFILES["trl"].objective[name].conventions)


class TRLWatch:
    """`crosscheck.live.watch` for a TRL GRPOTrainer (see the module docstring)."""

    def __init__(self, trainer, every: int, strict: bool, stream):
        self.t, self.every, self.strict, self.stream = trainer, every, strict, stream
        self.world = int(trainer.accelerator.num_processes)
        self.rank = int(trainer.accelerator.process_index)
        self._saved: list = []
        self._k = 0                          # micro-steps done in the current window
        self._sampled = False
        self._step = 0
        self._mbs: List[MicroBatch] = []
        self._holders: List[dict] = []
        self._adv: list = []
        self._rewards = None
        self._capture: Optional[dict] = None
        missing = [m for m in REQUIRED if not callable(getattr(trainer, m, None))]
        if missing:
            raise TypeError(f"this GRPOTrainer (trl {_version()}) has no "
                            f"{', '.join(missing)}; the live audit reads TRL 1.16's")
        self.prov = self._provenance()
        self._keys = None
        try:
            self.report = self._read_config()
        except AttributeError as exc:
            raise TypeError(f"this GRPOTrainer (trl {_version()}) lacks a setting the live "
                            f"audit reads ({exc}); it reads TRL 1.16's") from None

    def _provenance(self):
        return provenance.Provenance(self.t, self.rank)

    # ------------------------------------------------------------------ configuration
    def _read_config(self) -> Report:
        t, a = self.t, self.t.args
        conf = configured(a, t)
        lt, level = conf["loss_type"], conf["importance_sampling_level"]
        beta = float(conf["beta"])
        lo, hi = float(conf["epsilon_low"]), float(conf["epsilon_high"])
        gas, spg = int(a.gradient_accumulation_steps), int(a.steps_per_generation)
        config = [
            ("loss_type", lt, "GRPOConfig.loss_type → " + C),
            ("importance_sampling_level", level, "GRPOConfig → " + C),
            ("epsilon_low", lo, "GRPOConfig.epsilon → trainer.epsilon_low"),
            ("epsilon_high", hi, "GRPOConfig.epsilon_high → trainer.epsilon_high"),
            ("delta", a.delta, "GRPOConfig.delta: two-sided clipping, " + C),
            ("beta", beta, "GRPOConfig.beta: β·k3 added per token, " + C),
            ("use_bias_correction_kl", bool(getattr(a, "use_bias_correction_kl", False)),
             "GRPOConfig: the KL term times the attached ratio coef_1, " + C),
            ("scale_rewards", a.scale_rewards, "GRPOConfig.scale_rewards → " + G),
            ("num_generations", int(a.num_generations), "GRPOConfig → " + G),
            ("gradient_accumulation_steps", gas, "TrainingArguments"),
            ("steps_per_generation", spg, "GRPOConfig → _prepare_inputs"),
            ("num_iterations", int(a.num_iterations), "GRPOConfig → _prepare_inputs"),
            ("use_vllm", bool(a.use_vllm), "GRPOConfig"),
            ("world size", self.world, "accelerator.num_processes"),
        ]
        if lt == "dr_grpo":
            config.append(("max_completion_length", a.max_completion_length,
                           "GRPOConfig → " + C + " (loss_type 'dr_grpo')"))
        no: List[str] = []
        kw = self._policy(lt, level, lo, hi, a, no)
        # what else the reference cannot express, and the checks it would falsify
        LOSS, GRAD = "micro-batch loss", "gradient"
        blocks = {LOSS: list(no), GRAD: list(no), "metrics": list(no)}

        def cannot(what, *affected):
            no.append(what)
            for c in affected:
                blocks[c].append(what)
        if beta and getattr(a, "use_bias_correction_kl", False) and level != "token":
            cannot("use_bias_correction_kl with importance_sampling_level='sequence' (the KL "
                   "term times the sequence ratio)", LOSS, GRAD)
        if a.top_entropy_quantile < 1.0:
            cannot(f"top_entropy_quantile={a.top_entropy_quantile} (the entropy mask)", LOSS,
                   GRAD)
        if a.off_policy_mask_threshold is not None:
            cannot("off_policy_mask_threshold (the off-policy sequence mask)", LOSS, GRAD)
        if a.use_vllm and a.vllm_importance_sampling_correction:
            cannot("vLLM importance-sampling correction folded into the loss", LOSS, GRAD)
        if a.entropy_coef != 0.0 or getattr(a, "use_adaptive_entropy", False):
            cannot("the entropy bonus (entropy_coef) in the micro-batch loss; its gradient "
                   "reaches the logits, not logp, so the gradient check stands", LOSS)
        if getattr(t, "aux_loss_enabled", False):
            cannot("the MoE router auxiliary loss in the micro-batch loss", LOSS)
        self._blocks = {c: w for c, w in blocks.items() if w}
        self._kw = None if kw is None else {**kw, "beta": beta, "kl_kind": "k3"}
        if kw is not None and beta and getattr(a, "use_bias_correction_kl", False):
            self._kw["kl_weight"] = "ratio"           # per_token_kl * coef_1, attached
        scope, agg, words = AGGREGATION.get(lt, ("step", {}, f"loss_type {lt!r}"))
        if lt == "dr_grpo":
            agg = {**agg, "norm": float(a.max_completion_length)}
        self._scope, self._agg = scope, agg
        self._spg, self._lt = spg, lt
        self._metrics_ok = lt in PPO_FAMILY and level == "token"
        if lt == "sapo":
            config.append(("sapo_temperature_pos/neg", (a.sapo_temperature_pos,
                                                        a.sapo_temperature_neg), "GRPOConfig"))
        if lt == "vespo":
            config.append(("vespo_k_pos/lambda_pos/k_neg/lambda_neg",
                           (a.vespo_k_pos, a.vespo_lambda_pos, a.vespo_k_neg,
                            a.vespo_lambda_neg), "GRPOConfig → get_gamma_weights"))
        report = Report("trl " + _version(), config, f"loss_type {lt!r}: {words}",
                        "", self.every, self.world, not_expressed=no)
        report.words.update(WORDS)
        report.words.update(provenance.WORDS)
        report.trusted = list(TRUSTED)
        report.not_applicable.update(self.prov.not_applicable)
        if beta and getattr(t, "ref_model", None) is None:
            report.trusted.append(REF_TRUSTED)
        self._rank_scope(report)
        return report

    def _rank_scope(self, report) -> None:
        """Whether the ranks' gradients can be compared: not on one process, nor where they
        are sharded (the all-reduce is then trusted)."""
        if self.world == 1:
            report.not_applicable["rank agreement"] = "one process"
        elif self._sharded():
            report.not_applicable["rank agreement"] = SHARDED
            report.trusted.append(ALL_REDUCE_TRUSTED)

    def _sharded(self) -> bool:
        return bool(getattr(self.t, "is_fsdp_enabled", False)
                    or getattr(self.t, "is_deepspeed_enabled", False))

    def _checksum(self):
        """(Σg, Σ|g|) in float64 over every parameter's gradient, as this process holds them
        after the step's last backward (DDP has all-reduced them by then); None where there is
        nothing to compare (one process, sharded gradients, no gradient)."""
        if self.world == 1 or not _dist() or self._sharded():
            return None
        total = None
        with torch.no_grad():
            for p in self.t.model.parameters():
                if p.grad is not None:
                    g = p.grad.detach().to(torch.float64)
                    part = torch.stack([g.sum(), g.abs().sum()])
                    total = part if total is None else total + part
        return None if total is None else tuple(float(x) for x in total.tolist())

    @staticmethod
    def _policy(lt, level, lo, hi, a, no):
        if lt in PPO_FAMILY:
            if level == "token":
                return dict(loss="ppo", clip_low=lo, clip_high=hi, delta=a.delta)
            if a.delta is not None:
                no.append("delta with importance_sampling_level='sequence'")
                return None
            return dict(loss="gspo", form=_profile("gspo")["form"], clip_low=lo, clip_high=hi)
        if lt == "cispo":
            if level != "token":
                no.append("loss_type 'cispo' with importance_sampling_level='sequence'")
                return None
            return dict(loss="cispo", clip_high=hi, bound=_profile("cispo")["bound"])
        if lt == "sapo":
            return dict(loss="sapo", tau_pos=float(a.sapo_temperature_pos),
                        tau_neg=float(a.sapo_temperature_neg), level=level)
        if lt == "vespo":
            base = _profile("vespo")
            return dict(loss="vespo", k_pos=float(a.vespo_k_pos), k_neg=float(a.vespo_k_neg),
                        lambda_pos=float(a.vespo_lambda_pos),
                        lambda_neg=float(a.vespo_lambda_neg),
                        **{k: base[k] for k in ("log_ratio_clamp", "log_w_min", "log_w_max")})
        no.append(f"loss_type {lt!r}")
        return None

    def _documented(self) -> Objective:
        return Objective({**self._kw, **self._agg}, self._scope,
                         f"GRPOConfig.loss_type={self._lt!r} help; {C}")

    def _formula(self, mb: MicroBatch):
        """TRL's loss for one micro-batch: (aggregate keywords, factor, source)."""
        gas = mb.meta["gas"]
        if self._lt in BY_TOKEN_COUNT:
            norm = max(mb.meta["num_items_in_batch"], 1.0) / self.world * gas / self._spg
            return ({**self._kw, "agg": "seq-mean-token-sum-norm", "norm": norm}, 1.0,
                    C + ": num_items_in_batch / num_processes · accumulation / "
                        "steps_per_generation")
        return {**self._kw, **self._agg}, 1.0 / gas, C + ": ÷ current_gradient_accumulation_steps"

    def _alternatives(self):
        if self._lt in BY_TOKEN_COUNT and self._spg != self.t.args.gradient_accumulation_steps:
            return [(lambda mbs: formula_gradient(self._formula, mbs, self.world),
                     "documented choice",
                     f"steps_per_generation ({self._spg}) ≠ gradient_accumulation_steps: TRL "
                     f"divides by the generation batch's mean token count per window, not "
                     f"this window's", C + ": '`num_items_in_batch` spans the generation "
                                           "batch, so rescale it to one accumulation window'")]
        return []

    # ------------------------------------------------------------------ wrapping
    def __enter__(self):
        self._wrap("training_step", self._training_step)
        if all(callable(getattr(self.t, m, None)) for m in OPTIONAL):
            self._wrap("_calculate_rewards", self._calculate_rewards)
            self._wrap("_generate_and_score_completions", self._generate)
        else:
            self.report.not_expressed.append("advantages: this trainer has no "
                                             "_calculate_rewards / "
                                             "_generate_and_score_completions")
        self._wrap("_compute_loss", self._compute_loss)
        self._wrap("_get_per_token_logps_and_entropies", self._logps)
        if self.stream is not None and self.rank == 0 and self.report.not_expressed:
            self.stream.write("crosscheck live: not checked: "
                              + "; ".join(self.report.not_expressed) + "\n")
        return self

    def __exit__(self, *exc):
        for name, had, value in reversed(self._saved):
            if had:
                setattr(self.t, name, value)
            else:
                self.t.__dict__.pop(name, None)
        self._saved.clear()
        if self.stream is not None and self.rank == 0 and exc[0] is None:
            self.stream.write(self.report.text() + "\n")
        return False

    @contextlib.contextmanager
    def _own(self):
        """The audit's own code: its time is counted (Report.seconds), and an error in it never
        stops the run (only strict's LiveDeviation does): it is reported, and the window it
        happened in is left unchecked."""
        t0 = time.perf_counter()
        try:
            yield
        except LiveDeviation:
            raise
        except Exception as exc:
            self.report.errors.append(f"step {self._step}: {type(exc).__name__}: {exc}")
            self._sampled = False
            self._mbs, self._holders, self._adv = [], [], []
        finally:
            self.report.seconds += time.perf_counter() - t0

    def _wrap(self, name, make):
        had = name in self.t.__dict__
        self._saved.append((name, had, self.t.__dict__.get(name)))
        setattr(self.t, name, make(getattr(self.t, name)))

    def _training_step(self, orig):
        def training_step(*args, **kwargs):
            if self._k == 0:
                self._step = int(self.t.state.global_step) + 1
                self._sampled = sampled(self._step, self.every)
                self._mbs, self._holders, self._adv = [], [], []
                self.prov.begin(self._step)
            out = orig(*args, **kwargs)
            self._k += 1
            if self._k >= int(self.t.current_gradient_accumulation_steps):
                self._k = 0
                if self._sampled:
                    with self._own():
                        self._close_window()
            return out
        return training_step

    def _calculate_rewards(self, orig):
        def calculate_rewards(*args, **kwargs):
            out = orig(*args, **kwargs)
            if self._sampled and self.t.model.training:
                self._rewards = out
            return out
        return calculate_rewards

    def _generate(self, orig):
        def generate(*args, **kwargs):
            self._rewards = None
            out = orig(*args, **kwargs)
            if self.t.model.training:
                with self._own():
                    self.prov.generated(out)
            if self._sampled and self.t.model.training and self._rewards is not None:
                with self._own():
                    self._adv.append((self.rank, bridge.to_numpy(out["advantages"]),
                                      bridge.to_numpy(self._rewards)))
            return out
        return generate

    def _logps(self, orig):
        def logps(*args, **kwargs):
            out = orig(*args, **kwargs)
            cap = self._capture
            if cap is not None and "logp" not in cap and torch.is_grad_enabled():
                with self._own():
                    self._capture_logps(out, cap)
            return out
        return logps

    def _capture_logps(self, out, cap):
        """Copy the log-probs (and entropies) the loss receives, and hook their gradient."""
        lp = out[0] if isinstance(out, tuple) else out
        cap["logp"] = bridge.to_numpy(lp)
        cap["dtype"] = str(lp.dtype).replace("torch.", "")
        if isinstance(out, tuple) and len(out) > 1 and out[1] is not None:
            cap["entropy"] = bridge.to_numpy(out[1])
        if lp.requires_grad:
            scaler = getattr(self.t.accelerator, "scaler", None)

            def hook(g, cap=cap, scaler=scaler):
                with self._own():
                    s = float(scaler.get_scale()) if scaler is not None else 1.0
                    cap["grad"] = bridge.to_numpy(g) / s
            lp.register_hook(hook)

    def _compute_loss(self, orig):
        def compute_loss(model, inputs, *args, **kwargs):
            self._keys = None
            if self.t.model.training:
                with self._own():
                    self._keys = self.prov.used(inputs)
            if not (self._sampled and self.t.model.training and self._kw is not None):
                return orig(model, inputs, *args, **kwargs)
            metrics = self.t._metrics["train"]
            before = {k: len(v) for k, v in metrics.items()}
            self._capture = cap = {}
            try:
                loss = orig(model, inputs, *args, **kwargs)
            finally:
                self._capture = None
            if "logp" in cap:
                with self._own():
                    cap["logged"] = {k: float(v[-1]) for k, v in metrics.items()
                                     if k in METRICS and len(v) > before.get(k, 0)}
                    self._record(inputs, loss, cap)
                    self.prov.micro_batch(model, inputs, self._keys, cap["logp"],
                                          len(self._mbs) - 1, cap["dtype"])
            return loss
        return compute_loss

    def _record(self, inputs, loss, cap):
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old = inputs.get("old_per_token_logps")
        ref = inputs.get("ref_per_token_logps") if self._kw.get("beta") else None
        mb = MicroBatch(
            rank=self.rank, index=len(self._mbs), logp=cap["logp"],
            old_logp=cap["logp"] if old is None else bridge.to_numpy(old),
            advantages=bridge.to_numpy(inputs["advantages"]),
            mask=bridge.to_numpy(mask) != 0,
            ref_logp=None if ref is None else bridge.to_numpy(ref),
            loss=float(loss.detach()), dtype=cap["dtype"],
            meta=dict(gas=int(self.t.current_gradient_accumulation_steps),
                      num_items_in_batch=float(inputs["num_items_in_batch"]),
                      logged=cap.get("logged", {}), entropy=cap.get("entropy"),
                      after_end=self._after_end(inputs)))
        self._mbs.append(mb)
        self._holders.append(cap)

    def _after_end(self, inputs):
        """[B, T] bool: the positions after each completion's first end token (one of
        trainer.eos_token_ids), which the objective never counts; None where a completion may
        hold several turns (a tool mask) or the trainer keeps no end tokens."""
        ends = getattr(self.t, "eos_token_ids", None)
        if not ends or "tool_mask" in inputs:
            return None
        ids = inputs["completion_ids"]
        end = torch.isin(ids, torch.as_tensor(list(ends), device=ids.device)).int()
        return bridge.to_numpy((end.cumsum(1) - end) > 0) != 0

    # ------------------------------------------------------------------ the checks
    def _close_window(self):
        for mb, cap in zip(self._mbs, self._holders):
            mb.grad = cap.get("grad")
        payload = dict(mbs=self._mbs, adv=self._adv, checksum=self._checksum(),
                       settings=effective_differs(self.t.args, self.t, self._configured()),
                       prov=self.prov.payload())
        gathered = _all_gather(payload, self.world)
        res = self._check(gathered) if self.rank == 0 else None
        res = _broadcast(res, self.world)
        self._mbs, self._holders, self._adv = [], [], []
        self.report.steps.append(res)
        metrics = self.t._metrics["train"]
        metrics["crosscheck/max_rel_err"].append(res.max_rel_err)
        metrics["crosscheck/deviations"].append(float(len(res.deviations)))
        if self.stream is not None and self.rank == 0:
            self.stream.write(res.line() + "\n")
            self.stream.flush()
        if self.strict and res.deviations:
            raise LiveDeviation(res.deviations[0])

    def _check(self, gathered) -> StepResult:
        res = StepResult(self._step)
        mbs = [mb for p in gathered for mb in p["mbs"]]
        dtypes = sorted({mb.dtype for mb in mbs})
        unjudged = [d for d in dtypes if d not in checks.JUDGED]
        row, tol = checks.tolerance_row(dtypes or ["float32"])
        self.report.precision = checks.row_words(row, dtypes)
        self._check_settings(res, gathered)
        self._check_advantages(res, gathered, tol)
        provenance.merge(res, gathered, self.world, self.prov.G)
        if unjudged:
            for c in ("micro-batch loss", "gradient", "metrics"):
                res.skipped[c] = f"log-probs in {', '.join(unjudged)}: no tolerance row"
            return res
        for c, why in self._blocks.items():
            res.skipped[c] = "; ".join(why)
        if not mbs:
            res.skipped.setdefault("gradient", "no micro-batch was recorded")
            return res
        self._check_ranks(res, [p.get("checksum") for p in gathered])
        if "micro-batch loss" not in self._blocks:
            checks.micro_batch_losses(res, mbs, self._formula, tol)
        if "gradient" not in self._blocks:
            checks.gradient(res, mbs, self.world, self._documented(), tol, self._alternatives())
        if "metrics" not in self._blocks:
            self._check_metrics(res, mbs, tol)
        return res

    def _check_settings(self, res, gathered):
        """Each setting the trainer keeps as an attribute equals its configuration, on every
        process; the step itself is judged against the configuration."""
        n = len(self._configured())
        for rank, p in enumerate(gathered):
            diffs = p.get("settings", [])
            res.count("settings", n, len(diffs))
            for attr, want, have in diffs:
                num = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                          for v in (want, have))
                field = dict(self.SETTINGS)[attr]
                res.findings.append(Finding(
                    res.step, "settings", "deviation",
                    f"trainer.{attr} is {have!r} but its configuration says {want!r} "
                    f"(GRPOConfig.{field}): the trainer does not run the configuration you "
                    f"wrote; the step is judged against the configuration", rank=rank,
                    got=float(have) if num else None, expected=float(want) if num else None,
                    source=f"GRPOConfig.{field} → GRPOTrainer.__init__: self.{attr}"))

    def _configured(self) -> dict:
        return configured(self.t.args, self.t)

    def _check_ranks(self, res, sums):
        """Every process holds the same gradients after the step's last backward."""
        if self.world == 1 or "rank agreement" in self.report.not_applicable:
            return
        if any(s is None for s in sums):
            res.skipped["rank agreement"] = "a process had no parameter gradient to compare"
            return
        checks.ranks_agree(res, sums, tolerances.get("ranks", "float64"),
                           "DDP all-reduce (accelerator.backward at sync_gradients)")

    def _check_advantages(self, res, gathered, tol):
        t, a = self.t, self.t.args
        if a.multi_objective_aggregation != "sum_then_normalize":
            res.skipped["advantages"] = (f"multi_objective_aggregation "
                                         f"{a.multi_objective_aggregation!r}")
            return
        conv = dict(PROFILES["trl"].rules["group_advantages"].conventions)
        conv.update(scale=a.scale_rewards, group_size=int(a.num_generations))
        weights = np.asarray(configured(a, t)["reward_weights"], dtype=np.float64)
        for p in gathered:
            for rank, got, per_func in p["adv"]:
                with np.errstate(invalid="ignore"):
                    rewards = np.nansum(per_func * weights[None, :], axis=1)
                valid = ~np.isnan(per_func).all(axis=1)
                n = got.shape[0]
                checks.advantages(res, got, np.where(valid, rewards, np.nan),
                                  slice(rank * n, (rank + 1) * n), conv, G + " ("
                                  f"scale_rewards={a.scale_rewards!r})", tol, rank,
                                  valid=valid)
                provenance.reward_weights(res, per_func, weights, got,
                                          slice(rank * n, (rank + 1) * n), conv, tol, rank)

    def _check_metrics(self, res, mbs, tol):
        """The logged values of each micro-step, over that micro-step's rows on every rank."""
        if not self._metrics_ok:
            res.skipped["metrics"] = "logged metrics are checked for token-level clipped losses"
            return
        for k in sorted({mb.index for mb in mbs}):
            step_mbs = [mb for mb in mbs if mb.index == k]
            logged = step_mbs[0].meta["logged"]
            (logp, old, adv, mask, ref), _ = stacked(step_mbs)
            n = mask.sum()
            expected = {}
            if all(mb.meta["entropy"] is not None for mb in step_mbs):
                ent, _ = stacked([MicroBatch(**{**mb.__dict__, "logp": mb.meta["entropy"]})
                                  for mb in step_mbs])
                expected["entropy"] = float(np.where(mask, ent[0], 0.0).sum() / max(n, 1))
            if self._kw.get("beta") and ref is not None:
                # the per-token KL term of the objective, ratio-weighted where TRL corrects it
                kl = kl_term(logp, old, ref, mask, "k3", None, self._kw.get("kl_weight"))
                expected["kl"] = float(np.where(mask, kl, 0.0).sum() / max(n, 1))
            expected["clip_ratio/region_mean"] = float(ref_numpy.clip_fraction(
                logp, old, adv, mask, clip_low=self._kw["clip_low"],
                clip_high=self._kw["clip_high"], definition="sign"))
            for name, value in expected.items():
                if name in logged:
                    checks.metric(res, name, logged[name], value, tol,
                                  f"{C}: _metrics['train'][{name!r}]", k)


# the settings GRPOTrainer copies from its configuration into attributes that its loss, its
# advantages or its sampling read: (attribute, GRPOConfig field it comes from)
SETTINGS = (
    ("loss_type", "loss_type"), ("importance_sampling_level", "importance_sampling_level"),
    ("beta", "beta"), ("epsilon_low", "epsilon"), ("epsilon_high", "epsilon_high"),
    ("temperature", "temperature"), ("scale_rewards", "scale_rewards"),
    ("num_generations", "num_generations"), ("num_iterations", "num_iterations"),
    ("max_completion_length", "max_completion_length"),
    ("top_entropy_quantile", "top_entropy_quantile"),
    ("off_policy_mask_threshold", "off_policy_mask_threshold"),
    ("mask_truncated_completions", "mask_truncated_completions"),
    ("multi_objective_aggregation", "multi_objective_aggregation"),
    ("use_vllm", "use_vllm"),
    ("vllm_importance_sampling_correction", "vllm_importance_sampling_correction"),
    ("entropy_coef", "entropy_coef"), ("reward_weights", "reward_weights"),
)
TRLWatch.SETTINGS = SETTINGS


def configured(a, t) -> dict:
    """Each of SETTINGS as the configuration `a` (trainer.args) states it, in the form the
    trainer keeps it (GRPOTrainer.__init__: epsilon_high defaults to epsilon, reward_weights to
    ones). reward_weights the trainer extended (a tool's reward) and an adaptive entropy_coef
    are left out: they have no configured value to compare."""
    out = {attr: getattr(a, field) for attr, field in SETTINGS if hasattr(a, field)}
    out["epsilon_high"] = a.epsilon_high if a.epsilon_high is not None else a.epsilon
    n = len(getattr(t, "reward_funcs", []) or [])
    weights = [float(w) for w in (a.reward_weights if a.reward_weights is not None
                                  else [1.0] * n)]
    out.pop("reward_weights")
    if len(weights) == len(_weights(t)):
        out["reward_weights"] = weights
    if getattr(a, "use_adaptive_entropy", False):
        out.pop("entropy_coef", None)
    return out


def _weights(t) -> list:
    w = getattr(t, "reward_weights", None)
    return [] if w is None else [float(x) for x in (w.tolist() if hasattr(w, "tolist") else w)]


def effective_differs(a, t, conf=None) -> list:
    """[(attribute, configured, effective)] for each setting the trainer holds otherwise than
    its configuration states (`conf`: the configured settings, by default `configured(a, t)`)."""
    out = []
    for attr, want in (configured(a, t) if conf is None else conf).items():
        have = _weights(t) if attr == "reward_weights" else getattr(t, attr, want)
        if isinstance(want, (int, float)) and not isinstance(want, bool) and \
                isinstance(have, (int, float)) and not isinstance(have, bool):
            same = float(want) == float(have)
        else:
            same = want == have
        if not same:
            out.append((attr, want, have))
    return out


def sampled(step: int, every: int) -> bool:
    """The schedule: steps 1 and 2, then every `every`-th step counted from the first (1 +
    k·every). At step 1 policy, old policy and reference coincide, so a KL term or a clip
    bound cannot show; step 2 is the first step where they can (one update away from the
    reference, and from the sampling policy where a generation is reused)."""
    return step <= 2 or (step - 1) % every == 0


def _version() -> str:
    try:
        import trl
        return trl.__version__
    except Exception:                                    # pragma: no cover
        return "?"


def _dist():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _all_gather(payload, world):
    if world == 1 or not _dist():
        return [payload]
    out = [None] * world
    torch.distributed.all_gather_object(out, payload)
    return out


def _broadcast(obj, world):
    if world == 1 or not _dist():
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def is_trl_grpo(trainer) -> bool:
    return any(c.__name__ == "GRPOTrainer" and c.__module__.startswith("trl")
               for c in type(trainer).__mro__)
