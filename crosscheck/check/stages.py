"""The four stages of the cross-check, run over seeded cases in float64.

value   ref_numpy vs ref_torch outputs (and exact zeros at masked positions)
vjp     the hand VJP vs torch autograd, for a random cotangent (and exact zeros at masked inputs)
fd      the hand VJP vs scipy finite differences of the NumPy value: a full Jacobian on small
        cases, directional derivatives ⟨u, J v⟩ = ⟨Jᵀu, v⟩ on large ones
detach  where the definition holds a stop-gradient factor: torch autograd vs finite differences
        of the objective with that factor frozen; the distance to finite differences of the
        undetached value is reported beside it
"""
import os
from typing import Dict, List, Sequence

import numpy as np

from .. import bridge, tolerances
from . import cases as cases_mod
from . import finite_diff, stacking
from .registry import Entry
from .results import STAGES, StageResult, fail, record



# ---------------------------------------------------------------- plumbing
def _valid(case: cases_mod.Case, name: str) -> np.ndarray:
    """Positions of input `name` that are real data (the mask where it applies)."""
    x = case.arrays[name]
    for key in ("mask", "valid"):          # token mask, or group_advantages' valid rows
        m = case.arrays.get(key)
        if m is not None and m.shape == x.shape:
            return m.astype(bool)
        if m is not None and m.shape == x.shape[:-1]:    # per-token logits [B, T, V]
            return np.broadcast_to(m.astype(bool)[..., None], x.shape)
    return np.ones(x.shape, dtype=bool)


def _reference(entry: Entry, case: cases_mod.Case) -> list:
    """ref_numpy's outputs on a case, computed once and shared by its stages (read-only)."""
    key = (entry.name, "outputs")
    if key not in case.memo:
        outs = bridge.outputs(entry.numpy_fn(**case.arrays, **case.params), entry.outputs)
        for o in outs:
            if isinstance(o, np.ndarray):
                o.flags.writeable = False
        case.memo[key] = outs
    return case.memo[key]


def _cotangent(entry: Entry, outs: Sequence[np.ndarray], vec: np.ndarray):
    return bridge.cotangent(outs, vec, entry.outputs, entry.dict_output)


def _hand_vjp(entry: Entry, case: cases_mod.Case, g, arrays=None):
    return entry.numpy_vjp(g, **(case.arrays if arrays is None else arrays), **case.params)


def _autograd_vjp(entry: Entry, case: cases_mod.Case, g, arrays=None):
    return bridge.autograd_vjp(entry.torch_fn, case.arrays if arrays is None else arrays,
                               case.params, entry.diff, g,
                               entry.outputs if entry.dict_output else None)


def condition(entry: Entry, case) -> list:
    """κ ≥ 1 per output where the registry declares a condition number, else 1s."""
    if entry.condition is None:
        return [1.0] * len(entry.outputs)
    return entry.condition(dict(case.arrays, **case.params), case.params)


def _info(entry, case, index, seed, **more):
    return dict(case=index, label=case.label, seed=seed, shape=[int(n) for n in case.shape()],
                **more)


# ---------------------------------------------------------------- stages
def stage_value(entry: Entry, case, index, seed, res: StageResult) -> None:
    tol = tolerances.get("value")
    ref = _reference(entry, case)
    twin = bridge.outputs(entry.torch_fn(**bridge.to_torch(case.arrays), **case.params), entry.outputs)
    mask = case.arrays.get("mask")
    for name, a, b, kappa in zip(entry.outputs, ref, twin, condition(entry, case)):
        info = _info(entry, case, index, seed, input=name, got_from="ref_torch",
                     expected_from="ref_numpy")
        if np.isnan(a).any() or np.isnan(b).any():
            fail(res, info, f"output {name} holds NaN for finite valid inputs "
                             f"(ref_numpy: {int(np.isnan(a).sum())}, ref_torch: "
                             f"{int(np.isnan(b).sum())} entries)")
            continue
        i = _padding_leak(mask, a, b)
        if i is not None:
            fail(res, dict(info, index=list(i)), f"output {name} is not 0 at masked position "
                                                  f"{i}: ref_numpy {a[i]}, ref_torch {b[i]}")
            continue
        record(res, bridge.compare(b, a, tol, cond=kappa), info)


def _padding_leak(valid, a, b):
    """The first position outside `valid` where a or b is not exactly 0, or None."""
    if valid is None or a.shape != valid.shape or b.shape != valid.shape:
        return None
    leak = ~valid.astype(bool) & ((a != 0) | (b != 0))      # NaN != 0 counts as a leak too
    return tuple(int(k) for k in np.argwhere(leak)[0]) if leak.any() else None


