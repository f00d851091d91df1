"""The live recorder for verl (read at 0.9.1): `crosscheck.live.verl.record()`.

verl's full trainer needs GPUs and Ray, so the recorder wraps the math its actor loop calls,
through the module objects, for the duration of the `with` block:
- every function in `core_algos.POLICY_LOSS_REGISTRY` (what `get_policy_loss_fn` returns):
  each call is a micro-batch, recorded with a hook on its `log_prob`; calls are grouped into
  optimizer steps by the `config.global_batch_info` they pass (dp_size, batch_num_tokens,
  global_batch_size, loss_scale_factor; crosscheck.live.recorder);
- every function in `core_algos.ADV_ESTIMATOR_REGISTRY` (what `get_adv_estimator_fn` returns):
  'grpo' is checked against `group_advantages` on the rewards it received;
- `agg_loss` and `kl_penalty`, in core_algos and in the modules that imported them by name
  (verl.workers.utils.losses): each `agg_loss` value is checked against `aggregate` under the
  global counts; a `kl_penalty` on a recorded log_prob marks that step's gradient as shared.
Policy loss modes: 'vanilla' (PPO with clip-higher and dual clip, the verl profile's
conventions with the config's clip ratios); the others are recorded and reported as not
expressed.
"""
import sys
from typing import Optional

import numpy as np

import ref_numpy

from .. import bridge
from ..trainer import loading
from ..audit.profiles import PROFILES
from .recorder import Counts, Recorder, micro_batch_formula
from .objective import MicroBatch

CA = "verl/trainer/ppo/core_algos.py"


def _counts(config, loss_agg_mode, T=None) -> Counts:
    info = dict(getattr(config, "global_batch_info", None) or {})
    return Counts(loss_agg_mode, int(info.get("dp_size", 1) or 1), info.get("batch_num_tokens"),
                  info.get("global_batch_size"), info.get("loss_scale_factor"))


def _vanilla(config):
    base = dict(PROFILES["verl"].objective["ppo"].conventions)
    eps = config.clip_ratio
    lo = config.clip_ratio_low if config.clip_ratio_low is not None else eps
    hi = config.clip_ratio_high if config.clip_ratio_high is not None else eps
    return dict(loss="ppo", clip_low=float(lo), clip_high=float(hi),
                clip_c=float(config.get("clip_ratio_c", 3.0)),
                log_ratio_clamp=base["log_ratio_clamp"])


