"""Per-token policy and value losses (PPO clip, dual clip, CISPO, GSPO, SAPO, VESPO, clipped
value loss), each with a hand-derived VJP; the composed actor objective is in `objective`.
"""
import math

import numpy as np

from ref_common import args

from . import _arrays as ar
from ._arrays import OPS


def loss_inputs(logp, old_logp, advantages, mask, log_ratio_clamp):
    """Validated, padding-free logp, old_logp, A (expanded to [B, T]), mask and the clamp."""
    a = args.ratio_inputs(OPS, logp, old_logp, advantages, mask, log_ratio_clamp)
    lp, old, adv, m = a.logp, a.old_logp, a.advantages, a.mask
    if a.per_seq:
        adv = np.where(m.any(axis=-1), adv, 0.0)
        adv = np.repeat(adv[:, None], lp.shape[-1], axis=1)      # one A per sequence → [B, T]
    lp, old, adv = (ar.zero_masked(x, m) for x in (lp, old, adv))
    return lp, old, adv, m, a.log_ratio_clamp


def _ratio_inputs(logp, old_logp, advantages, mask, log_ratio_clamp):
    """Validated, padding-free logp, A (expanded to [B, T]), mask, ρ, ratio and dρ/dlogp."""
    lp, old, adv, m, clamp = loss_inputs(logp, old_logp, advantages, mask, log_ratio_clamp)
    rho = lp - old
    drho = np.ones_like(rho)
    if clamp is not None:
        drho = (np.abs(rho) <= clamp).astype(np.float64)  # clamp passes the gradient at its edge
        rho = np.clip(rho, -clamp, clamp)
    drho = drho * (rho <= ar.LOG_FLOAT_MAX)               # saturation, see ar.LOG_FLOAT_MAX
    ratio = ar.capped_exp(rho)
    return lp, adv, m, ratio, drho


def _level_inputs(logp, old_logp, advantages, mask, log_ratio_clamp, level):
    """As `_ratio_inputs`, the ratio at `level` (vocab.RATIO_LEVELS), and the parts of its
    derivative: with ρ the (clamped) token log-ratios and ρ̄_b = Σ_t m·ρ / L_b the row's mean,

        token:              r̃_t = e^ρ_t                  a_t = r̃_t,   b_t = 0
        sequence:           r̃_t = s_b = e^ρ̄_b             a_t = 0,     b_t = s_b
        average:            r̃_t = (e^ρ_t + s_b)/2         a_t = e^ρ_t/2, b_t = s_b/2
        geometric_average:  r̃_t = e^((ρ_t + ρ̄_b)/2)      a_t = b_t = r̃_t/2

    so that ∂r̃_t/∂logp_j = dρ_j·(a_t·[t = j] + b_t/L_b) for j in row b (dρ_j = 1[the clamp
    passes]; a capped exp contributes 0 past the cap). Returns (logp, A, mask, r̃, a, b, dρ, L)."""
    level = args.ratio_level(level)
    lp, old, adv, m, clamp = loss_inputs(logp, old_logp, advantages, mask, log_ratio_clamp)
    rho = lp - old
    drho = np.ones_like(rho)
    if clamp is not None:
        drho = (np.abs(rho) <= clamp).astype(np.float64)
        rho = np.clip(rho, -clamp, clamp)
    L = m.sum(axis=-1, keepdims=True).astype(np.float64)
    rho_bar = np.where(m, rho, 0.0).sum(axis=-1, keepdims=True) / np.maximum(L, 1.0)
    live = lambda x: ar.capped_exp(x) * (x <= ar.LOG_FLOAT_MAX)        # noqa: E731
    zero = np.zeros_like(rho)
    if level == "token":
        ratio, a, b = ar.capped_exp(rho), live(rho), zero
    elif level == "sequence":
        ratio = np.broadcast_to(ar.capped_exp(rho_bar), rho.shape)
        a, b = zero, np.broadcast_to(live(rho_bar), rho.shape)
    elif level == "average":
        ratio = (ar.capped_exp(rho) + ar.capped_exp(rho_bar)) / 2
        a, b = live(rho) / 2, np.broadcast_to(live(rho_bar), rho.shape) / 2
    else:
        e = (rho + rho_bar) / 2
        ratio = ar.capped_exp(e)
        a = b = live(e) / 2
    return lp, adv, m, np.where(m, ratio, 1.0), a, b, drho, L