def _hand_vjp_and_rows(entry: Entry, case, outs, g):
    """The hand VJP at cotangent g. Where the fd stage will need the full Jacobian of the hand
    VJP (one differentiable input, a small case), its rows (one unit cotangent per output) are
    computed in the same stacked call and kept in case.memo for it."""
    if len(entry.diff) != 1 or "fd" not in case.stages:
        return _hand_vjp(entry, case, g)
    name = entry.diff[0]
    idx = np.flatnonzero(_valid(case, name))
    how = stacking.mode(entry.stack, case.arrays, case.params, name)
    if idx.size == 0 or idx.size > finite_diff.FULL_JACOBIAN_MAX_INPUTS or \
            how not in ("rows", "row", "groups", "many"):
        return _hand_vjp(entry, case, g)
    units = [_cotangent(entry, outs, e) for e in np.eye(sum(o.size for o in outs))]
    rows = stacking.vjps(how, lambda arrays, gg: _hand_vjp(entry, case, gg, arrays), case.arrays,
                         [g] + units, name, entry.numpy_vjp, case.params)
    case.memo[(entry.name, name, "hand VJP rows")] = rows[1:]
    return {name: rows[0]}


def vjp_condition(entry: Entry, case, name: str, g_size: float) -> tuple:
    """(scale, κ) of the vjp comparison for input `name`, from the outputs' declared condition.

    An output of condition κ has derivatives κ times its own size per unit input (A = (r − μ)/σ
    moves by ~1/σ = κ/max|r|), and each carries the output's κ ulps of rounding: the terms of a
    VJP err by ~κ²·u·|g| in absolute terms, κ·u relative to a non-zero result. Where the terms
    cancel exactly (pass@k at n = 2, eps = 0: A = ±√2 whatever r is, ∂A/∂r = 0), only the
    absolute part is left, so it is scaled by κ·max|g| and the whole rule by κ. With no declared
    condition, (1, 1)."""
    if entry.condition is None:
        return 1.0, 1.0
    kappa = np.asarray(condition(entry, case)[0] if len(entry.outputs) == 1 else
                       max(float(np.max(k)) for k in condition(entry, case)), dtype=np.float64)
    if kappa.shape != case.arrays[name].shape:
        kappa = np.asarray(float(np.max(kappa)) if kappa.size else 1.0)
    return kappa * g_size, kappa


def stage_vjp(entry: Entry, case, index, seed, res: StageResult, rng) -> None:
    tol = tolerances.get("vjp")
    outs = _reference(entry, case)
    vec = rng.normal(size=sum(o.size for o in outs))
    g = _cotangent(entry, outs, vec)
    hand = _hand_vjp_and_rows(entry, case, outs, g)
    auto = _autograd_vjp(entry, case, g)
    g_size = max([1.0] + [float(np.abs(vec).max())] * bool(vec.size))
    for name in entry.diff:
        info = _info(entry, case, index, seed, input=name, got_from="ref_numpy hand VJP",
                     expected_from="torch autograd")
        h, a = np.asarray(hand[name]), np.asarray(auto[name])
        i = _padding_leak(_valid(case, name), h, a)
        if i is not None:
            fail(res, dict(info, index=list(i)), f"gradient wrt {name} is not 0 at masked "
                                                  f"position {i}: hand {h[i]}, autograd {a[i]}")
            continue
        scale, kappa = vjp_condition(entry, case, name, g_size)
        record(res, bridge.compare(h, a, tol, scale=scale, cond=kappa), info)


