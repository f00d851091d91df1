"""Finite differences by scipy.differentiate (adaptive central differences with Richardson
extrapolation): the third, implementation-free oracle for every hand-derived gradient."""
import numpy as np
from scipy import differentiate

FULL_JACOBIAN_MAX_INPUTS = 64   # above this, random directional derivatives instead
MAXITER = 3                     # scipy's step halvings: the smallest offset is step / 2**(2 + 3)
EPS = float(np.finfo(np.float64).eps)


def roundoff(f_scale: float, step: float) -> float:
    """A bound on the round-off in a difference quotient of values of size `f_scale`.

    Each f(x ± h) carries an absolute error of a few eps·|f|; dividing by the smallest offset
    h_min = step / 2**(2 + MAXITER) and by the stencil's weights (their absolute sum is < 4)
    gives ≲ 4·eps·|f|/h_min. The factor 16 covers the rounding inside f itself (a sum over a
    batch). Where this exceeds the gradient, finite differences cannot judge it: the harness
    then runs no fd stage on such a case (see cases.py).
    """
    h_min = step / 2.0 ** (2 + MAXITER)
    return 16.0 * EPS * f_scale / h_min


def jacobian(f_many, x0: np.ndarray, step: float) -> np.ndarray:
    """Full Jacobian [m, n] of f: R^n → R^m at x0; f_many evaluates f at many points at once,
    [P, n] → [P, m] (one problem of `solve`)."""
    return solve([("jacobian", f_many, x0, step)])[0]


def directional(phi_many, step: float) -> float:
    """d/dt φ(t) at t = 0 for a scalar φ (a directional derivative ⟨u, J v⟩ when
    φ(t) = ⟨u, f(x0 + t·v)⟩); phi_many evaluates φ at an array of t at once (one problem of
    `solve`)."""
    return solve([("directional", phi_many, step)])[0]


def solve(requests):
    """Many finite-difference problems in one scipy call per kind (and output count).

    scipy iterates every element on its own abscissae and step, so an element's estimate is
    the one it would get alone, except that scipy stops only when every element has converged
    (or at MAXITER): together, an element may take more of its MAXITER halvings than alone.
    Its estimate then moves by less than the finite-difference error; `roundoff` already
    bounds the smallest offset MAXITER allows.

    requests: ("jacobian", f_many, x0, step[, m]) → the Jacobian [m, n] (as `jacobian`; m,
    the number of outputs, saves a call to learn it), or
    ("directional", phi_many, step) → d/dt φ at 0 (as `directional`). Each iteration evaluates
    each problem's function once, on all of its points; scipy's own bookkeeping then runs once
    for all problems instead of once each. Returns the answers in order.
    """
    answers = [None] * len(requests)
    jac = [(i, r) for i, r in enumerate(requests) if r[0] == "jacobian"]
    dirs = [(i, r) for i, r in enumerate(requests) if r[0] == "directional"]
    by_outputs = {}       # one scipy call per output count: no padding to the largest
    for i, r in jac:
        problem = r[1:] if len(r) == 5 else r[1:] + (None,)
        m = problem[3] if problem[3] is not None else np.asarray(
            problem[0](np.asarray(problem[1], dtype=np.float64).reshape(1, -1))).shape[1]
        by_outputs.setdefault(m, []).append((i, problem[:3] + (m,)))
    for group in by_outputs.values():
        for (i, _), J in zip(group, _jacobians([p for _, p in group])):
            answers[i] = J
    if dirs:
        for i, d in zip([i for i, _ in dirs], _directionals([r[1:] for _, r in dirs])):
            answers[i] = d
    return answers


def _jacobians(problems):
    """problems: (f_many, x0, step, m) with one m for all (`solve` groups them)."""
    x0s = [np.asarray(x0, dtype=np.float64).reshape(-1) for _, x0, _, _ in problems]
    ms = [m for _, _, _, m in problems]
    offsets = np.cumsum([0] + [x0.size for x0 in x0s])
    M, N = max(ms), int(offsets[-1])
    x = np.concatenate(x0s)
    steps = np.concatenate([np.full(x0.size, step) for (_, _, step, _), x0 in
                            zip(problems, x0s)])

    def wrapped(X):                        # X: (N,) or (N, P) abscissae, one row per entry
        X2 = X.reshape(N, -1)
        P = X2.shape[1]
        out = np.zeros((M, N, P))
        for (f, _, _, _), x0, m, lo, hi in zip(problems, x0s, ms, offsets[:-1], offsets[1:]):
            n = hi - lo
            pts = np.repeat(x0[None, :], n * P, axis=0)      # entry j moved to X[j, p]
            pts[np.arange(n * P), np.repeat(np.arange(n), P)] = X2[lo:hi].reshape(-1)
            F = np.asarray(f(pts))                            # [n·P, m]
            out[:m, lo:hi, :] = F.reshape(n, P, m).transpose(2, 0, 1)
        return out.reshape((M,) + X.shape)

    res = differentiate.derivative(wrapped, x, initial_step=steps, maxiter=MAXITER,
                                   preserve_shape=True)
    df = np.asarray(res.df)
    return [df[:m, lo:hi] for m, lo, hi in zip(ms, offsets[:-1], offsets[1:])]


def _directionals(problems):
    R = len(problems)
    steps = np.array([step for _, step in problems], dtype=np.float64)

    def wrapped(T):                        # T: (R,) or (R, P)
        T2 = T.reshape(R, -1)
        return np.stack([np.asarray(phi(t), dtype=np.float64) for (phi, _), t in
                         zip(problems, T2)]).reshape(T.shape)

    # preserve_shape: every call sees all R problems in order (scipy would otherwise drop the
    # rows of the ones that have converged, and the rows would no longer match the problems)
    res = differentiate.derivative(wrapped, np.zeros(R), initial_step=steps, maxiter=MAXITER,
                                   preserve_shape=True)
    return [float(v) for v in np.asarray(res.df).reshape(-1)]
