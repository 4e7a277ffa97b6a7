"""A prompt's token ids against the vocabulary: in-range ids pass (also the empty prompt and the
boundaries), and the first id that is out of range, negative, fractional, boolean or not a number is
named with its position and the range."""

import pytest

from sglang_pd.srt.http import check_input_ids

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
    from sglang_pd.srt.http import check_top_logprobs_num

    for good in (None, 0, 5, 512):
        check_top_logprobs_num(good, 512)
    for bad in (513, 10 ** 6, -1, 2.0, "5", True):
        with pytest.raises(ValueError, match=r"top_logprobs_num .* must be an integer in \[0, 512\]"):
            check_top_logprobs_num(bad, 512)


def test_logprob_start_len_is_none_minus_one_or_a_position():
    from sglang_pd.srt.http import check_logprob_start_len

    for good in (None, -1, 0, 7, 10 ** 9):  # past the prompt: SGLang's own check answers that one
        check_logprob_start_len(good)
    for bad in (-2, -7, -(10 ** 9), 1.0, "3", True, [0]):
        with pytest.raises(ValueError, match=r"logprob_start_len .* must be an integer >= -1"):
            check_logprob_start_len(bad)


def test_parallel_samples_within_the_cap_pass_in_every_form_sglang_accepts():
    """sampling_params as a request carries it before SGLang normalises it: absent, one dict, a list of
    dicts (a batch); n absent or in [1, cap]; a malformed sampling_params is left to SGLang's parser."""
    from sglang_pd.srt.http import check_parallel_samples

    for params in (None, {}, {"temperature": 0.5}, {"n": 1}, {"n": 128}, [{"n": 4}, {"n": 4}], [], "garbage",
                   [None, {"n": 2}]):
        check_parallel_samples(params, 128)


@pytest.mark.parametrize("params, shown", [
    ({"n": 129}, "129"), ({"n": 10 ** 6}, "1000000"), ({"n": 0}, "0"), ({"n": -3}, "-3"), ({"n": 2.0}, "2.0"),
    ({"n": "4"}, "'4'"), ({"n": True}, "True"), ({"n": None}, "None"), ([{"n": 2}, {"n": 10 ** 6}], "1000000"),
])
def test_parallel_samples_above_the_cap_or_not_a_count_are_named(params, shown):
    from sglang_pd.srt.http import check_parallel_samples

    with pytest.raises(ValueError) as info:
        check_parallel_samples(params, 128)
    assert str(info.value).startswith(f"sampling_params.n {shown} must be an integer in [1, 128]")


def test_sglang_copies_a_request_n_times_which_is_what_the_cap_bounds():
    """The reason the check runs before SGLang's normalisation: SGLang's own GenerateReqInput expands one
    prompt into n copies there (so the cost of a request is linear in n before anything else looks)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_pd.srt.http import check_parallel_samples

    req = GenerateReqInput(input_ids=[5, 6, 7], sampling_params={"n": 64, "max_new_tokens": 2})
    check_parallel_samples(req.sampling_params, 128)
    req.normalize_batch_and_arguments()
    assert len(req.input_ids) == 64 and len(req.rid) == 64


def test_stop_regexes_that_compile_pass_and_the_first_that_does_not_is_named():
    """SGLang's own normaliser raises re.error on a bad pattern (its HTTP handler turns only ValueError
    into 400, so upstream answers 500); the check names the pattern first, in every form SGLang accepts."""
    import re

    from sglang.srt.sampling.sampling_params import SamplingParams

    from sglang_pd.srt.http import check_stop_regex

    with pytest.raises(re.error):
        SamplingParams(stop_regex="((").normalize(None)
    for params in (None, {}, {"stop_regex": None}, {"stop_regex": r"\d+$"}, {"stop_regex": ["a|b", "(x)"]},
                   [{"stop_regex": "ok"}, {}], "garbage"):
        check_stop_regex(params)
    for params, shown in (({"stop_regex": "(("}, "'(('"), ({"stop_regex": ["ok", "[a-"]}, "'[a-'"),
                          ([{}, {"stop_regex": "a**"}], "'a**'")):
        with pytest.raises(ValueError) as info:
            check_stop_regex(params)
        assert str(info.value).startswith(f"sampling_params.stop_regex {shown} is not a valid regular expression: ")
    for bad in (5, [1], ["a", None], {"a": 1}):
        with pytest.raises(ValueError, match="must be a string or a list of strings"):
            check_stop_regex({"stop_regex": bad})


def test_a_rid_that_is_not_a_string_is_named_after_sglang_normalised_the_request():
    """SGLang's normaliser keeps a list rid on a single prompt (its request table then raises TypeError:
    upstream answers 500); a batch takes one string per prompt (n > 1 makes a single prompt a batch)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_pd.srt.http import check_request_ids

    def normalised(n=1, **fields):
        req = GenerateReqInput(sampling_params={"max_new_tokens": 2, "n": n}, **fields)
        req.normalize_batch_and_arguments()
        return req

    bad = normalised(input_ids=[5, 6, 7], rid=["a", "b"])
    assert bad.is_single and bad.rid == ["a", "b"]
    with pytest.raises(TypeError):
        hash(bad.rid)  # what SGLang's table does with it next
    with pytest.raises(ValueError, match=r"rid \['a', 'b'\] must be a string for a single prompt"):
        check_request_ids(bad.rid, bad.is_single)
    for good in (normalised(input_ids=[5, 6, 7]), normalised(input_ids=[5, 6], rid="r1"),
                 normalised(input_ids=[[5, 6], [7]], rid=["r1", "r2"]), normalised(n=2, input_ids=[5])):
        check_request_ids(good.rid, good.is_single)
    with pytest.raises(ValueError, match="must be a list of strings, one per prompt, for a batch"):
        check_request_ids([1, 2], False)


