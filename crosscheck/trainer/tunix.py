"""Tunix's report card (google/tunix, `google-tunix`, JAX): the GRPO loss, aggregation, KL
estimators and group advantages of tunix/rl/algo_core.py and tunix/rl/common.py.

Facts read in google-tunix 0.1.7:
- the math is JAX: `jax` and `jaxlib` (the CPU build) must be installed beside torch, which
  they do not replace (`Trainer.requires` pins them; CI installs them with --no-deps); flax,
  absl and the rest of the package's dependencies are imported by the package `__init__` and
  by `common.py`, and stood in: the rows never touch them;
- `grpo_loss_fn(model, train_example, algo_config, pad_id, eos_id)` computes the per-token
  log-probs from the model (`common.compute_per_token_logps(graphdef, state, ...)` after
  `nnx.split(model)`), casts them to float32, clamps log r to ±20, takes PPO's clip
  max(−A·r, −A·clip(r, 1 − ε, 1 + ε_high)) (ε_high = ε unless the config has epsilon_high),
  the dual clip where `epsilon_c` is set, aggregates with `common.aggregate_loss` under
  `loss_agg_mode`, and adds β·aggregate_loss(k) with k = `compute_kl_divergence(logp, ref,
  kl_loss_mode)` where the example holds reference log-probs; GRPOConfig's defaults: β 0.04,
  ε 0.2, kl_loss_mode "kl" (logp − ref), loss_agg_mode "sequence-mean-token-mean";
- `aggregate_loss(per_token_loss, completion_mask, loss_agg_mode, norm=...)`: "token-mean"
  (÷ the batch's tokens), "sequence-mean-token-mean" (each row's token mean, ÷ the rows with a
  token), "sequence-mean-token-scale" (each row's token sum ÷ norm, default T, ÷ the rows with a
  token: `aggregate`'s "seq-mean-token-sum" with that norm), "seq-mean-token-sum",
  "sequence-mean-token-sum-norm" (÷ norm, default the rows with a token);
- `compute_kl_divergence(logp, ref, method)`: "kl" logp − ref, "mse_kl" ½(logp − ref)²,
  "low_var_kl" e^(ref − logp) − (ref − logp) − 1, in float32;
- `compute_advantages(rewards, num_generations)` (NumPy): (r − group mean)/(unbiased group
  std + 1e-6), groups of consecutive rows; GRPOConfig refuses num_generations ≤ 1.
"""
import contextlib
from types import SimpleNamespace

import numpy as np
import torch

from .card import NotInVersion, Row, Trainer, source_of

CORE = "tunix.rl.algo_core"
COMMON = "tunix.rl.common"

# GRPOConfig's defaults in 0.1.7 (tunix/rl/grpo/grpo_learner.py)
_GRPO = dict(beta=0.04, epsilon=0.2, loss_algo="grpo",
             loss_agg_mode="sequence-mean-token-mean", kl_loss_mode="kl",
             kl_clamp_value=None, temperature=1.0)


def _jnp(x):
    import jax.numpy as jnp
    return jnp.asarray(np.asarray(x.detach().cpu().numpy()))


class _Jax(torch.autograd.Function):
    """A JAX function f(x, *consts) as a torch function of x: its value by `fwd`, its VJP by
    `bwd` (both jitted once per row, compiled once per shape)."""

    @staticmethod
    def forward(ctx, x, fns, consts):
        fwd, bwd = fns
        out = fwd(_jnp(x), *consts)
        ctx.fns, ctx.consts, ctx.x, ctx.out_dtype = fns, consts, _jnp(x), out.dtype
        ctx.dtype = x.dtype
        return torch.from_numpy(np.array(out))

    @staticmethod
    def backward(ctx, g):
        import jax.numpy as jnp
        gx = ctx.fns[1](ctx.x, jnp.asarray(g.detach().cpu().numpy(), dtype=ctx.out_dtype),
                        *ctx.consts)
        return torch.from_numpy(np.array(gx)).to(ctx.dtype), None, None


def jitted(f):
    """(fwd, bwd) of f(x, *consts): jax.jit of f and of its VJP in x."""
    import jax

    def bwd(x, g, *consts):
        _, vjp = jax.vjp(lambda y: f(y, *consts), x)
        return vjp(g)[0]
    return jax.jit(f), jax.jit(bwd)


def jax_call(fns, x, *consts):
    """torch tensor → f(x, *consts) in JAX → torch tensor, differentiable in x through
    jax.vjp (`fns` from `jitted`)."""
    return _Jax.apply(x, fns, consts)


