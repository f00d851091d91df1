"""The blocked GAE kernel: what `ref_torch.gae` dispatches to when no episode ends inside a row.

`ref_torch.advantages.gae` is the twin's definition (validation, the conventions, and the
log-depth scan that handles every case); this module makes the common LLM case fast without a
Python loop over T. Right-padded rows: a blocked Toeplitz discounted cumsum of δ. Rows with
holes (masked steps anywhere): one matmul with a 0/1 triangle on inputs scaled by γλ to the
power of the valid-step count, in place (no autograd). Both are exact; tests/ref/test_gae_kernel.py
checks each path against the NumPy recursion, and that each is taken when it should be.
"""
import functools
import math

import torch

from .scan import reverse_affine_scan


BLOCK = 32      # time steps per block of the Toeplitz solve (one K×K matmul per block)
Q_MIN = 2.0 ** (-40 / BLOCK)    # smallest γλ of the scaled path: weights down to 2^-40 (below)
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}
_ONE_BITS = {torch.float32: 0x3F800000, torch.float64: 0x3FF0000000000000}   # 1.0


@functools.lru_cache(maxsize=64)
def decay_matrix(q: float, dtype: torch.dtype, device: torch.device):
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


def discounted_reverse_cumsum(x: torch.Tensor, q: float) -> torch.Tensor:
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
    U, tail = decay_matrix(q, x.dtype, x.device)
    local = (x.reshape(b * nb, BLOCK) @ U).view(b, nb, BLOCK)
    if nb > 1:
        after = discounted_reverse_cumsum(local[:, 1:, 0], q ** BLOCK)   # S_(b+1), b < nb − 1
        local[:, :-1].addcmul_(after[..., None], tail)
    return local.view(b, nb * BLOCK)[:, :n]


def select(x: torch.Tensor, m: torch.Tensor, bits) -> torch.Tensor:
    """x where m, else +0.0; a NaN or inf where m is False never enters arithmetic.

    Without autograd this is x's bit pattern and-ed with 0 or all ones (`bits`, the mask as
    0 / −1 integers of x's width): the same values as torch.where, bit for bit, at a quarter of
    its time on CPU (where on a bool mask runs at a fraction of copy speed). Autograd cannot
    pass an integer view, so a tensor that requires grad takes torch.where.
    """
    if x.requires_grad or bits is None:
        return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return (x.view(bits.dtype) & bits).view(x.dtype)


def select_both(r, v, m):
    """(r, V) where m, else +0.0, with one set of mask bits (dropped before the caller goes on)."""
    bits = mask_bits(m, r.dtype)
    return select(r, m, bits), select(v, m, bits)


def mask_bits(m: torch.Tensor, dtype: torch.dtype):
    """The mask as 0 / −1 integers as wide as `dtype` (None for a dtype with no such integer)."""
    if dtype not in BITS:
        return None
    return m.view(torch.uint8).to(BITS[dtype]).neg_()


def is_right_padded(m: torch.Tensor) -> bool:
    """No valid step follows a masked one in any row (a uint8 max: bool any() is slow on CPU)."""
    mu = m.view(torch.uint8)
    return m.shape[-1] < 2 or m.shape[0] == 0 or \
        int(mu[:, 1:].gt(mu[:, :-1]).view(torch.uint8).max()) == 0


def gae_right_padded(r, v, m, lv, gamma, lam):
    """GAE with a constant decay γλ per step, on rows whose valid steps come first.

    δ_j = r_j − v_j + γ·v_(j+1) (v is 0 past the row's end), plus γ·last_value at the row's
    last valid step; A is the discounted reverse cumsum of δ and is 0 past the end by itself.
    Returns (A, A + V, check), check = Σ δ (see ref_torch.advantages.gae).
    """
    delta, vc = select_both(r, v, m)
    delta.sub_(vc)
    delta[:, :-1].add_(vc[:, 1:], alpha=gamma)                     # 0 past each row's end
    L = m.sum(-1, dtype=torch.int32)
    rows = torch.nonzero(L).squeeze(1)
    delta.index_put_((rows, (L[rows] - 1).long()), gamma * lv[rows], accumulate=True)
    check = delta.detach().sum()
    adv = discounted_reverse_cumsum(delta, gamma * lam)
    del delta                                                       # its pages serve the next
    return adv, vc.add_(adv), check


