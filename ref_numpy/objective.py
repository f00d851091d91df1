"""The actor objective: a policy loss plus a KL term, aggregated (`policy_objective`), with its
hand-derived VJP. Every policy loss of `policy_losses` and DPPO of `pg_losses` can be its loss."""
import numpy as np

from ref_common import args

from . import _arrays as ar
from ._arrays import OPS
from .kl import kl_penalty, kl_penalty_vjp, unclamped, weighted_slope
from .pg_losses import dppo_loss, dppo_loss_vjp
from .policy_losses import (cispo_loss, cispo_loss_vjp, gspo_loss, gspo_loss_vjp, ppo_clip_loss,
                            ppo_clip_loss_vjp, sapo_loss, sapo_loss_vjp, vespo_loss,
                            vespo_loss_vjp)
from .reduce import aggregate, aggregate_vjp


def _policy_parts(mask, ref_logp, loss, beta, kl_kind, kl_clamp, agg, kl_weight, kl_anchor):
    p = args.policy_objective(mask, ref_logp, loss, beta, kl_kind, kl_clamp, agg, kl_weight,
                              kl_anchor)
    fn, vjp = {"ppo": (ppo_clip_loss, ppo_clip_loss_vjp), "cispo": (cispo_loss, cispo_loss_vjp),
               "gspo": (gspo_loss, gspo_loss_vjp), "sapo": (sapo_loss, sapo_loss_vjp),
               "vespo": (vespo_loss, vespo_loss_vjp), "dppo": (dppo_loss, dppo_loss_vjp)}[p.loss]
    return fn, vjp, p.beta > 0, p.beta, dict(kind=kl_kind, clamp=kl_clamp, weight=kl_weight)


def _shaped(logp, old_logp, advantages, mask, ref_logp, adv_tau, adv_kl):
    """The advantages the policy loss is given: A, or shaped_advantages (a constant)."""
    adv_tau, adv_kl = args.shaped_advantages(ref_logp, adv_tau, adv_kl, kl_name="adv_kl",
                                             tau_name="adv_tau")
    if adv_tau == 0 and adv_kl == 0:
        return advantages
    return shaped_advantages(logp, old_logp, advantages, mask, ref_logp, tau=adv_tau,
                             kl_coef=adv_kl)


def _kl_anchor(old_logp, ref_logp, kl_anchor):
    """The log-probs the KL term is taken against: ref_logp, or old_logp for kl_anchor='old'."""
    return old_logp if kl_anchor == "old" else ref_logp


def _kl_ratio(logp, old_logp, mask):
    """exp(logp − old_logp) at valid tokens, 1 at padding (never read there)."""
    m = np.asarray(mask).astype(bool)
    with np.errstate(invalid="ignore", over="ignore"):      # garbage at padding is never read
        x = np.where(m, np.asarray(logp, dtype=np.float64) - np.asarray(old_logp,
                                                                         dtype=np.float64), 0.0)
    return ar.capped_exp(x)


def kl_term(logp, old_logp, ref_logp, mask, kind, clamp, weight):
    """The per-token KL term of `policy_objective`: k(logp, ref_logp), times the attached
    ratio r = exp(logp − old_logp) where weight = "ratio". With weight = "score" its value is k
    (the weight exp(logp − sg(logp)) is 1); only its gradient differs (kl_term_vjp)."""
    kl = kl_penalty(logp, ref_logp, mask, kind=kind, clamp=clamp)
    if weight == "ratio":
        with np.errstate(over="ignore", invalid="ignore"):
            kl = ar.zero_masked(_kl_ratio(logp, old_logp, mask) * kl, np.asarray(mask, bool))
    return kl


