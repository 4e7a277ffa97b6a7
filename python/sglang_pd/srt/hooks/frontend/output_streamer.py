"""Hook on SGLang's `SchedulerOutputStreamer`: our per-request decode fields are request-level keys."""

from __future__ import annotations

from sglang_pd.srt.metrics import FIELDS


def around_is_request_level_key(original, streamer, key):
    """decode_prefix_len / pages / bytes are emitted once per request, not per token."""
    return key in FIELDS or original(streamer, key)
