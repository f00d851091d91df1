"""ref_torch: an independent torch implementation of the RL math; autograd gives gradients.

Same function names and signatures as ref_numpy (without the *_vjp). Any float dtype and device:
a call computes in its inputs' dtype, on their device.
"""
from .advantages import discounted_returns, gae, group_advantages, whiten
from .entropy import entropy
from .fipo import fipo_influence_weights
from .estimators import kl_estimator_gradient, kl_estimator_moments
from .kl import approx_kl, kl_penalty, kl_rewards
from .objective import policy_objective, ratio_kl_penalty, shaped_advantages
from .policy_losses import (cispo_loss, clip_fraction, gspo_loss, ppo_clip_loss, sapo_loss,
                            value_loss, vespo_loss)
from .outcome import (gpg_advantages, opo_advantages, optimal_token_baseline_advantages,
                      passk_advantages, remax_advantages,
                      whitened_group_advantages)
from .pg_losses import decoupled_ppo_loss, dppo_loss, gmpo_loss, kl_cov_loss, reinforce_loss, rollout_is_weights, opsm_mask, m2po_mask, tv_filter_mask
from .reduce import aggregate

__all__ = [
    "gae",
    "whiten",
    "group_advantages",
    "ppo_clip_loss",
    "cispo_loss",
    "value_loss",
    "kl_penalty",
    "aggregate",
    "policy_objective", "shaped_advantages",
    "kl_estimator_moments",
    "kl_estimator_gradient",
    "gspo_loss",
    "discounted_returns",
    "approx_kl",
    "clip_fraction",
    "sapo_loss",
    "rollout_is_weights",
    "opsm_mask",
    "m2po_mask",
    "reinforce_loss",
    "dppo_loss",
    "decoupled_ppo_loss",
    "gmpo_loss",
    "kl_cov_loss",
    "entropy",
    "kl_rewards",
    "opo_advantages",
    "gpg_advantages",
    "passk_advantages",
    "remax_advantages",
    "whitened_group_advantages",
    "optimal_token_baseline_advantages",
    "vespo_loss",
    "fipo_influence_weights",
    "ratio_kl_penalty",
    "tv_filter_mask",
]
