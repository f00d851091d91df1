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

# A freeze rule: (arrays, params, input name, perturbation of that input) -> (numpy function,
# arrays, params) whose value is the objective with every detached factor held at its value at
# the unperturbed point. An entry's `freeze` gives the rule that applies to a case's params.
Freeze = Callable[[Dict[str, np.ndarray], Dict[str, object], str, np.ndarray],
                  Tuple[Callable, Dict[str, np.ndarray], Dict[str, object]]]


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
        """The freeze rule that applies to a case, or None (no stop-gradient in its definition)."""
        return None if self.freeze is None else self.freeze(params)


def _freeze_ratio(arrays, params, name, delta):
    """CISPO: hold r = exp(logp − old_logp) fixed by moving old_logp with logp: sg(w(r)) frozen,
    and the objective is the same function of the perturbed arrays."""
    fn = getattr(ref_numpy, "policy_objective" if "loss" in params else "cispo_loss")
    out = dict(arrays)
    out[name] = arrays[name] + delta
    out["old_logp"] = arrays["old_logp"] + delta
    return fn, out, params


def _freeze_sequence_ratio(arrays, params, name, delta):
    """GSPO-token: the ratio of token t is exp(logp_t − sg(logp_t) + sg(ρ̄_i)); with ρ̄ frozen at
    its value it is exp(min(ρ̄_i + Δlogp_t, cap)), a per-token PPO ratio against
    old' = logp − ρ̄_i whose log is capped from above only (PPO's log_ratio_clamp is two-sided,
    so the cap is applied to logp instead: logp' = old' + min(logp − old', cap)). For
    policy_objective the KL term must see the real logp: the aggregation is linear, so the
    objective splits into the policy part on logp' (β = 0) plus the KL part on logp (A = 0)."""
    lp, old = arrays["logp"], arrays["old_logp"]
    m = np.ones(lp.shape, bool) if arrays.get("mask") is None else arrays["mask"].astype(bool)
    with np.errstate(invalid="ignore"):
        diff = np.where(m, lp - old, 0.0)
    rho_bar = diff.sum(axis=-1, keepdims=True) / np.maximum(m.sum(axis=-1, keepdims=True), 1)
    out = dict(arrays, old_logp=np.where(m, lp - rho_bar, old))
    out[name] = arrays[name] + delta
    cap = params.get("log_ratio_max")
    if cap is not None:
        with np.errstate(invalid="ignore"):            # padding may hold NaN or inf
            out["logp"] = np.where(m, out["old_logp"] + np.minimum(out["logp"] - out["old_logp"],
                                                                   cap), 0.0)
    ppo = dict(clip_low=params.get("clip_low", 3e-4), clip_high=params.get("clip_high", 4e-4))
    if "loss" not in params:
        return ref_numpy.ppo_clip_loss, out, ppo
    rest = {k: v for k, v in params.items()
            if k not in ("form", "log_ratio_max", "clip_low", "clip_high", "loss")}

    def objective(logp, old_logp, advantages, mask=None, ref_logp=None, **kw):
        args = dict(old_logp=old_logp, advantages=advantages, mask=mask, ref_logp=ref_logp)
        policy = ref_numpy.policy_objective(logp, **args, **dict(kw, beta=0.0), loss="ppo", **ppo)
        if kw.get("beta", 0.0) == 0.0:
            return policy
        real = arrays["logp"] + delta                 # ratio 1 and A = 0: the KL part alone
        return policy + ref_numpy.policy_objective(
            real, **dict(args, old_logp=real, advantages=np.zeros_like(advantages)), **kw,
            loss="ppo", **ppo)
    return objective, out, rest


def _cispo_rule(params):
    return _freeze_ratio


def _gspo_rule(params):
    return _freeze_sequence_ratio if params.get("form", "token") == "token" else None


def _objective_rule(params):
    loss = params.get("loss", "ppo")
    if loss == "cispo":
        return _freeze_ratio
    return _gspo_rule(params) if loss == "gspo" else None


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
               freeze=_cispo_rule),
        _entry("gspo_loss", ("logp",),
               detached="the sequence ratio in form='token' (straight-through GSPO-token)",
               freeze=_gspo_rule),
        _entry("value_loss", ("values",)),
        _entry("kl_penalty", ("logp",)),
        _entry("aggregate", ("loss",)),
        _entry("policy_objective", ("logp",),
               detached="CISPO's weight, or GSPO-token's sequence ratio", freeze=_objective_rule),
        _entry("kl_estimator_moments", ("logits",), outputs=ref_numpy.estimators.MOMENT_KEYS,
               dict_output=True),
        _entry("kl_estimator_gradient", ("logits",), outputs=ref_numpy.estimators.GRADIENT_KEYS,
               dict_output=True, objectives=_estimator_objectives),
        _entry("discounted_returns", ("rewards",)),
        _entry("approx_kl", ("logp",)),
        _entry("clip_fraction", ()),                  # a count: value stage only
    ]
    return {e.name: e for e in entries}


REGISTRY: Dict[str, Entry] = build()