def kl_term_vjp(g, logp, old_logp, ref_logp, mask, kind, clamp, weight):
    """VJP of `kl_term` wrt logp.

    Gradient: without a weight it is kl_penalty's. With r = exp(logp − old_logp) (∂r/∂logp = r,
    old_logp a constant), the product rule gives
        ∂(r·k)/∂logp = r·∂k/∂logp + r·k = r·(∂k/∂logp + k).
    With weight = "score", w = exp(logp − sg(logp)): w = 1 and ∂w/∂logp = w = 1, so
        ∂(w·k)/∂logp = ∂k/∂logp + k,
    the score-function term k·∇log π of a KL estimated on the policy's own samples
    (∇E_π[k] = E_π[∇k + k·∇log π]; Tang and Munos, arXiv:2506.09477). As NeMo-RL's
    calculate_kl forms it, w multiplies before the output clamp and is detached where the
    input clamp binds, so wherever a clamp binds both terms are 0: the gradient is
    (∂k/∂logp + k)·1[no clamp binds] (∂k/∂logp is already 0 there).
    Where no clamp binds, ∂k/∂logp + k is taken in closed form (`kl.weighted_slope`): for k3
    it is (1 − e^x) + (e^x − 1 − x) = −x with x = ref − logp, which summed term by term loses
    every digit once e^x ≫ |x|. Where a clamp binds (or k3's e^x passes the exp cap) ∂k is 0
    and the gradient is r·k ("ratio") or 0 ("score"; k past the cap). Past the exp cap of r
    itself r is flat (gradient r·∂k/∂logp alone), as every capped exp is.
    """
    dk = kl_penalty_vjp(g, logp, ref_logp, mask, kind=kind, clamp=clamp)["logp"]   # g·∂k
    if weight is None:
        return dk
    m = np.asarray(mask, bool)
    gm = ar.zero_masked(np.asarray(g, dtype=np.float64), m)
    k = kl_penalty(logp, ref_logp, mask, kind=kind, clamp=clamp)
    free = unclamped(logp, ref_logp, mask, kind=kind, clamp=clamp)
    with np.errstate(invalid="ignore", over="ignore"):      # garbage at padding is never read
        x = ar.zero_masked(np.asarray(ref_logp, dtype=np.float64), m) - \
            ar.zero_masked(np.asarray(logp, dtype=np.float64), m)
        live = (free > 0) & (x <= ar.LOG_FLOAT_MAX if kind == "k3" else True)
        if weight == "score":
            d = np.where(live, gm * weighted_slope(kind, x), dk + gm * k * free)
        else:
            moves = np.where(m, np.asarray(logp, np.float64) - np.asarray(old_logp, np.float64),
                             0.0) <= ar.LOG_FLOAT_MAX          # r below its exp cap
            r = _kl_ratio(logp, old_logp, mask)
            d = np.where(live & moves, gm * r * weighted_slope(kind, x),
                         r * dk + gm * r * k * moves)
    return ar.zero_masked(d, m)


