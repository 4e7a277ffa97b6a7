"""Built-in model configs and the harness's process handling (no SGLang server needed)."""

import json
import os
import sys
import time

import pytest
import requests

import socket

from sglang_pd.harness.server import (PortTakenError, ServerProcess, ServerStartError, free_port,
                                     wait_healthy_rebinding)
from sglang_pd.models import ensure_model_dir, model_config

pytestmark = pytest.mark.unit


def test_model_dir_is_a_checkpoint_built_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_PD_MODEL_DIR", str(tmp_path))
    folder = ensure_model_dir("tiny")
    config = json.loads((folder / "config.json").read_text())
    assert config == model_config("tiny")
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    weights = folder / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert ensure_model_dir("tiny") == folder and weights.stat().st_mtime_ns == mtime
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


# As SGLang does: a child keeps the process up, then uvicorn binds --port (after the model load).
_LATE_BINDER = r"""
import subprocess, sys, uvicorn
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200 if scope["path"] == "/health" else 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})
try:
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[sys.argv.index("--port") + 1]), log_level="info")
finally:
    child.wait()
"""


def test_a_server_whose_port_was_taken_is_restarted_on_a_new_port(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        taken = holder.getsockname()[1]
        server = ServerProcess("late", [sys.executable, "-c", _LATE_BINDER, "--port", str(taken)],
                               dict(os.environ), taken, tmp_path)
        server.start()
        try:
            with pytest.raises(PortTakenError, match=f"late could not bind its port\\(s\\) --port {taken}"):
                server.wait_healthy(time.monotonic() + 60)
            assert server.is_running()  # up without an HTTP server: only the log says why
            server.stop(grace_s=5)
            server.proc = None
            server.start()  # the same taken port again: wait_healthy_rebinding must move it
            moves = wait_healthy_rebinding(server, time.monotonic() + 60)
            assert moves == [("--port", taken, server.port)] and server.port != taken
            assert "--port" in server.argv and server.argv[server.argv.index("--port") + 1] == str(server.port)
            assert requests.get(server.url + "/health", timeout=5).status_code == 200
        finally:
            server.stop(grace_s=5)


def test_free_port_is_below_the_ephemeral_range():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= p < low for p in ports) and len(ports) > 1, (low, ports)


def test_each_test_session_gets_its_own_log_folder(tmp_path):
    """Two sessions never share a log folder (the authenticated deployments' peer secret lives there);
    one named by SGLANG_PD_TEST_LOGS is used as given."""
    from sglang_pd.harness.test_logs import session_log_root

    base = tmp_path / "logs"
    first, second = session_log_root(None, base), session_log_root(None, base)
    assert first != second and first.parent == base and second.parent == base
    assert first.is_dir() and second.is_dir() and (first.stat().st_mode & 0o777) == 0o700
    assert f"-{os.getpid()}-" in first.name
    named = tmp_path / "mine"
    assert session_log_root(named, base) == named and not named.exists()


def test_private_files_are_written_mode_600_and_replaced_whole(tmp_path):
    """The harness's secret files (peer secret, API key): 0600 from creation; a rewrite truncates."""
    from sglang_pd.harness.test_logs import write_private_file

    path = write_private_file(tmp_path / "api_key", "a-much-longer-first-key\n")
    assert (path.stat().st_mode & 0o777) == 0o600 and path.read_text() == "a-much-longer-first-key\n"
    write_private_file(path, "short\n")
    assert path.read_text() == "short\n" and (path.stat().st_mode & 0o777) == 0o600


def test_extra_server_arguments_cannot_override_what_the_harness_sets():
    """An extra argument the harness already passes would be taken silently by SGLang (last one wins):
    refused, naming it; others are appended."""
    from sglang_pd.harness.deployment import with_extra_args

    base = ["--page-size", "1", "--attention-backend", "torch_native", "--disaggregation-mode", "decode"]
    assert with_extra_args(base, ("--disable-overlap-schedule",), "decode") == [*base, "--disable-overlap-schedule"]
    with pytest.raises(ValueError, match=r"extra decode server arguments \['--attention-backend', '--page-size'\]"):
        with_extra_args(base, ("--page-size=16", "--attention-backend", "triton"), "decode")


def test_bench_decode_args_are_parsed_and_refused_in_attach_mode():
    from sglang_pd import bench_multiturn as bm

    args = bm.parse_args(["--configs", "on", "--decode-arg=--disable-overlap-schedule"])
    assert args.decode_arg == ["--disable-overlap-schedule"]
    with pytest.raises(SystemExit):
        bm.parse_args(["--prefill-url", "http://p", "--decode-url", "http://d", "--bootstrap-port", "1",
                       "--decode-arg=--disable-overlap-schedule"])


