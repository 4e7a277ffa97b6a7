"""srt/metrics - every sglang_pd counter, in one place (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.metrics.pd_metrics import PDCounters
from sglang_pd.srt.metrics.request_fields import (FIELDS, PATH_DECODE_LOCAL, attach_request_fields, recorded_decode_prefix_len,
                                                  unwrap_request_fields)
from sglang_pd.srt.metrics.scrape_refresh import RefreshBeforeScrape
from sglang_pd.srt.metrics.shared_attention_rows import AttentionFallback, SHARED_ATTENTION_METRICS, fallback_metric
from sglang_pd.srt.metrics.single_flight import SingleFlight

__all__ = [
    "AttentionFallback", "FIELDS", "PATH_DECODE_LOCAL", "PDCounters", "RefreshBeforeScrape",
    "SHARED_ATTENTION_METRICS", "SingleFlight", "attach_request_fields", "fallback_metric", "recorded_decode_prefix_len",
    "unwrap_request_fields"]
