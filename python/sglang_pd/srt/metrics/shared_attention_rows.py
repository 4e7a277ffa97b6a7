"""The shared-prefix decode attention's metric rows, and the reasons a layer call falls back (their labels).

They live with the counters (srt/metrics) so pd_metrics, the one source of every counter, never imports
the attention package; srt/attention/stats.py feeds them.
"""

from __future__ import annotations

import enum


class AttentionFallback(str, enum.Enum):
    """Why a decode attention call went to the wrapped backend instead of the shared-prefix path."""

    SLIDING_WINDOW = "sliding_window"    # the layer attends a sliding window
    CROSS_ATTENTION = "cross_attention"  # encoder-decoder cross attention layer
    LOGIT_CAP = "logit_cap"              # the layer caps logits (tanh soft-cap)
    ENCODER_LENS = "encoder_lens"        # the batch carries encoder tokens before the decoder's
    SWA_KV_POOL = "swa_kv_pool"          # hybrid SWA KV pool: per-layer slot translation
    BEAM_SEARCH = "beam_search"          # beam-search member rows ride the batch past its rids (no request id)


def fallback_metric(reason: AttentionFallback) -> str:
    """The PDCounters name counting decode attention layer calls that fell back for `reason`."""
    return f"shared_attn_fallback_{reason.value}_total"


# name -> (kind, help); merged into pd_metrics.METRICS (attention/stats.py feeds them).
SHARED_ATTENTION_METRICS: dict[str, tuple[str, str]] = {
    "shared_attn_decode_steps_total": ("counter", "decode forwards planned by the shared-prefix attention backend"),
    "shared_attn_groups_last_step": (
        "gauge", "prefix groups (shared KV segments, nested ones included) in the latest decode step"),
    "shared_attn_groups_total": ("counter", "prefix groups summed over decode steps"),
    "shared_attn_grouped_requests_total": ("counter", "requests that read a shared segment, summed over decode steps"),
    "shared_attn_shared_tokens_total": ("counter", "KV tokens read once for a whole group, summed over steps (per layer)"),
    "shared_attn_kv_reads_saved_tokens_total": (
        "counter", "KV token reads saved against one read per request, summed over steps (per layer)"),
    "shared_attn_own_tokens_total": (
        "counter", "KV tokens of requests' own parts read in place from the pool, summed over steps (per layer)"),
    "shared_attn_segment_gathered_tokens_total": (
        "counter", "shared-segment KV tokens gathered from the pool (a segment not reused from the previous step)"),
    "shared_attn_extend_queries_total": (
        "counter", "extend query tokens attended with only their own queries (offset-causal; per layer call)"),
    **{fallback_metric(r): ("counter", f"decode attention layer calls served by the wrapped backend: {r.value}")
       for r in AttentionFallback},
}
