"""The registry: one entry per reference function, built explicitly (no import side effects).

An entry is the one place that knows a function. It ties the NumPy function, its hand VJP and
the torch twin to:
- what it is differentiable in, and whether trainers differentiate through it at all (advantage
  estimators and logged metrics are computed without gradients);
- its case generator, and its outputs' names;
- its stop-gradient, in words and as a freeze rule for finite differences;
- the conventions a diagnosis may vary (its grid) and the known bugs written as variants;
- the audit's property checks that apply to it;
- its data keywords (inputs passed as keywords, not conventions) and default conventions.
The harness, the audit, its diagnosis and `--scale` read entries; nothing selects behaviour by
comparing function names.
"""
import dataclasses
import inspect
from typing import Callable, Dict, Mapping, Optional, Tuple

import ref_numpy
from ref_common import vocab

from . import cases, oracles, variants

# A freeze rule: (numpy fn, arrays, params, input name, perturbation of that input) ->
# (numpy function, arrays, params) whose value is the objective with every detached factor held
# at its value at the unperturbed point. An entry's `freeze` gives the rule for a case's params.
Freeze = Callable[..., Tuple[Callable, Dict[str, object], Dict[str, object]]]

PROPERTY_CHECKS = ("permutation", "microbatch", "kl_direction")


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    numpy_fn: Callable
    numpy_vjp: Optional[Callable]
    torch_fn: Callable
    diff: Tuple[str, ...]                    # differentiable inputs
    case: Callable                           # (rng, index) -> cases.Case
    detached: str = ""                       # the stop-gradient factor, in words
    freeze: Optional[Callable[[Mapping[str, object]], Optional[Freeze]]] = None
    outputs: Tuple[str, ...] = ("output",)   # names of the returned arrays (dict keys if dict)
    dict_output: bool = False                # the function returns a dict keyed by `outputs`
    # outputs an audited function may leave out of its dict (a figure the reference adds, such
    # as log_var beside var); an audit compares those it returns
    optional_outputs: Tuple[str, ...] = ()
    # Gradient-valued functions (their outputs *are* gradients wrt `diff[0]`): for each output,
    # the scalar objective whose finite differences it must equal. numpy_vjp is None for them.
    objectives: Optional[Callable] = None
    trainer_grad: bool = True                # trainers back-propagate through it (a loss)
    data_keywords: Tuple[str, ...] = ()      # keyword-only inputs that are data, not conventions
    checks: Tuple[str, ...] = ()             # the audit's property checks that apply
    grid: Mapping[str, tuple] = dataclasses.field(default_factory=dict)   # diagnosis variants
    known_bugs: Tuple[variants.KnownBug, ...] = ()
    # the convention change that is the same as dropping the stop-gradient, given the declared
    # conventions (GSPO-token's sequence ratio differentiated is form="sequence"), or None
    undetached: Optional[Callable[[Mapping[str, object]], Optional[Dict[str, object]]]] = None
    # where the reference is not differentiable on given data and conventions: {input: mask}
    # (a NaN gradient of the user's there is no failure)
    kinks: Optional[Callable[[Mapping[str, object], Mapping[str, object]],
                             Dict[str, object]]] = None
    # the condition number κ ≥ 1 of each output on given data and conventions (None: 1); the
    # closeness rule widens its tolerance by κ (crosscheck.bridge)
    condition: Optional[Callable[[Mapping[str, object], Mapping[str, object]], list]] = None
    # where the reference's output is one of several right ones on given data and conventions
    # (a tie its definition leaves open): why, else None; an audit does not judge such a case
    ambiguous: Optional[Callable[[Mapping[str, object], Mapping[str, object]],
                                 Optional[str]]] = None
    # how finite differences evaluate many perturbed copies in one call (crosscheck/check/
    # stacking.py): "rows" (each output row depends on that row of the inputs only; its freeze
    # rule must keep that true), "groups" (rows interact within a group only), "many" (it
    # couples the batch; ref_numpy.many evaluates many points in one call), or None (one call
    # per point)
    stack: Optional[str] = None
    # the inputs that cannot change the output under given conventions (policy_objective's
    # ref_logp when beta = 0): an audited function need not take them
    unused: Optional[Callable[[Mapping[str, object]], Tuple[str, ...]]] = None
    # the inputs holding log-probabilities (≤ 0 in a trainer's batch, padded alike, and whose
    # differences are log-ratios a trainer exponentiates); by default every input the
    # reference names logp or <policy>_logp (see logprob_inputs)
    logprobs: Tuple[str, ...] = ()
    # whether its value under given conventions is a surrogate whose gradient is what trains:
    # a loss with a policy-gradient form −sg(g)·A·log π of the same gradient, which a trainer
    # may write instead (CISPO's −sg(w)·A·log π for −w·A, SAPO's and VESPO's gates alike); a
    # trainer's value that differs only so is a convention (crosscheck.trainer.card grades it)
    surrogate: Optional[Callable[[Mapping[str, object]], bool]] = None

    def freeze_for(self, params) -> Optional[Freeze]:
        """The freeze rule that applies to a case, or None (no stop-gradient in its definition)."""
        return None if self.freeze is None else self.freeze(params)

    @property
    def defaults(self) -> Dict[str, object]:
        """The default conventions: keyword-only parameters with defaults, less data keywords."""
        return {n: v for n, v in oracles.keyword_defaults(self.numpy_fn).items()
                if n not in self.data_keywords}

    @property
    def conventions(self) -> Tuple[str, ...]:
        """Every convention keyword, with or without a default."""
        return tuple(n for n, p in inspect.signature(self.numpy_fn).parameters.items()
                     if p.kind is p.KEYWORD_ONLY and n not in self.data_keywords)

    @property
    def takes_more(self) -> bool:
        """The function takes **kwargs (policy_objective passes them to its loss)."""
        return any(p.kind is p.VAR_KEYWORD
                   for p in inspect.signature(self.numpy_fn).parameters.values())