def test_a_batch_with_parallel_samples_counts_every_copy_sglang_makes():
    """n x prompts is what SGLang copies: a batch of 8,000 one-token prompts with n = 128 was a 32 KB body
    expanding to 1,024,000 requests. With n above 1 the copies of all prompts together are capped; a batch
    with n = 1 is not (its body carries every prompt)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_pd.srt.http import check_parallel_samples, num_prompts

    req = GenerateReqInput(input_ids=[[5], [6], [7]], sampling_params={"n": 4, "max_new_tokens": 2})
    assert num_prompts(req.text, req.input_ids) == 3
    check_parallel_samples(req.sampling_params, 12, num_prompts(req.text, req.input_ids))
    req.normalize_batch_and_arguments()
    assert len(req.rid) == 12  # what the cap counts: 3 prompts x 4
    with pytest.raises(ValueError, match=r"asks for 1024000 copies of this request's 8000 prompt\(s\), more than 128"):
        check_parallel_samples({"n": 128}, 128, num_prompts(None, [[0]] * 8000))
    with pytest.raises(ValueError, match="asks for 130 copies"):
        check_parallel_samples([{"n": 65}, {"n": 65}], 128, 2)
    check_parallel_samples({"n": 1}, 128, num_prompts(["a"] * 8000, None))  # no copies beyond the body's
    assert num_prompts("a", None) == 1 and num_prompts(None, [1, 2, 3]) == 1 and num_prompts(None, None) == 1


@pytest.mark.parametrize("params, message", [
    ({"stop_token_ids": [5, 100000000], "min_new_tokens": 1}, r"stop_token_ids\[1\] = 100000000 must be a token id"),
    ({"stop_token_ids": [-1]}, r"stop_token_ids\[0\] = -1 must be a token id in \[0, 513\)"),
    ({"stop_token_ids": [2 ** 70]}, r"stop_token_ids\[0\] = 1180591620717411303424 must be"),
    ({"stop_token_ids": [True]}, r"stop_token_ids\[0\] = True must be"),
    ({"top_k": 2 ** 40}, r"top_k 1099511627776 is above 2147483647"),
    ({"max_new_tokens": None, "min_new_tokens": 2 ** 40}, r"min_new_tokens 1099511627776 is above 2147483647"),
])
def test_sampling_fields_that_would_end_the_scheduler_are_named(params, message):
    """SGLang's verify accepts these and the scheduler then raises (the server ends): a stop id outside the
    vocabulary indexes the min-new-tokens penalizer's mask; top_k and min_new_tokens go into int32 tensors."""
    from sglang_pd.srt.http import check_sampling_limits

    with pytest.raises(ValueError, match=message):
        check_sampling_limits(params, 513)


def test_sampling_fields_in_range_pass():
    from sglang_pd.srt.http import check_sampling_limits

    for params in (None, "garbage", {}, {"stop_token_ids": [0, 512], "min_new_tokens": 3}, {"top_k": -1},
                   {"top_k": 2 ** 31 - 1, "min_new_tokens": 2 ** 31 - 1}, {"stop_token_ids": None}):
        check_sampling_limits(params, 513)

