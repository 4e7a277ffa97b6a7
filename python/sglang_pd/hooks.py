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
from sglang_pd.srt.disaggregation import prefill_hooks

_DISAGG = "sglang.srt.disaggregation"


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
        f"{_DISAGG}.prefill.PrefillBootstrapQueue.finalize_bootstrap", "AROUND",
        prefill_hooks.around_finalize_bootstrap, ProcessKind.SCHEDULER,
        "record the decode_prefix_len that reached prefill (ground truth of decode reuse)"),
    HookSpec(
        f"{_DISAGG}.common.conn.CommonKVSender._prepare_send_indices", "AFTER",
        prefill_hooks.after_prepare_send_indices, ProcessKind.SCHEDULER,
        "count KV pages really handed to the transport per room (nixl and mooncake share it)"),
)


def hooks_for(kind: ProcessKind) -> tuple[HookSpec, ...]:
    """The rows of HOOK_TABLE applied in a process of `kind` (read-only)."""
    return tuple(spec for spec in HOOK_TABLE if spec.process is kind)
