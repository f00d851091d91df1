"""One argument parser per equation: each twin validates a call in one line.

A twin passes an `Ops` object that answers questions about its own arrays (shape and kind, the
first entry of a mask that is not 0/1, the first non-finite valid entry, ...) and converts them
to what it computes with (float64 NumPy arrays; tensors left as they are). The parsers hold the
order of the checks and every message, so both twins refuse the same input with the same words.

Every parser returns a NamedTuple of validated values: arrays converted by the twin, masks as
booleans, hyper-parameters as Python numbers, and flags that the math needs (a per-sequence
advantage, say). Nothing here computes a result.
"""
import math
import numbers
from typing import Any, NamedTuple, Optional, Protocol, Tuple

from . import checks, vocab
from .checks import Spec


class Ops(Protocol):
    """What a twin tells the parsers about its arrays."""

    uniform: bool     # True: float inputs of one call must share one dtype and device (torch)

    def spec(self, name: str, x) -> Spec: ...               # raises TypeError for a non-array
    def floats(self, x): ...                                 # x as the twin computes with it
    def bad_mask_value(self, m): ...                         # first entry not 0/1, or None
    def as_mask(self, m): ...                                # a boolean array
    def all_valid(self, like): ...                           # an all-True mask shaped like `like`
    def rows_with_tokens(self, m): ...                       # [B] bool: rows with a valid token
    def count(self, m) -> int: ...                           # number of True entries
    def first_nonfinite(self, x, valid): ...                 # (index, value) or None
    def all_finite(self, x) -> bool: ...


# ====================================================================== shared pieces
def token(ops: Ops, name: str, x):
    """(Spec, array) of a float token array [B, T] or [T]."""
    s = ops.spec(name, x)
    checks.require_token(s)
    return s, ops.floats(x)


def like(ops: Ops, name: str, x, ref: Spec):
    """A float array with exactly `ref`'s shape (and, where the twin requires it, its dtype and
    device)."""
    s = ops.spec(name, x)
    checks.require_float(s)
    checks.same_shape(ref, s)
    if ops.uniform:
        checks.same_dtype(ref, s)
        checks.same_device(ref, s)
    return ops.floats(x)


def mask(ops: Ops, m, ref: Spec, ref_array, name: str = "mask"):
    """A boolean mask shaped like `ref`; None means every position is valid."""
    if m is None:
        return ops.all_valid(ref_array)
    s = ops.spec(name, m)
    checks.require_mask(s, ref)
    if ops.uniform:
        checks.same_device(ref, s)
    bad = ops.bad_mask_value(m)
    checks.mask_values(name, bad is None, bad)
    return ops.as_mask(m)


def finite(ops: Ops, name: str, x, valid) -> None:
    found = ops.first_nonfinite(x, valid)
    if found is not None:
        checks.finite_at_valid(name, *found)


def cotangent(ops: Ops, g, name: str, ref: Spec, ref_name: Optional[str] = None):
    """A VJP's cotangent `name` (g, g[0], ...): a float array shaped like the output."""
    return like(ops, name, g, ref._replace(name=ref_name or ref.name))


def scalar_cotangent(ops: Ops, g, fn: str) -> float:
    """The cotangent of a scalar-valued function: a float scalar (a 0-d array or a number)."""
    s = ops.spec("g", g)
    checks.require_float(s)
    if s.shape != ():
        raise ValueError(f"g has shape {s.shape}; {fn} returns a scalar, so g must be one")
    return float(g)


def policy_mask(mask_is_none: bool, fn: str) -> None:
    if mask_is_none:
        raise ValueError(f"mask is None; {fn} needs the [B, T] mask of valid tokens")


# ====================================================================== GAE, returns
class Gae(NamedTuple):
    rewards: Any
    values: Any
    mask: Any
    dones: Any          # boolean mask, or None
    last_value: Any     # float array [B] (or 0-d for [T] input), or None
    gamma: float
    lam: float


def gae(ops: Ops, rewards, values, mask_, gamma, lam, dones, last_value, *,
        check_finite: bool = True) -> Gae:
    """gae's inputs. With check_finite=False the twin checks finiteness itself (the torch twin
    folds it into a sum it computes anyway); the message is `finite`'s."""
    rs, r = token(ops, "rewards", rewards)
    v = like(ops, "values", values, rs)
    m = mask(ops, mask_, rs, r)
    gamma = checks.in_range("gamma", gamma, 0.0, 1.0)
    lam = checks.in_range("lam", lam, 0.0, 1.0)
    d = None if dones is None else mask(ops, dones, rs, r, name="dones")
    lv = None
    if last_value is not None:
        s = ops.spec("last_value", last_value)
        checks.require_float(s)
        lv = ops.floats(last_value)
        batch_shape = tuple(rs.shape[:-1])
        if tuple(s.shape) != batch_shape:
            raise ValueError(f"last_value has shape {tuple(s.shape)}; expected one value per "
                             f"sequence {batch_shape}")
        if not ops.all_finite(lv):
            raise ValueError("last_value holds NaN or inf; it bootstraps every row and must be "
                             "finite")
    if check_finite:
        finite(ops, "rewards", r, m)
        finite(ops, "values", v, m)
    return Gae(r, v, m, d, lv, gamma, lam)


class Returns(NamedTuple):
    rewards: Any
    mask: Any
    gamma: float


