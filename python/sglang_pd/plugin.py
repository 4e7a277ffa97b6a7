"""SGLang plugin entry point (entry-point group `sglang.srt.plugins`, name `sglang_pd`).

SGLang calls `register()` in every process it starts (HTTP server, each scheduler, detokenizer,
DP controller). We parse the settings once, build this process's objects (`srt/state.py`) and register
only the hook-table rows meant for this process; SGLang's `HookRegistry.apply_hooks()` then patches
them. On any SGLang version other than the pinned one we log one line and register nothing, so an
upgrade cannot silently run half-patched. A bad or unknown `SGLANG_PD_*` setting stops the process at
start with one line naming it: a server must not run without the guards its operator configured.

Peer authentication is fail-closed: with SGLANG_PD_PEER_SECRET_FILE set, a plugin that cannot activate
(other SGLang version) stops the server instead of letting it serve unauthenticated. Without the
setting, the HTTP process logs one warning naming the risk.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version

import sglang_pd
from sglang_pd.config import PEER_SECRET_FILE, Settings, SettingsError
from sglang_pd.srt.handshake import start_up_line
from sglang_pd.srt import state as process_state

refused_reason: str | None = None  # why this process runs without the plugin (None: active or not loaded)


def _log(line: str) -> None:
    # print, not logging: the main process loads plugins before SGLang configures its loggers.
    print(f"[sglang_pd] {line}", file=sys.stderr, flush=True)


def installed_sglang_version() -> str | None:
    """The installed sglang distribution version, or None if it is not installed."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _refuse(reason: str) -> None:
    global refused_reason
    refused_reason = reason
    _log(reason)


def register() -> None:
    """Build this process's state and register its hooks with SGLang's HookRegistry (once per process)."""
    if refused_reason is not None or process_state.installed():
        return
    kind = process_state.detect_process_kind()
    found = installed_sglang_version()
    if found != sglang_pd.SUPPORTED_SGLANG_VERSION:
        _refuse(f"sglang_pd {sglang_pd.__version__} requires sglang=={sglang_pd.SUPPORTED_SGLANG_VERSION}, "
                f"found {found}; plugin NOT active")
        if os.environ.get(PEER_SECRET_FILE):
            _log(f"refusing to start: {PEER_SECRET_FILE} is set but the plugin cannot activate")
            raise SystemExit(2)
        return
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        _refuse("refusing to start: bad setting: " + "; ".join(exc.problems))
        raise SystemExit(2) from None  # the line above says why

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_pd.srt.hooks.table import hooks_for, registrations_for

    state = process_state.build_state(kind, settings)
    process_state.install(state)
    if kind is process_state.ProcessKind.HTTP:
        _log(start_up_line(state.peer_guard))
    for spec in hooks_for(kind):
        HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
        state.applied_hooks.append(f"{spec.hook_type} {spec.target}")
    for entry in registrations_for(kind):
        entry.add()
        state.applied_hooks.append(f"REGISTER {entry.target}")
    _log(f"sglang_pd {sglang_pd.__version__} active in {kind.value} process; hooks: "
         + (", ".join(state.applied_hooks) or "none"))
