"""Outcome-reward advantage estimators beyond GRPO and RLOO: OPO, GPG, GRPO pass@k, ReMax, and
a group baseline followed by batch whitening (REINFORCE++-baseline, GDPO), each with a
hand-derived VJP. One scalar reward per sequence unless said otherwise; groups as in
`group_advantages` (group_size blocks or group_ids).
"""
import numpy as np

from ref_common import args, checks

from . import _arrays as ar
from ._arrays import OPS
from .advantages import (_group_units, discounted_returns, discounted_returns_vjp,
                         group_advantages, group_advantages_vjp, group_codes, whiten, whiten_vjp)


def _groups(fn, rewards, group_size, group_ids):
    """Rewards [B], each row's group code 0..G−1, and each group's size."""
    a = args.outcome_groups(OPS, fn, rewards, group_size, group_ids)
    gid = group_codes(a.rewards.shape[0], a.group_size, a.group_ids)
    counts = np.bincount(gid, minlength=int(gid.max(initial=-1)) + 1)
    return a.rewards, gid, counts


def _per_group(X, gid, n_groups):
    """Σ of the rows of X [B, ...] in each group, [G, ...], added in row order (the same bits
    whatever other groups the batch holds)."""
    out = np.zeros((n_groups,) + X.shape[1:])
    np.add.at(out, gid, X)
    return out


# ====================================================================== OPO
def _opo_parts(rewards, lengths, group_size, group_ids):
    r, gid, counts = _groups("opo_advantages", rewards, group_size, group_ids)
    L = args.per_row(OPS, "lengths", lengths, r.shape[0], positive=True)
    multi = counts[gid] >= 2
    return r, gid, counts, L, multi, _per_group(L, gid, len(counts))[gid]


def opo_advantages(rewards, lengths, *, group_size=None, group_ids=None):
    """OPO: the reward minus its group's length-weighted mean reward,

        A_i = r_i − Σ_{j∈g} L_j r_j / Σ_{j∈g} L_j      (a group of one: b = 0, A = r)

    the baseline that is optimal for a sequence-level policy gradient whose variance grows
    with the response length.

    Reference: Hao et al., "On-Policy RL with Optimal Reward Baseline" (arXiv:2505.23585), as
    verl writes it in `compute_opo_outcome_advantage` (L = the response's token count).
    Note: with equal lengths it is the group-mean baseline (group_advantages, scale="none",
    singleton="keep").

    Worked example: r = [1, 0], L = [10, 30]: b = 10/40 = 0.25, A = [0.75, −0.25].

    Args:
      rewards: [B] float.  lengths: [B] positive float or int (response lengths).
      group_size: int dividing B, or group_ids: [B] int.

    Returns:
      [B] float64.
    """
    r, gid, counts, L, multi, SL = _opo_parts(rewards, lengths, group_size, group_ids)
    return r - np.where(multi, _per_group(L * r, gid, len(counts))[gid] / SL, 0.0)


def opo_advantages_vjp(g, rewards, lengths, *, group_size=None, group_ids=None):
    """VJP of `opo_advantages` wrt rewards.

    Gradient: ∂A_i/∂r_j = δ_ij − L_j/Σ_g L (i, j in one group of ≥ 2), so
        ḡ_j = g_j − [n_g ≥ 2]·L_j/Σ_g L · Σ_{i∈g} g_i.

    Returns:
      {"rewards": [B]} float64.
    """
    r, gid, counts, L, multi, SL = _opo_parts(rewards, lengths, group_size, group_ids)
    g = args.cotangent(OPS, g, "g", OPS.spec("rewards", rewards))
    return {"rewards": g - np.where(multi, L / SL * _per_group(g, gid, len(counts))[gid], 0.0)}


def group_centred(R, gid, counts):
    """R minus its group's mean in groups of ≥ 2 (a group of one keeps its value), for R [..., B]
    with any leading axes (many points or many cotangents at once)."""
    member = (np.arange(len(counts))[:, None] == gid[None, :]).astype(np.float64)
    mean = ((R[..., None, :] * member).sum(axis=-1) / np.maximum(counts, 1))[..., gid]
    return R - np.where(counts[gid] >= 2, mean, 0.0)