def _fd_against(entry: Entry, case, index, seed, res, stage, grad_of, freeze, rng,
                got_from, undetached=False, hand=None):
    """Compare grad_of(arrays, cotangent)[input] with finite differences of the NumPy value."""
    tol = tolerances.get(stage)
    outs = _reference(entry, case)
    n_out = sum(o.size for o in outs)
    f_scale = max((float(np.abs(o[np.isfinite(o)]).max(initial=0.0)) for o in outs), default=0.0)
    f_scale *= max(float(np.max(k)) for k in condition(entry, case))   # inputs' own rounding
    noise = finite_diff.roundoff(f_scale, case.fd_step)
    requests, finishers = [], []      # every problem of every input, solved in one round
    for name in entry.diff:
        x0 = case.arrays[name]
        idx = np.flatnonzero(_valid(case, name))
        if idx.size == 0:
            continue
        base = x0.reshape(-1)[idx].copy()
        how = stacking.mode(entry.stack, case.arrays, case.params, name)

        def f_many(X, frozen=freeze, x0=x0, idx=idx, base=base, name=name, how=how):
            """The NumPy value at each row of X [P, valid entries of `name`]: [P, outputs].
            The freeze rule sees all P perturbations at once (a leading axis on delta)."""
            X = np.atleast_2d(X)
            delta = np.zeros((len(X), x0.size))
            delta[:, idx] = X - base
            delta = delta.reshape((len(X),) + x0.shape)
            if frozen is not None:
                fn, arrays, params = frozen(entry.numpy_fn, case.arrays, case.params, name, delta)
            else:
                fn, arrays, params = entry.numpy_fn, dict(case.arrays, **{name: x0 + delta}), \
                    case.params
            # the arrays that moved carry the point axis: one dimension more than they had
            varying = {k: v for k, v in arrays.items()
                       if isinstance(v, np.ndarray) and isinstance(case.arrays.get(k), np.ndarray)
                       and v.ndim == case.arrays[k].ndim + 1}
            shared = {k: v for k, v in arrays.items() if k not in varying}
            return stacking.evaluate(how, fn, shared, varying, params, entry.outputs)

        info = _info(entry, case, index, seed, input=name, got_from=got_from,
                     expected_from="scipy finite differences" +
                     (" (detached factor frozen)" if freeze is not None else ""))
        if idx.size <= finite_diff.FULL_JACOBIAN_MAX_INPUTS:
            # the fd and detach stages difference the same frozen objective: the Jacobian is
            # solved once, in the fd stage's request, and the detach stage reads it
            key = (entry.name, name, "frozen Jacobian")
            reuse = stage == "detach" and key in case.memo
            if stage == "fd":
                case.memo[key] = None
            if not reuse:
                requests.append(("jacobian", f_many, base, case.fd_step, n_out))
            if undetached:
                requests.append(("jacobian", lambda X, f=f_many: f(X, None), base,
                                 case.fd_step, n_out))
            finishers.append((_full_jacobian(entry, case, res, outs, name, idx, how, grad_of,
                                             hand, tol, noise, info, undetached, key, reuse),
                              (0 if reuse else 1) + undetached))
        else:
            for k in range(3):
                u = rng.normal(size=n_out)
                v = rng.normal(size=idx.size)

                def along(ts, frozen=freeze, u=u, v=v, base=base, f_many=f_many):
                    return np.array([float(u @ row) for row in f_many(
                        base[None, :] + np.asarray(ts)[:, None] * v[None, :], frozen)])
                requests.append(("directional", along, case.fd_step))
                if undetached:
                    requests.append(("directional", lambda ts, a=along: a(ts, None),
                                     case.fd_step))
                finishers.append((_directional(entry, case, res, outs, name, idx, u, v, k,
                                               grad_of, tol, noise, info, undetached),
                                  1 + undetached))
    answers = yield requests
    for finish, n in finishers:
        finish(answers[:n])
        answers = answers[n:]


def _full_jacobian(entry, case, res, outs, name, idx, how, grad_of, hand, tol, noise, info,
                   undetached, key, reuse):
    """What to record once the full finite-difference Jacobian (and the undetached one) is
    known: every entry against the gradient's, its rows from one VJP per output. With `reuse`
    the frozen Jacobian is the one the fd stage solved (case.memo[key]); else it is stored
    there."""
    def finish(answers):
        if reuse:
            J_fd = case.memo[key]
            if J_fd is None:
                raise RuntimeError("the fd stage's finite-difference Jacobian is missing")
            answers = [J_fd] + list(answers)
        J_fd = answers[0]
        case.memo[key] = J_fd
        n_out = J_fd.shape[0]
        rows = case.memo.get((entry.name, name, "hand VJP rows")) if hand is not None else None
        if rows is None:
            units = [_cotangent(entry, outs, e) for e in np.eye(n_out)]
            rows = stacking.vjps(how, grad_of, case.arrays, units, name, hand, case.params)
        J_got = np.array([row.reshape(-1)[idx] for row in rows])
        scale = max(1.0, float(np.abs(J_fd).max()))
        cmp = bridge.compare(J_got, J_fd, tol, scale, noise)
        out_i, in_i = cmp.index if cmp.index else (0, 0)
        x0 = case.arrays[name]
        where = dict(output_index=unflat_index(outs, out_i, entry.outputs),
                     input_index=[int(i) for i in np.unravel_index(idx[in_i], x0.shape)])
        extra = {}
        if undetached:
            extra["undetached_fd_max_abs_diff"] = float(np.abs(J_got - answers[1]).max())
        record(res, cmp, dict(info, mode="full Jacobian", **where, **extra))
    return finish


