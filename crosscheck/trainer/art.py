"""ART's report card (OpenPipe's Agent Reinforcement Trainer, `openpipe-art`): `loss_fn` of
art/loss.py, the RL loss every ART backend calls.

Facts read in openpipe-art 0.5.18:
- the package declares Python ≥ 3.12 and its `__init__` imports dotenv, litellm's warnings and
  the whole client; art/loss.py itself imports torch, pydantic, `art.utils.group_aggregate`
  and `art.dev` (TypedDicts), so the card loads it by file;
- `loss_fn(inputs, new_logprobs, ref_logprobs, entropies, experimental_config,
  reduction="mean")`: `inputs` holds [B, S] tensors aligned with the token ids (logprobs,
  advantages, assistant_mask, weights, group_ids), which it shifts left by one
  (`shift_tensor`: `x[:, 1:]` padded at the end) to align them with `new_logprobs` [B, S],
  the log-probs of each next token;
- a NaN old log-prob (a prompt token, padding) is replaced by the new one, detached (ratio 1);
- the ratio at `importance_sampling_level` "token" is exp(logp − old); "sequence" is
  exp(mean of the log-ratios of the completion's assistant tokens) (`group_aggregate` by
  group_ids · assistant_mask: a packed row holds several completions, each with its own
  random 64-bit group id); "average" is their arithmetic mean, "geometric_average"
  r^0.5·s^0.5; every one is attached;
- `ppo=False` (the default): −clip(sg(r), 1 − ε, 1 + ε_high)·A·logp with ε = 1, ε_high = 4
  (CISPO's weight in [0, 5]); `ppo=True`: −min(r·A, clip(r, 1 − ε, 1 + ε_high)·A) with
  ε = 0.2 and ε_high = ε;
- `kimi_k2_tau`: A ← A − τ·sg(logp − old) per token; `kl_penalty_coef` c with
  ref_logprobs: A ← A + c·(k̄ − k)·mask, k = sg(logp − ref) and k̄ its mean over the call's
  assistant tokens (+1e-6 in the count);
- the loss is Σ l·weights·mask / (Σ mask + 1e-6) for reduction "mean" (the Unsloth
  backend's call), Σ l·weights·mask for "sum" (the Megatron backend's call);
- the packer (preprocessing/pack.py) pads logprobs with NaN, advantages and weights with 0,
  writes one advantage per trajectory on every token of it, and normalises the weights to
  mean 1 over the assistant tokens.
"""
import inspect

import torch

from .card import Known, NotInVersion, Row, Trainer, source_of

LOSS = "art.loss"
GROUPS = "art.utils.group_aggregate"


def _trajectory_weights(m, dtype):
    """The weights ART's preprocessing gives each completion's tokens: 1/(L_i + 1e-6), L_i its
    assistant tokens (tokenize.py:277-281), then divided by their mean over every assistant
    token of the batch (pack.py:133-139); 0 elsewhere."""
    w = (1.0 / (m.sum(dim=1, keepdim=True).to(dtype) + 1e-6)).expand(m.shape)
    w = torch.where(m, w, torch.zeros((), dtype=dtype))
    return w / w[m].mean() if bool(m.any()) else w


def _inputs(logp, old_logp, advantages, mask, weights="one"):
    """ART's `inputs` for one completion per packed row: [B, T + 1] tensors aligned with the
    token ids, which loss_fn shifts left by one (column 0 is read by nothing), and the
    new log-probs [B, T + 1] (the last column is the position past the row, masked)."""
    B, T = logp.shape
    m = mask.bool()
    adv = advantages[:, None].expand(B, T) if advantages.dim() == 1 else advantages
    w = m.to(logp.dtype) if weights == "one" else _trajectory_weights(m, logp.dtype)

    def aligned(x, first):
        return torch.cat([torch.full((B, 1), first, dtype=x.dtype), x], dim=1)
    ids = torch.arange(1, B + 1, dtype=torch.long)[:, None].expand(B, T)
    inputs = dict(logprobs=aligned(old_logp, float("nan")),
                  advantages=aligned(adv, 0.0),
                  assistant_mask=aligned(m, False),
                  weights=aligned(w, 0.0),
                  group_ids=aligned(ids, 0))
    new = torch.cat([logp, logp.new_zeros((B, 1))], dim=1)
    return inputs, new