def shaped_advantages(logp, old_logp, advantages, mask, ref_logp=None, *, tau=0.0,
                      kl_coef=0.0):
    """The advantage a loss multiplies, shaped by two detached terms of the log-probs:

        Ã_t = A_t − τ·ρ_t + c·(k̄ − k_t),   ρ_t = logp_t − old_logp_t,   k_t = logp_t − ref_logp_t,
        k̄ = Σ_bt m·k / Σ_bt m   (the k1 KL estimate averaged over the call's valid tokens)

    The τ term is Kimi's: the gradient of τ/2·(log r)², the squared log-ratio regulariser of
    Kimi k1.5 (arXiv:2501.12599, §2.3.2, the policy gradient after eq. 3) and Kimi K2's
    squared loss (arXiv:2507.20534, §3.2), is τ·log r·∇log π, so it enters the
    REINFORCE surrogate as the advantage A − τ·sg(log r). The papers take log r of the whole
    response; ART's `kimi_k2_tau` takes each token's own log-ratio, as here.
    The c term folds a KL penalty into the advantage as a centred k1: a token whose policy has
    drifted further from the reference than the batch's average gets its advantage lowered by
    c·(k_t − k̄), and the shaping sums to 0 over the valid tokens (ART's `kl_penalty_coef`).
    Both terms are detached where a trainer uses them (the advantage is a constant of the loss);
    this function's gradient is what they would give undetached.

    Reference: Kimi k1.5, arXiv:2501.12599, §2.3.2; Kimi K2, arXiv:2507.20534, §3.2.
    Note: in `policy_objective` (adv_tau, adv_kl) the shaped advantage is a constant.

    Worked example (τ = 0.5, c = 0, one row): ρ = (0.2, −0.4), A = (1, 1) → Ã = (0.9, 1.2).
    (c = 1, τ = 0) k = (0.1, 0.3): k̄ = 0.2, Ã = A + (0.1, −0.1).

    Args:
      logp, old_logp: [B, T] float.
      advantages: [B, T] float, or [B] (one per sequence).
      mask: [B, T] bool or 0/1 (required).
      ref_logp: [B, T] float, or None where kl_coef = 0.
      tau: τ ≥ 0. kl_coef: c ≥ 0.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    lp, old, adv, m, _ = _shaping_inputs(logp, old_logp, advantages, mask, ref_logp, tau,
                                         kl_coef)
    tau, c = args.shaped_advantages(ref_logp, tau, kl_coef)
    return _shaped_values(lp, old, adv, m, ref_logp, tau, c)


def _shaped_values(lp, old, adv, m, ref_logp, tau, c):
    """Ã on validated inputs; lp may carry leading point axes [..., B, T] (ref_numpy.many):
    k̄ is each point's mean over its [B, T] valid tokens."""
    with np.errstate(invalid="ignore", over="ignore"):     # padding may hold NaN or inf
        out = adv - tau * (lp - old)
        if c > 0:
            k = np.where(m, lp - ar.zero_masked(np.asarray(ref_logp, dtype=np.float64), m), 0.0)
            k_bar = k.sum(axis=(-2, -1), keepdims=True) / max(int(m.sum()), 1)
            out = out + c * (k_bar - k)
    return np.where(m, out, 0.0)


def _shaped_vjp_values(gm, m, tau, c):
    """∂/∂logp of Σ g·Ã (gm: the cotangent, 0 where masked; leading point axes allowed)."""
    mean_g = gm.sum(axis=(-2, -1), keepdims=True) / max(int(m.sum()), 1)
    return np.where(m, -(tau + c) * gm + c * mean_g, 0.0)


def _shaping_inputs(logp, old_logp, advantages, mask, ref_logp, tau, kl_coef):
    from .policy_losses import loss_inputs
    args.policy_mask(mask is None, "shaped_advantages")
    lp, old, adv, m, _ = loss_inputs(logp, old_logp, advantages, mask, None)
    if ref_logp is not None:
        args.like(OPS, "ref_logp", ref_logp, OPS.spec("logp", lp))
        args.finite(OPS, "ref_logp", OPS.floats(ref_logp), m)
    return lp, old, adv, m, None


def shaped_advantages_vjp(g, logp, old_logp, advantages, mask, ref_logp=None, *, tau=0.0,
                          kl_coef=0.0):
    """VJP of `shaped_advantages` wrt logp.

    Gradient:
      ∂Ã_t/∂logp_j = −τ·[t = j] + c·(∂k̄/∂logp_j − [t = j]) with ∂k̄/∂logp_j = m_j/N
      (N = Σ m, ref_logp a constant). Summing the cotangent g over t:
          ∂/∂logp_j = m_j·(−(τ + c)·g_j + c·(Σ_t m_t·g_t)/N).
      Worked example (τ = 0, c = 1, two valid tokens, g = (1, 0)): (−1 + 1/2, 1/2) =
      (−0.5, 0.5): the centring moves every token's gradient by the mean.

    Returns:
      {"logp": [B, T]} float64.
    """
    lp, _, _, m, _ = _shaping_inputs(logp, old_logp, advantages, mask, ref_logp, tau, kl_coef)
    tau, c = args.shaped_advantages(ref_logp, tau, kl_coef)
    gm = ar.zero_masked(args.cotangent(OPS, g, "g", OPS.spec("logp", lp)), m)
    return {"logp": _shaped_vjp_values(gm, m, tau, c)}


