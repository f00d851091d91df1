"""Advantage estimators: GAE, whitening, group-relative (GRPO/RLOO) advantages.

Readable reference implementations in float64, each with a hand-derived VJP.
"""
import numpy as np

from ref_common import args, checks

from . import _arrays as ar
from ._arrays import OPS


# ====================================================================== GAE
def _gae_inputs(rewards, values, mask, gamma, lam, dones, last_value):
    a = args.gae(OPS, rewards, values, mask, gamma, lam, dones, last_value)
    r, v, m = a.rewards, a.values, a.mask
    d = np.zeros(r.shape) if a.dones is None else np.where(m, a.dones, False).astype(np.float64)
    lv = np.zeros(r.shape[:-1]) if a.last_value is None else a.last_value
    (r, v, m, d, lv), squeeze = ar.as_2d(ar.zero_masked(r, m), ar.zero_masked(v, m), m, d, lv)
    return r, v, m, d, lv, a.gamma, a.lam, squeeze


def gae(rewards, values, mask=None, *, gamma, lam, dones=None, last_value=None):
    """Generalised advantage estimation by the backward recursion.

        δ_t = r_t + γ·(1 − d_t)·V_next(t) − V_t
        A_t = δ_t + γλ·(1 − d_t)·A_next(t),        returns_t = A_t + V_t

    where next(t) is the next *valid* step of the same row and V_next(t) its value; after the last
    valid step V_next = last_value (0 by default) and A_next = 0.

    Reference: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438, eq. (16).
    Note: masked steps are skipped, not zeroed: the value and the running advantage are carried
    across them and γ is applied once per valid step (verl's multi-turn convention), so a masked
    tool-output span neither bootstraps from padding nor decays the advantage. `dones[t] = 1`
    means the episode ends after valid step t: no bootstrap, and the recursion restarts.
    dones at masked steps are ignored.

    Worked example (γ = λ = 1, one row, mask [1, 0, 1]): r = [0, 9, 1], V = [0.5, 9, 0.2]
    gives δ = [0 + 0.2 − 0.5, ·, 1 + 0 − 0.2] = [−0.3, ·, 0.8], A = [0.5, 0, 0.8].

    Args:
      rewards: [B, T] float (or [T]). Per-step reward.
      values: [B, T] float. Critic values V(s_t).
      mask: [B, T] bool or 0/1, or None (all valid). 1 = the step is part of the trajectory.
      gamma: float in [0, 1]. Discount.
      lam: float in [0, 1]. GAE λ (0: one-step TD error, 1: Monte-Carlo return minus V).
      dones: [B, T] bool or 0/1, or None. 1 = the episode terminates after this step.
      last_value: [B] float, or None (0). Value bootstrapped after the last valid step.

    Returns:
      (advantages, returns): each [B, T] float64, exactly 0 at masked positions.
    """
    r, v, m, d, lv, gamma, lam, squeeze = _gae_inputs(rewards, values, mask, gamma, lam, dones,
                                                      last_value)
    B, T = r.shape
    adv = np.zeros((B, T))
    next_value = lv.copy()        # V of the next valid step (bootstrap after the last one)
    lastgaelam = np.zeros(B)      # A of the next valid step
    for t in reversed(range(T)):
        valid = m[:, t]
        cont = 1.0 - d[:, t]
        delta = r[:, t] + gamma * cont * next_value - v[:, t]
        a_t = delta + gamma * lam * cont * lastgaelam
        lastgaelam = np.where(valid, a_t, lastgaelam)
        next_value = np.where(valid, v[:, t], next_value)
        adv[:, t] = np.where(valid, a_t, 0.0)
    ret = np.where(m, adv + v, 0.0)
    if squeeze:
        return adv[0], ret[0]
    return adv, ret