def _twin(name):
    """ref_torch.<name>, imported at its first call: what reads only the registry's facts
    (`--list`, the walkthrough's NumPy side) runs without torch."""
    def twin(*args, **kwargs):
        import ref_torch
        return getattr(ref_torch, name)(*args, **kwargs)
    twin.__name__ = twin.__qualname__ = name
    twin.__module__ = "ref_torch"
    return twin


def logprob_inputs(fn) -> Tuple[str, ...]:
    """The array inputs of a reference that hold log-probabilities, read from its signature:
    ref_common's vocabulary names a log-prob input `logp` or `<policy>_logp`
    (vocab.is_logprob)."""
    return tuple(n for n, p in inspect.signature(fn).parameters.items()
                 if p.kind is p.POSITIONAL_OR_KEYWORD and vocab.is_logprob(n))


def _entry(name, diff, **facts):
    fn = getattr(ref_numpy, name)
    facts.setdefault("logprobs", logprob_inputs(fn))
    return Entry(name=name, numpy_fn=fn, numpy_vjp=getattr(ref_numpy, name + "_vjp", None),
                 torch_fn=_twin(name), diff=diff,
                 case=getattr(cases, name + "_case"), **facts)


def _kl_cov_tie(args, params):
    """KL-Cov penalises the k tokens of largest covariance; where the k-th and (k+1)-th are
    equal (to rounding, float32's included: the trainer forms them in its own arithmetic), any
    of the tied tokens is a right choice, whichever way its top-k breaks ties. With one
    advantage per sequence and one non-empty row, every covariance is 0."""
    import numpy as np
    lp = np.asarray(args["logp"], dtype=np.float64)
    adv = np.asarray(args["advantages"], dtype=np.float64)
    m = np.ones(lp.shape, bool) if args.get("mask") is None else \
        np.asarray(args["mask"], dtype=bool)
    if adv.shape != lp.shape:
        adv = np.broadcast_to(adv.reshape(adv.shape + (1,) * (lp.ndim - adv.ndim)), lp.shape)
    if m.sum() < 2:
        return None
    ratio = params["ratio"] if "ratio" in params else \
        inspect.signature(ref_numpy.kl_cov_loss).parameters["ratio"].default
    cov, k = cases.kl_cov_ranking(lp, adv, m, ratio)
    if k >= len(cov):
        return None
    a, l = adv[m], lp[m]
    # the rounding of (a − ā)(l − l̄) scales with the inputs, not with the centred values: a
    # batch of equal advantages has covariances of exactly 0 that rounding makes ±1e-17. The
    # band covers float32 code (unit roundoff 6e-8, its sums' growth included)
    da, dl = np.abs(a - a.mean()).max(), np.abs(l - l.mean()).max()
    scale = np.abs(a).max() * dl + da * np.abs(l).max()
    if cov[k - 1] - cov[k] <= 1e-6 * max(scale, 1e-300):
        return ("the covariance terms tie at the selection's boundary (the k-th and "
                "(k+1)-th largest are equal): any of the tied tokens is a right KL-Cov "
                "selection, so the case is not judged")
    return None


