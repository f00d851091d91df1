"""The advantage estimators: GAE, discounted returns, whitening, group advantages.

Per function: hand-computed fixtures (each expected value derived in the comment beside it, from
the defining equation, never from running the code under test; checked through both twins and,
for gradients, both the hand VJP and autograd), identities that tie it to other functions, and
corners pinned by hand.
"""
import math

import numpy as np
import pytest
import torch
from scipy.signal import lfilter

import ref_numpy
import ref_torch
from tests.helpers import both, close, grads


SQRT2 = math.sqrt(2.0)
SQRT3 = math.sqrt(3.0)


def discounted_cumsum(x, discount):
    """Σ_l discount^l · x_{t+l}: lfilter on the reversed sequence, a loop-free third oracle."""
    return lfilter([1.0], [1.0, -discount], x[..., ::-1], axis=-1)[..., ::-1]


def no_nan(*arrays):
    for a in arrays:
        assert not np.isnan(np.asarray(a, dtype=np.float64)).any()


def test_large_rewards_and_tiny_spreads():
    r = 1e6 + np.array([0.0, 1e-9, 2e-9, 0.0, 5.0, 5.0, 5.0, 5.0])   # a group with σ ≈ 1e-9
    for scale in ("group", "batch", "none"):
        no_nan(*both("group_advantages", r, group_size=4, scale=scale))
        hand, auto, _ = grads("group_advantages", 0, np.ones(8), r, group_size=4, scale=scale)
        no_nan(hand["rewards"], auto)
    x = np.array([[1e-12, 2e-12, 3e-12], [1e6, 1e6, 1e6]])
    for mode in ("var", "clamp", "std"):
        no_nan(*both("whiten", x, eps_mode=mode))
        no_nan(*both("whiten", x[:1], eps_mode=mode, eps=1e-8))
    big = np.full((2, 50), 1e6)
    no_nan(*both("gae", big, -big, gamma=1.0, lam=1.0)[0])
    no_nan(*both("value_loss", big, -big, big))