def gae_vjp(g, rewards, values, mask=None, *, gamma, lam, dones=None, last_value=None):
    """VJP of `gae`: the gradients of ⟨g_A, A⟩ + ⟨g_R, returns⟩ wrt rewards and values.

    Gradient:
      Write c_t = γλ(1 − d_t) and let prev(s) be the previous valid step of s's row. Unrolling
      A_t = δ_t + c_t·A_next(t) gives A_t = Σ_{s ≥ t} (Π_{k=t}^{prev(s)} c_k)·δ_s over the valid
      chain. Transposing that lower-triangular map turns the backward recursion into a forward
      one. With ĝ_t = g_A,t + g_R,t (returns = A + V, so the A-part of g_R joins g_A):

          u_s = ĝ_s + c_prev(s)·u_prev(s)           (u = ∂L/∂δ, first valid step: u = ĝ)

      δ_s = r_s + γ(1 − d_s)·V_next(s) − V_s is linear in r and V:
          ∂L/∂r_s = u_s
          ∂L/∂V_s = −u_s + g_R,s + γ(1 − d_prev(s))·u_prev(s)
      the last term because V_s is the bootstrap value of its previous valid step; the g_R,s
      term is the direct path returns_s = A_s + V_s. Masked positions get exactly 0.

      Check (T = 2, all valid, no dones): A_0 = δ_0 + γλδ_1, A_1 = δ_1, δ_0 = r_0 + γV_1 − V_0,
      δ_1 = r_1 − V_1. With g_A = [1, 0], g_R = 0: u = [1, γλ], ∂r = [1, γλ],
      ∂V = [−1, −γλ + γ] — the same as differentiating A_0 directly.

    Args:
      g: (g_advantages, g_returns), each shaped like the outputs.
      rewards, values, mask, gamma, lam, dones, last_value: as for `gae`.

    Returns:
      {"rewards": [B, T], "values": [B, T]} float64.
    """
    r, v, m, d, lv, gamma, lam, squeeze = _gae_inputs(rewards, values, mask, gamma, lam, dones,
                                                      last_value)
    if not isinstance(g, (tuple, list)) or len(g) != 2:
        raise TypeError("g must be a pair (g_advantages, g_returns) shaped like gae's outputs")
    out = OPS.spec("rewards", r[0] if squeeze else r)
    g_adv = args.cotangent(OPS, g[0], "g[0]", out)
    g_ret = args.cotangent(OPS, g[1], "g[1]", out)
    if squeeze:
        g_adv, g_ret = g_adv[None], g_ret[None]
    g_hat = np.where(m, g_adv + g_ret, 0.0)
    g_ret = np.where(m, g_ret, 0.0)
    B, T = r.shape
    u = np.zeros((B, T))
    dv = np.zeros((B, T))
    carry_u = np.zeros(B)   # c_prev · u_prev
    carry_v = np.zeros(B)   # γ(1 − d_prev) · u_prev
    for t in range(T):
        valid = m[:, t]
        u_t = g_hat[:, t] + carry_u
        u[:, t] = np.where(valid, u_t, 0.0)
        dv[:, t] = np.where(valid, -u_t + g_ret[:, t] + carry_v, 0.0)
        cont = 1.0 - d[:, t]
        carry_u = np.where(valid, gamma * lam * cont * u_t, carry_u)
        carry_v = np.where(valid, gamma * cont * u_t, carry_v)
    if squeeze:
        return {"rewards": u[0], "values": dv[0]}
    return {"rewards": u, "values": dv}


# ====================================================================== discounted returns
def _returns_inputs(rewards, mask, gamma):
    a = args.discounted_returns(OPS, rewards, mask, gamma)
    (r, m), squeeze = ar.as_2d(ar.zero_masked(a.rewards, a.mask), a.mask)
    return r, m, a.gamma, squeeze


