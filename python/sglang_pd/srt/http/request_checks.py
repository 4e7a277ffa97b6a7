"""A prompt's token ids checked against the model's vocabulary before anything runs on them.

SGLang 0.5.23 checks `token_ids_logprob` against the vocabulary but not a request's `input_ids`: one
id outside [0, vocab_size) reaches the embedding lookup in the scheduler, whose IndexError ends the
scheduler process and with it the server (every other request fails). In PD that is prefill's
scheduler (and decode's, for a request it prefills locally); any client that can reach the HTTP port
can do it with one request. The check runs in the HTTP process where SGLang validates the request's
length, so the request is answered with HTTP 400 naming the first bad id and the valid range and
nothing is queued. The same holds for `top_logprobs_num` (logprobs of the k most likely tokens): a k
above the vocabulary ends the scheduler at `torch.topk` ("selected index k out of range"), so it is
checked here too. Two more fields end or stall an upstream server from one request:
`logprob_start_len` below -1 (its "no prompt logprobs" value) fails an assertion in the scheduler's
logprob bookkeeping after the prefill forward, which ends it; `n` (parallel samples) is expanded into n
copies of the request in the HTTP process before any check, so n = 10**6 holds that process for
minutes (every other client's request and /health wait). `logprob_start_len` is checked beside the
ids; `n` before SGLang expands it, against an operator cap (SGLANG_PD_MAX_PARALLEL_SAMPLES, default
128, the ceiling OpenAI's API puts on n). Two bodies that SGLang answers with HTTP 500 (its handler
only turns ValueError into 400) get a 400 naming the field: a `stop_regex` that is not a valid regular
expression (SGLang's parser raises re.error) and a `rid` that is not a string for a single prompt (a
list: SGLang's request table raises TypeError on it). Read-only; no SGLang import.
"""

from __future__ import annotations

import re
from typing import Sequence


def check_input_ids(input_ids: Sequence, vocab_size: int) -> None:
    """Raise ValueError naming the first id that is not an integer in [0, vocab_size) (position and value)."""
    if not input_ids:
        return
    if set(map(type, input_ids)) == {int} and 0 <= min(input_ids) and max(input_ids) < vocab_size:
        return  # the common case, in C loops
    for pos, token_id in enumerate(input_ids):
        if type(token_id) is not int:
            raise ValueError(f"input_ids[{pos}] = {token_id!r} is not an integer token id")
        if not 0 <= token_id < vocab_size:
            raise ValueError(f"input_ids[{pos}] = {token_id} is outside this model's vocabulary [0, {vocab_size})")


def check_top_logprobs_num(top_logprobs_num, vocab_size: int) -> None:
    """Raise ValueError unless `top_logprobs_num` is None or an integer in [0, vocab_size] (naming it)."""
    if top_logprobs_num is None:
        return
    if type(top_logprobs_num) is not int or not 0 <= top_logprobs_num <= vocab_size:
        raise ValueError(f"top_logprobs_num {top_logprobs_num!r} must be an integer in [0, {vocab_size}] "
                         "(this model's vocabulary)")


def check_logprob_start_len(logprob_start_len) -> None:
    """Raise ValueError unless `logprob_start_len` is None or an integer >= -1 (-1: no prompt logprobs)."""
    if logprob_start_len is None:
        return
    if type(logprob_start_len) is not int or logprob_start_len < -1:
        raise ValueError(f"logprob_start_len {logprob_start_len!r} must be an integer >= -1 "
                         "(-1: no prompt logprobs)")


INT32_MAX = 2 ** 31 - 1


