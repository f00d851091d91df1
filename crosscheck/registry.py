"""The registry: one entry per reference function, built explicitly (no import side effects).

An entry ties the NumPy function, its hand VJP and the torch twin to the inputs it is
differentiable in, its case generator and, where the definition holds a stop-gradient factor,
how to perturb an input while holding that factor frozen.
"""
import dataclasses
from typing import Callable, Dict, Optional, Tuple

import numpy as np

import ref_numpy
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
    outputs: Tuple[str, ...] = ("output",)   # names of the returned arrays

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


def _entry(name, diff, detached="", freeze=None, outputs=("output",)):
    return Entry(name=name, numpy_fn=getattr(ref_numpy, name),
                 numpy_vjp=getattr(ref_numpy, name + "_vjp"), torch_fn=getattr(ref_torch, name),
                 diff=diff, case=cases_mod.GENERATORS[name], detached=detached, freeze=freeze,
                 outputs=outputs)


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
    ]
    return {e.name: e for e in entries}


REGISTRY: Dict[str, Entry] = build()
