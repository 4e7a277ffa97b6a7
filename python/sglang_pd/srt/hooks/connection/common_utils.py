"""Hook on SGLang's `FastQueue` (disaggregation/common/utils.py): which room a transfer worker serves."""

from __future__ import annotations

from sglang_pd.srt.state import current


def after_queue_get(chunk, queue):
    """Remember which room this transfer-worker thread is serving (for NIXL page counts and stalls)."""
    room = getattr(chunk, "room", None)
    if room is not None:
        current().transfer_watch.on_chunk(int(room))
    return chunk