def discounted_returns(ops: Ops, rewards, mask_, gamma) -> Returns:
    rs, r = token(ops, "rewards", rewards)
    m = mask(ops, mask_, rs, r)
    gamma = checks.in_range("gamma", gamma, 0.0, 1.0)
    finite(ops, "rewards", r, m)
    return Returns(r, m, gamma)


# ====================================================================== whitening
class Whiten(NamedTuple):
    x: Any
    mask: Any
    n_valid: int
    ddof: int
    eps: float
    eps_mode: str
    shift_mean: bool
    restore_mean: bool


def whiten(ops: Ops, x, mask_, ddof, eps, eps_mode, shift_mean, restore_mean=False) -> Whiten:
    xs, xa = token(ops, "x", x)
    m = mask(ops, mask_, xs, xa)
    ddof = checks.ddof(ddof)
    eps = checks.non_negative("eps", eps)
    eps_mode = checks.choice("eps_mode", eps_mode, vocab.EPS_MODES)
    checks.boolean("shift_mean", shift_mean)
    checks.boolean("restore_mean", restore_mean)
    if restore_mean and shift_mean:
        raise ValueError("restore_mean is True but shift_mean is True; restore_mean re-adds the "
                         "mean that shift_mean=False keeps (verl's and TRL's masked_whiten)")
    finite(ops, "x", xa, m)
    n = ops.count(m)
    if n - ddof <= 0 and 0 not in xs.shape:      # an empty batch whitens to an empty batch
        raise ValueError(f"mask has {n} valid entries; whiten with ddof={ddof} needs at least "
                         f"{ddof + 1}")
    return Whiten(xa, m, n, ddof, eps, eps_mode, shift_mean, restore_mean)


def whiten_scale(scale_is_zero: bool, n_valid: int) -> None:
    """After the twin computed the scale s: 0 (a constant x with eps = 0) cannot divide."""
    if scale_is_zero:
        raise ValueError(f"x has zero variance over its {n_valid} valid entries and eps=0: "
                         f"whitening would divide by zero")


# ====================================================================== group advantages
class Groups(NamedTuple):
    rewards: Any
    group_size: Optional[int]     # exactly one of group_size and group_ids is set
    group_ids: Any
    keep: Any                     # [B] bool: rows that enter the statistics
    ddof: int
    eps: float
    scale: str
    baseline: str
    singleton: str


class Grouped(NamedTuple):
    spec: Spec
    rewards: Any
    group_size: Optional[int]
    group_ids: Any


def groups(ops: Ops, fn: str, rewards, group_size, group_ids) -> Grouped:
    """One reward per sequence [B] and its groups: consecutive blocks of group_size, or rows
    with equal group_ids (exactly one of the two)."""
    s = ops.spec("rewards", rewards)
    checks.require_float(s)
    checks.require_sequence(s)
    r = ops.floats(rewards)
    return Grouped(s, r, group_rule(ops, fn, s.shape[0], group_size, group_ids), group_ids)


def group_rule(ops: Ops, fn: str, B: int, group_size, group_ids,
               rows_of: str = "rewards") -> Optional[int]:
    """Checks the groups of B rows of `rows_of` (exactly one of group_size and group_ids); the
    group size."""
    ids = None if group_ids is None else ops.spec("group_ids", group_ids)
    if (group_size is not None) == (ids is not None):
        raise ValueError(f"{fn} needs exactly one of group_size= or group_ids=; "
                         f"got {'both' if group_size is not None else 'neither'}")
    if ids is not None:
        if ids.kind not in ("int", "bool"):
            raise TypeError(f"group_ids has dtype {ids.dtype}; expected integers")
        checks.require_sequence(ids, B)
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or \
                group_size < 1:
            raise ValueError(f"group_size is {group_size!r}; expected a positive integer")
        if B % group_size:
            raise ValueError(f"group_size is {group_size} but {rows_of} has B = {B} rows; "
                             f"group_size must divide B")
        group_size = int(group_size)
    return group_size


class TokenGroups(NamedTuple):
    rewards: Any
    old_logp: Any
    sum_pi_squared: Any
    mask: Any
    group_size: Optional[int]


def token_groups(ops: Ops, fn: str, rewards, old_logp, sum_pi_squared, mask_, group_size,
                 group_ids) -> TokenGroups:
    """Token rewards [B, T] of grouped sequences, with the sampled tokens' log-probs and the
    policies' Σπ² at each step."""
    s, r = token(ops, "rewards", rewards)
    if len(s.shape) != 2:
        raise ValueError(f"rewards has shape {tuple(s.shape)}; expected [B, T]")
    old = like(ops, "old_logp", old_logp, s)
    sq = like(ops, "sum_pi_squared", sum_pi_squared, s)
    m = mask(ops, mask_, s, r)
    size = group_rule(ops, fn, s.shape[0], group_size, group_ids)
    for name, x in (("rewards", r), ("old_logp", old), ("sum_pi_squared", sq)):
        finite(ops, name, x, m)
    return TokenGroups(r, old, sq, m, size)


def per_row(ops: Ops, name: str, x, B: int, *, positive: bool = False):
    """A float (or integer) array [B], finite (and > 0 where `positive`)."""
    s = ops.spec(name, x)
    if s.kind not in ("float", "int"):
        raise TypeError(f"{name} has dtype {s.dtype}; expected a float or integer array")
    checks.require_sequence(s, B)
    v = ops.floats(x) if s.kind == "float" else ops.floats(x * 1.0)
    finite(ops, name, v, ops.all_valid(v))
    if positive and B and not bool((v > 0).all()):
        raise ValueError(f"{name} holds a value ≤ 0; expected positive {name} (a response "
                         "without tokens has no length)")
    return v