class VerlRecorder:
    def __init__(self, module, every, strict, stream, explicit_steps):
        self.ca = module
        self.rec = Recorder("verl " + _version(), every, strict, stream,
                            f"{CA}::agg_loss (global_batch_info)", explicit_steps)
        self.report = self.rec.report
        self.step = self.rec.step
        self._undo = []
        self.loaded = None      # the by-file load that holds verl's modules (loading.Loaded)

    def __enter__(self):
        ca = self.ca
        for name, fn in list(ca.POLICY_LOSS_REGISTRY.items()):
            self._set(ca.POLICY_LOSS_REGISTRY, name, self._policy(name, fn), item=True)
        for name, fn in list(ca.ADV_ESTIMATOR_REGISTRY.items()):
            if name == "grpo":
                self._set(ca.ADV_ESTIMATOR_REGISTRY, name, self._grpo(fn), item=True)
        agg, kl = self._agg(ca.agg_loss), self._kl(ca.kl_penalty)
        for mod in [ca] + [m for n, m in list(sys.modules.items())
                           if n.startswith("verl.") and m is not ca and m is not None]:
            if getattr(mod, "agg_loss", None) is ca.agg_loss:
                self._set(mod, "agg_loss", agg)
            if getattr(mod, "kl_penalty", None) is ca.kl_penalty:
                self._set(mod, "kl_penalty", kl)
        return self

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                self.rec.close()
        finally:
            for target, name, old, item in reversed(self._undo):
                if item:
                    target[name] = old
                else:
                    setattr(target, name, old)
            self._undo.clear()
            if self.loaded is not None:
                self.loaded.__exit__(None, None, None)
                self.loaded = None
        return False

    def _set(self, target, name, new, item=False):
        old = target[name] if item else getattr(target, name)
        self._undo.append((target, name, old, item))
        if item:
            target[name] = new
        else:
            setattr(target, name, new)

    def _policy(self, name, fn):
        def policy_loss(old_log_prob, log_prob, advantages, response_mask,
                        loss_agg_mode="token-mean", config=None, rollout_is_weights=None, **kw):
            out = fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                     rollout_is_weights, **kw)
            why = ""
            kwargs = None
            if name != "vanilla":
                why = f"policy loss mode {name!r}"
            elif rollout_is_weights is not None:
                why = "rollout_is_weights inside the loss"
            else:
                kwargs = _vanilla(config)
            self.rec.policy_call(log_prob, old_log_prob, advantages, response_mask, out[0],
                                 _counts(config, loss_agg_mode), kwargs, why)
            return out
        policy_loss.__wrapped__ = fn
        return policy_loss

    def _grpo(self, fn):
        def grpo(token_level_rewards, response_mask, index, epsilon=1e-6,
                 norm_adv_by_std_in_grpo=True, config=None, **kw):
            out = fn(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo,
                     config, **kw)
            conv = dict(PROFILES["verl"].rules["group_advantages"].conventions)
            conv.update(eps=float(epsilon), scale="group" if norm_adv_by_std_in_grpo else "none")
            scores = bridge.to_numpy(token_level_rewards).sum(axis=-1)
            ids = np.unique(np.asarray(index), return_inverse=True)[1]
            adv = ref_numpy.group_advantages(scores, group_ids=ids, **conv)
            m = bridge.to_numpy(response_mask) != 0
            self.rec.value("advantages", out[0], np.where(m, adv[:, None], 0.0),
                           "the 'grpo' advantages", f"{CA}::compute_grpo_outcome_advantage")
            return out
        grpo.__wrapped__ = fn
        return grpo

    def _agg(self, fn):
        def agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None,
                     global_batch_size=None, loss_scale_factor=None):
            out = fn(loss_mat, loss_mask, loss_agg_mode, dp_size, batch_num_tokens,
                     global_batch_size, loss_scale_factor)
            if loss_agg_mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                 "seq-mean-token-sum-norm"):
                counts = Counts(loss_agg_mode, int(dp_size), batch_num_tokens, global_batch_size,
                                loss_scale_factor)
                lm, m = bridge.to_numpy(loss_mat), bridge.to_numpy(loss_mask) != 0
                stub = MicroBatch(0, 0, lm, lm, np.zeros(lm.shape[0]), m, None, 0.0)
                kw, factor = micro_batch_formula(counts, {}, stub)
                kw = {k: v for k, v in kw.items() if k in ("agg", "norm", "empty_rows")}
                expected = factor * ref_numpy.aggregate(lm, m, mode=kw["agg"],
                                                        norm=kw.get("norm"),
                                                        empty_rows=kw.get("empty_rows",
                                                                          "exclude"))
                self.rec.value("micro-batch loss", out, expected,
                               f"agg_loss({loss_agg_mode!r})", f"{CA}::agg_loss")
            return out
        agg_loss.__wrapped__ = fn
        return agg_loss

    def _kl(self, fn):
        def kl_penalty(logprob, ref_logprob, kl_penalty="kl", *a, **kw):
            self.rec.other_term(logprob, f"kl_penalty({kl_penalty!r})")
            return fn(logprob, ref_logprob, kl_penalty, *a, **kw)
        kl_penalty.__wrapped__ = fn
        return kl_penalty


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("verl")
    except Exception:                                   # pragma: no cover
        return "?"


def record(core_algos=None, every: int = 1, strict: bool = False, verbose=None,
           explicit_steps: bool = False):
    """Record and check verl's policy losses, advantage estimators and agg_loss calls made
    inside the `with` block. `core_algos`: the module to wrap (default: the installed
    verl.trainer.ppo.core_algos; pass a fork's module object to audit the fork).
    Steps are the runs of calls sharing one global_batch_info, closed when their rows reach its
    counts; explicit_steps=True: call `.step()` after each optimizer step instead, and the
    counts themselves are checked against the rows of the step."""
    from .options import arguments
    every, strict, stream = arguments(every, strict, verbose)
    loaded = None
    if core_algos is None:
        (core_algos,), loaded = loading.import_installed("verl", ["verl.trainer.ppo.core_algos"])
    module = core_algos
    for name in ("POLICY_LOSS_REGISTRY", "ADV_ESTIMATOR_REGISTRY", "agg_loss", "kl_penalty"):
        if not hasattr(module, name):
            if loaded is not None:
                loaded.__exit__(None, None, None)
            raise TypeError(f"core_algos is {module!r}, which has no {name}; expected verl's "
                            f"verl.trainer.ppo.core_algos module")
    recorder = VerlRecorder(module, every, strict, stream, explicit_steps)
    recorder.loaded = loaded
    return recorder
