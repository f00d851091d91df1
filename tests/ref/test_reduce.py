"""aggregate: the per-token weights of each mode, and the length bias they carry."""

import numpy as np
import pytest

from tests.helpers import both, close, grads


LOSS = np.array([[4.0, np.nan, np.nan], [1.0, 2.0, 3.0], [np.inf, 5.0, 5.0]])


MASK = np.array([[1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=bool)   # lengths 1, 3 and an empty row


class TestAggregate:
    """aggregate: the four modes, empty rows, and the weights as gradient."""

    @pytest.mark.parametrize("mode, empty_rows, expected", [
        ("token-mean", "exclude", 10 / 4),                  # (4 + 1 + 2 + 3)/4
        ("token-mean", "include", 10 / 4),
        ("seq-mean-token-mean", "exclude", (4 + 2) / 2),    # row means 4 and 2, two non-empty rows
        ("seq-mean-token-mean", "include", (4 + 2) / 3),    # the empty row counts as a 0
        ("seq-mean-token-sum", "exclude", (4 + 6) / 2),
        ("seq-mean-token-sum", "include", (4 + 6) / 3),
        ("seq-mean-token-sum-norm", "exclude", 10 / 3),     # ÷ T = 3, never ÷ B
    ])
    def test_modes(self, mode, empty_rows, expected):
        for v in both("aggregate", LOSS, MASK, mode=mode, empty_rows=empty_rows):
            close(v, expected)

    def test_weights_show_length_bias(self):
        # seq-mean-token-mean: the lone token of row 0 weighs 1/2, each token of row 1 weighs 1/6
        hand, auto, _ = grads("aggregate", 0, 1.0, LOSS, MASK)
        w = [[0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6], [0, 0, 0]]
        close(hand["loss"], w)
        close(auto, w)
        hand, _, _ = grads("aggregate", 0, 1.0, LOSS, MASK, mode="seq-mean-token-sum-norm", norm=5.0)
        close(hand["loss"], np.where(MASK, 0.2, 0.0))

    @pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
    def test_mean_aggregations_weight_valid_tokens_to_one(self, rng, mode):
        m = rng.random((5, 8)) < 0.5
        m[0] = False
        hand, _, _ = grads("aggregate", 0, 1.0, rng.normal(size=(5, 8)), m, mode=mode)
        close(hand["loss"].sum(), 1.0)
        assert np.all(hand["loss"][~m] == 0)

    def test_seq_mean_token_sum_with_a_norm_divides_by_rows_and_norm(self):
        # LOSS/MASK: row sums 4, 6 and an empty row. TRL's dr_grpo: Σ/(B·norm) with the empty row
        # counted, (4 + 6)/(3·5); verl 0.9's -norm: the empty row excluded, (4 + 6)/(2·5)
        for got in both("aggregate", LOSS, MASK, mode="seq-mean-token-sum", norm=5.0,
                        empty_rows="include"):
            close(got, 10 / 15)
        for got in both("aggregate", LOSS, MASK, mode="seq-mean-token-sum", norm=5.0):
            close(got, 10 / 10)
        hand, auto, _ = grads("aggregate", 0, 1.0, LOSS, MASK, mode="seq-mean-token-sum", norm=5.0)
        close(hand["loss"], MASK / 10.0)
        close(auto, MASK / 10.0)

    @pytest.mark.parametrize("empty_rows, expected", [
        # prompts {row 0, row 2} and {row 1}: prompt A's tokens are row 0's one (4; row 2 is
        # empty), its mean 4; prompt B's mean (1 + 2 + 3)/3 = 2; the mean over prompts 3
        ("include", 3.0),
        ("exclude", 3.0),
    ])
    def test_prompt_mean_is_a_token_mean_per_prompt_then_a_mean_over_prompts(self, empty_rows,
                                                                             expected):
        ids = np.array([7, 3, 7])
        for v in both("aggregate", LOSS, MASK, mode="prompt-mean-token-mean", group_ids=ids,
                      empty_rows=empty_rows):
            close(v, expected)
        # its weights: 1/(2·1) for row 0's token, 1/(2·3) for row 1's
        hand, auto, _ = grads("aggregate", 0, 1.0, LOSS, MASK, mode="prompt-mean-token-mean",
                              group_ids=ids)
        w = [[0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6], [0, 0, 0]]
        close(hand["loss"], w)
        close(auto, w)

    # group_size 1: three prompts, the third empty: (4 + 2)/3 included (SkyRL), /2 excluded
    @pytest.mark.parametrize("empty_rows, expected", [("include", 6 / 3), ("exclude", 6 / 2)])
    def test_a_prompt_with_no_token_counts_only_when_included(self, empty_rows, expected):
        for v in both("aggregate", LOSS, MASK, mode="prompt-mean-token-mean", group_size=1,
                      empty_rows=empty_rows):
            close(v, expected)

    def test_prompt_mean_needs_its_groups(self):
        import ref_numpy
        with pytest.raises(ValueError, match="needs exactly one of group_size= or group_ids="):
            ref_numpy.aggregate(LOSS, MASK, mode="prompt-mean-token-mean")
        with pytest.raises(ValueError, match="group_size is 2 but loss has B = 3 rows"):
            ref_numpy.aggregate(LOSS, MASK, mode="prompt-mean-token-mean", group_size=2)
