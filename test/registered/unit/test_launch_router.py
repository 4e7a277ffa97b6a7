"""launch_router: argument parsing, the router command line, and the preflight's clear errors
(against small HTTP workers that answer /health and /sglang_pd/info like real ones)."""

import http.server
import json
import os
import threading

import pytest

from sglang_pd import launch_router as lr

pytestmark = pytest.mark.unit


class _Worker:
    def __init__(self, info: dict | None, health: int = 200, listing=None, api_key: str | None = None):
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body, code = b"", 404
                if self.path == "/health":  # open with or without a key, as SGLang's
                    code = worker.health
                elif worker.api_key and self.headers.get("Authorization") != f"Bearer {worker.api_key}":
                    code = 401
                elif self.path == "/sglang_pd/info" and worker.info is not None:
                    body, code = json.dumps(worker.info).encode(), 200
                elif self.path == "/workers" and worker.listing is not None:  # a router's worker list
                    body, code = json.dumps({"workers": worker.listing()}).encode(), 200
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.info, self.health, self.listing, self.api_key = info, health, listing, api_key
        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _info(role, page=16, model="/m/tiny", backend="mooncake_tcp"):
    return {"role": role, "page_size": page, "model_path": model, "transfer_backend": backend}


@pytest.fixture
def workers():
    made = []

    def make(*args, **kwargs):
        made.append(_Worker(*args, **kwargs))
        return made[-1]

    yield make
    for w in made:
        w.server.shutdown()


def test_consistent_deployment_passes(workers):
    p, d1, d2 = workers(_info("prefill")), workers(_info("decode")), workers(_info("decode"))
    found = lr.preflight([p.url], [d1.url, d2.url])
    assert [w.role for w in found] == ["prefill", "decode", "decode"]


@pytest.mark.parametrize("decode_info,needle", [
    (_info("decode", page=1), "workers disagree on page_size"),
    (_info("decode", model="/m/other"), "workers disagree on model_path"),
    (_info("prefill"), "given as decode but the server runs as prefill"),
    (None, "is the sglang_pd plugin installed there?"),
])
def test_inconsistent_deployment_is_named(workers, decode_info, needle):
    p, d = workers(_info("prefill")), workers(decode_info)
    with pytest.raises(lr.PreflightError, match=needle):
        lr.preflight([p.url], [d.url])


def test_unhealthy_and_unreachable_workers(workers):
    sick = workers(_info("decode"), health=503)
    p = workers(_info("prefill"))
    with pytest.raises(lr.PreflightError, match="/health did not answer 200"):
        lr.preflight([p.url], [sick.url])
    with pytest.raises(lr.PreflightError, match="not reachable"):
        lr.preflight([p.url], ["http://127.0.0.1:9"])


def test_router_command_line_per_policy():
    args = lr.parse_args(["--prefill", "http://p:1/", "8998", "--decode", "http://d1:2", "--decode", "http://d2:3",
                          "--port", "4000"])
    argv = lr.router_argv(args)
    assert argv[argv.index("--prefill") + 1:argv.index("--prefill") + 3] == ["http://p:1", "8998"]
    assert argv.count("--decode") == 2 and "--pd-disaggregation" in argv
    assert argv[argv.index("--decode-policy") + 1] == "manual"
    rr = lr.router_argv(lr.parse_args(["--prefill", "http://p:1", "--decode", "http://d:2", "--policy", "round_robin"]))
    assert rr[rr.index("--prefill") + 2] == "none" and rr[rr.index("--policy") + 1] == "round_robin"
    # the router's metrics server binds where the router does (sglang-router's own default is 0.0.0.0)
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    own = lr.router_argv(lr.parse_args(["--prefill", "http://p:1", "--decode", "http://d:2",
                                        "--router-arg=--prometheus-host=10.0.0.5"]))
    assert own.count("--prometheus-host") == 0 and own[-1] == "--prometheus-host=10.0.0.5"


def test_bad_prefill_argument_is_refused(capsys):
    with pytest.raises(SystemExit):
        lr.parse_args(["--prefill", "http://p:1", "port", "--decode", "http://d:2"])
    assert "--prefill takes URL [BOOTSTRAP_PORT]" in capsys.readouterr().err


def _listed(url: str, healthy: bool = True) -> dict:
    return {"url": url, "is_healthy": healthy, "worker_type": "decode", "load": 0}


def test_unregistered_names_workers_missing_or_unhealthy(workers):
    router = workers(None, listing=lambda: [_listed("http://d1:2/"), _listed("http://d2:3", healthy=False)])
    assert lr.unregistered(router.url, ["http://p:1", "http://d1:2", "http://d2:3"]) == ["http://p:1", "http://d2:3"]
    assert lr.unregistered(router.url, ["http://d1:2"]) == []