class TestGae:
    """gae: the backward recursion, masked steps skipped, dones and the bootstrap."""

    def test_skips_masked_step_and_bootstraps_from_next_valid_value(self):
        # γ = λ = 1, mask [1, 0, 1]: the masked step (r = 9, V = 9) is skipped entirely.
        # δ0 = r0 + V2 − V0 = 0 + 0.2 − 0.5 = −0.3 ; δ2 = r2 + 0 − V2 = 1 − 0.2 = 0.8
        # A0 = δ0 + A2 = 0.5 ; A2 = 0.8 ; returns = A + V = [1.0, 0, 1.0]
        args = ([0.0, 9.0, 1.0], [0.5, 9.0, 0.2], [True, False, True])
        for adv, ret in both("gae", *args, gamma=1.0, lam=1.0):
            close(adv, [0.5, 0.0, 0.8], atol=1e-15)
            close(ret, [1.0, 0.0, 1.0], atol=1e-15)

    def test_done_resets_and_last_value_bootstraps(self):
        # γ = 0.5, λ = 1, V ≡ 0.5, r = [1, 2, 3], done after step 0, last_value = 1.
        # δ2 = 3 + 0.5·1.0 − 0.5 = 3.0              A2 = 3.0
        # δ1 = 2 + 0.5·0.5 − 0.5 = 1.75             A1 = 1.75 + 0.5·3.0 = 3.25
        # δ0 = 1 + 0 (done: no bootstrap) − 0.5     A0 = 0.5 (the recursion restarts)
        kw = dict(gamma=0.5, lam=1.0, dones=np.array([[1, 0, 0]]), last_value=np.array([1.0]))
        for adv, ret in both("gae", [[1.0, 2.0, 3.0]], [[0.5, 0.5, 0.5]], None, **kw):
            close(adv, [[0.5, 3.25, 3.0]])
            close(ret, [[1.0, 3.75, 3.5]])

    def test_gradient_two_steps(self):
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

    def test_returns_cotangent_reaches_values_directly(self):
        # returns0 = A0 + V0 = δ0 + V0 = r0 + γV1 (T = 1 chain broken by a done): ∂/∂V0 = 0.
        g = (np.zeros(2), np.array([1.0, 0.0]))
        hand, auto, _ = grads("gae", 1, g, np.array([0.3, 0.1]), np.array([0.2, 0.7]), gamma=0.9,
                              lam=0.5, dones=np.array([1, 0]))
        # done after step 0: returns0 = r0 − V0 + V0 = r0, so no gradient reaches V at all.
        close(hand["values"], [0.0, 0.0])
        close(auto, [0.0, 0.0])

    def test_lambda_zero_is_the_td_error(self, rng):
        r, v = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
        v_next = np.concatenate([v[:, 1:], np.zeros((3, 1))], axis=1)
        for adv, _ in both("gae", r, v, gamma=0.9, lam=0.0):
            close(adv, r + 0.9 * v_next - v, atol=1e-14)

    def test_lambda_one_is_the_discounted_return_minus_v(self, rng):
        r, v, lv = rng.normal(size=(3, 7)), rng.normal(size=(3, 7)), rng.normal(size=3)
        G = discounted_cumsum(r, 0.95) + 0.95 ** (7 - np.arange(7))[None, :] * lv[:, None]
        for adv, ret in both("gae", r, v, gamma=0.95, lam=1.0, last_value=lv):
            close(adv, G - v, atol=1e-13)
            close(ret, G, atol=1e-13)

    def test_equals_lfilter_of_td_errors(self, rng):
        r, v = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
        v_next = np.concatenate([v[:, 1:], np.zeros((4, 1))], axis=1)
        expected = discounted_cumsum(r + 0.99 * v_next - v, 0.99 * 0.95)
        for adv, _ in both("gae", r, v, gamma=0.99, lam=0.95):
            close(adv, expected, atol=1e-13)

    def test_masked_steps_behave_as_if_removed(self, rng):
        # carrying across masked steps = running GAE on the valid steps alone (compacted)
        r, v = rng.normal(size=9), rng.normal(size=9)
        m = np.array([1, 1, 0, 0, 1, 0, 1, 1, 0], dtype=bool)
        adv_c, ret_c = ref_numpy.gae(r[m], v[m], gamma=0.9, lam=0.8)
        for adv, ret in both("gae", r, v, m, gamma=0.9, lam=0.8):
            close(adv[m], adv_c, atol=1e-14)
            close(ret[m], ret_c, atol=1e-14)
            assert np.all(adv[~m] == 0) and np.all(ret[~m] == 0)

    @pytest.mark.parametrize("twin", ["numpy", "torch"])
    def test_a_nan_last_value_is_named(self, twin):
        r, v = np.ones((2, 3)), np.ones((2, 3))
        lv = np.array([0.0, np.nan])
        with pytest.raises(ValueError, match="last_value"):
            if twin == "numpy":
                ref_numpy.gae(r, v, gamma=0.9, lam=0.9, last_value=lv)
            else:
                ref_torch.gae(torch.tensor(r), torch.tensor(v), gamma=0.9, lam=0.9,
                              last_value=torch.tensor(lv))


class TestDiscountedReturns:
    """discounted_returns: REINFORCE++'s reward-to-go."""

    def test_values_masked_steps_and_gradient(self):
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


