"""slime's report card (THUDM/slime, a checkout: `--path`): slime/utils/ppo_utils.py, the
per-sample mean of slime/backends/megatron_utils/cp_utils.py, the rollout-correction weights of
slime/backends/megatron_utils/loss.py and the GRPO reward normalisation of slime/ray/rollout.py.

Facts read at commit 624b824a8:
- a sample's tensors hold its response tokens only (a list of 1-D tensors, no padding); a token
  outside the loss (a tool's output in a multi-turn rollout) is a real token with a finite
  log-prob and loss mask 0; the loss functions concatenate the samples' tokens;
- `compute_approx_kl`, `compute_policy_loss` and `compute_cispo_loss` are wrapped by
  `torch.compile(dynamic=True)`; `compute_approx_kl` computes in float32 (`.float()`), k3 and
  low_var_kl are the same estimator, low_var_kl clamped to ±10 after it, no log-ratio clamp;
- `compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)` takes
  ppo_kl = old − new log-prob and returns PPO's per-token clipped loss (dual clip with
  eps_clip_c), unmasked; GSPO passes it `compute_gspo_kl`'s per-sample masked mean of ppo_kl,
  attached, expanded over the sample's tokens;
- `compute_cispo_loss`: −sg(clip(r, 1 − eps_clip, 1 + eps_clip_high))·A·logp;
- `get_sum_of_sample_mean` (context-parallel size 1) returns Σ_i Σ_t x·m / max(Σ_t m, 1) over
  the samples; `loss_function` scales the sum by the micro-batch count over the step's sample
  count, and Megatron divides by the micro-batch count: a mean over samples of each sample's
  token mean;
- `vanilla_gae`, `chunked_gae` take [B, T] rewards and values right-padded with 0, which
  `get_advantages_and_returns_batch` builds, and no mask;
- `_post_process_rewards` normalises GRPO rewards per group of n_samples_per_prompt
  consecutive samples: (r − mean) / (torch.std (Bessel) + 1e-6), in float32;
- `vanilla_tis_function` truncates w = exp(train − rollout log-prob) to [tis_clip_low,
  tis_clip] (0 and 2 by default); `icepop_function` zeroes it outside those bounds.
"""
import inspect
from types import SimpleNamespace

import torch

from .card import Known, Row, Trainer, eager, per_sequence, zero_padding

PPO = "slime.utils.ppo_utils"
CP = "slime.backends.megatron_utils.cp_utils"
LOSS = "slime.backends.megatron_utils.loss"
ROLLOUT = "slime.ray.rollout"


def _rows(x):
    return list(x.unbind(0))


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return zero_padding(mask, fn(logp, ref_logp, kl_loss_type=kind))
        return adapter
    return make


def _ppo(**settings):
    def make(fn):
        def adapter(logp, old_logp, advantages, mask):
            loss, _ = fn(old_logp - logp, per_sequence(advantages, logp), **settings)
            return zero_padding(mask, loss)
        return adapter
    return make


def _cispo(fn):
    def adapter(logp, old_logp, advantages, mask):
        loss, _ = fn(old_logp - logp, logp, per_sequence(advantages, logp), eps_clip=0.2,
                     eps_clip_high=0.28)
        return zero_padding(mask, loss)
    return adapter


def _gspo(fn):
    """compute_gspo_kl, then the module's compute_policy_loss on it, as policy_loss_function
    composes them."""
    policy = eager(inspect.unwrap(fn).__globals__["compute_policy_loss"])

    def adapter(logp, old_logp, advantages, mask):
        m = mask.to(logp.dtype)
        ppo_kl = fn(_rows(logp), _rows(old_logp), _rows(logp), _rows(m)).reshape(logp.shape)
        loss, _ = policy(ppo_kl, per_sequence(advantages, logp), eps_clip=3e-4,
                         eps_clip_high=4e-4)
        return zero_padding(mask, loss)
    return adapter