def test_cpu_splits_put_decode_or_its_scheduler_alone_on_the_highest_cpu_and_refuse_bad_sets():
    from sglang_pd.harness.cpu_placement import CpuPlacement, split_placement

    whole = split_placement("decode", frozenset({0, 1}))
    assert (whole.decode, whole.prefill, whole.client, whole.decode_scheduler) == ({1}, {0}, {0}, None)
    assert whole.as_dict() == {"prefill": [0], "decode": [1], "client": [0]}
    sched = split_placement("decode-scheduler", frozenset({0, 1}))
    assert (sched.decode, sched.prefill, sched.client, sched.decode_scheduler) == ({0}, {0}, {0}, {1})
    assert not sched.main_thread_only
    step = split_placement("decode-step", frozenset({0, 1}))
    assert (step.decode_scheduler, step.main_thread_only) == ({1}, True)
    assert step.as_dict() == {"prefill": [0], "decode": [0], "client": [0], "decode_scheduler": [1],
                              "main_thread_only": True}
    with pytest.raises(ValueError, match="main_thread_only needs decode_scheduler"):
        CpuPlacement(prefill=frozenset({0}), decode=frozenset({0}), client=frozenset({0}), main_thread_only=True)
    with pytest.raises(ValueError, match=r"at least 2 CPUs .* \[0\]"):
        split_placement("decode", frozenset({0}))
    with pytest.raises(ValueError, match="unknown CPU split 'prefill'"):
        split_placement("prefill", frozenset({0, 1}))
    with pytest.raises(ValueError, match="decode CPUs"):
        CpuPlacement(prefill=frozenset({0}), decode=frozenset(), client=frozenset({0}))
    with pytest.raises(ValueError, match="decode_scheduler CPUs"):
        CpuPlacement(prefill=frozenset({0}), decode=frozenset({0}), client=frozenset({0}),
                     decode_scheduler=frozenset({os.cpu_count()}))


# A server whose child titles itself as SGLang's scheduler does, and starts a thread after it is moved.
_TITLED_SERVER = _SERVER.replace(
    'child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])',
    'child = subprocess.Popen([sys.executable, "-c", "import setproctitle, threading, time; '
    'setproctitle.setproctitle(\'sglang::scheduler\'); time.sleep(3); '
    'threading.Thread(target=time.sleep, args=(600,)).start(); time.sleep(600)"])')


