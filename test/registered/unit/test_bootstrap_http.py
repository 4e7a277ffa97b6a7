"""SGLang's real bootstrap HTTP server behind our guard; SGLang's real `requests` calls signed by our hook.

The server is `CommonKVBootstrapServer` itself (aiohttp, on a free loopback port) with the HOOK_TABLE
rows on `_setup_routes` and `requests.sessions.Session.request` applied through SGLang's HookRegistry,
as in a server process. An impostor speaks plain urllib (no hook) with no or a wrong tag.
"""

import http.client
import http.server
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import requests

from sglang_pd.harness.server import free_port
from sglang_pd.srt.hooks.table import HOOK_TABLE
from sglang_pd.srt.state import current
from sglang_pd.srt.http.bootstrap_checks import names_this_server, route_put_problem
from sglang_pd.srt.auth import HTTP_HEADER, BootstrapAddresses, PeerAuth, PeerSources
from sglang_pd.srt.handshake.peer_defenses import HttpGuardCounts

pytestmark = pytest.mark.unit

KEY = b"s" * 40
RANK = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
        "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
        "rank_ip": "127.0.0.1", "rank_port": 40000, "page_size": 16, "kv_cache_dtype": "float32"}


@pytest.fixture(scope="module")
def hooks_applied():
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for spec in HOOK_TABLE:
        if spec.target.endswith(("_setup_routes", "Session.request")):
            HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
    HookRegistry.apply_hooks()


@pytest.fixture
def server(hooks_applied, request):
    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    current().peer_guard.auth = PeerAuth([KEY]) if request.param else None
    current().peer_guard.sources = PeerSources(authenticated=bool(request.param), allow_remote=False)
    current().peer_guard.http = HttpGuardCounts()
    current().peer_guard.bootstrap_addresses = BootstrapAddresses([("127.0.0.1", None)])  # the hook signs for it
    srv = CommonKVBootstrapServer("127.0.0.1", free_port())
    url = f"http://127.0.0.1:{srv.port}"
    deadline = time.monotonic() + 10
    while True:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            assert time.monotonic() < deadline, "bootstrap server did not start"
            time.sleep(0.05)
    yield srv, url
    srv.close()
    current().peer_guard.auth = None


