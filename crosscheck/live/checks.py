"""The live checks on one optimizer step, trainer-agnostic: each takes the step's own
tensors (float64 copies), the reference objective and the tolerance row, and adds counts and
graded findings to a StepResult. The closeness rule is `crosscheck.bridge.compare`.
"""
from typing import Callable, Mapping, Optional, Sequence, Tuple

import numpy as np

import ref_numpy

from .. import bridge, tolerances
from .objective import MicroBatch, Objective, applied_gradient, micro_batch_value, \
    step_value_and_gradient
from .report import Finding, StepResult

# where a precision is lower than float32 there is no tolerance row to judge it at
JUDGED = ("float32", "float64")


def tolerance_row(dtypes: Sequence[str]) -> Tuple[str, object]:
    """The row a run is judged at: float32 if any of its log-probs are float32, else float64."""
    dtype = "float32" if "float32" in dtypes else "float64"
    return dtype, tolerances.get("audit", dtype)


def row_words(row: str, dtypes: Sequence[str]) -> str:
    """The tolerance row a run is judged at, and why, for the report."""
    seen = ", ".join(dtypes) if dtypes else "none recorded"
    return f"the {row} audit row of the tolerance table (log-probs: {seen})"


def _uniform_factor(got, expected) -> Optional[float]:
    """got/expected when one factor relates them at every token where the reference is not
    zero (to 1e-3), else None: the sign of a normalisation or scaling bug."""
    nz = np.abs(expected) > 0
    if not nz.any():
        return None
    r = got[nz] / expected[nz]
    med = float(np.median(r))
    return med if np.all(np.abs(r - med) <= 1e-3 * abs(med)) else None


def _gradient_fails(mbs, applied, reference, tol, scale):
    out = []
    for mb, got, exp in zip(mbs, applied, reference):
        c = bridge.compare(got, exp, tol, scale=scale)
        if not c.ok:
            bad = ~bridge.within(got, exp, tol, scale=scale)
            out.append((mb, got, exp, c, int(bad.sum())))
    return out


def gradient(res: StepResult, mbs: Sequence[MicroBatch], world: int, documented: Objective,
             tol, alternatives: Sequence[Tuple[Callable, str, str, str]] = ()) -> None:
    """Check 3: Σ_window (1/P)·∂(loss back-propagated)/∂logp = ∂J/∂logp at every token.

    Where it fails, each alternative (gradients of `mbs`, grade, why, source): a form of the
    objective the trainer documents elsewhere; one that matches grades the step by it.

    Tolerance: the row's rtol relative to each entry, atol relative to the step's largest
    reference entry (a gradient's rounding is relative to its size, which 1/N shrinks)."""
    missing = [mb for mb in mbs if mb.grad is None]
    if missing:
        res.skipped["gradient"] = (f"no gradient reached the log-probs of "
                                   f"{len(missing)} micro-batch(es)")
        return
    applied = applied_gradient(mbs, world)
    _, reference = step_value_and_gradient(documented, mbs)
    scale = max(float(np.max(np.abs(g))) if g.size else 0.0 for g in reference)
    fails = _gradient_fails(mbs, applied, reference, tol, scale)
    n = sum(g.size for g in applied)
    rel = max((bridge.compare(a, r, tol, scale=scale).max_rel
               for a, r in zip(applied, reference)), default=0.0)
    if not fails:
        res.count("gradient", n, 0, rel)
        return
    for alt_grads, grade, why, source in alternatives:
        alt_ref = alt_grads(mbs)
        alt_scale = max(float(np.max(np.abs(g))) if g.size else 0.0 for g in alt_ref)
        if not _gradient_fails(mbs, applied, alt_ref, tol, alt_scale):
            ratios = np.concatenate([a[r != 0] / r[r != 0] for a, r in zip(alt_ref, reference)])
            span = (f"{ratios.min():.4g}–{ratios.max():.4g}" if ratios.size else "1")
            res.count("gradient", n, 0, 0.0)
            res.findings.append(Finding(
                res.step, "gradient", grade,
                f"{why}; each token's gradient is {span}× the documented objective's",
                source=source))
            return
    res.count("gradient", n, sum(k for *_, k in fails), rel)
    for mb, got, exp, c, k in fails:
        padded = (~mb.mask) & (got != 0)
        if padded.any():
            why = (f"the gradient reaches {int(padded.sum())} token(s) the objective does "
                   f"not count (mask = 0): a wrong mask")
        else:
            f = _uniform_factor(got[mb.mask], exp[mb.mask])
            why = (f"the applied gradient is {f:.6g}× the documented objective's at every "
                   f"token: a normalisation or scaling factor" if f is not None else
                   f"∂loss/∂logp differs from the documented objective's")
        res.findings.append(Finding(
            res.step, "gradient", "deviation", f"{why} ({k} of {got.size} tokens differ)",
            rank=mb.rank, micro_batch=mb.index, token=c.index, got=c.got,
            expected=c.expected, source=documented.source))