def _sequence_rows(args):
    """(logp, old_logp, mask) of a sequence-level mask's call as float64 [B, T] rows (a [T]
    trajectory as one row; no mask: every token valid)."""
    import numpy as np
    lp = np.asarray(args["logp"], dtype=np.float64)
    old = np.asarray(args["old_logp"], dtype=np.float64)
    m = np.ones(lp.shape, bool) if args.get("mask") is None else \
        np.asarray(args["mask"], dtype=bool)
    return (lp[None], old[None], m[None]) if lp.ndim == 1 else (lp, old, m)


def _opsm_tie(args, params):
    """OPSM compares each row's mean log-ratio D with δ: where D lies within rounding of δ (in
    the trainer's own arithmetic), either side is a right mask."""
    import numpy as np
    lp, old, m = _sequence_rows(args)
    drift = cases.opsm_drift(lp, old, m).ravel()
    delta = params.get("delta", inspect.signature(ref_numpy.opsm_mask).parameters["delta"].default)
    scale = np.where(m, np.abs(old) + np.abs(lp), 0.0).max(axis=-1, initial=0.0)
    if np.any(np.abs(drift - delta) <= 1e-5 * np.maximum(scale, 1e-300)):
        return ("a sequence's mean log-ratio equals OPSM's threshold δ to rounding: keeping or "
                "dropping its negative-advantage tokens are both right, so the case is not judged")
    return None


def _tv_tie(args, params):
    """The TV filter compares each row's mean |ρ − 1| with its bounds: where it equals one to
    rounding (in the trainer's own arithmetic), keeping or dropping the row's tokens are both
    right."""
    import numpy as np
    lp, old, m = _sequence_rows(args)
    drift = ref_numpy.pg_losses.tv_drift(lp, old, m, params.get("log_ratio_clamp")).ravel()
    for bound in (params.get("lower"), params.get("upper")):
        if bound is not None and np.any(np.abs(drift - bound) <= 1e-5 * max(bound, 1.0)):
            return ("a sequence's mean |ρ − 1| equals a bound of the TV filter to rounding: "
                    "keeping or dropping its tokens are both right, so the case is not judged")
    return None


def _m2po_tie(args, params):
    """M2PO drops the k largest squared log-ratios: where the k-th and (k+1)-th are equal to
    rounding, or the mean it compares with τ is τ to rounding, more than one mask is right."""
    import numpy as np
    lp = np.asarray(args["logp"], dtype=np.float64)
    old = np.asarray(args["old_logp"], dtype=np.float64)
    m = np.ones(lp.shape, bool) if args.get("mask") is None else \
        np.asarray(args["mask"], dtype=bool)
    with np.errstate(invalid="ignore"):
        x = np.sort(((lp - old) ** 2)[m])[::-1]
    tau = params.get("threshold",
                     inspect.signature(ref_numpy.m2po_mask).parameters["threshold"].default)
    n = x.size
    if n < 2:
        return None
    rest = np.cumsum(x[::-1])[::-1] / np.arange(n, 0, -1)
    below = np.flatnonzero(rest < tau)
    k = int(below[0]) if below.size else n - 1
    rtol = 1e-5 * max(x[0], 1e-300)
    near_tau = np.abs(rest[max(k - 1, 0):k + 1] - tau) <= 1e-5 * max(tau, rest[0])
    tied = 0 < k < n and x[k - 1] - x[k] <= rtol
    if tied or near_tau.any():
        return ("the squared log-ratios tie at M2PO's cut, or the mean of the rest equals τ to "
                "rounding: more than one mask is right, so the case is not judged")
    return None


