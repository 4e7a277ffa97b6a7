"""Prometheus metrics of sglang_pd, exported on each server's own /metrics (`--enable-metrics`).

Created lazily in the scheduler process, after SGLang has set PROMETHEUS_MULTIPROC_DIR, so the HTTP
process's /metrics aggregates them with SGLang's own. Every metric is under the `sglang_pd:` prefix
and labelled by `role` (prefill/decode) and `transfer_backend`. The same numbers are in
GET /sglang_pd/stats (`counters`), which works without --enable-metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "sglang_pd:"

# name -> (kind, help). Kept in one table so README and tests can list them.
METRICS: dict[str, tuple[str, str]] = {
    "decode_prompt_tokens_total": ("counter", "prompt tokens of requests admitted by decode (real requests only)"),
    "decode_prefix_hit_tokens_total": ("counter", "prompt tokens reused from the decode radix tree (decode_prefix_len)"),
    "decode_pages_saved_total": ("counter", "KV pages not transferred thanks to decode reuse"),
    "kv_pages_transferred_total": ("counter", "KV pages asked of prefill (decode) / handed to the transport (prefill)"),
    "kv_bytes_transferred_total": ("counter", "bytes of those KV pages (pages x bytes per page over all layers)"),
    "evicted_tokens_total": ("counter", "tokens evicted from the radix tree"),
    "prefill_rejected_requests_total": ("counter", "requests prefill refused for a bad decode_prefix_len"),
    "resume_requests_total": ("counter", "retracted decode requests resumed through radix-aware resume"),
    "resume_backup_tokens_total": ("counter", "tokens a full restore would copy back for them (SGLang's resume)"),
    "resume_restored_tokens_total": ("counter", "tokens radix-aware resume copied back (the rest came from the tree)"),
    "admission_round_evictions_total": ("counter", "tree evictions done once per decode admission round"),
    "integrity_failures_total": ("counter", "check_integrity() runs that found a violated invariant"),
    "tree_locks_outstanding": ("gauge", "radix-tree locks taken and not yet released (lock ledger)"),
    # SLO-aware decode admission (srt/disaggregation/slo_controller.py)
    "decode_step_seconds_measured": ("gauge", "decode step time, launch to launch (EWMA of measured steps)"),
    "decode_step_seconds_predicted": ("gauge", "step time the learned model predicts for the batch just admitted"),
    "decode_admission_cap": ("gauge", "running requests the ITL target allows at the current mean length"),
    "decode_ttft_seconds_predicted": ("gauge", "predicted time to first token of the latest new request"),
    "early_rejected_requests_total": ("counter", "requests refused at the door for a predicted TTFT over target"),
    # Hostile peers (srt/disaggregation/handshake_gate.py, peer_auth.py, thread_watch.py)
    "handshake_messages_rejected_total": ("counter", "PD handshake messages / bootstrap requests dropped as malformed "
                                                     "or out of bounds before SGLang parsed them"),
    "peer_auth_refused_total": ("counter", "PD handshake messages / bootstrap requests or answers refused for a "
                                           "missing, wrong, stale or replayed auth tag"),
    "handshake_rooms_failed_total": ("counter", "rooms failed because a rejected message named them"),
    "unclaimed_rooms_expired_total": ("counter", "rooms whose transfer infos were dropped: no request claimed them"),
    "pd_threads_dead": ("gauge", "PD threads (bootstrap, status listener, transfer workers) found dead; /health "
                                 "fails while > 0"),
}


@dataclass
class PDCounters:
    """The process's counters (always kept) and, once bound, their Prometheus twins."""

    role: str = "unknown"
    backend: str = "unknown"
    values: dict[str, float] = field(default_factory=lambda: {name: 0 for name in METRICS})
    _prom: dict = field(default_factory=dict)

    def bind(self, role: str, backend: str) -> None:
        """Fix the labels and create the Prometheus objects (once per process)."""
        if self._prom:
            return
        from prometheus_client import Counter, Gauge

        self.role, self.backend = role, backend
        labels = ("role", "transfer_backend")
        for name, (kind, doc) in METRICS.items():
            if kind == "counter":
                metric = Counter(PREFIX + name.removesuffix("_total"), doc, labels)
            else:
                metric = Gauge(PREFIX + name, doc, labels, multiprocess_mode="livesum")
            self._prom[name] = metric.labels(role, backend)
            if kind == "counter" and self.values[name]:
                self._prom[name].inc(self.values[name])

    @property
    def bound(self) -> bool:
        """True once the Prometheus twins exist in this process."""
        return bool(self._prom)

    def add(self, name: str, amount: float) -> None:
        """Increase counter `name` by `amount` (>= 0)."""
        if amount < 0:
            raise ValueError(f"counter {name} cannot decrease (got {amount})")
        self.values[name] += amount
        if name in self._prom:
            self._prom[name].inc(amount)

    def set(self, name: str, value: float) -> None:
        """Set gauge `name`."""
        self.values[name] = value
        if name in self._prom:
            self._prom[name].set(value)

    def snapshot(self) -> dict:
        """JSON-able counter values with their labels."""
        return {"role": self.role, "transfer_backend": self.backend, **self.values}
