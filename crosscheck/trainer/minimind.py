"""MiniMind's report card: statement blocks of trainer/train_grpo.py and trainer/train_ppo.py.

MiniMind is a set of training scripts, not a package: `trainer minimind --path CHECKOUT`. Its
math is written inline in `grpo_train_epoch` and `ppo_train_epoch`; each row names a block by
its first and last assignment (crosscheck.trainer.blocks) and runs only those statements, with
the block's inputs and an `args` holding the hyper-parameters it reads.

Covered: GRPO group advantages, the GRPO/CISPO loss with its k3 term and per-sequence
aggregation, PPO's GAE loop and its advantage whitening. Not covered: the PPO actor and critic
losses, clip fraction and approx-KL, which sit in a mini-batch loop over shuffled indices (their
conventions are in the minimind profile); the reward functions (a reward model and heuristics).
"""
from .card import Known, Row, Trainer

GRPO_FILE = "trainer.train_grpo"
PPO_FILE = "trainer.train_ppo"
GAMMA, LAM = 0.99, 0.95


def _group(fn):
    def adapter(rewards, group_size):
        return fn(args=dict(num_generations=int(group_size)), rewards=rewards)
    return adapter


def _loss(loss_type, **hyper):
    def make(fn):
        def adapter(logp, old_logp, advantages, mask, ref_logp):
            return fn(args=dict(loss_type=loss_type, **hyper), per_token_logps=logp,
                      old_per_token_logps=old_logp, ref_per_token_logps=ref_logp,
                      advantages=advantages, completion_mask=mask.int())
        return adapter
    return make


def _gae(gamma, lam):
    def make(fn):
        def adapter(rewards, values, mask):
            m = mask.to(values.dtype)
            return fn(args=dict(gamma=gamma, lam=lam, device="cpu"), B=values.shape[0],
                      old_resp_values=values * m, token_rewards=rewards * m)
        return adapter
    return make


def _whiten(fn):
    def adapter(x, mask):
        return fn(advantages=x, resp_policy_mask=mask.to(x.dtype))
    return adapter


_LOSS = ("the block from kl_div = ... to policy_loss = ... in grpo_train_epoch",
         "completion_mask = mask as int; advantages one per sequence, as MiniMind computes them")

_PADDING = Known(
    "garbage", "robustness",
    "the block takes exp(ref − log π) for the k3 term (and exp(log π − log π_old) for the "
    "ratio) at every position and masks by multiplying ((per_token_loss * completion_mask)"
    ".sum), so a padded position whose log-ratio overflows exp (> 88 in float32) gives "
    "inf · 0 = NaN and the whole loss is NaN. Valid positions are exact; it bites only when "
    "padding holds extreme log-probs")
_PER_SEQUENCE = dict(domain=("per_sequence_advantages",))

ROWS = (
    Row(f"{GRPO_FILE}:grpo_train_epoch", "group_advantages", _group, label="advantages",
        block=("grouped_rewards", "advantages", ("advantages",)),
        choices=("the block from grouped_rewards = ... to advantages = ...",
                 "args.num_generations = group_size: groups are consecutive blocks")),
    Row(f"{GRPO_FILE}:grpo_train_epoch", "policy_objective",
        _loss("cispo", epsilon_high=5.0, beta=0.1), label="cispo loss",
        block=("kl_div", "policy_loss", ("policy_loss",)),
        choices=_LOSS + ("args: loss_type 'cispo', epsilon_high 5.0, beta 0.1 (its defaults)",),
        conventions=dict(loss="cispo"), audit=_PER_SEQUENCE, known=(_PADDING,)),
    Row(f"{GRPO_FILE}:grpo_train_epoch", "policy_objective",
        _loss("grpo", epsilon=0.2, beta=0.1), label="grpo loss",
        block=("kl_div", "policy_loss", ("policy_loss",)),
        choices=_LOSS + ("args: loss_type 'grpo', epsilon 0.2, beta 0.1",),
        conventions=dict(loss="ppo", agg="seq-mean-token-mean", empty_rows="include",
                         beta=0.1, kl_kind="k3", clip_low=0.2, clip_high=0.2),
        audit=dict(_PER_SEQUENCE, accumulation="none"), known=(_PADDING,)),
) + tuple(
    Row(f"{PPO_FILE}:ppo_train_epoch", "gae", _gae(gamma, lam), label=label,
        block=("gen_len", "returns", ("advantages", "returns")),
        choices=("the block from gen_len = ... to returns = ... (the loop has no mask)",
                 "values and rewards multiplied by the mask, as the statements before the "
                 "block build old_resp_values and token_rewards",
                 f"γ = {gamma}, λ = {lam}" + note),
        conventions=dict(gamma=gamma, lam=lam))
    for gamma, lam, label, note in ((GAMMA, LAM, "GAE", ""),
                                    (1.0, LAM, "GAE, γ 1", " (train_ppo.py's defaults)"))
) + (
    Row(f"{PPO_FILE}:ppo_train_epoch", "whiten", _whiten, label="whitening",
        block=("adv_mean", "advantages", ("advantages",)),
        choices=("the block from adv_mean = ... to advantages = ...",
                 "resp_policy_mask = mask as float")),
)

TRAINER = Trainer(
    name="minimind", package="trainer", dist="minimind", profile="minimind", pinned="d65ef2c",
    modules=(), rows=ROWS, inventory=(), installable=False,
    notes=("MiniMind's math is inline: the rows are statement blocks of its training loops. "
           "The PPO actor and critic losses, clip fraction and approx-KL (a mini-batch loop over "
           "shuffled indices in ppo_train_epoch) are not reached",),
)
