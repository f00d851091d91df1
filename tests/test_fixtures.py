"""Hand-computed fixtures for every function: values, and gradients at kinks and ties.

Each expected value is derived in the comment beside it, from the defining equation, never
from running the code under test. Every fixture is checked against both twins (and, for
gradients, against both the hand VJP and torch autograd).
"""
import math

import numpy as np
import pytest

from _util import both, close, grads

SQRT3 = math.sqrt(3.0)


# ---------------------------------------------------------------- GAE
def test_gae_skips_masked_step_and_bootstraps_from_next_valid_value():
    # γ = λ = 1, mask [1, 0, 1]: the masked step (r = 9, V = 9) is skipped entirely.
    # δ0 = r0 + V2 − V0 = 0 + 0.2 − 0.5 = −0.3 ; δ2 = r2 + 0 − V2 = 1 − 0.2 = 0.8
    # A0 = δ0 + A2 = 0.5 ; A2 = 0.8 ; returns = A + V = [1.0, 0, 1.0]
    args = ([0.0, 9.0, 1.0], [0.5, 9.0, 0.2], [True, False, True])
    for adv, ret in both("gae", *args, gamma=1.0, lam=1.0):
        close(adv, [0.5, 0.0, 0.8], atol=1e-15)
        close(ret, [1.0, 0.0, 1.0], atol=1e-15)


def test_gae_done_resets_and_last_value_bootstraps():
    # γ = 0.5, λ = 1, V ≡ 0.5, r = [1, 2, 3], done after step 0, last_value = 1.
    # δ2 = 3 + 0.5·1.0 − 0.5 = 3.0              A2 = 3.0
    # δ1 = 2 + 0.5·0.5 − 0.5 = 1.75             A1 = 1.75 + 0.5·3.0 = 3.25
    # δ0 = 1 + 0 (done: no bootstrap) − 0.5     A0 = 0.5 (the recursion restarts)
    kw = dict(gamma=0.5, lam=1.0, dones=np.array([[1, 0, 0]]), last_value=np.array([1.0]))
    for adv, ret in both("gae", [[1.0, 2.0, 3.0]], [[0.5, 0.5, 0.5]], None, **kw):
        close(adv, [[0.5, 3.25, 3.0]])
        close(ret, [[1.0, 3.75, 3.5]])


def test_gae_gradient_two_steps():
    # A0 = δ0 + γλ·δ1, δ0 = r0 + γV1 − V0, δ1 = r1 − V1; cotangent g_A = [1, 0], g_R = 0:
    # ∂A0/∂r = [1, γλ], ∂A0/∂V = [−1, γ − γλ]. With γ = 0.9, λ = 0.5: [1, 0.45], [−1, 0.45].
    r, v = np.array([0.3, -0.2]), np.array([0.1, 0.4])
    g = (np.array([1.0, 0.0]), np.zeros(2))
    hand, auto, _ = grads("gae", 0, g, r, v, gamma=0.9, lam=0.5)
    close(hand["rewards"], [1.0, 0.45])
    close(auto, [1.0, 0.45])
    hand, auto, _ = grads("gae", 1, g, r, v, gamma=0.9, lam=0.5)
    close(hand["values"], [-1.0, 0.45])
    close(auto, [-1.0, 0.45])


def test_gae_returns_cotangent_reaches_values_directly():
    # returns0 = A0 + V0 = δ0 + V0 = r0 + γV1 (T = 1 chain broken by a done): ∂/∂V0 = 0.
    g = (np.zeros(2), np.array([1.0, 0.0]))
    hand, auto, _ = grads("gae", 1, g, np.array([0.3, 0.1]), np.array([0.2, 0.7]), gamma=0.9,
                          lam=0.5, dones=np.array([1, 0]))
    # done after step 0: returns0 = r0 − V0 + V0 = r0, so no gradient reaches V at all.
    close(hand["values"], [0.0, 0.0])
    close(auto, [0.0, 0.0])