def _directional(entry, case, res, outs, name, idx, u, v, k, grad_of, tol, noise, info,
                 undetached):
    """What to record once the directional derivative ⟨u, J v⟩ (and the undetached one) is
    known."""
    def finish(answers):
        d_fd = answers[0]
        d_got = float(np.asarray(grad_of(case.arrays, _cotangent(entry, outs, u))[name])
                      .reshape(-1)[idx] @ v)
        extra = {}
        if undetached:
            extra["undetached_fd_max_abs_diff"] = abs(d_got - answers[1])
        cmp = bridge.compare(d_got, d_fd, tol, max(1.0, abs(d_fd)),
                             noise * float(np.abs(u).sum()))
        record(res, cmp, dict(info, mode=f"directional ⟨u, J v⟩, direction {k}", **extra))
    return finish


def unflat_index(outs, flat_index, names):
    for name, o in zip(names, outs):
        if flat_index < o.size:
            return [name] + [int(i) for i in np.unravel_index(flat_index, o.shape)]
        flat_index -= o.size
    return []


def _fd_of_objectives(entry: Entry, case, index, seed, res) -> None:
    """Gradient-valued outputs vs finite differences of the objectives they are gradients of."""
    tol = tolerances.get("fd")
    name = entry.diff[0]
    x0 = case.arrays[name]
    grads = dict(zip(entry.outputs,
                     _reference(entry, case)))
    objectives = entry.objectives(case.arrays, case.params)
    at_x0 = {}                  # each objective's value at x0, seen among the stencil points

    def values(X, key, objective):
        Y = np.asarray(objective(X))
        centre = np.all(np.atleast_2d(X) == x0[None, :], axis=1)
        if centre.any():
            at_x0[key] = float(Y[centre][0])
        return Y[:, None]
    answers = yield [("jacobian", lambda X, key=key, objective=objective: values(X, key, objective),
                      x0, case.fd_step, 1) for key, objective in objectives.items()]
    for (key, objective), J in zip(objectives.items(), answers):
        J = J[0]
        f0 = at_x0[key] if key in at_x0 else float(objective(x0[None, :])[0])
        noise = finite_diff.roundoff(abs(f0), case.fd_step)
        cmp = bridge.compare(grads[key], J, tol, max(1.0, float(np.abs(J).max())), noise)
        record(res, cmp, _info(entry, case, index, seed, input=name, output=key,
                                got_from=f"ref_numpy {key}",
                                expected_from="scipy finite differences of its expectation"))


def stage_fd(entry, case, index, seed, res, rng):
    """A generator: it yields its finite-difference problems (`finite_diff.solve` requests)
    and records once it has their answers (`_drive`)."""
    if entry.objectives is not None:
        return (yield from _fd_of_objectives(entry, case, index, seed, res))
    yield from _fd_against(entry, case, index, seed, res, "fd",
                lambda arrays, g: _hand_vjp(entry, case, g, arrays),
                entry.freeze_for(case.params), rng, "ref_numpy hand VJP",
                hand=entry.numpy_vjp)


def stage_detach(entry, case, index, seed, res, rng):
    """A generator, as `stage_fd`."""
    yield from _fd_against(entry, case, index, seed, res, "detach",
                lambda arrays, g: _autograd_vjp(entry, case, g, arrays),
                entry.freeze_for(case.params), rng,
                "torch autograd", undetached=True)


# ---------------------------------------------------------------- driver
def applicable(entry: Entry, case: cases_mod.Case, stage: str) -> bool:
    if stage not in case.stages:
        return False
    if stage in ("vjp", "fd", "detach") and not entry.diff:
        return False            # not differentiated (a count, stop-gradient weights)
    if stage == "vjp" and entry.numpy_vjp is None:
        return False            # a gradient-valued function: its value stage is the autograd check
    if stage == "detach":
        return entry.freeze_for(case.params) is not None
    return True


def run_entry(entry: Entry, seed: int, n_cases: int,
              stages: Sequence[str] = STAGES) -> List[StageResult]:
    results, jobs = _entry_jobs(entry, seed, n_cases, stages)
    _drive(jobs)
    return [r for r in results.values() if r.cases > 0]


def _entry_jobs(entry, seed, n_cases, stages):
    """Run the value and vjp stages of every case; return the results and the fd and detach
    stages still to drive."""
    results = {s: StageResult(entry.name, s) for s in stages}
    jobs = []
    for i in range(n_cases):
        rng = cases_mod.rng_for(seed, entry.name, i)
        case = entry.case(rng, i)
        for stage in stages:
            if not applicable(entry, case, stage):
                continue
            res = results[stage]
            res.cases += 1
            job = _stage_job(entry, stage, case, i, seed, res)
            if job is not None:
                jobs.append(job)
    return results, jobs