# the chunk size the chunked rows pass: the cases' rows are shorter than slime's default 128,
# so at that size every row is one chunk and the carry between chunks never runs
CHUNK = 3


def _gae(gamma, lam, **chunking):
    def make(fn):
        def adapter(rewards, values, mask):
            adv, ret = fn(zero_padding(mask, rewards), zero_padding(mask, values), gamma=gamma,
                          lambd=lam, **chunking)
            return zero_padding(mask, adv), zero_padding(mask, ret)
        return adapter
    return make


def _batch_gae(gamma, lam):
    """get_advantages_and_returns_batch on one sample per row, each the row's valid tokens (the
    right-padded domain: a prefix), as the actor passes its per-sample values and rewards; the
    per-sample outputs written back into [B, T], 0 at padding."""
    def make(fn):
        def adapter(rewards, values, mask):
            lengths = [int(n) for n in mask.sum(dim=1)]
            adv, ret = values.new_zeros(values.shape), values.new_zeros(values.shape)
            if not lengths:
                return adv, ret
            a, r = fn(lengths, lengths, [values[b, :n] for b, n in enumerate(lengths)],
                      [rewards[b, :n] for b, n in enumerate(lengths)], gamma=gamma, lambd=lam)
            for b, n in enumerate(lengths):
                adv[b, :n], ret[b, :n] = a[b], r[b]
            return adv, ret
        return adapter
    return make


def _returns(gamma):
    def make(fn):
        def adapter(rewards, mask):
            return zero_padding(mask, fn(zero_padding(mask, rewards), gamma, chunk_size=CHUNK))
        return adapter
    return make


def _sample_mean(fn):
    def adapter(loss, mask):
        B, T = loss.shape
        m = mask.to(loss.dtype)
        reduce = fn([T] * B, [T] * B, _rows(m))
        return reduce(loss.reshape(-1)) / B
    return adapter


class _Sample(SimpleNamespace):
    def get_reward_value(self, args):
        return self.reward