# ---------------------------------------------------------------- whitening
@pytest.mark.parametrize("ddof, expected", [
    (0, [-SQRT3 / math.sqrt(2.0), 0.0, SQRT3 / math.sqrt(2.0)]),   # var = 2/3, 1/sqrt(2/3)
    (1, [-1.0, 0.0, 1.0]),                                          # var = 2/2 = 1
])
def test_whiten_ddof(ddof, expected):
    for y in both("whiten", [1.0, 2.0, 3.0], ddof=ddof, eps=0.0):
        close(y, expected, atol=1e-15)


def test_whiten_eps_modes_and_shift_mean():
    x = [1.0, 2.0, 3.0]                    # μ = 2, var(ddof=1) = 1
    for y in both("whiten", x, ddof=1, eps=0.5, eps_mode="std"):
        close(y, [-2 / 3, 0.0, 2 / 3])     # s = sqrt(1) + 0.5 = 1.5
    for y in both("whiten", x, ddof=1, eps=4.0, eps_mode="clamp"):
        close(y, [-0.5, 0.0, 0.5])         # s = sqrt(max(1, 4)) = 2
    for y in both("whiten", x, ddof=1, eps=3.0, eps_mode="var"):
        close(y, [-0.5, 0.0, 0.5])         # s = sqrt(1 + 3) = 2
    for y in both("whiten", x, ddof=1, eps=0.0, shift_mean=False):
        close(y, [1.0, 2.0, 3.0])          # scaled by s = 1, not centred, nothing added back


def test_whiten_statistics_ignore_padding():
    # valid entries [1, 3]: μ = 2, var (ddof 0) = 1, so y = [−1, 0, 1]; the NaN never counts
    for y in both("whiten", [1.0, np.nan, 3.0], [1, 0, 1], eps=0.0):
        close(y, [-1.0, 0.0, 1.0])


def test_whiten_gradient_through_mean_and_variance():
    # x = [1, 2, 3], ddof 0, eps 0: s = sqrt(2/3), dev = [−1, 0, 1], g = [1, 0, 0].
    # ∂x_i = (g_i − 1/3)/s − (Σ g_j dev_j / s²)·(1/(2s))·2·dev_i/3 = (g_i − 1/3)/s + dev_i/(3s³)
    # s³ = s·2/3 ⇒ ∂x = [(2/3 − 1/2)/s, −(1/3)/s, (−1/3 + 1/2)/s] = [1/6, −1/3, 1/6]/s
    s = math.sqrt(2 / 3)
    hand, auto, _ = grads("whiten", 0, np.array([1.0, 0.0, 0.0]), np.array([1.0, 2.0, 3.0]),
                          eps=0.0)
    close(hand["x"], np.array([1 / 6, -1 / 3, 1 / 6]) / s)
    close(auto, np.array([1 / 6, -1 / 3, 1 / 6]) / s)


def test_whiten_clamp_binding_has_no_variance_path():
    # var = 1 < eps = 4: s = 2 is constant, so ∂x = (g − ḡ)/s = [2/3, −1/3, −1/3]/2
    hand, auto, _ = grads("whiten", 0, np.array([1.0, 0.0, 0.0]), np.array([1.0, 2.0, 3.0]),
                          ddof=1, eps=4.0, eps_mode="clamp")
    close(hand["x"], [1 / 3, -1 / 6, -1 / 6])
    close(auto, [1 / 3, -1 / 6, -1 / 6])


# ---------------------------------------------------------------- group advantages
def test_group_advantages_biased_vs_unbiased_std():
    # rewards [1, 0, 0, 0]: μ = 1/4, Σ(r − μ)² = 9/16 + 3/16 = 3/4.
    # ddof 0: σ = sqrt(3/16) = √3/4 → A = [3/4, −1/4, −1/4, −1/4]/(√3/4) = [√3, −1/√3 ×3]
    for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, eps=0.0):
        close(a, [SQRT3, -1 / SQRT3, -1 / SQRT3, -1 / SQRT3])
    # ddof 1, eps 1e-4 (TRL): σ = sqrt(1/4) = 0.5 → A0 = 0.75/0.5001
    for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, ddof=1):
        close(a[0], 0.75 / 0.5001)
    # ddof 0, eps 1e-4 (MiniMind): A0 = 0.75/(√3/4 + 1e-4) ≈ 1.7317 (trainer_conventions §2.2)
    for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4):
        close(a[0], 0.75 / (SQRT3 / 4 + 1e-4))
        assert round(float(a[0]), 4) == 1.7317