CHUNK = 1 << 20     # elements per work buffer of the scaled path (4 MiB in float32), below


@functools.lru_cache(maxsize=64)
def triangles(dtype: torch.dtype, device: torch.device):
    """(count, incl): count[s, t] = 1 for s ≤ t, so (keep @ count)_t = Σ_{s ≤ t} keep_s (a
    matmul: on CPU a prefix sum along 32-step rows is slower); incl[s, t] = 1 for s ≥ t, so
    (z @ incl)_t = Σ_{s ≥ t} z_s, within a block of K = BLOCK."""
    i = torch.arange(BLOCK, device=device)
    incl = (i[:, None] >= i[None, :]).to(dtype)
    return incl.T.contiguous(), incl


def gae_scaled(r, v, m, lv, gamma, lam):
    """GAE on rows with masked steps anywhere (holes), as one blocked matmul: no compaction.

    Derivation. Let q = γλ and, inside a block of K steps, c_t = the number of valid steps at or
    before t. Between two valid steps t ≤ s of one block A's weight is q^(c_s − c_t) (masked
    steps are carried, decay 1), and V at the next valid step s' after s enters δ_s with
    weight γ·q^(c_s − c_t) = (γ/q)·q^(c_s' − c_t), c_s' = c_s + 1. Collecting both sums over
    the valid s ≥ t (γ/q = 1/λ):

        A_t = q^(−c_t)·[ Σ_{s ≥ t} z_s + q^(C_b)·G_(b+1) ] − v_t/λ,
        z = q^c·(r + (1/λ − 1)·v)   (masked entries 0),

    the −v_t/λ removing the s = t term's share of V_t, which belongs to δ_(prev). So one
    product P = z @ incl (incl[s, t] = [s ≥ t]) gives every suffix sum, and its first column is
    the block's whole sum. G_(b+1) is what the steps after block b hand to its last valid step:
    G = γ·V_f + q·A_f at the first valid step f after it (γ·last_value when there is none).
    With c_f = 1, q·A_f = P_f + q^(C_b)·G_(b+1) − γ·v_f, so G_b = P_(b,0) + q^(C_b)·G_(b+1):
    P_f = P_(b,0) because z is 0 before f. The G_b are a reverse affine scan over the blocks'
    heads (⌈log2 (T/K)⌉ doubling steps on arrays K times smaller); the carry q^(C_b)·G_(b+1)
    is then added to every position of block b before the scaling by q^(−c).

    Every power of q stays in [q^K, q^-K] ⊂ [2^-40, 2^40] for q ≥ Q_MIN, so the scaled terms
    neither overflow nor lose their relative precision to underflow (in float32, values above
    ~1e-26). q^c is exp(c·log q) with c an exact integer (a matmul of 0/1 with 0/1): relative
    error ≤ (2c·|log q| + 2)·u against exact powers. The v/λ terms cancel to u·|v|/λ ≤ 2.4·u·|v|
    (λ ≥ Q_MIN); the bound in tests/ref/test_precision.py counts both. Returns (A, A + V,
    check), check = Σ z + Σ v (see ref_torch.advantages.gae).

    Memory. Without autograd only: every step is in place or writes through out=. Rows go in
    chunks of about CHUNK elements, whose two work buffers serve every chunk (q^c is kept in A's
    own buffer until the product overwrites it); A and A + V are written straight into the
    outputs. On CPU a fresh 16 MB buffer costs more (page faults, cold cache lines) than the
    arithmetic done in it; here the outputs are the only large allocations.
    """
    B, T = r.shape
    n = -(-T // BLOCK) * BLOCK
    adv = torch.empty((B, n), dtype=r.dtype, device=r.device)
    ret = torch.empty_like(adv)
    rows = max(1, min(B, CHUNK // n))
    work = [torch.empty((rows, n), dtype=r.dtype, device=r.device) for _ in range(2)]
    check = torch.zeros((), dtype=r.dtype, device=r.device)
    for i in range(0, B, rows):
        j = min(B, i + rows)
        check += scaled_rows(r[i:j], v[i:j], m[i:j], lv[i:j], gamma, lam,
                              adv[i:j], ret[i:j], [w[:j - i] for w in work])
    return adv[:, :T], ret[:, :T], check


def scaled_rows(r, v, m, lv, gamma, lam, adv, ret, work):
    """gae_scaled on a chunk of rows: A into adv, A + V into ret, both [rows, n]; returns check."""
    q = gamma * lam
    rows, T = r.shape
    nb = adv.shape[1] // BLOCK
    bits_of = BITS[r.dtype]
    keep, z = work
    vm, qc = ret, adv            # q^c lives in A's buffer until the product overwrites it
    for buf in (keep, z, vm):
        buf[:, T:].zero_()                                  # the last block's padding
    bits = keep[:, :T].view(bits_of)
    bits.copy_(m).neg_()                                    # 0 / −1: the mask's bits
    torch.bitwise_and(r.view(bits_of), bits, out=z[:, :T].view(bits_of))
    torch.bitwise_and(v.view(bits_of), bits, out=vm[:, :T].view(bits_of))
    bits.bitwise_and_(_ONE_BITS[r.dtype])                   # −1 & bits of 1.0 = 1.0: keep
    keep, z, qc, vm = (t.view(rows * nb, BLOCK) for t in (keep, z, qc, vm))
    count, incl = triangles(r.dtype, r.device)
    torch.mm(keep, count, out=qc).mul_(math.log(q)).exp_()          # q^(c_t)
    inverse = keep.div_(qc)                                         # q^(−c_t); 0 where masked
    head_decay = qc[:, -1].reshape(rows, nb).clone()                # q^(C_b)
    z.add_(vm, alpha=1.0 / lam - 1.0).mul_(qc)
    out = adv.view(rows * nb, BLOCK)
    torch.mm(z, incl, out=out)
    heads = out[:, 0].reshape(rows, nb)                             # Σ z per block
    one = torch.ones((rows, 1), dtype=r.dtype, device=r.device)
    G = reverse_affine_scan(torch.cat([head_decay, one], 1),
                             torch.cat([heads, gamma * lv[:, None]], 1))
    check = heads.sum() + vm.sum()
    out.add_((head_decay * G[:, 1:]).view(rows * nb, 1)).mul_(inverse)
    out.sub_(vm, alpha=1.0 / lam)
    vm.add_(out)
    return check


def solve(r, v, m, lv, gamma, lam):
    """GAE by the blocked kernel, or None where it does not apply.

    r, v, m: [B, T], validated, with no done before a row's last valid step. Right-padded rows
    take the Toeplitz path; rows with holes take the scaled path when γλ ≥ Q_MIN, the dtype has
    an integer of its width (float32, float64) and nothing requires grad (it works in place).
    Returns (A, A + V, check) with check = a sum in which every valid r and V appears with a
    nonzero coefficient: it is finite iff they all are (barring an overflow).
    """
    if is_right_padded(m):
        return gae_right_padded(r, v, m, lv, gamma, lam)
    if (gamma * lam >= Q_MIN and r.dtype in BITS
            and not (r.requires_grad or v.requires_grad or lv.requires_grad)):
        return gae_scaled(r, v, m, lv, gamma, lam)
    return None
