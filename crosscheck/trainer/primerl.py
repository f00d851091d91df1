"""prime-rl's report card (PrimeIntellect-ai/prime-rl, a checkout: `--path`): the RL loss of
src/prime_rl/trainer/rl/loss.py and the GRPO advantage of src/prime_rl/orchestrator/algo/grpo.py.

Facts read at commit 559b44772:
- two source roots make one namespace package: `src/prime_rl` (trainer, orchestrator) and
  `packages/prime-rl-configs/src/prime_rl` (configs); the loader reads both;
- `compute_loss(trainer_logprobs, inference_logprobs, ref_logprobs, advantages, loss_mask,
  rl_weights, ce_weights, ref_kl_weights, rl_loss_fn, rl_scale, ce_scale, ref_kl_scale)` takes
  one 1-D tensor per sample (the packed micro-batch split by sample length), sums the
  per-sample losses of `rl_loss_fn` and divides by `rl_scale`, the step's global count of
  loss-mask tokens (train.py): a token mean over the step;
- `default_loss_fn` is DPPO's binary-TV trust region on p − q (p = e^logp, q the inference
  policy's) conditioned on the advantage's sign, the policy term −keep·A·r with the ratio
  r = exp(logp − log q) attached and neither truncated nor clamped, plus kl_tau·(log r)² on
  every loss-mask token: the KL to the sampling policy (`DefaultLossConfig`: dppo_mask_low and
  dppo_mask_high 0.2, adv_tau 1, kl_tau 1e-3);
- the masks multiply (keep_mask * A * r, loss_mask * (log r)²), and `compute_loss` anchors its
  graph on trainer_logprobs[0].sum() * 0; the trainer's padding has loss_mask False,
  advantage 0 and inference log-prob 0 (batch.py), so both see finite values there;
- `GRPOAlgorithm.score_group` gives each trainable trace of a group reward − mean(reward), no
  std (the default `length_penalty` None), computed in float32, and writes it to every sampled
  token of the trace.
"""
import asyncio
import inspect
from types import SimpleNamespace

import torch

from .card import Known, Row, Trainer, owner_class, per_sequence

LOSS = "prime_rl.trainer.rl.loss"
ALGO = "prime_rl.orchestrator.algo"
GRPO = f"{ALGO}.grpo"
MAXRL = f"{ALGO}.max_rl"
# the algorithms ALGORITHM_CLASSES (algo/__init__.py, read as the card's registry) dispatches
# on, one module each
ALGORITHMS = ("grpo", "echo", "max_rl", "rae", "hierarchical_grpo", "opd", "opsd", "sft")

# DefaultLossConfig's defaults at 559b44772 (packages/prime-rl-configs/.../configs/trainer.py)
DEFAULTS = dict(dppo_mask_low=0.2, dppo_mask_high=0.2, adv_tau=1.0, kl_tau=1e-3)


def _compute_loss(fn):
    """compute_loss on one sample per row, with default_loss_fn built by setup_rl_loss_fn."""
    setup = inspect.unwrap(fn).__globals__["setup_rl_loss_fn"]

    def adapter(logp, old_logp, advantages, mask):
        rl_loss_fn = setup(SimpleNamespace(type="default", **DEFAULTS))
        m = mask.bool()
        rows = lambda x: list(x.unbind(0))                      # noqa: E731
        loss, _ = fn(rows(logp), rows(old_logp), None, rows(per_sequence(advantages, logp)),
                     rows(m), None, None, None, rl_loss_fn=rl_loss_fn,
                     rl_scale=max(int(m.sum()), 1), ce_scale=1, ref_kl_scale=1)
        return loss
    return adapter


class _Trace(SimpleNamespace):
    """What score_group and assign_advantages read of a verifiers trace: its reward, whether it
    errored, its agent's trainable flag, and nodes with a token mask."""


