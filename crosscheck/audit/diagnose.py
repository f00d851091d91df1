"""When an audit fails, say what the function most likely computes instead.

Two kinds of explanation, tried on the failing (shrunk) case, the same case with ±1e4-scale
padding, and six more cases:
  1. the reference under other conventions: up to two conventions changed, from the registry
     entry's grid (ddof, eps, eps placement, clip bounds, aggregation mode, ...);
  2. a known bug, written as a small variant of the reference (the entry's `known_bugs`: dual
     clip on A > 0, swapped clip bounds, a product of token ratios, KL arguments swapped or its
     sign flipped, unmasked whitening statistics, a value clip around the returns, groups taken
     by position, a CISPO weight that is not detached).

A variant is proposed only when it is sound: the declared conventions fail on those cases, and
the variant reproduces the user's outputs (or gradients) on every one of them it applies to,
padding included, under the audit's closeness rule. A variant that changes nothing on those
cases (an aggregation option without an empty row, say) can therefore never be proposed. A
convention variant is named as a deviation from the declared conventions (from the profile,
when one was given), never as "not a bug".
"""
import itertools
from typing import Dict, List, Tuple

import numpy as np
import torch

from .. import bridge
from .calls import IN_DOMAIN, audit_case, fill_padding, reference_args


def _probe_data(aud, case, n=6) -> List[Dict[str, object]]:
    """The failing case, the same with the mask check's differing in-domain padding, and up to
    n more cases."""
    data, _ = aud.inputs_for(case)
    out = [data]
    if data.get("mask") is not None and not np.asarray(data["mask"]).all():
        _, logprobs, base = IN_DOMAIN[1]
        out.append(fill_padding(data, logprobs, base, names=aud.entry.logprobs))
    for i in range(40):
        if len(out) > n + 1:
            break
        d, _ = aud.inputs_for(audit_case(aud.entry, 99, i))     # seed 99: other cases
        if d is not None:
            out.append(d)
    return out


def _user_values(aud, probes):
    """The user's outputs on the probes it runs on (a probe it raises on is left out)."""
    got = []
    for data in probes:
        try:
            got.append((data, aud.to_numpy(aud.call(data)[0])))
        except Exception:
            continue
    return got if got else None


def _user_grads(aud, probes):
    got = []
    for data in probes:
        names = [d for d in aud.entry.diff if d in data]
        try:
            raw, leaves = aud.call(data, grad_wrt=names)
            outs = aud.outputs_of(raw)
            rng = np.random.default_rng(5)
            gs = [rng.normal(size=tuple(o.shape)) if o.dim() else float(rng.normal())
                  for o in outs]
            grads = bridge.backprop(outs, gs, [leaves[n] for n in names])
        except Exception:          # the user's code raised on a probe: no diagnosis
            return None
        if all(gr is None for gr in grads) and not any(
                isinstance(o, torch.Tensor) and o.requires_grad for o in outs):
            return None            # no gradient at all: nothing to diagnose
        got.append((data, aud.cotangent(gs), {n: (np.zeros(data[n].shape) if gr is None else gr)
                                  for n, gr in zip(names, grads)}))
    return got


def _same(aud, a, b, data, cond=1.0, everywhere=False):
    """Outputs agree on valid positions (gradients, `everywhere`: padding included, where the
    reference's are 0) under the audit's closeness rule."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    where = np.ones(a.shape, dtype=bool) if everywhere else aud.valid_of(data, a.shape)
    return aud.mismatch(a, b, where, cond) is None


def _grid(aud) -> Tuple[Dict[str, tuple], Dict[str, object]]:
    """(the conventions a diagnosis may vary, their declared values): the entry's grid and,
    for policy_objective, the chosen policy loss's own (DPPO's log_ratio_clamp under
    loss='dppo'), at that loss's defaults where not declared."""
    from ..check import registry

    grid, declared = dict(aud.entry.grid), dict(aud.params)
    loss = aud.params.get("loss") if aud.entry.takes_more else None
    sub = registry.REGISTRY.get(registry.POLICY_LOSS_ENTRIES.get(loss, ""))
    if sub is not None:
        for k, values in sub.grid.items():
            if k not in grid and k in sub.defaults:
                grid[k] = values
                declared.setdefault(k, sub.defaults[k])
    return grid, declared


def _variants(aud) -> List[Tuple[str, Dict[str, object]]]:
    grid, declared = _grid(aud)
    keys = [k for k in grid if k in declared]
    out = []
    for n_changed in (1, 2):
        for combo in itertools.combinations(keys, n_changed):
            for values in itertools.product(*(grid[k] for k in combo)):
                if any(declared.get(k) == v for k, v in zip(combo, values)):
                    continue
                out.append((", ".join(f"{k}={v!r}" for k, v in zip(combo, values)),
                            dict(aud.params, **dict(zip(combo, values)))))
    return out


def _declared(aud, label) -> str:
    keys = [part.split("=")[0] for part in label.split(", ")]
    declared = _grid(aud)[1]
    return ", ".join(f"{k}={declared.get(k)!r}" for k in keys)


def _deviation(aud, profile, label) -> str:
    where = f"the {profile} profile declares" if profile else "the declared conventions are"
    return f"{aud.entry.name} with {label} ({where} {_declared(aud, label)})"


