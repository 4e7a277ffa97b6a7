"""The peer secret file (SGLANG_PD_PEER_SECRET_FILE): its keys, or an error naming the path, never the content.

Read by config (validated at start-up) and by srt/auth/peer_auth (the keys that sign and verify), so it
sits below both. A file is refused when:
- group or others may read or write it, or this process's user does not own it (`private_file_problem`,
  also the rule for launch_router's --api-key-file);
- a key is shorter than 32 characters, or carries less than 256 bits by `key_bits`' estimate: 64 hex digits,
  43 base64 characters or 40 other printable ones, at least 8 distinct and none over a quarter of it.
  `openssl rand -hex 32` makes one.
"""

from __future__ import annotations

import math
import os
import stat
import string
from pathlib import Path

MIN_KEY_CHARS = 32
MIN_KEY_BITS = 256
MIN_DISTINCT_CHARS = 8
MAKE_ONE = "make one with `openssl rand -hex 32 > FILE; chmod 600 FILE`"
_HEX = frozenset(string.hexdigits.encode())
_BASE64 = frozenset((string.ascii_letters + string.digits + "+/=-_").encode())


class SecretFileError(ValueError):
    """The secret file cannot be used; the message names the path, never the content."""


def private_file_problem(st: os.stat_result) -> str | None:
    """Why a file holding a secret, of status `st`, is not private to this process's user, or None."""
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this server's user (uid {os.geteuid()})"
    return None


def read_private(path: Path) -> tuple[str, str | None]:
    """(text of `path`, why it is not private or None): the status checked is the file read, not whatever the
    path names later. Raises OSError / UnicodeDecodeError as open and decode do."""
    with open(path, "rb") as f:
        problem = private_file_problem(os.fstat(f.fileno()))
        return f.read().decode("utf-8"), problem


def key_bits(key: bytes) -> float:
    """An estimate of the entropy of `key`: its length times the bits per character of the smallest usual
    alphabet holding it (hex 4, base64 6, printable ASCII log2(95)); 0 for a repeated or patterned key (fewer
    than 8 distinct characters, or one character making up more than a quarter of it). It catches short,
    repeated and padded keys, not every weak one: make keys with a random generator."""
    if len(set(key)) < MIN_DISTINCT_CHARS or max(key.count(c) for c in set(key)) * 4 > len(key):
        return 0.0
    per_char = 4.0 if set(key) <= _HEX else 6.0 if set(key) <= _BASE64 else math.log2(95)
    return len(key) * per_char


def read_keys(path: str | os.PathLike) -> list[bytes]:
    """Keys in `path`, one per line (blank and '#' lines skipped); the first signs. Raises SecretFileError."""
    p = Path(path)
    try:
        text, problem = read_private(p)
    except FileNotFoundError:
        raise SecretFileError(f"{p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"{p} cannot be read ({type(exc).__name__})") from None
    if problem is not None:
        raise SecretFileError(f"{p} is {problem}")
    keys = [line.strip().encode() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not keys:
        raise SecretFileError(f"{p} holds no key; {MAKE_ONE}")
    short = [i + 1 for i, key in enumerate(keys) if len(key) < MIN_KEY_CHARS]
    if short:
        raise SecretFileError(f"{p}: key(s) on non-comment line(s) {short} are shorter than {MIN_KEY_CHARS} "
                              f"characters; {MAKE_ONE}")
    weak = [i + 1 for i, key in enumerate(keys) if key_bits(key) < MIN_KEY_BITS]
    if weak:
        raise SecretFileError(f"{p}: key(s) on non-comment line(s) {weak} carry less than {MIN_KEY_BITS} bits of "
                              f"entropy (64 hex digits, 43 base64 characters, or 8+ distinct characters); {MAKE_ONE}")
    return keys