def _abs_scale(kwargs, factor, mb: MicroBatch) -> float:
    """The size of the sum's terms: the objective with |A| (for every loss here the per-token
    terms then share one sign, so the sum is Σ|w·l|)."""
    absed = MicroBatch(**{**mb.__dict__, "advantages": np.abs(mb.advantages)})
    return abs(micro_batch_value(kwargs, factor, absed))


def micro_batch_losses(res: StepResult, mbs: Sequence[MicroBatch],
                       formula: Callable[[MicroBatch], Tuple[Mapping, float, str]], tol,
                       extra: Optional[Callable[[MicroBatch], float]] = None) -> None:
    """Check 2: each micro-batch's returned loss = the reference objective of that micro-batch
    under the trainer's aggregation (`formula(mb)` gives its keywords, factor and source), plus
    `extra(mb)` where the loss holds a further term the reference computes (a critic's value
    loss, whose gradient reaches the critic, not the log-probs).

    Tolerance: the row's atol relative to the size of the summed terms (a sum of B·T rounded
    terms that cancel is exact only to that size)."""
    fails = 0
    rel = 0.0
    for mb in mbs:
        kwargs, factor, source = formula(mb)
        expected = micro_batch_value(kwargs, factor, mb)
        more = extra(mb) if extra is not None else 0.0
        expected += more
        c = bridge.compare(mb.loss, expected, tol, scale=max(_abs_scale(kwargs, factor, mb)
                                                              + abs(more), abs(expected)))
        rel = max(rel, c.max_rel)
        if not c.ok:
            fails += 1
            res.findings.append(Finding(
                res.step, "micro-batch loss", "deviation",
                "the loss this micro-batch returned is not the reference objective of its "
                "rows under the trainer's aggregation", rank=mb.rank, micro_batch=mb.index,
                got=mb.loss, expected=expected, source=source))
    res.count("micro-batch loss", len(mbs), fails, rel)


def advantages(res: StepResult, got: np.ndarray, rewards: np.ndarray, at: slice,
               conventions: Mapping[str, object], source: str, tol, rank: int,
               valid: Optional[np.ndarray] = None) -> None:
    """Check 1: the advantages the trainer computed from this step's rewards and groups equal
    the reference estimator's (`group_advantages` with the trainer's conventions).

    Tolerance: the row, times κ = max|r − mean| / spread + 1 (centring rewards on a large
    common offset cannot be more accurate than their rounding)."""
    expected = ref_numpy.group_advantages(rewards, valid=valid, **conventions)[at]
    r = rewards[valid] if valid is not None else rewards
    spread = float(np.std(r)) if r.size else 0.0
    kappa = 1.0 + (float(np.max(np.abs(r))) / spread if spread > 0 else 0.0)
    c = bridge.compare(got, expected, tol, cond=kappa)
    bad = int((~bridge.within(got, expected, tol, cond=kappa)).sum()) if not c.ok else 0
    res.count("advantages", got.size, bad, c.max_rel)
    if not c.ok:
        res.findings.append(Finding(
            res.step, "advantages", "deviation",
            f"{bad} of {got.size} advantages differ from group_advantages on this step's "
            f"rewards", rank=rank, token=c.index, got=c.got, expected=c.expected,
            source=source))


def metric(res: StepResult, name: str, got: float, expected: float, tol, source: str,
           micro_batch: int) -> None:
    """Check 4: a value the trainer logs equals the reference's on the same tensors."""
    c = bridge.compare(got, expected, tol)
    res.count("metrics", 1, 0 if c.ok else 1, c.max_rel)
    if not c.ok:
        res.findings.append(Finding(
            res.step, "metrics", "deviation", f"the logged {name!r} is not the reference's",
            micro_batch=micro_batch, got=float(got), expected=float(expected), source=source))


def ranks_agree(res: StepResult, sums: Sequence[Tuple[float, float]], tol, source: str) -> None:
    """Every process's gradient checksum (Σg, Σ|g|), gathered after the step's last backward,
    equals rank 0's: the gradients were averaged across processes. One comparison per rank.

    Tolerance: atol relative to rank 0's Σ|g| (the `ranks` row)."""
    base = np.asarray(sums[0], dtype=np.float64)
    scale = max(abs(float(base[1])), 1e-300)
    bad = []
    rel = 0.0
    for rank, got in enumerate(sums[1:], start=1):
        c = bridge.compare(np.asarray(got, dtype=np.float64), base, tol, scale=scale)
        rel = max(rel, c.max_rel)
        if not c.ok:
            bad.append(rank)
    res.count("rank agreement", len(sums) - 1, len(bad), rel)
    if bad:
        shown = "; ".join(f"rank {r} ({sums[r][0]:.9g}, {sums[r][1]:.9g})"
                          for r in [0, *bad])
        res.findings.append(Finding(
            res.step, "rank agreement", "deviation",
            f"after the step's last backward the gradients differ across processes: "
            f"checksums (Σg, Σ|g|) {shown}; rank(s) {', '.join(map(str, bad))} disagree with "
            f"rank 0: the gradients were not averaged across processes (an all-reduce "
            f"skipped, e.g. a backward under no_sync)", rank=bad[0],
            got=float(sums[bad[0]][0]), expected=float(base[0]), source=source))
