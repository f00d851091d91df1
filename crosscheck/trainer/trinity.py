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
from types import SimpleNamespace

import torch

from .card import DoesNotFit, Row, Trainer, owner_class, per_sequence
from .verl import _whiten

P = "trinity.algorithm.policy_loss_fn"
ADV = "trinity.algorithm.advantage_fn"
GRPO = f"{ADV}.grpo_advantage"
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


def _grpo(fn):
    """calculate_group_advantage on each group (the rows sharing a group id, as group_by groups
    experiences by task: any size, one included), each experience a reward and a one-token
    action mask; the advantage read from that token."""
    cls = owner_class(fn)

    def adapter(rewards, group_ids):
        estimator = cls()                                 # its defaults: epsilon 1e-6, group std
        ids = [int(i) for i in torch.as_tensor(group_ids).reshape(-1)]
        out = torch.zeros(rewards.shape[0], dtype=torch.float32)
        for group in dict.fromkeys(ids):
            rows = [b for b, i in enumerate(ids) if i == group]
            exps = [SimpleNamespace(reward=float(rewards[b]), action_mask=torch.ones(1))
                    for b in rows]
            fn(estimator, str(group), exps)
            for b, e in zip(rows, exps):
                out[b] = e.advantages[0]
        return out
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
    Row(f"{GRPO}:GRPOGroupedAdvantage.calculate_group_advantage", "group_advantages", _grpo,
        choices=("the class at its defaults (epsilon 1e-6, std_cal_level 'group', no "
                 "std_threshold, no rank_penalty: the 'grpo' advantage's default_args); each "
                 "group a list of experiences with a reward and a one-token action mask, groups "
                 "of any size (group_by groups by task: errored or filtered runs leave groups "
                 "unequal, and the code handles a group of one itself: mean 0, std 1); the "
                 "float32 advantage read from that token",),
        conventions=dict(ddof=1, eps=1e-6, scale="group", baseline="mean", singleton="keep"),
        params=("group_id", "exps")),
    Row(f"{ADV}.opmd_advantage:OPMDGroupAdvantage.calculate_group_advantage",
        "group_advantages", _grpo,
        choices=("the class at its defaults (opmd_baseline 'mean', tau 1: the 'opmd' "
                 "advantage's default_args): reward − the group mean, a group of one keeping "
                 "its reward (baseline 0); groups and experiences as for GRPO",),
        conventions=dict(ddof=0, eps=0.0, scale="none", baseline="mean", singleton="keep"),
        params=("group_id", "exps")),
    Row(f"{UTILS}:masked_whiten", "whiten", _whiten, choices=("mask as a float tensor",),
        conventions=dict(ddof=1, eps=1e-8, eps_mode="var", shift_mean=True),
        params=("values", "mask")),
)

