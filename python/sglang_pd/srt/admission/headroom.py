"""Decode headroom with the running requests a mixed local extend holds counted as running.

From a mixed step (a local extend run inside a decode step, srt/local_prefill/queue.py `mixed_with`)
until its join (one scheduler iteration in the normal loop, two in the overlap loop) SGLang's
`running_batch` is empty, and its admission runs in between: counted from running_batch alone, the
budget reserves no decode headroom for those requests and no room for the largest one to finish. These
are SGLang's own figures (`DecodePreallocQueue._need_space_for_single_req`, the retractable tokens its
`pop_preallocated` sums) over the running requests plus the mixed ones. Pure.
"""

from __future__ import annotations

from typing import Any, Iterable

from sglang_pd.srt.mem_cache import request_kv_len


def retractable_tokens(reqs: Iterable[Any]) -> int:
    """KV tokens a retraction of `reqs` would free (prompt + output each), as SGLang counts running_batch's."""
    return sum(request_kv_len(r) for r in reqs)


def need_space_for_single_req(running_reqs: Iterable[Any], retractable: int, max_new_tokens_cap: int) -> int:
    """Tokens the largest running request may still need to finish (prompt + max_new_tokens capped at
    `max_new_tokens_cap`, SGLang's CLIP_MAX_NEW_TOKEN), less what can be retracted (`retractable`)."""
    return max(min(r.sampling_params.max_new_tokens, max_new_tokens_cap) + len(r.origin_input_ids)
               for r in running_reqs) - retractable
