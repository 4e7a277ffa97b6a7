"""What the shared-prefix decode attention did: per-step grouping figures and fallbacks by reason.

Every figure is a PDCounters value (one source: Prometheus and /sglang_pd/stats both read it); this
object only names them, feeds them and keeps the latest step's summary for /sglang_pd/stats.
Scheduler thread only.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from sglang_pd.srt.attention.prefix_groups import PrefixGrouping


class FallbackReason(str, enum.Enum):
    """Why a decode attention call went to the wrapped backend instead of the shared-prefix path."""

    SLIDING_WINDOW = "sliding_window"    # the layer attends a sliding window
    CROSS_ATTENTION = "cross_attention"  # encoder-decoder cross attention layer
    LOGIT_CAP = "logit_cap"              # the layer caps logits (tanh soft-cap)
    ENCODER_LENS = "encoder_lens"        # the batch carries encoder tokens before the decoder's
    SWA_KV_POOL = "swa_kv_pool"          # hybrid SWA KV pool: per-layer slot translation
    BEAM_SEARCH = "beam_search"          # beam-search member rows ride the batch past its rids (no request id)


def fallback_metric(reason: FallbackReason) -> str:
    """The PDCounters name counting decode attention layer calls that fell back for `reason`."""
    return f"shared_attn_fallback_{reason.value}_total"


# name -> (kind, help); merged into pd_metrics.METRICS.
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
       for r in FallbackReason},
}


class StepSummary(NamedTuple):
    """The grouping of one decode step and where its KV came from."""

    batch_size: int
    num_groups: int
    num_grouped_requests: int
    num_shared_tokens: int
    num_reads_saved: int
    num_own_tokens: int
    num_segment_gathered_tokens: int


class SharedAttentionStats:
    """Feeds the shared-attention counters; `counters` is the process's PDCounters."""

    def __init__(self, counters):
        self.counters = counters
        self.backend: str | None = None  # set when this process created the backend
        self.kernel: dict | None = None  # how the own-part kernel was built, when this process has the backend
        self.min_reads_saved: int | None = None  # the backend's grouping threshold (saved reads per layer)
        self.last_step: StepSummary | None = None

    def on_backend_created(self, name: str, kernel: dict | None = None, min_reads_saved: int | None = None) -> None:
        """The attention backend `name` serves this process, its own-part kernel built as `kernel`
        describes, grouping runs that save at least `min_reads_saved` token reads per layer (mutates)."""
        self.backend = name
        self.kernel = kernel
        self.min_reads_saved = min_reads_saved

    def on_step(self, grouping: PrefixGrouping, plan) -> StepSummary:
        """One decode forward was planned with `grouping` into `plan` (a shared_prefix_attention
        DecodePlan). Mutates the counters."""
        step = StepSummary(len(grouping.seq_lens), grouping.num_groups, grouping.num_grouped_requests,
                           grouping.num_shared_tokens, grouping.num_reads_saved, plan.num_own_tokens,
                           plan.num_gathered_segment_tokens)
        add = self.counters.add
        add("shared_attn_decode_steps_total", 1)
        add("shared_attn_groups_total", step.num_groups)
        add("shared_attn_grouped_requests_total", step.num_grouped_requests)
        add("shared_attn_shared_tokens_total", step.num_shared_tokens)
        add("shared_attn_kv_reads_saved_tokens_total", step.num_reads_saved)
        add("shared_attn_own_tokens_total", step.num_own_tokens)
        add("shared_attn_segment_gathered_tokens_total", step.num_segment_gathered_tokens)
        self.counters.set("shared_attn_groups_last_step", step.num_groups)
        self.last_step = step
        return step

    def on_extend(self, num_queries: int) -> None:
        """One extend layer call attended its `num_queries` new tokens offset-causally (mutates the counters)."""
        self.counters.add("shared_attn_extend_queries_total", num_queries)

    def on_fallback(self, reason: FallbackReason) -> None:
        """One decode attention layer call went to the wrapped backend (mutates the counters)."""
        self.counters.add(fallback_metric(reason), 1)

    def snapshot(self) -> dict:
        """JSON-able view for /sglang_pd/stats (read-only)."""
        values = self.counters.values
        return {
            "backend": self.backend,
            "last_step": None if self.last_step is None else self.last_step._asdict(),
            "fallback_layer_calls": {r.value: values[fallback_metric(r)] for r in FallbackReason},
            "kernel": self.kernel,
            "min_reads_saved": self.min_reads_saved,
            **{name: values[name] for name in SHARED_ATTENTION_METRICS if not name.startswith("shared_attn_fallback")},
        }
