"""The one source of every sglang_pd counter: `PDCounters`, exported on /metrics and in /sglang_pd/stats.

Every logic class counts into the PDCounters it was handed (srt/state.py builds one per process);
their `snapshot()` views read it back, so nothing is counted twice. Prometheus objects are created
lazily in the scheduler process, after SGLang has set PROMETHEUS_MULTIPROC_DIR, so the HTTP
process's /metrics aggregates them with SGLang's own (start servers with `--enable-metrics`). Every
metric is under the `sglang_pd:` prefix and labelled by `role` (prefill/decode) and `transfer_backend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pd.srt.metrics.shared_attention_rows import SHARED_ATTENTION_METRICS

PREFIX = "sglang_pd:"

# name -> (kind, help). One table: README, tests and the stats views list from it.
METRICS: dict[str, tuple[str, str]] = {
    # decode admission (srt/admission/decode_admission.py)
    "decode_prompt_tokens_total": ("counter", "prompt tokens of requests decode admitted, once each, handed to "
                                   "transfer or served by decode-local prefill (real requests only)"),
    "decode_prefix_hit_tokens_total": ("counter", "prompt tokens reused from the decode radix tree (decode_prefix_len)"),
    "decode_pages_saved_total": ("counter", "KV pages not transferred thanks to decode reuse"),
    "decode_admitted_requests_total": ("counter", "admission plans made by decode (warmup and health checks included)"),
    "decode_tree_skipped_requests_total": ("counter", "warmup / health-check requests admitted without touching the tree"),
    "decode_pages_planned_total": ("counter", "KV pages decode asked of prefill for those requests"),
    "decode_handoff_mismatches_total": ("counter", "transfer hand-offs that disagreed with their admission plan"),
    "decode_replans_total": ("counter", "requests admitted again before any hand-off (an earlier attempt was refused)"),
    "decode_stale_locks_released_total": ("counter", "locks of refused admission attempts released before the retry"),
    # transfer (both sides)
    "kv_pages_transferred_total": ("counter", "KV pages asked of prefill (decode) / handed to the transport (prefill)"),
    "kv_bytes_transferred_total": ("counter", "bytes of those KV pages (pages x bytes per page over all layers)"),
    # prefill (srt/transfer/prefill_log.py, transfer/watch.py)
    "prefill_requests_total": ("counter", "requests whose decode_prefix_len reached prefill"),
    "prefill_prompt_tokens_total": ("counter", "prompt tokens of those requests"),
    "prefill_decode_prefix_tokens_total": ("counter", "decode_prefix_len tokens prefill was told to skip"),
    "prefill_pages_planned_total": ("counter", "KV pages prefill planned to send past decode_prefix_len"),
    "prefill_pages_sent_unknown_room_total": ("counter", "KV pages sent for a room prefill has no record of"),
    "prefill_rejected_requests_total": ("counter", "requests prefill refused for a bad decode_prefix_len or transfer info"),
    "prefill_computed_tokens_total": ("counter", "prompt tokens prefill's model computed (its extend forwards)"),
    # room decline: decode tells prefill to drop a room (srt/wire/room_decline.py), prefill side
    "prefill_declined_requests_total": ("counter", "requests whose prefill half decode declined: answered without a transfer"),
    "prefill_declined_computed_tokens_total": ("counter", "prompt tokens prefill had computed for requests decode then declined"),
    "prefill_decline_tombstones_total": ("counter", "declines that reached prefill before the request did (kept until it arrives)"),
    "prefill_declines_expired_total": ("counter", "declines dropped unused (their prefill half never came within the TTL)"),
    "prefill_declines_malformed_total": ("counter", "messages carrying the decline marker that prefill could not read (dropped)"),
    # decode-local prefill (srt/local_prefill/queue.py), decode side
    "local_prefill_requests_total": ("counter", "requests decode computed itself (decode-local prefill; prefill declined)"),
    "local_prefill_tokens_total": ("counter", "prompt tokens decode-local prefill computed (local extend forwards)"),
    "local_prefill_balanced_total": (
        "counter", "local requests past the threshold taken because prefill's backlog was larger (the balance rule)"),
    "local_prefill_extends_total": ("counter", "local extend forwards run on decode"),
    "local_prefill_mixed_extends_total": (
        "counter", "local extends run inside a decode step (one mixed forward with the running requests)"),
    "local_prefill_aborted_total": ("counter", "local-prefill requests aborted before their extend (lock and pages released)"),
    "local_prefill_failed_total": ("counter", "local-prefill requests failed with their extend (answered 500, released)"),
    "local_prefill_deferred_steps_total": ("counter", "scheduler steps where queued local prefills waited (decode step first, or ITL target)"),
    "local_prefill_fallback_input_logprobs_total": ("counter", "would-be local requests sent to prefill: they ask for prompt logprobs"),
    "local_prefill_fallback_full_prefix_hit_total": ("counter", "would-be local requests sent to prefill: decode holds the whole prompt, nothing to extend"),
    "local_prefill_fallback_unsupported_request_total": ("counter", "would-be local requests sent to prefill: a feature the local extend does not run"),
    "local_prefill_fallback_decline_unsent_total": ("counter", "would-be local requests sent to prefill: the decline could not be sent"),
    "local_prefill_retracted_total": ("counter", "local requests whose extend a retract-mode pause took before they joined (SGLang released and re-bootstraps them)"),
    "local_prefill_rebootstrap_rooms_total": ("counter", "locally served requests a retract pause sent back to prefill, each under a new bootstrap room (prefill refuses the declined one)"),
    "local_prefill_fallback_duplicate_rid_total": ("counter", "would-be local requests sent to prefill: another request under their rid was local on this decode"),
    "local_prefill_queued": ("gauge", "requests waiting for their local extend on decode"),
    "mooncake_split_batches_total": ("counter", "mooncake transfer batches over the descriptor limit, sent in parts"),
    "nixl_pages_total": ("counter", "KV pages NIXL itself was asked to move"),
    "nixl_bytes_total": ("counter", "bytes of those pages"),
    "nixl_stalls_total": ("counter", "NIXL transfers cancelled and failed for exceeding SGLANG_PD_NIXL_STALL_TIMEOUT_S"),
    "nixl_uncancellable_stalls_total": ("counter", "stalled NIXL transfers NIXL could not cancel (their room keeps waiting)"),
    # radix tree and lock ledger (srt/mem_cache/)
    "evicted_tokens_total": ("counter", "tokens evicted from the radix tree"),
    "tree_locks_total": ("counter", "radix-tree locks taken (lock ledger)"),
    "tree_lock_releases_total": ("counter", "radix-tree locks released (each at most once)"),
    "tree_lock_double_releases_total": ("counter", "second releases of a lock: refused before they reach the tree"),
    "tree_lock_unknown_releases_total": ("counter", "releases of a lock the ledger never recorded (passed through)"),
    "tree_lock_refused_transitions_total": ("counter", "lock state changes the lifecycle table does not allow"),
    "tree_locks_outstanding": ("gauge", "radix-tree locks taken and not yet released (lock ledger)"),
    "integrity_checks_total": ("counter", "check_integrity() runs (before /metrics scrapes, at most one a second, and every /sglang_pd/stats call; concurrent callers share one)"),
    "integrity_failures_total": ("counter", "check_integrity() runs that found a violated invariant"),
    # retraction and admission rounds (radix_resume.py, admission/round.py)
    "decode_retractions_total": ("counter", "running decode requests retracted under memory pressure"),
    "resume_requests_total": ("counter", "retracted decode requests resumed through radix-aware resume"),
    "resume_backup_tokens_total": ("counter", "tokens a full restore would copy back for them (SGLang's resume)"),
    "resume_restored_tokens_total": ("counter", "tokens radix-aware resume copied back (the rest came from the tree)"),
    "admission_rounds_total": ("counter", "decode admission rounds planned"),
    "admission_round_planned_requests_total": ("counter", "requests matched and locked by admission rounds"),
    "admission_round_max_size": ("gauge", "largest admission round so far (requests)"),
    "admission_round_released_unused_total": ("counter", "planned locks SGLang's loop did not take, released at round close"),
    "admission_round_evictions_total": ("counter", "tree evictions done once per decode admission round"),
    "admission_round_duplicate_rids_total": ("counter", "admission-round candidates whose rid an earlier candidate of the round had (each keeps its own lock)"),
    # SLO-aware decode admission (srt/slo/controller.py)
    "decode_step_seconds_measured": ("gauge", "decode step time, launch to launch (EWMA of measured steps)"),
    "decode_step_seconds_predicted": ("gauge", "step time the learned model predicts for the batch just admitted (local-prefill tokens included)"),
    "decode_admission_cap": ("gauge", "running requests the ITL target allows at the current mean length"),
    "decode_admission_deferred_steps_total": ("counter", "decode steps where the ITL target held waiting requests back"),
    "decode_ttft_seconds_predicted": ("gauge", "predicted time to first token of the latest new request"),
    "early_rejected_requests_total": ("counter", "requests refused at the door for a predicted TTFT over target"),
    "early_rejection_probes_total": ("counter", "requests let through as probes while the TTFT predictor said refuse"),
    "early_rejection_declines_total": ("counter", "refused requests whose prefill half decode declined (answered at once)"),
    "early_rejection_nothing_ahead_total": ("counter", "requests let through although over target: nothing was ahead of them (a refusal cannot shorten their own prefill)"),
    "early_rejection_unrefusable_total": ("counter", "requests let through although over target: their prefill is not known yet, so could not be told"),
    # Hostile peers (srt/handshake/gate.py, peer_auth.py, thread_watch.py)
    "handshake_messages_rejected_total": ("counter", "PD handshake messages / bootstrap requests dropped as malformed "
                                                     "or out of bounds before SGLang parsed them"),
    "peer_auth_refused_total": ("counter", "PD handshake messages / bootstrap requests or answers refused for a "
                                           "missing, wrong, stale or replayed auth tag, or one stamped before the "
                                           "process started"),
    "peer_source_refused_total": ("counter", "PD handshake messages / bootstrap requests refused unread because no "
                                             "peer secret is configured and their source address is not this host's "
                                             "(SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS)"),
    "bootstrap_addresses_refused_total": ("counter", "bootstrap requests not sent (a 403 in their place): with a peer "
                                                     "secret, their address is not in SGLANG_PD_BOOTSTRAP_ADDRESSES "
                                                     "nor prefill's own bootstrap server"),
    "bootstrap_route_moves_refused_total": ("counter", "PUT /route refused (409): without a peer secret, a prefill "
                                                       "rank's first registration stands for the bootstrap server's "
                                                       "lifetime"),
    "handshake_rooms_failed_total": ("counter", "rooms failed because a rejected message named them"),
    "handshake_peers_forgotten_total": ("counter", "peer registrations forgotten to make room for a new peer in a "
                                                   "full registration table (unused longest, no room naming them)"),
    "decode_duplicate_rooms_refused_total": ("counter", "decode requests refused because another request on "
                                             "this decode already holds their bootstrap room"),
    "prompt_digest_mismatches_total": ("counter", "prefill requests refused because their room's transfer info "
                                       "was sent for a different prompt (two requests share one room)"),
    "kv_digests_sent_total": ("counter", "prefill: rooms whose Success status carried a digest of the KV sent "
                              "(SGLANG_PD_KV_DIGEST)"),
    "kv_digests_checked_total": ("counter", "decode: transferred requests whose KV matched prefill's digest before use"),
    "kv_digest_mismatches_total": ("counter", "decode: transferred requests failed because their KV did not match "
                                   "prefill's digest (pages freed, never cached)"),
    "kv_digest_seconds_total": ("counter", "seconds this scheduler spent computing KV digests (prefill: of what it "
                                "sent; decode: of what it received)"),
    "kv_digests_missing_total": ("counter", "decode: transferred requests failed because no KV digest arrived while "
                                 "SGLANG_PD_KV_DIGEST is on"),
    "unclaimed_rooms_expired_total": ("counter", "rooms whose transfer infos were dropped: no request claimed them"),
    "late_transfer_infos_refused_total": ("counter", "decode transfer infos refused: prefill's own request for the "
                                                     "room had already failed (decode told at once)"),
    "transfer_infos_out_of_pool_total": ("counter", "decode transfer infos refused: a destination KV page, aux or "
                                                    "state index beyond the pools the decode registered (its room "
                                                    "failed)"),
    "prefill_failures_told_total": ("counter", "prefill requests that failed after their decode's transfer info came "
                                               "(aborted on prefill before or during their transfer) whose decode "
                                               "prefill told, at once or once the transfer's writes settled (SGLang "
                                               "tells it only of a failed transfer)"),
    "prefill_failure_tells_held_total": ("counter", "Failed statuses for a decode (a failed request's at its clear, "
                                                    "or a room a rejected message failed) held because a transfer "
                                                    "worker's writes into that decode's pages had not settled (sent "
                                                    "once they did)"),
    "prefill_failure_tells_dropped_total": ("counter", "held failure statuses never sent: the room's writes did not "
                                                       "settle within the room TTL, or a new request took the room "
                                                       "(that decode ends at its own waiting timeout)"),
    "prefill_waiting_aborts_cleared_total": ("counter", "prefill requests aborted in the waiting queue whose sender "
                                                        "prefill cleared (SGLang leaves it: decode untold, room kept)"),
    "prefill_sender_clears_total": ("counter", "prefill request senders SGLang cleared (a request's end on prefill)"),
    "clears_waited_for_bootstrap_total": ("counter", "prefill request clears that waited for the bootstrap thread "
                                                     "to finish handling a message (SGLang's thread died when a "
                                                     "clear landed inside it)"),
    "clear_bootstrap_wait_timeouts_total": ("counter", "prefill request clears that waited the 2 s maximum for the "
                                                       "bootstrap thread and ran anyway (logged)"),
    "room_pops_waited_for_bootstrap_total": ("counter", "rooms a prefill transfer worker removed from SGLang's "
                                                        "transfer infos after waiting for the bootstrap thread to "
                                                        "finish handling a message (same race as a clear's)"),
    "room_pop_bootstrap_wait_timeouts_total": ("counter", "such removals that waited the 2 s maximum and ran anyway "
                                                          "(logged)"),
    "pd_threads_dead": ("gauge", "PD threads (bootstrap, status listener, transfer workers) found dead; /health "
                                 "fails while > 0"),
    # PD scheduler waits (srt/threads/idle_wait.py)
    "pd_idle_waits_total": ("counter", "sleeps of a PD scheduler that had transfers or handshakes in flight and nothing "
                                       "to run (SGLANG_PD_IDLE_WAIT_US; upstream spins)"),
    "pd_idle_wait_seconds_total": ("counter", "seconds those sleeps took"),
    # prefill's transfer workers below the schedulers (srt/threads/worker_priority.py)
    "pd_transfer_workers_lowered_total": ("counter", "transfer worker threads started at SGLANG_PD_TRANSFER_WORKER_NICE "
                                                     "(or the lower priority they already had)"),
    "pd_transfer_worker_nice_errors_total": ("counter", "transfer worker threads that could not be lowered (logged; "
                                                        "they keep their priority)"),
    # helper threads without wake-up preemption (srt/threads/helper_threads.py)
    "pd_helper_threads_batched_total": ("counter", "threads of this process switched to SCHED_BATCH "
                                                   "(SGLANG_PD_HELPER_THREADS_BATCH)"),
    "pd_helper_thread_policy_errors_total": ("counter", "threads that could not be switched to SCHED_BATCH (logged; "
                                                        "they keep their policy)"),
    # shared-prefix decode attention (srt/hooks/attention_backend.py; names in shared_attention_rows.py)
    **SHARED_ATTENTION_METRICS,
}

# name -> (help, extra label): counters with one more label than role / transfer_backend.
LABELLED_COUNTERS: dict[str, tuple[str, str]] = {
    "hook_errors_total": ("exceptions a hook caught to keep SGLang serving (each one also logged)", "hook"),
    "transfer_worker_errors_total": ("exceptions prefill's mooncake transfer worker raised on a room: the room was "
                                     "cleared / concluded / failed (decode told), the worker kept "
                                     "(transfer/worker_recovery.py; each one also logged)", "outcome"),
}


@dataclass
class PDCounters:
    """The process's counters (always kept) and, once bound, their Prometheus twins."""

    role: str = "unknown"
    backend: str = "unknown"
    values: dict[str, float] = field(default_factory=lambda: {name: 0 for name in METRICS})
    labelled: dict[str, dict[str, float]] = field(default_factory=lambda: {name: {} for name in LABELLED_COUNTERS})
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
            elif kind == "gauge":
                self._prom[name].set(self.values[name])
        for name, (doc, label) in LABELLED_COUNTERS.items():
            metric = Counter(PREFIX + name.removesuffix("_total"), doc, (*labels, label))
            self._prom[name] = metric
            for value, amount in self.labelled[name].items():
                metric.labels(role, backend, value).inc(amount)

    @property
    def bound(self) -> bool:
        """True once the Prometheus twins exist in this process."""
        return bool(self._prom)

    def add(self, name: str, amount: float = 1) -> None:
        """Increase counter `name` by `amount` (>= 0); raises KeyError for a name not in METRICS."""
        if amount < 0:
            raise ValueError(f"counter {name} cannot decrease (got {amount})")
        self.values[name] += amount
        if name in self._prom:
            self._prom[name].inc(amount)

    def add_labelled(self, name: str, label_value: str, amount: float = 1) -> None:
        """Increase labelled counter `name` for `label_value` by `amount` (>= 0)."""
        if amount < 0:
            raise ValueError(f"counter {name} cannot decrease (got {amount})")
        values = self.labelled[name]
        values[label_value] = values.get(label_value, 0) + amount
        if name in self._prom:
            self._prom[name].labels(self.role, self.backend, label_value).inc(amount)

    def set(self, name: str, value: float) -> None:
        """Set gauge `name`."""
        if name not in self.values:
            raise KeyError(name)
        self.values[name] = value
        if name in self._prom:
            self._prom[name].set(value)

    def get(self, name: str) -> float:
        """Current value of `name` (read-only)."""
        return self.values[name]

    def snapshot(self) -> dict:
        """JSON-able counter values with their labels."""
        return {"role": self.role, "transfer_backend": self.backend, **self.values,
                **{name: dict(values) for name, values in self.labelled.items()}}


def markdown_table() -> str:
    """The README's metrics table, generated from METRICS and LABELLED_COUNTERS (read-only)."""
    rows = ["| metric | type | meaning |", "|---|---|---|"]
    rows += [f"| `{PREFIX}{name}` | {kind} | {doc} |" for name, (kind, doc) in METRICS.items()]
    rows += [f"| `{PREFIX}{name}` | counter, label `{label}` | {doc} |" for name, (doc, label) in LABELLED_COUNTERS.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