def run_stage(entry: Entry, stage: str, case, index: int, seed: int, res: StageResult) -> None:
    """One stage on one case, recorded into `res`; a twin that raises is a reported failure."""
    job = _stage_job(entry, stage, case, index, seed, res)
    if job is not None:
        _drive([job])


def _stage_job(entry, stage, case, index, seed, res):
    """Run a value or vjp stage now; return an fd or detach stage as a job for `_drive`."""
    stage_rng = cases_mod.rng_for(seed, entry.name + ":" + stage, index)

    def failed(exc):
        fail(res, _info(entry, case, index, seed, input="-"),
             f"raised {type(exc).__name__}: {exc}")
    try:
        if stage == "value":
            stage_value(entry, case, index, seed, res)
        elif stage == "vjp":
            stage_vjp(entry, case, index, seed, res, stage_rng)
        elif stage == "fd":
            return stage_fd(entry, case, index, seed, res, stage_rng), failed
        else:
            return stage_detach(entry, case, index, seed, res, stage_rng), failed
    except Exception as exc:
        failed(exc)
    return None


def _drive(jobs) -> None:
    """Run the fd and detach stages of many cases together. Each job is a generator that
    yields a list of finite-difference problems and receives their answers; the problems of
    all jobs are solved in one `finite_diff.solve` call, so scipy's bookkeeping runs once, not
    once per problem. A job that raises is a reported failure of its own case only: if the
    joint solve raises, each job's problems are solved again on their own."""
    pending = []
    for gen, failed in jobs:
        _advance(gen, failed, pending, None, first=True)
    while pending:
        batch, pending = pending, []
        flat = [req for _, _, reqs in batch for req in reqs]
        try:
            answers = finite_diff.solve(flat)
            split = []
            for _, _, reqs in batch:
                split.append(answers[:len(reqs)])
                answers = answers[len(reqs):]
        except Exception:
            split = []
            for gen, failed, reqs in batch:
                try:
                    split.append(finite_diff.solve(reqs))
                except Exception as exc:
                    failed(exc)
                    split.append(_FAILED)
        for (gen, failed, _), answer in zip(batch, split):
            if answer is not _FAILED:
                _advance(gen, failed, pending, answer)


_FAILED = object()


def _advance(gen, failed, pending, answer, first=False) -> None:
    try:
        requests = next(gen) if first else gen.send(answer)
    except StopIteration:
        return
    except Exception as exc:
        failed(exc)
        return
    pending.append((gen, failed, requests))


def run(entries: Dict[str, Entry], seed: int = 0, n_cases: int = 12,
        stages: Sequence[str] = STAGES, progress=None, workers: int = 1) -> List[StageResult]:
    """Every stage of every entry: the fd and detach problems of all entries solved together.
    With workers=2 (and os.fork), a forked child checks every other entry meanwhile; the
    results come back in registry order, and the same (each case is seeded by its entry).
    Fork only from a process whose torch thread pool has not run (the command line's)."""
    if workers > 1 and len(entries) > 1 and hasattr(os, "fork"):
        out = _run_forked(entries, seed, n_cases, stages)
        if progress is not None:
            for entry in entries.values():
                progress(entry, [r for r in out if r.name == entry.name])
        return out
    per_entry, jobs = [], []
    for entry in entries.values():
        results, entry_jobs = _entry_jobs(entry, seed, n_cases, stages)
        per_entry.append((entry, results))
        jobs.extend(entry_jobs)
    _drive(jobs)
    out: List[StageResult] = []
    for entry, results in per_entry:
        rs = [r for r in results.values() if r.cases > 0]
        out.extend(rs)
        if progress is not None:
            progress(entry, rs)
    return out


def _run_forked(entries, seed, n_cases, stages) -> List[StageResult]:
    """Half of the entries (every other one) in a forked child, the rest here, at once
    (crosscheck.fork); if the child fails, its half runs here."""
    from ..fork import in_two_processes

    names = list(entries)
    theirs = {n: entries[n] for n in names[1::2]}
    mine = {n: entries[n] for n in names[0::2]}
    here, there = in_two_processes(lambda: run(mine, seed, n_cases, stages),
                                   lambda: run(theirs, seed, n_cases, stages))
    by_name = {}
    for r in here + there:
        by_name.setdefault(r.name, []).append(r)
    return [r for n in names for r in by_name.get(n, [])]