def _score_group(fn):
    """score_group on each group (the rows sharing a group id: groups of any size, one
    included), one trace per episode, each with one sampled token; the advantage read back
    from that token."""
    cls = owner_class(fn)

    def adapter(rewards, group_ids):
        algorithm = cls.__new__(cls)                   # __init__ only stores the config and pool
        algorithm.length_penalty = None
        ids = [int(i) for i in torch.as_tensor(group_ids).reshape(-1)]
        out = torch.zeros(rewards.shape[0], dtype=torch.float32)
        for group in dict.fromkeys(ids):
            rows = [b for b, i in enumerate(ids) if i == group]
            traces = [_Trace(reward=float(rewards[b]), has_error=False,
                             agent=SimpleNamespace(trainable=True),
                             nodes=[SimpleNamespace(mask=[True], token_ids=[0], advantages=None)])
                      for b in rows]
            asyncio.run(fn(algorithm, [SimpleNamespace(traces=[t]) for t in traces]))
            for b, t in zip(rows, traces):
                out[b] = t.nodes[0].advantages[0]
        return out                                     # the dtype score_group computes in
    return adapter


_GROUP = ("one trace per episode, each with one sampled token, whose advantage is read back "
          "as float32 (score_group computes in float32); a group is the rows sharing a group "
          "id, in any order and of any size: score_group gets one example's episodes, and "
          "iter_trainable_traces drops errored and untrainable traces, so groups differ in "
          "size and a group of one (its advantage 0) occurs",)
_PADDING = Known(
    "garbage", "robustness",
    "default_loss_fn masks by multiplying (keep_mask * advantages * importance_ratio and "
    "loss_mask * log_importance_ratio**2, loss.py:144-145), and compute_loss anchors its graph "
    "on trainer_logprobs[0].sum() * 0.0 (loss.py:355): a NaN or infinite log-prob or advantage "
    "at padding gives NaN · 0 = NaN. prime-rl's own padding holds advantage 0 and inference "
    "log-prob 0 (batch.py:714-731), so it bites only when padding holds such a value")
_SETUP = ("one sample per row (the packed micro-batch split by sample length, as train.py "
          "does), the advantage broadcast over the row's tokens",
          "rl_loss_fn from setup_rl_loss_fn on a plain namespace holding DefaultLossConfig's "
          "defaults at 559b44772 (dppo_mask_low 0.2, dppo_mask_high 0.2, adv_tau 1, kl_tau "
          "1e-3): setup_rl_loss_fn sends any config that is neither a CustomLossConfig nor an "
          "IPOLossConfig to default_loss_fn",
          "no rl, ce or ref_kl weights (compute_loss's hot path); rl_scale the call's count of "
          "loss-mask tokens: judged on whole batches, where prime-rl divides by the step's "
          "global count")

ROWS = (
    Row(f"{LOSS}:compute_loss", "policy_objective", _compute_loss, label="default loss",
        choices=_SETUP,
        conventions=dict(loss="dppo", form="ratio", divergence="tv", clip_low=0.2,
                         clip_high=0.2, clip_c=None, log_ratio_clamp=None, kl_eps=0.0,
                         agg="token-mean", beta=2e-3, kl_kind="k2", kl_clamp=None,
                         kl_weight=None, kl_anchor="old", empty_rows="exclude"),
        audit=dict(accumulation="none"),
        params=("trainer_logprobs", "inference_logprobs", "advantages", "loss_mask",
                "rl_loss_fn", "rl_scale"),
        known=(_PADDING,)),
    Row(f"{GRPO}:GRPOAlgorithm.score_group", "group_advantages", _score_group,
        choices=_GROUP + ("length_penalty None (the default)",),
        conventions=dict(ddof=0, eps=0.0, scale="none", baseline="mean", singleton="zero"),
        params=("episodes",)),
    Row(f"{MAXRL}:MaxRLAlgorithm.score_group", "group_advantages", _score_group,
        choices=_GROUP + ("rewards ≥ 0, as MaxRL assumes (its docstring: non-negative, "
                          "canonically binary rewards)",),
        conventions=dict(ddof=0, eps=0.0, scale="mean", baseline="mean", singleton="zero"),
        audit=dict(domain=("pass_rates",)), params=("episodes",)),
)