def _level_vjp(c, a, b, drho, m, L):
    """Σ_t c_t·∂r̃_t/∂logp_j = m_j·dρ_j·(c_j·a_j + Σ_t m_t·c_t·b_t / L_b)."""
    c = np.where(m, c, 0.0)
    shared = (c * b).sum(axis=-1, keepdims=True) / np.maximum(L, 1.0)
    return np.where(m, drho * (c * a + shared), 0.0)


def clipped_surrogate(adv, ratio, lo, hi):
    """PPO's clip as a loss: max(−A·r, −A·clip(r, lo, hi)), and where the clipped branch is the
    one taken. At a tie the unclipped branch wins (it carries the gradient). The one place in
    ref_numpy this rule is written: PPO, GSPO and the logged clip fraction use it."""
    with np.errstate(over="ignore"):                # |A|·r past the largest float is ±inf
        l1 = -adv * ratio                           # pg_loss1: unclipped surrogate
    l2 = -adv * np.clip(ratio, lo, hi)              # pg_loss2: clipped surrogate
    clipped = l2 > l1
    return np.where(clipped, l2, l1), clipped


# ====================================================================== PPO clip
def _ppo_branches(adv, ratio, clip_low, clip_high, clip_c, delta=None):
    p = args.ppo(clip_low, clip_high, clip_c, delta)
    clip_c, delta = p.clip_c, p.delta
    capped = np.zeros(ratio.shape, dtype=bool)
    if delta is not None:                           # TRL: the unclipped ratio is capped at δ
        capped = ratio > delta
        ratio = np.minimum(ratio, delta)
    loss, clipped = clipped_surrogate(adv, ratio, p.lo, p.hi)
    dual = np.zeros_like(clipped)
    if clip_c is not None:
        dual = (adv < 0) & (loss > -adv * clip_c)   # dual clip: the loss is capped at −c·A
        loss = np.where(dual, -adv * clip_c, loss)
    return loss, clipped | dual | (capped & ~clipped)


