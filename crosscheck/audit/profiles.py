"""Trainer profiles: the conventions each trainer uses, per reference function.

Every value was read from the trainer's own source at the commit named in its profile; the file
and function it comes from is stated beside it (`Rule.source`), and docs/conventions.md prints
them all (`python -m crosscheck audit --list-profiles`). A profile sets the *reference's*
conventions; the user's own hyper-parameters stay bound inside their adapter.
"""
import dataclasses
from typing import Dict, Mapping


@dataclasses.dataclass(frozen=True)
class Rule:
    """A trainer's conventions for one reference function, and where they come from."""
    conventions: Mapping[str, object]
    source: str                               # file and function (or config) in the trainer


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    about: str                                # its conventions in one sentence
    snapshot: str                             # the repository and commit the sources were read at
    rules: Mapping[str, Rule]


def _rule(source, **conventions):
    return Rule(conventions, source)


PROFILES: Dict[str, Profile] = {p.name: p for p in (
    Profile(
        "verl", "unbiased group std + 1e-6, dual clip c = 3 always on, log-ratio clamp ±20, "
        "k3 KL clamped (20, 10), token-mean aggregation",
        "volcengine/verl b178a3cd5", {
            "gae": _rule("verl/trainer/config/algorithm.py: gamma, lam", gamma=1.0, lam=1.0),
            "discounted_returns": _rule(
                "verl/trainer/ppo/core_algos.py::compute_reinforce_plus_plus_outcome_advantage",
                gamma=1.0),
            "whiten": _rule("verl/utils/torch_functional.py::masked_whiten", ddof=1, eps=1e-8,
                            eps_mode="var", shift_mean=True),
            "group_advantages": _rule(
                "verl/trainer/ppo/core_algos.py::compute_grpo_outcome_advantage", ddof=1, eps=1e-6,
                scale="group", baseline="mean"),
            "ppo_clip_loss": _rule("verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla",
                                   clip_low=0.2, clip_high=0.2, clip_c=3.0,
                                   log_ratio_clamp=20.0),
            "cispo_loss": _rule("verl/trainer/ppo/core_algos.py::compute_policy_loss_cispo",
                                bound="relative", clip_low=0.2, clip_high=0.2,
                                log_ratio_clamp=20.0),
            "gspo_loss": _rule("verl/trainer/ppo/core_algos.py::compute_policy_loss_gspo",
                               form="token", clip_low=0.2, clip_high=0.2, log_ratio_max=10.0),
            "value_loss": _rule("verl/trainer/ppo/core_algos.py::compute_value_loss; "
                                "verl/trainer/config/critic/critic.yaml: cliprange_value",
                                clip=0.5),
            "kl_penalty": _rule("verl/trainer/ppo/core_algos.py::kl_penalty_forward (low_var_kl)",
                                kind="k3", clamp=(20.0, 10.0)),
            "aggregate": _rule("verl/trainer/ppo/core_algos.py::agg_loss", mode="token-mean",
                               empty_rows="exclude"),
            "policy_objective": _rule(
                "verl/workers/actor/dp_actor.py::update_policy with compute_policy_loss_vanilla, "
                "agg_loss and kl_penalty", loss="ppo", agg="token-mean", clip_low=0.2,
                clip_high=0.2, clip_c=3.0, log_ratio_clamp=20.0, kl_kind="k3",
                kl_clamp=(20.0, 10.0)),
            "approx_kl": _rule(
                "verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla: ppo_kl", kind="k1"),
            "clip_fraction": _rule(
                "verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla: pg_clipfrac",
                definition="loss", clip_low=0.2, clip_high=0.2),
        }),
    Profile(
        "trl", "unbiased group std + 1e-4, symmetric ε = 0.2 (δ off), CISPO absolute cap 5.0, "
        "k3 unclamped, token-mean (loss_type='dapo')",
        "huggingface/trl f2cd57710", {
            "gae": _rule("trl/experimental/ppo/ppo_config.py: gamma, lam", gamma=1.0, lam=0.95),
            "whiten": _rule("trl/experimental/ppo/ppo_trainer.py::masked_whiten", ddof=1,
                            eps=1e-8, eps_mode="var", shift_mean=True),
            "group_advantages": _rule("trl/trainer/grpo_trainer.py (scale_rewards='group', "
                                      "nanstd)", ddof=1, eps=1e-4, scale="group",
                                      baseline="mean"),
            "ppo_clip_loss": _rule("trl/trainer/grpo_trainer.py::_compute_loss", clip_low=0.2,
                                   clip_high=None, delta=None),
            "cispo_loss": _rule("trl/trainer/grpo_trainer.py::_compute_loss "
                                "(loss_type='cispo', epsilon_high=5.0)", bound="absolute",
                                clip_high=5.0),
            "gspo_loss": _rule("trl/trainer/grpo_trainer.py::_compute_loss "
                               "(importance_sampling_level='sequence')", form="sequence",
                               clip_low=3e-4, clip_high=4e-4),
            "value_loss": _rule("trl/experimental/ppo/ppo_config.py: cliprange_value",
                                clip=0.2),
            "kl_penalty": _rule("trl/trainer/grpo_trainer.py::_compute_loss: per_token_kl",
                                kind="k3", clamp=None),
            "aggregate": _rule("trl/trainer/grpo_trainer.py::_compute_loss (loss_type='dapo')",
                               mode="token-mean", empty_rows="exclude"),
            "policy_objective": _rule("trl/trainer/grpo_trainer.py::_compute_loss", loss="ppo",
                                      agg="token-mean", clip_low=0.2, kl_kind="k3"),
            "approx_kl": _rule("trl/experimental/ppo/ppo_trainer.py: approxkl", kind="k2"),
            "clip_fraction": _rule("trl/trainer/grpo_trainer.py::_compute_loss: clip_ratio "
                                   "low/high", definition="sign", clip_low=0.2),
        }),
    Profile(
        "openrlhf", "unbiased group std + 1e-9, biased whitening with max(var, 1e-8), ε = 0.2 "
        "with log-ratio clamp ±20, KL k1 clamped to ±10, token-level loss",
        "OpenRLHF/OpenRLHF 3c3be623", {
            "gae": _rule("openrlhf/cli/train_ppo_ray.py: gamma, lambd", gamma=1.0, lam=1.0),
            "discounted_returns": _rule(
                "openrlhf/trainer/ppo_utils/experience_maker.py::get_cumulative_returns",
                gamma=1.0),
            "whiten": _rule("openrlhf/trainer/ppo_utils/experience_maker.py (advantage "
                            "normalisation)", ddof=0, eps=1e-8, eps_mode="clamp",
                            shift_mean=True),
            "group_advantages": _rule("openrlhf/trainer/ppo_utils/experience_maker.py "
                                      "(group_norm)", ddof=1, eps=1e-9, scale="group",
                                      baseline="mean"),
            "ppo_clip_loss": _rule("openrlhf/models/loss.py::PolicyLoss (ppo)", clip_low=0.2,
                                   clip_high=0.2, clip_c=None, log_ratio_clamp=20.0),
            "gspo_loss": _rule("openrlhf/models/loss.py::PolicyLoss (gspo)", form="sequence",
                               clip_low=0.2, clip_high=0.2),
            "value_loss": _rule("openrlhf/cli/train_ppo_ray.py: critic.value_clip", clip=0.5),
            "kl_penalty": _rule("openrlhf/models/utils.py::compute_approx_kl", kind="k1",
                                clamp=(None, 10.0)),
            "aggregate": _rule("openrlhf/utils/loss_utils.py (token_level_loss=True)",
                               mode="token-mean", empty_rows="exclude"),
            "policy_objective": _rule("openrlhf/models/loss.py::PolicyLoss with "
                                      "compute_approx_kl", loss="ppo", agg="token-mean",
                                      clip_low=0.2, clip_high=0.2, log_ratio_clamp=20.0,
                                      kl_kind="k1", kl_clamp=(None, 10.0)),
            "approx_kl": _rule("openrlhf/models/loss.py::PolicyLoss: ppo_kl", kind="k1"),
            "clip_fraction": _rule("openrlhf/models/loss.py::PolicyLoss: clip_ratio",
                                   definition="loss", clip_low=0.2, clip_high=0.2),
        }),
    Profile(
        "minimind", "biased group std + 1e-4, CISPO (absolute cap 5.0) with β = 0.1 k3, "
        "per-sequence token mean over all rows",
        "jingyaogong/minimind d65ef2c", {
            "gae": _rule("trainer/train_ppo.py: gamma, lam", gamma=1.0, lam=0.95),
            "whiten": _rule("trainer/train_ppo.py (advantage whitening)", ddof=0, eps=1e-8,
                            eps_mode="var", shift_mean=True),
            "group_advantages": _rule("trainer/train_grpo.py (group advantages)", ddof=0,
                                      eps=1e-4, scale="group", baseline="mean"),
            "ppo_clip_loss": _rule("trainer/train_ppo.py: clip_epsilon", clip_low=0.2),
            "cispo_loss": _rule("trainer/train_grpo.py: epsilon_high", bound="absolute",
                                clip_high=5.0),
            "value_loss": _rule("trainer/train_ppo.py: cliprange_value", clip=0.2),
            "kl_penalty": _rule("trainer/train_grpo.py and train_ppo.py (k3)", kind="k3",
                                clamp=None),
            "aggregate": _rule("trainer/train_grpo.py (per-sequence mean, then batch mean)",
                               mode="seq-mean-token-mean", empty_rows="include"),
            "policy_objective": _rule("trainer/train_grpo.py (loss_type='cispo', beta=0.1)",
                                      loss="cispo", agg="seq-mean-token-mean",
                                      empty_rows="include", beta=0.1, kl_kind="k3",
                                      clip_high=5.0),
            "approx_kl": _rule("trainer/train_ppo.py: approx_kl (k2)", kind="k2"),
            "clip_fraction": _rule("trainer/train_ppo.py: clipfrac", definition="ratio",
                                   clip_low=0.2),
        }),
    Profile(
        "cleanrl", "GAE γ = 0.99, λ = 0.95, per-minibatch whitening (A − mean)/(std_unbiased "
        "+ 1e-8), ε = 0.2 for policy and value, plain mean",
        "vwxyzjn/cleanrl fe8d8a03", {
            "gae": _rule("cleanrl/ppo.py: gamma, gae_lambda", gamma=0.99, lam=0.95),
            "whiten": _rule("cleanrl/ppo.py: norm_adv", ddof=1, eps=1e-8, eps_mode="std",
                            shift_mean=True),
            "ppo_clip_loss": _rule("cleanrl/ppo.py: clip_coef", clip_low=0.2),
            "value_loss": _rule("cleanrl/ppo.py: clip_vloss, clip_coef", clip=0.2),
            "aggregate": _rule("cleanrl/ppo.py: .mean()", mode="token-mean",
                               empty_rows="exclude"),
            "policy_objective": _rule("cleanrl/ppo.py: pg_loss", loss="ppo", agg="token-mean",
                                      clip_low=0.2),
            "approx_kl": _rule("cleanrl/ppo.py: approx_kl", kind="k3"),
            "clip_fraction": _rule("cleanrl/ppo.py: clipfracs", definition="ratio",
                                   clip_low=0.2),
        }),
)}


class ProfileError(ValueError):
    pass


def conventions(profile: str, ref: str) -> Dict[str, object]:
    """The reference conventions `profile` sets for `ref` (a copy)."""
    if profile not in PROFILES:
        raise ProfileError(f"profile is {profile!r}; expected one of {', '.join(PROFILES)}")
    p = PROFILES[profile]
    if ref not in p.rules:
        raise ProfileError(f"profile {profile!r} defines no conventions for {ref!r} (that "
                           f"trainer has no such function); it defines: {', '.join(p.rules)}")
    return dict(p.rules[ref].conventions)


def describe() -> str:
    """Every profile, the conventions it sets, and the trainer code each comes from."""
    lines = []
    for p in PROFILES.values():
        lines.append(f"{p.name} ({p.snapshot}): {p.about}")
        for ref, rule in p.rules.items():
            lines.append(f"    {ref:<20} " + ", ".join(f"{k}={v!r}"
                                                      for k, v in rule.conventions.items()))
            lines.append(f"    {'':<20} from {rule.source}")
    return "\n".join(lines)