def discounted_returns(rewards, mask=None, *, gamma):
    """Discounted reward-to-go, the REINFORCE++ return.

        G_t = r_t + γ·G_next(t),    G after the last valid step = 0

    Reference: Hu, REINFORCE++, arXiv:2501.03262, §3 (verl `reinforce_plus_plus`).
    Note: masked steps are skipped (G is carried across them), as in `gae`; for right-padded
    rows this equals verl's reset after EOS. It is `gae` with V ≡ 0 and λ = 1.

    Worked example (γ = 0.5): r = [1, 0, 2] → G = [1 + 0.5·(0 + 0.5·2), 0 + 0.5·2, 2] = [1.5, 1, 2].

    Args:
      rewards: [B, T] float (or [T]).
      mask: [B, T] bool or 0/1, or None.
      gamma: float in [0, 1].

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    r, m, gamma, squeeze = _returns_inputs(rewards, mask, gamma)
    G = np.zeros_like(r)
    running = np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        running = np.where(m[:, t], r[:, t] + gamma * running, running)
        G[:, t] = np.where(m[:, t], running, 0.0)
    return G[0] if squeeze else G


def discounted_returns_vjp(g, rewards, mask=None, *, gamma):
    """VJP of `discounted_returns` wrt rewards.

    Gradient:
      G_t = Σ_{s ≥ t} γ^(k(s) − k(t))·r_s over the valid chain (k = index among valid steps),
      so ∂L/∂r_s = Σ_{t ≤ s} γ^(k(s) − k(t))·g_t: the transposed map runs forwards,
          u_s = g_s + γ·u_prev(s).
      Check: T = 2, g = [1, 0]: ∂G_0/∂r = [1, γ].

    Returns:
      {"rewards": [B, T]} float64.
    """
    r, m, gamma, squeeze = _returns_inputs(rewards, mask, gamma)
    gm = args.cotangent(OPS, g, "g", OPS.spec("rewards", r[0] if squeeze else r))
    gm = np.where(m, gm[None] if squeeze else gm, 0.0)
    u = np.zeros_like(r)
    carry = np.zeros(r.shape[0])
    for t in range(r.shape[1]):
        u_t = gm[:, t] + gamma * carry
        u[:, t] = np.where(m[:, t], u_t, 0.0)
        carry = np.where(m[:, t], u_t, carry)
    return {"rewards": u[0] if squeeze else u}


# ====================================================================== whitening
def _whiten_inputs(x, mask, ddof, eps, eps_mode, shift_mean, restore_mean):
    a = args.whiten(OPS, x, mask, ddof, eps, eps_mode, shift_mean, restore_mean)
    return ar.zero_masked(a.x, a.mask), a.mask, a.ddof, a.eps, a.eps_mode


def _whiten_stats(xs, m, ddof, eps, eps_mode):
    """The statistics of `whiten` in units of 2^e, the power of two just above max |x|.

    Whitening is scale-invariant, and so is this: x' = x·2^−e is exact, |x'| < 1, so Σ x'² and
    every deviation stay far from overflow (and from underflow, relative to the largest) at any
    magnitude of x, where (x − μ)² of values near 1e154 would overflow and values near 1e−160
    would underflow to a zero spread. eps moves with the units: s' = s·2^−e is
    sqrt(var' + eps·2^−2e), sqrt(max(var', eps·2^−2e)) or sqrt(var') + eps·2^−e, exact
    rescalings of the unscaled formulas; for data far smaller than sqrt(eps), eps·2^−2e may
    overflow, and s' is then sqrt(eps)·2^−e (var' < 8 is below its rounding). For ordinary x
    every step is the unscaled one times a power of two, so the result is bit for bit the same.
    xs may carry leading axes beyond the mask's (many points at once: ref_numpy.many); the
    statistics are taken over the mask's axes, per leading index.
    Returns N, μ', the deviations x' − μ' (0 where masked), var', s', e (the last four with
    the mask's axes kept, of size 1).
    """
    axes = tuple(range(-m.ndim, 0))
    N = m.sum()
    e = np.frexp(np.max(np.abs(xs), axis=axes, keepdims=True, initial=0.0))[1]
    xs = np.ldexp(xs, -e)
    mu = xs.sum(axis=axes, keepdims=True) / N
    dev = np.where(m, xs - mu, 0.0)
    var = (dev ** 2).sum(axis=axes, keepdims=True) / (N - ddof)
    with np.errstate(over="ignore"):
        if eps_mode == "var":
            s = np.sqrt(var + np.ldexp(eps, -2 * e))
        elif eps_mode == "clamp":
            s = np.sqrt(np.maximum(var, np.ldexp(eps, -2 * e)))
        else:
            s = np.sqrt(var) + np.ldexp(eps, -e)
        if eps_mode != "std":
            s = np.where(np.isinf(s), np.ldexp(np.sqrt(eps), -e), s)
    args.whiten_scale(bool(np.any(s == 0.0)) and eps == 0.0, int(N))
    return N, mu, dev, var, s, e


def whiten(x, mask=None, *, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True,
           restore_mean=False):
    """Masked whitening over all valid entries of the batch.

        μ = Σ m·x / N,   var = Σ m·(x − μ)² / (N − ddof),   N = Σ m
        y = (x − μ) / s  (shift_mean=True)   or   y = x / s  (shift_mean=False)
        y = (x − μ) / s + μ   (shift_mean=False, restore_mean=True)
        s = sqrt(var + eps) ("var"), sqrt(max(var, eps)) ("clamp"), sqrt(var) + eps ("std")

    Reference: the advantage normalisation of PPO implementations (e.g. verl `masked_whiten`,
    OpenRLHF, MiniMind `train_ppo.py`, CleanRL `norm_adv`).
    Note: `shift_mean=False` means two things in trainers. Alone it scales by the centred spread
    without centring and adds nothing back. With `restore_mean=True` it is verl's and TRL's
    `masked_whiten(shift_mean=False)`: the centred values are scaled and the mean re-added.
    Library defaults differ (np.std ddof=0, torch.std ddof=1); here ddof is always explicit.

    Worked example: x = [1, 2, 3], ddof=0, eps=0: μ = 2, var = 2/3, y = [−1.2247, 0, 1.2247].

    Args:
      x: [B, T] float (or [T]). Values to whiten (usually advantages).
      mask: [B, T] bool or 0/1, or None. Statistics use valid entries only.
      ddof: 0 (divide by N) or 1 (N − 1).
      eps: float ≥ 0, placed as `eps_mode` says.
      eps_mode: "var" | "clamp" | "std".
      shift_mean: bool. Centre (True) or only scale (False).
      restore_mean: bool. With shift_mean=False: scale the centred values, re-add the mean.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    xs, m, ddof, eps, eps_mode = _whiten_inputs(x, mask, ddof, eps, eps_mode, shift_mean,
                                                restore_mean)
    if xs.size == 0:
        return np.zeros(xs.shape)
    return _whiten_values(xs, m, ddof, eps, eps_mode, shift_mean, restore_mean)


