"""When an audit fails, say what the function most likely computes instead.

Two kinds of explanation, tried in order on the failing (shrunk) case and six more cases:
  1. a convention difference: the same reference with up to two conventions changed (ddof,
     eps, eps placement, clip bounds, aggregation mode, ...), from the registry entry's grid —
     "a convention difference, not a bug";
  2. a known bug, written as a small variant of the reference (the entry's `known_bugs`: dual
     clip on A > 0, swapped clip bounds, a product of token ratios, KL arguments swapped or its
     sign flipped, unmasked whitening statistics, a value clip around the returns, groups taken
     by position, a CISPO weight that is not detached).
A variant explains the failure only if it reproduces the user's outputs (or gradients) on every
one of those cases.
"""
import itertools
from typing import Dict, List, Tuple

import numpy as np
import torch

from .. import bridge
from ..check import cases as cases_mod
from .calls import as_trainer_batch, finite_padding, reference_args


def _probe_cases(aud, case, n=6):
    out = [case]
    for i in range(40):
        if len(out) > n:
            break
        c = finite_padding(aud.entry.case(cases_mod.rng_for(99, aud.entry.name, i), i))
        c = as_trainer_batch(c)
        data, _ = aud.inputs_for(c)
        if data is not None:
            out.append(c)
    return out


def _user_values(aud, probes):
    """The user's outputs on the probes it runs on (a probe it raises on is left out)."""
    got = []
    for c in probes:
        data, _ = aud.inputs_for(c)
        try:
            got.append((data, aud.to_numpy(aud.call(data)[0])))
        except Exception:
            continue
    return got if got else None


def _user_grads(aud, probes):
    wrt = [d for d in aud.entry.diff]
    got = []
    for c in probes:
        data, _ = aud.inputs_for(c)
        names = [d for d in wrt if d in data]
        try:
            raw, leaves = aud.call(data, grad_wrt=names)
            outs = raw if isinstance(raw, tuple) else (raw,)
            rng = np.random.default_rng(5)
            gs = [rng.normal(size=tuple(o.shape)) if o.dim() else float(rng.normal())
                  for o in outs]
            grads = bridge.backprop(outs, gs, [leaves[n] for n in names])
        except Exception:          # the user's code raised on a probe: no diagnosis
            return None
        if all(gr is None for gr in grads) and not any(
                isinstance(o, torch.Tensor) and o.requires_grad for o in outs):
            return None            # no gradient at all: nothing to diagnose
        got.append((data, tuple(gs) if len(gs) > 1 else gs[0],
                    {n: (np.zeros(data[n].shape) if gr is None else gr)
                     for n, gr in zip(names, grads)}))
    return got


def _same(aud, a, b, data):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    return aud.mismatch(a, b, aud.valid_of(data, a.shape)) is None


def _variants(aud) -> List[Tuple[str, Dict[str, object]]]:
    grid = aud.entry.grid
    keys = [k for k in grid if k in aud.params]
    out = []
    for n_changed in (1, 2):
        for combo in itertools.combinations(keys, n_changed):
            for values in itertools.product(*(grid[k] for k in combo)):
                if any(aud.params.get(k) == v for k, v in zip(combo, values)):
                    continue
                out.append((", ".join(f"{k}={v!r}" for k, v in zip(combo, values)),
                            dict(aud.params, **dict(zip(combo, values)))))
    return out


def diagnose(aud, case, check) -> Tuple[str, bool]:
    """(explanation, whether it is a missing stop-gradient) for a failing check, or ("", False)."""
    if check not in ("value", "grad"):
        return "", False
    probes = _probe_cases(aud, case)
    name = aud.entry.name
    if check == "value":
        user = _user_values(aud, probes)
        if user is None:
            return "", False
        known = next((bug.label for bug in aud.entry.known_bugs
                      if bug.value is not None and _all_match(
                          aud, user, lambda d, f=bug.value: f(d, aud.params))), None)
        convention = next((label for label, params in _variants(aud)
                           if _all_match(aud, user, lambda d, p=params: aud.entry.numpy_fn(
                               **reference_args(d), **p))), None)
        if known and convention:
            return (f"matches a known bug: {known} (it computes the same as {name} with "
                    f"{convention})", False)
        if known:
            return f"matches a known bug: {known}", False
        if convention:
            return (f"matches {name} with {convention}: a convention difference, not a bug",
                    False)
        return "", False
    user = _user_grads(aud, probes)
    if user is None:
        return "", False
    undetached = None if aud.entry.undetached is None else aud.entry.undetached(aud.params)
    for label, params in _variants(aud):
        def vjp(d, g, p=params):
            return aud.entry.numpy_vjp(g, **reference_args(d), **p)
        if _all_grads_match(aud, user, vjp):
            detach = undetached is not None and all(params.get(k) == v
                                                    for k, v in undetached.items())
            what = ("GSPO-token's sequence factor is not detached: the gradient flows through "
                    "the mean (" if detach else "") + f"matches {name}'s gradient with {label}" + \
                (")" if detach else ": a convention difference, not a bug")
            return what, detach
    wrt = aud.entry.diff[0]
    for bug in aud.entry.known_bugs:
        if bug.grad is None:
            continue
        if _all_grads_match(aud, user, lambda d, g, f=bug.grad: {wrt: f(d, aud.params, g)}):
            return f"matches a known bug: {bug.label}", bug.detach
    return "", False


def _all_match(aud, user, fn, at_least=2):
    """The variant reproduces the user's outputs on every probe it applies to (≥ at_least)."""
    compared = 0
    for data, yours in user:
        try:
            ref = fn(data)
        except (ValueError, TypeError):
            continue                          # the variant does not apply to this probe
        refs = ref if isinstance(ref, tuple) else (ref,)
        if len(refs) != len(yours) or not all(_same(aud, y, r, data)
                                              for y, r in zip(yours, refs)):
            return False
        compared += 1
    return compared >= min(at_least, len(user))


def _all_grads_match(aud, user, vjp):
    for data, g, yours in user:
        try:
            ref = vjp(data, g)
        except (ValueError, TypeError):
            return False
        for n, y in yours.items():
            if not _same(aud, y, ref[n], data):
                return False
    return True
