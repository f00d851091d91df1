"""Advantage estimators in torch (autograd gives the gradients).

Written from the equations, independently of ref_numpy: GAE as blocked matmuls (a log-depth
affine scan when dones fall inside a row, and for holed rows under autograd or with a small
γλ); group statistics through a membership matrix.
"""
import functools
import math

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
Q_MIN = 2.0 ** (-40 / BLOCK)    # smallest γλ of the scaled path: weights down to 2^-40 (below)
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}
_ONE_BITS = {torch.float32: 0x3F800000, torch.float64: 0x3FF0000000000000}   # 1.0


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


def _select(x: torch.Tensor, m: torch.Tensor, bits) -> torch.Tensor:
    """x where m, else +0.0; a NaN or inf where m is False never enters arithmetic.

    Without autograd this is x's bit pattern and-ed with 0 or all ones (`bits`, the mask as
    0 / −1 integers of x's width): the same values as torch.where, bit for bit, at a quarter of
    its time on CPU (where on a bool mask runs at a fraction of copy speed). Autograd cannot
    pass an integer view, so a tensor that requires grad takes torch.where.
    """
    if x.requires_grad or bits is None:
        return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return (x.view(bits.dtype) & bits).view(x.dtype)


def _select_both(r, v, m):
    """(r, V) where m, else +0.0, with one set of mask bits (dropped before the caller goes on)."""
    bits = _mask_bits(m, r.dtype)
    return _select(r, m, bits), _select(v, m, bits)


def _mask_bits(m: torch.Tensor, dtype: torch.dtype):
    """The mask as 0 / −1 integers as wide as `dtype` (None for a dtype with no such integer)."""
    if dtype not in _BITS:
        return None
    return m.view(torch.uint8).to(_BITS[dtype]).neg_()


def _right_padded(m: torch.Tensor) -> bool:
    """No valid step follows a masked one in any row (a uint8 max: bool any() is slow on CPU)."""
    mu = m.view(torch.uint8)
    return m.shape[-1] < 2 or int(mu[:, 1:].gt(mu[:, :-1]).view(torch.uint8).max()) == 0


def _gae_right_padded(r, v, m, lv, gamma, lam):
    """GAE with a constant decay γλ per step, on rows whose valid steps come first.

    δ_j = r_j − v_j + γ·v_(j+1) (v is 0 past the row's end), plus γ·last_value at the row's
    last valid step; A is the discounted reverse cumsum of δ and is 0 past the end by itself.
    Returns (A, A + V, check), check = Σ δ (see _gae_2d).
    """
    delta, vc = _select_both(r, v, m)
    delta.sub_(vc)
    delta[:, :-1].add_(vc[:, 1:], alpha=gamma)                     # 0 past each row's end
    L = m.sum(-1, dtype=torch.int32)
    rows = torch.nonzero(L).squeeze(1)
    delta.index_put_((rows, (L[rows] - 1).long()), gamma * lv[rows], accumulate=True)
    check = delta.detach().sum()
    adv = _discounted_reverse_cumsum(delta, gamma * lam)
    del delta                                                       # its pages serve the next
    return adv, vc.add_(adv), check


CHUNK = 1 << 20     # elements per work buffer of the scaled path (4 MiB in float32), below


@functools.lru_cache(maxsize=64)
def _scaled_matrices(q: float, gamma: float, dtype: torch.dtype, device: torch.device):
    """count[s, t] = 1 for s ≤ t; incl[s, t] = 1 for s ≥ t; late[s, t] = γ/q·[s > t] − [s ≥ t]."""
    i = torch.arange(BLOCK, device=device)
    after = (i[:, None] >= i[None, :]).to(torch.float64)
    late = (i[:, None] > i[None, :]).to(torch.float64) * (gamma / q) - after
    return after.T.to(dtype), after.to(dtype), late.to(dtype)


