"""The rules for `decode_prefix_len`: the prompt tokens decode already holds and prefill skips.

Invariant (every request that reaches a transfer):

    0 <= decode_prefix_len <= prompt_len   and   decode_prefix_len % page_size == 0

so prefill sends exactly the pages past it, `ceil((prompt_len - decode_prefix_len) / page_size)`, and
never writes into a page decode's tree owns. Two checks of it, one per place the facts are known:

  `check_in_pool`    the wire schema (srt/wire/prefill_schemas.py), before the prompt is known: a number a
                     pool this size can hold, 0 <= decode_prefix_len <= max_kv_pages * page_size.
  `check_for_prompt` the whole invariant, where the prompt is known: decode admission
                     (srt/admission/decode_admission.py) on the tree's match before it locks it, and
                     prefill (srt/hooks/scheduling/prefill.py, at finalize_bootstrap) on what decode sent.

A value that breaks it on prefill can only come from a broken or hostile decode: prefill fails that
request through SGLang's failure path (reason recorded, decode told); on decode it is a tree bug,
and admission falls back to SGLang's own path. Both functions are pure and raise ValueError only.
"""

from __future__ import annotations

from sglang_pd.srt.mem_cache.page_math import check_page_size


def check_in_pool(decode_prefix_len: int, max_kv_pages: int, page_size: int) -> None:
    """Raise ValueError unless 0 <= decode_prefix_len <= the pool's token capacity (max_kv_pages pages)."""
    check_page_size(page_size)
    max_len = max_kv_pages * page_size
    if not 0 <= decode_prefix_len <= max_len:
        raise ValueError(f"decode_prefix_len {decode_prefix_len} is outside [0, {max_len}]")


def check_for_prompt(decode_prefix_len: int, prompt_len: int, page_size: int) -> None:
    """Raise ValueError naming the broken part of the invariant (an int, >= 0, <= prompt_len, page-aligned)."""
    check_page_size(page_size)
    if not isinstance(decode_prefix_len, int) or isinstance(decode_prefix_len, bool):
        raise ValueError(f"decode_prefix_len must be an int, got {type(decode_prefix_len).__name__}")
    if decode_prefix_len < 0:
        raise ValueError(f"decode_prefix_len {decode_prefix_len} is negative")
    if decode_prefix_len > prompt_len:
        raise ValueError(f"decode_prefix_len {decode_prefix_len} exceeds the prompt length {prompt_len}")
    if decode_prefix_len % page_size:
        raise ValueError(f"decode_prefix_len {decode_prefix_len} is not aligned to page size {page_size}")