def diagnose(aud, case, check, profile=None) -> Tuple[str, bool]:
    """(explanation, whether it is a missing stop-gradient) for a failing check, or ("", False)."""
    if check not in ("value", "grad"):
        return "", False
    probes = _probe_data(aud, case, n=16)
    name = aud.entry.name

    def reference(p):
        return lambda d: aud.entry.numpy_fn(**reference_args(d), **p)
    if check == "value":
        user = _user_values(aud, probes)
        if user is None or _all_match(aud, user, reference(aud.params), need=0):
            return "", False                  # the declared conventions do not fail here
        known = next((bug.label for bug in aud.entry.known_bugs
                      if bug.value is not None and _all_match(
                          aud, user, lambda d, f=bug.value: f(d, aud.params))), None)
        convention = next((label for label, params in _variants(aud)
                           if _all_match(aud, user, reference(params))), None)
        if not known and not convention:      # a known bug on top of a convention change
            known, convention = next(
                ((bug.label, label) for bug in aud.entry.known_bugs if bug.value is not None
                 for label, params in _variants(aud)
                 if _all_match(aud, user, lambda d, f=bug.value, q=params: f(d, q))
                 and not _all_match(aud, _applies(user, bug.value, params),
                                    reference(params))),
                (None, None))
        if known and convention:
            return (f"matches a known bug: {known} (it computes "
                    f"{_deviation(aud, profile, convention)})"), False
        if known:
            return f"matches a known bug: {known}", False
        if convention:
            return f"deviates: it computes {_deviation(aud, profile, convention)}", False
        return "", False
    user = _user_grads(aud, probes)
    if user is None:
        return "", False

    def vjp_of(p):
        return lambda d, g: aud.entry.numpy_vjp(g, **reference_args(d), **p)
    if _all_grads_match(aud, user, vjp_of(aud.params)):
        return "", False                      # the declared gradient does not fail here
    undetached = None if aud.entry.undetached is None else aud.entry.undetached(aud.params)
    for label, params in _variants(aud):
        if _all_grads_match(aud, user, vjp_of(params)):
            detach = undetached is not None and all(params.get(k) == v
                                                    for k, v in undetached.items())
            if detach:
                return ("GSPO-token's sequence factor is not detached: the gradient flows "
                        f"through the mean (its gradient is {name}'s with {label})"), True
            return f"deviates: its gradient is that of {_deviation(aud, profile, label)}", False
    wrt = aud.entry.diff[0]
    for bug in aud.entry.known_bugs:
        if bug.grad is None:
            continue
        if _all_grads_match(aud, user, lambda d, g, f=bug.grad: {wrt: f(d, aud.params, g)}):
            return f"matches a known bug: {bug.label}", bug.detach
    if aud.entry.detached and _all_grads_match(
            aud, user, lambda d, g: {wrt: _full_derivative(aud, d, g, wrt)}):
        return (f"a stop-gradient is missing: your gradient is the full derivative of the "
                f"loss's value, {aud.entry.detached} differentiated too"), True
    return "", False


def _full_derivative(aud, data, g, wrt, h=1e-6):
    """Σ_out g·∂(reference value)/∂wrt by central differences of the reference's *value*,
    which every stop-gradient leaves unchanged: the gradient of a function that forgot to
    detach its weight. Only valid positions move (padding gets 0). Every entry with a
    `detached` factor is elementwise or small here (the shrunk case and the probes)."""
    x = np.asarray(data[wrt], dtype=np.float64)
    valid = aud.valid_of(data, x.shape)
    gs = g if isinstance(g, (tuple, list)) else (g,)

    def value(xv):
        out = aud.entry.numpy_fn(**reference_args(dict(data, **{wrt: xv})), **aud.params)
        return [np.asarray(o, dtype=np.float64) for o in (out if isinstance(out, tuple)
                                                          else (out,))]
    grad = np.zeros(x.shape)
    for j in zip(*np.nonzero(valid)):
        step = h * max(1.0, abs(x[j]))
        up, down = x.copy(), x.copy()
        up[j] += step
        down[j] -= step
        grad[j] = sum(float(np.sum(np.asarray(gi) * (a - b))) for gi, a, b in
                      zip(gs, value(up), value(down))) / (2 * step)
    return grad


def _applies(user, variant, params):
    """The probes (data, yours) a variant applies to: a known bug that the convention change
    alone reproduces on all of them explains nothing (a regrouping of one group)."""
    out = []
    for data, yours in user:
        try:
            variant(data, params)
        except (ValueError, TypeError):
            continue
        out.append((data, yours))
    return out


def _all_match(aud, user, fn, at_least=2, need=None):
    """The variant reproduces the user's outputs on every probe it applies to (≥ at_least of
    them). With need=0, whether it reproduces them everywhere it applies at all."""
    compared = 0
    for data, yours in user:
        try:
            ref = bridge.outputs(fn(data), aud.keys if aud.entry.dict_output else None)
        except (ValueError, TypeError):
            continue                          # the variant does not apply to this probe
        if len(ref) != len(yours) or not all(_same(aud, y, r, data, k) for y, r, k in
                                             zip(yours, ref, aud.condition(data))):
            return False
        compared += 1
    if need == 0:
        return True
    return compared >= min(at_least, len(user))


def _all_grads_match(aud, user, vjp):
    for data, g, yours in user:
        try:
            ref = vjp(data, g)
        except (ValueError, TypeError):
            return False
        kappa = max(float(np.max(k)) for k in aud.condition(data))
        for n, y in yours.items():
            if not _same(aud, y, ref[n], data, kappa, everywhere=True):
                return False
    return True
