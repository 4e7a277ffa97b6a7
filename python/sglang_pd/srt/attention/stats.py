"""What the shared-prefix decode attention did: per-step grouping figures and fallbacks by reason.

Every figure is a PDCounters value (one source: Prometheus and /sglang_pd/stats both read it); this
object only names them, feeds them and keeps the latest step's summary for /sglang_pd/stats.
Scheduler thread only.
"""

from __future__ import annotations

from typing import NamedTuple

from sglang_pd.srt.attention.prefix_groups import PrefixGrouping
from sglang_pd.srt.metrics import SHARED_ATTENTION_METRICS, AttentionFallback, fallback_metric


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

    def on_fallback(self, reason: AttentionFallback) -> None:
        """One decode attention layer call went to the wrapped backend (mutates the counters)."""
        self.counters.add(fallback_metric(reason), 1)

    def snapshot(self) -> dict:
        """JSON-able view for /sglang_pd/stats (read-only)."""
        values = self.counters.values
        return {
            "backend": self.backend,
            "last_step": None if self.last_step is None else self.last_step._asdict(),
            "fallback_layer_calls": {r.value: values[fallback_metric(r)] for r in AttentionFallback},
            "kernel": self.kernel,
            "min_reads_saved": self.min_reads_saved,
            **{name: values[name] for name in SHARED_ATTENTION_METRICS if not name.startswith("shared_attn_fallback")},
        }
