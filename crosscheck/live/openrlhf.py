"""The live recorder for OpenRLHF (read at 0.11.2): `crosscheck.live.openrlhf.record()`.

OpenRLHF's trainer needs Ray, DeepSpeed and GPUs, so the recorder wraps its loss math through
the module objects, for the duration of the `with` block:
- `openrlhf.models.loss.PolicyLoss` (and the name wherever a loaded openrlhf module imported
  it) is replaced by a subclass whose forward records each call as a micro-batch, with a hook
  on its `log_probs`; calls are grouped into optimizer steps by the global counts they pass
  (dp_size, batch_num_tokens, global_batch_size; crosscheck.live.recorder). Only actors built
  inside the block are recorded;
- `openrlhf.models.utils.compute_approx_kl` (and where imported by name): each value is checked
  against `kl_penalty` with OpenRLHF's clamp (the OpenRLHF profile); called on recorded
  log-probs, it marks that step's gradient as shared with a KL loss.
PolicyLoss types: 'ppo' (clip-higher, dual clip, the ±20 log-ratio clamp) and 'gspo' (sequence
form); the train/rollout IS correction (is_correction_level != 'off') is reported as not
expressed.
"""
import sys

import ref_numpy

from .. import bridge
from ..trainer import loading
from ..audit.profiles import PROFILES
from .recorder import Counts, Recorder

LOSS = "openrlhf/models/loss.py"


def _kwargs(loss):
    if loss.is_correction_level != "off":
        return None, f"is_correction_level={loss.is_correction_level!r} (train/rollout IS)"
    if loss.policy_loss_type == "ppo":
        base = dict(PROFILES["openrlhf"].objective["ppo"].conventions)
        kw = dict(loss="ppo", clip_low=float(loss.clip_eps_low),
                  clip_high=float(loss.clip_eps_high), log_ratio_clamp=base["log_ratio_clamp"])
        if loss.dual_clip is not None:
            kw["clip_c"] = float(loss.dual_clip)
        return kw, ""
    if loss.policy_loss_type == "gspo" and loss.dual_clip is None:
        base = dict(PROFILES["openrlhf"].objective["gspo"].conventions)
        return dict(loss="gspo", form=base["form"], clip_low=float(loss.clip_eps_low),
                    clip_high=float(loss.clip_eps_high)), ""
    return None, f"policy_loss_type {loss.policy_loss_type!r} with dual_clip {loss.dual_clip}"


class OpenRLHFRecorder:
    def __init__(self, loss_module, utils_module, every, strict, stream, explicit_steps):
        self.lm, self.um = loss_module, utils_module
        self.rec = Recorder("openrlhf " + _version(), every, strict, stream,
                            f"{LOSS}::aggregate_loss (global counts)", explicit_steps)
        self.report = self.rec.report
        self.step = self.rec.step
        self._undo = []
        self.loaded = None      # the by-file load that holds OpenRLHF's modules (loading.Loaded)

    def __enter__(self):
        rec, original = self.rec, self.lm.PolicyLoss

        class RecordedPolicyLoss(original):
            def forward(self, log_probs, old_log_probs, advantages, action_mask=None,
                        rollout_log_probs=None, dp_size=1, batch_num_tokens=None,
                        global_batch_size=None):
                out = super().forward(log_probs, old_log_probs, advantages, action_mask,
                                      rollout_log_probs, dp_size, batch_num_tokens,
                                      global_batch_size)
                kwargs, why = _kwargs(self)
                mode = "token-mean" if self.token_level_loss else "seq-mean-token-mean"
                rec.policy_call(log_probs, old_log_probs, advantages, action_mask, out[0],
                                Counts(mode, int(dp_size), batch_num_tokens, global_batch_size),
                                kwargs, why)
                return out
        RecordedPolicyLoss.__qualname__ = RecordedPolicyLoss.__name__ = original.__name__
        approx = self._approx(self.um.compute_approx_kl)
        for mod in self._modules():
            if getattr(mod, "PolicyLoss", None) is original:
                self._set(mod, "PolicyLoss", RecordedPolicyLoss)
            if getattr(mod, "compute_approx_kl", None) is self.um.compute_approx_kl:
                self._set(mod, "compute_approx_kl", approx)
        return self

    def _modules(self):
        mods = [self.lm, self.um]
        return mods + [m for n, m in list(sys.modules.items())
                       if n.startswith("openrlhf") and m is not None and m not in mods]

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                self.rec.close()
        finally:
            for mod, name, old in reversed(self._undo):
                setattr(mod, name, old)
            self._undo.clear()
            if self.loaded is not None:
                self.loaded.__exit__(None, None, None)
                self.loaded = None
        return False

    def _set(self, mod, name, new):
        self._undo.append((mod, name, getattr(mod, name)))
        setattr(mod, name, new)

    def _approx(self, fn):
        rec = self.rec

        def compute_approx_kl(log_probs, log_probs_base, log_probs_old=None, kl_estimator="k1",
                              unbiased_gradient=False):
            out = fn(log_probs, log_probs_base, log_probs_old, kl_estimator, unbiased_gradient)
            rec.other_term(log_probs, f"compute_approx_kl({kl_estimator!r})")
            if kl_estimator in ("k1", "k2", "k3"):
                clamp = PROFILES["openrlhf"].rules["kl_penalty"].conventions["clamp"]
                lp, base = bridge.to_numpy(log_probs), bridge.to_numpy(log_probs_base)
                expected = ref_numpy.kl_penalty(lp, base, None, kind=kl_estimator, clamp=clamp)
                rec.value("metrics", out, expected, f"compute_approx_kl({kl_estimator!r})",
                          "openrlhf/models/utils.py::compute_approx_kl")
            return out
        compute_approx_kl.__wrapped__ = fn
        return compute_approx_kl


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("openrlhf")
    except Exception:                                   # pragma: no cover
        return "?"


def record(loss_module=None, utils_module=None, every: int = 1, strict: bool = False,
           verbose=None, explicit_steps: bool = False):
    """Record and check OpenRLHF's PolicyLoss calls and compute_approx_kl values made inside
    the `with` block. `loss_module`, `utils_module`: openrlhf.models.loss and .utils (default:
    the installed ones; pass a fork's module objects to audit the fork). Steps: as
    crosscheck.live.verl.record."""
    from .options import arguments
    every, strict, stream = arguments(every, strict, verbose)
    loaded = None
    if loss_module is None or utils_module is None:
        (lm, um), loaded = loading.import_installed(
            "openrlhf", ["openrlhf.models.loss", "openrlhf.models.utils"])
    lm = loss_module if loss_module is not None else lm
    um = utils_module if utils_module is not None else um
    for mod, arg, name, where in ((lm, "loss_module", "PolicyLoss", "loss"),
                                  (um, "utils_module", "compute_approx_kl", "utils")):
        if not hasattr(mod, name):
            if loaded is not None:
                loaded.__exit__(None, None, None)
            raise TypeError(f"{arg} is {mod!r}, which has no {name}; expected "
                            f"openrlhf.models.{where}")
    recorder = OpenRLHFRecorder(lm, um, every, strict, stream, explicit_steps)
    recorder.loaded = loaded
    return recorder