def test_group_advantages_leave_one_out_and_dr_grpo():
    # RLOO: b_i = mean of the others. [1, 0, 0, 0]: A0 = 1 − 0, A_j = 0 − 1/3
    for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, scale="none",
                  baseline="leave_one_out"):
        close(a, [1.0, -1 / 3, -1 / 3, -1 / 3])
    # Dr. GRPO: r − μ, no std
    for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, scale="none"):
        close(a, [0.75, -0.25, -0.25, -0.25])


def test_group_advantages_batch_std():
    # groups [1, 0] and [3, 1]: centred c = [0.5, −0.5, 1, −1]. Batch μ = 1.25,
    # Σ(r − μ)² = 0.0625 + 1.5625 + 3.0625 + 0.0625 = 4.75, σ (ddof 0) = sqrt(4.75/4)
    sigma = math.sqrt(4.75 / 4)
    for a in both("group_advantages", np.array([1.0, 0, 3, 1]), group_size=2, eps=0.0,
                  scale="batch"):
        close(a, np.array([0.5, -0.5, 1.0, -1.0]) / sigma)


def test_group_ids_any_order_and_singleton_gets_zero():
    # ids 5, 9, 5: group 5 = rewards [1, 0] → μ 0.5, σ 0.5 → ±1; the singleton (id 9) gets 0
    for a in both("group_advantages", np.array([1.0, 7.0, 0.0]), group_ids=np.array([5, 9, 5]),
                  eps=0.0):
        close(a, [1.0, 0.0, -1.0])


def test_group_advantages_two_member_group_has_zero_gradient():
    # n = 2, eps 0: A = ±1 whatever the rewards, so the gradient is exactly 0 (docstring check)
    hand, auto, _ = grads("group_advantages", 0, np.array([0.3, -1.2]), np.array([2.0, 0.5]),
                          group_size=2, eps=0.0)
    close(hand["rewards"], [0.0, 0.0], atol=1e-15)
    close(auto, [0.0, 0.0], atol=1e-15)


def test_group_advantages_all_equal_group_gradient():
    # σ = 0 exactly: A_i = (r_i − μ)/(σ + eps) moves to first order as (d_i − d̄)/eps, so the
    # gradient is (g − ḡ)/eps; with g = [1, 0], eps = 0.5: [0.5, −0.5]/0.5 = [1, −1]
    hand, auto, _ = grads("group_advantages", 0, np.array([1.0, 0.0]), np.array([0.7, 0.7]),
                          group_size=2, eps=0.5)
    close(hand["rewards"], [1.0, -1.0])
    close(auto, [1.0, -1.0])


# ---------------------------------------------------------------- PPO clip
def test_ppo_positive_advantage_case_split():
    # A = 1, ε = 0.2, ρ = [0.5, 0.1, −0.3, −1.5] (the seed's tokens)
    # r = e^ρ; loss = −min(r, clip(r, 0.8, 1.2)):
    #   r = 1.6487 > 1.2: clip binds → −1.2, gradient 0
    #   r = 1.1052, 0.7408, 0.2231: unclipped is the min → −r, gradient −r
    rho = np.array([0.5, 0.1, -0.3, -1.5])
    logp, old, A = -1.0 + rho, np.full(4, -1.0), np.ones(4)
    r = np.exp(rho)
    for loss in both("ppo_clip_loss", logp, old, A):
        close(loss, [-1.2, -r[1], -r[2], -r[3]])
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(4), logp, old, A)
    close(hand["logp"], [0.0, -r[1], -r[2], -r[3]])
    close(auto, [0.0, -r[1], -r[2], -r[3]])


