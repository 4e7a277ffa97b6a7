"""A server started with a bad or unknown SGLANG_PD_* setting stops at once, naming it (no model load,
no port opened): it must not serve without the guards its operator configured."""

import secrets
import subprocess
import sys

import pytest

from sglang_pd.harness.cpu_env import server_env
from sglang_pd.harness.server import free_port
from sglang_pd.models import ensure_model_dir

pytestmark = pytest.mark.integration


def test_server_refuses_to_start_on_a_bad_setting(tmp_path):
    shared_secret = tmp_path / "peer_secret"   # a good key in a file group and others may read
    shared_secret.write_text(secrets.token_hex(32) + "\n")
    shared_secret.chmod(0o644)
    env = dict(server_env(), SGLANG_PD_NIXL_STALL_TIMEOUT_S="soon", SGLANG_PD_ITL_TARGET="40",
               SGLANG_PD_PEER_SECRET_FILE=str(shared_secret), SGLANG_PD_PEER_AUTH_MAX_SKEW_S="3600")
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(ensure_model_dir("tiny")),
            "--load-format", "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(free_port()),
            "--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[sglang_pd] refusing to start")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "SGLANG_PD_NIXL_STALL_TIMEOUT_S='soon' is not a number of seconds" in lines[0]
    assert "SGLANG_PD_ITL_TARGET is not a sglang_pd setting" in lines[0]
    assert f"{shared_secret} is readable or writable by group or others (mode 644); chmod 600 it" in lines[0]
    assert "SGLANG_PD_PEER_AUTH_MAX_SKEW_S='3600' exceeds the cap of 120 seconds" in lines[0]
    assert shared_secret.read_text().strip() not in proc.stderr + proc.stdout
    assert "Uvicorn running" not in proc.stderr and "Load weight" not in proc.stderr


def test_a_decode_with_a_secret_and_no_bootstrap_addresses_refuses_to_start(tmp_path):
    """With a peer secret a decode signs bootstrap requests only for SGLANG_PD_BOOTSTRAP_ADDRESSES
    (srt/auth/bootstrap_addresses.py); empty, it could pair with no prefill: it stops before any subprocess."""
    shared_secret = tmp_path / "peer_secret"
    shared_secret.write_text(secrets.token_hex(32) + "\n")
    shared_secret.chmod(0o600)
    env = dict(server_env(), SGLANG_PD_PEER_SECRET_FILE=str(shared_secret))
    env.pop("SGLANG_PD_BOOTSTRAP_ADDRESSES", None)
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(ensure_model_dir("tiny")),
            "--load-format", "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(free_port()),
            "--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[sglang_pd] refusing to start")]
    assert len(lines) == 1 and "SGLANG_PD_BOOTSTRAP_ADDRESSES" in lines[0] and "is empty" in lines[0], proc.stderr[-3000:]
    assert "subprocesses start by" not in proc.stderr and "Load weight" not in proc.stderr


def test_shared_prefix_backend_refuses_to_start_without_a_c_compiler():
    """--attention-backend sglang_pd_shared_prefix builds its own-part C kernel at start-up: with no
    compiler (CC pointing nowhere) the server stops in its own process, before any subprocess or model load,
    with one error naming the kernel and the command, instead of serving without it."""
    from sglang_pd.harness.cpu_env import cpu_server_args
    from sglang_pd.srt.hooks.attention_backend import BACKEND_NAME

    env = dict(server_env(), CC="/nonexistent/cc")
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(ensure_model_dir("tiny")),
            "--load-format", "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(free_port()),
            "--max-total-tokens", "2048", *cpu_server_args(BACKEND_NAME)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[sglang_pd] refusing to start")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert f"--attention-backend {BACKEND_NAME} cannot serve this server: its own-part C kernel cannot be " \
           "built here: /nonexistent/cc could not compile" in lines[0]
    assert "subprocesses start by" not in proc.stderr and "Load weight" not in proc.stderr
    assert "Uvicorn running" not in proc.stdout + proc.stderr