def ppo_clip_loss(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                  clip_c=None, delta=None, log_ratio_clamp=None, level="token"):
    """PPO clipped surrogate loss per token, with optional asymmetric (clip-higher) and dual clip.

        r = exp(logp − old_logp)
        l = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
        dual clip (A < 0 only):  l = min(l, −c·A)

    Reference: Schulman et al., PPO, arXiv:1707.06347, eq. (7) (as a loss: the negated
    objective); Ye et al., dual-clip PPO, arXiv:1912.09729, eq. (4); DAPO clip-higher,
    arXiv:2503.14476, §3.1.
    Note: at a tie (r exactly on a clip edge, or l = −c·A) the unclipped branch carries the
    gradient. `log_ratio_clamp` clamps ρ = logp − old_logp to ±bound before exp, as verl and
    OpenRLHF do (±20); the ratio then has no gradient beyond the bound. exp() is capped at the
    largest float (ρ > 709.78 in float64) so that it saturates instead of overflowing.

    Worked example (A = 1, ε = 0.2): r = 1.6487 → l = −1.2 (clip binding, gradient 0);
    r = 1.1052 → l = −1.1052 (gradient −r); r = 0.2231 → l = −0.2231 (the clip does not bind for
    A > 0 and r < 1 − ε: min picks the unclipped, smaller objective; gradient −r).

    Args:
      logp: [B, T] float (or [T]). log π_θ of the sampled tokens.
      old_logp: [B, T] float. log π_old of the same tokens (behaviour policy).
      advantages: [B, T] float, or [B] (one per sequence, used for each of its tokens).
      mask: [B, T] bool or 0/1, or None.
      clip_low: ε_low in [0, 1).
      clip_high: ε_high ≥ 0, or None (= clip_low).
      clip_c: dual-clip constant c > 1, or None (off).
      delta: TRL's absolute cap δ > 1 on the unclipped ratio, min(r, δ)·A, or None. For
        δ ≥ 1 + ε_high it equals the dual clip with c = δ (A < 0) and changes nothing for A > 0.
      log_ratio_clamp: bound > 0 on |logp − old_logp| before exp, or None.
      level: the ratio r in the clip (vocab.RATIO_LEVELS; ART's importance_sampling_level):
        "token" e^ρ_t; "sequence" s = e^ρ̄, ρ̄ the row's mean log-ratio (GSPO's sequence
        ratio, attached: gspo_loss with form="sequence"); "average" (e^ρ_t + s)/2;
        "geometric_average" √(e^ρ_t·s) = e^((ρ_t + ρ̄)/2). Every form is attached: the
        gradient flows through ρ̄ to every token of the row.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    if level != "token":
        lp, adv, m, ratio, *_ = _level_inputs(logp, old_logp, advantages, mask,
                                              log_ratio_clamp, level)
        loss, _ = _ppo_branches(adv, ratio, clip_low, clip_high, clip_c, delta)
        return np.where(m, loss, 0.0)
    args.ratio_level(level)
    lp, adv, m, ratio, _ = _ratio_inputs(logp, old_logp, advantages, mask, log_ratio_clamp)
    loss, _ = _ppo_branches(adv, ratio, clip_low, clip_high, clip_c, delta)
    return np.where(m, loss, 0.0)


def ppo_clip_loss_vjp(g, logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                      clip_c=None, delta=None, log_ratio_clamp=None, level="token"):
    """VJP of `ppo_clip_loss` wrt logp.

    Gradient:
      dr/dlogp = r, so the unclipped branch l = −A·r has dl/dlogp = −A·r, and the clipped
      branch −A·clip(r) is constant wherever it is the one chosen (there r is outside
      [1 − ε_low, 1 + ε_high]; inside, the two branches are equal and the unclipped one is taken).
      The case split (Spinning Up's):
        A > 0: −A·r while r ≤ 1 + ε_high, then 0;
        A < 0: −A·r while r ≥ 1 − ε_low, then 0; with the dual clip also 0 once r > c;
        A = 0: 0.
      With TRL's δ, the unclipped branch is min(r, δ)·A: flat (gradient 0) once r > δ.
      The log-ratio clamp multiplies by 1[|ρ| ≤ bound].
      So ∂L/∂logp = g · (−A·r) · 1[unclipped branch active] · 1[|ρ| ≤ bound], 0 when masked.
      At another level the ratio r̃_t of token t depends on every token j of its row b through
      the mean ρ̄_b = Σ_j m_j·ρ_j / L_b (∂ρ̄_b/∂logp_j = m_j·dρ_j/L_b), so with
      c_t = g_t·(−A_t)·1[unclipped branch active at t] the chain rule sums over t:
          ∂L/∂logp_j = Σ_t c_t·∂r̃_t/∂logp_j = dρ_j·(c_j·a_j + (Σ_t m_t·c_t·b_t)/L_b),
      a_t = ∂r̃_t/∂ρ_t (own term) and b_t = ∂r̃_t/∂ρ̄_b: for "sequence" a = 0, b = s
      (∂e^ρ̄/∂ρ̄ = e^ρ̄); for "average" a = e^ρ_t/2, b = s/2; for "geometric_average"
      r̃ = e^((ρ_t + ρ̄)/2), a = b = r̃/2 (`_level_inputs`).
      Worked example ("sequence", A = 1 on both tokens of a row, ρ = (0.1, −0.1), ε = 0.2):
      ρ̄ = 0, s = 1 inside the clip, c = (−g, −g), so each token gets (−g·1 − g·1)/2 = −g.

    Returns:
      {"logp": [B, T]} float64.
    """
    if level != "token":
        lp, adv, m, ratio, a, b, drho, L = _level_inputs(logp, old_logp, advantages, mask,
                                                         log_ratio_clamp, level)
        _, inactive = _ppo_branches(adv, ratio, clip_low, clip_high, clip_c, delta)
        gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", lp)), m)
        with np.errstate(over="ignore", invalid="ignore"):
            c = np.where(inactive, 0.0, -(gm * adv))
            return {"logp": _level_vjp(c, a, b, drho, m, L)}
    args.ratio_level(level)
    lp, adv, m, ratio, drho = _ratio_inputs(logp, old_logp, advantages, mask, log_ratio_clamp)
    _, inactive = _ppo_branches(adv, ratio, clip_low, clip_high, clip_c, delta)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", lp)), m)
    with np.errstate(over="ignore"):
        # (g·A)·r, in that order: r is finite (saturated), so g = 0 or A = 0 gives 0, never 0·inf
        grad = np.where(inactive | (drho == 0), 0.0, -(gm * adv) * ratio)
    return {"logp": np.where(m, grad, 0.0)}


# ====================================================================== CISPO
def _cispo_weight(ratio, clip_high, clip_low, bound):
    w = args.cispo(clip_high, clip_low, bound)
    return np.clip(ratio, w.lo, w.hi)


def cispo_loss(logp, old_logp, advantages, mask=None, *, clip_high=5.0, clip_low=None,
               bound="absolute", log_ratio_clamp=None, level="token"):
    """CISPO loss per token: REINFORCE weighted by a clipped, detached importance ratio.

        l = −sg(w)·A·logp,   w = min(r, clip_high)                         ("absolute")
                             w = clip(r, 1 − clip_low, 1 + clip_high)      ("relative")

    Reference: MiniMax-M1, arXiv:2506.13585, §3.1 eq. (4)–(5).
    Note: sg = stop-gradient: w scales the gradient but is not differentiated, so a token whose
    ratio is clipped still gets a gradient (unlike PPO). "absolute" is MiniMind's and TRL's form
    (cap 5.0); "relative" is verl's and slime's; clip_low=None there means no lower bound.
    The loss *value* is −w·A·logp; only its gradient is the CISPO estimator.

    Worked example (A = 1, cap 2): r = 3 → w = 2, dl/dlogp = −2 (clipped, still a gradient);
    r = 0.3 → w = 0.3, dl/dlogp = −0.3.

    Args:
      logp, old_logp: [B, T] float (or [T]).
      advantages: [B, T] float, or [B].
      mask: [B, T] bool or 0/1, or None.
      clip_high: cap (absolute, > 0, inf allowed) or upper half-width (relative, ≥ 0).
      clip_low: relative lower half-width ≥ 0 (≥ 1 disables it), or None.
      bound: "absolute" | "relative".
      log_ratio_clamp: bound > 0 on |logp − old_logp| before exp, or None.
      level: the ratio clipped into w (vocab.RATIO_LEVELS, as `ppo_clip_loss`'s): w stays
        detached at every level. ART's default loss is "relative" with clip_low 1 (no lower
        bound) and clip_high 4 at its importance_sampling_level.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    lp, adv, m, ratio = _level_inputs(logp, old_logp, advantages, mask, log_ratio_clamp,
                                      level)[:4]
    w = _cispo_weight(ratio, clip_high, clip_low, bound)
    with np.errstate(over="ignore"):                # an uncapped w·|A·logp| may pass max float
        return np.where(m, -w * (adv * lp), 0.0)


def cispo_loss_vjp(g, logp, old_logp, advantages, mask=None, *, clip_high=5.0, clip_low=None,
                   bound="absolute", log_ratio_clamp=None, level="token"):
    """VJP of `cispo_loss` wrt logp.

    Gradient:
      w is stop-gradient, so l = −w·A·logp is linear in logp: ∂l/∂logp = −w·A, for clipped and
      unclipped tokens alike. (Differentiating through w instead would add −A·logp·∂w/∂logp =
      −A·logp·r where w = r: the bug the `detach` stage looks for.) 0 at masked positions.
      At every `level` w is detached, so the same −w·A holds with w the clipped level ratio.

    Returns:
      {"logp": [B, T]} float64.
    """
    lp, adv, m, ratio = _level_inputs(logp, old_logp, advantages, mask, log_ratio_clamp,
                                      level)[:4]
    w = _cispo_weight(ratio, clip_high, clip_low, bound)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", lp)), m)
    with np.errstate(over="ignore"):
        return {"logp": np.where(m, -(gm * adv) * w, 0.0)}


# ====================================================================== GSPO
def _gspo_parts(logp, old_logp, advantages, mask, clip_low, clip_high, form, log_ratio_max):
    lp, adv, m, _, _ = _ratio_inputs(logp, old_logp, advantages, mask, None)
    old = ar.zero_masked(OPS.floats(old_logp), m)
    p = args.gspo(clip_low, clip_high, form, log_ratio_max)
    (lp, old, adv, m), squeeze = ar.as_2d(lp, old, adv, m)
    L = m.sum(axis=1)
    rho_bar = (lp - old).sum(axis=1) / np.maximum(L, 1)        # length-normalised log-ratio
    hi = min(ar.LOG_FLOAT_MAX, np.inf if p.log_ratio_max is None else p.log_ratio_max)
    alive = rho_bar <= hi                                        # the cap passes the gradient at it
    s = np.exp(np.minimum(rho_bar, hi))[:, None] * np.ones_like(lp)
    loss, clipped = clipped_surrogate(adv, s, p.lo, p.hi)
    loss = np.where(m, loss, 0.0)
    return lp, adv, m, L, s, loss, clipped, alive, p.form, squeeze


def gspo_loss(logp, old_logp, advantages, mask=None, *, clip_low=3e-4, clip_high=4e-4,
              form="token", log_ratio_max=None):
    """GSPO: the PPO clip on the length-normalised *sequence* ratio.

        s_i = exp((1/L_i)·Σ_t m_it·(logp_it − old_logp_it))
        l_it = max(−A_it·s_i, −A_it·clip(s_i, 1 − ε_low, 1 + ε_high))

    Reference: Zheng et al., "Group Sequence Policy Optimization", arXiv:2507.18071, eq. (5)–(7)
    (sequence form) and eq. (10)–(11) (GSPO-token).
    Note: `form="token"` is GSPO-token (verl's `gspo`; TRL 1.16 has no such mode): the per-token
    ratio is exp(logp_t − sg(logp_t) + sg(log s_i)), equal to s_i in value, but the gradient
    reaches token t only through its own logp_t. `form="sequence"` (TRL `sequence`, OpenRLHF,
    NeMo) differentiates through the mean, so every token of a row shares the gradient.
    The two agree when the advantage is constant within a row and the loss is aggregated
    seq-mean-token-mean. The ratio is the *mean* of log-ratios, never their product.
    `log_ratio_max` caps log s_i from above (verl: 10). ε defaults are the paper's.

    Worked example (one row, two tokens, log-ratios 0.2 and −0.1, A = 1, ε = 0.2):
    s = e^0.05 = 1.0513, inside the clip: l = [−1.0513, −1.0513].

    Args:
      logp, old_logp: [B, T] float (or [T]).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      clip_low: ε_low in [0, 1). clip_high: ε_high ≥ 0.
      form: "token" | "sequence".
      log_ratio_max: upper cap on log s_i, or None.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    *_, loss, _, _, _, squeeze = _gspo_parts(logp, old_logp, advantages, mask, clip_low,
                                             clip_high, form, log_ratio_max)
    return loss[0] if squeeze else loss


def gspo_loss_vjp(g, logp, old_logp, advantages, mask=None, *, clip_low=3e-4, clip_high=4e-4,
                  form="token", log_ratio_max=None):
    """VJP of `gspo_loss` wrt logp.

    Gradient:
      Per token the unclipped branch is −A_it·s_i (flat where the clip binds, as in PPO), so
      ∂l_iu/∂s_i = −A_iu·1[unclipped at u]; the cap on log s multiplies by 1[log s_i ≤ max].
      "token": ∂s_it/∂logp_it = s_i and nothing else (the sg terms), so
          ∂L/∂logp_it = g_it·(−A_it)·s_i·1[unclipped at t]
      "sequence": ∂s_i/∂logp_it = s_i/L_i for every valid t of the row, so each token gets
          ∂L/∂logp_it = (s_i/L_i)·Σ_u g_iu·(−A_iu)·1[unclipped at u]
      With A constant in a row and g = 1/(L_i·B) (seq-mean-token-mean) the two coincide.

    Returns:
      {"logp": [B, T]} float64.
    """
    lp, adv, m, L, s, _, clipped, alive, form, squeeze = _gspo_parts(
        logp, old_logp, advantages, mask, clip_low, clip_high, form, log_ratio_max)
    gm = args.cotangent(OPS, g, "g", OPS.spec("logp", logp))
    gm = np.where(m, gm[None] if squeeze else gm, 0.0)
    per_token = np.where(clipped | ~alive[:, None], 0.0, -(gm * adv) * s)
    if form == "token":
        grad = per_token
    else:
        grad = np.where(m, per_token.sum(axis=1, keepdims=True) / np.maximum(L, 1)[:, None], 0.0)
    grad = np.where(m, grad, 0.0)
    return {"logp": grad[0] if squeeze else grad}


# ====================================================================== SAPO
def _sigmoid(x):
    """σ(x) without overflow: e^min(x, 0)/(1 + e^−|x|)."""
    return np.exp(np.minimum(x, 0.0)) / (1.0 + np.exp(-np.abs(x)))


def _sapo_parts(logp, old_logp, advantages, mask, tau_pos, tau_neg, log_ratio_clamp, level):
    p = args.sapo(tau_pos, tau_neg, level)
    if p.level == "token":
        lp, adv, m, ratio, drho = _ratio_inputs(logp, old_logp, advantages, mask,
                                                log_ratio_clamp)
        length = None
    else:                       # one ratio per sequence: the geometric mean of its tokens'
        lp, old, adv, m, clamp = loss_inputs(logp, old_logp, advantages, mask, log_ratio_clamp)
        length = np.maximum(m.sum(axis=-1, keepdims=True), 1)
        rho = (lp - old).sum(axis=-1, keepdims=True) / length
        drho = np.ones_like(rho)
        if clamp is not None:
            drho = (np.abs(rho) <= clamp).astype(np.float64)
            rho = np.clip(rho, -clamp, clamp)
        drho = drho * (rho <= ar.LOG_FLOAT_MAX)
        ratio = np.broadcast_to(ar.capped_exp(rho), lp.shape)
        drho = np.broadcast_to(drho, lp.shape)
    tau = np.where(adv > 0, p.tau_pos, p.tau_neg)
    sig = _sigmoid(tau * (ratio - 1.0))
    return adv, m, ratio, drho, tau, sig, length


def sapo_loss(logp, old_logp, advantages, mask=None, *, tau_pos=1.0, tau_neg=1.05,
              log_ratio_clamp=None, level="token"):
    """SAPO: a smooth, temperature-controlled gate on the ratio instead of PPO's hard clip.

        r = exp(logp − old_logp),   f_τ(r) = σ(τ·(r − 1))·4/τ,   l = −f_τ(r)·A
        τ = tau_pos where A > 0, tau_neg where A ≤ 0

    Reference: Gao et al., "Soft Adaptive Policy Optimization", arXiv:2511.20347; verl's
    `compute_policy_loss_sapo` and TRL's `loss_type="sapo"` write the same per-token gate.
    Note: at r = 1 the gate's slope is 1, so the gradient is vanilla policy gradient's, −A; away
    from r = 1 it decays like σ(1 − σ), smoothly, where PPO cuts it to 0 at 1 ± ε. As τ → 0
    the gate tends to 2/τ + (r − 1): the unclipped surrogate −r·A plus a constant. A larger τ
    for A ≤ 0 (tau_neg > tau_pos, the defaults 1.05 and 1.0 of both trainers) damps negative
    updates faster. verl clamps log r to ±20 first (`log_ratio_clamp=20`); TRL does not.
    With level="sequence" (TRL's importance_sampling_level="sequence") every token of a
    sequence takes the sequence's ratio s = exp(mean_t log r_t), GSPO's, through the same gate.

    Worked example: A = 1, τ = 1, r = 1: f = σ(0)·4 = 2, l = −2, ∂l/∂logp = −1;
    r = e^0.5 = 1.6487: f = σ(0.6487)·4 = 2.6269, ∂l/∂logp = −4σ(1 − σ)·r = −1.4867.

    Args:
      logp, old_logp: [B, T] float (or [T]).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      tau_pos, tau_neg: float > 0.
      log_ratio_clamp: None or a bound b > 0 on |log r| (on |log s| at sequence level).
      level: "token" | "sequence".

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    adv, m, _, _, tau, sig, _ = _sapo_parts(logp, old_logp, advantages, mask, tau_pos, tau_neg,
                                            log_ratio_clamp, level)
    return np.where(m, -sig * (4.0 / tau) * adv, 0.0)


def sapo_loss_vjp(g, logp, old_logp, advantages, mask=None, *, tau_pos=1.0, tau_neg=1.05,
                  log_ratio_clamp=None, level="token"):
    """VJP of `sapo_loss` wrt logp.

    Gradient:
      d/dr [σ(τ(r − 1))·4/τ] = 4·σ(1 − σ) (the τ of the chain rule cancels the 1/τ), and
      dr/dlogp = r, so
          ∂L/∂logp_t = g_t·(−A_t)·4·σ_t(1 − σ_t)·r_t·1[|log r_t| ≤ clamp]
      with σ_t = σ(τ_t(r_t − 1)). At r = 1: σ = ½ and the weight is −A·r, PPO's unclipped
      gradient. Past the exp cap of r the gradient is 0 (ref_numpy._arrays.LOG_FLOAT_MAX).
      Sequence level: every l_t' depends on logp_t through s = exp(Σ_t m_t log r_t / L), with
      ∂s/∂logp_t = s·m_t/L, so
          ∂L/∂logp_t = (m_t/L)·Σ_t' g_t'·(−A_t')·4σ_t'(1 − σ_t')·s·1[|log s| ≤ clamp],
      σ_t' = σ(τ_t'(s − 1)): the sequence's summed token terms, shared equally by its tokens.

    Returns:
      {"logp": [B, T]} float64.
    """
    adv, m, ratio, drho, _, sig, length = _sapo_parts(logp, old_logp, advantages, mask,
                                                      tau_pos, tau_neg, log_ratio_clamp, level)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", logp)), m)
    per_token = np.where(m, -gm * adv * 4.0 * sig * (1.0 - sig) * ratio * drho, 0.0)
    if length is None:
        return {"logp": per_token}
    # every token's loss depends on the sequence ratio, whose log is the mean of the tokens'
    return {"logp": np.where(m, per_token.sum(axis=-1, keepdims=True) / length, 0.0)}


def _vespo_parts(logp, old_logp, advantages, mask, k_pos, lambda_pos, k_neg, lambda_neg,
                 log_ratio_clamp, log_w_min, log_w_max):
    lp, old, adv, m, _ = loss_inputs(logp, old_logp, advantages, mask, None)
    p = args.vespo(k_pos, lambda_pos, k_neg, lambda_neg, log_ratio_clamp, log_w_min, log_w_max)
    rho = lp - old
    if p.log_ratio_clamp is not None:
        rho = np.clip(rho, -p.log_ratio_clamp, p.log_ratio_clamp)
    log_w = np.clip(np.where(m, rho, 0.0).sum(axis=-1, keepdims=True), p.log_w_min, p.log_w_max)
    pos = adv >= 0
    k = np.where(pos, p.k_pos, p.k_neg)
    lam = np.where(pos, p.lambda_pos, p.lambda_neg)
    phi = np.exp(lam + k * log_w - lam * np.exp(log_w))
    return lp, adv, m, phi


def vespo_loss(logp, old_logp, advantages, mask=None, *, k_pos=2.0, lambda_pos=3.0, k_neg=3.0,
               lambda_neg=2.0, log_ratio_clamp=20.0, log_w_min=math.log(1e-8), log_w_max=20.0):
    """VESPO: REINFORCE weighted by a gamma-shaped function of the sequence's importance ratio,

        log w = clip(Σ_t m_t·clip(logp_t − old_logp_t, ±log_ratio_clamp), log_w_min, log_w_max)
        φ(w) = e^λ·w^k·e^(−λw)      (φ(1) = 1; k, λ = k_pos, lambda_pos where A ≥ 0, else _neg)
        l_t = −sg(φ(w))·A_t·logp_t

    φ rises like w^k near 0 and decays like e^(−λw) for large w: a soft trust region on the
    sequence ratio, strongest where the sequence has moved far from the sampling policy.

    Reference: Shen et al., "VESPO: Variational Sequence-Level Soft Policy Optimization",
    arXiv:2602.10693; TRL `GRPOTrainer.get_gamma_weights` and `loss_type="vespo"` (k 2 / 3, λ 3 / 2
    for A ≥ 0 / A < 0; the log-ratio clamped to ±20, log w to [log 1e-8, 20]).
    Under vLLM importance-sampling correction TRL folds the rollout's token ratios ρ_t =
    π_old/π_vllm (already truncated, or 0 where token_mask rejected them) into w:
    log w = clip(Σ m·clip(logp − old, ±20) + Σ_t clip(log ρ_t, log 1e-8, 20), log 1e-8, 20),
    and, unlike the other losses, does not multiply the per-token loss by ρ. This reference
    takes no ρ: that configuration is audited by passing old_logp − clip(log ρ, log 1e-8, 20)
    as old_logp, which is exact while no token's log-ratio reaches the ±20 clamp.
    Note: φ is detached (a gradient scale), so the gradient is −φ·A per token; on policy
    (w = 1) it is −A, the policy gradient. With k = 0 and λ → 0, φ → 1 (plain REINFORCE).

    Worked example: one token, A = 1, logp = −0.5, old = −0.5 − log 2 (w = 2), k = 2, λ = 3:
    φ = e^3·4·e^(−6) = 4e^(−3) = 0.199148, l = 0.099574, ∂l/∂logp = −0.199148.

    Args:
      logp, old_logp: [B, T] float (or [T]).
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1, or None.
      k_pos, k_neg: float ≥ 0.  lambda_pos, lambda_neg: float > 0.
      log_ratio_clamp: None or > 0.  log_w_min ≤ log_w_max: floats.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    lp, adv, m, phi = _vespo_parts(logp, old_logp, advantages, mask, k_pos, lambda_pos, k_neg,
                                   lambda_neg, log_ratio_clamp, log_w_min, log_w_max)
    return np.where(m, -phi * adv * lp, 0.0)


def vespo_loss_vjp(g, logp, old_logp, advantages, mask=None, *, k_pos=2.0, lambda_pos=3.0,
                   k_neg=3.0, lambda_neg=2.0, log_ratio_clamp=20.0, log_w_min=math.log(1e-8),
                   log_w_max=20.0):
    """VJP of `vespo_loss` wrt logp.

    Gradient: φ(w) is a stop-gradient factor, so ∂l_t/∂logp_t = −φ·A_t, times g. (Through φ
    the sequence's every token would also get −A·logp·φ'(w)·w, which VESPO does not want.)

    Returns:
      {"logp": [B, T]} float64.
    """
    _, adv, m, phi = _vespo_parts(logp, old_logp, advantages, mask, k_pos, lambda_pos, k_neg,
                                  lambda_neg, log_ratio_clamp, log_w_min, log_w_max)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", logp)), m)
    return {"logp": np.where(m, -gm * phi * adv, 0.0)}


# ====================================================================== diagnostics
def clip_fraction(logp, old_logp, advantages, mask=None, *, clip_low=0.2, clip_high=None,
                  definition="loss"):
    """The fraction of valid tokens a trainer logs as "clipped", by one of three definitions.

        "loss":  l_clipped > l_unclipped strictly (verl `pg_clipfrac`, OpenRLHF): the clip binds
        "sign":  (r > 1 + ε_high and A > 0) or (r < 1 − ε_low and A < 0) (TRL's low/high)
        "ratio": r > 1 + ε_high or r < 1 − ε_low, whatever A (MiniMind, CleanRL |r − 1| > ε)

    Reference: the trainers' logged metrics (docs/conventions.md); trl #3175 (a clip fraction
    defined backwards).
    Note: "loss" and "sign" agree except at A = 0 and exact ties: both count where the gradient
    is zeroed. "ratio" also counts tokens the clip does not touch (A > 0 with r < 1 − ε).
    Not differentiable (a count).

    Returns:
      float64 in [0, 1]; 0 when no token is valid.
    """
    lp, adv, m, ratio, _ = _ratio_inputs(logp, old_logp, advantages, mask, None)
    definition, (_, lo, hi) = args.clip_fraction(definition, clip_low, clip_high)
    if definition == "loss":
        _, hit = clipped_surrogate(adv, ratio, lo, hi)
    elif definition == "sign":
        hit = ((ratio > hi) & (adv > 0)) | ((ratio < lo) & (adv < 0))
    else:
        hit = (ratio > hi) | (ratio < lo)
    n = m.sum()
    return np.float64((hit & m).sum() / n) if n else np.float64(0.0)


# ====================================================================== value loss
def _value_inputs(values, old_values, returns, mask, clip):
    a = args.value_loss(OPS, values, old_values, returns, mask, clip)
    m, clip = a.mask, a.clip
    v, vo, R = (ar.zero_masked(x, m) for x in (a.values, a.old_values, a.returns))
    e1 = v - R
    if clip is None:
        return m, e1, e1, np.zeros(v.shape, dtype=bool), np.ones(v.shape)
    d = v - vo
    e2 = vo + np.clip(d, -clip, clip) - R
    use_clipped = 0.5 * e2 ** 2 > 0.5 * e1 ** 2     # a tie goes to the unclipped branch
    dclip = (np.abs(d) <= clip).astype(np.float64)
    return m, e1, e2, use_clipped, dclip


def value_loss(values, old_values, returns, mask=None, *, clip=0.2):
    """Clipped value loss per token.

        l = ½·max((v − R)², (v_old + clip(v − v_old, −c, c) − R)²)      (clip=None: ½(v − R)²)

    Reference: the PPO2 baselines value clipping; Engstrom et al., "Implementation Matters",
    arXiv:2005.12729, §3 (value function clipping).
    Note: the clip is around the *old value*, not the target. At a tie the unclipped branch
    carries the gradient.

    Worked example (c = 0.2): v = 1.0, v_old = 0.5, R = 2.0 → clipped v is 0.7,
    l = ½·max(1.0, 1.69) = 0.845, and the gradient is 0 (v is outside v_old ± c).

    Args:
      values: [B, T] float (or [T]). New critic values.
      old_values: [B, T] float. Critic values at rollout time.
      returns: [B, T] float. Regression targets.
      mask: [B, T] bool or 0/1, or None.
      clip: c > 0, or None (unclipped).

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m, e1, e2, use_clipped, _ = _value_inputs(values, old_values, returns, mask, clip)
    return np.where(m, 0.5 * np.where(use_clipped, e2 ** 2, e1 ** 2), 0.0)


def value_loss_vjp(g, values, old_values, returns, mask=None, *, clip=0.2):
    """VJP of `value_loss` wrt values.

    Gradient:
      Unclipped branch: ∂½(v − R)²/∂v = v − R.
      Clipped branch: ∂½(v_old + clip(v − v_old) − R)²/∂v = (v_clip − R)·1[|v − v_old| ≤ c]:
      once v has left v_old ± c the clipped branch is flat. So a token whose clipped error is
      the larger one (the max picks it) gets no gradient unless it sits exactly on the edge.

    Returns:
      {"values": [B, T]} float64.
    """
    m, e1, e2, use_clipped, dclip = _value_inputs(values, old_values, returns, mask, clip)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("values", values)), m)
    dl = np.where(use_clipped, e2 * dclip, e1)
    return {"values": np.where(m, gm * dl, 0.0)}
