"""launch_router: argument parsing, the router command line, and the preflight's clear errors
(against small HTTP workers that answer /health and /sglang_pd/info like real ones)."""

import http.server
import json
import threading

import pytest

from sglang_pd import launch_router as lr

pytestmark = pytest.mark.unit


class _Worker:
    def __init__(self, info: dict | None, health: int = 200):
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body, code = b"", 404
                if self.path == "/health":
                    code = worker.health
                elif self.path == "/sglang_pd/info" and worker.info is not None:
                    body, code = json.dumps(worker.info).encode(), 200
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.info, self.health = info, health
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


def test_bad_prefill_argument_is_refused(capsys):
    with pytest.raises(SystemExit):
        lr.parse_args(["--prefill", "http://p:1", "port", "--decode", "http://d:2"])
    assert "--prefill takes URL [BOOTSTRAP_PORT]" in capsys.readouterr().err
