"""ROLL's report card (alibaba/ROLL, a checkout: `--path`): roll/utils/functionals.py.

Facts read at commit 8eb27cc2:
- the token tensors are [B, L − 1] over prompt, response and right padding, with the response
  mask `response_mask[:, 1:]` (0 at prompt and padding); the policy's log-probs are multiplied
  by that mask, the critic's values are not (base_worker.py);
- `agg_loss(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens, global_valid_samples,
  weights)` follows verl's modes, with the call's counts by default: every row, empty ones
  included, counts toward the sequence mean;
- `compute_gae_advantage_return(token_level_rewards, values, gamma, lambd)` takes no mask: it
  runs over the whole row, and `compute_advantage` passes it the critic's raw values
  (functionals.py:1164-1166: it stores values * mask, but calls GAE with values);
- `compute_approx_kl(log_probs, log_probs_base, action_mask, kl_penalty)`: 'kl' (k1), 'abs',
  'mse' (k2), 'k3' (clamped to ±10 after the exp), times the mask;
- `reward_norm(rewards, n_sample, norm_mean_type, norm_std_type)`: GRPO's group statistics
  over consecutive blocks of n_sample, torch.std (Bessel) and 1e-6 added to the std;
- `masked_whiten`: verl's (Bessel variance, 1e-8 inside the rsqrt);
- `import roll.utils.functionals` prints and opens a log file under ROLL_LOG_DIR (default
  ./output/logs): the card sets ROLL_LOG_DIR to a temporary directory.
"""
from .card import Row, Trainer, zero_padding

F = "roll.utils.functionals"
AGENTIC = "roll.pipeline.agentic.utils"
PG = "roll.pipeline.rlvr.actor_pg_worker"
BASE = "roll.pipeline.base_worker"


def _agg(mode):
    def make(fn):
        def adapter(loss, mask):
            return fn(loss_mat=loss, loss_mask=mask.to(loss.dtype), loss_agg_mode=mode)
        return adapter
    return make


def _kl(kind):
    def make(fn):
        def adapter(logp, ref_logp, mask):
            return fn(logp, ref_logp, action_mask=mask.to(logp.dtype), kl_penalty=kind)
        return adapter
    return make


def _whiten(fn):
    def adapter(x, mask):
        return fn(x, mask.to(x.dtype))
    return adapter


def _gae(gamma, lam):
    def make(fn):
        def adapter(rewards, values, mask):
            return fn(token_level_rewards=rewards * mask, values=values, gamma=gamma,
                      lambd=lam)
        return adapter
    return make


def _returns(gamma):
    def make(fn):
        def adapter(rewards, mask):
            advantages, _ = fn(token_level_rewards=zero_padding(mask, rewards), gamma=gamma,
                               lambd=1.0)
            return zero_padding(mask, advantages)
        return adapter
    return make


def _grpo(fn):
    def adapter(rewards, group_size):
        return fn(rewards, n_sample=int(group_size), norm_mean_type="group",
                  norm_std_type="group")
    return adapter


_CALLS = ("judged on whole batches: the counts are the call's (the strategy passes the "
          "step's global counts; the modes' forms are what is judged)",)
