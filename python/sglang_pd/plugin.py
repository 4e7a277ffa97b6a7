"""SGLang plugin entry point (entry-point group `sglang.srt.plugins`, name `sglang_pd`).

SGLang calls `register()` in every process it starts (HTTP server, each scheduler, detokenizer,
DP controller). We register only the HOOK_TABLE rows meant for the current process; SGLang's
`HookRegistry.apply_hooks()` then patches them. On any SGLang version other than the pinned one,
we log one line and register nothing, so an upgrade cannot silently run half-patched.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

import sglang_pd
from sglang_pd.config import validate as validate_settings
from sglang_pd.process_state import STATE, detect_process_kind



def _log(line: str) -> None:
    # print, not logging: the main process loads plugins before SGLang configures its loggers.
    print(f"[sglang_pd] {line}", file=sys.stderr, flush=True)


def installed_sglang_version() -> str | None:
    """The installed sglang distribution version, or None if it is not installed."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def register() -> None:
    """Register this process's hooks with SGLang's HookRegistry (idempotent per process)."""
    if STATE.kind is not None:
        return
    STATE.kind = detect_process_kind()
    found = installed_sglang_version()
    if found != sglang_pd.SUPPORTED_SGLANG_VERSION:
        STATE.refused_reason = (
            f"sglang_pd {sglang_pd.__version__} requires sglang=={sglang_pd.SUPPORTED_SGLANG_VERSION}, "
            f"found {found}; plugin NOT active")
        _log(STATE.refused_reason)
        return
    problems = validate_settings()
    if problems:
        STATE.refused_reason = "bad settings: " + "; ".join(problems) + "; plugin NOT active"
        for problem in problems:
            _log(f"bad setting: {problem}")
        _log("plugin NOT active")
        return

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_pd.hooks import hooks_for, registrations_for

    specs = hooks_for(STATE.kind)
    for spec in specs:
        HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
        STATE.applied_hooks.append(f"{spec.hook_type} {spec.target}")
    for entry in registrations_for(STATE.kind):
        entry.add()
        STATE.applied_hooks.append(f"REGISTER {entry.target}")
    _log(f"sglang_pd {sglang_pd.__version__} active in {STATE.kind.value} process; hooks: "
         + (", ".join(STATE.applied_hooks) or "none"))
