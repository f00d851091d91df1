"""Advantage estimators in torch (autograd gives the gradients).

Written from the equations, independently of ref_numpy: GAE as a blocked Toeplitz discounted
cumsum over each row's compacted valid steps (a log-depth affine scan when dones fall inside a
row); group statistics through a membership matrix.
"""
import functools

import torch

from ref_numpy import _checks

from . import _tensors as tt


def _reverse_affine_scan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Solve x_t = b_t + a_t·x_{t+1} (x_T = 0) along the last axis in ⌈log2 T⌉ doubling steps.

    Position t holds the composition of the affine maps f_t ∘ … ∘ f_{t+k−1} (f_s(y) = b_s + a_s·y)
    as (A, X): combining two adjacent windows gives X_t + A_t·X_{t+k} and A_t·A_{t+k}.
    """
    T = b.shape[-1]
    x, A, k = b, a, 1
    while k < T:
        x = x + A * torch.nn.functional.pad(x[..., k:], (0, k))
        A = A * torch.nn.functional.pad(A[..., k:], (0, k))
        k *= 2
    return x


BLOCK = 32      # time steps per block of the Toeplitz solve (one K×K matmul per block)
ROWS = 1 << 18  # elements per row-chunk of int64 compaction indices (small, reused blocks)


@functools.lru_cache(maxsize=64)
def _decay_matrix(q: float, dtype: torch.dtype, device: torch.device):
    """U[j, i] = q^(j − i) for j ≥ i (0 above), and tail[i] = q^(K − i), both K = BLOCK.

    Powers are formed in float64 and rounded once; every weight is ≤ 1, so nothing overflows
    (weights that underflow are below the dtype's resolution of the result anyway).
    """
    i = torch.arange(BLOCK, dtype=torch.float64, device=device)
    lag = i[:, None] - i[None, :]
    qq = torch.tensor(q, dtype=torch.float64, device=device)
    U = torch.where(lag >= 0, torch.pow(qq, lag.clamp(min=0)),
                    torch.zeros((), dtype=torch.float64, device=device))
    return U.to(dtype), torch.pow(qq, BLOCK - i).to(dtype)


def _discounted_reverse_cumsum(x: torch.Tensor, q: float) -> torch.Tensor:
    """y_t = Σ_{s ≥ t} q^(s − t)·x_s along the last axis of a 2-D x, without a loop over T.

    Blocks of K steps: inside a block y = x @ U (Toeplitz U[j, i] = q^(j − i), j ≥ i). The
    sum that enters block b from its right, S_(b+1), obeys S_b = y_(b,0) + q^K·S_(b+1): the
    same problem on the block heads with decay q^K, solved by recursion (depth log_K T).
    Each position then adds q^(K − i)·S_(b+1).
    """
    b, n = x.shape
    nb = -(-n // BLOCK)
    if nb * BLOCK != n:
        x = torch.nn.functional.pad(x, (0, nb * BLOCK - n))
    U, tail = _decay_matrix(q, x.dtype, x.device)
    local = (x.reshape(b * nb, BLOCK) @ U).view(b, nb, BLOCK)
    if nb > 1:
        after = _discounted_reverse_cumsum(local[:, 1:, 0], q ** BLOCK)   # S_(b+1), b < nb − 1
        local[:, :-1].addcmul_(after[..., None], tail)
    return local.view(b, nb * BLOCK)[:, :n]


def _index_chunks(pos):
    """(row slice, int64 positions) a few rows at a time: int64 indices never exist for the
    whole batch at once (they would double the peak memory), and are rebuilt when needed."""
    B, T = pos.shape
    chunk = max(1, ROWS // T)
    for i in range(0, B, chunk):
        rows = slice(i, i + chunk)
        yield rows, pos[rows].to(torch.int64)


def _gae_blocked(r, v, m, lv, gamma, lam):
    """GAE with a constant decay γλ per valid step (no done before a row's last valid step).

    Valid steps are compacted to the front of their row, so skipped masked steps vanish (rows
    already right-padded skip this); then δ_j = r_j − v_j + γ·v_(j+1), plus γ·last_value at
    each row's last valid step, and A is the discounted reverse cumsum of δ. Masked inputs are
    never read into the arithmetic (where/scatter drop them), so NaN there cannot leak.
    Returns (A, A + V, check): check = Σ δ. Every valid r_t and V_t enters δ_t with coefficient
    ±1, and inf or NaN plus anything is never finite, so check is finite iff every valid input
    is (barring an overflow): the caller skips the full finiteness scan when it is.
    """
    B, T = r.shape
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    L = m.sum(-1, dtype=torch.int32)
    mu = m.view(torch.uint8)
    # right-padded: no valid step follows a masked one (a uint8 max: bool any() is slow on CPU)
    right_padded = T < 2 or int(mu[:, 1:].gt(mu[:, :-1]).view(torch.uint8).max()) == 0
    if right_padded:
        delta, vc = torch.where(m, r, zero), torch.where(m, v, zero)
    else:
        # slot j ← the j-th valid step of the row; masked steps all land in slot T, then cleared
        count = torch.cumsum(mu, -1, dtype=torch.int16 if T < 2 ** 15 else torch.int32)
        pos = (count - (T + 1)).mul_(mu).add_(T)        # count − 1 where valid, else T
        n = -(-(T + 1) // BLOCK) * BLOCK                # room for slot T, whole blocks
        delta, vc = r.new_zeros(B, n), r.new_zeros(B, n)
        for rows, idx in _index_chunks(pos):
            delta[rows].scatter_(1, idx, r[rows])
            vc[rows].scatter_(1, idx, v[rows])
        delta[:, T], vc[:, T] = 0.0, 0.0
    delta.sub_(vc)
    delta[:, :-1].add_(vc[:, 1:], alpha=gamma)                     # 0 past each row's end
    rows = torch.nonzero(L).squeeze(1)
    delta.index_put_((rows, (L[rows] - 1).long()), gamma * lv[rows], accumulate=True)
    check = delta.sum()
    adv = _discounted_reverse_cumsum(delta, gamma * lam)
    del delta                                                       # its pages serve the next
    if right_padded:
        return adv, vc.add_(adv), check
    ret = vc.add_(adv)
    back = [(adv[rows].gather(1, idx), ret[rows].gather(1, idx))
            for rows, idx in _index_chunks(pos)]
    if len(back) == 1:
        return back[0] + (check,)
    return torch.cat([a for a, _ in back]), torch.cat([g for _, g in back]), check


def gae(rewards, values, mask=None, *, gamma, lam, dones=None, last_value=None):
    """Generalised advantage estimation (GAE), arXiv:1506.02438 eq. (16).

        A_t = Σ_{l ≥ 0} (Π_{j < l} γλ(1 − d_{t_j})) · δ_{t_l}  over the valid steps t = t_0 < t_1 < …
        δ_t = r_t + γ(1 − d_t)·V(next valid step, or last_value) − V_t;   returns = A + V

    Masked steps are skipped (value and advantage carried across them); see ref_numpy.gae for
    the conventions. No Python loop over T: with no done before a row's last valid step (the
    LLM case), valid steps are compacted and A is a blocked Toeplitz discounted cumsum (one
    matmul per 32 steps); otherwise a reverse affine scan in ⌈log2 T⌉ doubling steps.

    float16 and bfloat16 inputs are computed in float32 and rounded once at the end: a sum
    over hundreds of discounted terms kept in 8 or 11 bits would lose most of them.

    Args/Returns: as ref_numpy.gae, with tensors; any float dtype and device.
    """
    r = tt.token("rewards", rewards)
    v = tt.like("values", values, "rewards", r)
    m = tt.mask_of(mask, "rewards", r)
    gamma = _checks.in_range("gamma", gamma, 0.0, 1.0)
    lam = _checks.in_range("lam", lam, 0.0, 1.0)
    d = None if dones is None else tt.mask_of(dones, "rewards", r, "dones").to(r.dtype)
    batch_shape = tuple(r.shape[:-1])
    if last_value is None:
        lv = torch.zeros(batch_shape, dtype=r.dtype, device=r.device)
    else:
        s = tt.spec("last_value", last_value)
        _checks.require_float(s)
        _checks.last_value(s.shape, batch_shape, bool(torch.isfinite(last_value).all()))
        lv = last_value.to(r.dtype)
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
    """gae on [B, T] inputs, already validated."""
    # A done at a row's last valid step only drops the bootstrap; anywhere else it breaks the
    # constant decay, and the general scan below handles it.
    interior = False
    if d is not None:
        steps = torch.arange(r.shape[-1], device=r.device)
        last_index = torch.where(m, steps, torch.full_like(steps, -1)).max(-1).values
        last = steps == last_index[:, None]                 # each row's last valid step
        interior = bool((m & (d != 0) & ~last).any())
        lv = torch.where((d * last).sum(-1) > 0, torch.zeros_like(lv), lv)
    if not interior:
        adv, ret, check = _gae_blocked(r, v, m, lv, gamma, lam)
        if not bool(torch.isfinite(check)):       # a non-finite valid input, or an overflow
            tt.finite_at_valid("rewards", r, m)
            tt.finite_at_valid("values", v, m)
        return adv, ret
    tt.finite_at_valid("rewards", r, m)
    tt.finite_at_valid("values", v, m)
    B, T = r.shape
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
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
    adv = _reverse_affine_scan(a, torch.where(m, delta, zero))
    adv = torch.where(m, adv, zero)
    ret = torch.where(m, adv + v0, zero)
    return adv, ret


def discounted_returns(rewards, mask=None, *, gamma):
    """Reward-to-go G_t = r_t + γ·G_(next valid step), masked steps skipped (REINFORCE++).

    One reverse affine scan (masked steps carry G unchanged). Args/Returns: as
    ref_numpy.discounted_returns, with tensors.
    """
    r = tt.token("rewards", rewards)
    m = tt.mask_of(mask, "rewards", r)
    gamma = _checks.in_range("gamma", gamma, 0.0, 1.0)
    tt.finite_at_valid("rewards", r, m)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    decay = torch.where(m, torch.full_like(r, gamma), torch.ones_like(r))
    G = _reverse_affine_scan(decay, torch.where(m, r, zero))
    return torch.where(m, G, zero)


def whiten(x, mask=None, *, ddof=0, eps=1e-8, eps_mode="var", shift_mean=True):
    """Masked whitening: (x − μ)/s (or x/s), μ and var over valid entries, var with N − ddof.

    s = sqrt(var + eps) | sqrt(max(var, eps)) | sqrt(var) + eps for eps_mode var | clamp | std.
    Args/Returns: as ref_numpy.whiten, with tensors.
    """
    x = tt.token("x", x)
    m = tt.mask_of(mask, "x", x)
    ddof = _checks.ddof(ddof)
    eps = _checks.non_negative("eps", eps)
    eps_mode = _checks.choice("eps_mode", eps_mode, _checks.EPS_MODES)
    _checks.boolean("shift_mean", shift_mean)
    tt.finite_at_valid("x", x, m)
    n_valid = int(m.sum())
    _checks.whiten_count(n_valid, ddof)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    xm = torch.where(m, x, zero)
    mean = xm.sum() / n_valid
    centred = torch.where(m, xm - mean, zero)
    var = centred.pow(2).sum() / (n_valid - ddof)
    if eps_mode == "var":
        scale = torch.sqrt(var + eps)
    elif eps_mode == "clamp":
        scale = torch.sqrt(torch.clamp(var, min=eps))
    else:
        scale = tt.safe_sqrt(var) + eps
    _checks.whiten_scale(bool(scale == 0), n_valid)
    out = (centred if shift_mean else xm) / scale
    return torch.where(m, out, zero)


def group_advantages(rewards, *, group_size=None, group_ids=None, ddof=0, eps=1e-4,
                     scale="group", baseline="mean", valid=None):
    """Group-relative advantages A_i = (r_i − b_i)/(σ + eps) (GRPO arXiv:2402.03300 §4.1.2).

    b_i: group mean, or the mean of the *other* members (leave_one_out, computed as
    (Σ_group r − r_i)/(n − 1)); σ: group std, batch std, the others' std (NeMo; no scaling
    where it is 0), or none. Singleton groups get 0; rows with valid = 0 leave the statistics
    and get 0. Args/Returns: as ref_numpy.group_advantages, with tensors.
    """
    s = tt.spec("rewards", rewards)
    _checks.require_float(s)
    _checks.require_sequence(s)
    B = rewards.shape[0]
    ids_spec = None if group_ids is None else tt.spec("group_ids", group_ids)
    _checks.grouping(group_size is not None, ids_spec, B)
    if group_size is not None:
        ids = torch.arange(B, device=rewards.device) // _checks.group_size(group_size, B)
    else:
        ids = group_ids.to(rewards.device)
    ddof = _checks.ddof(ddof)
    eps = _checks.non_negative("eps", eps)
    scale = _checks.choice("scale", scale, _checks.GROUP_SCALES)
    baseline = _checks.choice("baseline", baseline, _checks.GROUP_BASELINES)
    _checks.loo_scale(scale, baseline)
    keep = tt.mask_of(valid, "rewards", rewards, "valid")
    tt.finite_at_valid("rewards", rewards, keep)
    out = torch.zeros_like(rewards)
    kept = _group_advantages_of(rewards[keep], ids[keep], ddof, eps, scale, baseline)
    return out.masked_scatter(keep, kept)


def _group_advantages_of(r, ids, ddof, eps, scale, baseline):
    B = r.shape[0]
    if B == 0:
        return r
    _, inverse = torch.unique(ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    member = (inverse[None, :] == torch.arange(n_groups, device=r.device)[:, None]).to(r.dtype)
    size_g = member.sum(dim=1)                      # [G]
    size = member.T @ size_g                        # [B]: size of each row's group
    sum_g = member @ r
    mean = member.T @ (sum_g / size_g)
    multi = size >= 2
    if baseline == "mean":
        baseline_value = mean
    else:
        others = torch.where(multi, size - 1, torch.ones_like(size))
        baseline_value = (member.T @ sum_g - r) / others
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    centred = torch.where(multi, r - baseline_value, zero)
    if scale == "group":
        dof_g = torch.clamp(size_g - ddof, min=1)
        sigma = member.T @ tt.safe_sqrt(member @ (r - mean).pow(2) / dof_g)
        denom = sigma + eps
    elif scale == "batch":
        sigma = tt.safe_sqrt((r - r.mean()).pow(2).sum() / max(B - ddof, 1))
        denom = (sigma + eps).expand(B)
    elif scale == "leave_one_out":
        # others[i, j] = 1 when j is in i's group and j ≠ i: the others' mean and spread directly
        others = member.T @ member - torch.eye(B, dtype=r.dtype, device=r.device)
        n_others = others.sum(dim=1)
        mean_others = (others @ r) / torch.clamp(n_others, min=1)
        spread = (others * (r[None, :] - mean_others[:, None]).pow(2)).sum(dim=1)
        dof = n_others - ddof
        var = torch.where(dof > 0, spread / torch.clamp(dof, min=1), torch.zeros_like(spread))
        sigma = tt.safe_sqrt(var)
        denom = torch.where(sigma > 0, sigma + eps, torch.ones_like(sigma))
    else:
        denom = torch.ones_like(r)
    bad = multi & (denom == 0)
    _checks.group_spread(int(torch.nonzero(bad)[0]) if bool(bad.any()) else None)
    return torch.where(multi, centred / torch.where(multi, denom, torch.ones_like(denom)), zero)
