"""README.md's "Run it yourself" CPU block, extracted from the README and run as printed (bash, from the
repo root): prefill server, decode server with the decode radix cache, the router launcher, the same
request twice through the router, then the block's own cleanup. Bounded in time; the block runs in a
new session, and whatever of that process group is still alive afterwards is a failure (then killed)."""

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import record_figures

from sglang_pd.harness.server import group_pids

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
START, END = "<!-- run-it-yourself:cpu -->", "<!-- /run-it-yourself:cpu -->"
TIMEOUT_S = 600
GRACE_S = 30  # after the block's own `wait`: SGLang's scheduler children may end a moment later


def cpu_block(readme: str) -> str:
    """The bash fence between the CPU block's markers (AssertionError naming what is missing)."""
    assert START in readme and END in readme, f"README.md lacks the markers {START} / {END}"
    section = readme.split(START, 1)[1].split(END, 1)[0]
    fence = re.search(r"```bash\n(.*?)```", section, re.S)
    assert fence, "no ```bash fence between the README's CPU block markers"
    return fence.group(1)


def _ports(script: str) -> list[int]:
    return sorted({int(p) for p in re.findall(r"\b(3[01]\d\d\d)\b", script)})


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _leftovers(pgid: int) -> list[int]:
    deadline = time.monotonic() + GRACE_S
    while (alive := group_pids(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def test_readme_cpu_block_runs_as_printed():
    script = cpu_block((ROOT / "README.md").read_text())
    ports = _ports(script)
    assert ports and all(p < 32768 for p in ports), ports
    taken = [p for p in ports if not _port_free(p)]
    assert not taken, f"ports the README block uses are taken on this machine: {taken}"
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    leftover: list[int] = []
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the README block did not finish in {TIMEOUT_S}s:\n{out[-3000:]}")
    finally:
        leftover = _leftovers(proc.pid)
        if leftover:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    assert not leftover, f"the README block's cleanup left processes of its group running: {leftover}"
    replies = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(replies) == 2, out[-3000:]
    first, second = replies
    assert first["text"].strip() and second["text"] == first["text"], (first["text"], second["text"])
    prompt_len = first["meta_info"]["prompt_tokens"]
    print(f"\nREADME_BLOCK prompt_tokens={prompt_len} decode_prefix_len={first['meta_info']['decode_prefix_len']}, "
          f"{second['meta_info']['decode_prefix_len']} text={first['text']!r}")
    record_figures("readme_block", {"prompt_tokens": prompt_len, "text": first["text"],
                                    "decode_prefix_len": [first["meta_info"]["decode_prefix_len"],
                                                          second["meta_info"]["decode_prefix_len"]]})
    assert first["meta_info"]["decode_prefix_len"] == 0
    # The second time decode holds the prompt: whole pages of it (page size 16) are reused.
    reused = second["meta_info"]["decode_prefix_len"]
    assert 0 < reused <= prompt_len and reused % 16 == 0 and prompt_len - reused < 16, second["meta_info"]
