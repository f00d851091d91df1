"""Seeded case generators, one per registry function.

Case i of function NAME under seed S is drawn from `np.random.default_rng([S, crc32(NAME), i])`,
so `python -m crosscheck --only NAME --seed S` reproduces it exactly. Cases rotate through
shapes (odd and non-square, B = 1, T = 1, one 23×17), masks (full, right-padded with an empty
row and a one-token row, holed as in multi-turn data), padding garbage (NaN, inf, 1e4) and
every convention keyword. Inputs that finite differences touch are kept at least `MARGIN` away
from kinks (clip edges, branch ties), since a difference across a kink is wrong by O(1); kinks
are pinned by hand-written fixtures in tests/ instead.
"""
import dataclasses
import math
import zlib
from typing import Dict, Optional, Tuple

import numpy as np

import ref_numpy
from ref_common.vocab import AGG_MODES, GROUPED_AGG_MODES, RATIO_LEVELS

DEFAULT_CASES = 12    # the cross-check's default run; regimes below only from this case on
MARGIN = 0.02         # distance kept from every kink, in the kinked variable (≫ FD_STEP)
FD_STEP = 1e-3        # largest finite-difference stencil offset (scipy.differentiate)

SHAPES = [(3, 7), (4, 9), (1, 1), (2, 5), (5, 11), (1, 6), (6, 3), (23, 17)]
ALL_STAGES = ("value", "vjp", "fd", "detach")


@dataclasses.dataclass
class Case:
    label: str
    arrays: Dict[str, Optional[np.ndarray]]   # inputs by keyword, numpy (float64, bool or int)
    params: Dict[str, object]                 # hyper-parameters by keyword
    stages: Tuple[str, ...] = ALL_STAGES
    fd_step: float = FD_STEP
    memo: Dict[tuple, object] = dataclasses.field(default_factory=dict, repr=False,
                                                  compare=False)   # results shared by stages

    def shape(self):
        first = next(a for a in self.arrays.values() if a is not None)
        return tuple(first.shape)


def rng_for(seed: int, name: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), index])


# ---------------------------------------------------------------- building blocks
def _shape(i, rng):
    return SHAPES[i % len(SHAPES)]


def _mask(rng, B, T, kind):
    if kind == "full":
        return np.ones((B, T), dtype=bool)
    if kind == "ragged":           # right padding; row 0 empty and row 1 one token when B ≥ 3
        lengths = rng.integers(1, T + 1, size=B)
        if B >= 3:
            lengths[0], lengths[1] = 0, 1
        return np.arange(T)[None, :] < lengths[:, None]
    m = rng.random((B, T)) < 0.7    # holes, as masked tool output in multi-turn data
    m[:, 0] = True
    return m


KINDS = ("full", "holed", "ragged")
FIRST_KIND = (0, 2, 0, 1, 1, 2, 1, 2)   # per shape; each pass over SHAPES moves one kind on


