"""ref_numpy: the NumPy reference of the RL math, with hand-derived VJPs (`X_vjp`).

Pure NumPy, float64. Every function `X` has `X_vjp(g, *args, **kwargs)` returning the gradient of
⟨g, X(...)⟩ wrt X's differentiable inputs, derived by hand in its docstring.
"""
from .advantages import (discounted_returns, discounted_returns_vjp, gae, gae_vjp,
                         group_advantages, group_advantages_vjp, whiten, whiten_vjp)
from .entropy import entropy, entropy_vjp
from .fipo import fipo_influence_weights
from .estimators import kl_estimator_gradient, kl_estimator_moments, kl_estimator_moments_vjp
from .kl import (approx_kl, approx_kl_vjp, kl_penalty, kl_penalty_vjp, kl_rewards,
                 kl_rewards_vjp)
from .objective import (policy_objective, policy_objective_vjp, ratio_kl_penalty,
                        ratio_kl_penalty_vjp, shaped_advantages, shaped_advantages_vjp)
from .policy_losses import (cispo_loss, cispo_loss_vjp, clip_fraction, gspo_loss, gspo_loss_vjp,
                            ppo_clip_loss, ppo_clip_loss_vjp, sapo_loss, sapo_loss_vjp,
                            value_loss, value_loss_vjp, vespo_loss, vespo_loss_vjp)
from .outcome import (gpg_advantages, gpg_advantages_vjp, opo_advantages, opo_advantages_vjp,
                      optimal_token_baseline_advantages,
                      optimal_token_baseline_advantages_vjp,
                      passk_advantages, passk_advantages_vjp, remax_advantages,
                      remax_advantages_vjp, whitened_group_advantages,
                      whitened_group_advantages_vjp)
from .pg_losses import (decoupled_ppo_loss, decoupled_ppo_loss_vjp, dppo_loss, dppo_loss_vjp,
                        gmpo_loss, gmpo_loss_vjp, kl_cov_loss, kl_cov_loss_vjp, m2po_mask,
                        opsm_mask, reinforce_loss, reinforce_loss_vjp, rollout_is_weights,
                        tv_filter_mask)
from .reduce import aggregate, aggregate_vjp

__all__ = [
    "gae", "gae_vjp",
    "whiten", "whiten_vjp",
    "group_advantages", "group_advantages_vjp",
    "ppo_clip_loss", "ppo_clip_loss_vjp",
    "cispo_loss", "cispo_loss_vjp",
    "value_loss", "value_loss_vjp",
    "kl_penalty", "kl_penalty_vjp",
    "aggregate", "aggregate_vjp",
    "policy_objective", "policy_objective_vjp",
    "shaped_advantages", "shaped_advantages_vjp",
    "kl_estimator_moments", "kl_estimator_moments_vjp",
    "kl_estimator_gradient",   # its value is a gradient: checked against autograd and FD, no VJP
    "gspo_loss", "gspo_loss_vjp",
    "discounted_returns", "discounted_returns_vjp",
    "approx_kl", "approx_kl_vjp",
    "clip_fraction",           # a count: not differentiable, no VJP
    "sapo_loss", "sapo_loss_vjp",
    "rollout_is_weights",      # stop-gradient weights: not differentiated, no VJP
    "opsm_mask", "m2po_mask",  # masks: not differentiated, no VJP
    "reinforce_loss", "reinforce_loss_vjp",
    "dppo_loss", "dppo_loss_vjp",
    "decoupled_ppo_loss", "decoupled_ppo_loss_vjp",
    "gmpo_loss", "gmpo_loss_vjp",
    "kl_cov_loss", "kl_cov_loss_vjp",
    "entropy", "entropy_vjp",
    "kl_rewards", "kl_rewards_vjp",
    "opo_advantages", "opo_advantages_vjp",
    "gpg_advantages", "gpg_advantages_vjp",
    "passk_advantages", "passk_advantages_vjp",
    "remax_advantages", "remax_advantages_vjp",
    "whitened_group_advantages", "whitened_group_advantages_vjp",
    "optimal_token_baseline_advantages", "optimal_token_baseline_advantages_vjp",
    "vespo_loss", "vespo_loss_vjp",
    "fipo_influence_weights",  # stop-gradient weights: not differentiated, no VJP
    "ratio_kl_penalty", "ratio_kl_penalty_vjp",
    "tv_filter_mask",          # a mask: not differentiated, no VJP
]
