"""Advantage estimators in torch (autograd gives the gradients).

Written from the equations, independently of ref_numpy: GAE as a log-depth affine scan (with a
blocked matmul kernel, `gae_blocked`, for the common case of no episode ending inside a row);
group statistics through a membership matrix.
"""
import math

import torch

from ref_common import args

from . import _tensors as tt
from . import gae_blocked
from ._tensors import OPS
from .scan import reverse_affine_scan


def gae(rewards, values, mask=None, *, gamma, lam, dones=None, last_value=None):
    """Generalised advantage estimation (GAE), arXiv:1506.02438 eq. (16).

        A_t = Σ_{l ≥ 0} (Π_{j < l} γλ(1 − d_{t_j})) · δ_{t_l}  over the valid steps t = t_0 < t_1 < …
        δ_t = r_t + γ(1 − d_t)·V(next valid step, or last_value) − V_t;   returns = A + V

    Masked steps are skipped (value and advantage carried across them); see ref_numpy.gae for
    the conventions. No Python loop over T: the definition is a reverse affine scan in
    ⌈log2 T⌉ doubling steps (`_gae_scan`). With no done before a row's last valid step (the LLM
    case), the blocked kernel in `gae_blocked` computes the same values with 32×32 matmuls.

    float16 and bfloat16 inputs are computed in float32 and rounded once at the end: a sum
    over hundreds of discounted terms kept in 8 or 11 bits would lose most of them.

    Args/Returns: as ref_numpy.gae, with tensors; any float dtype and device.
    """
    a = args.gae(OPS, rewards, values, mask, gamma, lam, dones, last_value, check_finite=False)
    r, v, m, gamma, lam = a.rewards, a.values, a.mask, a.gamma, a.lam
    d = None if a.dones is None else a.dones.to(r.dtype)
    lv = (torch.zeros(tuple(r.shape[:-1]), dtype=r.dtype, device=r.device)
          if a.last_value is None else a.last_value.to(r.dtype))
    squeeze = r.dim() == 1
    if squeeze:
        r, v, m, lv = r[None], v[None], m[None], lv[None]
        d = None if d is None else d[None]
    out_dtype = r.dtype
    if out_dtype in (torch.float16, torch.bfloat16):    # long discounted sums lose too much in
        r, v, lv = r.float(), v.float(), lv.float()     # 8 or 11 bits: accumulate in float32,
        d = None if d is None else d.float()           # round once at the end
    adv, ret = _gae_2d(r, v, m, d, lv, gamma, lam)
    adv, ret = adv.to(out_dtype), ret.to(out_dtype)
    return (adv[0], ret[0]) if squeeze else (adv, ret)


def _gae_2d(r, v, m, d, lv, gamma, lam):
    """gae on [B, T] inputs, already validated (but for finiteness)."""
    # A done at a row's last valid step only drops the bootstrap; anywhere else it breaks the
    # constant decay, and only the scan handles it.
    interior = False
    if d is not None:
        steps = torch.arange(r.shape[-1], device=r.device)
        last_index = torch.where(m, steps, torch.full_like(steps, -1)).max(-1).values
        last = steps == last_index[:, None]                 # each row's last valid step
        interior = bool((m & (d != 0) & ~last).any())
        lv = torch.where((d * last).sum(-1) > 0, torch.zeros_like(lv), lv)
    blocked = None if interior else gae_blocked.solve(r, v, m, lv, gamma, lam)
    if blocked is not None:
        adv, ret, check = blocked
        # Every valid r_t and V_t enters a term of check with a nonzero coefficient, and inf or
        # NaN plus anything is never finite, so check is finite iff every valid input is
        # (barring an overflow): the full finiteness scan runs only when it is not.
        if not bool(torch.isfinite(check)):
            _finite(r, v, m)
        return adv, ret
    _finite(r, v, m)
    return _gae_scan(r, v, m, d, lv, gamma, lam)


def _finite(r, v, m):
    args.finite(OPS, "rewards", r, m)
    args.finite(OPS, "values", v, m)