def _grpo(fn):
    def adapter(rewards, group_size):
        n = int(group_size)
        manager = SimpleNamespace(custom_reward_post_process_func=None, args=SimpleNamespace(
            advantage_estimator="grpo", rewards_normalization=True,
            grpo_std_normalization=True, n_samples_per_prompt=n,
            rollout_batch_size=rewards.shape[0] // n))
        _, normalised = fn(manager, [_Sample(reward=float(r)) for r in rewards])
        return torch.tensor(normalised, dtype=torch.float32)   # computed in float32
    return adapter


def _weights(low, high):
    def make(fn):
        def adapter(logp, rollout_logp, mask):
            m = mask.to(logp.dtype)
            args = SimpleNamespace(tis_clip_low=low, tis_clip=high)
            w, _, _ = fn(args, pg_loss=torch.ones_like(logp).reshape(-1),
                         train_log_probs=_rows(logp), rollout_log_probs=_rows(rollout_logp),
                         loss_masks=_rows(m))
            return zero_padding(mask, w.reshape(logp.shape))
        return adapter
    return make


_NO_PADDING = Known(
    "garbage", "robustness",
    "slime's per-token tensors hold no padding: a sample's tensor is its response, and a token "
    "outside the loss (a tool's output) is a real token with a finite log-prob. The per-token "
    "functions compute on every token and the mask multiplies afterwards "
    "(get_sum_of_sample_mean: (x_i * loss_mask_i).sum()), so a NaN or infinite value at a "
    "masked position gives NaN · 0 = NaN; no slime tensor holds one there")
_EVERY_TOKEN = ("the per-token loss read at the valid tokens (slime masks in its per-sample "
                "mean)",)
_PPO_PARAMS = ("ppo_kl", "advantages", "eps_clip", "eps_clip_high")

def _opsm(fn):
    """compute_opsm_mask on one sample per row (its response, the row's mask as loss_mask),
    args.opsm_delta 1e-4 (slime's default); the concatenated mask back in [B, T]."""
    def adapter(logp, old_logp, advantages, mask):
        a = per_sequence(advantages, logp)
        m = mask.to(logp.dtype)
        B = logp.shape[0]
        keep, _ = fn(SimpleNamespace(opsm_delta=1e-4), [logp[b] for b in range(B)],
                     [old_logp[b] for b in range(B)], [a[b] for b in range(B)],
                     [m[b] for b in range(B)])
        return zero_padding(mask, keep.reshape(logp.shape)) if B else logp.new_zeros(logp.shape)
    return adapter


ROWS = tuple(
    Row(f"{PPO}:compute_approx_kl", "kl_penalty", _kl(kind), label=kind,
        choices=("read at the valid tokens",), conventions=dict(kind=ref, clamp=clamp),
        params=("log_probs", "log_probs_base", "kl_loss_type"), known=(_NO_PADDING,))
    for kind, ref, clamp in (("k1", "k1", None), ("k2", "k2", None), ("k3", "k3", None),
                             ("low_var_kl", "k3", (None, 10.0)))
) + (
    Row(f"{PPO}:compute_policy_loss", "ppo_clip_loss", _ppo(eps_clip=0.2, eps_clip_high=0.28),
        label="ε 0.2/0.28", choices=("ppo_kl = old_logp − logp; eps_clip 0.2, eps_clip_high "
                                     "0.28: the bounds apart, so a swap shows",) + _EVERY_TOKEN,
        conventions=dict(clip_low=0.2, clip_high=0.28, clip_c=None, delta=None,
                         log_ratio_clamp=None),
        params=_PPO_PARAMS, known=(_NO_PADDING,)),
    Row(f"{PPO}:compute_policy_loss", "ppo_clip_loss",
        _ppo(eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=3.0), label="dual clip 3",
        choices=("ppo_kl = old_logp − logp; eps_clip 0.2 (eps_clip_high defaults to it), "
                 "eps_clip_c 3",) + _EVERY_TOKEN,
        conventions=dict(clip_low=0.2, clip_high=0.2, clip_c=3.0, delta=None,
                         log_ratio_clamp=None),
        params=_PPO_PARAMS + ("eps_clip_c",), known=(_NO_PADDING,)),
    Row(f"{PPO}:compute_opsm_mask", "opsm_mask", _opsm,
        choices=("one sample per row, each the row's full response with its mask as "
                 "loss_mask; args.opsm_delta 1e-4 (its default); the mask read at the valid "
                 "tokens",),
        conventions=dict(delta=1e-4), audit=dict(profile=None),
        params=("args", "full_log_probs", "full_old_log_probs", "advantages", "loss_masks"),
        known=(_NO_PADDING,)),
    Row(f"{PPO}:compute_cispo_loss", "cispo_loss", _cispo, label="ε 0.2/0.28",
        choices=("ppo_kl = old_logp − logp; eps_clip 0.2, eps_clip_high 0.28",) + _EVERY_TOKEN,
        conventions=dict(bound="relative", clip_low=0.2, clip_high=0.28, log_ratio_clamp=None),
        params=("ppo_kl", "log_probs", "advantages", "eps_clip", "eps_clip_high"),
        known=(_NO_PADDING,)),
    Row(f"{PPO}:compute_gspo_kl", "gspo_loss", _gspo, label="GSPO",
        choices=("one sample per row; compute_gspo_kl's sequence KL passed to compute_policy_"
                 "loss as policy_loss_function does, eps_clip 3e-4, eps_clip_high 4e-4 (GSPO's "
                 "bounds)",) + _EVERY_TOKEN,
        conventions=dict(form="sequence", clip_low=3e-4, clip_high=4e-4, log_ratio_max=None),
        params=("full_log_probs", "full_old_log_probs", "local_log_probs", "loss_masks"),
        known=(_NO_PADDING,)),
) + tuple(
    Row(f"{PPO}:{name}", "gae", _gae(gamma, lam, **chunking), label=label,
        choices=("rewards and values 0 at padding, as get_advantages_and_returns_batch pads "
                 f"them; γ {gamma}, λ {lam}{note}; read at the valid tokens",) + (
                     (f"chunk_size {CHUNK}: the cases' rows span several chunks (at the "
                      "default 128 every row is one chunk), so the carry between chunks and "
                      "a last chunk shorter than the others are run",) if chunking else ()),
        conventions=dict(gamma=gamma, lam=lam), audit=dict(domain=("right_padded",)),
        params=("rewards", "values", "gamma", "lambd") + (("chunk_size",) if chunking else ()))
    for name, chunking in (("vanilla_gae", {}), ("chunked_gae", dict(chunk_size=CHUNK)))
    for gamma, lam, label, note in ((1.0, 1.0, "γ 1, λ 1", " (slime's defaults)"),
                                    (0.99, 0.95, "γ 0.99, λ 0.95", ""))
) + (
    Row(f"{PPO}:get_advantages_and_returns_batch", "gae", _batch_gae(0.99, 0.95),
        label="γ 0.99, λ 0.95",
        choices=("as the actor calls it: one sample per row, its response the row's valid "
                 "tokens (right-padded rows: a prefix), total_lengths = response_lengths (no "
                 "context parallelism); it pads the samples to the longest and runs chunked_gae "
                 "(its default); the per-sample outputs written back, 0 at padding; γ 0.99, "
                 "λ 0.95",),
        conventions=dict(gamma=0.99, lam=0.95), audit=dict(domain=("right_padded",)),
        params=("total_lengths", "response_lengths", "values_list", "rewards_list", "gamma",
                "lambd")),
) + tuple(
    Row(f"{PPO}:chunked_discounted_returns", "discounted_returns", _returns(gamma),
        label=f"γ {gamma:g}",
        choices=(f"rewards 0 at padding; discount {gamma:g}; chunk_size {CHUNK} (the carry "
                 "between chunks run); read at the valid tokens",),
        conventions=dict(gamma=gamma), audit=dict(domain=("right_padded",)),
        params=("rewards", "discount", "chunk_size"))
    for gamma in (1.0, 0.99)
) + (
    Row(f"{CP}:get_sum_of_sample_mean", "aggregate", _sample_mean,
        choices=("one sample per row, the whole row its response; the reducer's sum over "
                 "samples divided by the sample count, the scaling loss_function and Megatron "
                 "apply (loss · M / B, then ÷ M)", "context-parallel size 1 (Megatron's "
                 "parallel state as one process)"),
        conventions=dict(mode="seq-mean-token-mean", norm=None, empty_rows="include"),
        audit=dict(accumulation="none"),
        params=("total_lengths", "response_lengths", "loss_masks"), known=(_NO_PADDING,)),
    Row(f"{ROLLOUT}:RolloutManager._post_process_rewards", "group_advantages", _grpo,
        choices=("advantage_estimator 'grpo' with rewards_normalization and "
                 "grpo_std_normalization (the defaults); n_samples_per_prompt the group size, "
                 "rollout_batch_size the number of groups; the rewards as sample rewards; the "
                 "normalised rewards read back as float32 (computed in float32)",),
        conventions=dict(ddof=1, eps=1e-6, scale="group", baseline="mean"),
        audit=dict(domain=("groups_of_two",)), params=("samples",)),
    Row(f"{LOSS}:vanilla_tis_function", "rollout_is_weights", _weights(0.0, 2.0),
        label="tis_clip 2",
        choices=("tis_clip_low 0, tis_clip 2 (the defaults); pg_loss 1 at every token, so the "
                 "output is the weight; one sample per row",),
        conventions=dict(level="token", mode="truncate", lower=0.0, upper=2.0,
                         log_ratio_clamp=None),
        params=("pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks"),
        known=(_NO_PADDING,)),
    Row(f"{LOSS}:icepop_function", "rollout_is_weights", _weights(0.5, 5.0),
        label="IcePop 0.5/5",
        choices=("tis_clip_low 0.5, tis_clip 5 (IcePop's bounds; slime's default lower bound "
                 "0 lets every small ratio through); pg_loss 1 at every token, so the output is "
                 "the weight; one sample per row",),
        conventions=dict(level="token", mode="mask", lower=0.5, upper=5.0, kept="token",
                         log_ratio_clamp=None),
        params=("pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks"),
        known=(_NO_PADDING,)),
)

TRAINER = Trainer(
    name="slime", package="slime", dist="slime", profile="verl", pinned="commit 624b824a8",
    installable=False, modules=(PPO, CP, LOSS, ROLLOUT), rows=ROWS,
    inventory=((PPO, r"compute_approx_kl|compute_policy_loss|compute_cispo_loss|"
                     r"compute_gspo_kl|compute_opsm_mask|get_grpo_returns|"
                     r"get_reinforce_plus_plus_returns|"
                     r"get_reinforce_plus_plus_baseline_advantages|vanilla_gae|chunked_gae|"
                     r"chunked_discounted_returns|get_advantages_and_returns_batch|"
                     r"calculate_log_probs_and_entropy"),
               (CP, r"get_sum_of_sample_mean"),
               (LOSS, r"compute_advantages_and_returns|vanilla_tis_function|icepop_function|"
                      r"policy_loss_function|value_loss_function"),
               (ROLLOUT, r"RolloutManager\._post_process_rewards")),
    not_run=(("get_grpo_returns", "copies each sample's reward to its tokens"),
             ("calculate_log_probs_and_entropy", "log-probs and entropy from Megatron's "
                                                 "vocab-parallel logits: no row yet"),
             ("get_reinforce_plus_plus_returns", "reads a rollout batch's KL and rewards lists "
                                                 "and Megatron's context-parallel slicing: its "
                                                 "return is chunked_discounted_returns, which "
                                                 "a row runs"),
             ("get_reinforce_plus_plus_baseline_advantages",
              "R − β·kl per token, unmasked: no reference takes a per-token KL shaping of a "
              "group baseline"),
             ("compute_advantages_and_returns", "dispatches on args.advantage_estimator over a "
                                                "rollout_data dict; its GAE and returns are the "
                                                "functions the rows run"),
             ("policy_loss_function", "takes the model's logits and Megatron's packed batch"),
             ("value_loss_function", "takes the model's logits and Megatron's packed batch")),
    runs=("compute_approx_kl k1, k2, k3, low_var_kl", "compute_opsm_mask (δ 1e-4)",
          "compute_policy_loss (0.2/0.28; dual "
          "clip 3)", "compute_cispo_loss", "GSPO (compute_gspo_kl into compute_policy_loss)",
          "vanilla_gae and chunked_gae (γ 1, λ 1 and γ 0.99, λ 0.95; chunked at chunk_size 3)",
          "chunked_discounted_returns (γ 1 and 0.99, chunk_size 3)",
          "get_advantages_and_returns_batch (the per-sample GAE the actor runs, padded into a "
          "batch and sliced back) at γ 0.99, λ 0.95",
          "get_sum_of_sample_mean at context-parallel size 1",
          "_post_process_rewards for GRPO", "vanilla_tis_function", "icepop_function"),
    does_not_run=("torch.compile (the eager functions run)", "context parallelism",
                  "calculate_per_token_loss", "rollout_mask_sums denominators (samples of one "
                  "rollout sharing a denominator)", "the importance-weighted KL "
                  "(use_unbiased_kl)", "masks with zeros inside a sample for GAE (multi-turn "
                  "rollouts: slime's GAE takes no mask and steps through those tokens)"),
    notes=("judged under the verl profile, whose estimators slime's follow, with every "
           "convention the rows need set explicitly: slime clamps no log-ratio",
           "compute_approx_kl casts to float32, so its rows are judged at float32 tolerance",),
)
