"""The vocabulary of conventions: every keyword's allowed values, written once.

Both twins, the harness, the audit, its diagnosis and the walkthrough read these tuples.
"""

AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
EMPTY_ROWS = ("exclude", "include")
EPS_MODES = ("var", "clamp", "std")
GROUP_SCALES = ("group", "batch", "leave_one_out", "none")
GROUP_BASELINES = ("mean", "leave_one_out")
SINGLETONS = ("zero", "keep", "error")         # a group of one: A = 0, baseline 0 and spread 1, refuse
KL_KINDS = ("k1", "k2", "k3", "abs")          # kl_penalty (abs: |log ratio|)
ESTIMATOR_KINDS = ("k1", "k2", "k3")          # approx_kl and the exact estimator analysis
CISPO_BOUNDS = ("absolute", "relative")
POLICY_LOSSES = ("ppo", "cispo", "gspo", "sapo")
GSPO_FORMS = ("token", "sequence")
CLIP_FRACTIONS = ("loss", "sign", "ratio")

# kl_estimator_gradient: how the trainer uses the estimator, and the importance weight on it
USES = ("loss", "reward")
IS_WEIGHTS = (None, "attached", "detached")
MOMENT_KEYS = ("kl_forward", "kl_reverse", "mean", "bias", "var")
GRADIENT_KEYS = ("expected", "grad_kl_forward", "grad_kl_reverse")