@contextlib.contextmanager
def _log_probs(fn, logp):
    """common.compute_per_token_logps (the model's forward pass) answering `logp` and zero
    logits [B, T, 2] (read only for the logged entropy), for the duration of one call."""
    common = fn.__globals__["common"]
    real = common.compute_per_token_logps

    def stand_in(*args, **kwargs):
        import jax.numpy as jnp
        return logp, jnp.zeros(logp.shape + (2,), logp.dtype)
    common.compute_per_token_logps = stand_in
    try:
        yield
    finally:
        common.compute_per_token_logps = real


def _grpo(**settings):
    config = SimpleNamespace(**dict(_GRPO, **settings))

    def make(fn):
        def f(lp, mask, advantages, old, ref):
            example = SimpleNamespace(completion_ids=mask, completion_mask=mask,
                                      advantages=advantages, old_per_token_logps=old,
                                      ref_per_token_logps=ref, prompt_ids=None)
            with _log_probs(fn, lp):
                loss, _ = fn(None, example, config, pad_id=0, eos_id=1)
            return loss
        fns = []

        def adapter(logp, old_logp, advantages, mask, ref_logp=None):
            fns[:] = fns or jitted(f)
            return jax_call(fns, logp, _jnp(mask.to(torch.int32)), _jnp(advantages),
                            _jnp(old_logp), None if ref_logp is None else _jnp(ref_logp))
        return adapter
    return make


def _aggregate(mode, **kwargs):
    def make(fn):
        fns = []

        def adapter(loss, mask):
            fns[:] = fns or jitted(lambda x, m: fn(x, m, mode, **kwargs))
            return jax_call(fns, loss, _jnp(mask.to(torch.int32)))
        return adapter
    return make


def _kl(method):
    def make(fn):
        fns = []

        def adapter(logp, ref_logp, mask):
            fns[:] = fns or jitted(lambda x, ref: fn(x, ref, method))
            return jax_call(fns, logp, _jnp(ref_logp))
        return adapter
    return make


def _advantages(fn):
    def adapter(rewards, group_size):
        out = fn(rewards.detach().cpu().numpy(), int(group_size))
        return torch.from_numpy(np.asarray(out))
    return adapter


def _fits_mode(mode):
    """aggregate_loss's `mode` in this release: absent (NOT IN THIS VERSION: before 0.1.6 there
    is no sequence-mean-token-scale), or before 0.1.7 a sequence mean over every row, empty ones
    included (`seq_loss.mean()`; 0.1.7 divides by the rows with a token)."""
    def fits(fn):
        source = source_of(fn)
        if f'"{mode}"' not in source:
            raise NotInVersion(f"aggregate_loss has no mode {mode!r} in this version")
        if mode != "token-mean" and "non_zero_rows" not in source:
            return dict(conventions=dict(empty_rows="include"),
                        choice="this release's sequence modes take seq_loss.mean() over every "
                               "row, empty ones included (0.1.7 divides by the rows with a "
                               "token)")
        return {}
    return fits


_CALL = ("grpo_loss_fn called as the learner calls it (model, train_example, algo_config, "
         "pad_id, eos_id) with the model's forward pass `common.compute_per_token_logps` "
         "answering the log-probs under test (and zero logits, read only for the logged "
         "entropy) for the call; `nnx.split(model)` runs on flax's stand-in",
         "train_example a namespace of completion_mask (int32), advantages ([B] or [B, T]), "
         "old and reference log-probs as JAX arrays; algo_config a namespace of GRPOConfig's "
         "defaults at 0.1.7 (β 0.04, ε 0.2, kl_loss_mode 'kl', loss_agg_mode "
         "'sequence-mean-token-mean', kl_clamp_value None, temperature 1) with the row's "
         "settings",
         "JAX computes the value and, through jax.vjp, the gradient (float32: JAX's default "
         "without x64, as Tunix trains); the tensors cross as NumPy arrays")
_PPO = dict(loss="ppo", clip_low=0.2, clip_high=0.2, clip_c=None, delta=None,
            log_ratio_clamp=20.0, agg="seq-mean-token-mean", empty_rows="exclude",
            beta=0.04, kl_kind="k1", kl_clamp=None, kl_weight=None, kl_anchor="ref")
_WHOLE = dict(accumulation="none")     # judged per call: the learner's micro-batching is
# outside these functions
_LOSS_PARAMS = ("model", "train_example", "algo_config", "pad_id", "eos_id")