def _mask_kind(i):
    """Cases 0–11 (the default run) put holed masks on shapes 2×5, 5×11, 6×3 and 3×7, ragged
    ones on 4×9 (an empty row and a one-token row), 1×6, 23×17 and 2×5, full ones elsewhere."""
    return KINDS[(FIRST_KIND[i % len(SHAPES)] + i // len(SHAPES)) % 3]


def _garbage(x, mask, rng):
    """Fill masked positions with NaN, ±inf or 1e4: none of it may reach any output."""
    out = np.array(x, dtype=np.float64, copy=True)
    junk = rng.choice([np.nan, np.inf, -np.inf, 1e4], size=out.shape)
    out[~mask] = junk[~mask]
    return out


def away(x, edges, margin=MARGIN):
    """Move entries of x that lie within `margin` of any edge to `2·margin` from it, on the side
    they were on (so a value meant to be clipped stays clipped)."""
    x = np.array(x, dtype=np.float64, copy=True)
    for _ in range(4):
        for e in edges:
            near = np.abs(x - e) < margin
            x[near] = e + np.where(x[near] >= e, 2 * margin, -2 * margin)
    return x


def _cycle(i, options):
    return options[i % len(options)]


def _logps(rng, shape):
    return np.log(rng.uniform(0.05, 0.95, size=shape))


def _extreme_range(i, period):
    """The size range of an extreme case's log-ratios, for a generator whose extreme cases come
    once every `period` cases: 15..30 (far outside any clip region, finite after exp in float32
    and float64) and, from case DEFAULT_CASES on, every other one 90..120, past float32's exp
    overflow (|ρ| > 89): float32 code must saturate there, not overflow."""
    return (90, 120) if i >= DEFAULT_CASES and (i // period) % 2 == 1 else (15, 30)


def _log_ratio(rng, shape, i, period, sd=0.35):
    """Ordinary log-ratios (N(0, sd)), or extreme ones once every `period` cases; and the
    label's words for them."""
    if i % period == period - 2:
        lo, hi = _extreme_range(i, period)
        x = rng.choice([-1, 1], size=shape) * rng.uniform(lo, hi, size=shape)
        return x, f", extreme log-ratios ±{lo}..{hi}"
    return rng.normal(0.0, sd, size=shape), ""


def _offset(i):
    """From case DEFAULT_CASES on, a sixth of the reward and whitening cases sit on a large
    common offset (1000 ± 0.1): a one-pass float32 variance, Σx² − (Σx)²/n, loses every digit
    there, while a two-pass one keeps them."""
    return i >= DEFAULT_CASES and i % 6 == 1


def _near_degenerate(i):
    """From case DEFAULT_CASES on, a sixth of the group cases are near-degenerate at ordinary
    scale: rewards 0 or 1 plus σ·N(0, 1), σ from 1e-4 to 1e-2, where σ meets the trainers'
    ε (1e-6, 1e-4) and float32 group statistics lose digits."""
    return i >= DEFAULT_CASES and i % 6 == 2


def _large_sequence_ratio(i):
    """From case DEFAULT_CASES on, a quarter of the sequence-level cases (GSPO, GMPO) shift
    each row's log-ratios by ±10..30: sequence ratios far past any clip or cap."""
    return i >= DEFAULT_CASES and i % 4 == 3


def _empty_micro_batch(i, B):
    """From case DEFAULT_CASES on, a fifth of the token cases mask their first half of rows
    entirely, so that the audit's first micro-batch holds no valid token."""
    return i >= DEFAULT_CASES and i % 5 == 1 and B >= 2


def _ratio_edges(clip_low, clip_high, clip_c=None):
    hi = clip_low if clip_high is None else clip_high
    edges = [math.log(1 - clip_low), math.log(1 + hi)]          # PPO's clip_low is < 1
    if clip_c is not None:
        edges.append(math.log(clip_c))
    return edges


def _advantages(rng, B, T, i, mask):
    per_seq = i % 4 == 3 and B > 0
    if per_seq:
        adv = rng.normal(size=B)
        adv[~mask.any(axis=1)] = np.nan          # a row without tokens may carry garbage
        return adv
    adv = rng.normal(size=(B, T))
    if i % 5 == 2:
        adv[rng.random((B, T)) < 0.2] = 0.0      # A = 0 tokens: loss and gradient exactly 0
    if _large_advantages(i):
        adv = adv * 20.0                         # advantages well beyond ±5
    return _garbage(adv, mask, rng)


def _large_advantages(i):
    """From case DEFAULT_CASES on, one token case in seven draws per-token advantages ×20."""
    return i >= DEFAULT_CASES and i % 7 == 3 and i % 4 != 3


def _advantages_label(arrays, i):
    adv = arrays["advantages"]
    return ", advantages [B]" if adv.ndim == 1 and arrays["mask"].size > 1 else \
        ", advantages ×20" if _large_advantages(i) else ""


# ---------------------------------------------------------------- per-function generators
def gae_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    gamma = _cycle(i, [0.99, 1.0, 0.9, 0.0, 0.97])
    lam = _cycle(i // 2, [0.95, 1.0, 0.0, 0.5])
    dones = (rng.random((B, T)) < 0.15) if i % 3 == 1 else None
    last_value = rng.normal(size=B) if i % 4 == 2 or i % 16 == 5 else None
    arrays = dict(rewards=_garbage(rng.normal(size=(B, T)), m, rng),
                  values=_garbage(rng.normal(size=(B, T)), m, rng), mask=m, dones=dones,
                  last_value=last_value)
    label = f"{kind} mask, γ={gamma}, λ={lam}" + (", dones" if dones is not None else "") + \
        (", last_value" if last_value is not None else "")
    if i % 8 == 5:                   # a single [T] trajectory (its last_value a 0-d array)
        arrays = {k: (None if v is None else (v[0] if v.ndim == 2 else v[:1].reshape(())))
                  for k, v in arrays.items()}
        label += ", 1-D [T]"
    return Case(label, arrays, dict(gamma=gamma, lam=lam))


def whiten_case(rng, i):
    B, T = _shape(i, rng)
    if B * T < 3:
        B, T = 2, 3
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    m.flat[:2] = True                              # at least two valid entries (ddof = 1)
    ddof = _cycle(i, [0, 1])
    eps_mode = _cycle(i // 2, ["var", "clamp", "std"])
    shift = _cycle(i // 6, [True, False])
    restore = not shift and i % 2 == 1            # verl's and TRL's shift_mean=False
    eps = _cycle(i, [1e-8, 1e-4, 0.1])
    x = rng.normal(size=(B, T)) * rng.uniform(0.5, 3.0) + rng.normal()
    offset = _offset(i) and i % 7 != 6             # not with a clamp-binding spread of 1e-6
    if offset:
        x = 1000.0 + 0.1 * x
    step = FD_STEP
    label = f"{kind} mask, ddof={ddof}, eps_mode={eps_mode}, shift_mean={shift}, eps={eps}" + \
        (", restore_mean" if restore else "") + (", offset 1000 ± 0.1" if offset else "")
    if i % 7 == 6:                                 # spread far below eps: the clamp binds
        x, eps, eps_mode, step = x * 1e-6, 1e-4, "clamp", 1e-10
        label += " (var ≪ eps: clamp binding)"
    return Case(label, dict(x=_garbage(x, m, rng), mask=m),
                dict(ddof=ddof, eps=eps, eps_mode=eps_mode, shift_mean=shift,
                     restore_mean=restore), fd_step=step)



def _unequal_ids(P, G, least=1):
    """Group ids of P groups of unequal sizes around G (G − 1, G, G + 1 in turn, at least
    `least`), consecutive: a trainer grouping by ids (verl's index, SkyRL's uids) takes groups
    of any sizes, which one size for every group would not exercise."""
    sizes = [max(least, G - 1 + p % 3) for p in range(P)]
    return np.repeat(np.arange(P), sizes)


def group_advantages_case(rng, i):
    G = _cycle(i, [4, 3, 2, 5, 1])
    P = _cycle(i // 2, [2, 3, 1, 4])
    B = P * G
    scale = "mean" if i % 12 in (3, 8) else _cycle(i, ["group", "batch", "none", "leave_one_out"])
    baseline = "leave_one_out" if scale == "leave_one_out" else \
        _cycle(i // 3, ["mean", "leave_one_out"])
    ddof = _cycle(i // 2, [0, 1])
    eps = _cycle(i, [1e-4, 1e-6, 1e-2])
    singleton = _cycle(i // 4, ["zero", "keep", "keep"])
    # MaxRL's "mean" scale divides by the group mean: pass rates, away from 0
    r = rng.uniform(0.2, 1.0, size=B) if scale == "mean" else rng.normal(size=B)
    params = dict(ddof=ddof, eps=eps, scale=scale, baseline=baseline, singleton=singleton)
    stages = ALL_STAGES
    label = f"B={B}, scale={scale}, baseline={baseline}, ddof={ddof}, eps={eps}, " \
        f"singleton={singleton}" + (", offset 1000 ± 0.1" if _offset(i) else "")
    if i % 2 == 0:
        params["group_size"] = G
        label = f"group_size={G}, " + label
        arrays = dict(rewards=r, group_ids=None)
    else:               # ids in any order, groups of unequal sizes, plus a singleton group
        ids = _unequal_ids(P, G)
        ids = np.concatenate([ids, [P + 7]])
        r = rng.uniform(0.2, 1.0, size=ids.size) if scale == "mean" else \
            rng.normal(size=ids.size)
        perm = rng.permutation(ids.size)
        arrays = dict(rewards=r[perm], group_ids=ids[perm] * 3 + 1)
        label = (f"shuffled group_ids, group sizes {np.bincount(ids).tolist()}, "
                 + label.replace(f"B={B}", f"B={ids.size}"))
    if i % 5 == 3:                                 # unscorable rows: out of the statistics, NaN
        valid = rng.random(arrays["rewards"].size) < 0.75
        arrays["rewards"] = np.where(valid, arrays["rewards"], np.nan)
        arrays["valid"] = valid
        label += ", invalid rows (NaN rewards)"
    if i % 6 in (4, 5):                            # an all-equal group: σ = 0 (non-smooth: no FD)
        size = params.get("group_size", None)
        rr = arrays["rewards"]
        if size:
            rr[:size] = np.where(np.isnan(rr[:size]), np.nan, 0.5)
        else:
            ids = arrays["group_ids"]
            rr[ids == ids[0]] = np.where(np.isnan(rr[ids == ids[0]]), np.nan, 0.5)
        stages = ("value", "vjp")
        label += ", an all-equal group"
    if _offset(i):                                 # every reward, the singleton's included
        arrays["rewards"] = 1000.0 + 0.1 * arrays["rewards"]
    elif _near_degenerate(i):
        centre, spread = _cycle(i // 6, [0.0, 1.0]), _cycle(i // 12, [1e-3, 1e-4, 1e-2])
        centre = 1.0 if scale == "mean" else centre
        arrays["rewards"] = centre + spread * arrays["rewards"]
        label += f", near-degenerate groups: {centre:g} + {spread:g}·N(0, 1)"
        stages = ("value", "vjp")                  # σ below the finite-difference stencil
    return Case(label, arrays, params, stages=stages)


def _ratio_case(rng, i, loss):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    if _empty_micro_batch(i, B):
        m[: B // 2] = False
    logp = _logps(rng, (B, T))
    if loss == "ppo":
        clip_low = _cycle(i, [0.2, 0.1, 0.3])
        clip_high = _cycle(i // 3, [None, 0.28])
        clip_c = _cycle(i // 2, [None, 3.0])
        delta = _cycle(i // 5, [None, None, 2.5])
        lrc = _cycle(i // 4, [None, 20.0])
        params = dict(clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, delta=delta,
                      log_ratio_clamp=lrc)
        if _level(i) != "token":
            params["level"] = _level(i)
        edges = _ratio_edges(clip_low, clip_high, clip_c)
        if delta is not None:
            edges.append(math.log(delta))
    elif loss == "vespo":
        # φ(w) is detached and held frozen: its clamps are not kinks of the objective
        lrc = _cycle(i // 4, [20.0, None])
        params = dict(k_pos=_cycle(i, [2.0, 1.0]), lambda_pos=_cycle(i // 2, [3.0, 1.0]),
                      k_neg=_cycle(i // 3, [3.0, 2.0]), lambda_neg=_cycle(i, [2.0, 1.0, 0.5]),
                      log_ratio_clamp=lrc)
        edges = []
        lrc = None
    elif loss == "sapo":
        # smooth in the ratio: its only kinks are the log-ratio clamp's edges
        lrc = _cycle(i // 4, [None, 20.0])
        params = dict(tau_pos=_cycle(i, [1.0, 0.5, 2.0]), tau_neg=_cycle(i // 3, [1.05, 1.5, 0.8]),
                      log_ratio_clamp=lrc, level=_cycle(i // 2, ["token", "sequence"]))
        edges = []
    else:
        bound = _cycle(i, ["absolute", "relative"])
        lrc = _cycle(i // 4, [None, 20.0])
        if bound == "absolute":
            params = dict(clip_high=_cycle(i // 2, [5.0, 2.0, math.inf]), clip_low=None,
                          bound=bound, log_ratio_clamp=lrc)
        else:
            params = dict(clip_high=_cycle(i // 2, [0.28, 4.0]),
                          clip_low=_cycle(i // 3, [None, 0.2, 1.0]), bound=bound,
                          log_ratio_clamp=lrc)
        if i >= DEFAULT_CASES and _level(i) != "token":
            params["level"] = _level(i)
        edges = []
    if lrc is not None:
        edges += [-lrc, lrc]
    case = _token_case(rng, i, params, edges, m, kind, logp)
    if loss == "ppo" and params.get("level", "token") != "token":
        case = _level_kinks(case, edges)
    return case


def _level(i):
    """The ratio level of a PPO or CISPO case: the token ratio every other case, in between the
    sequence ratio, the two ratios' arithmetic and their geometric mean (ART's levels). A case
    at the token level does not name it (a user's function without `level` still runs there);
    CISPO's cases take the other levels from case DEFAULT_CASES on (its detached weight is
    checked on them by policy_objective's CISPO cases within the default twelve too)."""
    return "token" if i % 2 == 0 else _cycle(i // 2, RATIO_LEVELS[1:])


def _level_kinks(case, edges):
    """A PPO case at a mixed level: each token's ratio mixes its own log-ratio with its row's
    mean, so keeping the token log-ratios away from the clip edges does not keep the mixed
    ratio away. Where a valid token's mixed log-ratio lies within MARGIN of an edge, finite
    differences would straddle a kink: such a case is judged at the value and VJP stages
    only."""
    a, p = case.arrays, case.params
    m = a["mask"].astype(bool)
    with np.errstate(invalid="ignore"):                 # padding may hold NaN or inf
        rho = np.where(m, a["logp"] - a["old_logp"], 0.0)
    clamp = p.get("log_ratio_clamp")
    if clamp is not None:
        rho = np.clip(rho, -clamp, clamp)
    rho_bar = rho.sum(-1, keepdims=True) / np.maximum(m.sum(-1, keepdims=True), 1)
    x = {"token": rho, "sequence": np.broadcast_to(rho_bar, rho.shape),        # log r̃ by level
         "average": np.logaddexp(rho, rho_bar) - np.log(2.0),
         "geometric_average": (rho + rho_bar) / 2}[p["level"]][m]
    near = any(np.any(np.abs(x - e) < MARGIN) for e in edges)
    return dataclasses.replace(case, stages=("value", "vjp")) if near else case


def _token_case(rng, i, params, edges, m=None, kind=None, logp=None):
    """A per-token loss case: log-probs, log-ratios kept `MARGIN` from `edges`, advantages
    (per token or per sequence), a mask with garbage at its padding."""
    B, T = _shape(i, rng)
    if m is None:
        kind = _mask_kind(i)
        m = _mask(rng, B, T, kind)
        if _empty_micro_batch(i, B):
            m[: B // 2] = False
        logp = _logps(rng, (B, T))
    rho, extreme = _log_ratio(rng, (B, T), i, period=6)
    rho = away(rho, edges)
    old = logp - rho
    arrays = dict(logp=_garbage(logp, m, rng), old_logp=_garbage(old, m, rng),
                  advantages=_advantages(rng, B, T, i, m), mask=m)
    label = f"{kind} mask, " + ", ".join(f"{k}={v}" for k, v in params.items()) + \
        extreme + \
        _advantages_label(arrays, i) + \
        (", first half of the rows empty" if _empty_micro_batch(i, B) else "")
    return Case(label, arrays, params)


def ppo_clip_loss_case(rng, i):
    return _ratio_case(rng, i, "ppo")


def cispo_loss_case(rng, i):
    return _ratio_case(rng, i, "cispo")


def sapo_loss_case(rng, i):
    return _ratio_case(rng, i, "sapo")


def vespo_loss_case(rng, i):
    return _ratio_case(rng, i, "vespo")


def rollout_is_weights_case(rng, i):
    lower, upper = _cycle(i // 4, [(None, 2.0), (0.5, 2.0), (None, None), (0.8, 1.25)])
    params = dict(level=_cycle(i, ["token", "sequence"]), mode=_cycle(i // 2, ["truncate", "mask"]),
                  lower=lower, upper=upper, seq_stat=_cycle(i // 3, ["sum", "mean"]),
                  kept=_cycle(i // 5, ["unit", "token"]),
                  log_ratio_clamp=_cycle(i // 6, [None, 20.0]))
    base = _token_case(rng, i, params, [])
    arrays = dict(logp=base.arrays["logp"], rollout_logp=base.arrays["old_logp"],
                  mask=base.arrays["mask"])
    return Case(base.label.split(", advantages")[0], arrays, params, stages=("value",))


def fipo_influence_weights_case(rng, i):
    """A ratio case under FIPO's conventions: half-lives from γ ≈ 0 to γ = 1, the weight's
    bounds one-sided (ms-swift), symmetric (the paper) or open, the two ratio thresholds on and
    off, log-ratios kept away from both thresholds (comparisons a trainer makes in its own
    arithmetic); values only (the weight is detached)."""
    lower, upper = _cycle(i // 2, [(1.0, 1.2), (0.8, 1.2), (None, None), (0.5, math.inf)])
    if i % 6 == 4 and upper in (None, math.inf):    # extreme log-ratios: e^F near overflow
        lower, upper = 0.8, 1.2
    params = dict(decay_rate=_cycle(i, [32.0, 1.0, 1e-3, math.inf, 4.0]), lower=lower,
                  upper=upper, ratio_threshold=_cycle(i // 3, [None, 10.0, 1.5]),
                  safety_threshold=_cycle(i // 4, [4.0, None, 1.3]))
    edges = [math.log(v) for v in (params["ratio_threshold"], params["safety_threshold"])
             if v is not None]
    return dataclasses.replace(_token_case(rng, i, params, edges), stages=("value",))


def shaped_advantages_case(rng, i):
    """A token case with a reference policy: Kimi's τ alone, the centred k1 alone, and both."""
    tau, kl_coef = _cycle(i, [(0.5, 0.0), (0.0, 1.0), (0.1, 0.3), (2.0, 0.05)])
    params = dict(tau=tau, kl_coef=kl_coef)
    base = _token_case(rng, i, params, [])
    m = base.arrays["mask"]
    ref = _garbage(_logps(rng, m.shape), m, rng)
    return dataclasses.replace(base, arrays=dict(base.arrays, ref_logp=ref))


def decoupled_ppo_loss_case(rng, i):
    """A PPO case around the proximal policy (logp against old_logp, read as prox_logp), and
    behaviour log-probs whose weight π_prox/π_behave (per token, or a row's geometric mean or
    product) stays away from the bounds: an audited trainer forms it in its own arithmetic."""
    base = _ratio_case(rng, i, "ppo")
    level = _cycle(i, ["token", "sequence", None])
    lower, upper = _cycle(i // 3, [(None, None), (None, 5.0), (0.5, 2.0), (None, 1.5)])
    params = dict(clip_low=base.params["clip_low"], clip_high=base.params["clip_high"],
                  clip_c=base.params["clip_c"], is_level=level,
                  is_mode=_cycle(i // 2, ["mask", "truncate"]), is_lower=lower, is_upper=upper,
                  is_seq_stat=_cycle(i // 4, ["mean", "sum"]))
    m = base.arrays["mask"]
    prox = np.where(m, base.arrays["old_logp"], 0.0)
    edges = [math.log(b) for b in (lower, upper) if b is not None]
    y = away(rng.normal(0.0, 0.5, size=prox.shape), edges)     # log π_prox − log π_behave
    if level == "sequence":       # a row's statistic away from the edges: shift the row
        n = np.maximum(m.sum(axis=-1, keepdims=True), 1)
        stat = np.where(m, y, 0.0).sum(axis=-1, keepdims=True)
        if params["is_seq_stat"] == "mean":
            stat = stat / n
        moved = away(stat, edges)
        y = y + (moved - stat) / (n if params["is_seq_stat"] == "sum" else 1.0)
    arrays = dict(logp=base.arrays["logp"], prox_logp=base.arrays["old_logp"],
                  behave_logp=_garbage(prox - y, m, rng), advantages=base.arrays["advantages"],
                  mask=m)
    label = base.label.split(", clip_low")[0] + ", " + \
        ", ".join(f"{k}={v}" for k, v in params.items())
    return Case(label, arrays, params)


def opsm_drift(logp, old_logp, mask):
    """Each row's mean log(π_old/π) over its valid tokens (OPSM's D), [B, 1]."""
    m = np.asarray(mask, dtype=bool)
    with np.errstate(invalid="ignore"):        # garbage at padding is never read
        d = np.where(m, np.asarray(old_logp, dtype=np.float64) -
                     np.asarray(logp, dtype=np.float64), 0.0)
    return d.sum(axis=-1, keepdims=True) / np.maximum(m.sum(axis=-1, keepdims=True), 1)


def opsm_mask_case(rng, i):
    """A ratio case with δ between two rows' drifts (some rows over it, some under), or
    slime's 1e-4, or 0; values only (a mask is not differentiated)."""
    base = _token_case(rng, i, {}, [])
    a = base.arrays
    drift = np.sort(opsm_drift(a["logp"], a["old_logp"], a["mask"]).ravel())
    choice = _cycle(i, ["between", 1e-4, 0.0])
    if choice == "between" and drift.size >= 2:
        k = drift.size // 2
        delta = float(0.5 * (drift[k - 1] + drift[k]))
    else:
        delta = 1e-4 if choice == "between" else choice
    a, near = dict(a), ""
    if choice == 1e-4 and i >= DEFAULT_CASES and "extreme" not in base.label:
        # from case DEFAULT_CASES on, slime's small δ with rows whose drift sits near it: D =
        # 0.2·δ (under δ, over 0) or 3·δ, each 8e-5 or more from δ, outside the rounding band
        # in which the registry leaves a row undecided (opsm's `ambiguous`)
        m = a["mask"]
        rows = np.flatnonzero(m.any(axis=1))
        chosen = rows[rng.random(rows.size) < 0.6]
        if chosen.size:
            d = opsm_drift(a["logp"], a["old_logp"], m).ravel()
            target = np.where(rng.random(chosen.size) < 0.5, 0.2 * delta, 3.0 * delta)
            shift = np.zeros(m.shape[0])
            shift[chosen] = target - d[chosen]
            a["old_logp"] = np.where(m, a["old_logp"] + shift[:, None], a["old_logp"])
            near = ", drifts near delta"
    params = dict(delta=delta)
    label = base.label.rstrip(", ") + f", delta={delta:.4g}" + near
    return Case(label, a, params, stages=("value",))


def tv_filter_mask_case(rng, i):
    """A ratio case with bounds on the mean |ρ − 1| between two rows' drifts (some rows out,
    some in), or open-instruct's shape of configuration (an upper bound above 1, a lower bound
    below the smallest drift), or none; log-ratios clipped to ±10 in a third of the cases;
    values only (a mask is not differentiated)."""
    clamp = _cycle(i // 2, [None, 10.0, None])
    base = _token_case(rng, i, {}, [])
    a = base.arrays
    drift = np.sort(ref_numpy.pg_losses.tv_drift(a["logp"], a["old_logp"], a["mask"],
                                                   clamp).ravel())
    choice = _cycle(i, ["upper", "both", "lower", "none"])
    lower = upper = None
    if drift.size >= 2:
        k = drift.size // 2
        mid = float(0.5 * (drift[k - 1] + drift[k]))
        if choice == "upper":
            upper = mid
        elif choice == "lower":
            lower = mid
        elif choice == "both":
            lower, upper = 0.5 * float(drift[0]) if drift[0] > 0 else None, max(mid, 1.0 + 1e-3)
    params = dict(lower=lower, upper=upper, log_ratio_clamp=clamp)
    return Case(base.label.rstrip(", ") + ", " + ", ".join(f"{k}={v}" for k, v in
                                                           params.items()),
                a, params, stages=("value",))


def ratio_kl_penalty_case(rng, i):
    """kl_penalty's case (estimators, clamps kept off their edges) with the sampling policy's
    log-probs: old_logp = logp − u, u ordinary (N(0, 0.3)) or, once every 6 cases, ±2..8."""
    base = kl_penalty_case(rng, i)
    a = dict(base.arrays)
    m = a["mask"]
    logp = np.where(m, a["logp"], 0.0)
    u = rng.normal(0.0, 0.3, m.shape) if i % 6 != 4 else \
        rng.choice([-1, 1], size=m.shape) * rng.uniform(2.0, 8.0, size=m.shape)
    a["old_logp"] = _garbage(logp - u, m, rng)
    # r·e^x = e^(ref − old) does not depend on logp, but at an extreme x its round-off swamps
    # the small derivative r·(−x) of r·k3: finite differences cannot judge such a case, the
    # hand VJP is checked against autograd there
    stages = ("value", "vjp") if "extreme" in base.label else ALL_STAGES
    return Case(base.label + (", large token ratios" if i % 6 == 4 else ""),
                dict(logp=a["logp"], old_logp=a["old_logp"], ref_logp=a["ref_logp"], mask=m),
                base.params, stages=stages)


def m2po_mask_case(rng, i):
    """Log-ratios with a few large ones (stale tokens), τ of 0.04 (the paper's), 0.01 or one
    no mask reaches (every token but one dropped); values only."""
    base = _token_case(rng, i, {}, [])
    a = base.arrays
    m = a["mask"]
    threshold = _cycle(i, [0.04, 0.01, 1e-9])
    stale = rng.random(m.shape) < 0.2
    rho = np.where(stale, rng.normal(0.0, 1.0, m.shape), rng.normal(0.0, 0.05, m.shape))
    arrays = dict(logp=a["logp"], old_logp=_garbage(np.where(m, a["logp"], 0.0) - rho, m, rng),
                  mask=m)
    return Case(base.label.rstrip(", ") + f", threshold={threshold}", arrays,
                dict(threshold=threshold), stages=("value",))


def reinforce_loss_case(rng, i):
    level = _cycle(i, [None, "token", "sequence"])
    params = dict(beta=0.5 if level is None and i % 2 == 0 else 0.0, is_level=level,
                  is_mode=_cycle(i // 3, ["truncate", "mask"]),
                  is_lower=_cycle(i // 2, [None, 0.5]),
                  is_upper=_cycle(i // 4, [2.0, 1.5, math.inf]),
                  is_log_ratio_clamp=_cycle(i // 5, [20.0, None]))
    return _token_case(rng, i, params, [])


def dppo_loss_case(rng, i):
    """Probabilities q and p = q + d kept inside (0, 1), d away from the trust region's edges
    (the region's indicator is constant between them)."""
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    divergence = _cycle(i, ["tv", "kl"])
    lo, hi = _cycle(i // 2, [(0.2, None), (0.1, 0.28), (0.05, 0.05)])
    params = dict(divergence=divergence, clip_low=lo, clip_high=hi,
                  clip_c=_cycle(i // 3, [20.0, None, 2.0]),
                  log_ratio_clamp=_cycle(i // 4, [20.0, None]),
                  kl_eps=_cycle(i // 5, [0.0, 1e-8]), form=_cycle(i // 7, ["logp", "ratio"]))
    hi = lo if hi is None else hi
    q = rng.uniform(0.05, 0.95, size=(B, T))
    d = away(rng.normal(0.0, 0.15, size=(B, T)), [hi, -lo])
    p = np.clip(q + d, 0.01, 0.99)
    if divergence == "kl":        # the binary KL's edges: move p to q where D is near δ
        D = q * np.log(q / p) + (1 - q) * np.log((1 - q) / (1 - p))
        near = (np.abs(D - lo) < 0.1 * lo) | (np.abs(D - hi) < 0.1 * hi)
        p = np.where(near, q, p)
    if params["clip_c"] is not None:
        # form "ratio"'s attached min(r, C) bends at r = C (policy_objective may set that form
        # on these arrays): move p to q where log r is near log C
        p = np.where(np.abs(np.log(p / q) - math.log(params["clip_c"])) < 0.05, q, p)
    lp, old = np.log(p), np.log(q)
    extreme = i >= DEFAULT_CASES and i % 4 == 3
    if extreme:
        # from case DEFAULT_CASES on, a quarter of the cases keep tokens with |log r| > 20, past
        # the usual log-ratio clamp: p tiny (logp −30..−60, log r < −20), or q tiny (log r
        # 21..30) with p 0.005..0.025, inside every region (p − q, and the binary KL ≈ p, stay
        # under the smallest δ 0.05 by more than MARGIN)
        pick = rng.random((B, T))
        low, high = pick < 0.2, (pick >= 0.2) & (pick < 0.4)
        lp = np.where(low, -rng.uniform(30.0, 60.0, (B, T)), lp)
        p_high = rng.uniform(0.005, 0.025, (B, T))
        old = np.where(low, np.minimum(old, -0.05), old)
        lp = np.where(high, np.log(p_high), lp)
        old = np.where(high, np.log(p_high) - rng.uniform(21.0, 30.0, (B, T)), old)
    arrays = dict(logp=_garbage(lp, m, rng), old_logp=_garbage(old, m, rng),
                  advantages=_advantages(rng, B, T, i, m), mask=m)
    label = f"{kind} mask, " + ", ".join(f"{k}={v}" for k, v in params.items()) + \
        (", extreme log-ratios |log r| > 20 kept" if extreme else "") + \
        _advantages_label(arrays, i)
    return Case(label, arrays, params)


def gmpo_loss_case(rng, i):
    lo = _cycle(i, [0.2, 0.4, 0.1])
    hi = _cycle(i // 3, [None, 0.3])
    params = dict(clip_low=lo, clip_high=hi, eps=_cycle(i // 2, [0.0, 1e-8]))
    case = _token_case(rng, i, params, [-lo, lo if hi is None else hi])
    if _large_sequence_ratio(i):                   # every token of a row clipped one way
        B = case.arrays["logp"].shape[0]
        shift = rng.choice([-1.0, 1.0], size=(B, 1)) * rng.uniform(10.0, 30.0, size=(B, 1))
        case.arrays["old_logp"] = case.arrays["old_logp"] - shift
        case = Case(case.label + ", sequence log-ratios ±10..30", case.arrays, case.params)
    return case


def kl_cov_loss_case(rng, i):
    """Log-ratios away from 0 (|·|'s kink), and the k-th and (k+1)-th largest covariance terms
    apart (the selection is constant under finite-difference steps)."""
    params = dict(ratio=_cycle(i, [2e-4, 0.1, 0.3]), coef=_cycle(i // 3, [1.0, 0.5]))
    for attempt in range(50):
        case = _token_case(rng, i, params, [0.0])
        lp, adv, m = (case.arrays[k] for k in ("logp", "advantages", "mask"))
        if adv.shape != lp.shape:                   # one advantage per sequence
            adv = np.repeat(adv[:, None], lp.shape[1], axis=1)
        m = m.astype(bool)
        if m.sum() < 2 or _kl_cov_apart(lp, adv, m, params["ratio"]):
            break
        # Many tokens pack the covariances densely: open the gap instead of drawing again.
        # The unselected tokens' log-probs move halfway to their mean (a convex combination,
        # so still ≤ 0), their covariance terms with them; old_logp moves alike, so every
        # log-ratio, and its distance from |·|'s kink, is kept.
        a, l = adv[m], lp[m]
        cov = (a - a.mean()) * (l - l.mean())
        k = kl_cov_ranking(lp, adv, m, params["ratio"])[1]
        rest = np.argsort(-cov, kind="stable")[k:]
        step = np.zeros(l.shape)
        step[rest] = 0.5 * (l.mean() - l[rest])
        shift = np.zeros(lp.shape)
        shift[m] = step
        moved = dict(case.arrays, logp=lp + shift, old_logp=case.arrays["old_logp"] + shift)
        if _kl_cov_apart(moved["logp"], adv, m, params["ratio"]):
            return Case(case.label, moved, case.params)
    return case


def _kl_cov_apart(lp, adv, m, ratio) -> bool:
    """The k-th and (k+1)-th largest covariance terms far apart, compared with how much a
    finite-difference step moves them: the selection is constant under those steps."""
    cov, k = kl_cov_ranking(lp, adv, m, ratio)
    return k >= len(cov) or cov[k - 1] - cov[k] > 0.05 * (1 + abs(cov[k - 1]))


def kl_cov_ranking(lp, adv, m, ratio):
    """KL-Cov's covariance terms (A − Ā)(logp − mean logp) over the valid tokens, largest
    first, and the number k = max(1, ⌊N·ratio⌋) it penalises (adv already [B, T])."""
    a, l = adv[m], lp[m]
    return np.sort((a - a.mean()) * (l - l.mean()))[::-1], max(1, int(len(a) * ratio))


def entropy_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    V = _cycle(i, [2, 5, 17, 3])
    spread = _cycle(i // 2, [1.0, 3.0, 10.0])
    offset = _cycle(i // 3, [0.0, 50.0])
    z = offset + rng.normal(0.0, spread, size=(B, T, V))
    arrays = dict(logits=_garbage(z, np.broadcast_to(m[..., None], z.shape), rng), mask=m)
    return Case(f"{kind} mask, V={V}, logits ~ {offset:g} + N(0, {spread:g}²)", arrays, {})


def _bisect(f, lo, hi):
    """The root of f in [lo, hi] (f changes sign there) to float precision. Written here
    because importing scipy.optimize for it would cost the default run 0.4 s."""
    flo = f(lo)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if (f(mid) > 0) == (flo > 0):
            lo, flo = mid, f(mid)
        else:
            hi = mid
    return lo


def _kl_edges(kind, clamp):
    """Log-ratio values x = ref − logp where kl_penalty's clamps bind (its kinks)."""
    if clamp is None:
        return [0.0] if kind == "abs" else []
    in_b, out_b = clamp
    edges = [] if in_b is None else [-in_b, in_b]
    if out_b is not None:
        if kind == "k2":
            edges += [-math.sqrt(2 * out_b), math.sqrt(2 * out_b)]
        elif kind == "k3":
            edges += [_bisect(lambda x: math.expm1(x) - x - out_b, lo, hi)
                      for lo, hi in ((-out_b - 2, 0.0), (0.0, math.log(out_b + 2) + 1))]
        else:
            edges += [-out_b, out_b]
    return edges + ([0.0] if kind == "abs" else [])


def kl_rewards_case(rng, i):
    kind = _cycle(i // 2, ["k1", "k2", "k3", "abs"])
    clamp = _cycle(i // 4, [None, (20.0, 10.0)])
    params = dict(beta=_cycle(i, [0.05, 0.1, 1.0]), kind=kind, clamp=clamp)
    base = _token_case(rng, i, params, [-e for e in _kl_edges(kind, clamp)])
    B, T = base.shape()
    m = base.arrays["mask"]
    if i % 3 == 1 and B > 0:                       # one score per sequence, at its last token
        scores = rng.normal(size=B)
        scores[~m.any(axis=1)] = np.nan
        label = ", a score per sequence"
    else:
        scores = _garbage(rng.normal(size=(B, T)) * (rng.random((B, T)) < 0.3), m, rng)
        label = ", sparse token scores"
    arrays = dict(scores=scores, logp=base.arrays["logp"], ref_logp=base.arrays["old_logp"],
                  mask=m)
    return Case(base.label.split(", advantages")[0] + label, arrays, params)


def _grouped_rewards(rng, i, singleton=True):
    """Continuous rewards [B] in groups (no ties, no exact zero), as consecutive blocks
    (group_size) or shuffled group_ids of unequal sizes with, where `singleton`, a group of one
    (without, every group has two or more)."""
    G = _cycle(i, [4, 3, 2, 5])
    P = _cycle(i // 2, [2, 3, 1, 4])
    r = rng.normal(size=P * G)
    if i % 2 == 0:
        return dict(rewards=r), dict(group_size=G), f"group_size={G}, B={P * G}"
    ids = _unequal_ids(P, G, least=1 if singleton else 2)
    if singleton:
        ids = np.concatenate([ids, [P + 7]])
    r = rng.normal(size=ids.size)
    perm = rng.permutation(ids.size)
    return (dict(rewards=r[perm], group_ids=ids[perm] * 3 + 1), {},
            f"shuffled group_ids, group sizes {np.bincount(ids).tolist()}, B={ids.size}")


def opo_advantages_case(rng, i):
    arrays, params, label = _grouped_rewards(rng, i)
    B = arrays["rewards"].size
    short = i % 3 == 2                              # equal lengths: the group-mean baseline
    arrays["lengths"] = np.full(B, 7) if short else rng.integers(1, 40, size=B)
    return Case(label + (", equal lengths" if short else ""), arrays, params)


def gpg_advantages_case(rng, i):
    arrays, params, label = _grouped_rewards(rng, i)
    params["f_norm"] = _cycle(i // 3, [1.0, 2.0])
    stages = ALL_STAGES
    if i % 4 == 3:                                  # zero rewards: α's count (a kink at 0)
        r = arrays["rewards"]
        r[rng.random(r.size) < 0.5] = 0.0
        stages, label = ("value", "vjp"), label + ", half the rewards exactly 0"
    return Case(label + f", f_norm={params['f_norm']}", arrays, params, stages=stages)


def passk_advantages_case(rng, i):
    arrays, params, label = _grouped_rewards(rng, i, singleton=False)
    params.update(eps=_cycle(i // 2, [1e-6, 0.0, 1e-2]), scale=_cycle(i // 3, ["group", "none"]))
    r = arrays["rewards"]                           # the top two of each group apart
    arrays["rewards"] = np.round(r, 1) + 0.001 * rng.permutation(r.size)
    return Case(label + f", eps={params['eps']}, scale={params['scale']}", arrays, params)


def remax_advantages_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    r = rng.normal(size=(B, T)) * (rng.random((B, T)) < _cycle(i, [0.3, 1.0]))
    arrays = dict(rewards=_garbage(r, m, rng), baselines=rng.normal(size=B), mask=m)
    return Case(f"{kind} mask", arrays, {})


def whitened_group_advantages_case(rng, i):
    arrays, params, label = _grouped_rewards(rng, i)
    B = arrays["rewards"].size
    T = _cycle(i, [5, 1, 8, 3])
    kind = _cycle(i // 2, ["ragged", "full", "holed"])
    m = _mask(rng, B, T, kind)
    m[-1, 0] = True                                 # at least two valid tokens in the batch
    m[0, 0] = True
    params.update(scale=_cycle(i // 3, ["none", "group"]), eps=_cycle(i, [1e-6, 1e-4]),
                  whiten_eps=_cycle(i // 4, [1e-8, 1e-6]))
    arrays["mask"] = m
    return Case(f"{label}, {kind} mask T={T}, scale={params['scale']}", arrays, params)


def optimal_token_baseline_advantages_case(rng, i):
    G = _cycle(i, [4, 3, 2])
    P = _cycle(i // 2, [2, 1, 3])
    B, T = P * G, _cycle(i, [6, 1, 9, 4])
    kind = _cycle(i // 3, ["ragged", "full", "holed"])
    m = _mask(rng, B, T, kind)
    pi = rng.uniform(0.05, 0.95, size=(B, T))
    sq = pi ** 2 + rng.uniform(0.0, 1.0, size=(B, T)) * (1 - pi) ** 2     # Σπ² given π
    r = rng.normal(size=(B, T)) * (rng.random((B, T)) < 0.4)
    params = dict(zero_tail=_cycle(i // 2, [True, False]), eps=_cycle(i, [1e-8, 1e-6]))
    arrays = dict(rewards=_garbage(r, m, rng), old_logp=_garbage(np.log(pi), m, rng),
                  sum_pi_squared=_garbage(sq, m, rng), mask=m)
    label = f"{kind} mask"
    if i % 2 == 0:
        params["group_size"] = G
        label += f", group_size={G}"
    else:
        ids = np.repeat(np.arange(P), G)
        ids[-1] = P + 5                                  # a group of one
        perm = rng.permutation(B)
        arrays = {k: v[perm] for k, v in arrays.items()}
        arrays["group_ids"] = ids[perm]
        label += ", shuffled group_ids with a singleton"
    return Case(label + f", zero_tail={params['zero_tail']}", arrays, params)


def value_loss_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    clip = _cycle(i, [0.2, 0.5, None])
    old = rng.normal(size=(B, T))
    d = rng.normal(0.0, 0.4, size=(B, T))
    R = rng.normal(size=(B, T))
    if clip is not None:
        d = away(d, [-clip, clip])
        for _ in range(6):          # keep |v_clip − R| and |v − R| apart (the max's kink)
            e1 = np.abs(old + d - R)
            e2 = np.abs(old + np.clip(d, -clip, clip) - R)
            tie = (np.abs(d) > clip) & (np.abs(e1 - e2) < MARGIN)
            R = np.where(tie, R + 5 * MARGIN, R)
    arrays = dict(values=_garbage(old + d, m, rng), old_values=_garbage(old, m, rng),
                  returns=_garbage(R, m, rng), mask=m)
    return Case(f"{kind} mask, clip={clip}", arrays, dict(clip=clip))


def kl_penalty_case(rng, i):
    B, T = _shape(i, rng)
    kind_m = _mask_kind(i)
    m = _mask(rng, B, T, kind_m)
    kind = _cycle(i, ["k1", "k2", "k3", "abs"])
    clamp = _cycle(i // 3, [None, (20.0, 10.0), (None, 10.0), (1.0, None)])
    logp = _logps(rng, (B, T))
    x, extreme = _log_ratio(rng, (B, T), i, period=5, sd=0.8)
    edges = [0.0] if kind == "abs" else []
    if clamp is not None and clamp[0] is not None:
        edges += [-clamp[0], clamp[0]]
    x = away(x, edges)
    if clamp is not None and clamp[1] is not None:   # keep the estimate off the output bound
        xi = x if clamp[0] is None else np.clip(x, -clamp[0], clamp[0])
        est = ref_numpy.kl_penalty(np.zeros_like(xi), xi, kind=kind)
        x = np.where(np.abs(np.abs(est) - clamp[1]) < MARGIN * 10, x * 0.5, x)
    ref = logp + x
    arrays = dict(logp=_garbage(logp, m, rng), ref_logp=_garbage(ref, m, rng), mask=m)
    return Case(f"{kind_m} mask, kind={kind}, clamp={clamp}" + extreme, arrays,
                dict(kind=kind, clamp=clamp))


def aggregate_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i) if i % 4 else "ragged"
    m = _mask(rng, B, T, kind)
    if _empty_micro_batch(i, B):
        m[: B // 2] = False
    # every fifth case is a prompt mean, over consecutive groups of rows or shuffled group ids
    mode = GROUPED_AGG_MODES[0] if i % 5 == 4 else _cycle(i, AGG_MODES)
    params = dict(mode=mode, norm=None, empty_rows=_cycle(i // 4, ["exclude", "include"]))
    # every case carries the rows' prompts (only the grouped mode reads them)
    ids = None
    size = next(g for g in (3, 2, 1) if B % g == 0)
    if i % 2 == 0:
        params["group_size"] = size
    else:
        ids = rng.permutation(np.arange(B) // size) * 5 + 2
    if mode == "seq-mean-token-sum-norm" and i % 8 >= 4:
        params["norm"] = 5.0
    if mode == "seq-mean-token-sum" and i % 8 >= 4:       # TRL's dr_grpo, verl 0.9's -norm
        params["norm"] = 3.0
    arrays = dict(loss=_garbage(rng.normal(size=(B, T)), m, rng), mask=m)
    if ids is not None:
        arrays["group_ids"] = ids
    return Case(f"{kind} mask, " + ", ".join(f"{k}={v}" for k, v in params.items()) +
                (", shuffled group_ids" if ids is not None else "") +
                (", first half of the rows empty" if _empty_micro_batch(i, B) else ""), arrays,
                params)


def kl_clamp_edges(kind, in_bound, out_bound):
    """The log-ratios x = log(ref/π) where kl_penalty's clamps start to bind: ±in_bound, and
    where |k(x)| = out_bound (k1, abs: ±out; k2: ±√(2·out); k3: the two roots of
    e^x − 1 − x = out), within the input clamp."""
    from scipy.optimize import brentq

    from ref_numpy.kl import k_estimator
    edges = [-in_bound, in_bound]
    f = lambda x: float(np.abs(k_estimator(kind, np.array(x))[0])) - out_bound  # noqa: E731
    for lo, hi in ((-in_bound, 0.0), (0.0, in_bound)):
        if f(lo if lo else hi) > 0 > f(0.0):
            edges.append(brentq(f, lo, hi))
    return edges


def policy_objective_case(rng, i):
    # every twelfth case is DPPO's (in VESPO's second slot of twelve), with the KL to the
    # sampling policy (prime-rl's default loss)
    loss = "dppo" if i % 12 == 9 else _cycle(i, ["ppo", "cispo", "gspo", "sapo", "vespo"])
    # GSPO's form alternates with its case index: i // 5 gives both forms within the default 12
    if loss == "dppo":
        base = dppo_loss_case(rng, i // 3)
    elif loss == "gspo":
        base = gspo_loss_case(rng, i // 5)
    else:
        base = _ratio_case(rng, i // 3, loss)
    B, T = base.shape()
    m = base.arrays["mask"]
    empty = _empty_micro_batch(i, B) and "rows empty" not in base.label
    if empty:
        m = m.copy()
        m[: B // 2] = False
    agg = _cycle(i // 2, (AGG_MODES[1], AGG_MODES[0]) + AGG_MODES[2:])   # per-sequence first
    if i % 12 in (5, 10):     # a prompt mean: consecutive groups of rows, or shuffled ids
        agg = GROUPED_AGG_MODES[0]
    beta = _cycle(i // 3, [0.0, 0.04, 0.1])
    kl_kind = _cycle(i, ["k3", "k1", "k2", "abs"])
    ref = _logps(rng, (B, T))
    if kl_kind == "abs":
        lp = np.where(m, base.arrays["logp"], 0.0)
        ref = lp + away(ref - lp, [0.0])
    arrays = dict(base.arrays, ref_logp=_garbage(ref, m, rng), mask=m)
    params = dict(base.params, loss=loss, agg=agg, beta=beta, kl_kind=kl_kind)
    if agg in GROUPED_AGG_MODES:
        size = next(g for g in (3, 2, 1) if B % g == 0)
        if i % 12 == 5:
            params["group_size"] = size
        else:
            arrays["group_ids"] = rng.permutation(np.arange(B) // size) * 5 + 2
    if loss == "dppo":          # the KL to the sampling policy: logp = old_logp can happen in
        # DPPO's cases (p moved to q off a region's edge), a kink of "abs" there
        params.update(beta=0.1, kl_kind=_cycle(i // 12, ["k2", "k3", "k1"]), kl_anchor="old",
                      form=_cycle(i // 12, ["ratio", "logp"]))
    elif loss == "cispo" and beta and i % 12 == 6:   # a frozen ratio beside the KL to old_logp
        params["kl_anchor"] = "old"
    # TRL's use_bias_correction_kl: the KL term times r (DPPO's cases: every other one)
    if params["beta"] and (i // 12 if loss == "dppo" else i) % 2:
        params["kl_weight"] = "ratio"
    elif params["beta"] and loss in ("ppo", "sapo"):
        # NeMo-RL's score weight exp(logp − sg(logp)), with its clamps (20, 10) every other
        # time: log-ratios spread wide (some clamped), away from both clamps' edges
        params["kl_weight"] = "score"
        if i % 4 < 2:
            params["kl_clamp"] = (20.0, 10.0)
            lp = np.where(m, base.arrays["logp"], 0.0)
            x = away(rng.normal(0.0, 4.0, size=lp.shape), kl_clamp_edges(kl_kind, 20.0, 10.0))
            arrays["ref_logp"] = _garbage(lp + x, m, rng)
    # ART's advantage shaping (Kimi's τ and a KL folded in as a centred k1) on a PPO or CISPO
    # case without a KL term of its own
    if loss in ("ppo", "cispo") and not params["beta"] and i % 4 in (0, 1):
        params.update(adv_tau=_cycle(i // 4, [0.1, 0.0, 0.5]),
                      adv_kl=_cycle(i // 8, [0.0, 0.3, 1.0]))
        if not params["adv_tau"] and not params["adv_kl"]:
            params["adv_kl"] = 0.5
    # An extreme token's loss (up to |A|·e^30) sums into the same scalar as every other token's,
    # so the objective's round-off swamps small gradients: finite differences cannot judge such
    # a case (the per-token losses, whose Jacobian is diagonal, are checked on extremes instead).
    stages = ("value", "vjp") if "extreme" in base.label or "fd" not in base.stages \
        else ALL_STAGES
    weight = f", kl_weight={params['kl_weight']}" if params.get("kl_weight") else ""
    weight += f", kl_clamp={params['kl_clamp']}" if params.get("kl_clamp") else ""
    weight += ", kl_anchor=old" if params.get("kl_anchor") == "old" else ""
    weight += f", group_size={params['group_size']}" if "group_size" in params else ""
    weight += ", shuffled group_ids" if "group_ids" in arrays else ""
    weight += "".join(f", {k}={params[k]}" for k in ("adv_tau", "adv_kl") if params.get(k))
    return Case(f"loss={loss}, agg={agg}, beta={params['beta']}, kl_kind={params['kl_kind']}"
                f"{weight}; " + base.label +
                (", first half of the rows empty" if empty else ""),
                arrays, params, stages=stages)


def gspo_loss_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    form = _cycle(i, ["token", "sequence"])
    clip_low, clip_high = _cycle(i // 2, [(3e-4, 4e-4), (0.2, 0.2), (0.2, 0.28)])
    cap = _cycle(i // 3, [None, 10.0])
    # a row's mean log-ratio decides its clip branch: draw it away from both clip edges, then
    # spread the token log-ratios around it with exactly that mean over the valid tokens
    rho_bar = away(rng.normal(0.0, 0.3, size=(B, 1)),
                    [math.log(1 - clip_low), math.log(1 + clip_high)])
    large = _large_sequence_ratio(i)
    if large:
        rho_bar = rng.choice([-1.0, 1.0], size=(B, 1)) * rng.uniform(10.0, 30.0, size=(B, 1))
    noise = rng.normal(0.0, 0.4, size=(B, T))
    L = np.maximum(m.sum(axis=1, keepdims=True), 1)
    noise -= np.where(m, noise, 0.0).sum(axis=1, keepdims=True) / L
    logp = _logps(rng, (B, T))
    old = logp - (rho_bar + noise)
    params = dict(clip_low=clip_low, clip_high=clip_high, form=form, log_ratio_max=cap)
    arrays = dict(logp=_garbage(logp, m, rng), old_logp=_garbage(old, m, rng),
                  advantages=_advantages(rng, B, T, i, m), mask=m)
    return Case(f"{kind} mask, " + ", ".join(f"{k}={v}" for k, v in params.items()) +
                _advantages_label(arrays, i) +
                (", sequence log-ratios ±10..30" if large else ""), arrays, params)


def discounted_returns_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    gamma = _cycle(i, [0.99, 1.0, 0.5, 0.0])
    return Case(f"{kind} mask, γ={gamma}",
                dict(rewards=_garbage(rng.normal(size=(B, T)), m, rng), mask=m), dict(gamma=gamma))


def approx_kl_case(rng, i):
    B, T = _shape(i, rng)
    kind = _mask_kind(i)
    m = _mask(rng, B, T, kind)
    k = _cycle(i, ["k1", "k2", "k3"])
    logp = _logps(rng, (B, T))
    rho, extreme = _log_ratio(rng, (B, T), i, period=7)
    old = logp - rho
    return Case(f"{kind} mask, kind={k}" + extreme,
                dict(logp=_garbage(logp, m, rng), old_logp=_garbage(old, m, rng), mask=m),
                dict(kind=k))


def clip_fraction_case(rng, i):
    base = _ratio_case(rng, i, "ppo")
    params = dict(clip_low=base.params["clip_low"], clip_high=base.params["clip_high"],
                  definition=_cycle(i, ["loss", "sign", "ratio"]))
    return Case(f"definition={params['definition']}; " + base.label, base.arrays, params,
                stages=("value",))


SEED_P = np.array([0.5, 0.3, 0.15, 0.05])      # the seed's policy and reference (example 6)
SEED_Q = np.array([0.4, 0.4, 0.15, 0.05])


def _estimator_logits(rng, i):
    if i == 0:
        return np.log(SEED_P), np.log(SEED_Q), "the seed's p and q"
    V = _cycle(i, [3, 4, 2, 5, 7])
    spread = _cycle(i // 5, [0.5, 1.5, 3.0])
    return (rng.normal(0, spread, V), rng.normal(0, spread, V),
            f"V={V}, logits ~ N(0, {spread}²)")


def kl_estimator_moments_case(rng, i):
    z, zr, label = _estimator_logits(rng, i)
    kind = _cycle(i, ["k1", "k2", "k3"])
    return Case(f"{label}, kind={kind}", dict(logits=z, ref_logits=zr), dict(kind=kind))


def kl_estimator_gradient_case(rng, i):
    z, zr, label = _estimator_logits(rng, i)
    kind = _cycle(i, ["k1", "k2", "k3"])
    use = _cycle(i // 3, ["loss", "reward"])
    is_weight = _cycle(i // 2, [None, "detached", "attached"])
    off = i % 4 >= 2
    zs = z + rng.normal(0, 0.7, z.shape) if off else None
    return Case(f"{label}, kind={kind}, use={use}, is_weight={is_weight}" +
                (", samples from another policy" if off else ", on-policy"),
                dict(logits=z, ref_logits=zr, sample_logits=zs),
                dict(kind=kind, use=use, is_weight=is_weight))
