"""Hand-computed fixtures for the reference pieces the trainer profiles need: discounted returns,
GSPO (both forms), TRL's δ, leave-one-out std, valid rows, clip fractions, approx KL."""
import math

import numpy as np

from _util import both, close, grads


def test_discounted_returns():
    # γ = 0.5, r = [1, 0, 2]: G = [1 + 0.5·(0 + 0.5·2), 0 + 0.5·2, 2] = [1.5, 1, 2]
    for G in both("discounted_returns", np.array([1.0, 0.0, 2.0]), gamma=0.5):
        close(G, [1.5, 1.0, 2.0])
    # a masked step is skipped: [1, ·, 2] → G0 = 1 + 0.5·2 = 2
    for G in both("discounted_returns", np.array([1.0, np.nan, 2.0]), np.array([1, 0, 1]),
                  gamma=0.5):
        close(G, [2.0, 0.0, 2.0])
    hand, auto, _ = grads("discounted_returns", 0, np.array([1.0, 0.0, 0.0]),
                          np.array([1.0, 0.0, 2.0]), gamma=0.5)
    close(hand["rewards"], [1.0, 0.5, 0.25])          # ∂G_0/∂r = [1, γ, γ²]
    close(auto, [1.0, 0.5, 0.25])


def test_gspo_value_and_the_two_gradient_forms():
    # log-ratios 0.2 and −0.1: s = e^0.05 inside [0.8, 1.2]; A = 1 → l = −s for both tokens
    logp, old, A = np.array([[0.2, -0.1]]), np.zeros((1, 2)), np.ones((1, 2))
    s = math.exp(0.05)
    for form in ("token", "sequence"):
        for loss in both("gspo_loss", logp, old, A, clip_low=0.2, clip_high=0.2, form=form):
            close(loss, [[-s, -s]])
    # cotangent [1, 0]: token form reaches token 0 only (−s); sequence form splits −s over L = 2
    g = np.array([[1.0, 0.0]])
    for form, expected in (("token", [[-s, 0.0]]), ("sequence", [[-s / 2, -s / 2]])):
        hand, auto, _ = grads("gspo_loss", 0, g, logp, old, A, clip_low=0.2, clip_high=0.2,
                              form=form)
        close(hand["logp"], expected)
        close(auto, expected)


def test_gspo_uses_the_mean_not_the_product():
    # log-ratios 0.1 and 0.05, ε = 0.1: mean → s = e^0.075 = 1.0779 inside the clip;
    # a product of ratios would be e^0.15 = 1.1618 and clip to 1.1
    for loss in both("gspo_loss", np.array([[0.1, 0.05]]), np.zeros((1, 2)), np.ones(1),
                     clip_low=0.1, clip_high=0.1):
        close(loss, [[-math.exp(0.075)] * 2])


def test_trl_delta_equals_the_dual_clip_for_negative_advantages():
    # A = −1, δ = 3: r = 4 → loss min(r, δ)·1 = 3 (gradient 0); r = 2.5 → 2.5 (gradient 2.5)
    r = np.array([0.5, 1.5, 4.0, 2.5])
    for loss in both("ppo_clip_loss", np.log(r), np.zeros(4), -np.ones(4), delta=3.0):
        close(loss, [0.8, 1.5, 3.0, 2.5])
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(4), np.log(r), np.zeros(4), -np.ones(4),
                          delta=3.0)
    close(hand["logp"], [0.0, 1.5, 0.0, 2.5])
    close(auto, [0.0, 1.5, 0.0, 2.5])
    # A > 0: δ changes nothing (the ordinary clip already binds above 1.2)
    for loss in both("ppo_clip_loss", np.log(r), np.zeros(4), np.ones(4), delta=3.0):
        close(loss, [-0.5, -1.2, -1.2, -1.2])


def test_leave_one_out_std():
    # [1, 0, 0, 0], ddof 1, eps 0. Row 0: others [0, 0, 0] have no spread → A = 1 − 0 = 1.
    # Row 1: others [1, 0, 0], μ = 1/3, σ = sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3):
    # A = (0 − 1/3)/sqrt(1/3) = −sqrt(1/3)
    for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, ddof=1, eps=0.0,
                  scale="leave_one_out", baseline="leave_one_out"):
        close(a, [1.0] + [-math.sqrt(1 / 3)] * 3)


def test_invalid_rows_leave_the_group_statistics():
    # rows 0, 2, 3 valid: mean of [1, 0, 3] = 4/3; scale none → [−1/3, 0, −4/3, 5/3]
    for a in both("group_advantages", np.array([1.0, np.nan, 0.0, 3.0]), group_size=4,
                  scale="none", valid=np.array([1, 0, 1, 1])):
        close(a, [-1 / 3, 0.0, -4 / 3, 5 / 3])


def test_clip_fraction_definitions():
    # (r, A): (1.5, +1) binds; (0.5, +1) does not bind but |r − 1| > ε; (0.5, −1) binds;
    # (1.1, +1) inside. "loss" and "sign": 2/4; "ratio": 3/4
    r = np.array([1.5, 0.5, 0.5, 1.1])
    A = np.array([1.0, 1.0, -1.0, 1.0])
    for definition, expected in (("loss", 0.5), ("sign", 0.5), ("ratio", 0.75)):
        for f in both("clip_fraction", np.log(r), np.zeros(4), A, definition=definition):
            close(f, expected)


def test_approx_kl_estimators():
    # u = logp − old = [0.1, −0.2]: k1 = mean(−u) = 0.05; k2 = mean(u²/2) = 0.0125;
    # k3 = mean(e^u − 1 − u); ∂k1/∂logp = −1/N each
    logp, old = np.array([0.1, -0.2]), np.zeros(2)
    expected = {"k1": 0.05, "k2": 0.0125,
                "k3": ((math.exp(0.1) - 1.1) + (math.exp(-0.2) - 0.8)) / 2}
    for kind, value in expected.items():
        for v in both("approx_kl", logp, old, kind=kind):
            close(v, value)
    hand, auto, _ = grads("approx_kl", 0, 1.0, logp, old, kind="k1")
    close(hand["logp"], [-0.5, -0.5])
    close(auto, [-0.5, -0.5])


def test_leave_one_out_std_of_a_single_other_is_exactly_zero():
    # found by hypothesis: with one "other" its spread is 0, so no scaling applies and
    # A = r_i − r_other; forming the others' mean as (Σr − r_i) rounded it to a tiny nonzero
    # spread, and eps = 1e-4 then scaled the advantage by 10^4
    r = np.array([1e-8, 1.0])
    for a in both("group_advantages", r, group_size=2, ddof=0, eps=1e-4,
                  scale="leave_one_out", baseline="leave_one_out"):
        close(a, [1e-8 - 1.0, 1.0 - 1e-8])