def _gae_scaled(r, v, m, lv, gamma, lam):
    """GAE on rows with masked steps anywhere (holes), as blocked matmuls: no compaction.

    Derivation. Let q = γλ and, inside a block of K steps, c_t = the number of valid steps at or
    before t. Between two valid steps t ≤ s of one block A's weight is q^(c_s − c_t) (masked
    steps are carried, decay 1), and V(next valid step after s) enters δ_s, so, summing by parts,

        A_t = Σ_{s ≥ t} q^(c_s − c_t)·(r_s − v_s) + γ·Σ_{s > t} q^(c_s − c_t − 1)·v_s + carry_t
            = q^(−c_t)·[ (y @ incl)_t + (x @ late)_t + q^(C_b)·G_(b+1) ]

    with y = q^c·r and x = q^c·v (masked entries 0), incl[s, t] = [s ≥ t] and
    late[s, t] = γ/q·[s > t] − [s ≥ t], C_b = c at the block's end. G_(b+1) is what the steps
    after block b hand to its last valid step: G = γ·V_f + q·A_f at the first valid step f after
    it (γ·last_value when there is none). Since incl's last row is all ones, the carry
    q^(C_b)·G_(b+1) is added to y's last entry before the product. For block b itself
    G_b = h_b + q^(C_b)·G_(b+1), where h_b = γ·V_f + q·(A_f's in-block part) is the block's first
    output plus γ·v at its first position; that v term cancels the −(γ/q)·x_0 of the first
    output (x_0 = q·v_0 when step 0 is valid, else 0), which leaves h_b = Σ y + (γ/q − 1)·Σ x.
    The G_b are a reverse affine scan over the blocks' heads (⌈log2 (T/K)⌉ doubling steps on
    arrays K times smaller).

    Every power of q stays in [q^K, q^-K] ⊂ [2^-40, 2^40] for q ≥ Q_MIN, so the scaled terms
    neither overflow nor lose their relative precision to underflow (in float32, values above
    ~1e-26). q^c is exp(c·log q) with c an exact integer (a matmul of 0/1 with 0/1): relative
    error ≤ (2c·|log q| + 2)·u against exact powers; the bound in tests/test_precision.py counts
    it. Returns (A, A + V, check), check = Σ y + Σ x (see _gae_2d).

    Memory. Without autograd only: every step is in place or writes through out=. Rows go in
    chunks of about CHUNK elements, whose three work buffers serve every chunk; A and A + V are
    written straight into the outputs. On CPU a fresh 16 MB buffer costs more (page faults, cold
    cache lines) than the arithmetic done in it; here the outputs are the only large allocations.
    """
    B, T = r.shape
    n = -(-T // BLOCK) * BLOCK
    adv = torch.empty((B, n), dtype=r.dtype, device=r.device)
    ret = torch.empty_like(adv)
    rows = max(1, min(B, CHUNK // n))
    work = [torch.empty((rows, n), dtype=r.dtype, device=r.device) for _ in range(3)]
    check = torch.zeros((), dtype=r.dtype, device=r.device)
    for i in range(0, B, rows):
        j = min(B, i + rows)
        check += _scaled_rows(r[i:j], v[i:j], m[i:j], lv[i:j], gamma, lam,
                              adv[i:j], ret[i:j], [w[:j - i] for w in work])
    return adv[:, :T], ret[:, :T], check


def _scaled_rows(r, v, m, lv, gamma, lam, adv, ret, work):
    """_gae_scaled on a chunk of rows: A into adv, A + V into ret, both [rows, n]; returns check."""
    q = gamma * lam
    rows, T = r.shape
    nb = adv.shape[1] // BLOCK
    bits_of = _BITS[r.dtype]
    keep, y, x = work
    vm = ret
    for buf in (keep, y, vm):
        buf[:, T:].zero_()                                  # the last block's padding
    bits = keep[:, :T].view(bits_of)
    bits.copy_(m).neg_()                                    # 0 / −1: the mask's bits
    torch.bitwise_and(r.view(bits_of), bits, out=y[:, :T].view(bits_of))
    torch.bitwise_and(v.view(bits_of), bits, out=vm[:, :T].view(bits_of))
    bits.bitwise_and_(_ONE_BITS[r.dtype])                   # −1 & bits of 1.0 = 1.0: keep
    keep, y, x, vm = (t.view(rows * nb, BLOCK) for t in (keep, y, x, vm))
    count, incl, late = _scaled_matrices(q, gamma, r.dtype, r.device)
    qc = torch.mm(keep, count, out=x).mul_(math.log(q)).exp_()        # q^(c_t)
    inverse = keep.div_(qc)                                         # q^(−c_t); 0 where masked
    head_decay = qc[:, -1].reshape(rows, nb).clone()                # q^(C_b)
    y.mul_(qc)
    x = qc.mul_(vm)
    sum_y, sum_x = y.sum(-1), x.sum(-1)
    h = torch.add(sum_y, sum_x, alpha=gamma / q - 1.0).view(rows, nb)
    one = torch.ones((rows, 1), dtype=r.dtype, device=r.device)
    G = _reverse_affine_scan(torch.cat([head_decay, one], 1),
                             torch.cat([h, gamma * lv[:, None]], 1))
    y[:, -1] += (head_decay * G[:, 1:]).view(rows * nb)
    out = adv.view(rows * nb, BLOCK)
    torch.mm(y, incl, out=out).addmm_(x, late).mul_(inverse)
    vm.add_(out)
    return sum_y.sum() + sum_x.sum()


def gae(rewards, values, mask=None, *, gamma, lam, dones=None, last_value=None):
    """Generalised advantage estimation (GAE), arXiv:1506.02438 eq. (16).

        A_t = Σ_{l ≥ 0} (Π_{j < l} γλ(1 − d_{t_j})) · δ_{t_l}  over the valid steps t = t_0 < t_1 < …
        δ_t = r_t + γ(1 − d_t)·V(next valid step, or last_value) − V_t;   returns = A + V

    Masked steps are skipped (value and advantage carried across them); see ref_numpy.gae for
    the conventions. No Python loop over T. With no done before a row's last valid step (the
    LLM case), A comes from matmuls with 32×32 triangles, one per 32 steps: right-padded rows
    with the Toeplitz matrix of powers of γλ (_gae_right_padded); rows with holes with 0/1
    triangles on inputs scaled by γλ to the power of the valid-step count (_gae_scaled, for
    γλ ≥ Q_MIN ≈ 0.42, without autograd: it works in place). Otherwise (dones inside a row,
    holes with a smaller γλ, or holes in inputs that require grad) a reverse affine scan in
    ⌈log2 T⌉ doubling steps.

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
    blocked = None
    if not interior:
        # the scaled path works in place (no autograd) on float32 / float64 bits
        scaled = (gamma * lam >= Q_MIN and r.dtype in _BITS
                  and not (r.requires_grad or v.requires_grad or lv.requires_grad))
        blocked = (_gae_right_padded if _right_padded(m) else _gae_scaled if scaled else None)
    if blocked is not None:
        adv, ret, check = blocked(r, v, m, lv, gamma, lam)
        # Every valid r_t and V_t enters a term of check with a nonzero coefficient, and inf or
        # NaN plus anything is never finite, so check is finite iff every valid input is
        # (barring an overflow): the full finiteness scan runs only when it is not.
        if not bool(torch.isfinite(check)):
            tt.finite_at_valid("rewards", r, m)
            tt.finite_at_valid("values", v, m)
        return adv, ret
    tt.finite_at_valid("rewards", r, m)
    tt.finite_at_valid("values", v, m)
    B, T = r.shape
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    if d is None:                     # holed rows with γλ < Q_MIN, or that autograd will follow
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