# ====================================================================== GPG
def _gpg_parts(rewards, group_size, group_ids, f_norm):
    r, gid, counts = _groups("gpg_advantages", rewards, group_size, group_ids)
    return r, gid, counts, checks.positive("f_norm", f_norm)


def gpg_alpha(R):
    """α = B / max(1, #{r ≠ 0}) for rewards R [..., B]: one per point."""
    return R.shape[-1] / np.maximum(np.count_nonzero(R, axis=-1), 1)[..., None]


def gpg_advantages(rewards, *, group_size=None, group_ids=None, f_norm=1.0):
    """GPG: group-mean-centred rewards, scaled up by the batch's share of non-zero rewards,

        α = B / max(1, #{i: r_i ≠ 0}),   A_i = α·(r_i − mean_g r)/f_norm   (one member: mean 0)

    so that a batch where few prompts earned any reward is not drowned by zero-advantage rows.

    Reference: Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline"
    (arXiv:2504.02546), as verl writes it in `compute_gpg_outcome_advantage` (f_norm = 1).
    Note: α counts non-zero *rewards*, before centring, over the whole batch; it is piecewise
    constant in r (a kink where a reward crosses 0), treated as a constant by the VJP. This is
    verl's α (`bsz / count_nonzero(scores)`). The paper's is α = B/(B − M), M the samples whose
    advantage is 0 (the members of groups whose rewards are all equal), so it counts samples
    that carry a gradient, not non-zero rewards: for 0/1 rewards verl's counts the correct
    answers, the paper's the members of mixed groups, which differ in general. The reference
    follows verl, the code it audits.

    Worked example: r = [1, 0, 0, 0], one group: α = 4, mean 0.25, A = [3, −1, −1, −1].

    Args:
      rewards: [B] float.  group_size: int dividing B, or group_ids: [B] int.
      f_norm: float > 0.

    Returns:
      [B] float64.
    """
    r, gid, counts, scale = _gpg_parts(rewards, group_size, group_ids, f_norm)
    return gpg_alpha(r) / scale * group_centred(r, gid, counts)


def gpg_advantages_vjp(g, rewards, *, group_size=None, group_ids=None, f_norm=1.0):
    """VJP of `gpg_advantages` wrt rewards.

    Gradient: α is locally constant (away from r = 0), and the mean's derivative is 1/n_g:
        ḡ_j = α/f_norm·(g_j − [n_g ≥ 2]·Σ_{i∈g} g_i / n_g).

    Returns:
      {"rewards": [B]} float64.
    """
    r, gid, counts, scale = _gpg_parts(rewards, group_size, group_ids, f_norm)
    g = args.cotangent(OPS, g, "g", OPS.spec("rewards", rewards))
    return {"rewards": gpg_alpha(r) / scale * group_centred(g, gid, counts)}


# ====================================================================== pass@k
def _passk_parts(rewards, group_size, group_ids, eps, scale):
    """The ranking, and the margin and spread in each group's units of 2^e (`_group_units`),
    so that (r_best − r_second)/(σ + eps) is the same at any magnitude of the rewards: the
    rescaling is exact, and ordinary rewards give the unscaled results bit for bit."""
    r, gid, counts = _groups("passk_advantages", rewards, group_size, group_ids)
    eps = checks.non_negative("eps", eps)
    scale = checks.choice("scale", scale, ("group", "none"))
    if (counts < 2).any():
        row = int(np.argmax(counts[gid] < 2))
        raise ValueError(f"rewards of row {row} form a group of one; pass@k compares the best "
                         "and second-best of a group of at least 2")
    G = len(counts)
    order = np.lexsort((-r, gid))                  # by group, best first (ties: first row)
    start = np.searchsorted(gid[order], np.arange(G))
    top, second = order[start], order[np.minimum(start + 1, len(order) - 1)]
    e = _group_units(r, gid, "group")               # per row
    rs = np.ldexp(r, -e)
    mu = _per_group(rs, gid, G) / np.maximum(counts, 1)
    dev = rs - mu[gid] if r.size else rs
    sigma = np.sqrt(_per_group(dev * dev, gid, G) / np.maximum(counts - 1, 1))
    e_top = e[top]
    with np.errstate(over="ignore"):                # eps far above tiny rewards: A ≈ 0
        D = sigma + np.ldexp(eps, -e_top) if scale == "group" else np.ldexp(1.0, -e_top)
    margin = rs[top] - rs[second]                   # in the group's units
    tie = margin == 0
    return r, gid, counts, top, second, dev, sigma, D, scale, margin, tie, e_top


