"""The hook table's lock/unlock rows applied outside a server, for trees built by a benchmark or the unit tier."""

from __future__ import annotations

from sglang_pd.srt.hooks.table import HOOK_TABLE


def apply_ledger_hooks() -> None:
    """Apply the table's lock/unlock rows here, as a scheduler does (idempotent): for trees built without a
    server (bench_admission, the unit tier), every lock is then recorded in the state's LockLedger, as in a server."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for spec in HOOK_TABLE:
        if spec.target.endswith((".lock", ".unlock")) and not any(
                fn is spec.fn for _, fn, _ in HookRegistry._hooks.get(spec.target, ())):
            HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
    HookRegistry.apply_hooks()