def _loss(reduction="mean", weights="one", **config):
    """loss_fn with `config` as its experimental_config; its policy_loss output."""
    def make(fn):
        def adapter(logp, old_logp, advantages, mask, ref_logp=None):
            inputs, new = _inputs(logp, old_logp, advantages, mask, weights)
            ref = None
            if ref_logp is not None and config.get("kl_penalty_coef"):
                ref = torch.cat([ref_logp, ref_logp.new_zeros((ref_logp.shape[0], 1))], dim=1)
            extra = {} if reduction == "mean" else dict(reduction=reduction)
            out = fn(inputs, new, ref, None, dict(config), **extra)
            # 0.5.4-0.5.17 call the output mean_policy_loss (always a token mean)
            return out.policy_loss if hasattr(out, "policy_loss") else out.mean_policy_loss
        return adapter
    return make


def _fits(config, reduction, cispo):
    """This release's loss_fn against the row's assumptions: each experimental_config key the
    row sets is read by it (else the option is not in this version), reduction 'sum' is a
    parameter (from 0.5.18), and the default loss is CISPO's (from 0.5.5: 0.5.4 defaults ppo
    to True, with no default for ε_high of its own; its value is what the row judges)."""
    def fits(fn):
        source = source_of(fn)
        for key in config:
            if f'"{key}"' not in source:
                raise NotInVersion(f"loss_fn reads no experimental_config[{key!r}] in this "
                                   f"version")
        if reduction != "mean" and "reduction" not in inspect.signature(fn).parameters:
            raise NotInVersion("loss_fn takes no reduction in this version (a token mean only)")
        if cispo and ('get("ppo", True)' in source or "epsilon_high_default" not in source):
            raise NotInVersion("ppo=False with ε 1, ε_high 4 is not the default loss in this "
                               "version (0.5.4: ppo defaults to True, ε to 0.2)")
        if "mean_policy_loss" in source:
            return dict(choice="this release's output mean_policy_loss (policy_loss from "
                               "0.5.18)")
        return {}
    return fits


_PARAMS = ("inputs", "new_logprobs", "ref_logprobs", "entropies", "experimental_config")
_SETUP = ("one completion per packed row: `inputs` [B, T + 1] aligned with the token ids "
          "(old log-probs, advantages broadcast over the completion, assistant_mask, weights "
          "0 off its tokens, group_ids the row's index + 1), which loss_fn shifts left by one; new_logprobs [B, T + 1], the last column the masked position "
          "past the row; the padding column of logprobs NaN, as ART's packer pads it",
          "judged per call: loss_fn normalises by the call's own assistant tokens, and the "
          "backend's accumulation over calls lies outside it")
_WHOLE = dict(accumulation="none")
# ART's default loss: CISPO's weight clip(sg(r), 1 − 1, 1 + 4), a token mean over the call
_CISPO = dict(loss="cispo", bound="relative", clip_low=1.0, clip_high=4.0,
              log_ratio_clamp=None, level="token", agg="token-mean", beta=0.0,
              kl_weight=None, empty_rows="exclude")
_PPO = dict(loss="ppo", clip_low=0.2, clip_high=0.2, clip_c=None, delta=None,
            log_ratio_clamp=None, level="token", agg="token-mean", beta=0.0, kl_weight=None,
            empty_rows="exclude")
_PADDING = Known(
    "garbage", "robustness",
    "loss_fn masks by multiplying (policy_loss * weights * assistant_mask, loss.py:128), "
    "after exp of every position's log-ratio: a NaN or infinite new log-prob or advantage at "
    "padding gives NaN · 0 = NaN; at the sequence levels every non-assistant position shares "
    "group 0 of group_aggregate (group_ids * assistant_mask, loss.py:62), so such a value "
    "reaches every masked position's ratio. ART's own padding holds new log-probs the model "
    "computed and advantage 0, so it bites only when padding holds such a value")



