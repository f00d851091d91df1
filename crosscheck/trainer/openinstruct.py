"""open-instruct's report card (allenai/open-instruct, a checkout: `--path`): the GRPO loss of
open_instruct/grpo_utils.py as open_instruct/grpo_fast.py composes it, the KL estimators of
open_instruct/model_utils.py, masked_mean of open_instruct/rl_utils.py and the group
advantages of open_instruct/data_loader.py.

Facts read at commit e6c3044aa:
- the learner's batch is packed (`rl_utils.pack_sequences`): a row of a micro-batch holds
  several query-response pairs back to back, right-padded by `collate_fn`; the response mask is
  bool (the per-sample ids `pack_sequences` returns are cast away once the advantages are
  gathered), [B, T] aligned with the input ids and read `[:, 1:]`; the advantage is each
  sample's, written to its response tokens (0 elsewhere); log-probs at positions outside the
  mask are set to INVALID_LOGPROB = 1.0 (`mask_logprobs`), both the trainer's and vLLM's;
- `PolicyTrainerRayProcess.step` (grpo_fast.py) per micro-batch: ratio = exp(new − old);
  `compute_rho_correction(old, vllm, mask, A, args)`; `compute_grpo_loss(new, ratio, A, ref,
  args, rho.weights)` gives pg_loss (times the ρ weights) and the KL estimate;
  loss = masked_mean(pg_loss + beta·kl, mask, None, denominator), times world_size //
  sequence_parallel_size (DeepSpeed averages over ranks); the denominator is the accumulation
  group's response-token count summed over ranks (`loss_denominator` "token", the default), or
  a constant (`loss_denominator` a number, Dr. GRPO);
- `compute_grpo_loss`: "dapo" (the default) is PPO's clip max(−A·r, −A·clip(r, 1 − clip_lower,
  1 + clip_higher)), 0.2/0.272 by default; "cispo" is −A·min(sg(r), 1 + clip_higher)·logp; the
  KL is `model_utils.estimate_kl((new − ref).clamp(±40), ratio)[kl_estimator]`: 0 the
  difference d (k1), 1 d²/2 (k2), 2 expm1(−d) + d (k3, the default), 3 ratio·d with the ratio
  attached; beta 0.05 by default;
- `compute_rho_correction`: ρ = exp(clamp(old − vllm, ±10)) on the mask; by default
  (use_rho_correction) the weight is min(ρ, 2) (rho_clamp_upper_bound 2, the lower clamp and
  both mask bounds 0, disabled); mask bounds drop tokens whose ρ is outside them (IcePop), with
  rho_mask_sequence_level the ρ judged and weighted is exp of the row's mean log ρ
  (`_sequence_level_mean`: a mean over the row's mask); with rho_mask_tv_divergence the weights
  stay min(ρ, 2) per token and the row's mean |ρ − 1| is compared with the bounds, dropping
  the tokens with sign(log ρ)·A > 0 of a row out of them;
- `masked_mean(values, mask, axis=None, denominator)`: Σ values·mask / denominator (the mask's
  count when None, 0 where it is 0);
- `DataPreparationActor._data_preparation_loop`: per prompt, A = r − mean(r) ("centered", the
  default advantage_normalization_type) or (r − mean(r)) / (std(r) + 1e-8) ("standard"), NumPy
  float64 with the population std, over groups of num_samples_per_prompt_rollout consecutive
  samples.
"""
import importlib
from types import SimpleNamespace

import numpy as np
import torch

from .card import Known, Row, Trainer, per_sequence, zero_padding
from .openrlhf import _entropy  # entropy_from_logits(logits): OpenRLHF's compute_entropy's form

GU = "open_instruct.grpo_utils"
MU = "open_instruct.model_utils"
RL = "open_instruct.rl_utils"
FAST = "open_instruct.grpo_fast"
DATA = "open_instruct.data_loader"

