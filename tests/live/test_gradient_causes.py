"""The gradient check's diagnosis on hand-built per-token gradients: the reference gradient
split into its terms (policy, clip region, KL, importance weight, mask), and the one term that
explains the trainer's gradient named, with the tokens that differ and why the rest agree.

Every expected value is a literal: the reference terms are written out, and the trainer's
gradient is built from them by the bug each test plants."""
import numpy as np

from crosscheck import bridge, tolerances
from crosscheck.live.checks import explain
from crosscheck.live.objective import Terms

T, F = True, False
# two completions of 4 positions: row 0 has 3 counted tokens, row 1 has 2
COUNTED = np.array([[T, T, T, F], [T, T, F, F]])
ADV = np.array([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])
# (0, 1): A > 0 and r = 1.5 above 1 + ε_high; (1, 1): A < 0 and r = 0.5 below 1 − ε_low
RATIO = np.array([[1.0, 1.5, 1.0, 1.0], [1.0, 0.5, 1.0, 1.0]])
# −A·r·w with w = 1/4 at the unclipped tokens, 0 where clipped or not counted
POLICY = np.array([[-0.25, 0.0, -0.25, 0.0], [0.25, 0.0, 0.0, 0.0]])
KL = np.array([[0.1, 0.2, -0.1, 0.0], [0.05, -0.2, 0.0, 0.0]])


def terms(policy=POLICY, kl=None, beta=0.0, after_end=None, ratio=RATIO, counted=COUNTED,
          alternatives=None):
    return Terms(policy=policy, kl=np.zeros_like(policy) if kl is None else kl,
                 counted=counted,
                 after_end=np.zeros_like(counted) if after_end is None else after_end,
                 ratio=ratio, advantages=ADV, beta=beta, clip_low=0.2, clip_high=0.2,
                 kl_name="β·k3 · ratio (bias-corrected)", kl_alternatives=alternatives or {})


def close(scale):
    tol = tolerances.get("audit", "float64")
    return lambda a, b: bridge.within(a, b, tol, scale=scale)


def test_a_uniform_factor_names_the_tokens_that_differ_and_why_the_rest_agree():
    msg = explain(0.5 * POLICY, terms(), close(0.25))
    assert msg.startswith("a normalisation or scaling factor: the applied gradient is 0.5× "
                          "the documented objective's at every token where that is non-zero "
                          "(3 tokens)"), msg
    assert "3 of 8 tokens differ ((0, 0), (0, 2), (1, 0))" in msg
    # the other five: the two clipped tokens and the three padded ones, zero on both sides
    assert "the other 5: 3 not counted (padding or after the end token)" in msg
    assert "2 clipped, zero gradient on both sides" in msg


def test_a_gradient_at_a_token_the_reference_clips_is_a_wider_clip_range():
    got = POLICY.copy()
    got[0, 1] = -0.25 * 1.5                         # the upper clip removed at r = 1.5
    msg = explain(got, terms(), close(0.375))
    assert msg.startswith("the clip bounds (ε_low, ε_high): at 1 token the reference clips "
                          "(1 token with A > 0, upper bound 1 + ε_high = 1.2, r 1.5–1.5) the "
                          "trainer's gradient is not 0: it clips at a wider range"), msg
    assert "1 of 8 tokens differ ((0, 1))" in msg
    assert "1 clipped, zero gradient on both sides" in msg       # (1, 1), on the lower side


def test_a_lower_bound_widened_is_named_on_its_side():
    got = POLICY.copy()
    got[1, 1] = 0.25 * 0.5                          # the lower clip removed at r = 0.5
    msg = explain(got, terms(), close(0.25))
    assert "1 token with A < 0, lower bound 1 − ε_low = 0.8, r 0.5–0.5" in msg, msg
    assert "wider range" in msg and "(1, 1)" in msg


def test_a_zero_gradient_inside_the_clip_range_is_a_narrower_one():
    ratio = RATIO.copy()
    ratio[0, 2] = 1.1                               # inside [0.8, 1.2]: the reference keeps it
    policy = POLICY.copy()
    policy[0, 2] = -0.275
    got = policy.copy()
    got[0, 2] = 0.0
    msg = explain(got, terms(policy=policy, ratio=ratio), close(0.275))
    assert msg.startswith("the clip bounds (ε_low, ε_high): at 1 token inside the reference's "
                          "clip range (1 token with A > 0, upper bound 1 + ε_high = 1.2, r "
                          "1.1–1.1) the trainer's gradient is 0: it clips at a narrower range"), \
        msg


