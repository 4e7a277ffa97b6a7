"""Where one test session keeps its server logs and its test peer secret, and how secrets are written there.

Two pytest runs on one box must not share this folder: the authenticated deployments read their peer
secret from it, so a second run rewriting the file makes every signed message of the first one fail
(measured: a fresh-clone CI run failed 10 tests while another pytest ran beside it). Each session
therefore gets a folder of its own unless the operator names one.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

DEFAULT_BASE = Path("/tmp/sglang_pd-test-logs")


def session_log_root(configured: Path | None, base: Path = DEFAULT_BASE) -> Path:
    """`configured` (SGLANG_PD_TEST_LOGS) when set, as given; else a NEW folder under `base` named
    <date>-<time>-<pid>-<random>, mode 0700 (created here; `base` too if missing). Never returns a folder
    another call of this function returned."""
    if configured is not None:
        return Path(configured)
    base.mkdir(parents=True, exist_ok=True)
    prefix = time.strftime("%Y%m%d-%H%M%S-") + f"{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def write_private_file(path: Path, text: str) -> Path:
    """Write `text` to `path` created (or truncated) with mode 0600 from the start, so no other user can
    read it even for an instant (the servers refuse secret files other users can read). Returns `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return Path(path)
