"""launch_router: argument parsing, the router command line, and the preflight's clear errors
(against small HTTP workers that answer /health and /sglang_pd/info like real ones); router_child, which
gives sglang-router its API key through a pipe; and a real sglang-router started by the launcher with a
key, which no process's command line shows."""

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from sglang_pd import launch_router as lr
from sglang_pd import router_child
from sglang_pd.harness.server import free_port

pytestmark = pytest.mark.unit


class _Worker:
    """A stand-in server. `answer_all`: any other path answers 200 `{}` (what a real sglang-router needs
    from a worker's /server_info, /model_info and /generate to register it and route to it)."""

    def __init__(self, info: dict | None, health: int = 200, listing=None, api_key: str | None = None,
                 answer_all: bool = False):
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                worker.seen.append((self.path, self.headers.get("Authorization")))
                body, code = b"", 404
                if self.path == "/health":  # open with or without a key, as SGLang's
                    code = worker.health
                elif worker.api_key and self.headers.get("Authorization") != f"Bearer {worker.api_key}":
                    code = 401
                elif self.path == "/sglang_pd/info" and worker.info is not None:
                    body, code = json.dumps(worker.info).encode(), 200
                elif self.path == "/workers" and worker.listing is not None:  # a router's worker list
                    body, code = json.dumps({"workers": worker.listing()}).encode(), 200
                elif worker.answer_all:
                    body, code = b"{}", 200
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args):
                pass

        self.info, self.health, self.listing, self.api_key = info, health, listing, api_key
        self.answer_all, self.seen = answer_all, []
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
    argv = lr.router_argv(args, key_fd=7)
    # the key is not on the router's command line (local users could read it with ps): only its pipe is
    assert not any(key in a for a in argv) and "--api-key" not in argv
    assert argv[2:5] == ["sglang_pd.router_child", "--api-key-fd", "7"]
    with pytest.raises(ValueError, match="a key was given: pass key_fd"):  # never a router without its key
        lr.router_argv(args)
    plain = lr.router_argv(lr.parse_args(["--prefill", p.url, "--decode", d.url]))
    assert "--api-key" not in plain and "--api-key-fd" not in plain
    router = workers(None, listing=lambda: [{"url": p.url, "is_healthy": True}], api_key=key)
    assert lr.unregistered(router.url, [p.url], api_key=key) == []