class TestWhiten:
    """whiten: masked statistics, the three eps placements, shift_mean."""

    @pytest.mark.parametrize("ddof, expected", [
        (0, [-SQRT3 / math.sqrt(2.0), 0.0, SQRT3 / math.sqrt(2.0)]),   # var = 2/3, 1/sqrt(2/3)
        (1, [-1.0, 0.0, 1.0]),                                          # var = 2/2 = 1
    ])
    def test_ddof(self, ddof, expected):
        for y in both("whiten", [1.0, 2.0, 3.0], ddof=ddof, eps=0.0):
            close(y, expected, atol=1e-15)

    def test_eps_modes_and_shift_mean(self):
        x = [1.0, 2.0, 3.0]                    # μ = 2, var(ddof=1) = 1
        for y in both("whiten", x, ddof=1, eps=0.5, eps_mode="std"):
            close(y, [-2 / 3, 0.0, 2 / 3])     # s = sqrt(1) + 0.5 = 1.5
        for y in both("whiten", x, ddof=1, eps=4.0, eps_mode="clamp"):
            close(y, [-0.5, 0.0, 0.5])         # s = sqrt(max(1, 4)) = 2
        for y in both("whiten", x, ddof=1, eps=3.0, eps_mode="var"):
            close(y, [-0.5, 0.0, 0.5])         # s = sqrt(1 + 3) = 2
        for y in both("whiten", x, ddof=1, eps=0.0, shift_mean=False):
            close(y, [1.0, 2.0, 3.0])          # scaled by s = 1, not centred, nothing added back

    def test_statistics_ignore_padding(self):
        # valid entries [1, 3]: μ = 2, var (ddof 0) = 1, so y = [−1, 0, 1]; the NaN never counts
        for y in both("whiten", [1.0, np.nan, 3.0], [1, 0, 1], eps=0.0):
            close(y, [-1.0, 0.0, 1.0])

    def test_gradient_through_mean_and_variance(self):
        # x = [1, 2, 3], ddof 0, eps 0: s = sqrt(2/3), dev = [−1, 0, 1], g = [1, 0, 0].
        # ∂x_i = (g_i − 1/3)/s − (Σ g_j dev_j / s²)·(1/(2s))·2·dev_i/3 = (g_i − 1/3)/s + dev_i/(3s³)
        # s³ = s·2/3 ⇒ ∂x = [(2/3 − 1/2)/s, −(1/3)/s, (−1/3 + 1/2)/s] = [1/6, −1/3, 1/6]/s
        s = math.sqrt(2 / 3)
        hand, auto, _ = grads("whiten", 0, np.array([1.0, 0.0, 0.0]), np.array([1.0, 2.0, 3.0]),
                              eps=0.0)
        close(hand["x"], np.array([1 / 6, -1 / 3, 1 / 6]) / s)
        close(auto, np.array([1 / 6, -1 / 3, 1 / 6]) / s)

    def test_clamp_binding_has_no_variance_path(self):
        # var = 1 < eps = 4: s = 2 is constant, so ∂x = (g − ḡ)/s = [2/3, −1/3, −1/3]/2
        hand, auto, _ = grads("whiten", 0, np.array([1.0, 0.0, 0.0]), np.array([1.0, 2.0, 3.0]),
                              ddof=1, eps=4.0, eps_mode="clamp")
        close(hand["x"], [1 / 3, -1 / 6, -1 / 6])
        close(auto, [1 / 3, -1 / 6, -1 / 6])

    def test_gives_zero_mean_unit_variance_on_valid_entries(self, rng):
        x = rng.normal(3.0, 2.0, size=(4, 6))
        m = rng.random((4, 6)) < 0.6
        for ddof in (0, 1):
            for y in both("whiten", x, m, ddof=ddof, eps=0.0):
                close(y[m].mean(), 0.0, atol=1e-14)
                close(((y[m] - y[m].mean()) ** 2).sum() / (m.sum() - ddof), 1.0, atol=1e-13)

    def test_restore_mean_is_verls_shift_mean_false(self):
        # x = [1, 2, 3], ddof 1, eps 1e-8: μ = 2, var = 1, s = √(1 + 1e-8);
        # verl's masked_whiten(shift_mean=False) re-adds μ: y = (x − 2)/s + 2
        s = math.sqrt(1 + 1e-8)
        for y in both("whiten", np.array([1.0, 2.0, 3.0]), ddof=1, shift_mean=False,
                      restore_mean=True):
            close(y, [-1 / s + 2, 2.0, 1 / s + 2])
        # its gradient, for g = e_0: with n = x − μ = [−1, 0, 1], s' = ∂s/∂x_i = n_i/(s·(N − 1)),
        # ∂y_0/∂x_i = (δ_0i − 1/N)/s − n_0·n_i/(s³·(N − 1)) + 1/N   (the last: μ re-added)
        #           = (δ_0i − 1/3)/s + n_i/(2s³) + 1/3
        g = np.array([1.0, 0.0, 0.0])
        n = np.array([-1.0, 0.0, 1.0])
        expected = (g - 1 / 3) / s + n / (2 * s ** 3) + 1 / 3
        hand, auto, _ = grads("whiten", 0, g, np.array([1.0, 2.0, 3.0]), ddof=1, shift_mean=False,
                              restore_mean=True)
        close(hand["x"], expected)
        close(auto, expected)

    def test_restore_mean_needs_shift_mean_false(self):
        with pytest.raises(ValueError, match="restore_mean is True but shift_mean is True"):
            ref_numpy.whiten(np.ones((2, 3)), restore_mean=True)
        with pytest.raises(ValueError, match="restore_mean is True but shift_mean is True"):
            ref_torch.whiten(torch.ones(2, 3), restore_mean=True)