TRAINER = Trainer(
    name="prime-rl", package="prime_rl", dist="prime-rl", profile="verl",
    pinned="commit 559b44772", installable=False, modules=(LOSS, GRPO, MAXRL), rows=ROWS,
    inventory=((LOSS, r"compute_loss|default_loss_fn|ipo_loss_fn|ref_kl_loss_fn|ce_loss_fn|"
                      r"compute_importance_ratio_and_mismatch_kl|compute_entropy"),) + tuple(
        (f"{ALGO}.{name}", r"\w+Algorithm\.(score_group|score_episode)")
        for name in ALGORITHMS),
    registries=(ALGO,),
    not_run=(("SFTDistillAlgorithm", "assigns no advantage: the ce loss on a teacher's tokens "
                                     "(SFT)"),
             ("default_loss_fn", "reached through compute_loss, which the default-loss row "
                                 "calls"),
             ("compute_importance_ratio_and_mismatch_kl",
              "reached through default_loss_fn, which the default-loss row runs; its "
              "mismatch_kl (k3 to the inference policy) is a logged metric"),
             ("compute_entropy", "a logged metric, computed under torch.no_grad (train.py:443)"),
             ("EchoAlgorithm.score_episode", "writes ce weights (a role's alpha) on the "
                                             "observation tokens: SFT weights, not RL math; its "
                                             "advantages are GRPOAlgorithm.score_group's"),
             ("HierarchicalGRPOAlgorithm.score_group",
              "reward − the mean of the trace's peers, peers keyed by (agent, episode) for the "
              "episode_agents roles and by agent otherwise: GRPOAlgorithm.score_group's "
              "baseline over a grouping that needs multi-agent traces; no adapter yet"),
             ("RAEAlgorithm.score_group", "reward − a per-agent EMA baseline kept across "
                                          "calls (SPIRAL): no reference yet"),
             ("OPDAlgorithm.score_episode", "scores each branch under a teacher model: no "
                                            "math of its own"),
             ("OPSDAlgorithm.score_episode", "scores each branch under the policy with a "
                                             "demonstration prepended: no math of its own"),
             ("ipo_loss_fn", "a symmetric trust region |p − q| ≤ ipo_threshold whatever the "
                             "advantage's sign, which no reference takes"),
             ("ref_kl_loss_fn", "on-policy distillation (sg(ref − logp)·r with a one-sided "
                                "mask at −0.2): no reference yet"),
             ("ce_loss_fn", "a masked negative log-likelihood (SFT), not an RL function")),
    runs=("compute_loss with default_loss_fn (DPPO binary TV 0.2/0.2 + 1e-3·(log r)²)",
          "GRPOAlgorithm.score_group without a length penalty and MaxRLAlgorithm.score_group, "
          "on groups of unequal sizes and of one"),
    does_not_run=("rl, ce and ref_kl weight streams", "the IPO and custom losses",
                  "score_group's length penalty (shaped by mean(reward)·a length fraction, "
                  "which no reference takes)", "several traces of one episode"),
    notes=("default_loss_fn's policy term is −keep·A·r with r attached and no truncation, the "
           "surrogate form of DPPO's binary-TV loss, whose gradient −A·r·keep is that of "
           "verl's −A·sg(min(r, C))·logp with no C; its KL term kl_tau·(log r)² = 2·kl_tau·k2 "
           "is taken to the inference policy, not a reference model (per token, as "
           "prime-rl cites Kimi K2.5; Kimi k1.5 squares the whole response's log-ratio), "
           "and on every loss-mask token, those outside the trust region "
           "included: the reference's dppo form 'ratio' and kl_anchor 'old'",
           "the default KL coefficient kl_tau = 1e-3 multiplies (log r)², so the reference's "
           "beta on k2 = ½(log r)² is 2e-3",
           "score_group's baseline is the mean over the group's trainable traces, pooled "
           "across episodes: an episode with several traces weighs more (not run: the card "
           "gives one trace per episode)"),
)
