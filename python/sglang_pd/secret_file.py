"""The peer secret file (SGLANG_PD_PEER_SECRET_FILE): its keys, or an error naming the path, never the content.

Read by config (validated at start-up) and by srt/auth/peer_auth (the keys that sign and verify), so it
sits below both.
"""

from __future__ import annotations

import os
from pathlib import Path

MIN_KEY_CHARS = 32


class SecretFileError(ValueError):
    """The secret file cannot be used; the message names the path, never the content."""


def read_keys(path: str | os.PathLike) -> list[bytes]:
    """Keys in `path`, one per line (blank and '#' lines skipped); the first signs. Raises SecretFileError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SecretFileError(f"{p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"{p} cannot be read ({type(exc).__name__})") from None
    keys = [line.strip().encode() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not keys:
        raise SecretFileError(f"{p} holds no key")
    short = [i + 1 for i, key in enumerate(keys) if len(key) < MIN_KEY_CHARS]
    if short:
        raise SecretFileError(f"{p}: key(s) on non-comment line(s) {short} are shorter than {MIN_KEY_CHARS} characters")
    return keys
