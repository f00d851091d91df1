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


def jacobian(f, x0: np.ndarray, step: float) -> np.ndarray:
    """Full Jacobian [m, n] of f: R^n → R^m at x0 (each stencil point is one call of f)."""
    m = np.asarray(f(x0)).size

    def batched(x):                         # scipy passes x as (n, *extra)
        flat = x.reshape(x.shape[0], -1)
        out = np.stack([f(flat[:, k]) for k in range(flat.shape[1])], axis=-1)
        return out.reshape((m,) + x.shape[1:])

    res = differentiate.jacobian(batched, np.asarray(x0, dtype=np.float64), initial_step=step,
                                 maxiter=MAXITER)
    return np.asarray(res.df).reshape(m, x0.size)


def directional(phi, step: float) -> float:
    """d/dt φ(t) at t = 0 for a scalar φ (a directional derivative ⟨u, J v⟩ when
    φ(t) = ⟨u, f(x0 + t·v)⟩)."""
    def batched(t):
        t = np.asarray(t, dtype=np.float64)
        return np.array([phi(float(s)) for s in t.ravel()]).reshape(t.shape)

    res = differentiate.derivative(batched, 0.0, initial_step=step, maxiter=MAXITER)
    return float(res.df)