def check_sampling_limits(sampling_params, vocab_size: int) -> None:
    """Raise ValueError naming the field unless a request's `stop_token_ids` are token ids in
    [0, vocab_size) and its `top_k` and `min_new_tokens` fit the int32 tensors SGLang's scheduler puts
    them in. SGLang's own verify accepts these, then the scheduler raises on them and the server ends:
    a stop id outside the vocabulary indexes the min-new-tokens penalizer's logits mask, and a top_k or
    min_new_tokens above 2**31 - 1 overflows building the batch (every batch, prefill and decode)."""
    if not isinstance(sampling_params, dict):
        return  # SGLang's own parsing answers a malformed sampling_params
    stop_ids = sampling_params.get("stop_token_ids")
    for pos, token_id in enumerate(stop_ids if isinstance(stop_ids, (list, tuple, set)) else ()):
        if type(token_id) is not int or not 0 <= token_id < vocab_size:
            raise ValueError(f"sampling_params.stop_token_ids[{pos}] = {token_id!r:.40} must be a token id in "
                             f"[0, {vocab_size}) (this model's vocabulary)")
    for name in ("top_k", "min_new_tokens"):
        value = sampling_params.get(name)
        if type(value) is int and value > INT32_MAX:
            raise ValueError(f"sampling_params.{name} {value} is above {INT32_MAX}, the largest the scheduler "
                             "can hold")


def check_parallel_samples(sampling_params, cap: int, num_prompts: int = 1) -> None:
    """Raise ValueError unless every `n` in `sampling_params` (a dict, a list of dicts, or None, as the
    request carries it before SGLang normalises it) is absent or an integer in [1, cap], and, when any n
    is above 1, the copies SGLang makes of the request's `num_prompts` prompts (n each) number at most
    `cap` (a batch of 8,000 one-token prompts with n = 128 was a 32 KB body expanding to 1,024,000
    requests); naming it."""
    listed = isinstance(sampling_params, list)
    counts = []
    for params in sampling_params if listed else (sampling_params,):
        if not isinstance(params, dict) or "n" not in params:
            counts.append(1)
            continue  # SGLang's own parsing answers a malformed sampling_params
        n = params["n"]
        if type(n) is not int or not 1 <= n <= cap:
            raise ValueError(f"sampling_params.n {n!r} must be an integer in [1, {cap}] (parallel samples; "
                             "SGLANG_PD_MAX_PARALLEL_SAMPLES sets the cap)")
        counts.append(n)
    copies = sum(counts) if listed else counts[0] * max(num_prompts, 1)
    if max(counts, default=1) > 1 and copies > cap:
        raise ValueError(f"sampling_params.n asks for {copies} copies of this request's {max(num_prompts, 1)} "
                         f"prompt(s), more than {cap} (SGLANG_PD_MAX_PARALLEL_SAMPLES caps the parallel samples "
                         "of one request, all its prompts together)")


def num_prompts(text, input_ids) -> int:
    """Prompts a request carries before SGLang normalises it: a list of strings, or a list of token-id
    lists, is a batch; anything else counts as one (read-only)."""
    if isinstance(text, list):
        return len(text)
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        return len(input_ids)
    return 1


def check_stop_regex(sampling_params) -> None:
    """Raise ValueError unless every `stop_regex` in `sampling_params` (a dict, a list of dicts, or None,
    before SGLang normalises it) is absent, None, a string or a list of strings that each compile as a
    Python regular expression (what SGLang searches the output with), naming the first that does not."""
    for params in sampling_params if isinstance(sampling_params, list) else (sampling_params,):
        if not isinstance(params, dict) or params.get("stop_regex") is None:
            continue
        value = params["stop_regex"]
        patterns = [value] if isinstance(value, str) else value
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise ValueError(f"sampling_params.stop_regex {value!r:.80} must be a string or a list of strings")
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"sampling_params.stop_regex {pattern!r:.80} is not a valid regular expression: "
                                 f"{exc}") from None


def check_request_ids(rid, is_single: bool) -> None:
    """After SGLang normalised a request: raise ValueError unless `rid` is None, a string for a single
    prompt, or a list of strings for a batch (SGLang has checked the list's length), naming it."""
    if rid is None:
        return
    if is_single and not isinstance(rid, str):
        raise ValueError(f"rid {rid!r:.80} must be a string for a single prompt")
    if not is_single and not (isinstance(rid, list) and all(isinstance(r, str) for r in rid)):
        raise ValueError(f"rid {rid!r:.80} must be a list of strings, one per prompt, for a batch")