def test_ppo_negative_advantage_and_dual_clip():
    # A = −1: loss = max(r, clip(r)) (since −A = 1).
    #   r = 0.5 → max(0.5, 0.8) = 0.8 clipped, grad 0;  r = 1.5 → 1.5 unclipped, grad −A·r = 1.5
    #   r = 4 with c = 3: 4 → min(4, −c·A = 3) = 3, grad 0; r = 2.5: 2.5 < 3, grad 2.5
    r = np.array([0.5, 1.5, 4.0, 2.5])
    logp, old, A = np.log(r), np.zeros(4), -np.ones(4)
    for loss in both("ppo_clip_loss", logp, old, A):
        close(loss, [0.8, 1.5, 4.0, 2.5])
    for loss in both("ppo_clip_loss", logp, old, A, clip_c=3.0):
        close(loss, [0.8, 1.5, 3.0, 2.5])
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(4), logp, old, A, clip_c=3.0)
    close(hand["logp"], [0.0, 1.5, 0.0, 2.5])
    close(auto, [0.0, 1.5, 0.0, 2.5])


def test_ppo_dual_clip_never_touches_positive_advantages():
    # A = +1, r = 4, c = 3: the ordinary clip gives −1.2; the dual clip is for A < 0 only
    for loss in both("ppo_clip_loss", np.array([math.log(4.0)]), np.zeros(1), np.ones(1),
                     clip_c=3.0):
        close(loss, [-1.2])


def test_ppo_tie_on_clip_edge_keeps_the_unclipped_gradient():
    # ε_low = ε_high = 0: the clip interval is {1} and r = e^0 = 1 exactly sits on both edges.
    # Both branches equal −A; the unclipped branch carries the gradient −A·r = −A.
    A = np.array([2.0, -3.0])
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(2), np.zeros(2), np.zeros(2), A,
                          clip_low=0.0, clip_high=0.0)
    close(hand["logp"], [-2.0, 3.0])
    close(auto, [-2.0, 3.0])


def test_ppo_clip_higher_is_asymmetric():
    # ε_low 0.2, ε_high 0.28: r = 1.25 is inside [0.8, 1.28] → unclipped; r = 1.3 → 1.28
    r = np.array([1.25, 1.3])
    for loss in both("ppo_clip_loss", np.log(r), np.zeros(2), np.ones(2), clip_high=0.28):
        close(loss, [-1.25, -1.28])


def test_ppo_log_ratio_clamp_stops_the_gradient():
    # ρ = 25 clamped to 20, A = −1: loss = e^20 (unclipped, A < 0), gradient 0 (clamp binds)
    for loss in both("ppo_clip_loss", np.array([25.0]), np.zeros(1), -np.ones(1),
                     log_ratio_clamp=20.0):
        close(loss, [math.exp(20.0)])
    hand, auto, _ = grads("ppo_clip_loss", 0, np.ones(1), np.array([25.0]), np.zeros(1),
                          -np.ones(1), log_ratio_clamp=20.0)
    close(hand["logp"], [0.0])
    close(auto, [0.0])


def test_ppo_per_sequence_advantages_apply_to_every_token():
    logp = np.array([[0.1, -0.2], [0.3, 0.05]])
    old = np.zeros((2, 2))
    per_token = np.array([[1.0, 1.0], [-0.5, -0.5]])
    for a, b in zip(both("ppo_clip_loss", logp, old, np.array([1.0, -0.5])),
                    both("ppo_clip_loss", logp, old, per_token)):
        close(a, b)


# ---------------------------------------------------------------- CISPO
def test_cispo_absolute_cap_value_and_gradient():
    # A = 1, cap 2, logp = −0.5. r = 3 → w = 2: loss = −2·1·(−0.5) = 1, gradient −w·A = −2
    # r = 0.3 → w = 0.3: loss = 0.15, gradient −0.3 (clipped or not, the token keeps a gradient)
    logp = np.array([-0.5, -0.5])
    old = logp - np.log([3.0, 0.3])
    for loss in both("cispo_loss", logp, old, np.ones(2), clip_high=2.0):
        close(loss, [1.0, 0.15])
    hand, auto, _ = grads("cispo_loss", 0, np.ones(2), logp, old, np.ones(2), clip_high=2.0)
    close(hand["logp"], [-2.0, -0.3])
    close(auto, [-2.0, -0.3])