@pytest.mark.parametrize("content, mode, message", [
    ("k" * 32, 0o644, "readable or writable by group or others (mode 644); chmod 600 it"),
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


@pytest.mark.parametrize("flag", ["--router-arg=--api-key=k", "--router-arg=--api-key", "--router-arg=--api",
                                  "--router-arg=--ap=k", "--router-arg=--control-plane-api-keys=a:b:admin:s",
                                  "--router-arg=--control-plane-ap", "--router-arg=--oracle-password=p",
                                  "--router-arg=--postgres-db-url=postgres://u:p@h/d", "--router-arg=--redis-u"])
def test_a_router_arg_carrying_a_credential_is_refused(flag, capsys):
    """--router-arg with one of sglang-router's credential flags (or an abbreviation its argparse would
    take) would put the credential on the router's command line."""
    with pytest.raises(SystemExit):
        lr.parse_args(["--prefill", "http://p:1", "--decode", "http://d:2", flag])
    err = capsys.readouterr().err
    name = lr.secret_flag(flag.split("=", 1)[1])
    assert name is not None and f"--router-arg {name} would show its value to every local user (ps); " in err
    assert lr.SECRET_ROUTER_FLAGS[name][1] in err


def test_router_args_that_carry_no_credential_pass():
    for arg in ("--assignment-mode=x", "--control-plane-audit-enabled", "--oracle-username=u", "--redis-pool-max=4",
                "--postgres-pool-max=2", "--tls-key-path=/k", "--client-key-path=/k"):
        assert lr.parse_args(["--prefill", "http://p:1", "--decode", "http://d:2", f"--router-arg={arg}"])


def test_secret_flags_match_what_sglang_routers_parser_takes():
    """Every prefix of every sglang-router flag: flagged by secret_flag exactly when sglang-router's own
    parser would read it as one of the credential flags (whole or abbreviated)."""
    import argparse

    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    actions = parser._option_string_actions  # flag -> action, the table argparse resolves prefixes in
    secret_dests = {actions[name].dest for name in lr.SECRET_ROUTER_FLAGS}
    assert len(secret_dests) == len(lr.SECRET_ROUTER_FLAGS)  # every listed flag is one of the router's
    checked = 0
    for option in [o for o in actions if o.startswith("--")]:
        for n in range(3, len(option) + 1):
            prefix = option[:n]
            dests = {actions[o].dest for o in actions if o.startswith(prefix)}
            if prefix not in actions and len(dests) != 1:
                continue  # argparse refuses an ambiguous abbreviation itself
            dest = actions[prefix].dest if prefix in actions else dests.pop()
            named = lr.secret_flag(prefix)
            assert (named is not None) == (dest in secret_dests), prefix
            assert named is None or actions[named].dest == dest, prefix
            checked += 1
    assert checked > 500


def test_main_refuses_a_bad_api_key_file_before_starting_anything(tmp_path, capsys):
    path = tmp_path / "api_key"
    path.write_text("k" * 32)
    path.chmod(0o640)
    assert lr.main(["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9",
                    "--api-key-file", str(path)]) == 2
    assert "readable or writable by group or others" in capsys.readouterr().err


def test_router_child_reads_the_key_from_the_pipe_once():
    fd = router_child.pass_key("k-" + "y" * 30)
    assert os.get_inheritable(fd)  # it must survive the launcher's exec
    assert router_child.read_key(fd) == "k-" + "y" * 30
    with pytest.raises(OSError):  # read to its end and closed
        os.fstat(fd)
    with pytest.raises(ValueError, match="must be 1..4096 bytes"):
        router_child.pass_key("k" * 4097)


def _pipe_holding(data: bytes) -> int:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    return read_fd


@pytest.mark.parametrize("data, message", [
    (b"", "no API key in the pipe (empty, or not one word)"),
    (b"two words", "no API key in the pipe (empty, or not one word)"),
    (b"\xff\xfe", "the key is not UTF-8 text"),
    (b"k" * 5000, "more than 4096 bytes, not a key from our launcher"),
])
def test_router_child_names_a_bad_pipe_without_its_content(data, message):
    fd = _pipe_holding(data)
    with pytest.raises(router_child.KeyNotReadable) as info:
        router_child.read_key(fd)
    assert str(info.value) == f"--api-key-fd {fd}: {message}"


def test_router_child_without_its_key_exits_2_and_starts_nothing(tmp_path):
    """A descriptor that is not open (the key never arrived): exit 2 naming it, no router listening."""
    port = free_port()
    argv = [sys.executable, "-m", "sglang_pd.router_child", "--api-key-fd", "97", "--pd-disaggregation",
            "--host", "127.0.0.1", "--port", str(port), "--prefill", "http://127.0.0.1:9", "none",
            "--decode", "http://127.0.0.1:9"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert ("router_child: --api-key-fd 97: cannot be read (Bad file descriptor); not starting the router "
            "without its API key") in out.stderr
    for bad in (["--api-key-fd"], ["--api-key-fd", "x"]):
        assert router_child.main(bad + ["--pd-disaggregation"]) == 2


def _descendants(root: int) -> list[int]:
    """`root` and every process below it (read from /proc: ppid is field 4 of /proc/<pid>/stat)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier]
        tree += frontier
    return tree


def _read_proc(pid: int, name: str) -> bytes:
    try:
        return (Path("/proc") / str(pid) / name).read_bytes()
    except OSError:
        return b""  # exited meanwhile


def test_a_real_router_with_a_key_keeps_it_off_every_command_line(workers, tmp_path):
    """The launcher starts a real sglang-router with a key: from the launcher's start until the router
    routes, no process of its tree shows the key in /proc/<pid>/cmdline (nor environ); the router answers
    401 without the key and routes with it, sending it to the workers."""
    key = "k-" + os.urandom(16).hex()
    p = workers(_info("prefill"), api_key=key, answer_all=True)
    d = workers(_info("decode"), api_key=key, answer_all=True)
    path = tmp_path / "api_key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    port, log = free_port(), tmp_path / "launcher.log"
    with log.open("wb") as out:
        launcher = subprocess.Popen([sys.executable, "-m", "sglang_pd.launch_router", "--prefill", p.url,
                                     "--decode", d.url, "--port", str(port), "--api-key-file", str(path),
                                     "--router-arg=--log-level", "--router-arg=warn",
                                     "--router-arg=--health-check-interval-secs", "--router-arg=1"],
                                    stdout=out, stderr=subprocess.STDOUT)
    try:
        seen = _watch_tree_until_ready(launcher, log)
        leaks = sorted(pid for pid, samples in seen.items() if any(key.encode() in s for s in samples))
        assert not leaks, f"the key is on the command line or in the environment of processes {leaks}"
        # we did watch the router as exec'd (before it retitled itself), and it got its key by the pipe
        assert any(b"\0--pd-disaggregation\0" in s for s in seen[launcher.pid])
        assert any(b"-m\0sglang_pd.router_child\0--api-key-fd\0" in s for s in seen[launcher.pid])
        url = f"http://127.0.0.1:{port}"
        assert requests.get(url + "/workers", timeout=30).status_code == 401
        assert requests.post(url + "/generate", json={"input_ids": [1, 2, 3]}, timeout=30).status_code == 401
        keyed = lr.auth_headers(key)
        assert requests.get(url + "/workers", headers=keyed, timeout=30).status_code == 200
        assert requests.post(url + "/generate", json={"input_ids": [1, 2, 3]}, headers=keyed,
                             timeout=30).status_code != 401
        # the router itself (not only our preflight) sent the key to each worker
        for worker in (p, d):
            assert any(auth == f"Bearer {key}" for path_, auth in worker.seen
                       if path_ not in ("/health", "/sglang_pd/info")), worker.seen
        assert key not in log.read_text(errors="replace")
    finally:
        launcher.terminate()
        try:
            launcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()


def _watch_tree_until_ready(launcher: subprocess.Popen, log: Path, timeout_s: float = 90) -> dict[int, set[bytes]]:
    """Sample the cmdline and environ of every process under the launcher every few ms until it prints
    its ready line (sglang-router retitles itself once started, so only a watch from the first moment
    sees what its command line was); {pid: the distinct samples}."""
    seen: dict[int, set[bytes]] = {}
    deadline = time.monotonic() + timeout_s
    while b"launch_router: ready:" not in log.read_bytes():
        assert launcher.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        for pid in _descendants(launcher.pid):
            seen.setdefault(pid, set()).update({_read_proc(pid, "cmdline"), _read_proc(pid, "environ")})
        time.sleep(0.01)  # the window to catch (interpreter start, sglang-router imports) lasts seconds
    return seen
