"""Without a peer secret only this host may talk to the PD sockets: the source rule, and a real rank socket
that drops a message sent from 127.0.0.2 unread while one from 127.0.0.1 passes."""

import logging
import time

import pytest
import zmq

from sglang_pd.harness.hostile_peer import PeerIdentity, Templates
from test_handshake_gate import Host
from sglang_pd.srt.auth import PeerSources
from sglang_pd.srt.auth.peer_sources import MAX_SOURCES, OTHER_SOURCES, host_addresses, normalize_address
from sglang_pd.srt.handshake import GuardedSocket, HandshakeGate, RoomTombstones, UnclaimedRooms
from sglang_pd.srt.wire import FrameLimits, Side

pytestmark = pytest.mark.unit

LOCAL = ("127.0.0.1", "::1", "10.1.2.3")
T = Templates("mooncake", PeerIdentity("127.0.0.1", 40001, "127.0.0.1:16001"))


def test_spellings_of_one_address_are_one():
    assert normalize_address("::ffff:127.0.0.1") == "127.0.0.1"
    assert normalize_address("[::1]") == "::1" and normalize_address("fe80::1%eth0") == "fe80::1"
    assert normalize_address("unknown") == "unknown"


def test_this_host_is_its_interface_addresses_not_all_of_127_8():
    found = host_addresses()
    assert {"127.0.0.1", "::1"} <= found and "127.0.0.2" not in found


def test_without_a_secret_only_this_hosts_addresses_pass_and_each_refused_source_is_logged_once(caplog):
    sources = PeerSources(authenticated=False, allow_remote=False, local=LOCAL)
    assert sources.mode == "this-host"
    assert all(sources.admits(a, "test socket") for a in ("127.0.0.1", "::ffff:127.0.0.1", "::1", "10.1.2.3"))
    with caplog.at_level(logging.WARNING, logger="sglang_pd.srt.auth.peer_sources"):
        refused = [a for a in ("127.0.0.2", "10.9.9.9", "127.0.0.2", "unknown", "10.9.9.9", "10.9.9.9")
                   if not sources.admits(a, "test socket")]
    assert len(refused) == 6
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("openssl rand -hex 32" in line and "ALLOW_UNAUTHENTICATED" in line for line in lines)
    assert sources.snapshot() == {"mode": "this-host", "num_refused": 6,
                                  "refused_by_source": {"127.0.0.2": 2, "10.9.9.9": 3, "unknown": 1}}


def test_with_a_secret_or_the_opt_out_every_source_passes():
    for sources, mode in ((PeerSources(authenticated=True, allow_remote=False), "authenticated"),
                          (PeerSources(authenticated=False, allow_remote=True), "unauthenticated-remote")):
        assert sources.mode == mode and sources.admits("10.9.9.9", "x") and sources.admits("unknown", "x")
        assert sources.snapshot()["num_refused"] == 0


def test_the_refusal_table_is_bounded():
    sources = PeerSources(authenticated=False, allow_remote=False, local=LOCAL)
    for i in range(MAX_SOURCES + 50):
        sources.admits(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", "x")
    table = sources.snapshot()["refused_by_source"]
    assert len(table) == MAX_SOURCES + 1 and table[OTHER_SOURCES] == 50


def test_a_rank_socket_drops_a_message_from_127_0_0_2_unread_and_reads_one_from_127_0_0_1():
    counted = {}
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    gate = HandshakeGate(lim, Host(), None, UnclaimedRooms(10), RoomTombstones(10),
                         on_count=lambda name, n: counted.__setitem__(name, counted.get(name, 0) + n),
                         sources=PeerSources(authenticated=False, allow_remote=False))
    ctx = zmq.Context()
    raw = ctx.socket(zmq.PULL)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    sock = GuardedSocket.around(raw, gate, on_error=lambda doing: None, housekeeping_s=0.05)
    stranger, local = ctx.socket(zmq.PUSH), ctx.socket(zmq.PUSH)
    stranger.connect(f"tcp://127.0.0.2:0;127.0.0.1:{port}")  # source address 127.0.0.2
    local.connect(f"tcp://127.0.0.1:{port}")
    try:
        stranger.send_multipart(T.abort(12))
        stranger.send_multipart([b"\xff"] * 500)    # not even counted as too many frames: never looked at
        deadline = time.monotonic() + 5
        while gate.counts.num_source_refused < 2 and time.monotonic() < deadline:
            with pytest.raises(zmq.Again):          # read and dropped: nothing is handed over
                sock.recv_multipart(zmq.NOBLOCK)
            time.sleep(0.01)
        assert gate.counts.num_unread == 0
        local.send_multipart(T.abort(13))
        assert sock.poll(5000)
        got = sock.recv_multipart()
        assert got == T.abort(13)  # the stranger's ABORT for room 12 was never handed over
        counts = gate.counts
        assert counts.num_source_refused == 2 and counts.num_admitted == 1 and counts.rejected == {}
        assert counted["peer_source_refused_total"] == 2 and gate.sources.snapshot()["refused_by_source"] == {
            "127.0.0.2": 2}
    finally:
        for s in (stranger, local, raw):
            s.close(0)
        ctx.term()