def _finite_objective(per_token, logp, old_logp, advantages, mask, ref_logp):
    """Refuse a per-token loss that overflowed at a valid position, naming the inputs there."""
    m = np.asarray(mask).astype(bool)
    bad = m & ~np.isfinite(per_token)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        adv = np.asarray(advantages)
        inputs = {"logp": logp, "old_logp": old_logp,
                  "advantages": adv if adv.ndim == 2 else adv[:, None].repeat(m.shape[1], 1)}
        if ref_logp is not None:
            inputs["ref_logp"] = ref_logp
        args.objective_overflow(at, {k: float(np.asarray(v)[at]) for k, v in inputs.items()})


def ratio_kl_penalty(logp, old_logp, ref_logp, mask=None, *, kind="k1", clamp=None):
    """A per-token KL(π‖ref) estimator importance-weighted from the sampling policy: tokens
    y ~ π_old, the estimator at y times the attached ratio r = π(y)/π_old(y):

        x = ref_logp − logp = log(ref(y)/π(y)),   r = exp(logp − old_logp)
        K = r·k(x)       with k one of kl_penalty's estimators (k1 = −x, k2, k3, |x|)

    E_{π_old}[r·k1] = E_π[log(π/ref)] = KL(π‖ref) for every old policy, and since r carries
    the gradient, E_{π_old}[∇(r·k1)] = E_π[(1 + log(π/ref))·∇log π] = ∇KL(π‖ref): the value and
    the gradient are both unbiased off-policy, where k1 alone (no weight) has a zero-mean
    gradient (E_π[∇log π] = 0).

    Reference: open-instruct `model_utils.estimate_kl`, estimator 3 (`ratio * (new − ref)`
    with the difference clamped to ±40: kind "k1", clamp (40, None)); TRL's
    `use_bias_correction_kl` (k3 times the token ratio); Schulman (2020) for k1.
    Note: the KL term of `policy_objective` with kl_weight="ratio" is this function
    (`kl_term`). The clamp acts on x (and on k) as in kl_penalty; r is capped at the largest
    float as every exp of a log-ratio is.

    Worked example: logp = log 0.5, old = log 0.25, ref = log 0.4: r = 2,
    k1 = log(0.5/0.4) = 0.2231, K = 0.4463.

    Args:
      logp: [B, T] float (or [T]). log π of the sampled tokens.
      old_logp: [B, T] float. log π_old, the policy that sampled them.
      ref_logp: [B, T] float. log π_ref of the same tokens.
      mask: [B, T] bool or 0/1, or None.
      kind: "k1" | "k2" | "k3" | "abs".  clamp: as kl_penalty's.

    Returns:
      [B, T] float64, 0 at masked positions.
    """
    m = args.ratio_kl(OPS, logp, old_logp, mask)
    kl_penalty(logp, ref_logp, m, kind=kind, clamp=clamp)         # validates ref_logp, kind
    return kl_term(logp, old_logp, ref_logp, m, kind, clamp, "ratio")