class TestGroupAdvantages:
    """group_advantages: GRPO, Dr. GRPO, RLOO, the leave-one-out std, valid rows."""

    def test_biased_vs_unbiased_std(self):
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

    def test_leave_one_out_and_dr_grpo(self):
        # RLOO: b_i = mean of the others. [1, 0, 0, 0]: A0 = 1 − 0, A_j = 0 − 1/3
        for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, scale="none",
                      baseline="leave_one_out"):
            close(a, [1.0, -1 / 3, -1 / 3, -1 / 3])
        # Dr. GRPO: r − μ, no std
        for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, scale="none"):
            close(a, [0.75, -0.25, -0.25, -0.25])

    def test_batch_std(self):
        # groups [1, 0] and [3, 1]: centred c = [0.5, −0.5, 1, −1]. Batch μ = 1.25,
        # Σ(r − μ)² = 0.0625 + 1.5625 + 3.0625 + 0.0625 = 4.75, σ (ddof 0) = sqrt(4.75/4)
        sigma = math.sqrt(4.75 / 4)
        for a in both("group_advantages", np.array([1.0, 0, 3, 1]), group_size=2, eps=0.0,
                      scale="batch"):
            close(a, np.array([0.5, -0.5, 1.0, -1.0]) / sigma)

    def test_group_ids_any_order_and_singleton_gets_zero(self):
        # ids 5, 9, 5: group 5 = rewards [1, 0] → μ 0.5, σ 0.5 → ±1; the singleton (id 9) gets 0
        for a in both("group_advantages", np.array([1.0, 7.0, 0.0]), group_ids=np.array([5, 9, 5]),
                      eps=0.0):
            close(a, [1.0, 0.0, -1.0])

    def test_two_member_group_has_zero_gradient(self):
        # n = 2, eps 0: A = ±1 whatever the rewards, so the gradient is exactly 0 (docstring check)
        hand, auto, _ = grads("group_advantages", 0, np.array([0.3, -1.2]), np.array([2.0, 0.5]),
                              group_size=2, eps=0.0)
        close(hand["rewards"], [0.0, 0.0], atol=1e-15)
        close(auto, [0.0, 0.0], atol=1e-15)

    def test_all_equal_group_gradient(self):
        # σ = 0 exactly: A_i = (r_i − μ)/(σ + eps) moves to first order as (d_i − d̄)/eps, so the
        # gradient is (g − ḡ)/eps; with g = [1, 0], eps = 0.5: [0.5, −0.5]/0.5 = [1, −1]
        hand, auto, _ = grads("group_advantages", 0, np.array([1.0, 0.0]), np.array([0.7, 0.7]),
                              group_size=2, eps=0.5)
        close(hand["rewards"], [1.0, -1.0])
        close(auto, [1.0, -1.0])

    def test_singleton_group_gradient_is_zero_even_with_eps_zero(self):
        # the singleton's advantage is the constant 0; its group has σ = 0 and eps = 0 (0/0 if computed)
        hand, auto, _ = grads("group_advantages", 0, np.ones(3), np.array([1.0, 7.0, 0.0]),
                              group_ids=np.array([5, 9, 5]), eps=0.0)
        assert np.all(np.isfinite(hand["rewards"])) and np.all(np.isfinite(auto))
        close(hand["rewards"][1], 0.0)
        close(auto[1], 0.0)

    def test_leave_one_out_std(self):
        # [1, 0, 0, 0], ddof 1, eps 0. Row 0: others [0, 0, 0] have no spread → A = 1 − 0 = 1.
        # Row 1: others [1, 0, 0], μ = 1/3, σ = sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3):
        # A = (0 − 1/3)/sqrt(1/3) = −sqrt(1/3)
        for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, ddof=1, eps=0.0,
                      scale="leave_one_out", baseline="leave_one_out"):
            close(a, [1.0] + [-math.sqrt(1 / 3)] * 3)

    def test_invalid_rows_leave_the_group_statistics(self):
        # rows 0, 2, 3 valid: mean of [1, 0, 3] = 4/3; scale none → [−1/3, 0, −4/3, 5/3]
        for a in both("group_advantages", np.array([1.0, np.nan, 0.0, 3.0]), group_size=4,
                      scale="none", valid=np.array([1, 0, 1, 1])):
            close(a, [-1 / 3, 0.0, -4 / 3, 5 / 3])

    def test_leave_one_out_std_of_a_single_other_is_exactly_zero(self):
        # found by hypothesis: with one "other" its spread is 0, so no scaling applies and
        # A = r_i − r_other; forming the others' mean as (Σr − r_i) rounded it to a tiny nonzero
        # spread, and eps = 1e-4 then scaled the advantage by 10^4
        r = np.array([1e-8, 1.0])
        for a in both("group_advantages", r, group_size=2, ddof=0, eps=1e-4,
                      scale="leave_one_out", baseline="leave_one_out"):
            close(a, [1e-8 - 1.0, 1.0 - 1e-8])

    @pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
    @pytest.mark.parametrize("scale", ["group", "batch", "none"])
    def test_sum_to_zero_in_each_group(self, rng, baseline, scale):
        r = rng.normal(size=12)
        ids = rng.permutation(np.repeat(np.arange(3), 4))
        for a in both("group_advantages", r, group_ids=ids, scale=scale, baseline=baseline):
            for g in range(3):
                close(a[ids == g].sum(), 0.0, atol=1e-13)

    def test_leave_one_out_is_a_rescaled_mean_baseline(self, rng):
        # r_i − mean of the others = n/(n − 1)·(r_i − μ)
        r = rng.normal(size=10)
        close(ref_numpy.group_advantages(r, group_size=5, scale="none", baseline="leave_one_out"),
              5 / 4 * ref_numpy.group_advantages(r, group_size=5, scale="none"), atol=1e-14)

    def test_batch_scale_with_ddof_1_by_hand(self):
        """r = [1, 2, 4, 7], groups of 2: centred [−0.5, 0.5, −1.5, 1.5]; the batch std with
        ddof = 1 is sqrt(21 / 3) = √7."""
        r = np.array([1.0, 2.0, 4.0, 7.0])
        got = ref_numpy.group_advantages(r, group_size=2, scale="batch", ddof=1, eps=0.0)
        assert got == pytest.approx(np.array([-0.5, 0.5, -1.5, 1.5]) / math.sqrt(7), abs=1e-15)
        twin = ref_torch.group_advantages(torch.tensor(r), group_size=2, scale="batch", ddof=1,
                                          eps=0.0)
        assert twin.numpy() == pytest.approx(got, abs=1e-15)

    def test_leave_one_out_gradient_where_the_others_do_not_spread(self):
        """Row 3 of [1, 1, 1, 5]: its others are all 1, σ = 0, no scaling; its VJP must match
        autograd through the twin."""
        r = np.array([1.0, 1.0, 1.0, 5.0, 0.3, -0.2, 0.9, 2.0])
        g = np.random.default_rng(0).normal(size=8)
        kw = dict(group_size=4, scale="leave_one_out", baseline="leave_one_out")
        hand = ref_numpy.group_advantages_vjp(g, r, **kw)["rewards"]
        rt = torch.tensor(r, requires_grad=True)
        (ref_torch.group_advantages(rt, **kw) * torch.tensor(g)).sum().backward()
        assert hand == pytest.approx(rt.grad.numpy(), abs=1e-12)

    def test_a_singleton_kept_has_baseline_0_and_spread_1(self):
        # rewards [1, 3 | 5]: the pair is (±1)/(σ + eps) with σ = √2 (ddof 1); the single 5 keeps
        # μ = 0, σ = 1 (verl's grpo): 5/(1 + eps), with eps = 1e-6 as verl's
        r, ids = np.array([1.0, 3.0, 5.0]), np.array([0, 0, 1])
        for a in both("group_advantages", r, group_ids=ids, ddof=1, eps=1e-6, singleton="keep"):
            close(a, [-1 / (SQRT2 + 1e-6), 1 / (SQRT2 + 1e-6), 5 / (1 + 1e-6)])
        for a in both("group_advantages", r, group_ids=ids, scale="none", singleton="keep"):
            close(a, [-1.0, 1.0, 5.0])                       # verl's rloo: A = s for a group of one
        for a in both("group_advantages", r, group_ids=ids, scale="none"):
            close(a, [-1.0, 1.0, 0.0])                       # the default: a group of one gets 0
        # its gradient: ∂A_2/∂r_2 = 1/(1 + eps), nothing from the others
        hand, auto, _ = grads("group_advantages", 0, np.array([0.0, 0.0, 1.0]), r, group_ids=ids,
                              ddof=1, eps=1e-6, singleton="keep")
        close(hand["rewards"], [0.0, 0.0, 1 / (1 + 1e-6)])
        close(auto, [0.0, 0.0, 1 / (1 + 1e-6)])

    def test_a_singleton_moves_the_batch_std_when_kept(self):
        # scale "batch", singleton kept: rows [1, 3 | 5] keep c = [−1, 1, 5] and share the batch σ
        # of the rewards themselves (ddof 0): σ_b = std([1, 3, 5]) = √(8/3)
        r, ids = np.array([1.0, 3.0, 5.0]), np.array([0, 0, 1])
        sb = math.sqrt(8 / 3)
        for a in both("group_advantages", r, group_ids=ids, scale="batch", eps=0.0,
                      singleton="keep"):
            close(a, np.array([-1.0, 1.0, 5.0]) / sb)

    def test_maxrl_scales_by_the_group_mean(self):
        # MaxRL, 0/1 rewards [1, 0, 0, 0], eps 0: pass rate μ = 1/4, A = (r − μ)/μ:
        # the success (1 − 1/4)/(1/4) = 3 = 1/p − 1, each failure −1
        for a in both("group_advantages", np.array([1.0, 0, 0, 0]), group_size=4, eps=0.0,
                      scale="mean"):
            close(a, [3.0, -1.0, -1.0, -1.0])
        # SkyRL's eps 1e-6, a group [2, 4] and a kept singleton 5 (baseline 0, not scaled):
        # μ = 3, A = ∓1/(3 + 1e-6); the singleton's A is 5 itself
        for a in both("group_advantages", np.array([2.0, 4.0, 5.0]), group_ids=np.array([0, 0, 1]),
                      eps=1e-6, scale="mean", singleton="keep"):
            close(a, [-1 / (3 + 1e-6), 1 / (3 + 1e-6), 5.0])

    def test_maxrl_gradient_by_hand(self):
        # n = 2, eps 0, r = [1, 0]: A_0 = (r_0 − μ)/μ with μ = (r_0 + r_1)/2, so
        # A_0 = (r_0 − r_1)/(r_0 + r_1): ∂A_0/∂r_0 = 2r_1/(r_0 + r_1)² = 0 and
        # ∂A_0/∂r_1 = −2r_0/(r_0 + r_1)² = −2 (the docstring's check of the two paths)
        hand, auto, _ = grads("group_advantages", 0, np.array([1.0, 0.0]), np.array([1.0, 0.0]),
                              group_size=2, eps=0.0, scale="mean")
        close(hand["rewards"], [0.0, -2.0], atol=1e-15)
        close(auto, [0.0, -2.0], atol=1e-15)
        # r = [1, 3], g = [0, 1]: A_1 = (r_1 − r_0)/(r_0 + r_1): ∂A_1/∂r_0 = −2r_1/16 = −3/8,
        # ∂A_1/∂r_1 = 2r_0/16 = 1/8
        hand, auto, _ = grads("group_advantages", 0, np.array([0.0, 1.0]), np.array([1.0, 3.0]),
                              group_size=2, eps=0.0, scale="mean")
        close(hand["rewards"], [-3 / 8, 1 / 8])
        close(auto, [-3 / 8, 1 / 8])

    def test_maxrl_refuses_a_zero_mean_with_eps_zero(self):
        # all-failed group [0, 0], eps 0: (0 − 0)/0; the message says what divides by zero
        for fn, r in ((ref_numpy.group_advantages, np.zeros(2)),
                      (ref_torch.group_advantages, torch.zeros(2, dtype=torch.float64))):
            with pytest.raises(ValueError,
                               match=r"row 0's group have mean \+ eps = 0 under scale='mean'"):
                fn(r, group_size=2, eps=0.0, scale="mean")
        # SkyRL's eps 1e-6: 0/1e-6 = 0
        for a in both("group_advantages", np.zeros(2), group_size=2, eps=1e-6, scale="mean"):
            close(a, [0.0, 0.0])

    @pytest.mark.parametrize("fn, conv", [(ref_numpy.group_advantages, np.asarray),
                                          (ref_torch.group_advantages, torch.tensor)],
                             ids=["numpy", "torch"])
    def test_maxrl_refuses_a_group_with_a_negative_mean_naming_it(self, fn, conv):
        # the group [−1, 0] has μ = −1/2: (r − μ)/(μ + eps) would flip both advantages' signs
        # (the better response would get A = −1); the second group [0, 1] alone is fine. A
        # kept singleton of −3 is not scaled by its mean and is no error
        r = conv(np.array([0.0, 1.0, -1.0, 0.0]))
        with pytest.raises(ValueError, match=r"^rewards have a group whose mean is -0\.5 under "
                                             r"scale='mean'"):
            fn(r, group_size=2, eps=1e-6, scale="mean")
        out = fn(conv(np.array([0.0, 1.0, -3.0])), group_ids=conv(np.array([0, 0, 1])),
                 eps=0.0, scale="mean", singleton="keep")
        close(np.asarray(out), [-1.0, 1.0, -3.0])

    def test_a_singleton_is_refused_when_asked(self):
        r, ids = np.array([1.0, 3.0, 5.0]), np.array([0, 0, 1])
        for fn, args in ((ref_numpy.group_advantages, (r,)),
                         (ref_torch.group_advantages, (torch.tensor(r),))):
            with pytest.raises(ValueError, match="row 2 form a group of one and singleton='error'"):
                fn(*args, group_ids=ids if fn is ref_numpy.group_advantages else torch.tensor(ids),
                   singleton="error")
        assert ref_numpy.group_advantages(r[:2], group_size=2, singleton="error").shape == (2,)


@pytest.mark.parametrize("value", [2.0, 1e200], ids=["2", "1e200"])
@pytest.mark.parametrize("eps_mode, scale", [("std", 1e-6), ("var", 1e-3), ("clamp", 1e-3)])
def test_whitening_equal_values_differentiates_through_the_numerator_alone(eps_mode, scale,
                                                                         value):
    # x = [v, v, v]: y = (x − μ)/(σ + ε) ("std") or (x − μ)/√(σ² + ε) ("var", "clamp" at
    # σ² < ε); with x − μ = 0 the product rule leaves d(x − μ)/s, s = ε or √ε, whatever v:
    # g = [1, 0, 0] gives (g − mean g)/s = [2/3, −1/3, −1/3]/s (at v = 1e200 the "std" VJP
    # gave NaN: its spread term, 0 there, was 0 · 1/s² with s² below the smallest float)
    x = np.full(3, value)
    got = ref_numpy.whiten_vjp(np.array([1.0, 0.0, 0.0]), x, eps=1e-6, eps_mode=eps_mode)["x"]
    np.testing.assert_allclose(got, np.array([2.0, -1.0, -1.0]) / 3.0 / scale, rtol=1e-12)