def _urllib(method, url, body=None, header=None):
    req = urllib.request.Request(url, data=body, method=method, headers={HTTP_HEADER: header} if header else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.parametrize("server", [False], indirect=True)
def test_without_auth_bad_registrations_are_refused_before_sglang_stores_them(server):
    srv, url = server
    assert requests.put(url + "/route", json={**RANK, "attn_tp_size": "abc"}, timeout=5).status_code == 400
    assert requests.put(url + "/route", json={**RANK, "attn_tp_rank": 1}, timeout=5).status_code == 400
    assert srv.attn_tp_size is None and srv._registered_count == 0  # nothing stored
    assert requests.put(url + "/route", json=RANK, timeout=5).status_code == 200
    info = requests.get(url + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
                        timeout=5)
    assert info.status_code == 200 and info.json()["rank_port"] == 40000
    assert requests.get(url + "/route?prefill_dp_rank=x&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
                        timeout=5).status_code == 400
    resized = {**RANK, "attn_tp_size": 2, "attn_tp_rank": 1}
    assert requests.put(url + "/route", json=resized, timeout=5).status_code == 400


@pytest.mark.parametrize("server", [True], indirect=True)
def test_with_auth_only_signed_requests_register_and_answers_are_verified(server):
    srv, url = server
    body = json.dumps({**RANK, "rank_ip": "6.6.6.6"}).encode()
    assert _urllib("PUT", url + "/route", body)[0] == 401                                   # no tag
    me = f"127.0.0.1:{srv.port}"
    forged, _ = PeerAuth([b"w" * 40]).sign_http_request("PUT", "/route", body, me)
    assert _urllib("PUT", url + "/route", body, forged)[0] == 401                            # wrong secret
    good = json.dumps(RANK).encode()
    for elsewhere in (f"127.0.0.1:{srv.port + 1}", f"10.9.9.9:{srv.port}"):                # signed for another server
        other, _ = PeerAuth([KEY]).sign_http_request("PUT", "/route", good, elsewhere)
        assert _urllib("PUT", url + "/route", good, other)[0] == 401
    signed, _ = PeerAuth([KEY]).sign_http_request("PUT", "/route", good, me)
    assert _urllib("PUT", url + "/route", body, signed)[0] == 401                            # body changed
    assert srv._registered_count == 0
    assert _urllib("PUT", url + "/route", good, signed)[0] == 200                            # the real rank
    assert _urllib("PUT", url + "/route", good, signed)[0] == 401                            # its replay
    assert requests.put(url + "/route", json=RANK, timeout=5).status_code == 200  # SGLang's call, signed by the hook
    assert srv._registered_count == 2
    got = requests.get(url + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
                       timeout=5)
    assert got.status_code == 200 and got.json()["rank_ip"] == "127.0.0.1"
    refused = current().peer_guard.http.snapshot()["auth_refused"]
    assert [refused.get(k) for k in ("missing", "unknown_key", "bad_mac", "replayed", "wrong_receiver")] == [1, 1, 1, 1, 2]


ROUTE_0 = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"


def _from_source(source: str, port: int, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    """One request to 127.0.0.1:`port` sent from the address `source` (a stranger on 127.0.0.2: not this host's)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("server", [False], indirect=True)
def test_without_auth_only_this_host_talks_and_a_registered_rank_stays_where_it_registered(server):
    srv, url = server
    assert requests.put(url + "/route", json=RANK, timeout=5).status_code == 200
    assert requests.put(url + "/route", json=RANK, timeout=5).status_code == 200  # the same endpoint again: fine
    moved = requests.put(url + "/route", json={**RANK, "rank_port": 40666}, timeout=5)
    assert moved.status_code == 409 and "is registered at 127.0.0.1:40000" in moved.text, moved.text
    assert requests.get(url + ROUTE_0, timeout=5).json()["rank_port"] == 40000
    for method, path, body in (("PUT", "/route", {**RANK, "rank_port": 40666}), ("GET", ROUTE_0, None),
                               ("POST", "/query_dp_ranks", {"bootstrap_rooms": [1]})):
        status, text = _from_source("127.0.0.2", srv.port, method, path, body)
        assert status == 403 and "its own host only" in text, (method, path, status, text)
    assert _from_source("127.0.0.1", srv.port, "GET", ROUTE_0)[0] == 200
    assert requests.get(url + ROUTE_0, timeout=5).json()["rank_port"] == 40000
    assert current().peer_guard.http.snapshot()["route_moves_refused"] == {"/route": 1}
    assert current().peer_guard.sources.snapshot()["refused_by_source"] == {"127.0.0.2": 3}


@pytest.mark.parametrize("server", [True], indirect=True)
def test_with_auth_a_signed_registration_may_move_a_rank_and_the_mac_decides_for_every_source(server):
    srv, url = server
    assert requests.put(url + "/route", json=RANK, timeout=5).status_code == 200          # signed by the hook
    assert requests.put(url + "/route", json={**RANK, "rank_port": 40666}, timeout=5).status_code == 200
    assert requests.get(url + ROUTE_0, timeout=5).json()["rank_port"] == 40666
    status, text = _from_source("127.0.0.2", srv.port, "PUT", "/route", {**RANK, "rank_port": 40777})
    assert status == 401, (status, text)                                                   # unsigned: the MAC says no
    assert requests.get(url + ROUTE_0, timeout=5).json()["rank_port"] == 40666
    assert current().peer_guard.sources.snapshot()["num_refused"] == 0


class _FakeBootstrap(http.server.BaseHTTPRequestHandler):
    """A fake bootstrap server steering decode to an attacker's 'prefill rank'; keeps each request's auth header."""

    seen: list = []

    def do_GET(self):
        _FakeBootstrap.seen.append((self.path, self.headers.get(HTTP_HEADER)))
        body = json.dumps({"rank_ip": "6.6.6.6", "rank_port": 6666}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_untagged_answer_is_a_401_to_sglang(hooks_applied):
    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeBootstrap)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    current().peer_guard.auth = PeerAuth([KEY])
    current().peer_guard.bootstrap_addresses = BootstrapAddresses([("127.0.0.1", fake.server_address[1])])
    try:
        url = f"http://127.0.0.1:{fake.server_address[1]}/route?prefill_dp_rank=0&prefill_cp_rank=0"
        got = requests.get(url, timeout=5)
        assert got.status_code == 401 and b"6.6.6.6" not in got.content
        assert requests.get(f"http://127.0.0.1:{fake.server_address[1]}/other", timeout=5).status_code == 200
    finally:
        current().peer_guard.auth = None
        fake.shutdown()


def test_with_auth_a_bootstrap_request_to_an_unlisted_address_is_never_sent(hooks_applied):
    """SGLang's own call to a bootstrap address outside SGLANG_PD_BOOTSTRAP_ADDRESSES: nothing reaches that
    address (no signed request to replay), SGLang reads a 403 naming the setting, counted per address;
    a listed host (any port), a listed host:port and prefill's own address are signed and sent."""
    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeBootstrap)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    port = fake.server_address[1]
    route = f"http://127.0.0.1:{port}/route?prefill_dp_rank=0&prefill_cp_rank=0"
    guard = current().peer_guard
    guard.auth = PeerAuth([KEY])
    _FakeBootstrap.seen = []
    try:
        guard.bootstrap_addresses = BootstrapAddresses([("10.0.0.5", None), ("127.0.0.1", port + 1)])
        for _ in range(2):
            got = requests.get(route, timeout=5)
            assert got.status_code == 403, got.status_code
            assert f"bootstrap address 127.0.0.1:{port} is not one this server signs for" in got.text
            assert "SGLANG_PD_BOOTSTRAP_ADDRESSES (10.0.0.5, 127.0.0.1:" in got.text, got.text
        assert _FakeBootstrap.seen == []                                          # nothing left this process
        assert current().counters.get("bootstrap_addresses_refused_total") == 2
        assert guard.bootstrap_addresses.snapshot()["refused"] == {f"127.0.0.1:{port}": 2}
        assert requests.get(f"http://127.0.0.1:{port}/other", timeout=5).status_code == 200  # not a bootstrap path
        for allowed in (BootstrapAddresses([("127.0.0.1", None)]), BootstrapAddresses([("127.0.0.1", port)])):
            guard.bootstrap_addresses = allowed
            assert requests.get(route, timeout=5).status_code == 401              # sent, signed; answer untagged
        own = BootstrapAddresses()
        own.add_own(["127.0.0.1"], port)                                          # prefill's own bootstrap server
        guard.bootstrap_addresses = own
        assert requests.get(route, timeout=5).status_code == 401
        routes = [header for path, header in _FakeBootstrap.seen if path.startswith("/route")]
        assert len(routes) == 3 and all(routes), _FakeBootstrap.seen
    finally:
        guard.auth = None
        fake.shutdown()


def test_route_put_rules():
    ok = json.dumps(RANK).encode()
    assert route_put_problem(ok, {}) is None
    assert "differs from the 2" in route_put_problem(ok, {"attn_tp_size": 2})
    assert "not JSON" in route_put_problem(b"\xff", {})
    assert "rank_ip" in route_put_problem(json.dumps({**RANK, "rank_ip": "a b"}).encode(), {})
    assert "rank_port 0" in route_put_problem(json.dumps({**RANK, "rank_port": 0}).encode(), {})


def test_a_signed_request_must_name_this_server():
    names = frozenset({"127.0.0.1", "::1", "10.1.2.3", "localhost", "box"})
    for receiver in ("127.0.0.1:8998", "localhost:8998", "BOX:8998", "[::1]:8998", "10.1.2.3:8998"):
        assert names_this_server(receiver, 8998, names), receiver
    for receiver in ("127.0.0.1:8999", "10.9.9.9:8998", "127.0.0.2:8998", "8998", "box:", ":8998"):
        assert not names_this_server(receiver, 8998, names), receiver
