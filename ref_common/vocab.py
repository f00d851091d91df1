"""The vocabulary of conventions: every keyword's allowed values, written once.

Both twins, the harness, the audit, its diagnosis and the walkthrough read these tuples.
"""

AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
# modes that read the rows' groups (aggregate's group_size / group_ids): a token mean within
# each prompt's responses, then a mean over prompts (SkyRL's loss_reduction "prompt_mean")
GROUPED_AGG_MODES = ("prompt-mean-token-mean",)
EMPTY_ROWS = ("exclude", "include")
EPS_MODES = ("var", "clamp", "std")
GROUP_SCALES = ("group", "batch", "leave_one_out", "mean", "none")
GROUP_BASELINES = ("mean", "leave_one_out")
SINGLETONS = ("zero", "keep", "error")         # a group of one: A = 0, baseline 0 and spread 1, refuse
KL_KINDS = ("k1", "k2", "k3", "abs")          # kl_penalty (abs: |log ratio|)
ESTIMATOR_KINDS = ("k1", "k2", "k3")          # approx_kl and the exact estimator analysis
CISPO_BOUNDS = ("absolute", "relative")
POLICY_LOSSES = ("ppo", "cispo", "gspo", "sapo", "vespo", "dppo")
KL_WEIGHTS = (None, "ratio", "score")   # policy_objective's KL term as it is, times the
                               # attached token ratio exp(logp − old_logp) (TRL's
                               # use_bias_correction_kl), or times exp(logp − sg(logp)): value 1,
                               # gradient the score term k·∇logp (NeMo-RL's calculate_kl weight)
KL_ANCHORS = ("ref", "old")     # policy_objective's KL term against ref_logp, or against old_logp
                                # (a trust-region penalty toward the sampling policy)
GSPO_FORMS = ("token", "sequence")
SAPO_LEVELS = ("token", "sequence")     # SAPO's ratio: per token, or the sequence's geometric mean
# ppo_clip_loss's and cispo_loss's ratio: per token r_t, the sequence's s = exp(mean log-ratio),
# their arithmetic mean (r_t + s)/2, or their geometric mean √(r_t·s) (ART's
# importance_sampling_level)
RATIO_LEVELS = ("token", "sequence", "average", "geometric_average")
CLIP_FRACTIONS = ("loss", "sign", "ratio")

# rollout-correction importance weights π_train/π_rollout (rollout_is_weights, reinforce_loss)
IS_LEVELS = ("token", "sequence")       # one weight per token, or one per sequence
IS_MODES = ("truncate", "mask")         # clamp the weight into [lower, upper] (TIS), or zero it
                                        # outside (MIS / IcePop)
IS_SEQ_STATS = ("sum", "mean")          # a sequence's log weight: Σ log-ratios (the product of
                                        # token ratios) or their mean (the geometric mean)
IS_KEPT = ("unit", "token")             # mask mode: a kept token carries its unit's weight, or
                                        # its own token ratio
DPPO_DIVERGENCES = ("tv", "kl")         # DPPO's trust region: binary total variation or KL
DPPO_FORMS = ("logp", "ratio")          # DPPO's value: −A·sg(w)·logp (verl), or −A·w with the
                                        # ratio attached (prime-rl's default loss)

# kl_estimator_gradient: how the trainer uses the estimator, and the importance weight on it
USES = ("loss", "reward")
IS_WEIGHTS = (None, "attached", "detached")
MOMENT_KEYS = ("kl_forward", "kl_reverse", "mean", "bias", "var", "log_var")
GRADIENT_KEYS = ("expected", "grad_kl_forward", "grad_kl_reverse")


def is_logprob(name: str) -> bool:
    """Whether an input of a reference holds log-probabilities: they are named `logp` (the
    policy being trained) or `<policy>_logp` (old_logp, ref_logp, rollout_logp, prox_logp,
    behave_logp, ...)."""
    return name == "logp" or name.endswith("_logp")
