"""A prompt's token ids checked against the model's vocabulary before anything runs on them.

SGLang 0.5.23 checks `token_ids_logprob` against the vocabulary but not a request's `input_ids`: one
id outside [0, vocab_size) reaches the embedding lookup in the scheduler, whose IndexError ends the
scheduler process and with it the server (every other request fails). In PD that is prefill's
scheduler (and decode's, for a request it prefills locally); any client that can reach the HTTP port
can do it with one request. The check runs in the HTTP process where SGLang validates the request's
length, so the request is answered with HTTP 400 naming the first bad id and the valid range and
nothing is queued. The same holds for `top_logprobs_num` (logprobs of the k most likely tokens): a k
above the vocabulary ends the scheduler at `torch.topk` ("selected index k out of range"), so it is
checked here too. Read-only; no SGLang import.
"""

from __future__ import annotations

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
