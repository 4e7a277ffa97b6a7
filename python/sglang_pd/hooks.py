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
from sglang_pd.srt.disaggregation import decode_hooks, prefill_hooks
from sglang_pd.srt.mem_cache import checkpoint_hooks, ledger_hooks

_DISAGG = "sglang.srt.disaggregation"
_TREE = "sglang.srt.mem_cache.base_prefix_cache.BasePrefixCache"
_UTREE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"


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
        "mount GET /sglang_pd/info and /sglang_pd/stats on the server's own FastAPI app"),
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
)


def hooks_for(kind: ProcessKind) -> tuple[HookSpec, ...]:
    """The rows of HOOK_TABLE applied in a process of `kind` (read-only)."""
    return tuple(spec for spec in HOOK_TABLE if spec.process is kind)