def _gspo_undetached(params):
    form = params.get("form", oracles.GSPO_DEFAULTS["form"])
    return {"form": "sequence"} if form == "token" else None


def _objective_undetached(params):
    return _gspo_undetached(params) if params.get("loss") == "gspo" else None


# the policy loss entry that policy_objective's `loss` convention names
POLICY_LOSS_ENTRIES = {"ppo": "ppo_clip_loss", "cispo": "cispo_loss", "gspo": "gspo_loss",
                       "sapo": "sapo_loss", "vespo": "vespo_loss", "dppo": "dppo_loss"}
assert tuple(POLICY_LOSS_ENTRIES) == vocab.POLICY_LOSSES

_PPO_GRID = dict(clip_low=(0.2, 0.1, 0.28), clip_high=(None, 0.2, 0.28), clip_c=(None, 3.0),
                 delta=(None, 3.0), log_ratio_clamp=(None, 20.0))


# policy_objective's losses whose gradient a trainer may write as −sg(g)·A·log π (the KL term's
# value is no surrogate: with β > 0 the value stays judged)
SURROGATE_LOSSES = ("cispo", "sapo", "vespo")


def build() -> Dict[str, Entry]:
    """A fresh registry, in the order the harness reports."""
    entries = [
        _entry("gae", ("rewards", "values"), outputs=("advantages", "returns"),
               stack="rows",
               trainer_grad=False, data_keywords=("dones", "last_value"),
               grid=dict(gamma=(1.0, 0.99), lam=(1.0, 0.95))),
        _entry("whiten", ("x",), trainer_grad=False, stack="many",
               grid=dict(ddof=(0, 1), eps=(1e-8, 1e-6, 1e-5), eps_mode=vocab.EPS_MODES,
                         shift_mean=(True, False), restore_mean=(False, True)),
               known_bugs=variants.WHITEN, kinks=oracles.whiten_kinks,
               condition=oracles.whiten_condition),
        _entry("group_advantages", ("rewards",), trainer_grad=False, stack="groups",
               data_keywords=("group_size", "group_ids", "valid"), checks=("permutation",),
               grid=dict(ddof=(0, 1), eps=(1e-4, 1e-6, 1e-8, 1e-9, 0.0),
                         scale=vocab.GROUP_SCALES,
                         baseline=vocab.GROUP_BASELINES, singleton=("zero", "keep")),
               known_bugs=variants.GROUPS, kinks=oracles.group_kinks,
               condition=oracles.group_condition),
        _entry("ppo_clip_loss", ("logp",), grid=_PPO_GRID, known_bugs=variants.PPO, stack="rows"),
        _entry("cispo_loss", ("logp",), detached="w = clip(ratio): CISPO's importance weight",
               stack="rows",
               freeze=lambda params: oracles.freeze_ratio,
               grid=dict(bound=vocab.CISPO_BOUNDS, clip_high=(5.0, 4.0, 2.0, 0.28, 0.2),
                         clip_low=(None, 0.2)),
               known_bugs=variants.CISPO, surrogate=lambda params: True),
        _entry("gspo_loss", ("logp",), stack="rows",
               detached="the sequence ratio in form='token' (straight-through GSPO-token)",
               freeze=oracles.gspo_rule, undetached=_gspo_undetached,
               grid=dict(form=vocab.GSPO_FORMS, clip_low=(3e-4, 0.2), clip_high=(4e-4, 0.2, 0.28),
                         log_ratio_max=(None, 10.0)),
               known_bugs=variants.GSPO),
        _entry("value_loss", ("values",), grid=dict(clip=(None, 0.2, 0.5)), stack="rows",
               known_bugs=variants.VALUE),
        _entry("kl_penalty", ("logp",), checks=("kl_direction",), stack="rows",
               grid=dict(kind=vocab.KL_KINDS, clamp=(None, (20.0, 10.0), (None, 10.0))),
               known_bugs=variants.KL),
        _entry("aggregate", ("loss",), checks=("microbatch",), stack="many",
               data_keywords=("group_size", "group_ids"),
               grid=dict(mode=vocab.AGG_MODES + vocab.GROUPED_AGG_MODES,
                         empty_rows=vocab.EMPTY_ROWS),
               unused=lambda params: () if params.get("mode") in vocab.GROUPED_AGG_MODES
               else ("group_size", "group_ids")),
        _entry("policy_objective", ("logp",),
               detached="CISPO's weight, VESPO's φ(w), GSPO-token's sequence ratio, DPPO's, "
               "or sg(logp) of the KL's score weight",
               freeze=oracles.objective_rule, undetached=_objective_undetached,
               checks=("microbatch",), stack="many", data_keywords=("group_size", "group_ids"),
               grid=dict(agg=vocab.AGG_MODES + vocab.GROUPED_AGG_MODES,
                         empty_rows=vocab.EMPTY_ROWS, loss=vocab.POLICY_LOSSES,
                         kl_weight=vocab.KL_WEIGHTS, kl_anchor=vocab.KL_ANCHORS),
               known_bugs=variants.OBJECTIVE,
               surrogate=lambda params: params.get("loss") in SURROGATE_LOSSES and
               not params.get("beta"),
               unused=lambda params: (() if params.get("beta") and
                                      params.get("kl_anchor", "ref") == "ref" or
                                      params.get("adv_kl") else
                                      ("ref_logp",)) +
               (() if params.get("agg") in vocab.GROUPED_AGG_MODES else
                ("group_size", "group_ids"))),
        _entry("kl_estimator_moments", ("logits",), outputs=vocab.MOMENT_KEYS, dict_output=True,
               optional_outputs=("log_var",), trainer_grad=False, stack="many"),
        _entry("kl_estimator_gradient", ("logits",), outputs=vocab.GRADIENT_KEYS,
               dict_output=True, objectives=oracles.estimator_objectives, trainer_grad=False,
               data_keywords=("sample_logits",)),
        _entry("discounted_returns", ("rewards",), trainer_grad=False, stack="rows",
               grid=dict(gamma=(1.0, 0.99))),
        _entry("approx_kl", ("logp",), trainer_grad=False, stack="many",
               grid=dict(kind=vocab.ESTIMATOR_KINDS)),
        _entry("clip_fraction", (), trainer_grad=False,             # a count: value stage only
               grid=dict(definition=vocab.CLIP_FRACTIONS)),
        _entry("sapo_loss", ("logp",), stack="rows", surrogate=lambda params: True,
               grid=dict(tau_pos=(1.0, 0.5, 2.0, 1.05), tau_neg=(1.05, 1.0, 1.5),
                         log_ratio_clamp=(None, 20.0), level=vocab.SAPO_LEVELS)),
        _entry("vespo_loss", ("logp",), stack="rows", surrogate=lambda params: True,
               detached="φ(w): the gamma weight of the sequence ratio",
               freeze=lambda params: oracles.freeze_ratio,
               grid=dict(k_pos=(2.0, 1.0), lambda_pos=(3.0, 1.0), k_neg=(3.0, 2.0),
                         lambda_neg=(2.0, 1.0), log_ratio_clamp=(20.0, None)),
               known_bugs=variants.VESPO),
        _entry("rollout_is_weights", (), trainer_grad=False,     # detached weights: values
               grid=dict(level=vocab.IS_LEVELS, mode=vocab.IS_MODES, seq_stat=vocab.IS_SEQ_STATS,
                         kept=vocab.IS_KEPT, log_ratio_clamp=(None, 20.0))),
        _entry("opsm_mask", (), trainer_grad=False, ambiguous=_opsm_tie,   # a mask: values
               grid=dict(delta=(1e-4, 1e-3, 0.0))),
        _entry("m2po_mask", (), trainer_grad=False, ambiguous=_m2po_tie,   # a mask: values
               grid=dict(threshold=(0.04, 0.01))),
        _entry("reinforce_loss", ("logp",), stack="rows",
               detached="w: the rollout-correction weight (is_level set)",
               freeze=lambda params: oracles.freeze_ratio if params.get("is_level") else None,
               grid=dict(beta=(0.0,), is_level=(None,) + vocab.IS_LEVELS,
                         is_log_ratio_clamp=(20.0, None))),
        _entry("dppo_loss", ("logp",), stack="rows",
               detached="min(r, C) (in form 'logp') and the trust-region indicator",
               freeze=lambda params: oracles.freeze_ratio
               if params.get("form", "logp") == "logp" else None,
               grid=dict(form=vocab.DPPO_FORMS, divergence=vocab.DPPO_DIVERGENCES,
                         clip_c=(3.0, 20.0, None),
                         kl_eps=(0.0, 1e-8), log_ratio_clamp=(20.0, None),
                         clip_low=(0.2, 0.1, 0.28), clip_high=(None, 0.2, 0.28)),
               known_bugs=variants.DPPO),
        _entry("decoupled_ppo_loss", ("logp",), stack="rows",
               grid=dict(clip_low=(0.2, 0.1, 0.28), clip_high=(None, 0.2, 0.28),
                         clip_c=(None, 3.0), is_level=(None,) + vocab.IS_LEVELS,
                         is_mode=vocab.IS_MODES, is_upper=(None, 5.0, 2.0),
                         is_seq_stat=vocab.IS_SEQ_STATS)),
        _entry("gmpo_loss", ("logp",), stack="many",
               grid=dict(clip_low=(0.2, 0.4, 0.1), clip_high=(None, 0.2, 0.4),
                         eps=(0.0, 1e-8))),
        _entry("kl_cov_loss", ("logp",), stack="many", ambiguous=_kl_cov_tie,
               grid=dict(ratio=(2e-4, 0.1, 0.2), coef=(1.0, 0.1, 0.5))),
        _entry("entropy", ("logits",), stack="rows"),
        _entry("kl_rewards", ("logp",), trainer_grad=False, stack="rows",
               grid=dict(kind=vocab.KL_KINDS, clamp=(None, (20.0, 10.0), (None, 10.0)),
                         beta=(0.05, 0.1, 0.01))),
        _entry("opo_advantages", ("rewards",), trainer_grad=False, stack="groups",
               data_keywords=("group_size", "group_ids"), checks=("permutation",)),
        _entry("gpg_advantages", ("rewards",), trainer_grad=False, stack="many",
               data_keywords=("group_size", "group_ids"), checks=("permutation",),
               grid=dict(f_norm=(1.0, 2.0))),
        _entry("passk_advantages", ("rewards",), trainer_grad=False, stack="groups",
               data_keywords=("group_size", "group_ids"), checks=("permutation",),
               grid=dict(eps=(1e-6, 1e-4, 0.0), scale=("group", "none")),
               condition=oracles.passk_condition),
        _entry("remax_advantages", ("rewards", "baselines"), trainer_grad=False, stack="rows"),
        _entry("whitened_group_advantages", ("rewards",), trainer_grad=False, stack="many",
               data_keywords=("group_size", "group_ids"), checks=("permutation",),
               grid=dict(scale=("none", "group"), eps=(1e-6, 1e-4), whiten_eps=(1e-8, 1e-6))),
        _entry("optimal_token_baseline_advantages", ("rewards",), trainer_grad=False,
               stack="groups", data_keywords=("group_size", "group_ids"),
               checks=("permutation",), grid=dict(zero_tail=(True, False), eps=(1e-8, 1e-6))),
        _entry("fipo_influence_weights", (), trainer_grad=False,  # detached weights: values
               grid=dict(decay_rate=(32.0, 16.0), lower=(1.0, 0.8, None),
                         upper=(1.2, None), ratio_threshold=(None, 10.0),
                         safety_threshold=(4.0, None))),
        _entry("ratio_kl_penalty", ("logp",), stack="rows",
               grid=dict(kind=vocab.KL_KINDS, clamp=(None, (40.0, None), (20.0, 10.0)))),
        _entry("tv_filter_mask", (), trainer_grad=False, ambiguous=_tv_tie,  # a mask: values
               grid=dict(log_ratio_clamp=(None, 10.0))),
        # ART's advantage shaping: Kimi's τ-shifted advantage and a KL folded in as a centred
        # k1 (detached where a trainer uses it: policy_objective's adv_tau and adv_kl)
        _entry("shaped_advantages", ("logp",), trainer_grad=False, stack="many",
               grid=dict(tau=(0.0, 0.5, 1.0), kl_coef=(0.0, 0.1, 1.0))),
    ]
    return {e.name: e for e in entries}


REGISTRY: Dict[str, Entry] = build()