def test_a_pinned_server_and_its_children_run_only_on_their_cpus(tmp_path):
    """The affinity set at start reaches the child the server forks; the scheduler-titled child is found
    and moved with its threads (a thread it starts later follows); check_group verifies every thread of
    the group and names one that runs elsewhere."""
    from sglang_pd.harness.cpu_placement import check_group, move_process, scheduler_pids, threads
    from sglang_pd.harness.server import group_pids

    available = os.sched_getaffinity(0)
    assert len(available) >= 2, "this test needs 2 CPUs (CI boxes have them)"
    low, high = frozenset({min(available)}), frozenset({max(available)})
    port = free_port()
    child_pid_file = tmp_path / "child.pid"
    server = ServerProcess("toy", [sys.executable, "-c", _TITLED_SERVER, str(port), str(child_pid_file)],
                           dict(os.environ), port, tmp_path, cpus=low)
    server.start()
    try:
        server.wait_healthy(time.monotonic() + 60)
        child = int(child_pid_file.read_text())
        assert child in group_pids(server.proc.pid) and os.sched_getaffinity(child) == low
        assert check_group(server.proc.pid, low, "toy") == 2
        assert os.sched_getaffinity(0) == available, "the parent keeps its own CPUs"
        deadline = time.monotonic() + 10
        while scheduler_pids(server.proc.pid) != [child] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scheduler_pids(server.proc.pid) == [child]
        assert move_process(child, high) == 1
        while len(threads(child)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(threads(child)) == 2, "the child started its second thread after the move"
        assert check_group(server.proc.pid, low, "toy", {child: high}) == 2
        with pytest.raises(RuntimeError, match=rf"toy: threads not on their CPUs: pid {child} thread {child} "
                                               rf"on \[{max(available)}\] \(want \[{min(available)}\]\)"):
            check_group(server.proc.pid, low, "toy")
        # only the main thread moved (split decode-step): its helper thread is expected where the rest is
        helper = [t for t in threads(child) if t != child][0]
        os.sched_setaffinity(helper, low)
        assert check_group(server.proc.pid, low, "toy", moved_threads={child: high}) == 2
        with pytest.raises(RuntimeError, match=rf"pid {child} thread {helper} on \[{min(available)}\]"):
            check_group(server.proc.pid, low, "toy", {child: high})
    finally:
        server.stop(grace_s=5)


def test_bench_cpu_split_is_parsed_and_refused_in_attach_mode():
    from sglang_pd import bench_multiturn as bm

    args = bm.parse_args(["--configs", "off,on", "--cpu-split", "decode-scheduler"])
    assert args.placement.decode_scheduler == {max(os.sched_getaffinity(0))}
    assert bm.parse_args(["--configs", "on"]).placement is None
    with pytest.raises(SystemExit):
        bm.parse_args(["--prefill-url", "http://p", "--decode-url", "http://d", "--bootstrap-port", "1",
                       "--cpu-split", "decode"])


def _placed_toy(tmp_path, split: str, name: str, script: str, role: str):
    """A deployment (never started) with CPU split `split`, and a toy server `name` (not started) running
    `script` on `role`'s CPUs, writing its child's pid to the returned file."""
    from sglang_pd.harness import DeploymentConfig, PDDeployment
    from sglang_pd.harness.cpu_placement import split_placement

    available = os.sched_getaffinity(0)
    assert len(available) >= 2, "this test needs 2 CPUs (CI boxes have them)"
    place = split_placement(split, frozenset(available))
    dep = PDDeployment(DeploymentConfig(cpu_placement=place, log_dir=tmp_path))
    port, pid_file = free_port(), tmp_path / f"{name}.pid"
    proc = ServerProcess(name, [sys.executable, "-c", script, str(port), str(pid_file)], dict(os.environ), port,
                         tmp_path, cpus=getattr(place, role))
    return dep, place, proc, pid_file


def test_a_deployment_checks_the_placement_of_a_router_it_starts(tmp_path):
    """`_apply_placement` on a router-like process (started by the deployment, not yet `dep.router`, as in
    `_start_routing`) checks it at once, and `check_placement` later names a thread that left its CPUs."""
    dep, place, router, child_pid_file = _placed_toy(tmp_path, "decode-step", "router", _SERVER, "client")
    router.start()
    try:
        router.wait_healthy(time.monotonic() + 60)
        assert dep.router is None
        dep._apply_placement([router])
        assert dep.placement_checked == {"router": 2}
        os.sched_setaffinity(int(child_pid_file.read_text()), place.decode_scheduler)
        with pytest.raises(RuntimeError, match="router: threads not on their CPUs"):
            dep.check_placement()
    finally:
        router.stop(grace_s=5)
    assert dep.check_placement() == {"router": 2}, "a stopped process is no longer checked"


# A server that is healthy only once its child has titled itself as SGLang's scheduler (as SGLang's
# /health answers only once its scheduler runs).
_SCHEDULER_SERVER = r"""
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import setproctitle, time; "
                          "setproctitle.setproctitle('sglang::scheduler'); time.sleep(600)"])
open(sys.argv[2], "a").write(f"{child.pid}\n")
def titled():
    try:
        return open(f"/proc/{child.pid}/cmdline", "rb").read().startswith(b"sglang::scheduler")
    except OSError:
        return False
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" and titled() else 503); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_restarted_decode_server_has_its_new_scheduler_moved_again(tmp_path):
    """Split decode-scheduler: `PDDeployment.restart` of a placed decode server moves the scheduler of the
    new run to the decode-scheduler CPU and checks it; the old scheduler's entry is dropped."""
    dep, place, decode, pids_file = _placed_toy(tmp_path, "decode-scheduler", "decode0", _SCHEDULER_SERVER, "decode")
    dep.decodes = [decode]
    decode.start()
    try:
        decode.wait_healthy(time.monotonic() + 60)
        dep._apply_placement([decode])
        first = int(pids_file.read_text().split()[0])
        assert os.sched_getaffinity(first) == place.decode_scheduler
        assert dep.placement_checked == {"decode0": 2}
        dep.restart(decode, time.monotonic() + 60)
        schedulers = [int(p) for p in pids_file.read_text().split()]
        assert len(schedulers) == 2 and schedulers[1] != first, schedulers
        assert os.sched_getaffinity(schedulers[1]) == place.decode_scheduler, "the new scheduler was moved"
        assert os.sched_getaffinity(decode.proc.pid) == place.decode, "the server itself kept its CPUs"
        assert dep.placement_checked == {"decode0": 2}
        assert dep._placement._moved == {"decode0": schedulers[1]}
        assert set(dep._placement._moved_processes) == {schedulers[1]}, "the old scheduler's entry is dropped"
        os.sched_setaffinity(schedulers[1], place.decode)
        with pytest.raises(RuntimeError, match=rf"decode0: threads not on their CPUs: pid {schedulers[1]}"):
            dep.check_placement()
    finally:
        decode.stop(grace_s=5)