def test_a_gradient_after_the_end_token_is_a_mask_finding_not_a_factor():
    after = np.array([[F, F, F, T], [F, F, T, T]])
    got = POLICY.copy()
    got[0, 3] = -0.25
    got[1, 2:] = 0.25
    msg = explain(got, terms(after_end=after), close(0.25))
    assert msg.startswith("a wrong mask: the gradient reaches 3 tokens after their completion's "
                          "first end token, which the objective does not count, at (0, 3), "
                          "(1, 2), (1, 3); the counted tokens agree (3 of 8 tokens differ)"), msg


def test_a_mask_that_also_rescales_the_counted_tokens_is_still_a_mask_finding():
    # a token-count normalisation over all 8 positions, not the 5 counted: every counted token
    # is 5/8 of the reference, a uniform factor, and the padding receives gradient
    got = np.array([[-0.25, 0.0, -0.25, -0.25], [0.25, 0.0, 0.25, 0.25]]) * 5 / 8
    got[0, 1] = got[1, 1] = 0.0
    msg = explain(got, terms(), close(0.25))
    assert msg.startswith("a wrong mask: the gradient reaches 3 tokens the objective does not "
                          "count (mask = 0), at (0, 3), (1, 2), (1, 3); the counted tokens' "
                          "gradient is 0.625× the objective's, since the normalisation counts "
                          "the extra tokens too"), msg
    assert "scaling factor" not in msg


def test_a_kl_term_scaled_names_the_coefficient():
    got = POLICY + 2 * KL
    msg = explain(got, terms(kl=KL, beta=0.5), close(0.35))
    assert msg.startswith("the KL term: β·KL's gradient is 2× the reference's at the 5 tokens "
                          "where it contributes, the policy term agrees: the KL coefficient is "
                          "1, the configuration's β is 0.5"), msg
    assert "5 of 8 tokens differ" in msg


def test_another_kl_estimator_is_named():
    k1 = np.array([[0.3, 0.1, 0.0, 0.0], [-0.05, 0.1, 0.0, 0.0]])
    got = POLICY + k1
    msg = explain(got, terms(kl=KL, beta=0.5, alternatives={"β·k1": k1}), close(0.35))
    assert msg.startswith("the KL estimator: the gradient is the policy term plus β·k1's, not "
                          "the documented β·k3 · ratio (bias-corrected)'s"), msg


def test_a_policy_term_scaled_alone_is_named_and_the_kl_term_agrees():
    got = 3 * POLICY + KL
    msg = explain(got, terms(kl=KL, beta=0.5), close(0.35))
    assert msg.startswith("the policy term: its gradient is 3× the reference's at the 3 tokens "
                          "where it contributes, the KL term agrees"), msg


def test_a_dropped_importance_weight_is_named():
    ratio = RATIO.copy()
    ratio[0, 0] = 1.25
    policy = POLICY.copy()
    policy[0, 0] = -0.25 * 1.25
    got = POLICY.copy()                             # −A·w: the reference's ÷ r
    msg = explain(got, terms(policy=policy, ratio=ratio), close(0.3125))
    assert msg.startswith("the importance weight: the policy term's gradient lacks the "
                          "importance weight r = exp(logp − old_logp)"), msg
    assert "1 of 8 tokens differ ((0, 0))" in msg


def test_a_difference_no_term_explains_lists_the_tokens():
    got = POLICY.copy()
    got[0, 0] = 0.4
    got[1, 0] = -0.1
    msg = explain(got, terms(), close(0.25))
    assert msg.startswith("∂loss/∂logp differs from the documented objective's; no one term"), \
        msg
    assert "2 of 8 tokens differ ((0, 0), (1, 0))" in msg


def test_another_kl_estimator_is_named_where_the_documented_kl_has_no_gradient():
    # at step 1 (policy = reference) k3's gradient is 0 at every token, k1's is not
    k1 = np.array([[0.125, 0.125, 0.125, 0.0], [0.125, 0.125, 0.0, 0.0]])
    got = POLICY + k1
    msg = explain(got, terms(kl=np.zeros_like(KL), beta=0.5, alternatives={"β·k1": k1}),
                  close(0.25))
    assert msg.startswith("the KL estimator: the gradient is the policy term plus β·k1's"), msg