def test_wait_registered_waits_for_the_late_worker_then_returns(workers):
    """The router lists the second decode server only from the 3rd poll on (as sglang-router does when
    it answers /readiness before registering every worker)."""
    polls = []

    def listing():
        polls.append(1)
        return [_listed("http://d1:2")] + ([_listed("http://d2:3")] if len(polls) >= 3 else [])

    router = workers(None, listing=listing)
    lr.wait_registered(router.url, ["http://d1:2", "http://d2:3"], timeout_s=30, poll_s=0.01)
    assert len(polls) == 3


def test_wait_registered_times_out_naming_the_missing_worker(workers):
    router = workers(None, listing=lambda: [_listed("http://d1:2")])
    with pytest.raises(lr.RouterNotReady, match=r"has not registered as healthy: http://d2:3$"):
        lr.wait_registered(router.url, ["http://d1:2", "http://d2:3"], timeout_s=0.1, poll_s=0.01)
    with pytest.raises(lr.RouterNotReady, match="http://d1:2, http://d2:3"):  # router not even listening
        lr.wait_registered("http://127.0.0.1:9", ["http://d1:2", "http://d2:3"], timeout_s=0.1, poll_s=0.01)


def test_watcher_prints_ready_or_warns(workers, capsys):
    pid = os.getppid()  # the watcher compares its parent's PID with the router's
    full = workers(None, listing=lambda: [_listed("http://d1:2")])
    lr._watch_readiness(full.url, ["http://d1:2"], timeout_s=5, router_pid=pid)
    assert f"launch_router: ready: {full.url} routes to all 1 workers" in capsys.readouterr().out
    lr._watch_readiness(full.url, ["http://d1:2", "http://d9:9"], timeout_s=0.1, router_pid=pid)
    err = capsys.readouterr().err
    assert "launch_router: WARNING: router" in err and err.rstrip().endswith("http://d9:9")


def test_bad_ready_timeout_is_refused(capsys):
    with pytest.raises(SystemExit):
        lr.parse_args(["--prefill", "http://p:1", "--decode", "http://d:2", "--ready-timeout", "0"])
    assert "--ready-timeout must be > 0 seconds, got 0.0" in capsys.readouterr().err


def test_servers_behind_an_api_key_need_the_key_file(workers, tmp_path):
    """Servers started with SGLang's --api-key answer /sglang_pd/info with 401 without the key: the
    preflight says so, passes with the key, and the router is given it (so it sends it to the workers)."""
    key = "k-" + "x" * 30
    p, d = workers(_info("prefill"), api_key=key), workers(_info("decode"), api_key=key)
    with pytest.raises(lr.PreflightError, match="answered 401: the server runs with --api-key; pass --api-key-file"):
        lr.preflight([p.url], [d.url])
    with pytest.raises(lr.PreflightError, match="this --api-key-file holds another key"):
        lr.preflight([p.url], [d.url], "wrong")
    assert [w.role for w in lr.preflight([p.url], [d.url], key)] == ["prefill", "decode"]
    path = tmp_path / "api_key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    assert lr.read_api_key(path) == key
    args = lr.parse_args(["--prefill", p.url, "--decode", d.url, "--api-key-file", str(path)])
    args.api_key = lr.read_api_key(args.api_key_file)
    argv = lr.router_argv(args)
    assert argv[argv.index("--api-key") + 1] == key
    assert "--api-key" not in lr.router_argv(lr.parse_args(["--prefill", p.url, "--decode", d.url]))
    router = workers(None, listing=lambda: [{"url": p.url, "is_healthy": True}], api_key=key)
    assert lr.unregistered(router.url, [p.url], api_key=key) == []


@pytest.mark.parametrize("content, mode, message", [
    ("k" * 32, 0o644, "readable by group or others (mode 644); chmod 600 it"),
    ("", 0o600, "must hold exactly one key on one line, without spaces"),
    ("a b", 0o600, "must hold exactly one key on one line, without spaces"),
    ("one\ntwo", 0o600, "must hold exactly one key on one line, without spaces"),
])
def test_a_bad_api_key_file_is_named_without_its_content(tmp_path, content, mode, message):
    path = tmp_path / "api_key"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(lr.PreflightError) as info:
        lr.read_api_key(path)
    assert str(info.value) == f"--api-key-file {path}: {message}"
    with pytest.raises(lr.PreflightError, match="cannot be read"):
        lr.read_api_key(tmp_path / "missing")


def test_main_refuses_a_bad_api_key_file_before_starting_anything(tmp_path, capsys):
    path = tmp_path / "api_key"
    path.write_text("k" * 32)
    path.chmod(0o640)
    assert lr.main(["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9",
                    "--api-key-file", str(path)]) == 2
    assert "readable by group or others" in capsys.readouterr().err