def ratio_kl_penalty_vjp(g, logp, old_logp, ref_logp, mask=None, *, kind="k1", clamp=None):
    """VJP of `ratio_kl_penalty` wrt logp (old_logp and ref_logp are constants).

    Gradient:
      K = r·k with ∂r/∂logp = r (r = exp(logp − old_logp)), so by the product rule
          ∂K/∂logp = r·∂k/∂logp + r·k = r·(∂k/∂logp + k),
      ∂k/∂logp being kl_penalty's (k1: +1, k2: logp − ref, k3: 1 − ref/π, abs: −sign(x)).
      For k1 (x = ref − logp): r·(1 − x) = r·(1 + log(π/ref)). Where no clamp binds, ∂k + k is
      taken in closed form (`kl.weighted_slope`: k3's terms cancel to −x); where a clamp binds
      ∂k = 0 and the gradient is r·k. Past the exp cap of r, r is flat: r·∂k/∂logp alone.
      Masked positions get 0. (`kl_term_vjp` with weight "ratio".)

    Returns:
      {"logp": [B, T]} float64.
    """
    m = args.ratio_kl(OPS, logp, old_logp, mask)
    kl_penalty(logp, ref_logp, m, kind=kind, clamp=clamp)
    return {"logp": kl_term_vjp(g, logp, old_logp, ref_logp, m, kind, clamp, "ratio")}


def policy_objective(logp, old_logp, advantages, mask, ref_logp=None, *, loss="ppo",
                     agg="seq-mean-token-mean", beta=0.0, kl_kind="k3", kl_clamp=None, norm=None,
                     empty_rows="exclude", kl_weight=None, kl_anchor="ref", group_size=None,
                     group_ids=None, adv_tau=0.0, adv_kl=0.0, **loss_kwargs):
    """The actor loss a trainer minimises: aggregate(policy_loss + β·kl_penalty).

        J = aggregate(l_policy(logp) + β·k(logp, ref_logp), mask, mode=agg)

    With kl_weight="ratio" the KL term is β·r·k, r = exp(logp − old_logp) attached (TRL's
    use_bias_correction_kl at importance_sampling_level='token': the KL estimate importance-
    weighted from the sampling policy to the current one). With kl_weight="score" it is
    β·exp(logp − sg(logp))·k: the value β·k, the gradient β·(∇k + k·∇logp), the score term of a
    KL estimated on the policy's own samples (NeMo-RL's ClippedPGLossFn; a clamp that binds
    zeroes both terms, see kl_term_vjp).
    With kl_anchor="old" the KL term is k(logp, old_logp), a penalty toward the sampling policy
    instead of a reference model, and ref_logp is not read: prime-rl's default loss adds
    τ·(log r)² = 2τ·k2(logp, old_logp) per token (prime-rl cites Kimi K2.5, arXiv:2602.02276).
    Kimi k1.5's regulariser (arXiv:2501.12599, eq. 3) is another: τ/2·(log r)² of the whole
    response, its log-ratio summed over the tokens before squaring.
    With adv_tau or adv_kl the loss is given `shaped_advantages(..., tau=adv_tau,
    kl_coef=adv_kl)` in place of A, a constant (detached): Kimi's τ-shifted advantage
    A − τ·sg(log r) per token, and a KL folded into the advantage as a centred k1 (ART's
    kimi_k2_tau and kl_penalty_coef).

    Reference: GRPO, arXiv:2402.03300, eq. (3) (KL as a per-token loss term); the aggregation
    modes of verl `agg_loss`.
    Note: `loss` is "ppo" (`ppo_clip_loss`), "cispo" (`cispo_loss`), "gspo" (`gspo_loss`),
    "sapo" (`sapo_loss`), "vespo" (`vespo_loss`) or "dppo" (`dppo_loss`);
    `**loss_kwargs` go to it.
    `norm`, `empty_rows`, `group_size`, `group_ids` go to `aggregate` (the rows' prompts, read
    by agg="prompt-mean-token-mean": SkyRL's prompt_mean); `kl_kind`, `kl_clamp` to
    `kl_penalty`.

    Args:
      logp, old_logp: [B, T] float.
      advantages: [B, T] or [B] float.
      mask: [B, T] bool or 0/1 (required).
      ref_logp: [B, T] float, or None when beta = 0 or kl_anchor = "old".
      loss, agg, beta (≥ 0), kl_kind, kl_clamp, norm, empty_rows: see above.
      kl_weight: None | "ratio" | "score" (see above).
      kl_anchor: "ref" | "old" (see above).
      group_size, group_ids: the rows' prompts, for agg="prompt-mean-token-mean" (as
        aggregate's: exactly one of the two there).
      adv_tau, adv_kl: τ ≥ 0 and c ≥ 0 of `shaped_advantages` (adv_kl > 0 reads ref_logp).

    Returns:
      float64 scalar.
    """
    fn, _, use_kl, beta, kl_kw = _policy_parts(mask, ref_logp, loss, beta, kl_kind,
                                               kl_clamp, agg, kl_weight, kl_anchor)
    advantages = _shaped(logp, old_logp, advantages, mask, ref_logp, adv_tau, adv_kl)
    per_token = fn(logp, old_logp, advantages, mask, **loss_kwargs)
    anchor = _kl_anchor(old_logp, ref_logp, kl_anchor)
    if anchor is not None:              # checked even at beta = 0: a wrong one is still a bug
        kl = kl_term(logp, old_logp, anchor, mask, **kl_kw)
        if use_kl:
            with np.errstate(over="ignore", invalid="ignore"):   # reported just below
                per_token = per_token + beta * kl
    _finite_objective(per_token, logp, old_logp, advantages, mask, ref_logp)
    return aggregate(per_token, mask, mode=agg, norm=norm, empty_rows=empty_rows,
                     group_size=group_size, group_ids=group_ids)


