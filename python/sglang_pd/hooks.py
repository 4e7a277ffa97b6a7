"""The one table of every upstream SGLang symbol sglang_pd hooks: target, hook type, process, why.

Adding a hook anywhere else is a bug: `plugin.register()` applies exactly this table, and the unit
tier checks that every target still resolves in the pinned SGLang and that hook signatures match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sglang_pd import http_routes
from sglang_pd.process_state import ProcessKind
from sglang_pd.srt import scheduler_hooks
from sglang_pd.srt.disaggregation import (decode_hooks, nixl_host_memory, prefill_hooks, request_fields,
                                           retraction_hooks, round_hooks, slo_hooks)
from sglang_pd.srt.hooks import common_conn, network, nixl_conn, requests_sessions
from sglang_pd.srt.mem_cache import checkpoint_hooks, ledger_hooks

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
        http_routes.before_launch_server, ProcessKind.HTTP,
        "mount GET /sglang_pd/info and /sglang_pd/stats on the server's own FastAPI app (and, with a TTFT "
        "target, the Retry-After middleware for early-rejection 503s)"),
    HookSpec(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info", "AFTER",
        request_fields.after_update_request_meta_info, ProcessKind.HTTP,
        "turn our per-request decode fields into plain numbers in meta_info"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.init_disaggregation", "AFTER",
        scheduler_hooks.after_init_disaggregation, ProcessKind.SCHEDULER,
        "label sglang_pd metrics with role/backend; export them on /metrics when metrics are on"),
    HookSpec(
        "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
        ".is_request_level_customized_info_key", "AROUND",
        request_fields.around_is_request_level_key, ProcessKind.SCHEDULER,
        "emit decode_prefix_len / pages / bytes once per request in meta_info"),
    HookSpec(
        "sglang.srt.mem_cache.radix_cache.RadixCache.evict", "AFTER", scheduler_hooks.after_evict,
        ProcessKind.SCHEDULER, "count evicted tokens (RadixCache; evict_for_alloc goes through it)"),
    HookSpec(
        f"{_UTREE}._evict", "AFTER", scheduler_hooks.after_evict, ProcessKind.SCHEDULER,
        "count evicted tokens (UnifiedRadixCache: evict and evict_for_alloc both end here)"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state", "AFTER",
        scheduler_hooks.after_get_internal_state, ProcessKind.SCHEDULER,
        "carry the scheduler's sglang_pd state to the HTTP process over SGLang's own channel"),
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.set_internal_state", "AROUND",
        scheduler_hooks.around_set_internal_state, ProcessKind.SCHEDULER,
        "arm test-only faults (sglang_pd_fault_* keys; refused unless enabled by env)"),
    HookSpec(
        f"{_DISAGG}.prefill.PrefillBootstrapQueue.finalize_bootstrap", "AROUND",
        prefill_hooks.around_finalize_bootstrap, ProcessKind.SCHEDULER,
        "reject a bad decode_prefix_len before any KV moves; record the one that reached prefill"),
    HookSpec(
        f"{_DISAGG}.common.conn.CommonKVSender._prepare_send_indices", "AFTER",
        prefill_hooks.after_prepare_send_indices, ProcessKind.SCHEDULER,
        "count KV pages really handed to the transport per room (nixl and mooncake share it)"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager.__init__", "AROUND", nixl_host_memory.around_manager_init,
        ProcessKind.SCHEDULER, "CPU device: register KV as DRAM (upstream says VRAM) and scope the next row"),
    HookSpec(
        "nixl._api.nixl_agent_config.__init__", "BEFORE", nixl_host_memory.before_agent_config_init,
        ProcessKind.SCHEDULER, "host-memory manager: no busy-polling progress thread (worker drives progress)"),
    HookSpec(
        f"{_DISAGG}.common.utils.FastQueue.get", "AFTER", nixl_host_memory.after_queue_get,
        ProcessKind.SCHEDULER, "know which room a NIXL transfer worker serves (for page counts / stalls)"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager.send_kvcache", "AFTER", nixl_host_memory.after_send_kvcache,
        ProcessKind.SCHEDULER, "count the KV pages NIXL itself was asked to move, per room"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager._await_handles", "AROUND", nixl_host_memory.around_await_handles,
        ProcessKind.SCHEDULER, "arm a stall deadline: upstream waits forever on a transfer that never ends"),
    HookSpec(
        "nixl._api.nixl_agent.check_xfer_state", "AFTER", nixl_host_memory.after_check_xfer_state,
        ProcessKind.SCHEDULER, "past the deadline a transfer reads ERR, so upstream fails the room"),
    HookSpec(
        f"{_TREE}.lock", "AFTER", ledger_hooks.after_lock, ProcessKind.SCHEDULER,
        "record every tree lock with its owner in the LockLedger"),
    HookSpec(
        f"{_TREE}.unlock", "AROUND", ledger_hooks.around_unlock, ProcessKind.SCHEDULER,
        "release exactly once: a double release is counted and never reaches the tree"),
    HookSpec(
        f"{_UTREE}.lock", "AFTER", ledger_hooks.after_lock, ProcessKind.SCHEDULER,
        "same as BasePrefixCache.lock: UnifiedRadixCache (the servers' default tree) overrides it"),
    HookSpec(
        f"{_UTREE}.unlock", "AROUND", ledger_hooks.around_unlock, ProcessKind.SCHEDULER,
        "same as BasePrefixCache.unlock, for UnifiedRadixCache"),
    HookSpec(
        "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode", "AFTER",
        scheduler_hooks.after_retract_decode, ProcessKind.SCHEDULER,
        "count retractions, so tests can prove the retraction path ran and released its locks"),
    HookSpec(
        "sglang.srt.mem_cache.common.checkpoint_kv_cache", "REPLACE",
        checkpoint_hooks.replace_checkpoint_kv_cache, ProcessKind.SCHEDULER,
        "publish running requests via maybe_cache_unfinished_req: warmup/health/fake never enter the tree"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._match_prefix_and_lock", "AROUND",
        decode_hooks.around_match_prefix_and_lock, ProcessKind.SCHEDULER,
        "decode admission through DecodePrefixAdmission: match, page-align, lock with owner, plan"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._send_kv_metadata", "AROUND",
        decode_hooks.around_send_kv_metadata, ProcessKind.SCHEDULER,
        "check decode_prefix_len and page count handed to the transfer layer against the plan"),
    # --- retraction that keeps the prefix, batched eviction (issue 5) ---
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue._pre_alloc", "AROUND",
        retraction_hooks.around_pre_alloc, ProcessKind.SCHEDULER,
        "a resumed retracted request re-matches and locks the tree; only the uncached rest is allocated"),
    HookSpec(
        "sglang.srt.managers.schedule_batch.Req.load_kv_cache", "AROUND",
        retraction_hooks.around_load_kv_cache, ProcessKind.SCHEDULER,
        "restore from the retraction backup only the tokens the tree did not give back"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue.pop_preallocated", "AROUND",
        round_hooks.around_pop_preallocated, ProcessKind.SCHEDULER,
        "run the prealloc loop as one admission round (evict once); release planned locks not taken"),
    # ---- SLO-aware decode admission (issue 10; slo_controller.py): ITL target, early rejection ----
    HookSpec(
        "sglang.srt.managers.scheduler.Scheduler.run_batch", "BEFORE", slo_hooks.before_run_batch,
        ProcessKind.SCHEDULER, "decode: time launch-to-launch of decode steps, the samples the step model learns"),
    HookSpec(
        f"{_DISAGG}.decode.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch", "AROUND",
        slo_hooks.around_get_new_prebuilt_batch, ProcessKind.SCHEDULER,
        "cap waiting -> running admissions at what keeps the predicted step within SGLANG_PD_ITL_TARGET_MS"),
    HookSpec(
        f"{_DISAGG}.decode.DecodePreallocQueue.add", "AROUND", slo_hooks.around_prealloc_add,
        ProcessKind.SCHEDULER, "refuse (503) a request whose predicted TTFT exceeds SGLANG_PD_TTFT_TARGET_MS, "
        "before any page or lock"),
    # ---- hostile peers (issue 16; srt/hooks/, srt/disaggregation/handshake_gate.py, peer_auth.py) ----
    HookSpec(
        f"{_CONN}.CommonKVManager.__init__", "AROUND", common_conn.around_manager_init, ProcessKind.SCHEDULER,
        "every message on the rank socket (prefill and decode, mooncake and NIXL, every receiving thread) "
        "passes the HandshakeGate before SGLang parses it: auth, schema, state; PD threads watched"),
    HookSpec(
        "sglang.srt.utils.network.get_zmq_socket_on_host", "AROUND", network.around_get_zmq_socket_on_host,
        ProcessKind.SCHEDULER, "inside a KV manager's construction only: bind its PULL socket with "
        "ZMQ_MAXMSGSIZE, so an oversize frame is refused before it is buffered"),
    HookSpec(
        f"{_CONN}.CommonKVManager._send_multipart_locked", "BEFORE", common_conn.before_send_multipart_locked,
        ProcessKind.SCHEDULER, "sign what prefill sends decode (status, ABORT_ACK, AUX_DATA) when a secret is set"),
    HookSpec(
        f"{_CONN}.CommonKVReceiver._connect", "AROUND", common_conn.around_receiver_connect, ProcessKind.SCHEDULER,
        "sign what decode sends prefill (registration, transfer info, ABORT, BOOTSTRAP) when a secret is set"),
    HookSpec(
        f"{_CONN}.CommonKVSender.__init__", "AFTER", common_conn.after_sender_init, ProcessKind.SCHEDULER,
        "a room a rejected message failed before its request arrived fails at once (not after the bootstrap timeout)"),
    HookSpec(
        f"{_DISAGG}.nixl.conn.NixlKVManager._add_remote_peer", "AROUND", nixl_conn.around_add_remote_peer,
        ProcessKind.SCHEDULER, "agent metadata NIXL cannot load (or naming another agent) drops that peer, "
        "not the bootstrap thread"),
    HookSpec(
        "requests.sessions.Session.request", "AROUND", requests_sessions.around_session_request,
        ProcessKind.SCHEDULER, "bootstrap HTTP calls (PUT/GET /route, /register_dp_rank, /query_dp_ranks) signed "
        "and their answers verified: decode trusts no unauthenticated prefill rank; other requests untouched"),
    HookSpec(
        f"{_CONN}.CommonKVBootstrapServer._setup_routes", "AFTER", common_conn.after_setup_routes, ProcessKind.HTTP,
        "bootstrap server: authenticate and check every /route, /register_dp_rank, /query_dp_ranks request "
        "before SGLang's handler stores it; tag the answers"),
)


def hooks_for(kind: ProcessKind) -> tuple[HookSpec, ...]:
    """The rows of HOOK_TABLE applied in a process of `kind` (read-only)."""
    return tuple(spec for spec in HOOK_TABLE if spec.process is kind)
