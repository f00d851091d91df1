"""Trainer profiles: the conventions each trainer uses, per reference function.

Every value comes from ../shared/reference/trainer_conventions.md (the section is named beside
it), which was read from these snapshots: verl b178a3cd5, TRL f2cd57710, OpenRLHF 3c3be623,
MiniMind d65ef2c (HEAD, after the 101d7df rewrite), CleanRL fe8d8a03. A profile sets the
*reference's* conventions; the user's own hyper-parameters stay bound inside their adapter.
"""
from typing import Dict

PROFILES: Dict[str, Dict[str, object]] = {
    "verl": {
        "_about": "volcengine/verl: unbiased std + 1e-6, dual clip c = 3 always on, log-ratio "
                  "clamp ±20, k3 KL clamped (20, 10), token-mean aggregation",
        "gae": dict(gamma=1.0, lam=1.0),                                      # (c) verl defaults
        "discounted_returns": dict(gamma=1.0),                                # §2.4
        "whiten": dict(ddof=1, eps=1e-8, eps_mode="var", shift_mean=True),    # §1 masked_whiten
        "group_advantages": dict(ddof=1, eps=1e-6, scale="group", baseline="mean"),  # §2.2 grpo
        "ppo_clip_loss": dict(clip_low=0.2, clip_high=0.2, clip_c=3.0,       # §3.1 vanilla
                              log_ratio_clamp=20.0),
        "cispo_loss": dict(bound="relative", clip_low=0.2, clip_high=0.2,    # §3.4
                           log_ratio_clamp=20.0),
        "gspo_loss": dict(form="token", clip_low=0.2, clip_high=0.2, log_ratio_max=10.0),  # §3.2
        "value_loss": dict(clip=0.5),                                         # §6 cliprange_value
        "kl_penalty": dict(kind="k3", clamp=(20.0, 10.0)),                    # §5.1 low_var_kl
        "aggregate": dict(mode="token-mean", empty_rows="exclude"),           # §4
        "policy_objective": dict(loss="ppo", agg="token-mean", clip_low=0.2, clip_high=0.2,
                                 clip_c=3.0, log_ratio_clamp=20.0, kl_kind="k3",
                                 kl_clamp=(20.0, 10.0)),
        "approx_kl": dict(kind="k1"),                                         # §9 ppo_kl
        "clip_fraction": dict(definition="loss", clip_low=0.2, clip_high=0.2),  # §3.1 l² > l¹
    },
    "trl": {
        "_about": "huggingface/trl: unbiased std + 1e-4, symmetric ε = 0.2 (δ off), CISPO "
                  "absolute cap 5.0, k3 unclamped, token-mean (loss_type='dapo')",
        "gae": dict(gamma=1.0, lam=0.95),                                     # (c) PPO config
        "whiten": dict(ddof=1, eps=1e-8, eps_mode="var", shift_mean=True),    # §1
        "group_advantages": dict(ddof=1, eps=1e-4, scale="group", baseline="mean"),  # §2.2
        "ppo_clip_loss": dict(clip_low=0.2, clip_high=None, delta=None),      # §3.1 GRPO
        "cispo_loss": dict(bound="absolute", clip_high=5.0),                  # §3.4
        "gspo_loss": dict(form="sequence", clip_low=3e-4, clip_high=4e-4),    # §3.2
        "value_loss": dict(clip=0.2),                                         # §6
        "kl_penalty": dict(kind="k3", clamp=None),                            # §5.1
        "aggregate": dict(mode="token-mean", empty_rows="exclude"),           # §4 dapo
        "policy_objective": dict(loss="ppo", agg="token-mean", clip_low=0.2, kl_kind="k3"),
        "approx_kl": dict(kind="k2"),                                         # §9 PPO
        "clip_fraction": dict(definition="sign", clip_low=0.2),               # §3.1 sign-aware
    },
    "openrlhf": {
        "_about": "OpenRLHF: unbiased group std + 1e-9, biased whitening with max(var, 1e-8), "
                  "ε = 0.2 with log-ratio clamp ±20, KL k1 clamped to ±10, token-level loss",
        "gae": dict(gamma=1.0, lam=1.0),                                      # (c)
        "discounted_returns": dict(gamma=1.0),                                # §2.4
        "whiten": dict(ddof=0, eps=1e-8, eps_mode="clamp", shift_mean=True),  # §1
        "group_advantages": dict(ddof=1, eps=1e-9, scale="group", baseline="mean"),  # §2.2
        "ppo_clip_loss": dict(clip_low=0.2, clip_high=0.2, clip_c=None,      # §3.1
                              log_ratio_clamp=20.0),
        "gspo_loss": dict(form="sequence", clip_low=0.2, clip_high=0.2),      # §3.2
        "value_loss": dict(clip=0.5),                                         # §6 CLI
        "kl_penalty": dict(kind="k1", clamp=(None, 10.0)),                    # §5.1
        "aggregate": dict(mode="token-mean", empty_rows="exclude"),           # §4
        "policy_objective": dict(loss="ppo", agg="token-mean", clip_low=0.2, clip_high=0.2,
                                 log_ratio_clamp=20.0, kl_kind="k1", kl_clamp=(None, 10.0)),
        "approx_kl": dict(kind="k1"),                                         # §9
        "clip_fraction": dict(definition="loss", clip_low=0.2, clip_high=0.2),  # §3.1 s₂ < s₁
    },
    "minimind": {
        "_about": "MiniMind HEAD: biased group std + 1e-4, CISPO (absolute cap 5.0) with "
                  "β = 0.1 k3, per-sequence token mean over all rows",
        "gae": dict(gamma=1.0, lam=0.95),                                     # (c) PPO
        "whiten": dict(ddof=0, eps=1e-8, eps_mode="var", shift_mean=True),    # §1
        "group_advantages": dict(ddof=0, eps=1e-4, scale="group", baseline="mean"),  # §2.2
        "ppo_clip_loss": dict(clip_low=0.2),                                  # §3.1
        "cispo_loss": dict(bound="absolute", clip_high=5.0),                  # §3.4
        "value_loss": dict(clip=0.2),                                         # §6
        "kl_penalty": dict(kind="k3", clamp=None),                            # §5.1
        "aggregate": dict(mode="seq-mean-token-mean", empty_rows="include"),  # §4 GRPO
        "policy_objective": dict(loss="cispo", agg="seq-mean-token-mean", empty_rows="include",
                                 beta=0.1, kl_kind="k3", clip_high=5.0),      # (c) GRPO
        "approx_kl": dict(kind="k2"),                                         # §9
        "clip_fraction": dict(definition="ratio", clip_low=0.2),              # §9 |r − 1| > ε
    },
    "cleanrl": {
        "_about": "CleanRL ppo.py: GAE γ = 0.99, λ = 0.95, per-minibatch whitening "
                  "(A − mean)/(std_unbiased + 1e-8), ε = 0.2 for policy and value, plain mean",
        "gae": dict(gamma=0.99, lam=0.95),                                    # (c)
        "whiten": dict(ddof=1, eps=1e-8, eps_mode="std", shift_mean=True),    # §1
        "ppo_clip_loss": dict(clip_low=0.2),                                  # §3.1
        "value_loss": dict(clip=0.2),                                         # §6
        "aggregate": dict(mode="token-mean", empty_rows="exclude"),           # §4 .mean()
        "policy_objective": dict(loss="ppo", agg="token-mean", clip_low=0.2),
        "approx_kl": dict(kind="k3"),                                         # §9
        "clip_fraction": dict(definition="ratio", clip_low=0.2),              # §9
    },
}


class ProfileError(ValueError):
    pass


def conventions(profile: str, ref: str) -> Dict[str, object]:
    """The reference conventions `profile` sets for `ref` (a copy)."""
    if profile not in PROFILES:
        raise ProfileError(f"profile is {profile!r}; expected one of {', '.join(PROFILES)}")
    p = PROFILES[profile]
    if ref not in p:
        has = ", ".join(k for k in p if not k.startswith("_"))
        raise ProfileError(f"profile {profile!r} defines no conventions for {ref!r} (that "
                           f"trainer has no such function); it defines: {has}")
    return dict(p[ref])


def describe() -> str:
    lines = []
    for name, p in PROFILES.items():
        lines.append(f"{name}: {p['_about']}")
        for ref, conv in p.items():
            if ref.startswith("_"):
                continue
            lines.append(f"    {ref:<20} " + ", ".join(f"{k}={v!r}" for k, v in conv.items()))
    return "\n".join(lines)