ROWS = (
    Row(f"{CORE}:grpo_loss_fn", "policy_objective", _grpo(), label="grpo",
        choices=_CALL, conventions=_PPO, audit=_WHOLE, params=_LOSS_PARAMS),
    Row(f"{CORE}:grpo_loss_fn", "policy_objective",
        _grpo(beta=0.0, loss_agg_mode="token-mean", epsilon_high=0.28, epsilon_c=3.0),
        label="token-mean, ε 0.2/0.28, dual clip 3", choices=_CALL,
        conventions=dict(_PPO, beta=0.0, agg="token-mean", clip_high=0.28, clip_c=3.0),
        audit=_WHOLE, params=_LOSS_PARAMS),
) + tuple(
    Row(f"{COMMON}:aggregate_loss", "aggregate", _aggregate(mode, **kw), label=mode,
        choices=("the per-token loss and the mask (int32) as JAX arrays",) + extra,
        conventions=conv, audit=_WHOLE, fits=_fits_mode(mode),
        params=("per_token_loss", "completion_mask", "loss_agg_mode"))
    for mode, kw, conv, extra in (
        ("token-mean", {}, dict(mode="token-mean", empty_rows="exclude"), ()),
        ("sequence-mean-token-scale", dict(norm=8.0),
         dict(mode="seq-mean-token-sum", norm=8.0, empty_rows="exclude"),
         ("norm 8 passed (the keyword _check_get_norm reads): without it the norm is the "
          "padded length T, which the losses' calls leave it at",)),
    )
) + tuple(
    Row(f"{COMMON}:compute_kl_divergence", "kl_penalty", _kl(method), label=method,
        choices=("logp and ref_logp as JAX arrays; the mask is not an input (the caller "
                 "masks)",), conventions=dict(kind=kind, clamp=None),
        params=("per_token_logps", "ref_per_token_logps", "method"))
    for method, kind in (("kl", "k1"), ("low_var_kl", "k3"))
) + (
    Row(f"{CORE}:compute_advantages", "group_advantages", _advantages, label="grpo",
        choices=("the rewards as a NumPy array, num_generations the group size (consecutive "
                 "rows)",),
        conventions=dict(ddof=1, eps=1e-6, scale="group", baseline="mean", singleton="keep"),
        audit=dict(domain=("groups_of_two",)), params=("rewards", "num_generations")),
)

TRAINER = Trainer(
    name="tunix", package="tunix", dist="google-tunix", profile="verl", pinned="0.1.7",
    modules=(CORE, COMMON), rows=ROWS,
    requires=("jax==0.10.2", "jaxlib==0.10.2", "ml_dtypes==0.7.0", "opt_einsum==3.4.0"),
    inventory=((CORE, r"compute_.*|masked_.*|ppo_.*|grpo_loss_fn"),
               (COMMON, r"aggregate_loss|compute_kl_divergence"),
               ("tunix.rl.grpo.dapo_learner", r"reward_shaping")),
    not_run=(("compute_gae_advantages", "a reference exists (gae); no row yet"),
             ("masked_whiten", "a reference exists (whiten); no row yet"),
             ("masked_mean", "reached through the losses (Σ x·m / (Σ m + 1e-8))"),
             ("masked_var", "reached through masked_whiten"),
             ("compute_entropy_from_logits", "logged, not trained (its softmax of a "
                                             "log_softmax is not the entropy's form)"),
             ("ppo_policy_loss_fn", "a reference exists (policy_objective); no row yet"),
             ("ppo_value_loss_fn", "a reference exists (value_loss); no row yet: it calls "
                                   "the value model through common.compute_score"),
             ("compute_rloo_advantages", "a reference exists (group_advantages, "
                                         "leave_one_out); no row yet"),
             ("compute_drgrpo_advantages", "a reference exists (group_advantages, scale "
                                           "'none'); no row yet"),
             ("reward_shaping", "DAPO's overlong penalty min(−(len − (L_max − L_buf))/L_buf·p, "
                                "0) on the completion's string length (characters, not "
                                "tokens): no reference yet")),
    precision="float32", fork=False,
    runs=("grpo_loss_fn under GRPOConfig's defaults (β 0.04 with the k1 'kl' term, ε 0.2, "
          "sequence-mean-token-mean), and β 0 with token-mean, ε 0.2/0.28 and dual clip 3",
          "aggregate_loss token-mean and sequence-mean-token-scale (norm 8)",
          "compute_kl_divergence kl and low_var_kl", "compute_advantages (GRPO)"),
    does_not_run=("aggregate_loss sequence-mean-token-mean (run inside grpo_loss_fn's default "
                  "row) and seq-mean-token-sum, compute_kl_divergence mse_kl: each JAX row "
                  "compiles its function once per case shape, which the card's time budget "
                  "does not hold for every mode", "gspo-token", "sampler_is_weights (precomputed truncated IS weights)",
                  "kl_clamp_value", "sequence-mean-token-sum-norm",
                  "the PPO learner's losses and GAE", "packed sequences (segment_ids)"),
    notes=("sequence-mean-token-scale is aggregate's seq-mean-token-sum with norm T (Dr. "
           "GRPO's constant): no new reference",),
)