def outcome_groups(ops: Ops, fn: str, rewards, group_size, group_ids):
    """`groups`, with every reward finite."""
    g = groups(ops, fn, rewards, group_size, group_ids)
    finite(ops, "rewards", g.rewards, ops.all_valid(g.rewards))
    return g


def group_advantages(ops: Ops, rewards, group_size, group_ids, ddof, eps, scale, baseline,
                     valid, singleton="zero") -> Groups:
    s, r, group_size, _ = groups(ops, "group_advantages", rewards, group_size, group_ids)
    ddof = checks.ddof(ddof)
    eps = checks.non_negative("eps", eps)
    scale = checks.choice("scale", scale, vocab.GROUP_SCALES)
    baseline = checks.choice("baseline", baseline, vocab.GROUP_BASELINES)
    if scale == "leave_one_out" and baseline != "leave_one_out":
        raise ValueError(f"scale is 'leave_one_out' but baseline is {baseline!r}; the others' "
                         f"std goes with the others' mean (baseline='leave_one_out', as NeMo)")
    singleton = checks.choice("singleton", singleton, vocab.SINGLETONS)
    keep = mask(ops, valid, s, r, name="valid")
    finite(ops, "rewards", r, keep)
    return Groups(r, group_size, group_ids, keep, ddof, eps, scale, baseline, singleton)


def singleton_group(row) -> None:
    """`row` is the first row alone in its group while singleton='error', or None."""
    if row is not None:
        raise ValueError(f"rewards of row {row} form a group of one and singleton='error': a "
                         f"group needs at least 2 members (as OpenRLHF requires)")


def negative_group_mean(mean) -> None:
    """`mean` is the first group mean below 0 under scale='mean' (groups of two or more), or
    None. MaxRL divides by the mean as a pass rate: below 0 it flips the advantages' signs."""
    if mean is not None:
        raise ValueError(f"rewards have a group whose mean is {mean:.6g} under scale='mean' "
                         f"(MaxRL): (r − mean)/(mean + eps) would flip the sign of its "
                         f"advantages; expected rewards in [0, 1], whose group means are pass "
                         f"rates ≥ 0 (shift the rewards, or use scale='group')")


def group_spread(row, scale="group") -> None:
    """`row` is the first row whose group's denominator is 0 (zero spread while eps = 0, or
    under scale='mean' a group mean equal to −eps), or None."""
    if row is None:
        return
    if scale == "mean":
        raise ValueError(f"rewards of row {row}'s group have mean + eps = 0 under "
                         f"scale='mean': the advantage (r − mean)/(mean + eps) would divide by "
                         f"0; use another eps")
    raise ValueError(f"rewards of row {row}'s group have zero spread and eps=0: the "
                     f"advantage would be 0/0; use eps > 0 or scale='none'")


# ====================================================================== ratio-based losses
class Ratio(NamedTuple):
    logp: Any
    old_logp: Any
    advantages: Any        # as given: [B, T], or [B] when per_seq
    per_seq: bool
    mask: Any
    log_ratio_clamp: Optional[float]


def per_token_or_sequence(ops: Ops, name: str, x, lps: Spec) -> bool:
    """x is a float array per token (logp's shape) or one per sequence ([B] for a [B, T] logp):
    whether it is per sequence. Nothing else is accepted, since a [B, 1] column or a [T] vector
    against [B, T] would broadcast silently elsewhere."""
    xs = ops.spec(name, x)
    checks.require_float(xs)
    if tuple(xs.shape) == tuple(lps.shape):
        per_seq = False
    elif len(lps.shape) == 2 and tuple(xs.shape) == (lps.shape[0],):
        per_seq = True
    else:
        one = f" or one per sequence [B] = ({lps.shape[0]},)" if len(lps.shape) == 2 else ""
        raise ValueError(f"{name} has shape {tuple(xs.shape)} but logp has "
                         f"{tuple(lps.shape)}; expected per token {tuple(lps.shape)}{one}")
    if ops.uniform:
        checks.same_dtype(lps, xs)
        checks.same_device(lps, xs)
    return per_seq


def ratio_inputs(ops: Ops, logp, old_logp, advantages, mask_, log_ratio_clamp,
                 old_name="old_logp") -> Ratio:
    """The inputs every ratio-based loss shares. Advantages are per token (logp's shape) or per
    sequence ([B] for a [B, T] logp); nothing else is accepted, since a [B, 1] column or a [T]
    vector against [B, T] would broadcast silently elsewhere. `old_name` is the name the
    function gives its ratio's anchor (decoupled PPO's prox_logp)."""
    lps, lp = token(ops, "logp", logp)
    old = like(ops, old_name, old_logp, lps)
    per_seq = per_token_or_sequence(ops, "advantages", advantages, lps)
    m = mask(ops, mask_, lps, lp)
    clamp = checks.positive("log_ratio_clamp", log_ratio_clamp, allow_none=True)
    adv = ops.floats(advantages)
    if per_seq:
        finite(ops, "advantages", adv, ops.rows_with_tokens(m))
    finite(ops, "logp", lp, m)
    finite(ops, old_name, old, m)
    if not per_seq:
        finite(ops, "advantages", adv, m)
    return Ratio(lp, old, adv, per_seq, m, clamp)