def test_cispo_relative_bound():
    # w = clip(r, 1 − 0.2, 1 + 0.28): r = 0.5 → 0.8, r = 2 → 1.28, r = 1.1 → 1.1; A = 1, logp = −1
    r = np.array([0.5, 2.0, 1.1])
    logp = -np.ones(3)
    for loss in both("cispo_loss", logp, logp - np.log(r), np.ones(3), clip_high=0.28,
                     clip_low=0.2, bound="relative"):
        close(loss, [0.8, 1.28, 1.1])


# ---------------------------------------------------------------- value loss
def test_value_loss_branches_and_gradients():
    # c = 0.2. token 0: v 1.0, v_old 0.5, R 2 → v_clip 0.7: ½·max(1.0², 1.3²) = 0.845, grad 0
    # token 1: v 1.0, v_old 0.5, R 0 → ½·max(1², 0.7²) = 0.5, grad v − R = 1
    # token 2: v 0.6, v_old 0.5, R 2 (inside the clip: branches tie) → 0.98, grad −1.4
    # token 3: v 0.75, v_old 0.5, c = 0.25 in float is exact: on the edge, both branches equal,
    #          unclipped carries the gradient: v − R = 0.75 − 2 = −1.25 (checked with c = 0.25)
    v, vo, R = np.array([1.0, 1.0, 0.6]), np.array([0.5, 0.5, 0.5]), np.array([2.0, 0.0, 2.0])
    for loss in both("value_loss", v, vo, R):
        close(loss, [0.845, 0.5, 0.98], atol=1e-15)
    hand, auto, _ = grads("value_loss", 0, np.ones(3), v, vo, R)
    close(hand["values"], [0.0, 1.0, -1.4], atol=1e-15)
    close(auto, [0.0, 1.0, -1.4], atol=1e-15)
    hand, auto, _ = grads("value_loss", 0, np.ones(1), np.array([0.75]), np.array([0.5]),
                          np.array([2.0]), clip=0.25)
    close(hand["values"], [-1.25])
    close(auto, [-1.25])
    for loss in both("value_loss", v, vo, R, clip=None):
        close(loss, 0.5 * (v - R) ** 2)


# ---------------------------------------------------------------- KL penalty
def test_kl_estimators_values_and_gradients():
    # logp = log 0.5, ref = log 0.4: x = log 0.8
    # k1 = −x, k2 = ½x², k3 = 0.8 − 1 − x, abs = −x;  ∂/∂logp: 1, −x, 1 − 0.8, 1
    x = math.log(0.8)
    logp, ref = np.array([math.log(0.5)]), np.array([math.log(0.4)])
    expected = {"k1": (-x, 1.0), "k2": (0.5 * x * x, -x), "k3": (0.8 - 1 - x, 0.2),
                "abs": (-x, 1.0)}
    for kind, (val, grad) in expected.items():
        for k in both("kl_penalty", logp, ref, kind=kind):
            close(k, [val], atol=1e-15)
        hand, auto, _ = grads("kl_penalty", 0, np.ones(1), logp, ref, kind=kind)
        close(hand["logp"], [grad], atol=1e-15)
        close(auto, [grad], atol=1e-15)


def test_kl_clamps():
    # k2 at x = −1 is 0.5, clamped to 0.1 → gradient 0
    for k in both("kl_penalty", np.array([1.0]), np.array([0.0]), kind="k2", clamp=(None, 0.1)):
        close(k, [0.1])
    hand, auto, _ = grads("kl_penalty", 0, np.ones(1), np.array([1.0]), np.array([0.0]),
                          kind="k2", clamp=(None, 0.1))
    close(hand["logp"], [0.0])
    close(auto, [0.0])
    # verl k3 (20, 10): x = 25 → 20 → e^20 − 21 → clamped 10, gradient 0
    for k in both("kl_penalty", np.array([0.0]), np.array([25.0]), kind="k3", clamp=(20.0, 10.0)):
        close(k, [10.0])
    # input clamp alone binding: x = 3 → 1 under clamp (1, None); k1 = −1, gradient 0
    hand, auto, _ = grads("kl_penalty", 0, np.ones(1), np.array([0.0]), np.array([3.0]),
                          kind="k1", clamp=(1.0, None))
    close(hand["logp"], [0.0])
    close(auto, [0.0])