def _gae_scan(r, v, m, d, lv, gamma, lam):
    """The definition: A_t = δ_t + a_t·A_(t+1) with a_t = γλ(1 − d_t) at valid steps and 1 at
    masked ones (carry A across), solved by a reverse affine scan."""
    B, T = r.shape
    zero = tt.zero(r)
    if d is None:
        d = torch.zeros_like(r)
    r0, v0, d0 = torch.where(m, r, zero), torch.where(m, v, zero), torch.where(m, d, zero)

    # index of the first valid step strictly after t (T = none: bootstrap from last_value)
    steps = torch.arange(T, device=r.device).expand(B, T)
    pos = torch.where(m, steps, torch.full_like(steps, T))
    first_at_or_after = torch.flip(torch.cummin(torch.flip(pos, [-1]), dim=-1).values, [-1])
    nxt = torch.cat([first_at_or_after[:, 1:], torch.full((B, 1), T, device=r.device)], dim=-1)
    v_next = torch.gather(torch.cat([v0, lv[:, None]], dim=-1), 1, nxt)

    cont = 1.0 - d0
    delta = r0 + gamma * cont * v_next - v0
    a = torch.where(m, gamma * lam * cont, torch.ones_like(r0))   # masked step: carry A across
    adv = reverse_affine_scan(a, torch.where(m, delta, zero))
    adv = torch.where(m, adv, zero)
    ret = torch.where(m, adv + v0, zero)
    return adv, ret


def discounted_returns(rewards, mask=None, *, gamma):
    """Reward-to-go G_t = r_t + γ·G_(next valid step), masked steps skipped (REINFORCE++).

    One reverse affine scan (masked steps carry G unchanged). Args/Returns: as
    ref_numpy.discounted_returns, with tensors.
    """
    a = args.discounted_returns(OPS, rewards, mask, gamma)
    r, m = a.rewards, a.mask
    zero = tt.zero(r)
    decay = torch.where(m, torch.full_like(r, a.gamma), torch.ones_like(r))
    G = reverse_affine_scan(decay, torch.where(m, r, zero))
    return torch.where(m, G, zero)


def whiten(x, mask=None, *, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True,
           restore_mean=False):
    """Masked whitening: (x − μ)/s (or x/s, or (x − μ)/s + μ with restore_mean), μ and var over
    valid entries, var with N − ddof.

    s = sqrt(var + eps) | sqrt(max(var, eps)) | sqrt(var) + eps for eps_mode var | clamp | std.
    Args/Returns: as ref_numpy.whiten, with tensors.
    """
    a = args.whiten(OPS, x, mask, ddof, eps, eps_mode, shift_mean, restore_mean)
    x, m, n_valid, eps = a.x, a.mask, a.n_valid, a.eps
    if x.numel() == 0:
        return x * 0
    zero = tt.zero(x)
    xm = torch.where(m, x, zero)
    # Scale-invariant: whiten x·2^−e (exact, |·| < 1) so that no square overflows or
    # underflows at any magnitude; eps then sits at eps·2^−2e (var, clamp) or eps·2^−e (std)
    e = tt.binary_exponent(xm)
    xs = tt.times_power_of_two(xm, -e)
    mean = xs.sum() / n_valid
    centred = torch.where(m, xs - mean, zero)
    var = centred.pow(2).sum() / (n_valid - a.ddof)
    eps_units = tt.ldexp_or_inf(eps, -e if a.eps_mode == "std" else -2 * e)
    if a.eps_mode == "var":
        scale = torch.sqrt(var + eps_units)
    elif a.eps_mode == "clamp":
        scale = torch.sqrt(torch.clamp(var, min=eps_units))
    else:
        scale = tt.safe_sqrt(var) + eps_units
    if math.isinf(eps_units):
        # data far below sqrt(eps): var' is below the rounding of eps·2^−2e, s = sqrt(eps)
        # (std: y is below 8/max float and 0 is its value to float64's range)
        scale = torch.full_like(scale, math.inf if a.eps_mode == "std"
                                else tt.ldexp_or_inf(math.sqrt(eps), -e))
    args.whiten_scale(bool(scale == 0) and eps == 0, n_valid)
    if bool(scale == 0):
        # eps > 0 and every deviation exactly 0: y = 0/sqrt(eps) (or 0/eps) = 0, and its
        # gradient is the centring over the true scale
        true = eps if a.eps_mode == "std" else math.sqrt(eps)
        num = (centred if a.shift_mean or a.restore_mean else xs)
        out = tt.times_power_of_two(num, e) / true
    else:
        out = (centred if a.shift_mean or a.restore_mean else xs) / scale
    if a.restore_mean:
        out = out + tt.times_power_of_two(mean, e)
    return torch.where(m, out, zero)


