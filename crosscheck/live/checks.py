"""The live checks on one optimizer step, trainer-agnostic: each takes the step's own
tensors (float64 copies), the reference objective and the tolerance row, and adds counts and
graded findings to a StepResult. The closeness rule is `crosscheck.bridge.compare`.
"""
from typing import Callable, Mapping, Optional, Sequence, Tuple

import numpy as np

import ref_numpy

from .. import bridge, tolerances
from .objective import MicroBatch, Objective, applied_gradient, counted_rows, \
    micro_batch_value, split_terms, step_value_and_gradient
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


def _fit(y, x, sel) -> Optional[float]:
    """The one factor c with y ≈ c·x, read where `sel` holds and x is not negligible (the
    median of y/x there), or None where there is no such token."""
    x_max = float(np.max(np.abs(x[sel]))) if sel.any() else 0.0
    use = sel & (np.abs(x) > 1e-6 * x_max)
    if x_max == 0 or not use.any():
        return None
    return float(np.median(y[use] / x[use]))


def _places(sel, limit: int = 4) -> str:
    """The first few (row, position) where `sel` holds, and how many in all."""
    at = [f"({int(r)}, {int(t)})" for r, t in np.argwhere(sel)[:limit]]
    more = int(sel.sum()) - len(at)
    return ", ".join(at) + (f" and {more} more" if more > 0 else "")


def _count(k: int, what: str = "token") -> str:
    return f"{k} {what}" + ("" if k == 1 else "s")


def _agreeing(got, terms, bad, close) -> str:
    """Why the tokens that agree agree: no gradient on either side (not counted, clipped,
    advantage 0 with no KL), or equal within the tolerance."""
    zero = ~bad & close(got, np.zeros_like(got)) & (terms.policy + terms.kl == 0)
    parts = [(zero & ~terms.counted, "not counted (padding or after the end token), no "
                                     "gradient on either side"),
             (zero & terms.counted & terms.clipped, "clipped, zero gradient on both sides"),
             (zero & terms.counted & ~terms.clipped, "with no gradient on either side "
                                                     "(advantage 0)")]
    words = [f"{int(sel.sum())} {why}" for sel, why in parts if sel.any()]
    rest = int((~bad & ~zero).sum())
    if rest:
        words.append(f"{rest} within the tolerance of the reference's")
    return "; ".join(words)


def _sides(sel, terms) -> str:
    """The clip side of each token in `sel`: which bound its ratio r is beyond, by the sign of
    its advantage A, with the range of r there."""
    r, A = terms.ratio, terms.advantages
    lo, hi, d = terms.clip_low, terms.clip_high, terms.delta
    out = []
    for side, where in (
            (f"A > 0, upper bound 1 + ε_high" + (f" = {1 + hi:.6g}" if hi is not None else ""),
             sel & (A > 0)),
            (f"A < 0, lower bound 1 − ε_low" + (f" = {1 - lo:.6g}" if lo is not None else ""),
             sel & (A < 0) & (r <= 1)),
            ("A < 0, r above 1" + (f" (δ = {d:.6g})" if d is not None else ""),
             sel & (A < 0) & (r > 1))):
        if where.any():
            out.append(f"{_count(int(where.sum()))} with {side}, r "
                       f"{float(r[where].min()):.6g}–{float(r[where].max()):.6g}")
    return "; ".join(out)