def test_kl_abs_has_zero_gradient_at_zero():
    hand, auto, _ = grads("kl_penalty", 0, np.ones(1), np.array([-0.3]), np.array([-0.3]),
                          kind="abs")
    close(hand["logp"], [0.0])
    close(auto, [0.0])


# ---------------------------------------------------------------- aggregation
LOSS = np.array([[4.0, np.nan, np.nan], [1.0, 2.0, 3.0], [np.inf, 5.0, 5.0]])
MASK = np.array([[1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=bool)   # lengths 1, 3 and an empty row


@pytest.mark.parametrize("mode, empty_rows, expected", [
    ("token-mean", "exclude", 10 / 4),                  # (4 + 1 + 2 + 3)/4
    ("token-mean", "include", 10 / 4),
    ("seq-mean-token-mean", "exclude", (4 + 2) / 2),    # row means 4 and 2, two non-empty rows
    ("seq-mean-token-mean", "include", (4 + 2) / 3),    # the empty row counts as a 0
    ("seq-mean-token-sum", "exclude", (4 + 6) / 2),
    ("seq-mean-token-sum", "include", (4 + 6) / 3),
    ("seq-mean-token-sum-norm", "exclude", 10 / 3),     # ÷ T = 3, never ÷ B
])
def test_aggregate_modes(mode, empty_rows, expected):
    for v in both("aggregate", LOSS, MASK, mode=mode, empty_rows=empty_rows):
        close(v, expected)


def test_aggregate_weights_show_length_bias():
    # seq-mean-token-mean: the lone token of row 0 weighs 1/2, each token of row 1 weighs 1/6
    hand, auto, _ = grads("aggregate", 0, 1.0, LOSS, MASK)
    w = [[0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6], [0, 0, 0]]
    close(hand["loss"], w)
    close(auto, w)
    hand, _, _ = grads("aggregate", 0, 1.0, LOSS, MASK, mode="seq-mean-token-sum-norm", norm=5.0)
    close(hand["loss"], np.where(MASK, 0.2, 0.0))


# ---------------------------------------------------------------- actor objective
def test_policy_objective_is_zero_at_ratio_one_but_its_gradient_is_not():
    # ratio ≡ 1 and centred advantages [1, −1]: loss = −mean(A) = 0, yet ∂/∂logp = −A/N
    logp = np.array([[-0.7, -1.2]])
    A = np.array([[1.0, -1.0]])
    m = np.ones((1, 2), dtype=bool)
    for v in both("policy_objective", logp, logp.copy(), A, m, agg="token-mean"):
        close(v, 0.0, atol=1e-15)
    hand, auto, _ = grads("policy_objective", 0, 1.0, logp, logp.copy(), A, m, agg="token-mean")
    close(hand["logp"], [[-0.5, 0.5]])
    close(auto, [[-0.5, 0.5]])


def test_policy_objective_adds_the_weighted_kl_gradient():
    # k1 term: ∂(β·k1)/∂logp = β per token; token-mean over 2 tokens; ratio 1, A = 0
    logp = np.array([[-0.7, -1.2]])
    m = np.ones((1, 2), dtype=bool)
    hand, auto, _ = grads("policy_objective", 0, 1.0, logp, logp.copy(), np.zeros((1, 2)), m,
                          logp - 0.3, agg="token-mean", beta=0.1, kl_kind="k1")
    close(hand["logp"], [[0.05, 0.05]])
    close(auto, [[0.05, 0.05]])


def test_singleton_group_gradient_is_zero_even_with_eps_zero():
    # the singleton's advantage is the constant 0; its group has σ = 0 and eps = 0 (0/0 if computed)
    hand, auto, _ = grads("group_advantages", 0, np.ones(3), np.array([1.0, 7.0, 0.0]),
                          group_ids=np.array([5, 9, 5]), eps=0.0)
    assert np.all(np.isfinite(hand["rewards"])) and np.all(np.isfinite(auto))
    close(hand["rewards"][1], 0.0)
    close(auto[1], 0.0)
