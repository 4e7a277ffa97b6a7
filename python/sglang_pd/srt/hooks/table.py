"""The one table of every upstream SGLang symbol sglang_pd hooks: target, hook type, process, why.

Adding a hook anywhere else is a bug: `plugin.register()` applies exactly this table; the unit tier checks every
target resolves in the pinned SGLang and every hook's signature matches its target's. Rows are grouped by the
upstream module or class they patch (`_on`); the functions live in scheduling/, connection/, frontend/.
`REGISTRY_TABLE`: names we add to SGLang's own registries (SGLang looks them up itself), e.g. our attention backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sglang_pd.srt.hooks import attention_backend
from sglang_pd.srt.hooks.connection import (bootstrap_server, common_conn, common_utils, mooncake_conn, network,
                                            nixl_api, nixl_conn, requests_sessions)
from sglang_pd.srt.hooks.frontend import (detokenizer_manager, engine, http_server, io_struct, output_streamer,
                                          tokenizer_manager)
from sglang_pd.srt.hooks.scheduling import (decode_handoff, decode_prealloc_queue, decode_scheduler,
                                            mem_cache_common, prefill, prefix_cache, schedule_batch, scheduler)
from sglang_pd.srt.state import ProcessKind

_DISAGG, _MGR, _MEM = "sglang.srt.disaggregation", "sglang.srt.managers", "sglang.srt.mem_cache"
_CONN = f"{_DISAGG}.common.conn"
HTTP, SCHED, DETOK = ProcessKind.HTTP, ProcessKind.SCHEDULER, ProcessKind.DETOKENIZER


@dataclass(frozen=True)
class HookSpec:
    """One hook: applied with HookRegistry.register(target, fn, hook_type) in `process` only."""

    target: str
    hook_type: str  # name of sglang.srt.plugins.hook_registry.HookType: BEFORE/AFTER/AROUND/REPLACE
    fn: Callable
    process: ProcessKind
    why: str


def _on(owner: str, process: ProcessKind, *rows: tuple[str, str, Callable, str]) -> tuple[HookSpec, ...]:
    """The rows (attribute, hook type, fn, why) hooked on upstream module or class `owner` in `process`."""
    return tuple(HookSpec(f"{owner}.{attr}", hook_type, fn, process, why) for attr, hook_type, fn, why in rows)


HOOK_TABLE: tuple[HookSpec, ...] = (
    *_on("sglang.srt.entrypoints.engine", HTTP, ("_set_envs_and_config", "AFTER", engine.after_set_envs_and_config,
         "on --device cpu, start the scheduler and detokenizer from a forkserver that imported them once, not as "
         "fresh spawned interpreters (processes/start_method.py)")),
    *_on("sglang.srt.entrypoints.http_server", HTTP,
         ("launch_server", "BEFORE", http_server.before_launch_server, "mount GET /sglang_pd/info and "
          "/sglang_pd/stats on the server's own FastAPI app (and, with a TTFT target, the Retry-After middleware for "
          "early-rejection 503s)")),
    *_on(f"{_MGR}.tokenizer_manager.TokenizerManager", HTTP,
         ("__init__", "AFTER", tokenizer_manager.after_init, "a PD server's HTTP process runs every thread at "
          "SCHED_BATCH (no wake-up preemption of a scheduler step; threads/helper_threads.py)"),
         ("_validate_one_request", "AFTER", tokenizer_manager.after_validate_one_request, "refuse a prompt token id "
          "outside [0, vocab_size), a top_logprobs_num above it, a logprob_start_len below -1 and, on a PD server, a "
          "malformed bootstrap room / host / port with HTTP 400 (upstream's scheduler dies on each; "
          "http/request_checks.py, http/pairing_checks.py)"),
         ("update_request_meta_info", "AFTER", tokenizer_manager.after_update_request_meta_info,
          "turn our per-request decode fields into plain numbers in meta_info")),
    *_on(f"{_MGR}.io_struct.GenerateReqInput", HTTP,
         ("normalize_batch_and_arguments", "AROUND", io_struct.around_normalize_generate, "refuse sampling_params.n "
          "above SGLANG_PD_MAX_PARALLEL_SAMPLES with HTTP 400 before SGLang copies the request n times (upstream: n "
          "= 10**6 stalls the HTTP process), and with 400 naming the field a stop_regex that does not compile and a "
          "rid that is not a string (upstream: HTTP 500; http/request_checks.py)")),
    *_on(f"{_MGR}.detokenizer_manager.DetokenizerManager", DETOK,
         ("__init__", "AFTER", detokenizer_manager.after_init, "a PD server's detokenizer runs every thread at "
          "SCHED_BATCH (threads/helper_threads.py)")),
    *_on(f"{_CONN}.CommonKVBootstrapServer", HTTP,
         ("_setup_routes", "AFTER", bootstrap_server.after_setup_routes, "bootstrap server: authenticate and check "
          "every /route, /register_dp_rank, /query_dp_ranks request before SGLang's handler stores it (and a "
          "PUT moving a rank in its prefill_port_table: 409 without a secret); tag the answers")),
    *_on(f"{_MGR}.scheduler.Scheduler", SCHED,
         ("init_disaggregation", "AFTER", scheduler.after_init_disaggregation, "label sglang_pd metrics with "
          "role/backend; export them on /metrics when metrics are on; a PD scheduler's helper threads to "
          "SCHED_BATCH, its own thread kept at SCHED_OTHER (threads/helper_threads.py)"),
         ("get_internal_state", "AFTER", scheduler.after_get_internal_state, "carry the scheduler's sglang_pd state "
          "to the HTTP process over SGLang's own channel"),
         ("set_internal_state", "AROUND", scheduler.around_set_internal_state, "arm test-only faults "
          "(sglang_pd_fault_* keys; refused unless enabled by env)"),
         ("run_batch", "BEFORE", scheduler.before_run_batch, "decode: time launch-to-launch of decode steps (a local "
          "extend's tokens ride on its step), the samples the step model learns; prefill: count prompt tokens its "
          "model computes; helper threads started since the last sweep to SCHED_BATCH (at most once a second)"),
         ("is_disable_overlap_for_batch", "AFTER", scheduler.after_is_disable_overlap_for_batch,
          "overlap loop: a local extend's result (first token) is processed before the next batch launches"),
         ("on_idle", "AFTER", scheduler.after_on_idle, "a PD scheduler with transfers in flight and nothing to run "
          "sleeps SGLANG_PD_IDLE_WAIT_US instead of spinning a core on sleep(0); the helper-thread sweep runs while "
          "idle too"),
         ("is_fully_idle", "AFTER", scheduler.after_is_fully_idle, "not idle while local-prefill requests hold pages "
          "(no idle sleep, no idle leak check on them)"),
         ("abort_request", "AFTER", scheduler.after_abort_request, "client aborts reach requests queued for a local "
          "extend (answered, released)"),
         ("pause_generation", "AROUND", scheduler.around_pause_generation, "a retract-mode pause that takes a local "
          "extend before its join ends it (RETRACTED, batch unbound); before, the extend stayed bound for good: no "
          "later local extend, never idle"),
         ("_collect_inflight_batches", "AFTER", scheduler.after_collect_inflight_batches, "the local extend batch is "
          "in flight until its join: SGLang's running-request abort and SGLANG_REQ_RUNNING_TIMEOUT scan find its "
          "requests (local and mixed-in running ones; the overlap loop had moved last_batch past it, so an abort was "
          "lost and they decoded to max_new_tokens)")),
    *_on(f"{_MGR}.scheduler_components.output_streamer.SchedulerOutputStreamer", SCHED,
         ("is_request_level_customized_info_key", "AROUND", output_streamer.around_is_request_level_key,
          "emit decode_prefix_len / pages / bytes once per request in meta_info")),
    *_on(f"{_MEM}.base_prefix_cache.BasePrefixCache", SCHED,
         ("lock", "AFTER", prefix_cache.after_lock, "record every tree lock with its owner in the LockLedger"),
         ("unlock", "AROUND", prefix_cache.around_unlock, "release exactly once: a double release is counted and "
          "never reaches the tree")),
    *_on(f"{_MEM}.radix_cache.RadixCache", SCHED, ("evict", "AFTER", prefix_cache.after_radix_evict,
          "count evicted tokens (RadixCache; evict_for_alloc goes through it)")),
    *_on(f"{_MEM}.unified_radix_cache.UnifiedRadixCache", SCHED,
         ("_evict", "AFTER", prefix_cache.after_unified_evict, "count evicted tokens (UnifiedRadixCache: evict and "
          "evict_for_alloc both end here)"),
         ("lock", "AFTER", prefix_cache.after_unified_lock, "same as BasePrefixCache.lock: UnifiedRadixCache (the "
          "servers' default tree) overrides it"),
         ("unlock", "AROUND", prefix_cache.around_unlock, "same as BasePrefixCache.unlock, for UnifiedRadixCache")),
    *_on(f"{_MEM}.common", SCHED,
         ("release_kv_cache", "BEFORE", mem_cache_common.before_release_kv_cache, "tests only (fault injection on): "
          "copy an armed room's prompt KV before its row is released, for a test to compare the KV decode computed "
          "locally with prefill's, page by page"),
         ("checkpoint_kv_cache", "REPLACE", mem_cache_common.replace_checkpoint_kv_cache, "publish running requests "
          "via maybe_cache_unfinished_req: warmup/health/fake never enter the tree")),
    *_on(f"{_MGR}.schedule_batch.ScheduleBatch", SCHED,
         ("retract_decode", "AFTER", schedule_batch.after_retract_decode, "count retractions, so tests can prove the "
          "retraction path ran and released its locks")),
    *_on(f"{_MGR}.schedule_batch.Req", SCHED,
         ("load_kv_cache", "AROUND", schedule_batch.around_load_kv_cache, "restore from the retraction backup only "
          "the tokens the tree did not give back")),
    *_on(f"{_MGR}.schedule_batch", SCHED,
         ("alloc_for_extend", "AROUND", schedule_batch.around_alloc_for_extend, "a local extend writes into the "
          "pages decode preallocated (no second allocation); tests only: an armed local_extend_kv_shift writes each "
          "token's KV one slot off (power checks)")),
    *_on(f"{_DISAGG}.decode.DecodePreallocQueue", SCHED,
         ("_match_prefix_and_lock", "AROUND", decode_prealloc_queue.around_match_prefix_and_lock,
          "decode admission through DecodePrefixAdmission: match, page-align, lock with owner, plan"),
         ("_send_kv_metadata", "AROUND", decode_handoff.around_send_kv_metadata, "decode_handoff.py: decode-local "
          "prefill decided after match + lock + prealloc, before prefill hears of the request (local: decline sent, "
          "request queued; the balance rule reads the uncached tokens of self.transfer_queue.queue); else decode_prefix_len and pages checked against the plan; tests only: faults bend "
          "decode_prefix_len (prefix_unaligned, prefix_exceeds, prefix_page_ahead)"),
         ("_pre_alloc", "AROUND", decode_prealloc_queue.around_pre_alloc, "a resumed retracted request re-matches "
          "and locks the tree; only the uncached rest is allocated"),
         ("pop_preallocated", "AROUND", decode_prealloc_queue.around_pop_preallocated, "run the prealloc loop as one "
          "admission round (evict once); release planned locks not taken; requests served by decode-local prefill do "
          "not go on to the transfer queue"),
         ("add", "AROUND", decode_prealloc_queue.around_add, "refuse (400) a request whose bootstrap room another "
          "request here holds (upstream's decode dies when that room fails) and (503) one whose predicted TTFT "
          "exceeds SGLANG_PD_TTFT_TARGET_MS, before any page or lock"),
         ("_active_req_count", "AFTER", decode_prealloc_queue.after_active_req_count, "admission reserves decode "
          "headroom for local-prefill requests, which sit in none of SGLang's queues, and for running requests "
          "inside a mixed local extend (running_batch is empty until its join)"),
         ("_need_space_for_single_req", "AROUND", decode_prealloc_queue.around_need_space_for_single_req,
          "running requests inside a mixed local extend count as running until its join: retractable, and the largest"
          " one's room to finish kept (upstream's figure from an empty running_batch was 0)"),
         ("_required_admission_tokens", "AROUND", decode_prealloc_queue.around_required_admission_tokens,
          "a request's admission need counts running requests inside a mixed local extend as retractable, as it would"
          " with them in running_batch")),
    *_on(f"{_DISAGG}.decode.SchedulerDisaggregationDecodeMixin", SCHED,
         ("_get_new_prebuilt_batch", "AROUND", decode_scheduler.around_get_new_prebuilt_batch,
          "cap waiting -> running admissions at what keeps the predicted step within SGLANG_PD_ITL_TARGET_MS; check "
          "transferred KV against prefill's digest before use (SGLANG_PD_KV_DIGEST); tests only: an armed "
          "kv_page_corrupt overwrites a waiting request's first transferred page"),
         ("get_next_disagg_decode_batch_to_run", "AROUND", decode_scheduler.around_get_next_disagg_decode_batch_to_run,
          "the local extend that ran joins the running batch; the next one (capped tokens) runs inside this step's "
          "decode (one mixed forward) when requests are decoding, else alone (at most one per decode step)")),
    *_on("sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend", SCHED,
         ("_run_sdpa_forward_extend", "AROUND", attention_backend.around_run_sdpa_forward_extend,
          "decode: a local extend attends with only its new tokens' queries (upstream runs a full-length causal query"
          " per request: O(seq_len^2) for a few new tokens, in front of the first token and every decode)")),
    *_on(f"{_DISAGG}.prefill.PrefillBootstrapQueue", SCHED,
         ("finalize_bootstrap", "AROUND", prefill.around_finalize_bootstrap, "reject a transfer info sent for "
          "another prompt (two requests, one room: handshake/prompt_binding.py) or a bad decode_prefix_len before "
          "any KV moves; record the one that reached prefill"),
         ("add", "AFTER", prefill.after_add, "prefill: a room decode declined before this half arrived fails at once "
          "(else a 300 s bootstrap wait)")),
    *_on(f"{_DISAGG}.prefill.SchedulerDisaggregationPrefillMixin", SCHED,
         ("send_kv_chunk", "BEFORE", prefill.before_send_kv_chunk, "SGLANG_PD_KV_DIGEST: at a room's last chunk, "
          "digest the KV rows it sends for the room's Success status (wire/kv_digest.py)"),
         ("handle_bootstrap_failure", "AROUND", prefill.around_handle_bootstrap_failure, "prefill: a declined room "
          "answers as decode asked (200 for decode-local prefill), not as a failure"),
         ("release_aborted_prefill_waiting_req", "AFTER", prefill.after_release_aborted_waiting_req,
          "prefill: a request aborted in the waiting queue (bootstrapped, not yet computed) has its sender cleared, "
          "which tells its decode (0.5.23 only marks the room Failed: decode waited for its waiting timeout, and the "
          "room's tables stayed)"),
         ("get_next_disagg_prefill_batch_to_run", "AROUND", prefill.around_next_prefill_batch,
          "tests only: an armed prefill_waiting_hold keeps its room's request out of prefill's next batches for 10 s "
          "(it stays in the waiting queue, where an abort finds it); otherwise passes through")),
    *_on(f"{_CONN}.CommonKVManager", SCHED,
         ("__init__", "AROUND", common_conn.around_manager_init, "every message on the rank socket (prefill and "
          "decode, mooncake and NIXL, every receiving thread) passes the HandshakeGate before SGLang parses it: "
          "auth, schema, state; PD threads watched; on prefill the manager's transfer_infos becomes HeldRooms (a "
          "transfer worker's pop of a finished room waits until the bootstrap thread is between messages)"),
         ("_connect", "AFTER", common_conn.after_manager_connect, "with SGLANG_PD_PEER_CURVE=1: check that each PUSH "
          "socket a manager made to a peer is a CURVE client"),
         ("_encode_kv_status_message", "AFTER", common_conn.after_encode_kv_status_message, "SGLANG_PD_KV_DIGEST: a "
          "Success status ends with the room's KV digest, signed with it (wire/kv_digest.py)"),
         ("_send_multipart_locked", "BEFORE", common_conn.before_send_multipart_locked, "sign what prefill sends "
          "decode (status, ABORT_ACK, AUX_DATA) when a secret is set"),
         ("send_kv_status_message", "AFTER", common_conn.after_send_kv_status_message, "prefill: remember which "
          "decodes were already sent a room's Failed status (a failed transfer's own), so the clear's tell of a "
          "failed request does not repeat it")),
    *_on(f"{_CONN}.CommonKVSender", SCHED,
         ("_prepare_send_indices", "AFTER", common_conn.after_prepare_send_indices, "count KV pages really handed to "
          "the transport per room (nixl and mooncake share it)"),
         ("clear", "AROUND", common_conn.around_sender_clear, "prefill: the clear waits until the bootstrap thread "
          "is between two messages (0.5.23's thread died of a KeyError when a clear popped the room it was handling; "
          "handshake/sockets.py); a cleared request no longer binds its room to its prompt "
          "(handshake/prompt_binding.py); a failed one's room is remembered so a late decode transfer info is "
          "refused and its decode told at once"),
         ("__init__", "AFTER", common_conn.after_sender_init, "the room is claimed by a local request; one a "
          "rejected message failed before it arrived fails at once")),
    *_on(f"{_CONN}.CommonKVReceiver", SCHED, ("_connect", "AROUND", common_conn.around_receiver_connect,
          "sign what decode sends prefill (registration, transfer info, ABORT, BOOTSTRAP, room decline) when a secret"
          " is set; with SGLANG_PD_PEER_CURVE=1 make those sockets CURVE clients (checked)")),
    *_on(f"{_DISAGG}.mooncake.conn.MooncakeKVManager", SCHED,
         ("_handle_abort_notification", "AROUND", mooncake_conn.around_handle_abort_notification,
          "prefill: consume a room decline (fail the room now, or tombstone it until it exists) before upstream's "
          "ABORT parser; malformed messages never get here (the HandshakeGate, below)"),
         ("_transfer_data", "AROUND", mooncake_conn.around_transfer_data, "split a batch over "
          "SGLANG_PD_MOONCAKE_MAX_BATCH_DESCRIPTORS: mooncake's TCP transport refuses batches over its per-peer "
          "queue limit (page 1, many layers, fragmented pool)"),
         ("transfer_worker", "AROUND", mooncake_conn.around_transfer_worker, "the worker thread spins in "
          "batch_transfer_sync while its transfer runs: it runs at SGLANG_PD_TRANSFER_WORKER_NICE so the spin takes "
          "no CPU a scheduler wants; an exception on one room (0.5.23 races on a cleared room) fails only that room "
          "instead of ending the thread (transfer/worker_recovery.py)"),
         ("send_kvcache", "AROUND", mooncake_conn.around_send_kvcache, "tests only: an armed prefill_transfer_fail "
          "reports the room's send failed (upstream's own prefill-side transport failure path), an armed "
          "prefill_worker_error raises in the transfer worker, an armed prefill_send_delay starts the room's send 5 "
          "s late; otherwise passes through"),
         ("build_receiver_registration_message", "AFTER", common_conn.after_build_receiver_registration_message,
          "decode: a registration ends with its KV pages and aux slots (SGLang's carries pointers and item lengths, "
          "no buffer lengths), so prefill refuses a transfer info naming an index beyond them "
          "(handshake/pool_bounds.py)"),
         ("build_receiver_metadata_message", "AFTER", common_conn.after_build_receiver_metadata_message,
          "decode: a transfer info ends with its request's prompt digest (prefill serves the room only for that "
          "prompt; handshake/prompt_binding.py)")),
    *_on(f"{_DISAGG}.nixl.conn.NixlKVManager", SCHED,
         ("_handle_abort_notification", "AROUND", nixl_conn.around_handle_abort_notification, "same for NIXL"),
         ("__init__", "AROUND", nixl_conn.around_init, "CPU device: register KV as DRAM (upstream says VRAM) and "
          "scope the next row"),
         ("send_kvcache", "AROUND", nixl_conn.around_send_kvcache, "count the KV pages NIXL itself was asked to "
          "move, per room (test fault: the send raises, for upstream's prefill-side failure path)"),
         ("_await_handles", "AROUND", nixl_conn.around_await_handles, "arm a stall deadline: upstream waits forever "
          "on a transfer that never ends"),
         ("build_receiver_registration_message", "AFTER", common_conn.after_build_receiver_registration_message,
          "decode: a registration ends with its KV pages and aux slots (SGLang's carries the page count but no aux "
          "buffer length), so prefill refuses a transfer info naming an index beyond them (handshake/pool_bounds.py)"),
         ("build_receiver_metadata_message", "AFTER", common_conn.after_build_receiver_metadata_message,
          "decode: a transfer info ends with its request's prompt digest (prefill serves the room only for that "
          "prompt; handshake/prompt_binding.py)"),
         ("_add_remote_peer", "AROUND", nixl_conn.around_add_remote_peer, "agent metadata NIXL cannot load (or "
          "naming another agent) drops that peer, not the bootstrap thread")),
    *_on("nixl._api.nixl_agent_config", SCHED, ("__init__", "BEFORE", nixl_api.before_agent_config_init,
          "host-memory manager: no busy-polling progress thread (worker drives progress)")),
    *_on("nixl._api.nixl_agent", SCHED, ("check_xfer_state", "AROUND", nixl_api.around_check_xfer_state,
          "past the deadline a transfer is cancelled, then reads ERR, so upstream fails the room and tells decode "
          "(never while a write may still land)")),
    *_on(f"{_DISAGG}.common.utils.FastQueue", SCHED, ("get", "AFTER", common_utils.after_queue_get,
          "know which room a NIXL transfer worker serves (for page counts / stalls)")),
    *_on("sglang.srt.utils.network", SCHED,
         ("get_zmq_socket_on_host", "AROUND", network.around_get_zmq_socket_on_host, "inside a KV manager's "
          "construction only: bind its PULL socket with ZMQ_MAXMSGSIZE, so an oversize frame is refused before it is "
          "buffered, and with SGLANG_PD_PEER_CURVE=1 as a CURVE server (its context then makes CURVE clients)")),
    *_on("requests.sessions.Session", SCHED, ("request", "AROUND", requests_sessions.around_session_request,
          "bootstrap HTTP calls (PUT/GET /route, /register_dp_rank, /query_dp_ranks) signed and their answers "
          "verified: decode trusts no unauthenticated prefill rank; other requests untouched")),
)


def hooks_for(kind: ProcessKind) -> tuple[HookSpec, ...]:
    return tuple(spec for spec in HOOK_TABLE if spec.process is kind)  # read-only


@dataclass(frozen=True)
class RegistrySpec:
    """One name we add to an upstream registry (`target`, a module attribute) by calling `add()`."""

    target: str
    add: Callable[[], None]  # idempotent
    processes: tuple[ProcessKind, ...]
    why: str


REGISTRY_TABLE: tuple[RegistrySpec, ...] = (  # shared-prefix decode attention (issue 17; attention_backend.py)
    RegistrySpec("sglang.srt.arg_groups.choices.ATTENTION_BACKEND_CHOICES", attention_backend.register_backend_choice,
                 (HTTP, SCHED), "accept --attention-backend / --decode-attention-backend sglang_pd_shared_prefix "
                 "(the HTTP process loads plugins before it parses arguments)"),
    RegistrySpec("sglang.srt.layers.attention.attention_registry.ATTENTION_BACKENDS",
                 attention_backend.register_backend_factory, (SCHED,), "the model runner builds "
                 "sglang_pd_shared_prefix by name: decode by shared physical prefix (own KV kept between steps), "
                 "extends with only their new queries, around TorchNativeAttnBackend"),
)


def registrations_for(kind: ProcessKind) -> tuple[RegistrySpec, ...]:
    return tuple(spec for spec in REGISTRY_TABLE if kind in spec.processes)  # read-only