TRAINER = Trainer(
    name="trinity", package="trinity", dist="trinity-rft", profile="verl", pinned="0.6.0",
    modules=(f"{P}.ppo_policy_loss", f"{P}.gspo_policy_loss", f"{P}.cispo_policy_loss",
             f"{P}.sapo_policy_loss", KL, UTILS, GRPO, f"{ADV}.opmd_advantage"),
    rows=ROWS,
    inventory=((f"{P}.ppo_policy_loss", r"PPOPolicyLossFn"),
               (f"{P}.gspo_policy_loss", r"GSPOLossFn"),
               (f"{P}.cispo_policy_loss", r"CISPOPolicyLossFn"),
               (f"{P}.sapo_policy_loss", r"SAPOPolicyLossFn"),
               (KL, r"(K1Fn|K2Fn|K3Fn|AbsFn|LowVarKLFn|CorrectedK3Fn)\.calculate_kl|"
                    r"KLFn\.(calculate_kl_loss|apply_kl_penalty_to_reward|update_kl_coef)"),
               (UTILS, r"aggregate_loss|masked_whiten|masked_sum|masked_mean|masked_var")),
    registries=(P, ADV, "trinity.algorithm.kl_fn", "trinity.algorithm.entropy_loss_fn"),
    not_run=(("CorrectedK3Fn.calculate_kl",
              "k3 times the attached ratio clamped to [0, 2]: no reference for the clamp"),
             ("DummyKLFn", "the 'none' KL: zeros"),
             ("KLFn.calculate_kl_loss", "kl_coef × aggregate_loss of calculate_kl, both of "
                                        "which rows run"),
             ("KLFn.apply_kl_penalty_to_reward", "token_level_scores − kl_coef·KL on a "
                                                 "DataProto (verl's batch): no adapter yet"),
             ("KLFn.update_kl_coef", "the adaptive KL controller's coefficient update (a "
                                     "schedule, not a loss)"),
             ("masked_sum", "reached through aggregate_loss, which rows run"),
             ("masked_mean", "reached through aggregate_loss and masked_whiten, which rows "
                             "run"),
             ("masked_var", "reached through masked_whiten, which a row runs"),
             # policy losses registered in POLICY_LOSS_FN without a row
             ("OPMDPolicyLossFn", "−A·logp aggregated, then divided by 1 + τ: REINFORCE's loss "
                                  "scaled by a constant, which no reference takes"),
             ("DPOLossFn", "DPO's pairwise preference loss on interleaved chosen/rejected rows: "
                           "not an RL policy-gradient function"),
             ("SFTLossFn", "a masked negative log-likelihood (SFT), not an RL function"),
             ("MIXPolicyLossFn", "a weighted sum of the GRPO loss on rollouts and the SFT loss "
                                 "on expert data: no reference for the mix"),
             ("TOPRPolicyLossFn", "TOPR's −sg(α)·A·logp with α the ratio clamped to [0, 1] "
                                  "only where the reward is at most a threshold: no reference "
                                  "yet"),
             ("SFTISLossFn", "CHORD's importance-weighted SFT on expert tokens: no reference "
                             "yet"),
             ("SFTPhiLossFn", "CHORD's φ(p) = p(1 − p)-weighted SFT: no reference yet"),
             ("MIXCHORDPolicyLossFn", "CHORD's scheduled mix of the PPO loss and an SFT loss: "
                                      "no reference for the mix"),
             ("sPPOPolicyLossFn", "−A·(logp − old_logp) on tokens whose ratio is inside "
                                  "[1/(1 + ε), 1 + ε]: no reference yet"),
             ("RECPolicyLossFn", "the REC family (clip modes, importance weights, "
                                 "regularisers): no reference yet"),
             ("ImportanceSamplingLossFn", "the unclipped surrogate −A·exp(clamp(log r, ±20)): "
                                          "no reference takes PPO's ratio without its clip"),
             # advantages registered in ADVANTAGE_FN without a row
             ("GRPOAdvantageFn", "the deprecated 'grpo_verl' on a DataProto: no adapter yet"),
             ("PPOAdvantageFn", "GAE on a DataProto (verl's batch): no adapter yet"),
             ("StepWiseGRPOAdvantageFn", "multi-step GRPO over a run's steps (Experience lists "
                                         "grouped by run and step): no reference yet"),
             ("GiGPOAdvantageFn", "GiGPO's episode- and step-level groups: no reference yet"),
             ("REINFORCEPLUSPLUSAdvantageFn", "REINFORCE++ returns whitened on a DataProto: "
                                              "no adapter yet"),
             ("REINFORCEGroupAdvantage", "the reward itself, no baseline"),
             ("REMAXAdvantageFn", "ReMax on a DataProto (a greedy baseline reward): no adapter "
                                  "yet"),
             ("RLOOAdvantageFn", "RLOO on a DataProto: no adapter yet"),
             ("OPMDAdvantageFn", "OPMD's advantage on a DataProto: no adapter yet"),
             ("ASYMREGroupAdvantage", "reward − (the group mean + baseline_shift, −0.1 by "
                                      "default): no reference takes a shifted baseline"),
             ("ASYMREAdvantageFn", "AsymRE on a DataProto: no reference yet"),
             ("RECGroupedAdvantage", "the REC family's group advantages (an optional balancing "
                                    "drop of negative samples, then a population-std "
                                    "normalisation): no reference yet"),
             ("OnPolicyDistillAdvantage", "on-policy distillation's teacher log-probs: no "
                                          "reference yet"),
             ("JSDAdvantage", "a Jensen-Shannon distillation signal from teacher log-probs: no "
                              "reference yet"),
             ("ClipBAdvantageFn", "GRPO advantages whose negative-advantage tokens are clipped "
                                  "by an entropy signal (Clip_B), on a DataProto: no reference "
                                  "yet"),
             ("ClipVAdvantageFn", "GRPO advantages whose negative-advantage tokens are clipped, "
                                  "capped at a global fraction (Clip_V), on a DataProto: no "
                                  "reference yet"),
             # entropy terms registered in ENTROPY_LOSS_FN
             ("DefaultEntropyLossFn", "aggregate_loss (which rows run) of the entropy it is "
                                      "given, times entropy_coef"),
             ("MixEntropyLossFn", "DefaultEntropyLossFn's term over the rows that are not "
                                  "expert data (the MIX algorithm)"),
             ("DummyEntropyLossFn", "the 'none' entropy term: zero")),
    runs=("the PPO loss (0.2/0.2 and 0.2/0.28, dual clip 3.0), GSPO, CISPO and SAPO at their "
          "defaults", "GRPOGroupedAdvantage ('grpo', the default advantage) and "
          "OPMDGroupAdvantage (its mean baseline) on groups of any size, one included",
          "calculate_kl k1, k2, k3, abs and low_var_kl",
          "aggregate_loss token-mean, seq-mean-token-mean, seq-mean-token-sum",
          "masked_whiten"),
    does_not_run=("aggregate_loss seq-mean-token-sum-norm (the whole batch's sum over the "
                  "normaliser, not divided by the rows)", "the advantage functions other "
                  "than GRPOGroupedAdvantage (see not covered)", "the other policy losses "
                  "(OPMD, TOPR, sPPO, REC, DPO, SFT, MIX, CHORD, importance sampling: see not "
                  "covered)", "the entropy and KL loss wrappers", "GRPOGroupedAdvantage's "
                  "std_threshold, rank_penalty and batch-level std",
                  "OPMDGroupAdvantage's logavgexp baseline",
                  "the actor's micro-batch scaling"),
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