def _count_without_eps(adapted):
    """loss_fn's token mean with its count's 1e-6 taken out: × (N + 1e-6)/N."""
    def variant(logp, old_logp, advantages, mask, ref_logp=None):
        out = adapted(logp, old_logp, advantages, mask, ref_logp)
        n = mask.sum().to(out.dtype)
        return out * (n + 1e-6) / n if bool(n > 0) else out
    return variant


def _eps(check):
    return Known(
        check, "precision",
        "the token mean divides by assistant_mask.sum() + 1e-6 (loss.py:129): a relative "
        "difference of 1e-6/N from the mean over N tokens, at the edge of the float64 "
        "tolerance for one or two tokens and far below float32's (reproduced by multiplying "
        "the loss by (N + 1e-6)/N)", variant=dict(adapt=_count_without_eps))


_EPS = (_eps("value"), _eps("grad"))


def _row(label, config, conventions, reduction="mean", choices=(), weights="one", audit=()):
    # with kl_penalty_coef the KL's own mean has the 1e-6 too: see the card's notes
    eps = _EPS if reduction == "mean" and weights == "one" and \
        not config.get("kl_penalty_coef") else ()
    ones = ("weights 1 on every assistant token (loss_fn's own aggregation, as a caller "
            "with equal weights has it)",) if weights == "one" else ()
    return Row(f"{LOSS}:loss_fn", "policy_objective", _loss(reduction, weights, **config),
               label=label, choices=_SETUP + ones + tuple(choices), conventions=conventions,
               audit=dict(_WHOLE, **dict(audit)), params=_PARAMS, known=(_PADDING,) + eps,
               fits=_fits(config, reduction, conventions["loss"] == "cispo"))


ROWS = (
    _row("default", {}, _CISPO,
         choices=("experimental_config {} (ART's defaults: ppo False, ε 1, ε_high 4, "
                  "importance_sampling_level 'token')",)),
    _row("ppo", dict(ppo=True), _PPO,
         choices=("experimental_config {'ppo': True} (ε 0.2, ε_high = ε)",)),
    _row("ppo 0.2/0.28", dict(ppo=True, epsilon_high=0.28), dict(_PPO, clip_high=0.28),
         choices=("experimental_config {'ppo': True, 'epsilon_high': 0.28}",)),
    _row("sequence", dict(importance_sampling_level="sequence"), dict(_CISPO, level="sequence"),
         choices=("experimental_config {'importance_sampling_level': 'sequence'}",)),
    _row("average", dict(importance_sampling_level="average"), dict(_CISPO, level="average"),
         choices=("experimental_config {'importance_sampling_level': 'average'}",)),
    _row("geometric_average", dict(importance_sampling_level="geometric_average"),
         dict(_CISPO, level="geometric_average"),
         choices=("experimental_config {'importance_sampling_level': 'geometric_average'}",)),
    _row("ppo sequence", dict(ppo=True, importance_sampling_level="sequence"),
         dict(_PPO, level="sequence"),
         choices=("experimental_config {'ppo': True, 'importance_sampling_level': "
                  "'sequence'}",)),
    _row("ppo geometric_average", dict(ppo=True, importance_sampling_level="geometric_average"),
         dict(_PPO, level="geometric_average"),
         choices=("experimental_config {'ppo': True, 'importance_sampling_level': "
                  "'geometric_average'}",)),
    _row("kimi_k2_tau", dict(kimi_k2_tau=0.5), dict(_CISPO, adv_tau=0.5),
         choices=("experimental_config {'kimi_k2_tau': 0.5}",)),
    _row("kl_penalty_coef", dict(kl_penalty_coef=0.1), dict(_CISPO, adv_kl=0.1),
         choices=("experimental_config {'kl_penalty_coef': 0.1}, ref_logprobs the reference "
                  "log-probs under test (shifted as new_logprobs)",)),
    _row("ppo kimi_k2_tau kl_penalty_coef", dict(ppo=True, kimi_k2_tau=0.1, kl_penalty_coef=0.5),
         dict(_PPO, adv_tau=0.1, adv_kl=0.5),
         choices=("experimental_config {'ppo': True, 'kimi_k2_tau': 0.1, 'kl_penalty_coef': "
                  "0.5}",)),
    _row("sum", {}, dict(_CISPO, agg="seq-mean-token-sum-norm", norm=1.0), reduction="sum",
         choices=("reduction 'sum', as the Megatron backend calls it: Σ l·weights·mask",)),
    _row("trajectory weights", {}, dict(_CISPO, agg="seq-mean-token-mean"),
         weights="trajectory", audit=dict(domain=("nonempty_rows",)),
         choices=("experimental_config {}; weights as ART's preprocessing builds them: "
                  "1/(L_i + 1e-6) on each completion's L_i assistant tokens "
                  "(tokenize_trajectory_groups), divided by their mean over the call's "
                  "assistant tokens (packed_tensors_from_tokenized_results normalises over "
                  "the packed batch: here the call is the batch); ART skips a completion "
                  "without assistant tokens (pack.py:61), so no row is empty",)),
)