ROWS = tuple(
    Row(f"{F}:agg_loss", "aggregate", _agg(mode), label=mode,
        choices=("the mask as the loss's dtype",) + _CALLS,
        conventions=dict(mode=agg, norm=norm, empty_rows=empty),
        audit=dict(accumulation="none"), params=("loss_mat", "loss_mask", "loss_agg_mode"))
    for mode, agg, norm, empty in (
        ("token-mean", "token-mean", None, "exclude"),
        ("seq-mean-token-mean", "seq-mean-token-mean", None, "include"),
        ("seq-mean-token-sum", "seq-mean-token-sum", None, "include"),
        ("seq-mean-token-sum-norm", "seq-mean-token-sum-norm", None, "include"))
) + (
    Row(f"{F}:masked_whiten", "whiten", _whiten, choices=("the mask as the values' dtype",),
        conventions=dict(ddof=1, eps=1e-8, eps_mode="var", shift_mean=True),
        params=("values", "mask")),
) + tuple(
    Row(f"{F}:compute_approx_kl", "kl_penalty", _kl(kind), label=kind,
        choices=("action_mask as the log-probs' dtype; read at the valid tokens",),
        conventions=dict(kind=ref_kind, clamp=clamp),
        params=("log_probs", "log_probs_base", "action_mask", "kl_penalty"))
    for kind, ref_kind, clamp in (("kl", "k1", None), ("abs", "abs", None),
                                  ("mse", "k2", None), ("k3", "k3", (None, 10.0)))
) + tuple(
    Row(f"{F}:compute_gae_advantage_return", "gae", _gae(gamma, lam), label=label,
        choices=("as compute_advantage calls it: the rewards masked (the reward sits on the "
                 "last response token), the critic's values as they are, padding included "
                 f"(functionals.py:1164-1166); γ {gamma}, λ {lam}" + note,),
        conventions=dict(gamma=gamma, lam=lam), audit=dict(domain=("right_padded",)),
        params=("token_level_rewards", "values", "gamma", "lambd"))
    for gamma, lam, label, note in ((1.0, 0.95, "γ 1, λ 0.95", " (ROLL's defaults)"),
                                    (0.99, 0.95, "γ 0.99, λ 0.95", ""))
) + tuple(
    Row(f"{F}:compute_reinforce_return", "discounted_returns", _returns(gamma), label=label,
        choices=("as compute_advantage calls it for 'reinforce', 'grpo', 'gigpo' and "
                 "'step_reinforce' (functionals.py:1168-1171): token_level_rewards multiplied "
                 "by response_mask, so 0 at padding; lambd unused; the returns read at the "
                 f"valid tokens; γ {gamma}" + note,),
        conventions=dict(gamma=gamma), audit=dict(domain=("right_padded",)),
        params=("token_level_rewards", "gamma", "lambd"))
    for gamma, label, note in ((1.0, "γ 1", " (ROLL's default)"), (0.99, "γ 0.99", ""))
) + (
    Row(f"{F}:reward_norm", "group_advantages", _grpo,
        choices=("norm_mean_type and norm_std_type 'group' (reward_postprocess forces them for "
                 "GRPO), n_sample the group size; groups are consecutive rows",),
        conventions=dict(ddof=1, eps=1e-6, scale="group", baseline="mean"),
        audit=dict(domain=("groups_of_two",)),
        params=("response_level_rewards", "n_sample", "norm_mean_type", "norm_std_type")),
)