class ClipBounds(NamedTuple):
    clip_low: float
    lo: float            # 1 − ε_low
    hi: float            # 1 + ε_high (ε_high = ε_low when clip_high is None)


def clip_bounds(clip_low, clip_high) -> ClipBounds:
    """PPO's clip interval [1 − ε_low, 1 + ε_high]."""
    clip_low = checks.in_range("clip_low", clip_low, 0.0, 1.0, hi_open=True)
    clip_high = checks.non_negative("clip_high", clip_high, allow_none=True)
    return ClipBounds(clip_low, 1.0 - clip_low, 1.0 + (clip_low if clip_high is None else
                                                       clip_high))


class Ppo(NamedTuple):
    lo: float
    hi: float
    clip_c: Optional[float]      # dual clip, > 1
    delta: Optional[float]       # TRL's absolute cap on the unclipped ratio, ≥ hi


def ppo(clip_low, clip_high, clip_c, delta) -> Ppo:
    b = clip_bounds(clip_low, clip_high)
    if clip_c is not None:
        clip_c = checks.number("clip_c", clip_c)
        if clip_c <= 1.0:
            raise ValueError(f"clip_c is {clip_c}; the dual clip needs c > 1 (or None to "
                             f"disable it)")
    delta = checks.ratio_cap("delta", delta)
    if delta is not None and delta < b.hi:
        raise ValueError(f"delta is {delta} but the upper clip edge 1 + clip_high is {b.hi}; "
                         f"TRL's cap must be at least the clip edge (it recommends δ > 1 + ε)")
    return Ppo(b.lo, b.hi, clip_c, delta)


class Cispo(NamedTuple):
    lo: float            # the weight's lower bound (0: none)
    hi: float            # its upper bound (may be inf)


def cispo(clip_high, clip_low, bound) -> Cispo:
    """CISPO's weight bounds: absolute min(r, clip_high), or relative clip(r, 1 − lo, 1 + hi)."""
    bound = checks.choice("bound", bound, vocab.CISPO_BOUNDS)
    if bound == "absolute":
        cap = checks.positive("clip_high", clip_high, allow_inf=True)
        if clip_low is not None:
            raise ValueError(f"clip_low is {clip_low!r}, but bound='absolute' has no lower "
                             f"bound; use bound='relative' or leave clip_low=None")
        return Cispo(0.0, cap)
    hi = checks.non_negative("clip_high", clip_high, allow_inf=True)
    lo = checks.non_negative("clip_low", clip_low, allow_none=True, allow_inf=True)
    return Cispo(0.0 if lo is None else max(1.0 - lo, 0.0), 1.0 + hi)


class Gspo(NamedTuple):
    lo: float
    hi: float
    form: str
    log_ratio_max: Optional[float]


def gspo(clip_low, clip_high, form, log_ratio_max) -> Gspo:
    clip_low = checks.in_range("clip_low", clip_low, 0.0, 1.0, hi_open=True)
    clip_high = checks.non_negative("clip_high", clip_high)
    form = checks.choice("form", form, vocab.GSPO_FORMS)
    cap = checks.number("log_ratio_max", log_ratio_max, allow_none=True)
    return Gspo(1.0 - clip_low, 1.0 + clip_high, form, cap)


class Sapo(NamedTuple):
    tau_pos: float
    tau_neg: float
    level: str


def ratio_level(level) -> str:
    """ppo_clip_loss's and cispo_loss's ratio level (vocab.RATIO_LEVELS)."""
    return checks.choice("level", level, vocab.RATIO_LEVELS)


def sapo(tau_pos, tau_neg, level="token") -> Sapo:
    return Sapo(checks.positive("tau_pos", tau_pos), checks.positive("tau_neg", tau_neg),
                checks.choice("level", level, vocab.SAPO_LEVELS))


class PairInputs(NamedTuple):
    first: Any
    second: Any
    mask: Any


def pair_inputs(ops: Ops, first, second, mask_, names) -> PairInputs:
    """Two float token arrays of one shape (log-probs of two policies) and their mask."""
    s, a = token(ops, names[0], first)
    b = like(ops, names[1], second, s)
    m = mask(ops, mask_, s, a)
    finite(ops, names[0], a, m)
    finite(ops, names[1], b, m)
    return PairInputs(a, b, m)


class RolloutIs(NamedTuple):
    level: str
    mode: str
    lower: Optional[float]
    upper: Optional[float]
    seq_stat: str
    kept: str
    log_ratio_clamp: Optional[float]


def rollout_is(level, mode, lower, upper, seq_stat, kept, log_ratio_clamp, *,
               prefix: str = "") -> RolloutIs:
    """rollout_is_weights' conventions (reinforce_loss names them with the prefix "is_"; its
    level may be None: no weights)."""
    level = None if prefix and level is None else \
        checks.choice(prefix + "level", level, vocab.IS_LEVELS)
    mode = checks.choice(prefix + "mode", mode, vocab.IS_MODES)
    lower = checks.non_negative(prefix + "lower", lower, allow_none=True)
    upper = checks.positive(prefix + "upper", upper, allow_none=True, allow_inf=True)
    if lower is not None and upper is not None and lower > upper:
        raise ValueError(f"{prefix}lower is {lower} but {prefix}upper is {upper}; expected "
                         f"{prefix}lower ≤ {prefix}upper")
    seq_stat = checks.choice(prefix + "seq_stat", seq_stat, vocab.IS_SEQ_STATS)
    kept = checks.choice(prefix + "kept", kept, vocab.IS_KEPT)
    clamp = checks.positive(prefix + "log_ratio_clamp", log_ratio_clamp, allow_none=True)
    return RolloutIs(level, mode, lower, upper, seq_stat, kept, clamp)