def _whiten_values(xs, m, ddof, eps, eps_mode, shift_mean, restore_mean):
    """`whiten` of validated inputs (xs zero at masked positions; leading axes allowed)."""
    N, mu, dev, var, s, e = _whiten_stats(xs, m, ddof, eps, eps_mode)
    with np.errstate(invalid="ignore"):
        if restore_mean:
            # y = dev/s + μ: the first part is scale-free, μ is back in the data's units
            return np.where(m, _ratio(dev, s) + np.ldexp(mu, e), 0.0)
        num = dev if shift_mean else np.ldexp(xs, -e)
        return np.where(m, _ratio(num, s), 0.0)


def _ratio(num, s):
    """num/s, and 0 where s = 0: with eps > 0 a zero s' means every deviation is exactly 0
    (var' underflows only for deviations below 1e−162 of max |x'| ≥ ½, which the rounding of
    μ' cannot leave) and the true quotient is 0/sqrt(eps)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s > 0, num / s, 0.0)


def whiten_vjp(g, x, mask=None, *, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True,
               restore_mean=False):
    """VJP of `whiten`.

    Gradient:
      y_j = n_j / s with n_j = x_j − μ (or x_j), s = f(var), var = Σ_k (x_k − μ)² / (N − ddof).
      Two facts: ∂μ/∂x_i = 1/N, and ∂var/∂x_i = 2(x_i − μ)/(N − ddof) (the μ-path term
      −2/(N−ddof)·Σ_k (x_k − μ)/N vanishes because the deviations sum to 0). Then

          ∂L/∂x_i = (g_i − ḡ)/s  [ḡ = Σ g / N; just g_i/s when shift_mean=False]
                    − (Σ_j g_j n_j / s²) · f'(var) · 2(x_i − μ)/(N − ddof)

      f'(var) = 1/(2s) for "var"; 1/(2s) if var ≥ eps else 0 for "clamp" (at var = eps the
      clamp passes the gradient, as torch.clamp does); 1/(2·sqrt(var)) for "std" (taken as 0
      when var = 0, where every deviation is 0 and the term vanishes anyway).
      restore_mean: y_j = n_j/s + μ with n_j = x_j − μ: the first two terms as for shift_mean,
      plus the direct path of μ, ∂/∂x_i Σ_j g_j·μ = ḡ.
      Scale: computed in units of 2^e (`_whiten_stats`): with x' = x·2^−e, s' = s·2^−e and
      n' = n·2^−e the two terms above are 2^−e times the same expressions in primed
      quantities (every power of 2 cancels but one), and f'(var) becomes f'(var') with eps·2^−2e.
      Masked positions get 0.

    Returns:
      {"x": [B, T]} float64.
    """
    xs, m, ddof, eps, eps_mode = _whiten_inputs(x, mask, ddof, eps, eps_mode, shift_mean,
                                                restore_mean)
    if xs.size == 0:
        args.cotangent(OPS, g, "g", OPS.spec("x", xs))
        return {"x": np.zeros(xs.shape)}
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("x", xs)), m)
    return {"x": _whiten_vjp_values(gm, xs, m, ddof, eps, eps_mode, shift_mean, restore_mean)}


def _whiten_vjp_values(gm, xs, m, ddof, eps, eps_mode, shift_mean, restore_mean):
    """`whiten_vjp` of validated inputs; gm (0 where masked) may carry leading axes: many
    cotangents at once (ref_numpy.many), the rows of a Jacobian."""
    N, mu, dev, var, s, e = _whiten_stats(xs, m, ddof, eps, eps_mode)
    axes = tuple(range(-m.ndim, 0))
    centred = shift_mean or restore_mean
    g_bar = gm.sum(axis=axes, keepdims=True) / N
    base = gm - m * g_bar if centred else gm
    if s == 0.0:
        # eps > 0 and every deviation exactly 0, with eps·2^−2e below the smallest float (`_ratio`):
        # "var" and "clamp" only (in "std" mode s ≥ eps·2^−e > 0); y = base/s_true with
        # s_true = sqrt(eps), and the spread term vanishes with the deviations
        gx = base / np.sqrt(eps)
    else:
        # in units of 2^e (`_whiten_stats`): x' = x·2^−e, so ∂/∂x = 2^−e·∂/∂x'
        num = dev if centred else np.ldexp(xs, -e)
        gx = base / s
        if eps_mode == "var":
            ds = 1.0 / (2.0 * s)
        elif eps_mode == "clamp":
            ds = 1.0 / (2.0 * s) if var >= np.ldexp(eps, -2 * e) else 0.0
        else:
            ds = 1.0 / (2.0 * np.sqrt(var)) if var > 0 else 0.0
        if ds:          # the spread term; none where the std does not move (ds = 0)
            with np.errstate(over="ignore"):  # ∂y/∂x ~ 1/|x|: beyond float64 for x below 1e−308
                gx = gx - (gm * num).sum(axis=axes, keepdims=True) / s ** 2 * ds * 2.0 * \
                    dev / (N - ddof)
        gx = np.ldexp(gx, -e)
    if restore_mean:
        gx = gx + m * g_bar
    return np.where(m, gx, 0.0)


# ====================================================================== group advantages
def group_codes(B, group_size, group_ids):
    """Each of B rows' group as a code 0..G−1: consecutive blocks of group_size, or the rank of
    its id among the distinct group_ids (validated by the caller)."""
    if group_size is not None:
        return np.arange(B) // group_size
    return np.unique(np.asarray(group_ids), return_inverse=True)[1].reshape(-1)


def _group_inputs(rewards, group_size, group_ids, ddof, eps, scale, baseline, valid, singleton):
    a = args.group_advantages(OPS, rewards, group_size, group_ids, ddof, eps, scale, baseline,
                              valid, singleton)
    r, keep = a.rewards, a.keep
    gid = group_codes(r.shape[0], a.group_size, a.group_ids)
    _, gid_kept = np.unique(gid[keep], return_inverse=True)     # groups of the kept rows only
    return (np.where(keep, r, 0.0), keep, gid_kept.reshape(-1), a.ddof, a.eps, a.scale,
            a.baseline, a.singleton)


def _group_units(r, gid, scale):
    """e per row: the rows' rewards are taken in units of 2^e, the power of two above the
    largest |r| of the rows that share a statistic (its group; the batch for scale="batch"),
    so that no square or sum overflows or underflows."""
    if scale == "batch":
        return np.full(r.shape, np.frexp(np.max(np.abs(r), initial=0.0))[1])
    peak = np.zeros(int(gid.max(initial=-1)) + 1)
    np.maximum.at(peak, gid, np.abs(r))
    return np.frexp(peak)[1][gid]


def _group_parts(r, gid, ddof, eps, scale, baseline, singleton):
    """Centred rewards c, the scale denominator D per row, and what the VJP needs, all in
    each row's units of 2^e (`_group_units`): A = c/D is the same in any units, and A = c (no
    scaling) is c/D with D = 2^−e. Rescaling by powers of two is exact, so ordinary rewards
    give the unscaled results bit for bit. Returns those and e."""
    counts = np.bincount(gid).astype(np.float64)
    n = counts[gid]
    multi = n >= 2
    if singleton == "error":
        args.singleton_group(int(np.argmax(~multi)) if (~multi).any() else None)
    e = _group_units(r, gid, scale)
    r = np.ldexp(r, -e)
    with np.errstate(over="ignore"):     # eps far above tiny rewards: A below 2/max float
        eps = np.ldexp(eps, -e)
        unit = np.ldexp(1.0, -e)         # 1 in the row's units
    single = ~multi & (singleton == "keep")      # alone in its group: baseline 0, spread 1
    mu = (np.bincount(gid, weights=r) / counts)[gid]
    k = np.ones_like(r) if baseline == "mean" else np.where(multi, n / np.maximum(n - 1, 1), 0)
    # leave-one-out: r_i − (S − r_i)/(n − 1) = n/(n − 1)·(r_i − μ): a rescaled mean baseline
    c = np.where(multi, k * (r - mu), np.where(single, r, 0.0))
    sigma = None
    if scale == "group":
        ss = np.bincount(gid, weights=(r - mu) ** 2)
        denom = np.maximum(counts - ddof, 1.0)
        sigma = np.where(single, unit, np.sqrt(ss / denom)[gid])
        D = sigma + eps
    elif scale == "batch":
        B = r.shape[0]
        mu_b = r.mean()
        sigma = np.sqrt(((r - mu_b) ** 2).sum() / max(B - ddof, 1))
        D = sigma + eps
    elif scale == "leave_one_out":
        # the others' spread Σ_{j≠i}(r_j − μ_i)², μ_i the others' mean, summed directly group by
        # group (a shortcut through the whole group's sum of squares cancels when the others
        # are nearly equal and r_i is not)
        ss = np.zeros_like(r)
        for g in np.unique(gid):
            rows = np.flatnonzero(gid == g)
            rr = r[rows]
            if rows.size < 2:
                continue
            self_ = np.eye(rows.size, dtype=bool)
            # the others' mean summed directly: (Σr − r_i) cancels when r_i dominates the group
            mu_others = np.where(self_, 0.0, rr[None, :]).sum(axis=1) / (rows.size - 1)
            dev = np.where(self_, 0.0, rr[None, :] - mu_others[:, None])
            ss[rows] = (dev ** 2).sum(axis=1)
        dof = n - 1 - ddof
        sigma = np.where(multi & (dof > 0), np.sqrt(np.maximum(ss, 0.0) / np.maximum(dof, 1)), 0.0)
        D = np.where(sigma > 0, sigma + eps, unit)    # NeMo: no scaling where the spread is 0
    elif scale == "mean":
        below = multi & (mu < 0)                      # MaxRL's pass rate: refused below 0
        args.negative_group_mean(float(np.ldexp(mu, e)[below][0]) if below.any() else None)
        D = np.where(single, unit, mu + eps)          # MaxRL: a group of one is not scaled
    else:
        D = unit
    zero = multi & (D == 0.0)
    args.group_spread(int(np.argmax(zero)) if zero.any() else None, scale)
    active = multi | single          # the rows that get an advantage
    D = np.where(active, D, 1.0)     # singletons with A = 0: keep 0/0 out of the arithmetic
    return counts, n, multi, single, mu, k, c, sigma, D, e, r


def group_advantages(rewards, *, group_size=None, group_ids=None, ddof=0, eps=1e-4,
                     scale="group", baseline="mean", valid=None, singleton="zero"):
    """Group-relative advantages (GRPO, Dr. GRPO, RLOO, MaxRL).

        A_i = (r_i − b_i) / (σ + eps)

    b_i = mean of i's group ("mean") or of the others in it ("leave_one_out", RLOO);
    σ = std of i's group ("group"), of the whole batch ("batch"), of the *others* in i's group
    ("leave_one_out", NeMo: with the leave-one-out baseline only, and no scaling — not even
    eps — where that spread is 0), the group's *mean* ("mean", MaxRL: A = (r − μ)/(μ + eps), for
    0/1 rewards μ is the pass rate and the advantage weighs a prompt by 1/pass rate), or no
    scaling ("none": A = r − b).

    Reference: Shao et al., DeepSeekMath (GRPO), arXiv:2402.03300, §4.1.2; Liu et al.,
    Dr. GRPO, arXiv:2503.20783; Ahmadian et al., RLOO, arXiv:2402.14740; Tajwar et al.,
    Maximum Likelihood RL (MaxRL), arXiv:2602.02710 (SkyRL `compute_maxrl_advantage`).
    Note: a group of one has no baseline. `singleton="zero"` gives it A = 0 (TRL, MiniMind,
    verl's `rloo_vectorized`); `"keep"` takes its baseline as 0 and its own spread as 1, so
    A = r/(1 + eps) under "group" scale and r under "none" and "mean" (verl's `grpo` and
    `rloo`, SkyRL's `maxrl`);
    `"error"` refuses it (OpenRLHF asserts groups of at least 2). MaxRL ("mean") is defined
    for rewards in [0, 1], whose group mean is a pass rate: a group whose mean is below 0 is
    refused (ValueError naming the mean), since dividing by it flips the sign of every
    advantage in the group (the better response would be pushed down); SkyRL's
    `compute_maxrl_advantage` computes it regardless. With "leave_one_out" baseline
    and "group" scale, σ is the std of the whole group. eps is added to the std (σ + eps), as
    all of verl, TRL, OpenRLHF, MiniMind do.

    Worked example: rewards [1, 0, 0, 0], group_size 4, ddof 0: μ = 0.25, σ = 0.4330,
    A_0 = 0.75 / 0.4331 = 1.7317 (with ddof=1, σ = 0.5 and A_0 = 1.4997).

    Args:
      rewards: [B] float. One scalar reward per sequence.
      group_size: int dividing B: groups are consecutive blocks. Or:
      group_ids: [B] int: rows with equal ids form a group, in any order.
      ddof: 0 or 1, for the std.
      eps: float ≥ 0.
      scale: "group" | "batch" | "leave_one_out" | "mean" | "none".
      baseline: "mean" | "leave_one_out".
      valid: [B] bool or 0/1, or None. Rows with valid = 0 (unscorable, or a response with no
        tokens) leave the group statistics, may hold NaN, and get A = 0 (TRL; the OpenRLHF #1239
        bug kept them in the baseline).
      singleton: "zero" | "keep" | "error", for a group of one (see the Note).

    Returns:
      [B] float64.
    """
    r, keep, gid, ddof, eps, scale, baseline, singleton = _group_inputs(
        rewards, group_size, group_ids, ddof, eps, scale, baseline, valid, singleton)
    _, _, multi, single, _, _, c, _, D, _, _ = _group_parts(r[keep], gid, ddof, eps, scale,
                                                             baseline, singleton)
    out = np.zeros(r.shape)
    out[keep] = np.where(multi | single, c / D, 0.0)
    return out


def group_advantages_vjp(g, rewards, *, group_size=None, group_ids=None, ddof=0, eps=1e-4,
                         scale="group", baseline="mean", valid=None, singleton="zero"):
    """VJP of `group_advantages`.

    Gradient:
      For a group of n ≥ 2, c_i = k·(r_i − μ) with k = 1 (mean) or n/(n−1) (leave-one-out,
      since r_i − (S − r_i)/(n − 1) = n/(n−1)·(r_i − μ)). A_i = c_i / D_i with D = σ + eps.

      1. Through c: ∂c_j/∂r_i = k(δ_ij − 1/n), so with h_j = g_j / D_j,
            ∂L/∂r_i ⊇ k·(h_i − mean_group(h))            (zero-sum within each group).
      2. Through σ ("group": per group; "batch": one σ for all rows):
            ∂L/∂σ = −Σ_j g_j c_j / D_j²   (summed over the rows that σ scales)
            ∂σ/∂r_i = (r_i − μ_σ) / ((n_σ − ddof)·σ)   (0 when σ = 0, where Σ g_j c_j = 0)
         with μ_σ, n_σ the mean and count σ is taken over. Singletons have c = 0 and no path 1,
         but in "batch" scale their reward still moves σ and so gets path 2.
      3. singleton="keep": a group of one has c = r and, under "group" scale, σ = 1 (constant),
         so path 1 is ∂A/∂r = 1/D; under "batch" scale it also moves σ (path 2, with c = r).

      "mean" scale: D = μ + eps for a group of n ≥ 2 (μ its mean; a kept singleton has D = 1),
         ∂L/∂D = −Σ_j g_j c_j / D_j² over the group and ∂D/∂r_i = 1/n, so
            ∂L/∂r_i ⊇ −(1/n)·Σ_{j in i's group} g_j c_j / D_j²       (path 2 with ∂μ/∂r_i = 1/n).
         Check (n = 2, eps 0, r = [1, 0]): μ = 1/2, A = [1, −1]; moving r_0 by δ gives
         A_0 = (1 + δ − μ')/μ' with μ' = (1 + δ)/2, so A_0 = 1 for every δ: ∂A_0/∂r_0 = 0.
         Path 1: (1 − 1/2)/(1/2) = 1; path 2: −(1/2)·c_0/D² = −(1/2)·(1/2)/(1/4) = −1. They cancel.

      Check (n = 2, r_0 > r_1, mean, ddof 0, eps 0): A = [+1, −1] whatever r is, so the
      gradient must be 0. Here c = [σ, −σ]; path 1 gives ∂r_0 = (g_0 − g_1)/(2σ); path 2 gives
      −σ(g_0 − g_1)/σ² · σ/(2σ) = −(g_0 − g_1)/(2σ). They cancel.

      "leave_one_out" scale: A_i = c_i/D_i with c_i = r_i − μ_i, μ_i and σ_i the mean and std of
      the m = n − 1 others O_i, D_i = σ_i + eps (1 where σ_i = 0). r_i enters A_i only through
      c_i (∂ = 1/D_i); r_k, k ∈ O_i, enters through μ_i (∂c_i/∂r_k = −1/m) and σ_i
      (∂σ_i/∂r_k = (r_k − μ_i)/((m − ddof)σ_i)). With e_i = g_i/(m·D_i) and
      h_i = g_i·c_i/(D_i²·(m − ddof)·σ_i) (0 where σ_i = 0), summing over i ≠ k in the group:
          ∂L/∂r_k = g_k/D_k − Σ_{i≠k} e_i − r_k·Σ_{i≠k} h_i + Σ_{i≠k} h_i·μ_i
      Rows with valid = 0 get 0.

    Returns:
      {"rewards": [B]} float64.
    """
    r_all, keep, gid, ddof, eps, scale, baseline, singleton = _group_inputs(
        rewards, group_size, group_ids, ddof, eps, scale, baseline, valid, singleton)
    gs = OPS.spec("g", g)
    checks.require_float(gs)
    checks.require_sequence(gs, r_all.shape[0])
    out = np.zeros(r_all.shape)
    out[keep] = _group_vjp_kept(OPS.floats(g)[keep], r_all[keep], gid, ddof,
                                eps, scale, baseline, singleton)
    return {"rewards": out}


def _group_vjp_kept(g, r, gid, ddof, eps, scale, baseline, singleton):
    counts, n, multi, single, mu, k, c, sigma, D, e, r = _group_parts(r, gid, ddof, eps, scale,
                                                                      baseline, singleton)
    with np.errstate(over="ignore"):     # ∂A/∂r ~ 1/|r|: beyond float64 below 1e−308
        return np.ldexp(_group_vjp_units(g, r, gid, ddof, counts, n, multi, single, mu, k, c,
                                         sigma, D, scale), -e)


def _group_vjp_units(g, r, gid, ddof, counts, n, multi, single, mu, k, c, sigma, D, scale):
    """∂L/∂r' in the rows' units r' = r·2^−e (A is the same function of r'); ∂L/∂r is
    2^−e times it."""
    g = np.where(multi | single, g, 0.0)
    if scale == "leave_one_out":
        m = np.maximum(n - 1, 1)
        mu_i = (np.bincount(gid, weights=r)[gid] - r) / m
        e = g / (m * D)
        pos = sigma > 0
        h = np.where(pos, g * c / (D ** 2 * np.maximum(n - 1 - ddof, 1) * np.where(pos, sigma, 1)),
                     0.0)
        group_sum = lambda x: np.bincount(gid, weights=x)[gid]   # noqa: E731
        grad = g / D - (group_sum(e) - e) - r * (group_sum(h) - h) + (group_sum(h * mu_i) - h * mu_i)
        return np.where(multi | single, grad, 0.0)
    h = g / D
    h_mean = (np.bincount(gid, weights=h) / counts)[gid]
    grad = np.where(multi, k * (h - h_mean), np.where(single, h, 0.0))
    if scale == "mean":
        w = np.where(multi, -g * c / D ** 2, 0.0)             # ∂L/∂D per row; D = μ + eps
        return grad + np.where(multi, np.bincount(gid, weights=w)[gid] / counts[gid], 0.0)
    if scale != "none":
        w = -g * c / D ** 2                                   # ∂L/∂σ contributions per row
        if scale == "group":
            g_sigma = np.bincount(gid, weights=w)[gid]
            n_sigma = counts[gid] - ddof
            centred = r - mu
        else:
            g_sigma = w.sum()
            n_sigma = r.shape[0] - ddof
            centred = r - r.mean()
        safe = np.where(sigma > 0, sigma, 1.0)
        dsigma = np.where(sigma > 0, centred / (np.maximum(n_sigma, 1) * safe), 0.0)
        grad = grad + g_sigma * dsigma
    return grad