TRAINER = Trainer(
    name="roll", package="roll", dist="roll", profile="verl", pinned="commit 8eb27cc2",
    installable=False, modules=(F,), rows=ROWS,
    environ=(("ROLL_LOG_DIR", "{tmp}"),),
    inventory=((F, r"agg_loss|masked_whiten|compute_approx_kl|compute_gae_advantage_return|"
                   r"reward_norm|compute_reinforce_return|masked_normalize|"
                   r"response_level_masked_whiten|group_reward_norm|masked_mean|masked_sum|"
                   r"masked_var|compute_clip_fraction|entropy_from_logits|compute_token_reward|"
                   r"apply_kl_penalty|compute_advantage|reward_postprocess|difficulty_mask|"
                   r"get_sample_level_mask"),
               # read from the files only (not loaded): the agentic pipeline's estimators and
               # the workers' losses, whose modules import the distributed stack
               (AGENTIC, r"compute_discounted_returns|agentic_reward_norm|"
                         r"compute_agentic_reinforce_return|agentic_compute_advantage|"
                         r"compute_segment_masked_mean"),
               (PG, r"ActorPGWorker\.(loss_func|_compute_\w+_loss)"),
               (BASE, r"(ActorWorker|CriticWorker)\.loss_func")),
    not_run=(("masked_mean", "reached through agg_loss and masked_whiten, which rows run"),
             ("masked_sum", "reached through agg_loss, which rows run"),
             ("masked_var", "reached through masked_whiten, which a row runs"),
             ("compute_clip_fraction", "a logged metric (the fraction of clipped values)"),
             ("entropy_from_logits", "the entropy of the full logits, computed by the "
                                     "strategies (strategy.py): no row yet"),
             ("compute_token_reward", "token_level_rewards − β·compute_approx_kl (a row) with "
                                      "an adaptive β, on a DataProto: no adapter yet"),
             ("apply_kl_penalty", "the KL in the reward on a DataProto, as "
                                  "compute_token_reward: no adapter yet"),
             ("compute_advantage", "dispatches over a DataProto to compute_gae_advantage_return "
                                   "and compute_reinforce_return (rows), with optional "
                                   "whitening and clipping"),
             ("reward_postprocess", "reward_norm (a row) and reward clipping on a DataProto"),
             ("difficulty_mask", "a 0/1 sample filter on the group's mean score, not a loss or "
                                 "an estimator"),
             ("get_sample_level_mask", "0/1 sample filters, not a loss or an estimator"),
             ("compute_discounted_returns", "the agentic pipeline's step-level returns over a "
                                            "DataProto's trajectories: no adapter yet"),
             ("agentic_reward_norm", "the agentic pipeline's score normalisation grouped by a "
                                     "configured key, on a DataProto: no adapter yet"),
             ("compute_agentic_reinforce_return", "a return discounted per segment of the mask "
                                                  "(each segment's tokens share its value): no "
                                                  "reference yet"),
             ("agentic_compute_advantage", "the agentic pipeline's dispatch over a DataProto"),
             ("compute_segment_masked_mean", "a per-segment masked mean (a helper)"),
             ("ActorPGWorker.loss_func", "the RLVR actor's loss (PPO, vanilla PG, TIS, TOPR, "
                                         "CISPO, Kimi k1.5 and the KL loss), a worker method "
                                         "whose module imports the distributed stack: no row "
                                         "yet"),
             ("ActorPGWorker._compute_ppo_loss", "reached through ActorPGWorker.loss_func"),
             ("ActorPGWorker._compute_vanilla_pg_loss", "reached through ActorPGWorker.loss_func"),
             ("ActorPGWorker._compute_tis_loss", "reached through ActorPGWorker.loss_func"),
             ("ActorPGWorker._compute_topr_loss", "reached through ActorPGWorker.loss_func"),
             ("ActorPGWorker._compute_cispo_loss", "reached through ActorPGWorker.loss_func"),
             ("ActorPGWorker._compute_kimi15_loss", "reached through ActorPGWorker.loss_func"),
             ("ActorWorker.loss_func", "the base actor's PPO loss, a worker method whose module "
                                       "imports ray: no row yet"),
             ("CriticWorker.loss_func", "the critic's value loss, a worker method whose module "
                                        "imports ray: no row yet"),
             ("masked_normalize", "not called anywhere in roll/ at this commit"),
             ("response_level_masked_whiten", "not called anywhere in roll/ at this commit"),
             ("group_reward_norm", "the agentic pipeline's copy of reward_norm's group mode")),
    runs=("agg_loss in its four modes", "masked_whiten", "compute_approx_kl kl, abs, mse, k3",
          "compute_gae_advantage_return as compute_advantage calls it (γ 1 and 0.99, λ 0.95)",
          "compute_reinforce_return (GRPO's and REINFORCE's returns) at γ 1 and 0.99",
          "reward_norm with group mean and std (GRPO)"),
    does_not_run=("ActorWorker.loss_func (the PPO clip, the KL loss, the train/infer "
                  "correction: the worker imports the distributed stack)",
                  "train_infer_corrections.py", "compute_advantage's OPD and whitening "
                  "branches", "reward_norm's batch and running statistics"),
    notes=("agg_loss 'token-mean' sums loss_mat without the mask (functionals.py:256: "
           "(loss_mat * weights).sum() / batch_num_tokens). Where the loss is non-zero at a "
           "masked position it enters the loss: the train/infer correction filters tokens by "
           "multiplying response_mask and final_response_mask by its filter mask "
           "(actor_worker.py), but their policy losses stay in the token-mean numerator, so "
           "with loss_agg_mode 'token-mean' (the default is seq-mean-token-mean) the filter "
           "does nothing to the policy gradient. A defect to file upstream",
           "agg_loss 'seq-mean-token-sum-norm' divides the sum over sequences by T = "
           "loss_mask.shape[-1] (functionals.py:274), not also by the number of sequences: "
           "the form verl had before 0.9, which the reference's mode of that name keeps; verl "
           "0.9's divides the per-sequence mean",
           "compute_gae_advantage_return has no mask and compute_advantage passes it the "
           "critic's raw values (functionals.py:1164-1166), so the last response token "
           "bootstraps from V at the first padding position, the critic's output after EOS, "
           "and the padding's TD errors flow back into the response: every right-padded row "
           "gets the wrong advantage and return. A defect to file upstream",
           "judged under the verl profile, whose functions ROLL's follow, with every "
           "convention the rows need set explicitly"),
)
