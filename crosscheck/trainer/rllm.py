"""rLLM's report card (rllm-org/rllm, a checkout: `--path`): the advantage estimators of
rllm/trainer/algorithms/advantage.py and rl_algo.py.

Facts read at commit 9beb6e0f:
- rLLM's own RL math is the per-trajectory scalar advantage, in NumPy; the per-token losses, KL
  and aggregation are verl's (or Tinker's and Fireworks' services), which verl's card covers;
- a registered estimator takes `rewards` (one 1-D array of trajectory rewards per
  TrajectoryGroup: the trajectories of one role across the rollouts of one task) and the
  `AlgorithmConfig`, and returns (advantages, returns) per group;
- `grpo` is `calculate_grpo_advantages_per_group` on each group: (r − mean)/(np.std + 1e-6),
  np.std the population std (ddof 0), or r − mean with norm_adv_by_std_in_grpo off; a group of
  one has mean 0 and std 1;
- `rloo` is `calculate_rloo_advantages_per_group`: n/(n − 1)·(r − mean) = r − the others' mean;
  a group of one keeps its reward;
- groups are whatever TrajectoryGroups the workflow builds: of unequal sizes, and of one (the
  per-group functions handle a group of one explicitly).
"""
from types import SimpleNamespace

import numpy as np
import torch

from .card import Row, Trainer

ADV = "rllm.trainer.algorithms.advantage"
ALGO = "rllm.trainer.algorithms.rl_algo"


def _estimator(**config):
    def make(fn):
        def adapter(rewards, group_ids):
            r = rewards.detach().numpy().astype(np.float64)
            ids = np.asarray(group_ids).reshape(-1)
            members = [np.flatnonzero(ids == g) for g in dict.fromkeys(ids.tolist())]
            advantages, _ = fn([r[m] for m in members], SimpleNamespace(**config))
            out = np.zeros_like(r)
            for m, a in zip(members, advantages):
                out[m] = a
            return torch.as_tensor(out)
        return adapter
    return make


_CHOICES = ("one TrajectoryGroup per group id, its rewards as the 1-D array rLLM builds (groups "
            "of any size, one included: a TrajectoryGroup holds the trajectories of one role "
            "for one task, however many there are); the advantages read back per trajectory",)

ROWS = (
    Row(f"{ADV}:calculate_grpo_advantages", "group_advantages",
        _estimator(norm_adv_by_std_in_grpo=True), label="std-normalised",
        choices=_CHOICES + ("norm_adv_by_std_in_grpo True (the default)",),
        conventions=dict(ddof=0, eps=1e-6, scale="group", baseline="mean", singleton="keep"),
        params=("rewards", "algorithm_config")),
    Row(f"{ADV}:calculate_grpo_advantages", "group_advantages",
        _estimator(norm_adv_by_std_in_grpo=False), label="Dr. GRPO",
        choices=_CHOICES + ("norm_adv_by_std_in_grpo False",),
        conventions=dict(ddof=0, eps=0.0, scale="none", baseline="mean", singleton="keep"),
        params=("rewards", "algorithm_config")),
    Row(f"{ADV}:calculate_rloo_advantages", "group_advantages", _estimator(), label="RLOO",
        choices=_CHOICES,
        conventions=dict(ddof=0, eps=0.0, scale="none", baseline="leave_one_out",
                         singleton="keep"),
        params=("rewards", "algorithm_config")),
)

TRAINER = Trainer(
    name="rllm", package="rllm", dist="rllm", profile="verl", pinned="commit 9beb6e0f",
    installable=False, modules=(ADV, ALGO), rows=ROWS,
    inventory=((ADV, r"calculate_\w+_advantages|collect_reward_and_advantage_from_trajectory_"
                     r"groups"),
               (ALGO, r"calculate_\w+_per_group")),
    not_run=(("calculate_grpo_advantages_per_group",
              "reached through calculate_grpo_advantages, which two rows call"),
             ("calculate_rloo_advantages_per_group",
              "reached through calculate_rloo_advantages, which a row calls"),
             ("calculate_reinforce_advantages", "the reward itself, no baseline"),
             ("calculate_reinforce_plus_plus_baseline_advantages",
              "whitens each trajectory's group-centred reward by the batch's population std "
              "with ε outside it, one value per trajectory: the reference whitens tokens (Bessel, "
              "ε inside the variance)"),
             ("calculate_prpo_advantages", "the batch's mean and population std, groups "
                                           "ignored: no reference takes that"),
             ("collect_reward_and_advantage_from_trajectory_groups",
              "runs the role's estimator and writes its advantages to each step")),
    runs=("grpo with and without the std", "rloo"),
    does_not_run=("reinforce, reinforce_plus_plus_baseline and prpo (see not covered)",
                  "precomputed advantages", "the per-token losses (verl's)"),
    notes=("judged under the verl profile with every convention set explicitly: rLLM's GRPO "
           "divides by the population std (np.std, ddof 0) where verl, TRL and OpenRLHF take "
           "Bessel's: a convention, the same advantages scaled by √((n − 1)/n)",),
)
