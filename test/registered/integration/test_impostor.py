"""An impostor process against a running PD pair: without the secret it cannot register, claim or drop
(room decline) a waiting room, receive one byte of KV or mark a transfer done; the real pair keeps serving.

The impostor runs a real transfer endpoint in this process (a Mooncake TransferEngine / a NIXL agent)
with zeroed buffers laid out like the real decode's, so any KV that prefill sent it would land there.
Three kinds of attempt, each counted by the server's gate:
  no secret     (messages without a tag)              -> refused "missing"
  wrong secret  (tagged with another key)             -> refused "unknown_key"
  replay        (real signed traffic captured on the server, resent byte for byte) -> refused "replayed"
                (inside the 30 s window: nonce already seen) or "stale" (older: timestamp)
The control runs the same impostor against pd_page1, which has no secret: there the KV does land.
"""

import concurrent.futures as cf
import http.client
import json
import random
import time

import pytest

from sglang_pd.harness import PDDeployment
from sglang_pd.harness.deployment_requests import new_bootstrap_room
from sglang_pd.harness.hostile_peer import (PeerSocket, Templates, TransferPeer, assert_threads_alive,
                                            captured_frames, handshake_view, rank_endpoint, wait_received)
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.auth import HTTP_HEADER, PeerAuth
from sglang_pd.srt.wire import DeclineNotice, decline_frames

pytestmark = pytest.mark.integration

WRONG = PeerAuth([b"an-impostor-guess-of-the-secret-0123456789"])
PROMPT_LEN = 40


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(PROMPT_LEN)]


def _rooms(dep, server, status: int) -> list[int]:
    return handshake_view(dep, server)["rooms"]["by_status"].get(str(status), [])


def _wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _backend(dep: PDDeployment) -> str:
    return "nixl" if dep.config.transfer_backend == "nixl" else "mooncake"


