"""SGLang plugin entry point (entry-point group `sglang.srt.plugins`, name `sglang_pd`).

SGLang calls `register()` in every process it starts (HTTP server, each scheduler, detokenizer,
DP controller). We register only the HOOK_TABLE rows meant for the current process; SGLang's
`HookRegistry.apply_hooks()` then patches them. On any SGLang version other than the pinned one,
we log one line and register nothing, so an upgrade cannot silently run half-patched.

Peer authentication is fail-closed: with SGLANG_PD_PEER_SECRET_FILE set, a secret the plugin cannot
use, or a plugin that cannot activate, stops the server (SystemExit) instead of letting it serve
unauthenticated. Without the setting, the HTTP process logs one warning naming the risk.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version

import sglang_pd
from sglang_pd.config import fatal_problems
from sglang_pd.config import validate as validate_settings
from sglang_pd.process_state import STATE, ProcessKind, detect_process_kind
from sglang_pd.srt.disaggregation.peer_guard import SECRET_ENV, UNAUTHENTICATED_WARNING, load_auth


def _log(line: str) -> None:
    # print, not logging: the main process loads plugins before SGLang configures its loggers.
    print(f"[sglang_pd] {line}", file=sys.stderr, flush=True)


def installed_sglang_version() -> str | None:
    """The installed sglang distribution version, or None if it is not installed."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _refuse_start(problems: list[str]) -> None:
    for problem in problems:
        _log(f"refusing to start: {problem}")
    raise SystemExit("sglang_pd: refusing to start: " + "; ".join(problems))


def _stay_inactive(reason: str) -> None:
    """Not activating is acceptable, unless peers were meant to be authenticated (fail closed)."""
    STATE.refused_reason = reason
    if os.environ.get(SECRET_ENV):
        _refuse_start([f"{SECRET_ENV} is set but the plugin cannot activate ({reason})"])


def register() -> None:
    """Register this process's hooks with SGLang's HookRegistry (idempotent per process)."""
    if STATE.kind is not None:
        return
    STATE.kind = detect_process_kind()
    fatal = fatal_problems()
    if fatal:
        _refuse_start(fatal)
    found = installed_sglang_version()
    if found != sglang_pd.SUPPORTED_SGLANG_VERSION:
        reason = (f"sglang_pd {sglang_pd.__version__} requires sglang=={sglang_pd.SUPPORTED_SGLANG_VERSION}, "
                  f"found {found}; plugin NOT active")
        _log(reason)
        _stay_inactive(reason)
        return
    problems = validate_settings()
    if problems:
        for problem in problems:
            _log(f"bad setting: {problem}")
        _log("plugin NOT active")
        _stay_inactive("bad settings: " + "; ".join(problems) + "; plugin NOT active")
        return
    STATE.peer_guard.auth = load_auth()
    if STATE.kind is ProcessKind.HTTP:
        _log(f"WARNING: {UNAUTHENTICATED_WARNING}" if STATE.peer_guard.auth is None else
             f"PD peers authenticated (HMAC-SHA256; key ids {', '.join(STATE.peer_guard.auth.key_ids)})")

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_pd.hooks import hooks_for

    specs = hooks_for(STATE.kind)
    for spec in specs:
        HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
        STATE.applied_hooks.append(f"{spec.hook_type} {spec.target}")
    _log(f"sglang_pd {sglang_pd.__version__} active in {STATE.kind.value} process; hooks: "
         + (", ".join(STATE.applied_hooks) or "none"))
