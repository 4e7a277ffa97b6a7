"""Every port a server of ours binds is the harness's choice, and a start that lost one to another
socket is retried on fresh ports (harness/ports.py). Toy servers bind their ports the way SGLang's
processes do (a real torch TCPStore for --nccl-port, asyncio servers for HTTP and bootstrap); no
SGLang server is started."""

import os
import socket
import sys
import time

import pytest
import requests

from sglang_pd.harness.deployment import BOOTSTRAP_FLAG, NCCL_FLAG, DeploymentConfig, PDDeployment
from sglang_pd.harness.ports import free_port, taken_flags
from sglang_pd.harness.server import PortTakenError, ServerProcess, wait_healthy_rebinding

pytestmark = pytest.mark.unit

# The lines each binder writes when its port is taken, as logged on this box (SGLang 0.5.23's scheduler
# through torch's TCPStore; uvicorn and aiohttp through asyncio; sglang-router 0.3.2).
TORCH_LINE = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
              "address. port: 23876, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
ASYNCIO_LINE = ("[2026-11-28 05:25:26] Server error: [Errno 98] error while attempting to bind on address "
                "('127.0.0.1', 24001): address already in use")
ROUTER_LINE = "Error starting router: Address already in use (os error 98)"


def test_the_log_line_of_a_lost_port_names_the_flag_it_was_given_for():
    ports = {"--port": 24001, NCCL_FLAG: 23876, BOOTSTRAP_FLAG: 25000}
    assert taken_flags(TORCH_LINE, ports) == [NCCL_FLAG]
    assert taken_flags(ASYNCIO_LINE, ports) == ["--port"]
    assert taken_flags(f"{TORCH_LINE}\n{ASYNCIO_LINE}", ports) == ["--port", NCCL_FLAG]
    assert taken_flags(ROUTER_LINE, {"--port": 1, "--prometheus-port": 2}) == ["--port", "--prometheus-port"]
    assert taken_flags(TORCH_LINE.replace("23876", "23877"), ports) == []  # another process's port: not ours
    assert taken_flags("Scheduler hit an exception: CUDA out of memory", ports) == []


def test_free_port_never_hands_out_one_port_twice():
    ports = [free_port() for _ in range(300)]
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    assert len(set(ports)) == 300 and all(20000 <= p < low for p in ports)


def test_a_deployment_gives_each_server_every_port_it_binds(tmp_path):
    dep = PDDeployment(DeploymentConfig(num_decode=2, with_plain=True, log_dir=tmp_path))
    owned = {s.name: s.ports for s in dep.servers}
    assert set(owned["prefill"]) == {"--port", NCCL_FLAG, BOOTSTRAP_FLAG}
    assert all(set(owned[n]) == {"--port", NCCL_FLAG} for n in ("decode0", "decode1", "plain"))
    values = [p for ports in owned.values() for p in ports.values()]
    assert len(values) == len(set(values)) == 3 + 2 * 3  # no two alike, none left to SGLang
    for server in dep.servers:
        for flag, port in server.ports.items():
            assert server.argv[server.argv.index(flag) + 1] == str(port)
    assert dep.bootstrap_port == owned["prefill"][BOOTSTRAP_FLAG]
    for extra in (("--nccl-port", "23876"), ("--port=30000",)):
        with pytest.raises(ValueError, match=r"decode0: \['--(nccl-)?port'\] are chosen by the harness"):
            PDDeployment(DeploymentConfig(extra_decode_args=extra, log_dir=tmp_path))


# As SGLang's scheduler does: the rendezvous TCPStore on --nccl-port first (the process exits when it
# cannot listen), then an HTTP server on --port; with --bootstrap, an aiohttp-style asyncio server on that
# port whose failure is only logged (the process stays up and healthy, as SGLang's prefill does).
_TOY = r"""
import asyncio, datetime, http.server, sys, threading, traceback
from torch.distributed import TCPStore
arg = lambda flag: int(sys.argv[sys.argv.index(flag) + 1])
try:
    store = TCPStore("127.0.0.1", arg("--nccl-port"), 1, True, timeout=datetime.timedelta(seconds=5))
except Exception:
    traceback.print_exc(); sys.stdout.flush(); sys.exit(1)
if "--bootstrap" in sys.argv:
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.start_server(lambda r, w: None, "127.0.0.1", arg("--bootstrap")))
    except OSError as exc:
        print(f"Server error: {exc}", flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", arg("--port")), H).serve_forever()
"""


def _toy(tmp_path, name: str, ports: dict[str, int]) -> ServerProcess:
    argv = [sys.executable, "-c", _TOY, *[str(a) for kv in ports.items() for a in kv]]
    return ServerProcess(name, argv, dict(os.environ), ports["--port"], tmp_path,
                         other_ports={f: p for f, p in ports.items() if f != "--port"})


def _held() -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", free_port()))
    holder.listen()
    return holder


def test_a_server_that_lost_its_nccl_port_is_restarted_on_a_fresh_one(tmp_path):
    with _held() as holder:
        taken = holder.getsockname()[1]
        server = _toy(tmp_path, "sched", {"--port": free_port(), NCCL_FLAG: taken})
        server.start()
        try:
            http_port = server.port
            moves = wait_healthy_rebinding(server, time.monotonic() + 60)
            assert moves == [(NCCL_FLAG, taken, server.ports[NCCL_FLAG])] and server.ports[NCCL_FLAG] != taken
            assert server.port == http_port  # only the lost port moves
            assert requests.get(server.url + "/health", timeout=5).status_code == 200
        finally:
            server.stop(grace_s=5)


def test_a_healthy_server_whose_bootstrap_port_was_taken_is_not_taken_as_started(tmp_path):
    with _held() as holder:
        taken = holder.getsockname()[1]
        server = _toy(tmp_path, "prefill", {"--port": free_port(), NCCL_FLAG: free_port(), "--bootstrap": taken})
        server.start()
        try:
            with pytest.raises(PortTakenError, match=f"prefill could not bind its port\\(s\\) --bootstrap {taken}"):
                server.wait_healthy(time.monotonic() + 60)
            assert server.is_running()  # up and answering: only its log says the bootstrap server is missing
            server.stop(grace_s=5)
            server.proc = None
            server.start()
            moves = wait_healthy_rebinding(server, time.monotonic() + 60)
            assert [m[:2] for m in moves] == [("--bootstrap", taken)] and server.ports["--bootstrap"] != taken
        finally:
            server.stop(grace_s=5)
