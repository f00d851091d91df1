"""The one tolerance table. Every gradient check runs in float64; an audit of code that
computes in float32 is judged at float32 tolerance.

A comparison passes where |got − expected| ≤ (atol·scale + rtol·max(|got|, |expected|))·κ (the
rule is `crosscheck.bridge.within`), with scale = 1 except for finite differences, where it is
max(1, the largest |entry| of the finite-difference Jacobian or directional derivative),
because their error is absolute in the size of what is differentiated, and for the vjp stage,
where it is κ·max(1, max|g|) (a VJP's terms are κ times the output's size per unit input and
carry its κ ulps: `crosscheck.check.stages.vjp_condition`), and κ ≥ 1 the condition number of
the output where the registry declares one (else 1).
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str


TOLERANCES = {
    ("value", "float64"): Tolerance(
        rtol=1e-12, atol=1e-12,
        why="the same formula evaluated in a different order and library: a few ulps, "
            "amplified up to ~100× by exp, expm1, the whitening divisions and GAE's "
            "reassociated scan; 1e-12 leaves a further 10× margin over 1e-14"),
    ("vjp", "float64"): Tolerance(
        rtol=1e-10, atol=1e-12,
        why="hand VJP vs autograd: exact derivatives both sides, but through chains "
            "(whitening's mean and variance, the group std, GAE's recursion vs scan) whose "
            "rounding reaches ~1e-13 relative; 1e-10 is 1000× above that and far below any "
            "missing factor, sign or term, which errs by O(1)"),
    ("fd", "float64"): Tolerance(
        rtol=1e-6, atol=1e-8,
        why="scipy.differentiate's Richardson-extrapolated central differences (order 8, "
            "adaptive step ≤ 1e-3) reach 1e-9–1e-11 on smooth pieces; round-off in "
            "f(x ± h) of size eps·|f|/h dominates for |f| ~ e^30, so 1e-6 relative"),
    ("probe", "float64"): Tolerance(
        rtol=1e-10, atol=0.0,
        why="--scale's exact probes of linear maps (the aggregation, GAE): the identity holds to "
            "rounding, which is added as its own bound 64·eps·Σ|terms|; 1e-10 is margin only"),
    ("detach", "float64"): Tolerance(
        rtol=1e-6, atol=1e-8,
        why="the same finite differences as 'fd', of the objective with the detached "
            "factor held at its value"),
    ("audit", "float64"): Tolerance(
        rtol=1e-6, atol=1e-8,
        why="a user's float64 code against the reference: conventions differ by ≥ 1e-4 "
            "relative (eps 1e-4 vs 1e-6 on a unit std), a reordered float64 formula by "
            "≤ 1e-12; 1e-6 separates the two by 100× either way"),
    ("audit", "float32"): Tolerance(
        rtol=2.0 ** -16, atol=2.0 ** -16,
        why="a user's float32 code (inputs cast down, or outputs in float32): each rounding "
            "errs by u = 2^-24 ≈ 6e-8, and a formula of a few dozen of them, amplified up to "
            "~10× by exp, expm1 and the divisions, by ≤ 256·u ≈ 1.5e-5; conventions differ by "
            "≥ 1e-4 relative, so 2^-16 still tells them apart"),
    ("forward", "float32"): Tolerance(
        rtol=2.0 ** -12, atol=2.0 ** -12,
        why="the live audit's log-probs of one model computed twice (at generation and in the "
            "loss, or by its own second forward): the same weights on other batch shapes "
            "reorder the reductions, which a float32 model's log-probs feel to ~1e-5; a "
            "swapped row, model or temperature moves them by ≥ 1e-2, so 2^-12 ≈ 2.4e-4 "
            "separates the two"),
    ("forward", "float64"): Tolerance(
        rtol=1e-9, atol=1e-9,
        why="as the float32 row, for a float64 model: reordered reductions err by ~1e-14"),
    ("ranks", "float64"): Tolerance(
        rtol=0.0, atol=1e-6,
        why="the live audit's cross-rank checksums (Σg and Σ|g| in float64 over every "
            "parameter's gradient) after DDP's all-reduce: every rank holds the same reduced "
            "bits, so they agree exactly unless a backend reduces in a rank-dependent order "
            "(≤ n·u of Σ|g|, n summands); atol relative to Σ|g| leaves 1e-6 for that, while "
            "gradients that were never averaged differ by O(1) of Σ|g|"),
}


# The widest rtol or atol an audit's given tolerance (`rtol=`, `atol=`) may have and still mean
# something: the audit rows above exist to separate rounding from a convention, and conventions
# differ by ≥ 1e-4 (eps 1e-4 vs 1e-6 on a unit std, the smallest gap they list) on outputs of
# order one, which the audit's cases are. Past it a convention, or a wrong formula, can pass:
# the report and the verdict say so.
WIDEST_GIVEN = 1e-4


def too_wide(rtol, atol):
    """The warning for a tolerance given to an audit wider than WIDEST_GIVEN (None: within)."""
    wide = [f"{name} {v:g}" for name, v in (("rtol", rtol), ("atol", atol))
            if v is not None and v > WIDEST_GIVEN]
    if not wide:
        return None
    return (f"the tolerance given ({', '.join(wide)}) is wider than {WIDEST_GIVEN:g}, the "
            f"smallest difference between two conventions the audit must tell apart: a wrong "
            f"function can pass")


def get(stage: str, dtype: str = "float64") -> Tolerance:
    return TOLERANCES[(stage, dtype)]