def reinforce(beta, is_level, is_mode, is_lower, is_upper, is_log_ratio_clamp):
    """(β, the in-loss weights' conventions) of reinforce_loss."""
    beta = checks.non_negative("beta", beta)
    c = rollout_is(is_level, is_mode, is_lower, is_upper, "sum", "unit", is_log_ratio_clamp,
                   prefix="is_")
    if c.level is not None and beta > 0:
        raise ValueError(f"beta is {beta} but is_level is {is_level!r}; the in-loss IS "
                         "weights read old_logp as the rollout policy, the DRO penalty as "
                         "the old policy: use one or the other")
    return beta, c


class Decoupled(NamedTuple):
    ratio: Ratio           # logp, prox_logp (as old_logp), advantages, mask
    behave_logp: Any
    ppo: "Ppo"
    weights: RolloutIs     # level None: no behaviour weight


def decoupled(ops: Ops, logp, prox_logp, behave_logp, advantages, mask_, clip_low, clip_high,
              clip_c, is_level, is_mode, is_lower, is_upper, is_seq_stat) -> Decoupled:
    """decoupled_ppo_loss's inputs: ratio_inputs with the proximal policy as the anchor, the
    behaviour policy's log-probs of the same shape, PPO's clip and the behaviour weight's
    conventions (rollout_is_weights', prefixed "is_"; its level may be None)."""
    r = ratio_inputs(ops, logp, prox_logp, advantages, mask_, None, old_name="prox_logp")
    lps, _ = token(ops, "logp", logp)
    behave = like(ops, "behave_logp", behave_logp, lps)
    finite(ops, "behave_logp", behave, r.mask)
    c = rollout_is(is_level, is_mode, is_lower, is_upper, is_seq_stat, "unit", None,
                   prefix="is_")
    return Decoupled(r, behave, ppo(clip_low, clip_high, clip_c, None), c)


def opsm(delta) -> float:
    """opsm_mask's threshold δ, any finite number (its arrays are a ratio loss's inputs)."""
    return checks.number("delta", delta)


def tv_filter(lower, upper) -> Tuple[Optional[float], Optional[float]]:
    """tv_filter_mask's bounds on a sequence's mean |ρ − 1|: each None or a finite number ≥ 0,
    lower ≤ upper when both are set (its arrays are a ratio loss's inputs)."""
    lo = checks.non_negative("lower", lower, allow_none=True)
    hi = checks.non_negative("upper", upper, allow_none=True)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"lower is {lo} but upper is {hi}; expected lower <= upper")
    return lo, hi


def ratio_kl(ops: Ops, logp, old_logp, mask_):
    """ratio_kl_penalty's old_logp beside kl_penalty's inputs (validated by `kl_penalty`):
    log-probs of logp's shape, finite at valid tokens; returns the validated mask."""
    return pair_inputs(ops, logp, old_logp, mask_, ("logp", "old_logp")).mask


def m2po(ops: Ops, logp, old_logp, mask_, threshold) -> Tuple[PairInputs, float]:
    """m2po_mask's inputs: two log-prob arrays of one shape, their mask, and τ > 0."""
    return pair_inputs(ops, logp, old_logp, mask_, ("logp", "old_logp")), \
        checks.positive("threshold", threshold)


class Fipo(NamedTuple):
    ratio: Ratio                      # logp, old_logp, advantages ([B, T] or [B]), mask
    gamma: float                      # 2^(−1/decay_rate)
    lower: Optional[float]
    upper: Optional[float]
    ratio_threshold: Optional[float]
    safety_threshold: Optional[float]


def fipo(ops: Ops, logp, old_logp, advantages, mask_, decay_rate, lower, upper,
         ratio_threshold, safety_threshold) -> Fipo:
    """fipo_influence_weights' inputs: a ratio loss's arrays, the half-life decay_rate > 0 (inf:
    γ = 1), the weight's bounds (None: that side open; lower ≤ upper) and the two ratio
    thresholds (None: off)."""
    r = ratio_inputs(ops, logp, old_logp, advantages, mask_, None)
    decay_rate = checks.positive("decay_rate", decay_rate, allow_inf=True)
    lower = checks.non_negative("lower", lower, allow_none=True)
    upper = checks.positive("upper", upper, allow_none=True, allow_inf=True)
    if lower is not None and upper is not None and lower > upper:
        raise ValueError(f"lower is {lower} but upper is {upper}; expected lower ≤ upper")
    c = checks.positive("ratio_threshold", ratio_threshold, allow_none=True, allow_inf=True)
    s = checks.positive("safety_threshold", safety_threshold, allow_none=True, allow_inf=True)
    return Fipo(r, 2.0 ** (-1.0 / decay_rate), lower, upper, c, s)