# GRPOExperimentConfig's defaults at e6c3044aa (grpo_utils.py): the loss and the ρ correction
_CONFIG = dict(loss_fn="dapo", clip_lower=0.2, clip_higher=0.272, beta=0.05, kl_estimator=2,
               load_ref_policy=True, use_rho_correction=True, rho_clamp_lower_bound=0.0,
               rho_clamp_upper_bound=2.0, rho_mask_lower_bound=0.0, rho_mask_upper_bound=0.0,
               rho_mask_sequence_level=False, rho_mask_tv_divergence=False,
               use_vllm_logprobs=False, record_entropy=False, world_size=1,
               sequence_parallel_size=1, loss_denominator="token")


def _config(**settings):
    return SimpleNamespace(**dict(_CONFIG, **settings))


def _module(name):
    """A trainer module the card loaded (the loader's finder serves it while the card runs)."""
    return importlib.import_module(name)


def _shifted(x, fill=0.0):
    """A [B, T] tensor as a [B, T + 1] one aligned with the input ids: the step reads [:, 1:]."""
    return torch.cat([x.new_full((x.shape[0], 1), fill), x], dim=1)


def _packed(pairs):
    """Consecutive pairs of rows as one packed row each, as pack_sequences lays samples back to
    back: [B, T] → [ceil(B/2), 2·T]; the second sample of a pair starts at T (what lies between
    two responses is the next query and padding: outside the mask)."""
    def pack(x):
        if not pairs:
            return x
        if x.shape[0] % 2:
            x = torch.cat([x, x.new_zeros((1,) + x.shape[1:])], dim=0)
        return x.reshape(x.shape[0] // 2, 2 * x.shape[1])

    def unpack(y, B, T):
        return y.reshape(-1, T)[:B] if pairs else y
    return pack, unpack


# --------------------------------------------------------------------- estimate_kl
def _kl(index):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return zero_padding(mask, fn(logp - ref_logp, torch.ones_like(logp))[index])
        return adapter
    return make


def _ratio_kl(fn):
    def adapter(logp, old_logp, ref_logp, mask):
        return zero_padding(mask, fn(logp - ref_logp, torch.exp(logp - old_logp))[3])
    return adapter


# --------------------------------------------------------------------- compute_rho_correction
def _rho(pairs=False, **settings):
    """compute_rho_correction's weights: logp is the trainer's old log-prob, rollout_logp
    vLLM's; both hold INVALID_LOGPROB at padding (mask_logprobs); advantages 0 (not read
    outside the TV filter)."""
    def make(fn):
        def adapter(logp, rollout_logp, mask):
            B, T = logp.shape
            pack, unpack = _packed(pairs)
            m = pack(mask.bool())
            mask_logprobs = _module(GU).mask_logprobs
            corr = fn(mask_logprobs(pack(logp), m), mask_logprobs(pack(rollout_logp), m), m,
                      torch.zeros_like(pack(logp)), _config(**settings))
            return zero_padding(mask, unpack(corr.weights, B, T))
        return adapter
    return make


def _tv(pairs=False, **settings):
    """The TV filter's keep mask: where compute_rho_correction's weight is not 0 (ρ > 0 and the
    truncation only bounds it above, so a 0 weight is a dropped token); logp is the trainer's
    old log-prob, old_logp vLLM's (the reference's sampling policy)."""
    def make(fn):
        def adapter(logp, old_logp, advantages, mask):
            B, T = logp.shape
            pack, unpack = _packed(pairs)
            m = pack(mask.bool())
            a = zero_padding(mask, per_sequence(advantages, logp))
            mask_logprobs = _module(GU).mask_logprobs
            corr = fn(mask_logprobs(pack(logp), m), mask_logprobs(pack(old_logp), m), m,
                      pack(a), _config(**settings))
            keep = (unpack(corr.weights, B, T) != 0).to(logp.dtype)
            return zero_padding(mask, keep)
        return adapter
    return make


# --------------------------------------------------------------------- compute_grpo_loss
def _weighted_loss(fn):
    """compute_grpo_loss's per-token pg_loss with the ρ weights compute_rho_correction gives,
    as the step passes them: ratio = exp(logp − old), old the proximal (trainer's old)
    log-probs, vLLM's the behaviour's; no reference policy (the KL rows judge the KL)."""
    def adapter(logp, prox_logp, behave_logp, advantages, mask):
        gu = _module(GU)
        m = mask.bool()
        a = zero_padding(mask, per_sequence(advantages, logp))
        old, vllm = gu.mask_logprobs(prox_logp, m), gu.mask_logprobs(behave_logp, m)
        new = gu.mask_logprobs(logp, m)
        config = _config()
        rho = gu.compute_rho_correction(old, vllm, m, a, config)
        pg, _, _ = fn(new, torch.exp(new - old), a, None, config, rho.weights)
        return zero_padding(mask, pg)
    return adapter


def _behave_clamped(data):
    """decoupled_ppo_loss's inputs with each token's log(π_prox/π_behave) clipped to ±10
    (behave_logp moved to match), as compute_rho_correction clamps it."""
    with np.errstate(invalid="ignore"):
        x = np.clip(data["prox_logp"] - data["behave_logp"], -10.0, 10.0)
    return dict(data, behave_logp=data["prox_logp"] - x)


# --------------------------------------------------------------------- the step's loss block
class _Metrics(dict):
    """self.local_metrics: the step updates it with vLLM-vs-local debug figures."""


def _step(with_ref=True, **settings):
    """grpo_fast's statements from response_mask_BT to loss on one micro-batch: the batch as
    data_BT holds it ([B, T + 1] aligned with the input ids), old log-probs precomputed as for
    several mini-batches (compute_logprobs then mask_logprobs), vLLM's log-probs equal to them
    (ρ = 1: the correction's own rows judge it), the model's forward replaced by the audited
    log-probs."""
    def make(block):
        def adapter(logp, old_logp, advantages, mask, ref_logp=None):
            gu, rl = _module(GU), _module(RL)
            m = mask.bool()
            a = zero_padding(mask, per_sequence(advantages, logp))
            config = _config(**settings)
            forward = SimpleNamespace(**{k: getattr(gu, k) for k in (
                "mask_logprobs", "compute_vllm_local_debug_metrics", "resolve_old_logprob",
                "compute_rho_correction", "accumulate_rho_histograms", "compute_grpo_loss")})
            forward.forward_for_logprobs = lambda *args, **kw: (logp, None)
            old = gu.mask_logprobs(old_logp, m)
            count = float(m.sum()) if config.loss_denominator == "token" else \
                float(config.loss_denominator)
            data = SimpleNamespace(
                response_masks=[_shifted(m, False)], advantages=[_shifted(a)],
                vllm_logprobs=[_shifted(old_logp)], query_responses=[None], position_ids=[None])
            refs = [gu.mask_logprobs(ref_logp, m)] if with_ref else []
            trainer = SimpleNamespace(args=config, model=None, pad_token_id=0,
                                      streaming_config=SimpleNamespace(temperature=1.0),
                                      local_metrics=_Metrics())
            return block(self=trainer, data_BT=data, i=0, accumulation_steps=1,
                         accumulation_token_counts={0: count}, grpo_utils=forward,
                         masked_mean=rl.masked_mean, old_logprobs_BT=[old], epoch_idx=0,
                         num_mini_batches=2, ref_logprobs_BT=refs, rho_histograms={})
        if not with_ref:
            return lambda logp, old_logp, advantages, mask: adapter(logp, old_logp, advantages,
                                                                    mask)
        return adapter
    return make


# --------------------------------------------------------------------- masked_mean
def _masked_mean(denominator=None):
    def make(fn):
        def adapter(loss, mask):
            return fn(loss, mask.bool(), None, denominator)
        return adapter
    return make


# --------------------------------------------------------------------- group advantages
def _groups(kind):
    def make(block):
        def adapter(rewards, group_size):
            n = int(group_size)
            out = block(np=np, batch=SimpleNamespace(scores=[float(r) for r in rewards]),
                        self=SimpleNamespace(config=SimpleNamespace(
                            num_samples_per_prompt_rollout=n,
                            advantage_normalization_type=kind)))
            return torch.from_numpy(np.asarray(out, dtype=np.float64))
        return adapter
    return make


# --------------------------------------------------------------------- entropy, GAE
def _gae(fn):
    """calculate_advantages on NumPy [B, T] rows, rewards and values 0 at padding."""
    def adapter(rewards, values, mask):
        r = zero_padding(mask, rewards).detach().numpy()
        v = zero_padding(mask, values).detach().numpy()
        adv, ret = fn(v, r, 0.99, 0.95)
        return (zero_padding(mask, torch.from_numpy(np.asarray(adv))),
                zero_padding(mask, torch.from_numpy(np.asarray(ret))))
    return adapter


_PADDING = Known(
    "garbage", "robustness",
    "estimate_kl computes on every position and masked_mean masks by multiplying "
    "(Σ values·mask, rl_utils.py:441), so a NaN or infinite log-prob at a masked position "
    "gives NaN · 0 = NaN; open-instruct's batches hold INVALID_LOGPROB = 1.0 there "
    "(grpo_utils.mask_logprobs, applied to the trainer's, the reference policy's and vLLM's "
    "log-probs), so it bites only when padding holds such a value")
_READ_VALID = ("read at the valid tokens (the step masks in masked_mean)",)
_STEP = ("grpo_fast.py's PolicyTrainerRayProcess.step from response_mask_BT to loss, run as "
         "written on one micro-batch: data_BT's response mask, advantages and vLLM log-probs "
         "[B, T + 1] (one column before the response, read [:, 1:]); the advantage broadcast "
         "over the row's tokens, 0 at padding, as the packed batch holds it",
         "the model's forward stood in by the audited log-probs (forward_for_logprobs returns "
         "them); old log-probs precomputed and masked (mask_logprobs), as for several "
         "mini-batches; vLLM's log-probs equal to them (ρ = 1: the correction's rows judge "
         "it); the reference policy's log-probs masked likewise",
         "accumulation_steps 1 and world_size 1, so the denominator is the call's own count "
         "(judged on whole batches, where open-instruct divides by the accumulation group's "
         "count over ranks)")
_PPO = dict(loss="ppo", clip_low=0.2, clip_high=0.272, clip_c=None, log_ratio_clamp=None,
            agg="token-mean", beta=0.05, kl_kind="k3", kl_clamp=(40.0, None), kl_weight=None,
            kl_anchor="ref", empty_rows="exclude")
def _conventions(over):
    """The step's conventions: _PPO's, over-ridden; CISPO takes no dual clip."""
    out = dict(_PPO, **over)
    if out["loss"] == "cispo":
        out.pop("clip_c")
    return out


_RHO = ("compute_rho_correction on the trainer's old log-probs (logp) and vLLM's "
        "(rollout_logp), each masked by mask_logprobs as the step does; advantages 0",)

def _token_clamped(data):
    """The reference's inputs with each token's log-ratio clipped to ±10 first (rollout_logp
    moved to match), as compute_rho_correction clamps before its sequence mean."""
    with np.errstate(invalid="ignore"):
        x = np.clip(data["logp"] - data["rollout_logp"], -10.0, 10.0)
    return dict(data, rollout_logp=data["logp"] - x)


_CLAMP_WHAT = (
    "compute_rho_correction clamps each token's log ρ to ±10 before the sequence-level mean "
    "(grpo_utils.py:416-418, then _sequence_level_mean), where the reference clips the "
    "sequence's mean log-ratio: they differ only where a token's log-ratio between the "
    "trainer's and vLLM's log-probs passes ±10 (the variant clips each token's first)")
_CLAMP = Known("value", "documented choice", _CLAMP_WHAT,
               variant=dict(inputs=_token_clamped),
               cite="grpo_utils.py:416-418, in code only: logprob_diff = (old_logprob − "
                    "vllm_logprobs).clamp(-10.0, 10.0) per token, before any mean")

ROWS = tuple(
    Row(f"{MU}:estimate_kl", "kl_penalty", _kl(index), label=f"{index} ({kind})",
        choices=("ref_logprobs_diff = logp − ref_logp passed unclamped (compute_grpo_loss "
                 "clamps it to ±40 first: the step's rows judge that), ratio 1 (not read by "
                 "this estimator)",) + _READ_VALID,
        conventions=dict(kind=kind, clamp=None),
        params=("ref_logprobs_diff", "ratio"), known=(_PADDING,))
    for index, kind in ((0, "k1"), (1, "k2"), (2, "k3"))
) + (
    Row(f"{MU}:estimate_kl", "ratio_kl_penalty", _ratio_kl, label="3 (ratio·k1)",
        choices=("ref_logprobs_diff = logp − ref_logp unclamped, ratio = exp(logp − old_logp) "
                 "attached, as the step forms it",) + _READ_VALID,
        conventions=dict(kind="k1", clamp=None), audit=dict(profile=None),
        params=("ref_logprobs_diff", "ratio"), known=(_PADDING,)),
    Row(f"{GU}:compute_rho_correction", "rollout_is_weights", _rho(),
        label="truncation at 2 (the default)", choices=_RHO,
        conventions=dict(level="token", mode="truncate", lower=None, upper=2.0,
                         log_ratio_clamp=10.0),
        params=("old_logprob", "vllm_logprobs", "response_mask", "advantages", "config")),
    Row(f"{GU}:compute_rho_correction", "rollout_is_weights",
        _rho(rho_clamp_upper_bound=0.0, rho_mask_lower_bound=0.5, rho_mask_upper_bound=5.0),
        label="token mask 0.5/5", choices=_RHO + (
            "rho_mask_lower_bound 0.5, rho_mask_upper_bound 5, the clamp off "
            "(rho_clamp_upper_bound 0): IcePop's mask alone",),
        conventions=dict(level="token", mode="mask", lower=0.5, upper=5.0, kept="unit",
                         log_ratio_clamp=10.0),
        params=("old_logprob", "vllm_logprobs", "response_mask", "advantages", "config")),
    Row(f"{GU}:compute_rho_correction", "rollout_is_weights",
        _rho(rho_clamp_upper_bound=0.0, rho_mask_lower_bound=0.5, rho_mask_upper_bound=2.0,
             rho_mask_sequence_level=True),
        label="sequence mask 0.5/2, one response per row", choices=_RHO + (
            "rho_mask_sequence_level with bounds 0.5 and 2, the clamp off; one response per "
            "row (no packing)",),
        conventions=dict(level="sequence", mode="mask", seq_stat="mean", lower=0.5, upper=2.0,
                         kept="unit", log_ratio_clamp=10.0),
        params=("old_logprob", "vllm_logprobs", "response_mask", "advantages", "config"),
        known=(_CLAMP,)),
    Row(f"{GU}:compute_rho_correction", "tv_filter_mask",
        _tv(rho_mask_tv_divergence=True, rho_mask_lower_bound=0.3, rho_mask_upper_bound=1.5),
        label="TV filter 0.3/1.5, one response per row",
        choices=("compute_rho_correction with rho_mask_tv_divergence, rho_mask_lower_bound "
                 "0.3 and rho_mask_upper_bound 1.5 (bounds within what its validation allows: "
                 "lower in (0, 1), upper > 1); the keep mask read as the weight's being non-zero "
                 "(ρ > 0, and the truncation at 2 only bounds it above); logp the trainer's old "
                 "log-probs, old_logp vLLM's, each masked by mask_logprobs; one response per row",),
        conventions=dict(lower=0.3, upper=1.5, log_ratio_clamp=10.0),
        audit=dict(profile=None),
        params=("old_logprob", "vllm_logprobs", "response_mask", "advantages", "config")),
)

_PACKED = Known(
    "value", "defect",
    "_sequence_level_mean (grpo_utils.py:380-390) averages over a row of the micro-batch, and a "
    "row is a pack of several responses (rl_utils.pack_sequences; the per-sample ids are cast "
    "to a bool mask at data_loader.py:1520 before the step reads it): the sequence-level ρ "
    "(rho_mask_sequence_level, whose help says 'per response sequence') and the TV filter's "
    "mean |ρ − 1| are each one figure per pack, shared by every response in it, so a response "
    "is kept or dropped (and, at sequence level, weighted) by its pack-mates' ratios. The "
    "variant re-audits the row with one response per row, where it conforms; a defect to file "
    "upstream")


def _packed_known(*more):
    """_PACKED with its variant (one response per row), and `more` variants beside it."""
    variant = dict(adapt=lambda adapter: getattr(adapter, "unpacked", adapter))
    for v in more:
        variant.update(v)
    return Known(_PACKED.check, _PACKED.kind, _PACKED.what, variant=variant)


def _with_unpacked(make_packed, make_single):
    """A packed adapter that carries, for the known entry's variant, the same adapter with one
    response per row."""
    def make(fn):
        adapter = make_packed(fn)
        adapter.unpacked = make_single(fn)
        return adapter
    return make


_SEQ = dict(rho_clamp_upper_bound=0.0, rho_mask_lower_bound=0.5, rho_mask_upper_bound=2.0,
            rho_mask_sequence_level=True)
_TV = dict(rho_mask_tv_divergence=True, rho_mask_lower_bound=0.3, rho_mask_upper_bound=1.5)
_PACKING = ("two responses per row, packed as pack_sequences lays them out: each pair of the "
            "reference's rows back to back in one row of twice the length, the second starting "
            "after the first's padding (outside the mask, as the next query is); the output "
            "unpacked to the reference's rows",)

ROWS = ROWS + (
    Row(f"{GU}:compute_grpo_loss", "decoupled_ppo_loss", _weighted_loss,
        label="dapo × ρ weights (the defaults)",
        choices=("compute_rho_correction's weights (GRPOExperimentConfig's defaults: min(ρ, 2), "
                 "ρ = π_old/π_vLLM) multiplied into compute_grpo_loss's dapo loss (0.2/0.272) "
                 "as the step passes them; prox_logp the trainer's old log-probs, behave_logp "
                 "vLLM's; every log-prob masked by mask_logprobs; no reference policy",),
        conventions=dict(clip_low=0.2, clip_high=0.272, clip_c=None, is_level="token",
                         is_mode="truncate", is_lower=None, is_upper=2.0),
        audit=dict(profile=None),
        params=("new_logprobs", "ratio", "advantages", "ref_logprobs", "config", "rho_weights"),
        known=(Known("value", "documented choice", _CLAMP_WHAT.replace(
            "before the sequence-level mean (grpo_utils.py:416-418, then _sequence_level_mean), "
            "where the reference clips the sequence's mean log-ratio",
            "(grpo_utils.py:416-418), where the reference clamps none"),
            variant=dict(inputs=_behave_clamped), cite=_CLAMP.cite),)),
    Row(f"{GU}:compute_rho_correction", "rollout_is_weights",
        _with_unpacked(_rho(pairs=True, **_SEQ), _rho(**_SEQ)),
        label="sequence mask 0.5/2, packed", choices=_RHO + (
            "rho_mask_sequence_level with bounds 0.5 and 2, the clamp off",) + _PACKING,
        conventions=dict(level="sequence", mode="mask", seq_stat="mean", lower=0.5, upper=2.0,
                         kept="unit", log_ratio_clamp=10.0),
        params=("old_logprob", "vllm_logprobs", "response_mask", "advantages", "config"),
        known=(_packed_known(dict(inputs=_token_clamped)),)),
    Row(f"{GU}:compute_rho_correction", "tv_filter_mask",
        _with_unpacked(_tv(pairs=True, **_TV), _tv(**_TV)),
        label="TV filter 0.3/1.5, packed",
        choices=("compute_rho_correction with rho_mask_tv_divergence, bounds 0.3 and 1.5; the "
                 "keep mask read as the weight's being non-zero",) + _PACKING,
        conventions=dict(lower=0.3, upper=1.5, log_ratio_clamp=10.0), audit=dict(profile=None),
        params=("old_logprob", "vllm_logprobs", "response_mask", "advantages", "config"),
        known=(_packed_known(),)),
) + tuple(
    Row(f"{FAST}:PolicyTrainerRayProcess.step", "policy_objective", _step(**settings),
        label=label, block=("response_mask_BT", "loss", ("loss",)),
        choices=_STEP + (choice,), conventions=_conventions(conventions),
        audit=dict(accumulation="none"), known=(_PADDING,))
    for label, settings, conventions, choice in (
        ("dapo 0.2/0.272, k3 KL 0.05 (the defaults)", {}, {},
         "GRPOExperimentConfig's defaults: loss_fn dapo, clip_lower 0.2, clip_higher 0.272, "
         "beta 0.05, kl_estimator 2 (k3), loss_denominator 'token'"),
        ("dapo, KL estimator 3 (ratio·k1)", dict(kl_estimator=3),
         dict(kl_kind="k1", kl_weight="ratio"), "kl_estimator 3: ratio·(new − ref), the ratio "
         "attached"),
        ("dapo, KL estimator 1 (k2)", dict(kl_estimator=1), dict(kl_kind="k2"),
         "kl_estimator 1: (new − ref)²/2"),
        ("cispo", dict(loss_fn="cispo"),
         dict(loss="cispo", bound="relative", clip_low=None),
         "loss_fn cispo: −A·min(sg(r), 1 + clip_higher)·logp, no lower bound"),
        ("dapo, loss_denominator 512 (Dr. GRPO)", dict(loss_denominator="512"),
         dict(agg="seq-mean-token-sum-norm", norm=512.0),
         "loss_denominator 512: the micro-batch's masked sum divided by that constant"),
    )
) + (
    Row(f"{FAST}:PolicyTrainerRayProcess.step", "policy_objective",
        _step(with_ref=False, load_ref_policy=False, beta=0.0),
        label="dapo, no reference policy", block=("response_mask_BT", "loss", ("loss",)),
        choices=_STEP + ("load_ref_policy False and beta 0 (its validation requires both): "
                         "compute_grpo_loss's KL is zeros",),
        conventions=dict(_PPO, beta=0.0), audit=dict(accumulation="none"), known=(_PADDING,)),
    Row(f"{MU}:entropy_from_logits", "entropy", _entropy,
        choices=("logits 0 at padding, the entropy read at valid tokens (the step logs it "
                 "under no_grad with record_entropy)",), params=("logits",)),
    Row(f"{RL}:calculate_advantages", "gae", _gae,
        choices=("values and rewards as NumPy [B, T] rows, 0 at padding; γ 0.99, λ 0.95; read "
                 "at the valid tokens (no training code of this commit calls it: its tests do)",),
        conventions=dict(gamma=0.99, lam=0.95), audit=dict(domain=("right_padded",)),
        params=("values", "rewards", "gamma", "lam")),
    Row(f"{RL}:masked_mean", "aggregate", _masked_mean(), label="token mean",
        choices=("axis None, no denominator: the mask's count",),
        conventions=dict(mode="token-mean"), audit=dict(accumulation="none"),
        params=("values", "mask", "axis", "denominator"), known=(_PADDING,)),
    Row(f"{RL}:masked_mean", "aggregate", _masked_mean(512.0), label="denominator 512",
        choices=("axis None, denominator 512 (loss_denominator as a number)",),
        conventions=dict(mode="seq-mean-token-sum-norm", norm=512.0),
        audit=dict(accumulation="none"),
        params=("values", "mask", "axis", "denominator"), known=(_PADDING,)),
) + tuple(
    Row(f"{DATA}:DataPreparationActor._data_preparation_loop", "group_advantages",
        _groups(kind), label=kind, block=("scores", "advantages", ("advantages",), True),
        choices=("the statements from scores to advantages run as written, on the batch's "
                 "scores; num_samples_per_prompt_rollout the group size, groups consecutive; "
                 f"advantage_normalization_type {kind!r}" + (" (the default)" if kind ==
                                                              "centered" else ""),),
        conventions=conventions)
    for kind, conventions in (
        ("centered", dict(baseline="mean", scale="none", ddof=0, eps=0.0, singleton="zero")),
        ("standard", dict(baseline="mean", scale="group", ddof=0, eps=1e-8, singleton="zero")),
    )
)

TRAINER = Trainer(
    name="open-instruct", package="open_instruct", dist="open-instruct", profile="verl",
    pinned="commit e6c3044aa", installable=False, modules=(GU, MU, RL), rows=ROWS,
    # what grpo_utils' imports pull in for its data, logging, hub and evaluation code, which
    # the math never runs: stood in to save seconds of import
    stand_in=("pandas", "datasets", "pyarrow", "boto3", "botocore", "requests", "trio",
              "huggingface_hub", "accelerate", "rich", "pydantic", "jinja2", "fsspec",
              "multiprocess", "safetensors", "httpx", "litellm", "openai", "tqdm",
              "torch.utils.tensorboard"),
    inventory=((GU, r"compute_grpo_loss|compute_rho_correction|_rho_drop_masks|"
                    r"_sequence_level_mean|mask_logprobs|resolve_old_logprob|"
                    r"calculate_token_counts|compute_vllm_local_debug_metrics|"
                    r"populate_sample_loss_stats|compute_metrics_from_loss_stats"),
               (MU, r"estimate_kl|log_softmax_and_gather|entropy_from_logits"),
               (RL, r"masked_mean|calculate_advantages|calculate_advantages_packed"),
               (FAST, r"PolicyTrainerRayProcess\.step"),
               (DATA, r"DataPreparationActor\._data_preparation_loop")),
    not_run=(("_rho_drop_masks", "reached through compute_rho_correction, which the mask rows "
                                 "call"),
             ("_sequence_level_mean", "reached through compute_rho_correction's sequence-level "
                                      "and TV rows"),
             ("mask_logprobs", "run by the step's and the ρ rows on every log-prob they pass, as "
                               "the step does (a masked_fill with INVALID_LOGPROB)"),
             ("resolve_old_logprob", "run inside the step's block; it selects which log-probs "
                                     "are old (cache or detached), no arithmetic"),
             ("calculate_token_counts", "all-reduces the accumulation group's token counts "
                                        "across ranks (torch.distributed): the step's rows pass "
                                        "the call's own count"),
             ("compute_vllm_local_debug_metrics", "logged figures (no gradient): the mean, max "
                                                  "and std of |local − vLLM| log-prob and a "
                                                  "reverse-KL figure, which no reference takes"),
             ("populate_sample_loss_stats", "logged per-sample figures (masked means of the "
                                            "loss terms), no gradient"),
             ("compute_metrics_from_loss_stats", "logged token-weighted averages of the "
                                                 "per-sample figures, no gradient"),
             ("log_softmax_and_gather", "the model's log-probs from logits: no RL math"),
             ("calculate_advantages_packed", "GAE over packed rows cut by `dones` and a query "
                                             "mask: no reference takes packed boundaries (only "
                                             "open-instruct's tests call it at this commit)")),
    runs=("compute_grpo_loss (dapo) times compute_rho_correction's default weights, as the "
          "step multiplies them", "the step's loss block with dapo 0.2/0.272 and the KL estimators 2 (k3, default), 3 "
          "(ratio·k1) and 1 (k2); cispo; a constant denominator 512; no reference policy",
          "estimate_kl's four estimators", "compute_rho_correction: truncation at 2 (the "
          "default), a token mask 0.5/5, a sequence mask 0.5/2, the TV filter 0.3/1.5, the "
          "last two with one response per row and packed two to a row",
          "masked_mean with the token count and a constant denominator",
          "entropy_from_logits", "calculate_advantages (GAE, γ 0.99, λ 0.95)",
          "the group advantages, centered (the default) and standard"),
    does_not_run=("the ρ correction inside the step's block (vLLM's log-probs equal the old "
                  "ones there; the compute_grpo_loss row multiplies its default weights in, "
                  "its own rows judge the other modes)", "mini-batches of one (old = new.detach(): "
                  "ratio 1)", "gradient accumulation across micro-batches and ranks (the "
                  "denominator is the call's own count)", "sequence parallelism",
                  "the olmo-core training path (olmo_core_train_modules.py, the same "
                  "functions composed alike)", "ρ clamp and mask together in one row"),
    notes=("estimate_kl's estimator 3, ratio·(new − ref) with the ratio attached, is the "
           "unbiased off-policy estimate of KL(π‖ref) and of its gradient; its reference is "
           "ratio_kl_penalty (policy_objective's kl_weight 'ratio' with kl_kind 'k1')",
           "with rho_mask_tv_divergence the bounds are validated as bounds on ρ "
           "(rho_mask_upper_bound > 1, rho_mask_lower_bound in (0, 1), grpo_utils.py:325-337) "
           "although they bound the mean |ρ − 1|: an upper TV threshold of 1 or less cannot "
           "be set",
           "judged under the verl profile with every convention the rows need set "
           "explicitly"),
)
