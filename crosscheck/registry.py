"""The registry: one entry per reference function, built explicitly (no import side effects).

An entry ties the NumPy function, its hand VJP and the torch twin to the inputs it is
differentiable in, its case generator and, where the definition holds a stop-gradient factor,
how to perturb an input while holding that factor frozen.
"""
import dataclasses
from typing import Callable, Dict, Optional, Tuple

import numpy as np
from scipy.special import log_softmax

import ref_numpy
import ref_numpy.estimators
import ref_torch

from . import cases as cases_mod

# A freeze rule: (arrays, params, input name, perturbation of that input) -> perturbed arrays in
# which every detached factor keeps its value at the unperturbed point.
Freeze = Callable[[Dict[str, np.ndarray], Dict[str, object], str, np.ndarray],
                  Dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    numpy_fn: Callable
    numpy_vjp: Callable
    torch_fn: Callable
    diff: Tuple[str, ...]                    # differentiable inputs
    case: Callable                           # (rng, index) -> cases.Case
    detached: str = ""                       # the stop-gradient factor, in words
    freeze: Optional[Freeze] = None
    outputs: Tuple[str, ...] = ("output",)   # names of the returned arrays (dict keys if dict)
    dict_output: bool = False                # the function returns a dict keyed by `outputs`
    # Gradient-valued functions (their outputs *are* gradients wrt `diff[0]`): for each output,
    # the scalar objective whose finite differences it must equal. numpy_vjp is None for them.
    objectives: Optional[Callable[[Dict[str, np.ndarray], Dict[str, object]],
                                  Dict[str, Callable[[np.ndarray], float]]]] = None

    def freeze_for(self, params) -> Optional[Freeze]:
        """The freeze rule that applies to a case (policy_objective: only for loss='cispo')."""
        if self.freeze is None:
            return None
        if self.name == "policy_objective" and params.get("loss") != "cispo":
            return None
        return self.freeze


def _freeze_ratio(arrays, params, name, delta):
    """Hold r = exp(logp − old_logp) fixed: move old_logp with logp, so sg(w(r)) is frozen."""
    out = dict(arrays)
    out[name] = arrays[name] + delta
    out["old_logp"] = arrays["old_logp"] + delta
    return out


def _entry(name, diff, detached="", freeze=None, outputs=("output",), dict_output=False,
           objectives=None):
    return Entry(name=name, numpy_fn=getattr(ref_numpy, name),
                 numpy_vjp=getattr(ref_numpy, name + "_vjp", None),
                 torch_fn=getattr(ref_torch, name), diff=diff, case=cases_mod.GENERATORS[name],
                 detached=detached, freeze=freeze, outputs=outputs, dict_output=dict_output,
                 objectives=objectives)


def _estimator_objectives(arrays, params):
    """The expectations whose gradients kl_estimator_gradient returns, written from the per-token
    `kl_penalty` reference and scipy's log_softmax. The sampling distribution μ is frozen at the
    base point (samples are data); so is a detached weight, and k itself for use="reward"."""
    z0, zr, zs = arrays["logits"], arrays["ref_logits"], arrays.get("sample_logits")
    kind, use, is_weight = params["kind"], params.get("use", "loss"), params.get("is_weight")
    log_ref = log_softmax(zr)
    p0 = np.exp(log_softmax(z0))
    mu = p0 if zs is None else np.exp(log_softmax(zs))
    k0 = ref_numpy.kl_penalty(log_softmax(z0), log_ref, kind=kind)

    def expected(z):
        logp = log_softmax(z)
        k = ref_numpy.kl_penalty(logp, log_ref, kind=kind)
        weight = {None: np.ones_like(mu), "attached": np.exp(logp) / mu,
                  "detached": p0 / mu}[is_weight]
        per_sample = weight * k if use == "loss" else weight * k0 * logp
        return float((mu * per_sample).sum())

    def moment(key):
        return lambda z: float(ref_numpy.kl_estimator_moments(z, zr, kind=kind)[key])

    return {"expected": expected, "grad_kl_forward": moment("kl_forward"),
            "grad_kl_reverse": moment("kl_reverse")}


def build() -> Dict[str, Entry]:
    """A fresh registry, in the order the harness reports."""
    entries = [
        _entry("gae", ("rewards", "values"), outputs=("advantages", "returns")),
        _entry("whiten", ("x",)),
        _entry("group_advantages", ("rewards",)),
        _entry("ppo_clip_loss", ("logp",)),
        _entry("cispo_loss", ("logp",), detached="w = clip(ratio): CISPO's importance weight",
               freeze=_freeze_ratio),
        _entry("value_loss", ("values",)),
        _entry("kl_penalty", ("logp",)),
        _entry("aggregate", ("loss",)),
        _entry("policy_objective", ("logp",),
               detached="w = clip(ratio) when loss='cispo'", freeze=_freeze_ratio),
        _entry("kl_estimator_moments", ("logits",), outputs=ref_numpy.estimators.MOMENT_KEYS,
               dict_output=True),
        _entry("kl_estimator_gradient", ("logits",), outputs=ref_numpy.estimators.GRADIENT_KEYS,
               dict_output=True, objectives=_estimator_objectives),
    ]
    return {e.name: e for e in entries}


REGISTRY: Dict[str, Entry] = build()