class Dppo(NamedTuple):
    divergence: str
    lo: float            # δ_low: the trust region's bound for A ≤ 0
    hi: float            # δ_high: for A > 0
    clip_c: Optional[float]
    kl_eps: float
    form: str = "logp"


def dppo(divergence, clip_low, clip_high, clip_c, kl_eps, form="logp") -> Dppo:
    divergence = checks.choice("divergence", divergence, vocab.DPPO_DIVERGENCES)
    lo = checks.positive("clip_low", clip_low)
    hi = lo if clip_high is None else checks.positive("clip_high", clip_high)
    clip_c = checks.positive("clip_c", clip_c, allow_none=True, allow_inf=True)
    return Dppo(divergence, lo, hi, clip_c, checks.non_negative("kl_eps", kl_eps),
                checks.choice("form", form, vocab.DPPO_FORMS))


def not_a_log_probability(name: str, index, value) -> None:
    """A twin found log-probability `value` > 0 at valid position `index`."""
    raise ValueError(f"{name} at valid position {index} is {value}; expected the "
                     "log-probability of a sampled token (≤ 0)")


class Gmpo(NamedTuple):
    lo: float
    hi: float
    eps: float


def gmpo(clip_low, clip_high, eps) -> Gmpo:
    lo = checks.non_negative("clip_low", clip_low)
    hi = lo if clip_high is None else checks.non_negative("clip_high", clip_high)
    return Gmpo(lo, hi, checks.non_negative("eps", eps))


class Vespo(NamedTuple):
    k_pos: float
    lambda_pos: float
    k_neg: float
    lambda_neg: float
    log_ratio_clamp: Optional[float]
    log_w_min: float
    log_w_max: float


def vespo(k_pos, lambda_pos, k_neg, lambda_neg, log_ratio_clamp, log_w_min, log_w_max) -> Vespo:
    k_pos = checks.non_negative("k_pos", k_pos)
    lambda_pos = checks.positive("lambda_pos", lambda_pos)
    k_neg = checks.non_negative("k_neg", k_neg)
    lambda_neg = checks.positive("lambda_neg", lambda_neg)
    clamp = checks.positive("log_ratio_clamp", log_ratio_clamp, allow_none=True)
    lo, hi = checks.number("log_w_min", log_w_min), checks.number("log_w_max", log_w_max)
    if lo > hi:
        raise ValueError(f"log_w_min is {lo} but log_w_max is {hi}; expected log_w_min ≤ "
                         "log_w_max")
    return Vespo(k_pos, lambda_pos, k_neg, lambda_neg, clamp, lo, hi)


def clip_fraction(definition, clip_low, clip_high):
    """(definition, ClipBounds) of clip_fraction."""
    definition = checks.choice("definition", definition, vocab.CLIP_FRACTIONS)
    return definition, clip_bounds(clip_low, clip_high)


# ====================================================================== value loss
class Value(NamedTuple):
    values: Any
    old_values: Any
    returns: Any
    mask: Any
    clip: Optional[float]


def value_loss(ops: Ops, values, old_values, returns, mask_, clip) -> Value:
    vs, v = token(ops, "values", values)
    vo = like(ops, "old_values", old_values, vs)
    R = like(ops, "returns", returns, vs)
    m = mask(ops, mask_, vs, v)
    clip = checks.positive("clip", clip, allow_none=True)
    for name, a in (("values", v), ("old_values", vo), ("returns", R)):
        finite(ops, name, a, m)
    return Value(v, vo, R, m, clip)


# ====================================================================== KL terms
class Kl(NamedTuple):
    logp: Any
    ref_logp: Any
    mask: Any
    kind: str
    in_bound: Optional[float]
    out_bound: Optional[float]


def kl_penalty(ops: Ops, logp, ref_logp, mask_, kind, clamp) -> Kl:
    lps, lp = token(ops, "logp", logp)
    ref = like(ops, "ref_logp", ref_logp, lps)
    m = mask(ops, mask_, lps, lp)
    kind = checks.choice("kind", kind, vocab.KL_KINDS)
    in_b, out_b = checks.clamp_pair("clamp", clamp)
    finite(ops, "logp", lp, m)
    finite(ops, "ref_logp", ref, m)
    return Kl(lp, ref, m, kind, in_b, out_b)


class KlRewards(NamedTuple):
    scores: Any         # as given: [B, T], or [B] when per_seq
    per_seq: bool
    beta: float


def kl_rewards(ops: Ops, scores, logp, mask_, beta) -> KlRewards:
    """The task scores beside kl_penalty's inputs (validated by `kl_penalty`): one per token
    (logp's shape) or one per sequence [B], placed at each row's last valid token."""
    lps = ops.spec("logp", logp)
    per_seq = per_token_or_sequence(ops, "scores", scores, lps)
    s = ops.floats(scores)
    m = mask(ops, mask_, lps, ops.floats(logp))
    finite(ops, "scores", s, ops.rows_with_tokens(m) if per_seq else m)
    return KlRewards(s, per_seq, checks.non_negative("beta", beta))


