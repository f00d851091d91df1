"""Shrinking a failing case to a minimal counterexample, and describing it."""
import numpy as np

from .. import bridge
from ..check import cases as cases_mod
from .auditor import Auditor
from .calls import InputMutated, exception_text
from .model import Outcome

SHRINK_STEPS = 60


def shrink(aud: Auditor, case, check: str):
    """Greedily drop rows and columns and round values while `check` still fails."""
    def fails(c):
        try:
            return any(o.check == check and (not o.ok if check != "garbage" else o.warn)
                       for o in aud.run_case(c, only=check))
        except Exception:
            return False

    current = case
    for _ in range(SHRINK_STEPS):
        progressed = False
        for candidate in smaller(current):
            if fails(candidate):
                current, progressed = candidate, True
                break
        if not progressed:
            break
    return current


def smaller(case):
    """Candidate cases one step smaller than `case`: a row (a whole group, for grouped data) or
    an end column dropped, or the values rounded to 1 and then 0 decimals."""
    arrays, params = case.arrays, case.params
    tok = [k for k, v in arrays.items() if isinstance(v, np.ndarray) and v.ndim == 2]
    seq = [k for k, v in arrays.items() if isinstance(v, np.ndarray) and v.ndim == 1]
    first = next((v for v in arrays.values() if isinstance(v, np.ndarray)), None)
    if first is None:
        return
    B = first.shape[0]
    grouped = "group_size" in params or arrays.get("group_ids") is not None
    if B > 1:
        if grouped:
            G = params.get("group_size")
            ids = arrays.get("group_ids")
            labels = (np.arange(B) // G) if G else ids
            for lab in np.unique(labels):
                keep = labels != lab
                if keep.any():
                    yield _take(case, keep, tok + seq)
        else:
            for i in range(B):
                keep = np.arange(B) != i
                yield _take(case, keep, tok + seq)
    if tok and arrays[tok[0]].shape[1] > 1:
        for cols in (slice(0, -1), slice(1, None)):
            new = dict(arrays)
            for k in tok:
                new[k] = arrays[k][:, cols]
            m = new.get("mask")
            if m is None or m.any():
                yield cases_mod.Case(case.label, new, params)
    for decimals in (1, 0):
        new = {k: (np.round(v, decimals) if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                   else v) for k, v in arrays.items()}
        if any(not np.array_equal(new[k], arrays[k], equal_nan=True) for k in new
               if isinstance(arrays[k], np.ndarray)):
            yield cases_mod.Case(case.label, new, params)


def _take(case, keep, keys):
    arrays = dict(case.arrays)
    for k in keys:
        arrays[k] = arrays[k][keep]
    params = dict(case.params)
    if "group_size" in params and arrays.get("group_ids") is None:
        G = params.pop("group_size")
        arrays["group_ids"] = (np.arange(keep.size) // G)[keep]
    return cases_mod.Case(case.label, arrays, params)


def _labelled(aud, outputs):
    """Outputs as the report shows them: one array, or a dict by the reference's names."""
    outputs = [bridge.json_safe(o) for o in outputs]
    if len(outputs) == 1:
        return outputs[0]
    return dict(zip(aud.keys, outputs))


def describe(aud: Auditor, case, outcome: Outcome):
    """The counterexample as the report shows it: the inputs (padding included), both outputs,
    and for a gradient failure both gradients."""
    data, _ = aud.inputs_for(case)
    if data is None:
        return None
    if outcome.check in ("mask", "garbage"):     # the padding the failing call was given
        again = next((o for o in aud.run_case(case, only=outcome.check)
                      if o.check == outcome.check and
                      o.replay is not None), None)
        if again is not None:
            data = again.replay
    # an input kept only for the reference (one it does not read either) was not passed
    ce = {k: bridge.json_safe(v) for k, v in data.items() if aud.accepts(k)}
    try:
        ce["reference output"] = _labelled(aud, aud.reference_outputs(data))
        try:
            raw, _ = aud.call(data)
        except InputMutated as exc:
            raw = exc.output
            ce["inputs after your call"] = {k: bridge.json_safe(v) for k, v in exc.after.items()}
        ce["your output"] = ("None: your function returned nothing" if raw is None else
                             _labelled(aud, aud.to_numpy(raw)))
    except Exception as exc:
        ce["your output"] = f"raised {exception_text(exc)}"
    if outcome.check in ("grad", "detach"):
        name = next((d for d in aud.entry.diff if d in data), None)
        try:
            yours, ref = aud.plain_gradients(data, name)
            ce["gradient of"] = f"the sum of the valid outputs, wrt {name}"
            ce["your gradient"] = bridge.json_safe(yours)
            ce["reference gradient"] = bridge.json_safe(ref)
        except Exception:           # no gradient to show (e.g. the function returns numbers)
            pass
    return ce
