"""A prompt's token ids against the vocabulary: in-range ids pass (also the empty prompt and the
boundaries), and the first id that is out of range, negative, fractional, boolean or not a number is
named with its position and the range."""

import pytest

from sglang_pd.srt.disaggregation.prompt_guard import check_input_ids

pytestmark = pytest.mark.unit


def test_ids_inside_the_vocabulary_pass():
    check_input_ids([], 512)
    check_input_ids([0, 511, 7], 512)
    check_input_ids(list(range(512)) * 8, 512)


@pytest.mark.parametrize("ids, message", [
    ([1, 512], "input_ids[1] = 512 is outside this model's vocabulary [0, 512)"),
    ([3, -1, 600], "input_ids[1] = -1 is outside this model's vocabulary [0, 512)"),
    ([3, 4, 10 ** 30], f"input_ids[2] = {10 ** 30} is outside this model's vocabulary [0, 512)"),
    ([1, 2.5, 3], "input_ids[1] = 2.5 is not an integer token id"),
    ([1, 3.0], "input_ids[1] = 3.0 is not an integer token id"),
    ([True, 1], "input_ids[0] = True is not an integer token id"),
    ([1, "7"], "input_ids[1] = '7' is not an integer token id"),
    ([1, None], "input_ids[1] = None is not an integer token id"),
    ([1, [2]], "input_ids[1] = [2] is not an integer token id"),
])
def test_the_first_bad_id_is_named(ids, message):
    with pytest.raises(ValueError) as info:
        check_input_ids(ids, 512)
    assert str(info.value) == message


def test_top_logprobs_num_within_the_vocabulary():
    from sglang_pd.srt.disaggregation.prompt_guard import check_top_logprobs_num

    for good in (None, 0, 5, 512):
        check_top_logprobs_num(good, 512)
    for bad in (513, 10 ** 6, -1, 2.0, "5", True):
        with pytest.raises(ValueError, match=r"top_logprobs_num .* must be an integer in \[0, 512\]"):
            check_top_logprobs_num(bad, 512)
