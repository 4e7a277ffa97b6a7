"""Hooks on SGLang's request structs (`managers/io_struct.py`, HTTP process): a request's parallel-sample
count is checked before SGLang expands the request into that many copies (prompt_guard.py)."""

from __future__ import annotations

from sglang_pd.srt.disaggregation.prompt_guard import check_parallel_samples
from sglang_pd.srt.state import current


def before_normalize_generate(obj):
    """`sampling_params.n` above SGLANG_PD_MAX_PARALLEL_SAMPLES (or not a positive integer) is refused here
    (ValueError: HTTP 400 naming it) instead of being copied n times."""
    check_parallel_samples(obj.sampling_params, current().settings.max_parallel_samples)