def policy_objective_vjp(g, logp, old_logp, advantages, mask, ref_logp=None, *, loss="ppo",
                         agg="seq-mean-token-mean", beta=0.0, kl_kind="k3", kl_clamp=None,
                         norm=None, empty_rows="exclude", kl_weight=None, kl_anchor="ref",
                         group_size=None, group_ids=None, adv_tau=0.0, adv_kl=0.0,
                         **loss_kwargs):
    """VJP of `policy_objective` wrt logp, by the chain rule through its parts.

    Gradient:
      aggregate is linear: J = Σ_bt w_bt·l_bt with the per-token weights w of `aggregate_vjp`
      (under "prompt-mean-token-mean" w = m_bt/(N_p(b)·P'), the prompts fixed by the data).
      So the cotangent reaching the per-token losses is g·w, and
          ∂J/∂logp = policy_vjp(g·w) + β·kl_term_vjp(g·w)
      (ref_logp, old_logp and A are constants; kl_term_vjp is kl_penalty's, or with
      kl_weight="ratio" the product rule r·∂k/∂logp + r·k, with "score" ∂k/∂logp + k where
      no clamp binds; with kl_anchor="old" the KL's
      second argument is old_logp, still a constant, so the same formulas hold with it).
      A shaped advantage (adv_tau, adv_kl) is detached: the policy VJP takes it as the
      constant A it is given, and no term flows through it.

    Returns:
      {"logp": [B, T]} float64.
    """
    fn, vjp, use_kl, beta, kl_kw = _policy_parts(mask, ref_logp, loss, beta, kl_kind,
                                                 kl_clamp, agg, kl_weight, kl_anchor)
    advantages = _shaped(logp, old_logp, advantages, mask, ref_logp, adv_tau, adv_kl)
    per_token = fn(logp, old_logp, advantages, mask, **loss_kwargs)
    _finite_objective(per_token, logp, old_logp, advantages, mask, ref_logp)
    w = aggregate_vjp(g, per_token, mask, mode=agg, norm=norm, empty_rows=empty_rows,
                      group_size=group_size, group_ids=group_ids)["loss"]
    grad = vjp(w, logp, old_logp, advantages, mask, **loss_kwargs)["logp"]
    anchor = _kl_anchor(old_logp, ref_logp, kl_anchor)
    if anchor is not None:
        kl_grad = kl_term_vjp(w, logp, old_logp, anchor, mask, **kl_kw)
        if use_kl:
            grad = grad + beta * kl_grad
    return {"logp": grad}