def group_advantages(rewards, *, group_size=None, group_ids=None, ddof=0, eps=1e-4,
                     scale="group", baseline="mean", valid=None, singleton="zero"):
    """Group-relative advantages A_i = (r_i − b_i)/(σ + eps) (GRPO arXiv:2402.03300 §4.1.2).

    b_i: group mean, or the mean of the *other* members (leave_one_out, computed as
    (Σ_group r − r_i)/(n − 1)); σ: group std, batch std, the others' std (NeMo; no scaling
    where it is 0), the group mean (MaxRL, arXiv:2602.02710: (r − μ)/(μ + eps); a group mean
    below 0 is refused, it would flip the signs), or none. A group of one gets 0 ("zero"), its
    reward over (1 + eps) or
    unscaled ("keep": baseline 0, spread 1), or is refused ("error"); rows with valid = 0 leave
    the statistics and get 0. Args/Returns: as ref_numpy.group_advantages, with tensors.
    """
    a = args.group_advantages(OPS, rewards, group_size, group_ids, ddof, eps, scale, baseline,
                              valid, singleton)
    r, keep = a.rewards, a.keep
    ids = group_ids_of(r.shape[0], a.group_size, a.group_ids, r.device)
    out = torch.zeros_like(r)
    kept = _group_advantages_of(r[keep], ids[keep], a.ddof, a.eps, a.scale, a.baseline,
                                a.singleton)
    return out.masked_scatter(keep, kept)


def group_ids_of(B, group_size, group_ids, device):
    """Each row's group id: its block of group_size, or group_ids as given (validated)."""
    if group_size is not None:
        return torch.arange(B, device=device) // group_size
    return group_ids.to(device)


def _group_advantages_of(r, ids, ddof, eps, scale, baseline, singleton):
    B = r.shape[0]
    if B == 0:
        return r
    _, inverse = torch.unique(ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    member = (inverse[None, :] == torch.arange(n_groups, device=r.device)[:, None]).to(r.dtype)
    size_g = member.sum(dim=1)                      # [G]
    size = member.T @ size_g                        # [B]: size of each row's group
    multi = size >= 2
    # Scale-invariant: each row in units of 2^e, the power of two above the largest |r| of
    # the rows it shares a statistic with (the batch under scale="batch", else its group).
    # Exact; eps moves to eps·2^−e, a 1 to 2^−e.
    with torch.no_grad():
        if scale == "batch":
            e = torch.full_like(inverse, tt.binary_exponent(r))
        else:
            peak = torch.zeros(n_groups, dtype=r.dtype, device=r.device).scatter_reduce(
                0, inverse, r.abs(), reduce="amax")
            e = torch.frexp(peak)[1].to(inverse.dtype)[inverse]
    r = tt.times_power_of_two(r, -e)
    eps = tt.times_power_of_two(torch.full_like(r, eps), -e)
    unit = tt.times_power_of_two(torch.ones_like(r), -e)
    sum_g = member @ r
    mean = member.T @ (sum_g / size_g)
    if singleton == "error":
        args.singleton_group(int(torch.nonzero(~multi)[0]) if bool((~multi).any()) else None)
    alone = ~multi & (singleton == "keep")          # baseline 0 and spread 1
    if baseline == "mean":
        baseline_value = mean
    else:
        others = torch.where(multi, size - 1, torch.ones_like(size))
        baseline_value = (member.T @ sum_g - r) / others
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    centred = torch.where(multi, r - baseline_value, torch.where(alone, r, zero))
    if scale == "group":
        dof_g = torch.clamp(size_g - ddof, min=1)
        sigma = member.T @ tt.safe_sqrt(member @ (r - mean).pow(2) / dof_g)
        denom = torch.where(alone, unit, sigma) + eps
    elif scale == "batch":
        sigma = tt.safe_sqrt((r - r.mean()).pow(2).sum() / max(B - ddof, 1))
        denom = sigma + eps
    elif scale == "leave_one_out":
        # others[i, j] = 1 when j is in i's group and j ≠ i: the others' mean and spread directly
        others = member.T @ member - torch.eye(B, dtype=r.dtype, device=r.device)
        n_others = others.sum(dim=1)
        mean_others = (others @ r) / torch.clamp(n_others, min=1)
        spread = (others * (r[None, :] - mean_others[:, None]).pow(2)).sum(dim=1)
        dof = n_others - ddof
        var = torch.where(dof > 0, spread / torch.clamp(dof, min=1), torch.zeros_like(spread))
        sigma = tt.safe_sqrt(var)
        denom = torch.where(sigma > 0, sigma + eps, unit)
    elif scale == "mean":                           # MaxRL: over the group's mean reward
        below = multi & (mean < 0)                  # a pass rate: refused below 0
        args.negative_group_mean(
            float(tt.times_power_of_two(mean, e)[below][0]) if bool(below.any()) else None)
        denom = torch.where(alone, unit, mean + eps)
    else:
        denom = unit
    bad = multi & (denom == 0)
    args.group_spread(int(torch.nonzero(bad)[0]) if bool(bad.any()) else None, scale)
    active = multi | alone
    return torch.where(active, centred / torch.where(active, denom, torch.ones_like(denom)), zero)