def token_logits(ops: Ops, logits_, mask_):
    """(logits, mask) of per-token categorical policies: logits [B, T, V] (or [T, V]), V ≥ 2,
    and a [B, T] mask. A logit of −inf at a valid token is vocabulary masking (top-k, top-p,
    a banned token): probability 0, accepted while one logit of the token is finite; NaN and
    +inf are refused."""
    s = ops.spec("logits", logits_)
    checks.require_float(s)
    if len(s.shape) not in (2, 3) or s.shape[-1] < 2:
        raise ValueError(f"logits has shape {tuple(s.shape)}; expected [B, T, V] or [T, V] "
                         f"with a vocabulary V ≥ 2")
    z = ops.floats(logits_)
    tokens = s._replace(shape=tuple(s.shape[:-1]))
    m = mask(ops, mask_, tokens, z[..., 0])
    banned = z == -math.inf
    found = ops.first_nonfinite(z, m[..., None] & ops.all_valid(z) & ~banned)
    if found is not None:
        checks.finite_at_valid("logits", *found)
    empty = ops.first_nonfinite(z[..., 0], m & ((~banned).sum(-1) == 0))
    if empty is not None:
        raise ValueError(f"logits are −inf for every token of the vocabulary at valid position "
                         f"{tuple(empty[0])}: that policy gives no token any probability; "
                         f"only masked positions (mask = 0) may hold it")
    return z, m


class ApproxKl(NamedTuple):
    logp: Any
    old_logp: Any
    mask: Any
    kind: str
    n_valid: int


def approx_kl(ops: Ops, logp, old_logp, mask_, kind) -> ApproxKl:
    lps, lp = token(ops, "logp", logp)
    old = like(ops, "old_logp", old_logp, lps)
    m = mask(ops, mask_, lps, lp)
    kind = checks.choice("kind", kind, vocab.ESTIMATOR_KINDS)
    finite(ops, "logp", lp, m)
    finite(ops, "old_logp", old, m)
    return ApproxKl(lp, old, m, kind, ops.count(m))


# ====================================================================== aggregation, objective
NORMED_MODES = ("seq-mean-token-sum", "seq-mean-token-sum-norm")   # the modes that take `norm`


class Aggregate(NamedTuple):
    loss: Any
    mask: Any
    mode: str
    norm: Optional[float]      # validated only for "seq-mean-token-sum-norm" (None: T)
    empty_rows: str
    group_size: Optional[int] = None     # the grouped modes' groups (exactly one of the two)
    group_ids: Any = None


def aggregate(ops: Ops, loss, mask_, mode, norm, empty_rows, group_size=None,
              group_ids=None) -> Aggregate:
    ls, lo = token(ops, "loss", loss)
    policy_mask(mask_ is None, "aggregate")
    m = mask(ops, mask_, ls, lo)
    mode = checks.choice("mode", mode, vocab.AGG_MODES + vocab.GROUPED_AGG_MODES)
    if mode in vocab.GROUPED_AGG_MODES or group_size is not None or group_ids is not None:
        # checked whenever given; only the grouped modes read them (as policy_objective's
        # ref_logp at beta = 0, groups a row-local mode ignores are no error)
        rows = ls.shape[0] if len(ls.shape) == 2 else 1
        group_size = group_rule(ops, f"aggregate with mode {mode!r}", rows, group_size,
                                group_ids, rows_of="loss")
    empty_rows = checks.choice("empty_rows", empty_rows, vocab.EMPTY_ROWS)
    if norm is not None and mode not in NORMED_MODES:
        raise ValueError(f"norm is {norm!r} but mode is {mode!r}; norm only applies to "
                         f"{' and '.join(repr(m) for m in NORMED_MODES)}")
    finite(ops, "loss", lo, m)
    if norm is not None:
        norm = checks.positive("norm", norm)
    return Aggregate(lo, m, mode, norm, empty_rows, group_size, group_ids)


class Objective(NamedTuple):
    loss: str
    beta: float
    kl_kind: str
    kl_clamp: Any
    kl_weight: Optional[str] = None
    kl_anchor: str = "ref"
    adv_tau: float = 0.0
    adv_kl: float = 0.0


def shaped_advantages(ref_logp, tau, kl_coef, ref_name="ref_logp", kl_name="kl_coef",
                      tau_name="tau"):
    """The advantage shaping's coefficients: τ ≥ 0 and the KL coefficient ≥ 0, which needs
    ref_logp."""
    tau = checks.non_negative(tau_name, tau)
    kl_coef = checks.non_negative(kl_name, kl_coef)
    if kl_coef > 0 and ref_logp is None:
        raise ValueError(f"{kl_name} is {kl_coef} but {ref_name} is None; the KL folded into "
                         f"the advantage needs {ref_name}")
    return tau, kl_coef


def policy_objective(mask_, ref_logp, loss, beta, kl_kind, kl_clamp, agg,
                     kl_weight=None, kl_anchor="ref", adv_tau=0.0, adv_kl=0.0) -> Objective:
    """policy_objective's own keywords; its parts validate their inputs themselves. The KL term's
    and the aggregation's conventions are checked here under policy_objective's names
    (kl_penalty calls them kind and clamp, aggregate calls agg mode), so a wrong value is
    reported under the keyword the caller used."""
    loss = checks.choice("loss", loss, vocab.POLICY_LOSSES)
    checks.choice("agg", agg, vocab.AGG_MODES + vocab.GROUPED_AGG_MODES)
    beta = checks.non_negative("beta", beta)
    policy_mask(mask_ is None, "policy_objective")
    kl_anchor = checks.choice("kl_anchor", kl_anchor, vocab.KL_ANCHORS)
    if beta > 0 and ref_logp is None and kl_anchor == "ref":
        raise ValueError(f"beta is {beta} but ref_logp is None; a KL term needs ref_logp (or "
                         f"kl_anchor='old', the KL to the sampling policy)")
    checks.choice("kl_kind", kl_kind, vocab.KL_KINDS)
    checks.clamp_pair("kl_clamp", kl_clamp)
    checks.choice("kl_weight", kl_weight, vocab.KL_WEIGHTS)
    adv_tau, adv_kl = shaped_advantages(ref_logp, adv_tau, adv_kl, kl_name="adv_kl",
                                        tau_name="adv_tau")
    return Objective(loss, beta, kl_kind, kl_clamp, kl_weight, kl_anchor, adv_tau, adv_kl)


