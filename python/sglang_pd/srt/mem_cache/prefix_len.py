"""Prefill-side validation of what a decode peer asked for, before any KV is sent.

A decode_prefix_len that is negative, not page-aligned or longer than the prompt can only come from
a broken or hostile decode server. The request is failed through SGLang's own failure path
(`conclude_failure`: reason recorded, room marked failed, decode told), so the client gets a clear
error, decode releases its lock and pages, and every other request keeps being served.
"""

from __future__ import annotations

from typing import NamedTuple

from sglang_pd.srt.mem_cache.page_math import check_decode_prefix_len


class PrefixVerdict(NamedTuple):
    """Outcome of validating one request's decode_prefix_len."""

    ok: bool
    reason: str | None


def validate_decode_prefix_len(decode_prefix_len, prompt_len: int, page_size: int) -> PrefixVerdict:
    """Accept or reject (with a reason naming the value and the rule) a decode_prefix_len."""
    try:
        check_decode_prefix_len(decode_prefix_len, prompt_len, page_size)
    except ValueError as exc:
        return PrefixVerdict(False, f"sglang_pd: rejected by prefill: {exc}")
    return PrefixVerdict(True, None)
