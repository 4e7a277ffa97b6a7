"""Built-in model configs and the harness's process handling (no SGLang server needed)."""

import json
import os
import sys
import time

import pytest

from sglang_pd.harness.server import ServerProcess, ServerStartError, free_port
from sglang_pd.models import ensure_model_dir, model_config

pytestmark = pytest.mark.unit


def test_model_dir_written_once_and_rewritten_on_change(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_PD_MODEL_DIR", str(tmp_path))
    folder = ensure_model_dir("tiny")
    config = json.loads((folder / "config.json").read_text())
    assert config == model_config("tiny")
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    mtime = (folder / "config.json").stat().st_mtime_ns
    assert ensure_model_dir("tiny") == folder and (folder / "config.json").stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="unknown built-in model 'huge'; known: capacity, smollm2, tiny"):
        model_config("huge")


# A parent that serves /health and forks a child that would outlive a plain kill of the parent.
_SERVER = r"""
import http.server, os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_server_process_health_and_group_teardown(tmp_path):
    port = free_port()
    child_pid_file = tmp_path / "child.pid"
    server = ServerProcess("toy", [sys.executable, "-c", _SERVER, str(port), str(child_pid_file)],
                           dict(os.environ), port, tmp_path)
    server.start()
    try:
        server.wait_healthy(time.monotonic() + 60)
        child_pid = int(child_pid_file.read_text())
        assert _alive(child_pid)
    finally:
        server.stop(grace_s=5)
    assert not server.is_running()
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child_pid), "the server's child must die with its process group"
    server.stop()  # idempotent


def test_server_that_exits_reports_log_tail(tmp_path):
    server = ServerProcess("broken", [sys.executable, "-c", "print('boom: bad flag --x'); raise SystemExit(3)"],
                           dict(os.environ), free_port(), tmp_path)
    server.start()
    with pytest.raises(ServerStartError, match="(?s)broken exited with 3.*boom: bad flag --x"):
        server.wait_healthy(time.monotonic() + 30)
    server.stop()