# ====================================================================== exact estimator analysis
def logits(ops: Ops, name: str, x, like_: Optional[Spec] = None):
    """One categorical policy's logits [V], V ≥ 2 (and the shape of `like_` when given)."""
    s = ops.spec(name, x)
    checks.require_float(s)
    if len(s.shape) != 1 or s.shape[0] < 2:
        raise ValueError(f"{name} has shape {tuple(s.shape)}; expected one categorical "
                         f"policy's logits [V] with V ≥ 2")
    if like_ is not None:
        if tuple(s.shape) != tuple(like_.shape):
            raise ValueError(f"{name} has shape {tuple(s.shape)} but {like_.name} has "
                             f"{tuple(like_.shape)}; both are [V]")
        if ops.uniform:
            checks.same_dtype(like_, s)
            checks.same_device(like_, s)
    z = ops.floats(x)
    finite(ops, name, z, ops.all_valid(z))
    return s, z


class Moments(NamedTuple):
    logits: Any
    ref_logits: Any
    kind: str


def kl_estimator_moments(ops: Ops, logits_, ref_logits, kind) -> Moments:
    s, z = logits(ops, "logits", logits_)
    _, zr = logits(ops, "ref_logits", ref_logits, s)
    kind = checks.choice("kind", kind, vocab.ESTIMATOR_KINDS)
    return Moments(z, zr, kind)


class EstimatorGradient(NamedTuple):
    logits: Any
    ref_logits: Any
    kind: str
    use: str
    sample_logits: Any      # or None: samples from π itself
    is_weight: Optional[str]


def kl_estimator_gradient(ops: Ops, logits_, ref_logits, kind, use, sample_logits,
                          is_weight) -> EstimatorGradient:
    s, z = logits(ops, "logits", logits_)
    _, zr = logits(ops, "ref_logits", ref_logits, s)
    kind = checks.choice("kind", kind, vocab.ESTIMATOR_KINDS)
    use = checks.choice("use", use, vocab.USES)
    is_weight = checks.choice("is_weight", is_weight, vocab.IS_WEIGHTS)
    zs = None if sample_logits is None else logits(ops, "sample_logits", sample_logits, s)[1]
    return EstimatorGradient(z, zr, kind, use, zs, is_weight)


def objective_overflow(index, inputs) -> None:
    """`index` is the first valid position where policy_objective's per-token loss is not
    finite although every input is (or None); `inputs` maps the inputs' names to their values
    there. Names the inputs, not the internal per-token loss."""
    if index is not None:
        at = ", ".join(f"{name}={value:.6g}" for name, value in inputs.items())
        raise ValueError(
            f"the inputs overflow the loss at valid position {tuple(index)} ({at}): the "
            f"per-token loss there is beyond float64; log-probabilities are ≤ 0, and a ratio "
            f"exp(logp − old_logp) or a KL term of inputs this large is not a number")


def estimator_overflow(category: Optional[int]) -> None:
    """`category` is the first category x where μ(x)·W(x)·k(x), the per-sample KL term a
    trainer's expectation sums, is beyond float64 (or None). Only sampling from μ ≠ π without
    importance weights gets there: μ·k grows like μ·ref/π where π(x) is almost 0."""
    if category is not None:
        raise ValueError(
            f"sample_logits put probability on category {category}, where logits give almost "
            f"none: the expected per-sample KL term μ·k there is beyond float64, and so is its "
            f"gradient; sample from π (sample_logits=None) or weight the samples (is_weight)")


def log_var_gradient(defined: bool) -> None:
    """`defined` is False where var is 0 in float64, so that log_var = −inf has no gradient."""
    if not defined:
        raise ValueError("g['log_var'] is nonzero where var is 0 in float64: log_var is −inf "
                         "there (the estimator takes one value under π, or π is a point mass "
                         "to float64 precision) and has no gradient; give log_var a zero "
                         "cotangent")


def moment_cotangent(g) -> dict:
    """The cotangent of kl_estimator_moments with every key: a key left out is 0 (code written
    before log_var keeps working); a key that is not an output is refused by name."""
    if not isinstance(g, dict):
        raise TypeError(f"g is a {type(g).__name__}; expected a dict with some of the keys "
                        f"{', '.join(vocab.MOMENT_KEYS)} (a missing key is 0)")
    unknown = [k for k in g if k not in vocab.MOMENT_KEYS]
    if unknown:
        raise ValueError(f"g has unknown key(s) {', '.join(map(repr, unknown))}; its keys are "
                         f"{', '.join(vocab.MOMENT_KEYS)} (a missing key is 0)")
    return {k: g.get(k, 0.0) for k in vocab.MOMENT_KEYS}

