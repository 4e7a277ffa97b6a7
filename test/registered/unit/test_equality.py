"""harness/equality: when two greedy outputs are the same (tokens, and logprobs within LOGPROB_TOL), what
counts as a greedy tie, and the power-check assertion (bodies shaped as SGLang's /generate answers)."""

import pytest

from sglang_pd.harness.equality import (LOGPROB_TOL, TieFlips, assert_differs, assert_same, compare,
                                        logprob_fields)

pytestmark = pytest.mark.unit


def _body(ids, tops):
    """A /generate body: `tops[i]` = [(logprob, token), ...] at position i, the chosen one first."""
    return {"output_ids": ids, "meta_info": {
        "output_token_logprobs": [[row[0][0], tok, None] for row, tok in zip(tops, ids)],
        "output_top_logprobs": [[[lp, t, None] for lp, t in row] for row in tops]}}


BASE = _body([5, 6, 7], [[(-1.0, 5), (-2.0, 9)], [(-1.5, 6), (-1.7, 3)], [(-0.5, 7), (-3.0, 1)]])


def test_same_tokens_and_logprobs_within_tolerance_are_the_same():
    near = _body([5, 6, 7], [[(-1.0 + LOGPROB_TOL / 2, 5), (-2.0, 9)], [(-1.5, 6), (-1.7, 3)],
                             [(-0.5, 7), (-3.0 - LOGPROB_TOL / 2, 1)]])
    result = assert_same(near, BASE)
    assert result.same and result.max_logprob_diff == pytest.approx(LOGPROB_TOL / 2)


def test_a_logprob_beyond_tolerance_differs_even_with_the_same_tokens():
    moved = _body([5, 6, 7], [[(-1.0, 5), (-2.0, 9)], [(-1.5 - 3 * LOGPROB_TOL, 6), (-1.7, 3)], [(-0.5, 7), (-3.0, 1)]])
    result = compare(moved, BASE)
    assert not result.same and result.first_token_diff is None and result.first_logprob_diff == 1
    with pytest.raises(AssertionError, match="first logprob diff at 1"):
        assert_same(moved, BASE)
    assert_differs(moved, BASE)


def test_a_later_top_k_entry_beyond_tolerance_differs():
    moved = _body([5, 6, 7], [[(-1.0, 5), (-2.0 + 5 * LOGPROB_TOL, 9)], [(-1.5, 6), (-1.7, 3)], [(-0.5, 7), (-3.0, 1)]])
    assert compare(moved, BASE).first_logprob_diff == 0


def test_other_tokens_differ_and_without_logprobs_only_tokens_count():
    other = _body([5, 8, 7], [[(-1.0, 5), (-2.0, 9)], [(-1.5, 8), (-1.7, 6)], [(-0.5, 7), (-3.0, 1)]])
    assert compare(other, BASE).first_token_diff == 1 and not compare(other, BASE).tie_flip
    bare = {"output_ids": [5, 6, 7]}
    assert compare(bare, BASE).same and compare(bare, BASE).max_logprob_diff is None
    assert compare({"output_ids": [5, 6]}, BASE).first_token_diff == 2  # shorter is different


def test_a_difference_at_a_greedy_tie_is_a_tie_flip_that_assert_same_counts_and_a_power_check_refuses():
    tied = _body([5, 6, 7], [[(-1.0, 5), (-2.0, 9)], [(-1.5, 6), (-1.5 - LOGPROB_TOL / 4, 3)], [(-0.5, 7), (-3.0, 1)]])
    flipped = _body([5, 3, 4], [[(-1.0, 5), (-2.0, 9)], [(-1.5, 3), (-1.5 - LOGPROB_TOL / 8, 6)], [(-0.9, 4), (-2.0, 1)]])
    tally = TieFlips()
    result = tally.add(compare(flipped, tied))
    assert result.tie_flip and not result.same and (tally.num_compared, tally.num_tie_flips) == (1, 1)
    assert_same(flipped, tied)  # passes, counted
    with pytest.raises(AssertionError, match="was not seen"):
        assert_differs(flipped, tied)


def test_a_power_check_fails_on_an_identical_output():
    with pytest.raises(AssertionError, match="the broken path was not seen"):
        assert_differs(BASE, BASE)


def test_request_fields_ask_for_output_logprobs_only():
    assert logprob_fields() == {"return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": -1}
