"""Every setting of sglang_pd: environment variables under one prefix, declared once, validated once.

`validate(environ)` returns one message per bad value, naming the variable; the plugin refuses to
activate (one log line each) rather than run with a setting it cannot honour.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

PREFIX = "SGLANG_PD_"


@dataclass(frozen=True)
class Setting:
    """One environment setting."""

    name: str
    default: str | None
    help: str
    check: Callable[[str], str | None]  # returns a problem or None


def _positive(unit: str) -> Callable[[str], str | None]:
    """A check that the value is a number > 0, its messages naming `unit`."""
    def check(value: str) -> str | None:
        try:
            return None if float(value) > 0 else f"must be > 0 {unit}"
        except ValueError:
            return f"is not a number of {unit}"

    return check


def _flag(value: str) -> str | None:
    return None if value in ("0", "1") else "must be 0 or 1"


def _path(value: str) -> str | None:
    return None if value.strip() else "must be a folder path"


SETTINGS: tuple[Setting, ...] = (
    Setting(f"{PREFIX}NIXL_STALL_TIMEOUT_S", "60",
            "seconds after which an unfinished NIXL transfer is failed (its lock and pages released)",
            _positive("seconds")),
    Setting(f"{PREFIX}ENABLE_FAULT_INJECTION", "0",
            "1 mounts POST /sglang_pd/faults and accepts test faults; never set it in production", _flag),
    Setting(f"{PREFIX}RADIX_RESUME", "1",
            "1: a resumed retracted decode request re-matches the radix tree and restores only the uncached"
            " part; 0: SGLang's full restore", _flag),
    Setting(f"{PREFIX}BATCHED_EVICTION", "1",
            "1: decode plans each admission round at once and evicts once for it; 0: SGLang's per-request"
            " eviction", _flag),
    Setting(f"{PREFIX}MODEL_DIR", None,
            "where built-in model folders are written (default ~/.cache/sglang_pd/models)", _path),
    # SLO-aware decode admission (srt/disaggregation/slo_controller.py); unset = upstream behaviour.
    Setting(f"{PREFIX}ITL_TARGET_MS", None,
            "decode: target inter-token latency (ms); waiting requests join the running batch only while "
            "the learned step time stays within it (an empty batch always takes one)", _positive("milliseconds")),
    Setting(f"{PREFIX}TTFT_TARGET_MS", None,
            "decode: refuse a new request at once (HTTP 503 + Retry-After) when its predicted time to "
            "first token exceeds this many ms", _positive("milliseconds")),
)


def validate(environ: Mapping[str, str] | None = None) -> list[str]:
    """Problems with the settings in `environ` (default os.environ), one message each; [] if fine."""
    env = os.environ if environ is None else environ
    known = {s.name for s in SETTINGS}
    problems = [f"{s.name}={env[s.name]!r} {msg}" for s in SETTINGS
                if s.name in env and (msg := s.check(env[s.name]))]
    problems += [f"{name} is not a sglang_pd setting (known: {', '.join(sorted(known))})"
                 for name in env if name.startswith(PREFIX) and name not in known]
    return problems


def enabled(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """The 0/1 flag setting `name` (full name, e.g. SGLANG_PD_RADIX_RESUME) with its declared default."""
    env = os.environ if environ is None else environ
    default = next(s.default for s in SETTINGS if s.name == name)
    return env.get(name, default) == "1"