def _impostor(dep: PDDeployment) -> TransferPeer:
    pool = handshake_view(dep, dep.prefill)["pool"]
    return TransferPeer(_backend(dep), pool, -(-PROMPT_LEN // pool["page_size"]), "impostor")


@pytest.mark.parametrize("name", ["pd_page16", "pd_nixl"])
def test_impostor_gets_nothing_and_the_pair_keeps_serving(name, request, plain_url):
    dep: PDDeployment = request.getfixturevalue(name)
    assert dep.env.get("SGLANG_PD_PEER_SECRET_FILE"), "this test needs an authenticated deployment"
    rng = random.Random(name)
    # Real traffic first: the gates capture the real decode's registration and transfer info and the real
    # prefill's Success status, which the impostor then replays.
    dep.generate_pd(_prompt(1), 8)
    real_prefill = captured_frames(handshake_view(dep, dep.prefill))
    real_decode = captured_frames(handshake_view(dep, dep.decodes[0]))
    assert {"registration", "transfer_info"} <= set(real_prefill) and "status" in real_decode
    impostor = _impostor(dep)
    room, stalled_room = new_bootstrap_room(rng), new_bootstrap_room(rng)
    try:
        with cf.ThreadPoolExecutor(4) as pool:  # four halves in flight at once
            prefill_half = pool.submit(dep.post_generate, dep.prefill.url, _prompt(2), 8, 90, **dep.pairing(room))
            _wait_for(lambda: room in _rooms(dep, dep.prefill, 1), f"room {room} never waited on prefill")
            decode_half = pool.submit(dep.post_generate, dep.decodes[0].url, _prompt(3), 8, 90,
                                      **dep.pairing(stalled_room))
            _wait_for(lambda: stalled_room in _rooms(dep, dep.decodes[0], 2), "decode room never waited")
            _wait_for(lambda: stalled_room in handshake_view(dep, dep.prefill)["rooms"]["transfer_info_rooms"],
                      "decode's transfer info never reached prefill")
            decline = decline_frames(DeclineNotice(room, None, "impostor"), "127.0.0.1", impostor.identity.port)
            p_before = handshake_view(dep, dep.prefill)["gate"]
            d_before = handshake_view(dep, dep.decodes[0])["gate"]

            with PeerSocket(rank_endpoint(dep, dep.prefill)) as to_prefill, \
                    PeerSocket(rank_endpoint(dep, dep.decodes[0])) as to_decode:
                for auth in (None, WRONG):   # register + claim / decline the waiting room; forge "transfer done"
                    to_prefill.send(impostor.registration(), auth)
                    to_prefill.send(impostor.claim(room), auth)
                    to_prefill.send(decline, auth)
                    to_decode.send(impostor.templates.status(stalled_room, 4), auth)
                for kind in ("registration", "transfer_info"):
                    to_prefill.send_raw(real_prefill[kind])
                to_decode.send_raw(real_decode["status"])
            p_view = wait_received(dep, dep.prefill, p_before["num_received"] + 8)
            d_view = wait_received(dep, dep.decodes[0], d_before["num_received"] + 3)
            time.sleep(2.0)  # would-be transfers get time to land before we look
            for view, before, n, n_forged in ((p_view, p_before, 2, 3), (d_view, d_before, 1, 1)):
                refused = {k: view["gate"]["auth_refused"].get(k, 0) - before["auth_refused"].get(k, 0)
                           for k in ("missing", "unknown_key", "replayed", "stale")}
                # a replay inside the 30 s window is caught by its nonce, an older one by its timestamp
                # (the registration was captured when the pair first met, possibly minutes ago)
                replays = refused["replayed"] + refused["stale"]
                assert (refused["missing"], refused["unknown_key"], replays) == (n_forged, n_forged, n), view["gate"]
                assert view["gate"]["num_admitted"] == before["num_admitted"]
            assert room in _rooms(dep, dep.prefill, 1), "the impostor claimed or dropped the waiting room"
            assert impostor.identity.name not in handshake_view(dep, dep.prefill)["rooms"]["registered_peers"]
            assert stalled_room in _rooms(dep, dep.decodes[0], 2), "decode believed a forged 'transfer done'"
            assert impostor.bytes_received() == 0
            # The real halves arrive: both rooms are served by the real pair, outputs right.
            decode_of_room = pool.submit(dep.post_generate, dep.decodes[0].url, _prompt(2), 8, 90,
                                         **dep.pairing(room))
            prefill_of_stalled = pool.submit(dep.post_generate, dep.prefill.url, _prompt(3), 8, 90,
                                             **dep.pairing(stalled_room))
            for fut in (prefill_half, decode_half, decode_of_room, prefill_of_stalled):
                assert fut.result(timeout=90).status_code == 200
        assert decode_of_room.result().json()["output_ids"] == dep.generate(plain_url, _prompt(2), 8)["output_ids"]
        assert decode_half.result().json()["output_ids"] == dep.generate(plain_url, _prompt(3), 8)["output_ids"]
        assert impostor.bytes_received() == 0
        print(f"IMPOSTOR {name}: refused on prefill {p_view['gate']['auth_refused']}, on decode "
              f"{d_view['gate']['auth_refused']}; impostor received 0 bytes")
    finally:
        impostor.close()
    assert_threads_alive(handshake_view(dep, dep.prefill), "prefill")
    dep.wait_clean()


def _from_127_0_0_2(endpoint: str) -> str:
    """`endpoint` (tcp://127.0.0.1:port) connected from source address 127.0.0.2: loopback, but not one of this
    host's interface addresses, which is what the no-secret default admits (srt/auth/peer_sources.py)."""
    return "tcp://127.0.0.2:0;" + endpoint[len("tcp://"):]


def _bootstrap_call(dep: PDDeployment, source: str, method: str, path: str, body: dict | None = None,
                    auth: PeerAuth | None = None, header: str | None = None):
    """One bootstrap request from address `source`; signed for this server with `auth`, or carrying `header`."""
    data = None if body is None else json.dumps(body).encode()
    if auth is not None:
        header = auth.sign_http_request(method, path, data or b"", f"127.0.0.1:{dep.bootstrap_port}")[0]
    conn = http.client.HTTPConnection("127.0.0.1", dep.bootstrap_port, timeout=10, source_address=(source, 0))
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                       **({HTTP_HEADER: header} if header else {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


ROUTE_0 = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"


def test_without_the_secret_another_address_can_neither_register_nor_claim_nor_move_a_rank(pd_page1: PDDeployment,
                                                                                           plain_url):
    """The default (no SGLANG_PD_PEER_SECRET_FILE, no opt-out): the impostor of the control test below, now
    sending from 127.0.0.2, is refused unread on the rank socket and with 403 on the bootstrap routes; a PUT
    /route from this host that would move prefill's registered rank gets 409. The waiting room is then
    served by the real pair."""
    dep = pd_page1
    assert not dep.env.get("SGLANG_PD_PEER_SECRET_FILE") and not dep.env.get("SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS")
    impostor = _impostor(dep)
    room = new_bootstrap_room(random.Random(6))
    registered = _bootstrap_call(dep, "127.0.0.1", "GET", ROUTE_0)
    assert registered[0] == 200, registered
    rank = json.loads(registered[1])
    hijack = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
              "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
              "rank_ip": "127.0.0.1", "rank_port": impostor.identity.port, "page_size": dep.config.page_size,
              "kv_cache_dtype": "auto"}
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            prefill_half = pool.submit(dep.post_generate, dep.prefill.url, _prompt(7), 8, 120, **dep.pairing(room))
            _wait_for(lambda: room in _rooms(dep, dep.prefill, 1), f"room {room} never waited on prefill")
            before = handshake_view(dep, dep.prefill)
            with PeerSocket(_from_127_0_0_2(rank_endpoint(dep, dep.prefill))) as to_prefill:
                to_prefill.send(impostor.registration())
                to_prefill.send(impostor.claim(room))
            status_away = _bootstrap_call(dep, "127.0.0.2", "PUT", "/route", hijack)
            status_get_away = _bootstrap_call(dep, "127.0.0.2", "GET", ROUTE_0)
            status_here = _bootstrap_call(dep, "127.0.0.1", "PUT", "/route", hijack)
            view = wait_received(dep, dep.prefill, before["gate"]["num_received"] + 2)
            time.sleep(2.0)  # a would-be transfer gets time to land before we look
            assert view["gate"]["num_source_refused"] - before["gate"]["num_source_refused"] == 2, view["gate"]
            assert view["gate"]["num_admitted"] == before["gate"]["num_admitted"]
            assert view["sources"]["refused_by_source"].get("127.0.0.2", 0) >= 2, view["sources"]
            assert impostor.identity.name not in view["rooms"]["registered_peers"]
            assert room in _rooms(dep, dep.prefill, 1), "the impostor claimed the waiting room"
            assert status_away[0] == 403 and "its own host only" in status_away[1], status_away
            assert status_get_away[0] == 403, status_get_away
            assert status_here[0] == 409 and f"is registered at {rank['rank_ip']}:{rank['rank_port']}" in status_here[1], \
                status_here
            assert json.loads(_bootstrap_call(dep, "127.0.0.1", "GET", ROUTE_0)[1]) == rank
            decode_half = dep.post_generate(dep.decodes[0].url, _prompt(7), 8, 120, **dep.pairing(room))
            assert decode_half.status_code == 200 and prefill_half.result(timeout=120).status_code == 200
        assert decode_half.json()["output_ids"] == dep.generate(plain_url, _prompt(7), 8)["output_ids"]
        assert impostor.bytes_received() == 0
        http_guard = dep.get_json(dep.prefill.url, "/sglang_pd/stats", headers=dep.headers)["http_process"]["handshake"]
        assert http_guard["http"]["route_moves_refused"].get("/route", 0) >= 1, http_guard
        assert http_guard["sources"]["refused_by_source"].get("127.0.0.2", 0) >= 2, http_guard
        print(f"REMOTE (no secret): rank socket refused {view['gate']['num_source_refused']} message(s) from "
              f"127.0.0.2 unread, bootstrap PUT/GET from 127.0.0.2 -> {status_away[0]}/{status_get_away[0]}, "
              f"PUT /route moving rank 0 from this host -> {status_here[0]}; impostor received 0 bytes")
    finally:
        impostor.close()
    dep.wait_clean()


def test_a_signed_message_replayed_to_another_server_is_refused(pd_page16: PDDeployment):
    """Messages name their receiver (srt/auth/peer_auth.py): decode's real signed transfer info, captured on
    prefill's rank socket, replayed byte for byte to decode's own rank socket (same deployment, same secret,
    another receiver) fails its MAC there; a bootstrap request signed with the real secret for another
    server is refused by this one (wrong_receiver). Without the binding the first would pass authentication
    and be dropped only by the schema, the second would register."""
    dep = pd_page16
    dep.generate_pd(_prompt(8), 8)
    captured = captured_frames(handshake_view(dep, dep.prefill))["transfer_info"]
    before = handshake_view(dep, dep.decodes[0])["gate"]
    with PeerSocket(rank_endpoint(dep, dep.decodes[0])) as to_decode:
        to_decode.send_raw(captured)
    after = wait_received(dep, dep.decodes[0], before["num_received"] + 1)["gate"]
    assert after["auth_refused"].get("bad_mac", 0) == before["auth_refused"].get("bad_mac", 0) + 1, after
    assert after["rejected"] == before["rejected"] and after["num_admitted"] == before["num_admitted"]
    real = PeerAuth.from_file(dep.env["SGLANG_PD_PEER_SECRET_FILE"])
    here = _bootstrap_call(dep, "127.0.0.1", "GET", ROUTE_0, auth=real)  # signed for this server: answered
    assert here[0] == 200 and "rank_port" in here[1], here
    for receiver in (f"127.0.0.1:{dep.bootstrap_port + 1}", f"10.9.9.9:{dep.bootstrap_port}"):
        header, _ = real.sign_http_request("GET", ROUTE_0, b"", receiver)
        status, text = _bootstrap_call(dep, "127.0.0.1", "GET", ROUTE_0, header=header)
        assert status == 401 and "wrong_receiver" in text, (receiver, status, text)
    dep.generate_pd(_prompt(9), 8)  # the pair still serves
    print(f"REPLAY TO ANOTHER RECEIVER: decode refused prefill's captured transfer info (bad_mac "
          f"{before['auth_refused'].get('bad_mac', 0)} -> {after['auth_refused']['bad_mac']}); bootstrap GETs signed "
          f"for 2 other servers -> 401 wrong_receiver")


def test_a_decode_with_a_secret_signs_for_no_address_it_was_not_given(pd_page16: PDDeployment):
    """SGLANG_PD_BOOTSTRAP_ADDRESSES (srt/auth/bootstrap_addresses.py): the harness lists 127.0.0.1 (any port) on
    the authenticated pair. A client naming 127.0.0.2 as its bootstrap host, where a socket of this test listens,
    gets HTTP 400 naming the address and the setting, and that socket is never contacted: decode made no signed
    request to replay. Prefill signs for its own bootstrap server by itself. The pair keeps serving."""
    import socket

    dep = pd_page16
    assert dep.env["SGLANG_PD_BOOTSTRAP_ADDRESSES"] == "127.0.0.1"
    listener = socket.socket()
    listener.bind(("127.0.0.2", 0))
    listener.listen(8)
    listener.settimeout(3.0)
    port = listener.getsockname()[1]
    try:
        pairing = {"bootstrap_host": "127.0.0.2", "bootstrap_port": port,
                   "bootstrap_room": new_bootstrap_room(random.Random(10))}
        refused = dep.post_generate(dep.decodes[0].url, _prompt(10), 8, 60, dep.headers, **pairing)
        assert refused.status_code == 400, (refused.status_code, refused.text[:500])
        assert f"bootstrap address 127.0.0.2:{port} is not one this server signs for" in refused.text, refused.text
        assert "SGLANG_PD_BOOTSTRAP_ADDRESSES (127.0.0.1)" in refused.text, refused.text
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    decode_view = handshake_view(dep, dep.decodes[0])["bootstrap_addresses"]
    prefill_view = handshake_view(dep, dep.prefill)["bootstrap_addresses"]
    assert decode_view["configured"] == "127.0.0.1" and decode_view["refused"] == {}, decode_view
    assert f"127.0.0.1:{dep.bootstrap_port}" in prefill_view["own"], prefill_view
    dep.generate_pd(_prompt(11), 8)
    print(f"UNLISTED BOOTSTRAP ADDRESS: 127.0.0.2:{port} -> {refused.status_code}, 0 connections to it; decode "
          f"signs for {decode_view['configured']}, prefill for its own {prefill_view['own'][:3]}...")


def test_control_without_the_secret_the_impostor_takes_the_kv(pd_page1: PDDeployment):
    """The same impostor against a pair without SGLANG_PD_PEER_SECRET_FILE, from this host (127.0.0.1): the
    no-secret default admits this host's own processes, so upstream's trust model still holds for them."""
    dep = pd_page1
    assert not dep.env.get("SGLANG_PD_PEER_SECRET_FILE")
    impostor = _impostor(dep)
    room = new_bootstrap_room(random.Random(5))
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            prefill_half = pool.submit(dep.post_generate, dep.prefill.url, _prompt(4), 8, 120, **dep.pairing(room))
            _wait_for(lambda: room in _rooms(dep, dep.prefill, 1), f"room {room} never waited on prefill")
            with PeerSocket(rank_endpoint(dep, dep.prefill)) as to_prefill:
                to_prefill.send(impostor.registration())
                to_prefill.send(impostor.claim(room))
            assert prefill_half.result(timeout=120).status_code == 200
        _wait_for(lambda: impostor.bytes_received() > 0, "no KV reached the impostor", 10)
        print(f"CONTROL (no secret): the impostor received {impostor.bytes_received()} nonzero KV bytes of room {room}")
    finally:
        impostor.close()
    dep.wait_clean()
