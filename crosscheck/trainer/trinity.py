"""Trinity-RFT's report card: trinity/algorithm/{policy_loss_fn,kl_fn}/ and
trinity/algorithm/utils.py.

Facts read in trinity-rft 0.6.0:
- every `trinity.algorithm.*` import runs the package `__init__`, which reaches `import ray`
  (trinity/utils/log.py); the math files themselves import only torch, so the card loads them
  by file;
- a policy loss is a class whose `__call__(logprob, old_logprob, action_mask, advantages)`
  returns (loss, metrics); `PolicyLossFnMeta` wraps `__call__` to rename verl's keys and drop
  unknown keywords; the card calls it with Trinity's own names;
- the losses aggregate with `trinity.algorithm.utils.aggregate_loss` (verl's modes, local to
  the call: the token counts are the call's; the seq-mean modes divide by every row, empty ones
  included, and token-mean adds 1e-8 to the count);
- the KL classes' `calculate_kl(logprob, ref_logprob)` give the per-token estimate ('k3' is the
  unclamped estimator, 'low_var_kl' verl's clamped one).
"""
import inspect

from .card import DoesNotFit, Row, Trainer, owner_class, per_sequence
from .verl import _whiten

P = "trinity.algorithm.policy_loss_fn"
KL = "trinity.algorithm.kl_fn.kl_fn"
UTILS = "trinity.algorithm.utils"


def _policy(**settings):
    """The loss class built with `settings` and called on one batch (advantages broadcast over
    the response, as Trinity's advantage functions store them)."""
    def make(cls):
        def adapter(logp, old_logp, advantages, mask):
            loss, _ = cls(**settings)(logprob=logp, old_logprob=old_logp,
                                      action_mask=mask.bool(),
                                      advantages=per_sequence(advantages, logp))
            return loss
        return adapter
    return make


def _kl(fn):
    cls = owner_class(fn)

    def adapter(logp, ref_logp, mask):
        return cls(kl_coef=0.001).calculate_kl(logp, ref_logp)
    return adapter


def _aggregate(mode):
    def make(fn):
        def adapter(loss, mask):
            return fn(loss, mask.bool(), loss_agg_mode=mode)
        return adapter
    return make


_CALL = ("the loss class constructed with the settings below and called with Trinity's own "
         "key names (logprob, old_logprob, action_mask as bool, advantages broadcast to "
         "[B, T]); the loss output of (loss, metrics)",
         "judged on whole batches: the aggregation is local to the call, and the actor's "
         "micro-batch scaling lies outside these functions")
# a policy-loss row names the class (its metaclass replaces __call__ by a (*args, **kwargs)
# wrapper): the adapter builds it, and the parameters are checked on the class's source
_PARAMS = ()


def _fits_call(cls):
    source = inspect.getsource(cls)
    missing = [p for p in ("logprob", "old_logprob", "action_mask", "advantages")
               if f"{p}:" not in source and f"{p}," not in source]
    if missing:
        raise DoesNotFit(f"{cls.__name__}.__call__ no longer names {', '.join(missing)}")
    return {}
_WHOLE = dict(accumulation="none")
_PPO = dict(loss="ppo", beta=0.0, agg="token-mean", clip_low=0.2, clip_c=3.0,
            log_ratio_clamp=20.0)