def explain(got: np.ndarray, terms, close: Callable) -> str:
    """Which term of the reference gradient explains `got` ≠ policy + kl (one micro-batch's
    [B, T]), in words naming the tokens: the simplest explanation that holds at every token.

    In order: the gradient reaches tokens the objective does not count (the mask, never a
    factor, even where the loss type makes the counted tokens' change uniform); one factor at
    every token where the reference is non-zero (a normalisation); the KL term alone scaled
    (its coefficient) or another KL estimator; the policy term alone scaled; the importance
    weight dropped or applied twice; a difference only at tokens clipped on one side and not
    on the other (the clip bounds); else the tokens that differ. `close(a, b)` is the
    closeness rule per token (bool [B, T])."""
    exp = terms.policy + terms.kl
    bad = ~close(got, exp)
    n, k = got.size, int(bad.sum())
    differ = f"{k} of {n} tokens differ"
    rest = _agreeing(got, terms, bad, close)
    tail = f"{differ} ({_places(bad)})" + (f"; the other {n - k}: {rest}" if rest else "")

    leak = bad & ~terms.counted
    if leak.any():
        after = leak & terms.after_end
        where = (f"{_count(int(leak.sum()))} after their completion's first end token, "
                 f"which the objective does not count"
                 if int(after.sum()) == int(leak.sum()) else
                 f"{_count(int(leak.sum()))} the objective does not count (mask = 0)")
        inside = bad & terms.counted
        if not inside.any():
            counted = "the counted tokens agree"
        else:
            f = _fit(got, exp, terms.counted & (exp != 0))
            uniform = f is not None and bool(close(got[terms.counted],
                                                   f * exp[terms.counted]).all())
            counted = (f"the counted tokens' gradient is {f:.6g}× the objective's, since the "
                       f"normalisation counts the extra tokens too" if uniform else
                       f"{_count(int(inside.sum()))} counted differ too, since the "
                       f"normalisation counts the extra tokens")
        return (f"a wrong mask: the gradient reaches {where}, at {_places(leak)}; {counted} "
                f"({differ})")

    nz = exp != 0
    f = _fit(got, exp, nz)
    if f is not None and close(got, f * exp).all():
        return (f"a normalisation or scaling factor: the applied gradient is {f:.6g}× the "
                f"documented objective's at every token where that is non-zero "
                f"({_count(int(nz.sum()))}); {tail}")

    kl_on = terms.kl != 0
    if terms.beta:
        c = _fit(got - terms.policy, terms.kl, kl_on)
        if c is not None and close(got, terms.policy + c * terms.kl).all():
            return (f"the KL term: β·KL's gradient is {c:.6g}× the reference's at the "
                    f"{_count(int(kl_on.sum()))} where it contributes, the policy term agrees: "
                    f"the KL coefficient is {c * terms.beta:.6g}, the configuration's β is "
                    f"{terms.beta:.6g}; {tail}")
        for name, alt in terms.kl_alternatives.items():
            if close(got, terms.policy + alt).all():
                return (f"the KL estimator: the gradient is the policy term plus {name}'s, "
                        f"not the documented {terms.kl_name}'s; {tail}")

    pol_on = terms.policy != 0
    c = _fit(got - terms.kl, terms.policy, pol_on)
    if c is not None and close(got, c * terms.policy + terms.kl).all():
        return (f"the policy term: its gradient is {c:.6g}× the reference's at the "
                f"{_count(int(pol_on.sum()))} where it contributes, the KL term agrees; {tail}")

    r = terms.ratio
    if (pol_on & (np.abs(r - 1) > 1e-12)).any():
        with np.errstate(divide="ignore", invalid="ignore"):
            for weight, words in ((1 / r, "lacks the importance weight r = exp(logp − old_logp)"
                                          ": it is the reference's ÷ r"),
                                  (r, "applies the importance weight r = exp(logp − old_logp) "
                                      "twice: it is the reference's × r")):
                cand = np.where(pol_on, terms.policy * weight, 0.0) + terms.kl
                if close(got, cand).all():
                    return f"the importance weight: the policy term's gradient {words}; {tail}"

    clipped = terms.clipped
    pol_got = got - terms.kl
    wider = bad & clipped
    narrower = bad & terms.counted & ~clipped & pol_on & close(pol_got, np.zeros_like(got))
    if (wider | narrower).any() and not (bad & ~wider & ~narrower).any():
        parts = []
        if wider.any():
            parts.append(f"at {_count(int(wider.sum()))} the reference clips "
                         f"({_sides(wider, terms)}) the trainer's gradient is not 0: it clips "
                         f"at a wider range")
        if narrower.any():
            parts.append(f"at {_count(int(narrower.sum()))} inside the reference's clip range "
                         f"({_sides(narrower, terms)}) the trainer's gradient is 0: it clips "
                         f"at a narrower range")
        return f"the clip bounds (ε_low, ε_high): {'; '.join(parts)}; {tail}"

    return (f"∂loss/∂logp differs from the documented objective's; no one term (a factor, the "
            f"policy term, the KL term, the importance weight, the clip region, the mask) "
            f"explains it alone; {tail}")


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
    objective the trainer documents elsewhere, or (grade "deviation") a named cause; one that
    matches grades the step by it (a deviation's tokens still count as failed).

    Tolerance: the row's rtol relative to each entry, atol relative to the step's largest
    reference entry (a gradient's rounding is relative to its size, which 1/N shrinks)."""
    missing = [mb for mb in mbs if mb.grad is None]
    if missing:
        res.skipped["gradient"] = (f"no gradient reached the log-probs of "
                                   f"{len(missing)} micro-batch(es)")
        return
    applied = applied_gradient(mbs, world)
    counted = counted_rows(mbs)
    _, reference = step_value_and_gradient(documented, counted)
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
            if grade == "deviation":        # named, but the tokens still differ from J's
                res.count("gradient", n, sum(k for *_, k in fails), rel)
            else:
                res.count("gradient", n, 0, 0.0)
            res.findings.append(Finding(
                res.step, "gradient", grade,
                f"{why}; each token's gradient is {span}× the documented objective's",
                source=source))
            return
    res.count("gradient", n, sum(k for *_, k in fails), rel)
    terms = {id(mb): t for mb, t in zip(mbs, split_terms(documented, counted, reference))}
    for mb, got, exp, c, k in fails:
        why = explain(got, terms[id(mb)],
                      lambda a, b: bridge.within(a, b, tol, scale=scale))
        res.findings.append(Finding(
            res.step, "gradient", "deviation", why, rank=mb.rank, micro_batch=mb.index,
            token=c.index, got=c.got, expected=c.expected, source=documented.source))


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
