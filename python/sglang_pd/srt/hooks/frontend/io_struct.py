"""Hooks on SGLang's request structs (`managers/io_struct.py`, HTTP process): a request's parallel-sample
count and stop regexes are checked before SGLang expands the request into that many copies, its rid
after SGLang normalised it (http/request_checks.py). A ValueError here is SGLang's HTTP 400."""

from __future__ import annotations

from sglang_pd.srt.http import (check_parallel_samples, check_request_ids, check_stop_regex,
                                                       num_prompts)
from sglang_pd.srt.state import current


def around_normalize_generate(original, obj):
    """Before: `sampling_params.n` above SGLANG_PD_MAX_PARALLEL_SAMPLES (or not a positive integer, or
    asking for more copies than that of a batch's prompts together) is refused instead of being copied, and a `stop_regex` that does not compile is named. After: a
    rid that is not a string (one per prompt for a batch) is named, before SGLang keys its table by it."""
    check_parallel_samples(obj.sampling_params, current().settings.max_parallel_samples,
                           num_prompts(obj.text, obj.input_ids))
    check_stop_regex(obj.sampling_params)
    result = original(obj)
    check_request_ids(obj.rid, obj.is_single)
    return result