ROWS = (
    Row(f"{P}.ppo_policy_loss:PPOPolicyLossFn", "policy_objective",
        _policy(clip_range=0.2), label="ppo",
        choices=_CALL + ("clip_range 0.2 (its default_args), clip_ratio_c 3.0, token-mean "
                         "(its defaults)",),
        conventions=dict(_PPO, clip_high=0.2),
        audit=_WHOLE, params=_PARAMS, fits=_fits_call),
    Row(f"{P}.ppo_policy_loss:PPOPolicyLossFn", "policy_objective",
        _policy(clip_range_low=0.2, clip_range_high=0.28), label="ppo, 0.2/0.28",
        choices=_CALL + ("clip_range_low 0.2, clip_range_high 0.28: the bounds apart, so a "
                         "swap shows",),
        conventions=dict(_PPO, clip_high=0.28),
        audit=_WHOLE, params=_PARAMS, fits=_fits_call),
    Row(f"{P}.gspo_policy_loss:GSPOLossFn", "policy_objective",
        _policy(clip_range_low=3e-4, clip_range_high=4e-4), label="gspo",
        choices=_CALL + ("clip_range_low 3e-4, clip_range_high 4e-4 (its default_args), "
                         "seq-mean-token-mean (its default)",),
        conventions=dict(loss="gspo", beta=0.0, agg="seq-mean-token-mean",
                         empty_rows="include", form="token", clip_low=3e-4, clip_high=4e-4,
                         log_ratio_max=None),
        audit=_WHOLE, params=_PARAMS, fits=_fits_call),
    Row(f"{P}.cispo_policy_loss:CISPOPolicyLossFn", "policy_objective", _policy(),
        label="cispo",
        choices=_CALL + ("clip_range_low 1.0, clip_range_high 0.28, no mask clip, token-mean "
                         "(its defaults)",),
        conventions=dict(loss="cispo", beta=0.0, agg="token-mean", bound="relative",
                         clip_low=1.0, clip_high=0.28, log_ratio_clamp=None),
        audit=_WHOLE, params=_PARAMS, fits=_fits_call),
    Row(f"{P}.sapo_policy_loss:SAPOPolicyLossFn", "policy_objective", _policy(),
        label="sapo",
        choices=_CALL + ("tau_pos 1.0, tau_neg 1.05, token-mean (its defaults)",),
        conventions=dict(loss="sapo", beta=0.0, agg="token-mean", tau_pos=1.0, tau_neg=1.05,
                         log_ratio_clamp=None),
        audit=_WHOLE, params=_PARAMS, fits=_fits_call),
) + tuple(
    Row(f"{KL}:{cls}.calculate_kl", "kl_penalty", _kl, label=name,
        choices=("calculate_kl(logprob, ref_logprob) of the class built with kl_coef 0.001 "
                 "(its default_args); read at the valid tokens",),
        conventions=dict(kind=kind, clamp=clamp), params=("logprob", "ref_logprob"))
    for cls, name, kind, clamp in (("K1Fn", "k1", "k1", None), ("K2Fn", "k2", "k2", None),
                                   ("K3Fn", "k3", "k3", None), ("AbsFn", "abs", "abs", None),
                                   ("LowVarKLFn", "low_var_kl", "k3", (20.0, 10.0)))
) + tuple(
    Row(f"{UTILS}:aggregate_loss", "aggregate", _aggregate(mode), label=mode,
        choices=("mask as bool",) + (("judged on whole batches: the per-sequence modes "
                                      "divide by the call's rows, empty ones included",)
                                     if mode != "token-mean" else
                                     ("judged on whole batches: the token count is the "
                                      "call's",)),
        conventions=dict(mode=mode, empty_rows="include" if mode != "token-mean" else
                         "exclude"),
        audit=_WHOLE, params=("values", "mask", "loss_agg_mode"))
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
) + (
    Row(f"{UTILS}:masked_whiten", "whiten", _whiten, choices=("mask as a float tensor",),
        conventions=dict(ddof=1, eps=1e-8, eps_mode="var", shift_mean=True),
        params=("values", "mask")),
)

TRAINER = Trainer(
    name="trinity", package="trinity", dist="trinity-rft", profile="verl", pinned="0.6.0",
    modules=(f"{P}.ppo_policy_loss", f"{P}.gspo_policy_loss", f"{P}.cispo_policy_loss",
             f"{P}.sapo_policy_loss", KL, UTILS),
    rows=ROWS,
    inventory=((f"{P}.ppo_policy_loss", r"PPOPolicyLossFn"),
               (f"{P}.gspo_policy_loss", r"GSPOLossFn"),
               (f"{P}.cispo_policy_loss", r"CISPOPolicyLossFn"),
               (f"{P}.sapo_policy_loss", r"SAPOPolicyLossFn"),
               (KL, r"(K1Fn|K2Fn|K3Fn|AbsFn|LowVarKLFn|CorrectedK3Fn)\.calculate_kl"),
               (UTILS, r"aggregate_loss|masked_whiten")),
    not_run=(("CorrectedK3Fn.calculate_kl",
              "k3 times the attached ratio clamped to [0, 2]: no reference for the clamp"),),
    runs=("the PPO loss (0.2/0.2 and 0.2/0.28, dual clip 3.0), GSPO, CISPO and SAPO at their "
          "defaults", "calculate_kl k1, k2, k3, abs and low_var_kl",
          "aggregate_loss token-mean, seq-mean-token-mean, seq-mean-token-sum",
          "masked_whiten"),
    does_not_run=("aggregate_loss seq-mean-token-sum-norm (the whole batch's sum over the "
                  "normaliser, not divided by the rows)", "the advantage functions (they "
                  "take Experience lists or a DataProto)", "the other policy losses (OPMD, "
                  "TOPR, sPPO, REC, DPO, SFT, MIX, CHORD)", "the entropy and KL loss "
                  "wrappers", "the actor's micro-batch scaling"),
    notes=("SAPOPolicyLossFn computes sapo_loss = -advantages * soft_gate.detach() * logprob "
           "(sapo_policy_loss.py:117), whose gradient is -A·f(r)·∇log π with f(r) = "
           "σ(τ(r − 1))·4/τ; the objective its docstring states, J = E[f(r)·A], has the "
           "gradient -A·f'(r)·r·∇log π (the SAPO paper's, verl's and TRL's). At r = 1 the "
           "gradient is 2/τ times A where it should be A, and it grows with r (to 4/τ) where "
           "SAPO's decays: the soft trust region is lost. A defect to file upstream; the card "
           "exits 1 for it",
           "judged under the verl profile, whose conventions Trinity's math copies, with every "
           "convention the rows need set explicitly",),
    precision="float64",
)