def passk_advantages(rewards, *, group_size=None, group_ids=None, eps=1e-6, scale="group"):
    """GRPO for pass@k: only a group's best response gets an advantage, the margin by which it
    beats the second best,

        A_best = (r_best − r_second)/(σ_g + eps)   (scale="group"; "none": no division)
        A = 0 for every other response

    σ_g the group's standard deviation with n − 1. A tie for the best gives 0 to all, eps = 0
    on an all-equal group included (0/0 there). A is scale-invariant for scale="group": the
    margin and σ are formed in units of the group's largest |r| (a power of two), so rewards
    ×1e200 or ×1e−200 give the advantages of rewards ×1, eps scaled with them.

    Reference: arXiv:2503.19595 as verl writes it in `compute_grpo_passk_outcome_advantage`
    (norm_adv_by_std_in_grpo picks scale="group"; groups of one are refused).
    Note: the advantage rewards being the best of k samples, not being good on average; it is
    piecewise smooth, with kinks where the ranking of the top two changes.

    Worked example: r = [1, 3, 2], eps = 0: σ = 1, A = [0, 1, 0].

    Args:
      rewards: [B] float.  group_size: int dividing B, or group_ids: [B] int.
      eps: float ≥ 0.  scale: "group" | "none".

    Returns:
      [B] float64.
    """
    r, _, _, top, _, _, _, D, _, margin, tie, _ = _passk_parts(rewards, group_size, group_ids,
                                                               eps, scale)
    out = np.zeros(r.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[top] = np.where(tie, 0.0, margin / np.where(tie, 1.0, D))
    return out


def passk_advantages_vjp(g, rewards, *, group_size=None, group_ids=None, eps=1e-6,
                         scale="group"):
    """VJP of `passk_advantages` wrt rewards.

    Gradient: only the best row's output depends on r. With Δ = r_best − r_second and
    D = σ + eps, ∂σ/∂r_j = (r_j − μ)/((n − 1)σ) for j in the group, so
        ḡ_best += g_best/D,   ḡ_second −= g_best/D,
        ḡ_j −= g_best·Δ/D²·(r_j − μ)/((n − 1)σ)   for every j in the group (scale="group").
    At σ = 0 every reward is equal, Δ = 0, and the last term is taken as 0. With eps = 0 there
    D = 0 too: A is 0 at that point but jumps to a constant (A is scale-invariant) for any
    spread, so it has no derivative; the gradient is taken as 0.
    Every term is formed in the group's units of 2^e (`_passk_parts`): Δ, σ, D and r − μ scale
    by 2^−e, so ∂A/∂r = (the same expression in those units)·2^−e.

    Returns:
      {"rewards": [B]} float64.
    """
    r, gid, counts, top, second, dev, sigma, D, scale, margin, _, e_top = _passk_parts(
        rewards, group_size, group_ids, eps, scale)
    g = args.cotangent(OPS, g, "g", OPS.spec("rewards", rewards))
    out = np.zeros(r.shape)
    flat = D == 0                                      # all equal, eps = 0: no derivative
    gb = np.where(flat, 0.0, g[top]) / np.where(flat, 1.0, D)       # g_best/D, group units
    units = np.zeros(r.shape)                          # the gradient in the groups' units
    np.add.at(units, top, gb)
    np.add.at(units, second, -gb)
    if scale == "group" and r.size:
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.where(sigma > 0, gb * (margin / np.where(flat, 1.0, D)) /
                         ((counts - 1) * sigma), 0.0)
        units -= k[gid] * dev
    with np.errstate(over="ignore"):                   # 1/σ of subnormal rewards: inf
        out = np.ldexp(units, -e_top[gid])
    return {"rewards": out}


# ====================================================================== ReMax
def _remax_inputs(rewards, baselines, mask):
    a = args.discounted_returns(OPS, rewards, mask, 1.0)
    if a.rewards.ndim != 2:
        raise ValueError(f"rewards has shape {a.rewards.shape}; expected [B, T]")
    b = args.per_row(OPS, "baselines", baselines, a.rewards.shape[0])
    return a.mask, b


def remax_advantages(rewards, baselines, mask=None):
    """ReMax: the reward-to-go minus the reward of the greedy response to the same prompt,

        A_t = Σ_{s ≥ t, valid} r_s − b        (b: the greedy rollout's reward, one per row)

    Reference: Li et al., "ReMax" (arXiv:2310.10505), as verl writes it in
    `compute_remax_outcome_advantage` (a reverse cumulative sum of the masked rewards).
    Note: the reward-to-go is `discounted_returns` with γ = 1; a variance-reducing baseline
    that costs one extra greedy generation per prompt, and no critic.

    Worked example: r = [0, 0, 1] on three valid tokens, b = 0.4: A = [0.6, 0.6, 0.6].

    Args:
      rewards: [B, T] float.  baselines: [B] float.
      mask: [B, T] bool or 0/1, or None.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m, b = _remax_inputs(rewards, baselines, mask)
    G = discounted_returns(rewards, mask, gamma=1.0)
    return np.where(m, G - b[:, None], 0.0)


def remax_advantages_vjp(g, rewards, baselines, mask=None):
    """VJP of `remax_advantages` wrt rewards and baselines.

    Gradient: the reward-to-go is linear in r (discounted_returns' VJP at γ = 1: ḡ_r is the
    forward cumulative sum of g over valid steps), and ∂A_t/∂b = −1 at valid t:
        ḡ_b = −Σ_t m_t g_t.

    Returns:
      {"rewards": [B, T], "baselines": [B]} float64.
    """
    m, b = _remax_inputs(rewards, baselines, mask)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("rewards", rewards)), m)
    return {"rewards": discounted_returns_vjp(gm, rewards, mask, gamma=1.0)["rewards"],
            "baselines": -gm.sum(axis=-1)}


# ====================================================================== group baseline, then whitening
def _whitened_parts(rewards, mask, group_size, group_ids, scale, eps, whiten_eps):
    s = OPS.spec("rewards", rewards)
    scale = checks.choice("scale", scale, ("none", "group"))
    whiten_eps = checks.non_negative("whiten_eps", whiten_eps)
    ms = OPS.spec("mask", mask)
    if len(ms.shape) != 2 or len(s.shape) != 1 or ms.shape[0] != s.shape[0]:
        raise ValueError(f"mask has shape {tuple(ms.shape)} but rewards has {tuple(s.shape)}; "
                         "expected one reward per sequence [B] and a [B, T] mask")
    args.group_rule(OPS, "whitened_group_advantages", s.shape[0], group_size, group_ids)
    group = dict(group_size=group_size, group_ids=group_ids, ddof=1, eps=eps, scale=scale,
                 baseline="mean", singleton="keep")
    whitening = dict(ddof=1, eps=whiten_eps, eps_mode="var", shift_mean=True)
    A = group_advantages(rewards, **group)
    m = args.mask(OPS, mask, ms, mask)   # 0/1 or bool only, as gae's
    X = np.where(m, A[:, None], 0.0)
    return m, X, group, whitening


def whitened_group_advantages(rewards, mask, *, group_size=None, group_ids=None, scale="none",
                              eps=1e-6, whiten_eps=1e-8):
    """A group baseline, then whitening over every valid token of the batch:

        a_i = group_advantages(r, baseline="mean", scale, ddof=1, eps, singleton="keep")_i
        A_{i,t} = whiten(a broadcast over row i's valid tokens; ddof=1, eps=whiten_eps "var")

    Reference: REINFORCE++-baseline (Hu et al., arXiv:2501.03262: scale="none", verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`) and GDPO's single-reward form
    (arXiv:2601.05242: GRPO's scale="group" per reward, then verl's masked_whiten, in
    `compute_gdpo_outcome_advantage`).
    Note: the whitening is over tokens, so a sequence weighs its length in the batch mean and
    variance: a long response pulls the batch statistics more than a short one.

    Worked example: r = [1, 0, 2, 2] in groups of 2, one token each, scale="none":
    a = [0.5, −0.5, 0, 0], μ = 0, var = 0.5/3, A = [1.2247, −1.2247, 0, 0].

    Args:
      rewards: [B] float.  mask: [B, T] bool or 0/1.
      group_size: int dividing B, or group_ids: [B] int.
      scale: "none" | "group".  eps, whiten_eps: float ≥ 0.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m, X, _, whitening = _whitened_parts(rewards, mask, group_size, group_ids, scale, eps,
                                         whiten_eps)
    return np.where(m, whiten(X, m, **whitening), 0.0)


def whitened_group_advantages_vjp(g, rewards, mask, *, group_size=None, group_ids=None,
                                  scale="none", eps=1e-6, whiten_eps=1e-8):
    """VJP of `whitened_group_advantages` wrt rewards.

    Gradient: the chain of its two parts. With X_{i,t} = m_{i,t}·a_i:
        ḡ_X = whiten_vjp(m·g),   ḡ_a_i = Σ_t m_{i,t}·ḡ_X_{i,t},   ḡ_r = group_advantages_vjp(ḡ_a).

    Returns:
      {"rewards": [B]} float64.
    """
    m, X, group, whitening = _whitened_parts(rewards, mask, group_size, group_ids, scale, eps,
                                             whiten_eps)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("mask", mask)), m)
    gX = whiten_vjp(gm, X, m, **whitening)["x"]
    ga = np.where(m, gX, 0.0).sum(axis=-1)
    return group_advantages_vjp(ga, rewards, **group)


# ====================================================================== optimal token baseline
def _otb_parts(rewards, old_logp, sum_pi_squared, mask, group_size, group_ids, zero_tail, eps):
    a = args.token_groups(OPS, "optimal_token_baseline_advantages", rewards, old_logp,
                          sum_pi_squared, mask, group_size, group_ids)
    eps = checks.non_negative("eps", eps)
    zero_tail = checks.boolean("zero_tail", zero_tail)
    m = a.mask
    B, T = m.shape
    gid = group_codes(B, a.group_size, group_ids)
    n_groups = int(gid.max(initial=-1)) + 1
    member = (np.arange(n_groups)[:, None] == gid[None, :]).astype(np.float64)   # [G, B]
    r = ar.zero_masked(a.rewards, m)
    G = np.flip(np.cumsum(np.flip(r, -1), axis=-1), -1)          # Σ_{s ≥ t} m_s r_s
    w = 1.0 - 2.0 * np.exp(ar.zero_masked(a.old_logp, m)) + ar.zero_masked(a.sum_pi_squared, m)
    W = np.cumsum(np.where(m, w, 0.0), axis=-1)                   # Σ_{j ≤ t} m_j w_j
    den = _per_group(np.where(m, W, 0.0), gid, n_groups) + eps   # [G, T]
    with np.errstate(divide="ignore", invalid="ignore"):         # a step no member reaches
        c = np.where(m & (den[gid] > 0), np.where(m, W, 0.0) / den[gid], 0.0)   # has no weight
    keep = (member.sum(axis=1) >= 2)[gid][:, None] & np.ones((B, T), bool)
    if zero_tail:
        L = m.sum(axis=-1)
        for g in range(n_groups):
            rows = np.flatnonzero(gid == g)
            if len(rows) < 2:
                continue
            lengths = np.sort(L[rows])
            longest = rows[L[rows] == lengths[-1]]
            if len(longest) == 1 and lengths[-1] > lengths[-2]:
                keep[longest[0], int(lengths[-2]):] = False
    return m, gid, member, G, c, keep


def optimal_token_baseline_advantages(rewards, old_logp, sum_pi_squared, mask=None, *,
                                      group_size=None, group_ids=None, zero_tail=True,
                                      eps=1e-8):
    """The optimal token baseline (OTB): a baseline per step t, weighted by each trajectory's
    accumulated score-function variance,

        G_{i,t} = Σ_{s ≥ t} m_s r_{i,s}                       (reward-to-go)
        w_{i,t} = 1 − 2π_{i,t} + Σ_v π_{i,t}(v)²              (‖∇log π‖² of a softmax, a proxy)
        W_{i,t} = Σ_{j ≤ t} m_j w_{i,j}
        b_t = Σ_{i∈g} m G W / (Σ_{i∈g} m W + eps),   A_{i,t} = m_{i,t}(G_{i,t} − b_t)

    b aligns trajectories of a group by position t; a group of one has b = 0; with zero_tail a
    group's single longest trajectory gets b = 0 from the second-longest length on.

    Reference: verl `compute_optimal_token_baseline_advantage` (π = exp(old_log_probs),
    Σπ² = sum_pi_squared, epsilon 1e-8, handle_zero_tail True), after the variance-optimal
    baseline B* = E[G·W]/E[W] of the policy-gradient estimator.
    Note: with every w equal, W_t is the step count and b_t the group's mean reward-to-go at t.
    The rollout-IS variant (W scaled by ρ̄²) is not in this reference.

    Worked example: two one-step trajectories, r = [1, 0], π = [0.5, 0.5], Σπ² = [0.5, 0.5]:
    w = W = [0.5, 0.5], b = 0.5, A = [0.5, −0.5].

    Args:
      rewards, old_logp, sum_pi_squared: [B, T] float.
      mask: [B, T] bool or 0/1, or None.
      group_size: int dividing B, or group_ids: [B] int.
      zero_tail: bool.  eps: float ≥ 0.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m, gid, member, G, c, keep = _otb_parts(rewards, old_logp, sum_pi_squared, mask, group_size,
                                            group_ids, zero_tail, eps)
    b = _per_group(c * G, gid, len(member))[gid]                # Σ_j c_j G_j, per row's group
    return np.where(m, G - np.where(keep, b, 0.0), 0.0)


def optimal_token_baseline_advantages_vjp(g, rewards, old_logp, sum_pi_squared, mask=None, *,
                                          group_size=None, group_ids=None, zero_tail=True,
                                          eps=1e-8):
    """VJP of `optimal_token_baseline_advantages` wrt rewards.

    Gradient: the weights c_{j,t} = m W_{j,t}/(Σ_g m W + eps) do not depend on r, so
    A_{i,t} = m_{i,t}(G_{i,t} − keep_{i,t}·Σ_{j∈g} c_{j,t} G_{j,t}) is linear in G:
        ḡ_G_{j,t} = m_{j,t} g_{j,t} − c_{j,t}·Σ_{i∈g} keep_{i,t} m_{i,t} g_{i,t},
    and G_{j,t} = Σ_{s ≥ t} m_s r_{j,s} gives ḡ_r_{j,s} = m_{j,s}·Σ_{t ≤ s} ḡ_G_{j,t}.

    Returns:
      {"rewards": [B, T]} float64.
    """
    m, gid, member, G, c, keep = _otb_parts(rewards, old_logp, sum_pi_squared, mask, group_size,
                                            group_ids, zero_tail, eps)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("rewards", rewards)), m)
    gG = gm - c * _per_group(np.where(keep, gm, 0.0), gid, len(member))[gid]
    return {"rewards": np.where(m, np.cumsum(gG, axis=-1), 0.0)}