TRAINER = Trainer(
    name="art", package="art", dist="openpipe-art", profile="trl", pinned="0.5.18",
    modules=(LOSS,), rows=ROWS,
    inventory=((LOSS, r"loss_fn|shift_tensor"), (GROUPS, r"group_aggregate")),
    not_run=(("shift_tensor", "reached through loss_fn, which every row calls: a shift of the "
                              "inputs by one position"),
             ("group_aggregate", "reached through loss_fn's sequence-level rows (the mean "
                                 "log-ratio of each completion); its var and std modes take "
                                 "E[x²] − E[x]² with 1e-8 in the count, which no row "
                                 "reaches")),
    runs=("loss_fn's default loss (CISPO's weight clip(sg(r), 0, 5)) and ppo (0.2/0.2, "
          "0.2/0.28) at importance_sampling_level token; the default loss at sequence, "
          "average and geometric_average, ppo 0.2/0.2 at sequence and geometric_average",
          "kimi_k2_tau (the τ-shifted advantage) and kl_penalty_coef (the KL folded into the "
          "advantage as a centred k1), alone and together under ppo",
          "reduction 'mean' (Unsloth backend) and 'sum' (Megatron backend)"),
    does_not_run=("ppo at importance_sampling_level 'average' (the default loss's row runs "
                  "that ratio; ppo's sequence and geometric rows its gradient through the "
                  "mean)", "mask_prob_ratio (the ratio zeroed outside (1 − ε, 1 + ε_high))",
                  "max_negative_advantage_importance_sampling_weight (a cap on the ratio of "
                  "every token, whatever its advantage's sign)",
                  "truncated_importance_sampling (min(r, U) detached on the loss; without "
                  "original_logprobs r is the ratio the loss already weights by)",
                  "weights normalised over a packed batch of several calls (each call is one "
                  "packed row; its loss is then Σ over its trajectories of their token means, "
                  "times N/(n·N_row) with N and n the batch's tokens and trajectories)",
                  "several completions in one packed row",
                  "the entropy and probs_corr outputs (logged, not trained)"),
    notes=("ART's default loss is called 'Modified REINFORCE or CISPO' in loss.py: with ε = 1 "
           "the weight's lower bound is 0, so it is CISPO with clip_low 1 and clip_high 4 "
           "(verl's relative form), the weight detached",
           "the token mean divides by Σ mask + 1e-6 (loss.py:129), and with kl_penalty_coef "
           "the KL's mean over the call too (loss.py:101): a relative difference of 1e-6/N, "
           "which the centred k1 carries into every token's advantage; the precision notes "
           "of the kl_penalty_coef rows are these",
           "with the weights ART's preprocessing gives (1/L_i per trajectory, normalised to "
           "mean 1), loss_fn's token mean is a per-trajectory token mean: the trajectory "
           "weights row is judged as seq-mean-token-mean",
           "kimi_k2_tau shifts every token's advantage by its own log-ratio; Kimi k1.5 and K2 "
           "take the whole response's log-ratio (the reference `shaped_advantages` says so)"),
)
