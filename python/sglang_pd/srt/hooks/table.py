"""The one table of every upstream SGLang symbol sglang_pd hooks: target, hook type, process, why.

Adding a hook anywhere else is a bug: `plugin.register()` applies exactly this table, and the unit
tier checks that every target still resolves in the pinned SGLang and that every hook's signature
matches its target's (names, kinds, defaults). The functions live beside this file, one module per
upstream module (or class) they patch. `REGISTRY_TABLE` lists the names we add to SGLang's own
registries (nothing patched: SGLang looks the name up itself), e.g. our attention backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sglang_pd.srt.hooks import (attention_backend, bootstrap_server, common_conn, common_utils,
                                 decode_prealloc_queue, decode_scheduler, detokenizer_manager, http_server,
                                 io_struct, mem_cache_common, mooncake_conn, network, nixl_api, nixl_conn,
                                 output_streamer, prefill, prefix_cache, requests_sessions, schedule_batch,
                                 scheduler, tokenizer_manager)
from sglang_pd.srt.state import ProcessKind

_DISAGG = "sglang.srt.disaggregation"
_TREE = "sglang.srt.mem_cache.base_prefix_cache.BasePrefixCache"
_UTREE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
_CONN = "sglang.srt.disaggregation.common.conn"


@dataclass(frozen=True)
class HookSpec:
    """One hook: applied with HookRegistry.register(target, fn, hook_type) in `process` only."""

    target: str
    hook_type: str  # name of sglang.srt.plugins.hook_registry.HookType: BEFORE/AFTER/AROUND/REPLACE
    fn: Callable
    process: ProcessKind
    why: str


HOOK_TABLE: tuple[HookSpec, ...] = (
    HookSpec(
        "sglang.srt.entrypoints.http_server.launch_server", "BEFORE",
        http_server.before_launch_server, ProcessKind.HTTP,
        "mount GET /sglang_pd/info and /sglang_pd/stats on the server's own FastAPI app (and, with a TTFT "
        "target, the Retry-After middleware for early-rejection 503s)"),
    HookSpec(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.__init__", "AFTER", tokenizer_manager.after_init,
        ProcessKind.HTTP, "a PD server's HTTP process runs every thread at SCHED_BATCH (no wake-up preemption of "
        "a scheduler step; helper_threads.py)"),
    HookSpec(
        "sglang.srt.managers.detokenizer_manager.DetokenizerManager.__init__", "AFTER",
        detokenizer_manager.after_init, ProcessKind.DETOKENIZER,
        "a PD server's detokenizer runs every thread at SCHED_BATCH (helper_threads.py)"),
    HookSpec(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "AFTER",
        tokenizer_manager.after_validate_one_request, ProcessKind.HTTP,
        "refuse a prompt token id outside [0, vocab_size), a top_logprobs_num above it, a logprob_start_len below -1 "
        "and, on a PD server, a malformed bootstrap room / host / port with HTTP 400 (upstream's scheduler dies on "
        "each; prompt_guard.py, pairing_guard.py)"),
    HookSpec(
        "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments", "AROUND",
        io_struct.around_normalize_generate, ProcessKind.HTTP,
        "refuse sampling_params.n above SGLANG_PD_MAX_PARALLEL_SAMPLES with HTTP 400 before SGLang copies the "
        "request n times (upstream: n = 10**6 stalls the HTTP process), and with 400 naming the field a stop_regex "
        "that does not compile and a rid that is not a string (upstream: HTTP 500; prompt_guard.py)"),
    HookSpec(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info", "AFTER",
        tokenizer_manager.after_update_request_meta_info, ProcessKind.HTTP,
        "turn our per-request decode fields into plain numbers in meta_info"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.init_disaggregation", "AFTER",
        scheduler.after_init_disaggregation, ProcessKind.SCHEDULER,
        "label sglang_pd metrics with role/backend; export them on /metrics when metrics are on; a PD "
        "scheduler's helper threads to SCHED_BATCH, its own thread kept at SCHED_OTHER (helper_threads.py)"),
    HookSpec(
        "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
        ".is_request_level_customized_info_key", "AROUND",
        output_streamer.around_is_request_level_key, ProcessKind.SCHEDULER,
        "emit decode_prefix_len / pages / bytes once per request in meta_info"),
    HookSpec(
        "sglang.srt.mem_cache.radix_cache.RadixCache.evict", "AFTER", prefix_cache.after_radix_evict,
        ProcessKind.SCHEDULER, "count evicted tokens (RadixCache; evict_for_alloc goes through it)"),
    HookSpec(
        f"{_UTREE}._evict", "AFTER", prefix_cache.after_unified_evict, ProcessKind.SCHEDULER,
        "count evicted tokens (UnifiedRadixCache: evict and evict_for_alloc both end here)"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state", "AFTER",
        scheduler.after_get_internal_state, ProcessKind.SCHEDULER,
        "carry the scheduler's sglang_pd state to the HTTP process over SGLang's own channel"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.set_internal_state", "AROUND",
        scheduler.around_set_internal_state, ProcessKind.SCHEDULER,
        "arm test-only faults (sglang_pd_fault_* keys; refused unless enabled by env)"),
    HookSpec(
        f"{_DISAGG}.prefill.PrefillBootstrapQueue.finalize_bootstrap", "AROUND",
        prefill.around_finalize_bootstrap, ProcessKind.SCHEDULER,
        "reject a transfer info sent for another prompt (two requests, one room: prompt_binding.py) or a bad "
        "decode_prefix_len before any KV moves; record the one that reached prefill"),
    HookSpec(
        f"{_DISAGG}.common.conn.CommonKVSender._prepare_send_indices", "AFTER",
        common_conn.after_prepare_send_indices, ProcessKind.SCHEDULER,
        "count KV pages really handed to the transport per room (nixl and mooncake share it)"),
    HookSpec(
        f"{_DISAGG}.mooncake.conn.MooncakeKVManager._handle_abort_notification", "AROUND",
        mooncake_conn.around_handle_abort_notification, ProcessKind.SCHEDULER,
        "prefill: consume a room decline (fail the room now, or tombstone it until it exists) before "
        "upstream's ABORT parser; malformed messages never get here (the HandshakeGate, below)"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager._handle_abort_notification", "AROUND",
        nixl_conn.around_handle_abort_notification, ProcessKind.SCHEDULER,
        "same for NIXL"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager.__init__", "AROUND", nixl_conn.around_init,
        ProcessKind.SCHEDULER, "CPU device: register KV as DRAM (upstream says VRAM) and scope the next row"),
    HookSpec(
        "nixl._api.nixl_agent_config.__init__", "BEFORE", nixl_api.before_agent_config_init,
        ProcessKind.SCHEDULER, "host-memory manager: no busy-polling progress thread (worker drives progress)"),
    HookSpec(
        f"{_DISAGG}.common.utils.FastQueue.get", "AFTER", common_utils.after_queue_get,
        ProcessKind.SCHEDULER, "know which room a NIXL transfer worker serves (for page counts / stalls)"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager.send_kvcache", "AROUND", nixl_conn.around_send_kvcache,
        ProcessKind.SCHEDULER, "count the KV pages NIXL itself was asked to move, per room (test fault: the "
        "send raises, for upstream's prefill-side failure path)"),
    HookSpec(
        f"{_DISAGG}.mooncake.conn.MooncakeKVManager._transfer_data", "AROUND", mooncake_conn.around_transfer_data,
        ProcessKind.SCHEDULER, "split a batch over SGLANG_PD_MOONCAKE_MAX_BATCH_DESCRIPTORS: mooncake's TCP "
        "transport refuses batches over its per-peer queue limit (page 1, many layers, fragmented pool)"),
    HookSpec(
        f"{_DISAGG}.mooncake.conn.MooncakeKVManager.transfer_worker", "AROUND", mooncake_conn.around_transfer_worker,
        ProcessKind.SCHEDULER, "the worker thread spins in batch_transfer_sync while its transfer runs: it runs "
        "at SGLANG_PD_TRANSFER_WORKER_NICE so the spin takes no CPU a scheduler wants; an exception on one room "
        "(0.5.23 races on a cleared room) fails only that room instead of ending the thread "
        "(transfer_worker_guard.py)"),
    HookSpec(
        f"{_DISAGG}.mooncake.conn.MooncakeKVManager.send_kvcache", "AROUND", mooncake_conn.around_send_kvcache,
        ProcessKind.SCHEDULER, "tests only: an armed prefill_transfer_fail reports the room's send failed "
        "(upstream's own prefill-side transport failure path), an armed prefill_worker_error raises in the "
        "transfer worker, an armed prefill_send_delay starts the room's send 5 s late; otherwise passes through"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager._await_handles", "AROUND", nixl_conn.around_await_handles,
        ProcessKind.SCHEDULER, "arm a stall deadline: upstream waits forever on a transfer that never ends"),
    HookSpec(
        "nixl._api.nixl_agent.check_xfer_state", "AROUND", nixl_api.around_check_xfer_state,
        ProcessKind.SCHEDULER, "past the deadline a transfer is cancelled, then reads ERR, so upstream fails "
        "the room and tells decode (never while a write may still land)"),
    HookSpec(
        f"{_TREE}.lock", "AFTER", prefix_cache.after_lock, ProcessKind.SCHEDULER,
        "record every tree lock with its owner in the LockLedger"),
    HookSpec(
        f"{_TREE}.unlock", "AROUND", prefix_cache.around_unlock, ProcessKind.SCHEDULER,
        "release exactly once: a double release is counted and never reaches the tree"),
    HookSpec(
        f"{_UTREE}.lock", "AFTER", prefix_cache.after_unified_lock, ProcessKind.SCHEDULER,
        "same as BasePrefixCache.lock: UnifiedRadixCache (the servers' default tree) overrides it"),
    HookSpec(
        f"{_UTREE}.unlock", "AROUND", prefix_cache.around_unlock, ProcessKind.SCHEDULER,
        "same as BasePrefixCache.unlock, for UnifiedRadixCache"),
    HookSpec(
        "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode", "AFTER",
        schedule_batch.after_retract_decode, ProcessKind.SCHEDULER,
        "count retractions, so tests can prove the retraction path ran and released its locks"),
    HookSpec(
        "sglang.srt.mem_cache.common.release_kv_cache", "BEFORE", mem_cache_common.before_release_kv_cache,
        ProcessKind.SCHEDULER, "tests only (fault injection on): copy an armed room's prompt KV before its row is "
        "released, for a test to compare the KV decode computed locally with prefill's, page by page"),
    HookSpec(
        "sglang.srt.mem_cache.common.checkpoint_kv_cache", "REPLACE",
        mem_cache_common.replace_checkpoint_kv_cache, ProcessKind.SCHEDULER,
        "publish running requests via maybe_cache_unfinished_req: warmup/health/fake never enter the tree"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._match_prefix_and_lock", "AROUND",
        decode_prealloc_queue.around_match_prefix_and_lock, ProcessKind.SCHEDULER,
        "decode admission through DecodePrefixAdmission: match, page-align, lock with owner, plan"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._send_kv_metadata", "AROUND",
        decode_prealloc_queue.around_send_kv_metadata, ProcessKind.SCHEDULER,
        "decode-local prefill decided after match + lock + prealloc, before prefill hears of the request "
        "(local: decline sent, request queued); else check decode_prefix_len and pages against the plan; tests "
        "only: faults that bend decode_prefix_len (prefix_unaligned, prefix_exceeds, prefix_page_ahead)"),
    # --- retraction that keeps the prefix, batched eviction (issue 5) ---
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._pre_alloc", "AROUND",
        decode_prealloc_queue.around_pre_alloc, ProcessKind.SCHEDULER,
        "a resumed retracted request re-matches and locks the tree; only the uncached rest is allocated"),
    HookSpec(
        "sglang.srt.managers.schedule_batch.Req.load_kv_cache", "AROUND",
        schedule_batch.around_load_kv_cache, ProcessKind.SCHEDULER,
        "restore from the retraction backup only the tokens the tree did not give back"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue.pop_preallocated", "AROUND",
        decode_prealloc_queue.around_pop_preallocated, ProcessKind.SCHEDULER,
        "run the prealloc loop as one admission round (evict once); release planned locks not taken; "
        "requests served by decode-local prefill do not go on to the transfer queue"),
    # ---- SLO-aware decode admission (issue 10; slo_controller.py): ITL target, early rejection ----
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.run_batch", "BEFORE", scheduler.before_run_batch,
        ProcessKind.SCHEDULER, "decode: time launch-to-launch of decode steps (a local extend's tokens ride "
        "on its step), the samples the step model learns; prefill: count prompt tokens its model computes; "
        "helper threads started since the last sweep to SCHED_BATCH (at most once a second)"),
    HookSpec(
        f"{_DISAGG}.decode.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch", "AROUND",
        decode_scheduler.around_get_new_prebuilt_batch, ProcessKind.SCHEDULER,
        "cap waiting -> running admissions at what keeps the predicted step within SGLANG_PD_ITL_TARGET_MS; tests "
        "only: an armed kv_page_corrupt overwrites a waiting request's first transferred page (power checks)"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue.add", "AROUND", decode_prealloc_queue.around_add,
        ProcessKind.SCHEDULER, "refuse (400) a request whose bootstrap room another request here holds (upstream's "
        "decode dies when that room fails) and (503) one whose predicted TTFT exceeds SGLANG_PD_TTFT_TARGET_MS, "
        "before any page or lock"),
    # ---- decode-local prefill (issue 20; local_prefill.py, room_decline.py) ----
    HookSpec(
        f"{_DISAGG}.decode.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run", "AROUND",
        decode_scheduler.around_get_next_disagg_decode_batch_to_run, ProcessKind.SCHEDULER,
        "the local extend that ran joins the running batch; the next one (capped tokens) runs inside this "
        "step's decode (one mixed forward) when requests are decoding, else alone (at most one per decode step)"),
    HookSpec(
        "sglang.srt.managers.schedule_batch.alloc_for_extend", "AROUND", schedule_batch.around_alloc_for_extend,
        ProcessKind.SCHEDULER, "a local extend writes into the pages decode preallocated (no second allocation); "
        "tests only: an armed local_extend_kv_shift writes each token's KV one slot off (power checks)"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._active_req_count", "AFTER",
        decode_prealloc_queue.after_active_req_count, ProcessKind.SCHEDULER,
        "admission reserves decode headroom for local-prefill requests, which sit in none of SGLang's queues, "
        "and for running requests inside a mixed local extend (running_batch is empty until its join)"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._need_space_for_single_req", "AROUND",
        decode_prealloc_queue.around_need_space_for_single_req, ProcessKind.SCHEDULER,
        "running requests inside a mixed local extend count as running until its join: retractable, and the "
        "largest one's room to finish kept (upstream's figure from an empty running_batch was 0)"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._required_admission_tokens", "AROUND",
        decode_prealloc_queue.around_required_admission_tokens, ProcessKind.SCHEDULER,
        "a request's admission need counts running requests inside a mixed local extend as retractable, as "
        "it would with them in running_batch"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.is_disable_overlap_for_batch", "AFTER",
        scheduler.after_is_disable_overlap_for_batch, ProcessKind.SCHEDULER,
        "overlap loop: a local extend's result (first token) is processed before the next batch launches"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.on_idle", "AFTER", scheduler.after_on_idle, ProcessKind.SCHEDULER,
        "a PD scheduler with transfers in flight and nothing to run sleeps SGLANG_PD_IDLE_WAIT_US instead of "
        "spinning a core on sleep(0); the helper-thread sweep runs while idle too"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.is_fully_idle", "AFTER", scheduler.after_is_fully_idle,
        ProcessKind.SCHEDULER, "not idle while local-prefill requests hold pages (no idle sleep, no idle "
        "leak check on them)"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.abort_request", "AFTER", scheduler.after_abort_request,
        ProcessKind.SCHEDULER, "client aborts reach requests queued for a local extend (answered, released)"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.pause_generation", "AROUND", scheduler.around_pause_generation,
        ProcessKind.SCHEDULER, "a retract-mode pause that takes a local extend before its join ends it "
        "(RETRACTED, batch unbound); before, the extend stayed bound for good: no later local extend, never idle"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler._collect_inflight_batches", "AFTER",
        scheduler.after_collect_inflight_batches, ProcessKind.SCHEDULER,
        "the local extend batch is in flight until its join: SGLang's running-request abort and "
        "SGLANG_REQ_RUNNING_TIMEOUT scan find its requests (local and mixed-in running ones; the overlap loop "
        "had moved last_batch past it, so an abort was lost and they decoded to max_new_tokens)"),
    HookSpec(
        "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_extend", "AROUND",
        attention_backend.around_run_sdpa_forward_extend, ProcessKind.SCHEDULER,
        "decode: a local extend attends with only its new tokens' queries (upstream runs a full-length causal "
        "query per request: O(seq_len^2) for a few new tokens, in front of the first token and every decode)"),
    HookSpec(
        f"{_DISAGG}.prefill.PrefillBootstrapQueue.add", "AFTER", prefill.after_add, ProcessKind.SCHEDULER,
        "prefill: a room decode declined before this half arrived fails at once (else a 300 s bootstrap wait)"),
    HookSpec(
        f"{_DISAGG}.prefill.SchedulerDisaggregationPrefillMixin.handle_bootstrap_failure", "AROUND",
        prefill.around_handle_bootstrap_failure, ProcessKind.SCHEDULER,
        "prefill: a declined room answers as decode asked (200 for decode-local prefill), not as a failure"),
    HookSpec(
        f"{_DISAGG}.prefill.SchedulerDisaggregationPrefillMixin.release_aborted_prefill_waiting_req", "AFTER",
        prefill.after_release_aborted_waiting_req, ProcessKind.SCHEDULER,
        "prefill: a request aborted in the waiting queue (bootstrapped, not yet computed) has its sender cleared, "
        "which tells its decode (0.5.23 only marks the room Failed: decode waited for its waiting timeout, and "
        "the room's tables stayed)"),
    HookSpec(
        f"{_DISAGG}.prefill.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run", "AROUND",
        prefill.around_next_prefill_batch, ProcessKind.SCHEDULER,
        "tests only: an armed prefill_waiting_hold keeps its room's request out of prefill's next batches for "
        "10 s (it stays in the waiting queue, where an abort finds it); otherwise passes through"),
    # ---- hostile peers (issue 16; handshake_gate.py, peer_auth.py, bootstrap_guard.py, thread_watch.py) ----
    HookSpec(
        f"{_CONN}.CommonKVManager.__init__", "AROUND", common_conn.around_manager_init, ProcessKind.SCHEDULER,
        "every message on the rank socket (prefill and decode, mooncake and NIXL, every receiving thread) "
        "passes the HandshakeGate before SGLang parses it: auth, schema, state; PD threads watched; on prefill "
        "the manager's transfer_infos becomes HeldRooms (a transfer worker's pop of a finished room waits until "
        "the bootstrap thread is between messages)"),
    HookSpec(
        "sglang.srt.utils.network.get_zmq_socket_on_host", "AROUND", network.around_get_zmq_socket_on_host,
        ProcessKind.SCHEDULER, "inside a KV manager's construction only: bind its PULL socket with "
        "ZMQ_MAXMSGSIZE, so an oversize frame is refused before it is buffered, and with "
        "SGLANG_PD_PEER_CURVE=1 as a CURVE server (its context then makes CURVE clients)"),
    HookSpec(
        f"{_CONN}.CommonKVManager._connect", "AFTER", common_conn.after_manager_connect, ProcessKind.SCHEDULER,
        "with SGLANG_PD_PEER_CURVE=1: check that each PUSH socket a manager made to a peer is a CURVE client"),
    HookSpec(
        f"{_CONN}.CommonKVManager._send_multipart_locked", "BEFORE", common_conn.before_send_multipart_locked,
        ProcessKind.SCHEDULER, "sign what prefill sends decode (status, ABORT_ACK, AUX_DATA) when a secret is set"),
    HookSpec(
        f"{_CONN}.CommonKVManager.send_kv_status_message", "AFTER", common_conn.after_send_kv_status_message,
        ProcessKind.SCHEDULER, "prefill: remember which decodes were already sent a room's Failed status (a "
        "failed transfer's own), so the clear's tell of a failed request does not repeat it"),
    HookSpec(
        f"{_DISAGG}.mooncake.conn.MooncakeKVManager.build_receiver_registration_message", "AFTER",
        common_conn.after_build_receiver_registration_message, ProcessKind.SCHEDULER,
        "decode: a registration ends with its KV pages and aux slots (SGLang's carries pointers and item lengths, "
        "no buffer lengths), so prefill refuses a transfer info naming an index beyond them (pool_bounds.py)"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager.build_receiver_registration_message", "AFTER",
        common_conn.after_build_receiver_registration_message, ProcessKind.SCHEDULER,
        "decode: a registration ends with its KV pages and aux slots (SGLang's carries the page count but no aux "
        "buffer length), so prefill refuses a transfer info naming an index beyond them (pool_bounds.py)"),
    HookSpec(
        f"{_DISAGG}.mooncake.conn.MooncakeKVManager.build_receiver_metadata_message", "AFTER",
        common_conn.after_build_receiver_metadata_message, ProcessKind.SCHEDULER,
        "decode: a transfer info ends with its request's prompt digest (prefill serves the room only for that "
        "prompt; prompt_binding.py)"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager.build_receiver_metadata_message", "AFTER",
        common_conn.after_build_receiver_metadata_message, ProcessKind.SCHEDULER,
        "decode: a transfer info ends with its request's prompt digest (prefill serves the room only for that "
        "prompt; prompt_binding.py)"),
    HookSpec(
        f"{_CONN}.CommonKVReceiver._connect", "AROUND", common_conn.around_receiver_connect, ProcessKind.SCHEDULER,
        "sign what decode sends prefill (registration, transfer info, ABORT, BOOTSTRAP, room decline) when a "
        "secret is set; with SGLANG_PD_PEER_CURVE=1 make those sockets CURVE clients (checked)"),
    HookSpec(
        f"{_CONN}.CommonKVSender.clear", "AROUND", common_conn.around_sender_clear, ProcessKind.SCHEDULER,
        "prefill: the clear waits until the bootstrap thread is between two messages (0.5.23's thread died of "
        "a KeyError when a clear popped the room it was handling; guarded_socket.py); a cleared request no "
        "longer binds its room to its prompt (prompt_binding.py); a failed one's room is remembered so a late "
        "decode transfer info is refused and its decode told at once"),
    HookSpec(
        f"{_CONN}.CommonKVSender.__init__", "AFTER", common_conn.after_sender_init, ProcessKind.SCHEDULER,
        "the room is claimed by a local request; one a rejected message failed before it arrived fails at once"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager._add_remote_peer", "AROUND", nixl_conn.around_add_remote_peer,
        ProcessKind.SCHEDULER, "agent metadata NIXL cannot load (or naming another agent) drops that peer, "
        "not the bootstrap thread"),
    HookSpec(
        "requests.sessions.Session.request", "AROUND", requests_sessions.around_session_request,
        ProcessKind.SCHEDULER, "bootstrap HTTP calls (PUT/GET /route, /register_dp_rank, /query_dp_ranks) signed "
        "and their answers verified: decode trusts no unauthenticated prefill rank; other requests untouched"),
    HookSpec(
        f"{_CONN}.CommonKVBootstrapServer._setup_routes", "AFTER", bootstrap_server.after_setup_routes,
        ProcessKind.HTTP, "bootstrap server: authenticate and check every /route, /register_dp_rank, "
        "/query_dp_ranks request before SGLang's handler stores it; tag the answers"),
)


def hooks_for(kind: ProcessKind) -> tuple[HookSpec, ...]:
    """The rows of HOOK_TABLE applied in a process of `kind` (read-only)."""
    return tuple(spec for spec in HOOK_TABLE if spec.process is kind)


@dataclass(frozen=True)
class RegistrySpec:
    """One name we add to an upstream registry (`target`, a module attribute) by calling `add()`."""

    target: str
    add: Callable[[], None]  # idempotent
    processes: tuple[ProcessKind, ...]
    why: str


REGISTRY_TABLE: tuple[RegistrySpec, ...] = (
    # ---- shared-prefix decode attention (issue 17; srt/hooks/attention_backend.py) ----
    RegistrySpec(
        "sglang.srt.arg_groups.choices.ATTENTION_BACKEND_CHOICES", attention_backend.register_backend_choice,
        (ProcessKind.HTTP, ProcessKind.SCHEDULER),
        "accept --attention-backend / --decode-attention-backend sglang_pd_shared_prefix (the HTTP process "
        "loads plugins before it parses arguments)"),
    RegistrySpec(
        "sglang.srt.layers.attention.attention_registry.ATTENTION_BACKENDS", attention_backend.register_backend_factory,
        (ProcessKind.SCHEDULER,),
        "the model runner builds sglang_pd_shared_prefix by name: decode by shared physical prefix (own KV "
        "kept between steps), extends with only their new queries, around TorchNativeAttnBackend"),
)


def registrations_for(kind: ProcessKind) -> tuple[RegistrySpec, ...]:
    """The rows of REGISTRY_TABLE applied in a process of `kind` (read-only)."""
    return tuple(spec for spec in REGISTRY_TABLE if kind in spec.processes)


def apply_ledger_hooks() -> None:
    """Apply the table's lock/unlock rows in this process, as a scheduler does (idempotent).

    For code that builds SGLang trees without a server (bench_admission, the unit tier): every tree
    lock is then recorded in the installed state's LockLedger, exactly as in a server.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for spec in HOOK_TABLE:
        if spec.target.endswith((".lock", ".unlock")) and not any(
                fn is spec.fn for _, fn, _ in HookRegistry._hooks.get(spec.target, ())):
            HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
    HookRegistry.apply_hooks()
