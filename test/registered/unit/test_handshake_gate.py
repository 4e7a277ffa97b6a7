"""The gate in front of a rank socket, on real ZMQ sockets: admit, drop, fail the room, tell decode, expire."""

import logging
import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest
import zmq

from sglang_pd.harness.hostile_peer import PeerIdentity, PeerSocket, Templates
from sglang_pd.srt.handshake import GuardedSocket, SigningSocket
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.handshake import HandshakeGate
from sglang_pd.srt.handshake import PeerRecord, PeerRemoval
from sglang_pd.srt.auth import PeerAuth
from sglang_pd.srt.handshake import RoomTombstones, UnclaimedRooms

pytestmark = pytest.mark.unit

PEER = PeerIdentity("127.0.0.1", 40001, "127.0.0.1:16001")
KEY = b"k" * 40
RECV = b"127.0.0.1:5000"   # the rank socket a gate stands for: signed messages are bound to it
T = Templates("mooncake", PEER)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Host:
    """A KV manager's tables, as plain dicts (what SGLang keeps: registered peers, rooms, transfer infos)."""

    def __init__(self):
        self.peers: dict[str, PeerRecord] = {}
        self.rooms: set[int] = set()
        self.transfer_infos: dict[int, bytes] = {}
        self.failed: list[tuple[int, str, tuple | None]] = []
        self.drop_reasons: dict[int, str] = {}

    def registered_peer(self, name):
        return self.peers.get(name)

    def num_registered(self):
        return len(self.peers)

    def endpoint_registered(self, target):
        return any((r.endpoint, r.port) == tuple(target) for r in self.peers.values())

    def forget_peer(self, name):
        return PeerRemoval.FORGOTTEN if self.peers.pop(name, None) is not None else PeerRemoval.UNKNOWN

    def room_claimed(self, room):
        return room in self.rooms

    def fail_room(self, room, reason, notify):
        self.failed.append((room, reason, notify))
        return room in self.rooms

    def drop_unclaimed(self, room, reason):
        self.drop_reasons[room] = reason
        return self.transfer_infos.pop(room, None) is not None

    def prune(self):
        pass

    def send_drained_tells(self):
        return [], []


def gate(host, auth=None, side=Side.PREFILL, clock=None, **kw):
    clock = clock or Clock()
    kw.setdefault("receiver", RECV)
    lim = FrameLimits("mooncake", side, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    return HandshakeGate(lim, host, auth, UnclaimedRooms(10, clock=clock), RoomTombstones(10, clock=clock),
                         clock=clock, **kw)


def test_transfer_info_of_a_registered_peer_is_admitted_and_tracked_until_claimed():
    host = Host()
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    clock = Clock()
    g = gate(host, clock=clock)
    assert g.admit(T.transfer_info(5, [1, 2]), "10.0.0.9") == T.transfer_info(5, [1, 2])
    host.transfer_infos[5] = b"held"
    clock.now += 11
    assert g.housekeeping() == [5] and 5 not in host.transfer_infos  # nobody claimed room 5
    assert "no prefill request claimed it within 10 s" in host.drop_reasons[5]  # what decode is told
    assert g.tombstones.take(5) == host.drop_reasons[5]  # a prefill half arriving after this fails at once
    g.admit(T.transfer_info(6, [1]), "10.0.0.9")
    host.rooms.add(6)
    host.transfer_infos[6] = b"held"
    clock.now += 11
    assert g.housekeeping() == [] and 6 in host.transfer_infos and 6 not in host.drop_reasons  # claimed: kept
    assert g.snapshot()["unclaimed_rooms"]["num_expired"] == 1


def test_bad_transfer_info_fails_its_room_and_tells_only_a_registered_decode():
    host = Host()
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    host.rooms.add(8)
    g = gate(host)
    bad = T.transfer_info(8, [1, 2], decode_prefix_len=-16)
    assert g.admit(bad, "10.0.0.9") is None
    room, reason, notify = host.failed[-1]
    assert (room, notify) == (8, (PEER.ip, PEER.port)) and "decode_prefix_len -16 is outside" in reason
    stranger = Templates("mooncake", PeerIdentity("6.6.6.6", 9, "6.6.6.6:9")).transfer_info(
        8, [1], decode_prefix_len=-16)
    assert g.admit(stranger, "6.6.6.6") is None and host.failed[-1][2] is None  # never tell an unknown endpoint


def test_unregistered_or_moved_peer_cannot_claim_a_room_and_early_rooms_are_tombstoned():
    host = Host()
    g = gate(host)
    assert g.admit(T.transfer_info(9, [1]), "10.0.0.9") is None
    assert "never registered" in host.failed[-1][1]
    assert g.tombstones.take(9) == host.failed[-1][1]          # room 9 did not exist yet: remembered
    host.peers[PEER.name] = PeerRecord("10.1.1.1", PEER.port)
    assert g.admit(T.transfer_info(10, [1]), "10.0.0.9") is None
    assert "registered ('10.1.1.1'" in host.failed[-1][1]


def test_registration_table_is_bounded():
    host = Host()
    g = gate(host, max_peers=1)
    assert g.admit(T.registration([4096], 2048), "a") is not None
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    other = Templates("mooncake", PeerIdentity("127.0.0.1", 2, "127.0.0.1:2")).registration([4096], 2048)
    assert g.admit(other, "b") is None and g.counts.rejected == {"registration": 1}
    assert g.admit(T.registration([4096], 2048), "a") is not None  # re-registration of a known peer


def test_with_auth_unsigned_and_impostor_messages_change_nothing():
    host = Host()
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    host.rooms.add(11)
    g = gate(host, auth=PeerAuth([KEY]))
    msg = T.transfer_info(11, [1])
    assert g.admit(msg, "6.6.6.6") is None
    assert g.admit(msg + PeerAuth([b"x" * 40]).sign_frames(msg, RECV), "6.6.6.6") is None
    bad = T.transfer_info(11, [1], decode_prefix_len=-3)
    assert g.admit(bad, "6.6.6.6") is None
    assert host.failed == [] and g.counts.auth_refused == {"missing": 2, "unknown_key": 1}
    signed = msg + PeerAuth([KEY]).sign_frames(msg, RECV)
    assert g.admit(signed, "10.0.0.9") == msg
    assert g.admit(signed, "10.0.0.9") is None and g.counts.auth_refused["replayed"] == 1


def test_with_auth_a_room_decline_must_be_signed():
    """An unauthenticated decline would let a stranger drop any room: refused before it is read."""
    from sglang_pd.srt.wire import DeclineNotice, decline_frames

    host = Host()
    host.rooms.add(12)
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)  # the declining decode's endpoint
    g = gate(host, auth=PeerAuth([KEY]))
    decline = decline_frames(DeclineNotice(12, None, "served by decode"), PEER.ip, PEER.port)
    assert g.admit(decline, "6.6.6.6") is None
    assert g.admit(decline + PeerAuth([b"x" * 40]).sign_frames(decline, RECV), "6.6.6.6") is None
    assert host.failed == [] and g.counts.auth_refused == {"missing": 1, "unknown_key": 1}
    assert g.admit(decline + PeerAuth([KEY]).sign_frames(decline, RECV), "10.0.0.9") == decline
    assert g.counts.num_admitted == 1 and g.counts.rejected == {}
    assert gate(host).admit(decline, "10.0.0.9") == decline, "without a secret: admitted as upstream's ABORT is"


@pytest.mark.parametrize("kind", ["abort", "decline"])
def test_prefill_answers_only_at_an_endpoint_a_peer_registered(kind):
    """Upstream answers an ABORT (and our decline, read as one) with an ABORT_ACK at the address the message
    carries, through a socket it opens and caches per address: a stranger naming fresh addresses made
    prefill connect wherever it said, until its file descriptors ran out. Only a registered peer's endpoint
    is answered; the room still fails (what the ABORT asked for), nobody is told."""
    from sglang_pd.srt.wire import DeclineNotice, decline_frames

    def message(room, ip, port):
        if kind == "abort":
            return [b"ABORT", str(room).encode(), ip.encode(), str(port).encode(), b"1"]
        return decline_frames(DeclineNotice(room, None, "served by decode"), ip, port)

    host = Host()
    host.rooms.update({3, 4})
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    g = gate(host)
    assert host.endpoint_registered((PEER.ip, PEER.port)) and not host.endpoint_registered(("10.255.255.1", 20001))
    assert g.admit(message(3, PEER.ip, PEER.port), "10.0.0.9") == message(3, PEER.ip, PEER.port)
    assert g.admit(message(4, "10.255.255.1", 20001), "6.6.6.6") is None
    assert g.counts.rejected == {kind: 1} and host.failed[-1][0] == 4 and host.failed[-1][2] is None
    assert "an endpoint no registered peer has" in host.failed[-1][1]
    if kind == "abort":  # an ABORT without an address asks for no answer: admitted as before
        assert g.admit([b"ABORT", b"5"], "6.6.6.6") == [b"ABORT", b"5"]


def test_decode_side_aux_data_needs_a_waiting_room():
    host = Host()
    g = gate(host, side=Side.DECODE)
    assert g.admit(T.aux_data(3, 0, 1, b"x" * 32), "p") is None
    host.rooms.add(3)
    assert g.admit(T.aux_data(3, 0, 1, b"x" * 32), "p") is not None
    assert g.admit(T.status(3, 4), "p") is not None


def test_one_log_line_per_peer(caplog):
    g = gate(Host())
    with caplog.at_level(logging.WARNING, logger="sglang_pd.srt.handshake.gate_tally"):
        for peer in ("10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2"):
            g.admit([b"None"], peer)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("registration has 10..20" in line for line in lines)
    assert g.snapshot()["peers"]["10.0.0.1"]["dropped"] == 3


def _bound_socket_and_registered_peer():
    """(ctx, a PULL socket bound on 127.0.0.1, its port, a Host where PEER registered, PeerAuth with KEY)."""
    ctx = zmq.Context()
    raw = ctx.socket(zmq.PULL)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    host = Host()
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    return ctx, raw, port, host, PeerAuth([KEY])


def test_guarded_socket_returns_only_admitted_frames_and_works_with_pollers():
    ctx, raw, port, host, auth = _bound_socket_and_registered_peer()
    errors = []
    sock = GuardedSocket.around(raw, gate(host, auth=auth, receiver=f"127.0.0.1:{port}".encode()),
                                on_error=errors.append, housekeeping_s=0.05)
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    signer = SigningSocket.around(push, auth, f"tcp://127.0.0.1:{port}")
    with PeerSocket(f"tcp://127.0.0.1:{port}") as hostile:
        hostile.send([b"WATERMARK"])
        hostile.send([b"\xff"] * 3, auth=auth)
        signer.send_multipart(T.abort(12))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        assert poller.poll(5000)
        assert sock.recv_multipart() == T.abort(12)
    got, handled = [], threading.Event()

    def read_one():  # SGLang's bootstrap thread: receive, then handle (until `handled`)
        got.append(sock.recv_multipart())
        handled.wait(5)

    reader = threading.Thread(target=read_one, daemon=True)
    reader.start()
    time.sleep(0.2)  # the reader idles through a few housekeeping rounds
    signer.send_multipart(T.abort(13))
    reader.join(5)
    assert got == [T.abort(13)] and sock.reader is not None
    counts = sock.gate.counts  # the two hostile messages arrived (any order) and were dropped
    assert (counts.num_received, counts.num_admitted, counts.rejected) == (4, 2, {"transfer_info": 1})
    assert counts.auth_refused == {"missing": 1} and errors == []
    for s in (push, raw):
        s.close(0)
    ctx.term()


def test_an_unclaimed_room_is_reported_only_to_decodes_that_registered_the_named_endpoint():
    """Prefill tells decode an unclaimed room was dropped only at the endpoint its peer registered."""
    import numpy as np
    from sglang.srt.disaggregation.mooncake.conn import TransferInfo

    from sglang_pd.srt.handshake.manager_host import registered_targets

    def info(ip: str, port: int) -> TransferInfo:  # what SGLang's manager keeps per peer in transfer_infos[room]
        return TransferInfo(room=9, endpoint=ip, dst_port=port, mooncake_session_id="x",
                            dst_kv_indices=np.array([1], dtype=np.int32), dst_aux_index=0, dst_state_indices=[],
                            required_dst_info_num=1, is_dummy=False)

    peers = {"a": PeerRecord("10.0.0.1", 5001), "b": PeerRecord("10.0.0.2", 5002)}
    infos = {"a": info("10.0.0.1", 5001),          # registered there: told
             "b": info("203.0.113.9", 5002),       # names another host than b registered: not told
             "c": info("10.0.0.3", 5003)}          # never registered: not told
    assert registered_targets(infos, peers.get) == [("10.0.0.1", 5001)]
    assert registered_targets({"a": info("10.0.0.1", 5001), "a2": info("10.0.0.1", 5001)},
                              {**peers, "a2": peers["a"]}.get) == [("10.0.0.1", 5001)]  # two ranks, one message
    assert registered_targets({}, peers.get) == []


def test_a_transfer_info_after_prefills_own_request_failed_is_refused_and_decode_told():
    host = Host()
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    clock = Clock()
    failed = RoomTombstones(10, clock=clock)
    g = gate(host, clock=clock, failed_rooms=failed)
    failed.bury(12, "Request 12 timed out after 3.0s in KVPoll.Bootstrapping")  # the sender's clear, failed
    assert failed.reason(12) is not None and 12 not in host.rooms  # the state this test is about
    assert g.admit(T.transfer_info(12, [1, 2]), "10.0.0.9") is None
    room, reason, notify = host.failed[-1]
    assert (room, notify) == (12, (PEER.ip, PEER.port))  # the decode that registered is told at once
    assert "arrived after prefill's request for it had failed: Request 12 timed out" in reason
    assert g.tombstones.take(12) is None  # the room had a request: a new prefill half on it is not failed
    assert g.admit(T.transfer_info(12, [1, 2]), "10.0.0.9") is None  # every decode rank's info: same answer
    assert g.snapshot()["num_late_transfer_infos"] == 2 and g.snapshot()["num_failed_rooms"] == 1
    assert g.unclaimed.snapshot()["num_tracked"] == 0  # refused infos are not held for the TTL
    host.rooms.add(12)  # a new request claimed the room (the hook also discards it): its infos pass
    assert g.admit(T.transfer_info(12, [1]), "10.0.0.9") == T.transfer_info(12, [1])
    host.rooms.discard(12)
    failed.discard(12)
    assert g.admit(T.transfer_info(12, [1]), "10.0.0.9") == T.transfer_info(12, [1])
    failed.bury(13, "Aborted by AbortReq.")
    clock.now += 11  # past the TTL: left to the unclaimed-room expiry
    assert g.admit(T.transfer_info(13, [1]), "10.0.0.9") == T.transfer_info(13, [1])
    assert g.snapshot()["num_late_transfer_infos"] == 2


class Manager:
    """The tables of SGLang's prefill KV manager that the sender hooks and ManagerHost read and write."""

    def __init__(self):
        self.request_status, self.transfer_infos, self.req_to_decode_prefix_len = {}, {}, {}
        self._staging_outstanding: dict[int, int] = defaultdict(int)  # chunks a transfer worker holds, per room
        self.failure_records: dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self.decode_kv_args_table = {PEER.name: SimpleNamespace(endpoint=PEER.ip, dst_port=PEER.port)}
        self.told: list[tuple] = []

    def send_kv_status_message(self, targets, bootstrap_room, status, failure_reason=None):
        from sglang_pd.srt.hooks.connection import common_conn

        self.told.append((tuple(targets), bootstrap_room, status, failure_reason))
        # what the hook table's AFTER row does in a server (a no-op until a ManagerHost is installed)
        common_conn.after_send_kv_status_message(None, self, targets=targets, bootstrap_room=bootstrap_room,
                                                 status=status, failure_reason=failure_reason)

    def record_failure(self, room, reason):
        self.failure_records[room] = reason

    def update_status(self, room, status):
        self.request_status[room] = status

    def clear(self, sender):
        """What SGLang's CommonKVSender.clear does to these tables (conclude_state set before)."""
        for table in (self.request_status, self.req_to_decode_prefix_len, self.transfer_infos):
            table.pop(sender.bootstrap_room, None)


def test_a_cleared_sender_ends_its_claim_and_a_failed_one_is_remembered_for_late_transfer_infos():
    from sglang.srt.disaggregation.base.conn import KVPoll

    from sglang_pd.srt.handshake import ManagerHost
    from sglang_pd.srt.hooks.connection import common_conn
    from sglang_pd.srt.state import current

    mgr, clock = Manager(), Clock()
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    guard = current().peer_guard
    guard.host = host = ManagerHost(mgr, lim)
    guard.failed_rooms = RoomTombstones(10, clock=clock)
    g = HandshakeGate(lim, host, None, UnclaimedRooms(10, clock=clock), None, clock=clock,
                      failed_rooms=guard.failed_rooms)
    senders = {room: SimpleNamespace(bootstrap_room=room, conclude_state=None, kv_mgr=mgr) for room in (7, 8)}
    for room, sender in senders.items():
        common_conn.after_sender_init(None, sender, mgr, "addr", room)
        mgr.request_status[room] = KVPoll.Bootstrapping
    assert host.room_claimed(7) and host.room_claimed(8)
    # room 7's request fails at the bootstrap timeout; room 8's succeeds; SGLang clears both
    mgr.failure_records[7] = "Request 7 timed out after 10.0s in KVPoll.Bootstrapping"
    senders[7].conclude_state, senders[8].conclude_state = KVPoll.Failed, KVPoll.Success
    for sender in senders.values():
        common_conn.around_sender_clear(mgr.clear, sender)
    assert host.claimed == set()  # ended with the request, not left for prune to find
    assert guard.failed_rooms.reason(7).startswith("Request 7 timed out") and guard.failed_rooms.reason(8) is None
    # late transfer infos; SGLang would re-create each room's status entry for them
    assert g.admit(T.transfer_info(7, [1]), "10.0.0.9") is None  # refused, and its decode told at once:
    assert mgr.told == [(((PEER.ip, PEER.port),), 7, KVPoll.Failed, mgr.told[0][3])]
    assert "arrived after prefill's request for it had failed: Request 7 timed out" in mgr.told[0][3]
    assert g.admit(T.transfer_info(8, [1]), "10.0.0.9") is not None  # not failed: admitted, then...
    mgr.request_status[8], mgr.transfer_infos[8] = KVPoll.WaitingForInput, {PEER.name: SimpleNamespace(
        endpoint=PEER.ip, dst_port=PEER.port)}
    assert not host.room_claimed(8)  # ...nobody's: the old request's claim does not cover it
    clock.now += 11
    assert g.housekeeping() == [8] and 8 not in mgr.request_status  # expired at the TTL, its decode told
    assert mgr.told[-1][:3] == (((PEER.ip, PEER.port),), 8, KVPoll.Failed)
    # a new request on room 7 (a reused room): its own transfer infos pass
    common_conn.after_sender_init(None, SimpleNamespace(bootstrap_room=7), mgr, "addr", 7)
    mgr.request_status[7] = KVPoll.Bootstrapping
    assert guard.failed_rooms.reason(7) is None and g.admit(T.transfer_info(7, [1]), "10.0.0.9") is not None


def test_a_request_that_failed_after_its_decode_registered_the_room_has_that_decode_told():
    """SGLang's prefill abort (and a timeout in prefill's queue) only marks the room Failed: a decode whose
    transfer info had come waited for its own timeout. At the clear, the decodes that registered the room
    are told, with the reason; not for a room decode declined, a success, an unregistered endpoint or a
    room no transfer info came for."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    from sglang_pd.srt.handshake import ManagerHost
    from sglang_pd.srt.hooks.connection import common_conn
    from sglang_pd.srt.state import current

    mgr = Manager()
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    guard = current().peer_guard
    guard.host = ManagerHost(mgr, lim)
    decode = SimpleNamespace(endpoint=PEER.ip, dst_port=PEER.port)
    stranger = SimpleNamespace(endpoint="10.9.9.9", dst_port=1)  # an info naming an endpoint nobody registered
    rooms = {1: (KVPoll.Failed, {PEER.name: decode}),     # aborted after decode's info: told
             2: (KVPoll.Failed, {PEER.name: decode}),     # declined by decode: not told
             3: (KVPoll.Success, {PEER.name: decode}),    # sent: not told
             4: (KVPoll.Failed, {}),                      # timed out before any info: nobody to tell
             5: (KVPoll.Failed, {"10.9.9.9:1": stranger})}  # not a registered endpoint: not told
    senders = {}
    for room, (end, infos) in rooms.items():
        mgr.request_status[room], mgr.transfer_infos[room] = end, dict(infos)
        mgr.failure_records[room] = "Aborted by AbortReq."
        senders[room] = SimpleNamespace(bootstrap_room=room, conclude_state=end, kv_mgr=mgr)
    assert mgr.transfer_infos[1] and mgr.told == []  # the state under test: decode registered, nobody told yet
    guard.declining.add(2)
    for sender in senders.values():
        common_conn.around_sender_clear(mgr.clear, sender)
    assert mgr.told == [(((PEER.ip, PEER.port),), 1, KVPoll.Failed, "prefill's request failed: Aborted by AbortReq.")]
    assert mgr.transfer_infos == {} and current().counters.get("prefill_failures_told_total") == 1


def test_a_request_aborted_in_prefills_waiting_queue_is_cleared_and_its_decode_told():
    """SGLang's waiting-queue abort (release_aborted_prefill_waiting_req) marks the room Failed and drops
    the request without clearing its sender. Our AFTER hook clears it; `sender.clear` here is SGLang's
    clear on these tables behind our clear hook, as the hook table applies it in a server."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    from sglang_pd.srt.handshake import ManagerHost
    from sglang_pd.srt.hooks.connection import common_conn
    from sglang_pd.srt.hooks.scheduling import prefill
    from sglang_pd.srt.state import current

    mgr = Manager()
    lim = FrameLimits("nixl", Side.PREFILL, 16, 64, 1 << 20)
    guard = current().peer_guard
    guard.host = ManagerHost(mgr, lim)
    guard.failed_rooms = RoomTombstones(10)
    room = 21
    sender = SimpleNamespace(bootstrap_room=room, conclude_state=KVPoll.Failed, kv_mgr=mgr)  # after SGLang's abort
    sender.clear = lambda: common_conn.around_sender_clear(mgr.clear, sender)
    mgr.request_status[room] = KVPoll.Failed
    mgr.transfer_infos[room] = {PEER.name: SimpleNamespace(endpoint=PEER.ip, dst_port=PEER.port)}
    mgr.failure_records[room] = "Aborted by AbortReq."
    req = SimpleNamespace(disagg_kv_sender=sender, bootstrap_room=room)
    prefill.after_release_aborted_waiting_req(None, None, req)
    assert mgr.told == [(((PEER.ip, PEER.port),), room, KVPoll.Failed, "prefill's request failed: Aborted by AbortReq.")]
    assert room not in mgr.request_status and room not in mgr.transfer_infos and room not in mgr.failure_records
    assert guard.failed_rooms.reason(room) == "Aborted by AbortReq."  # a late transfer info is refused
    assert not current().counters.labelled["hook_errors_total"]  # the hook did not fail
    assert current().counters.get("prefill_waiting_aborts_cleared_total") == 1


def test_a_failure_tell_waits_until_no_write_into_the_decodes_pages_can_land():
    """An abort on prefill during the room's transfer: a worker holds one of its chunks (upstream's
    `_staging_outstanding`), so telling decode now would let it free pages the write still lands in. The
    tell is held, sent by the gate's housekeeping once the count drains; one held past the TTL is dropped
    (never sent); a new request on a room drops the old tell; a decode SGLang's worker already told of a
    failed transfer is not told again, nor is one told of a room the gate failed when its request's clear comes."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    from sglang_pd.srt.handshake import ManagerHost
    from sglang_pd.srt.hooks.connection import common_conn
    from sglang_pd.srt.state import current

    mgr, clock = Manager(), Clock()
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    guard, counters = current().peer_guard, current().counters
    guard.host = host = ManagerHost(mgr, lim, held_ttl_s=10, clock=clock, on_count=counters.add)
    g = HandshakeGate(lim, host, None, UnclaimedRooms(10, clock=clock), None, clock=clock, on_count=counters.add)
    decode = SimpleNamespace(endpoint=PEER.ip, dst_port=PEER.port)
    for room in (1, 2, 3, 4):
        mgr.request_status[room], mgr.transfer_infos[room] = KVPoll.Failed, {PEER.name: decode}
        mgr.failure_records[room] = "Aborted by AbortReq."
        mgr._staging_outstanding[room] = 1 if room != 4 else 0  # rooms 1-3: a chunk in flight at the clear
    senders = {room: SimpleNamespace(bootstrap_room=room, conclude_state=KVPoll.Failed, kv_mgr=mgr)
               for room in (1, 2, 3, 4)}
    for sender in senders.values():
        common_conn.around_sender_clear(mgr.clear, sender)
    told = lambda: [t[1] for t in mgr.told]  # noqa: E731
    assert told() == [4]  # nothing in flight: at once
    assert host.told_failed == {}  # sent after room 4's clear: its note forgotten, not kept until evicted
    assert sorted(host.held_tells) == [1, 2, 3] and counters.get("prefill_failure_tells_held_total") == 3
    g.housekeeping()
    assert told() == [4]  # still writing: still held
    mgr._staging_outstanding[1] -= 1  # room 1's write settled (the worker's own decrement)
    mgr._staging_outstanding.pop(2)   # room 2's chunk skipped or recovered (the entry popped)
    g.housekeeping()
    assert told() == [4, 1, 2] and mgr.told[1] == (((PEER.ip, PEER.port),), 1, KVPoll.Failed,
                                                    "prefill's request failed: Aborted by AbortReq.")
    assert counters.get("prefill_failures_told_total") == 3 and sorted(host.held_tells) == [3]
    clock.now += 11  # room 3's write never settles: dropped, never told
    g.housekeeping()
    assert told() == [4, 1, 2] and host.held_tells == {} and counters.get("prefill_failure_tells_dropped_total") == 1
    mgr._staging_outstanding[5] = 1  # a held tell, then a new request on its room: dropped
    mgr.request_status[5], mgr.transfer_infos[5], mgr.failure_records[5] = KVPoll.Failed, {PEER.name: decode}, "x"
    common_conn.around_sender_clear(mgr.clear, SimpleNamespace(bootstrap_room=5, conclude_state=KVPoll.Failed,
                                                               kv_mgr=mgr))
    assert 5 in host.held_tells
    common_conn.after_sender_init(None, SimpleNamespace(bootstrap_room=5), mgr, "addr", 5)
    assert host.held_tells == {} and counters.get("prefill_failure_tells_dropped_total") == 2
    mgr._staging_outstanding.pop(5)
    g.housekeeping()
    assert told() == [4, 1, 2]
    # a failed transfer: SGLang's worker told the decode itself (through send_kv_status_message, which our
    # AFTER hook notes); the clear does not tell it again
    mgr.request_status[6], mgr.transfer_infos[6], mgr.failure_records[6] = KVPoll.Failed, {PEER.name: decode}, "x"
    common_conn.after_send_kv_status_message(None, mgr, targets=[(PEER.ip, PEER.port)], bootstrap_room=6,
                                             status=KVPoll.Failed, failure_reason="NIXL transfer encountered ERR")
    assert host.told_failed == {6: {(PEER.ip, PEER.port)}}
    common_conn.around_sender_clear(mgr.clear, SimpleNamespace(bootstrap_room=6, conclude_state=KVPoll.Failed,
                                                               kv_mgr=mgr))
    assert told() == [4, 1, 2] and host.told_failed == {} and counters.get("prefill_failures_told_total") == 3
    # held at the clear, then SGLang's worker, settling the room's transfer, tells decode of its failure
    # itself (noted by the AFTER hook after the clear): the held tell is not sent as well
    mgr.request_status[10], mgr.transfer_infos[10], mgr.failure_records[10] = KVPoll.Failed, {PEER.name: decode}, "y"
    mgr._staging_outstanding[10] = 1
    common_conn.around_sender_clear(mgr.clear, SimpleNamespace(bootstrap_room=10, conclude_state=KVPoll.Failed,
                                                               kv_mgr=mgr))
    assert 10 in host.held_tells and told() == [4, 1, 2]
    common_conn.after_send_kv_status_message(None, mgr, targets=[(PEER.ip, PEER.port)], bootstrap_room=10,
                                             status=KVPoll.Failed, failure_reason="NIXL transfer encountered ERR")
    mgr._staging_outstanding[10] -= 1
    g.housekeeping()
    assert told() == [4, 1, 2] and host.held_tells == {} and host.told_failed == {}
    assert counters.get("prefill_failures_told_total") == 3
    # the gate failing a room in transfer (a rejected message naming it) tells the registered decode the same way
    mgr.request_status[9], mgr._staging_outstanding[9] = KVPoll.Transferring, 1
    host.claimed.add(9)
    assert host.fail_room(9, "bad frame", (PEER.ip, PEER.port)) and mgr.request_status[9] == KVPoll.Failed
    assert told() == [4, 1, 2] and 9 in host.held_tells and counters.get("prefill_failure_tells_held_total") == 6
    mgr._staging_outstanding[9] -= 1
    g.housekeeping()
    assert told() == [4, 1, 2, 9] and mgr.told[-1][3] == "bad frame"
    assert counters.get("prefill_failures_told_total") == 3  # counted as a failed room by the gate, not here
    # the room's request ends later (SGLang's clear of the failed sender): that decode was told, not twice
    assert 9 in host.claimed and host.told_failed == {9: {(PEER.ip, PEER.port)}}
    mgr.transfer_infos[9], mgr.failure_records[9] = {PEER.name: decode}, "bad frame"
    common_conn.around_sender_clear(mgr.clear, SimpleNamespace(bootstrap_room=9, conclude_state=KVPoll.Failed,
                                                               kv_mgr=mgr))
    assert told() == [4, 1, 2, 9] and host.told_failed == {} and 9 not in host.claimed


def test_with_a_secret_a_kv_manager_whose_socket_cannot_be_guarded_is_refused_before_it_is_built(pd_state, caplog):
    """Fail closed: Ascend's manager (a MooncakeKVManager subclass in another module) and Mori's have rank
    sockets sglang_pd does not guard. Without a secret they are built and warned about (upstream's
    behaviour); with SGLANG_PD_PEER_SECRET_FILE set the server refuses, before SGLang builds the manager."""
    from sglang.srt.disaggregation.ascend.conn import AscendKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode

    from sglang_pd.srt.hooks.connection import common_conn

    built = []
    mgr = AscendKVManager.__new__(AscendKVManager)
    args = SimpleNamespace(kv_data_lens=[1 << 20], kv_item_lens=[4096], aux_item_lens=[], aux_data_lens=[], page_size=1)
    original = lambda *a: built.append(a)  # noqa: E731  (what SGLang's __init__ would build)
    server_args = SimpleNamespace(host="127.0.0.1", disaggregation_bootstrap_port=8998, dist_init_addr=None)
    assert pd_state.peer_guard.auth is None
    with caplog.at_level(logging.WARNING, logger="sglang_pd.srt.hooks.connection.common_conn"):
        common_conn.around_manager_init(original, mgr, args, DisaggregationMode.PREFILL, server_args)
    assert len(built) == 1 and "AscendKVManager rank socket is not guarded" in caplog.text
    pd_state.peer_guard.auth = PeerAuth([KEY])
    with pytest.raises(RuntimeError, match=r"SGLANG_PD_PEER_SECRET_FILE is set, but the rank socket of AscendKVManager"):
        common_conn.around_manager_init(original, mgr, args, DisaggregationMode.DECODE, server_args)
    assert len(built) == 1  # not built


def test_a_message_is_screened_before_the_reader_takes_its_hold():
    """Authentication and the schema (a MAC over every frame: up to a second on a stranger's 100 x 16 MiB
    message) read no room state and run before the bootstrap reader takes its hold, so a clear meanwhile
    gets its turn at once; the room checks and SGLang's handling run under the hold. A message with more
    frames than any PD message is dropped before its frames are copied."""
    from sglang_pd.srt.handshake import Between

    ctx, raw, port, host, auth = _bound_socket_and_registered_peer()
    g = gate(host, auth=auth, receiver=f"127.0.0.1:{port}".encode())
    screening, go = threading.Event(), threading.Event()
    screen = g.screen

    def slow_screen(msg, peer):  # the gate's own screen, entered and paused (a probe, not a replacement)
        screening.set()
        go.wait(5)
        return screen(msg, peer)

    g.screen = slow_screen
    sock = GuardedSocket.around(raw, g, on_error=lambda doing: None, housekeeping_s=0.05, hold=True)
    sock.hold_wait_s = 0.3
    got, handled = [], threading.Event()

    def read_one():  # SGLang's bootstrap thread: receive, then handle (until `handled`)
        got.append(sock.recv_multipart())
        handled.wait(5)

    reader = threading.Thread(target=read_one, daemon=True)
    push = SigningSocket.around(ctx.socket(zmq.PUSH), auth, f"tcp://127.0.0.1:{port}")
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        push.send_multipart([b"x"] * 40)  # 40 frames: dropped unread
        message = T.abort(3, PEER.ip, PEER.port)
        push.send_multipart(message)
        reader.start()
        assert screening.wait(5) and not sock._held  # the reader is inside the screen of the ABORT
        assert g.counts.rejected == {"unknown": 1} and g.counts.num_received == 1  # the 40 frames, unscreened
        with sock.between_messages() as turn:
            assert turn is Between.FREE  # a clear now runs at once
        go.set()
        for _ in range(100):
            if got:
                break
            threading.Event().wait(0.02)
        assert got == [message] and sock._held  # admitted; held while SGLang handles it
        with sock.between_messages() as turn:
            assert turn is Between.TIMED_OUT  # a clear would wait for the handling (here past the cap)
    finally:
        go.set()
        handled.set()
        push.close(linger=0)
        sock.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_a_full_registration_table_gives_the_longest_idle_peers_place_to_a_new_one(backend):
    """SGLang never forgets a registration, and a decode rank that restarts registers under a new name (NIXL:
    a fresh agent uuid per process): with the table capped, a long-lived prefill refused every new decode
    once enough had restarted. Full, the table now gives the place of the peer unused longest (at least
    `peer_idle_s`) and named by no room's transfer info; SGLang's per-peer state goes with it."""
    from sglang_pd.srt.handshake import ManagerHost

    class Agent:  # NIXL's agent: which remote agents were removed
        def __init__(self):
            self.removed = []

        def remove_remote_agent(self, name):
            self.removed.append(name)

    def peer(n):
        return PeerIdentity("127.0.0.1", 40000 + n, f"127.0.0.1:{17000 + n}")  # a new name per decode process

    mgr, clock = Manager(), Clock()
    mgr.decode_kv_args_table, mgr.agent = {}, Agent()
    per_peer = {}  # SGLang's per-peer state (NIXL: prepared transfer handles; mooncake: a layout verdict)
    setattr(mgr, "prep_handles" if backend == "nixl" else "state_layout_rejections", per_peer)
    lim = FrameLimits(backend, Side.PREFILL, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    host = ManagerHost(mgr, lim)
    counted = defaultdict(int)
    g = HandshakeGate(lim, host, None, None, None, clock=clock, max_peers=2, peer_idle_s=600,
                      on_count=lambda name, n: counted.__setitem__(name, counted[name] + n))

    def register(n):  # the gate, then what SGLang's handler stores for an admitted registration
        msg = Templates(backend, peer(n)).registration([4096], 2048, num_slots=64)
        if g.admit(msg, "127.0.0.1") is None:
            return False
        mgr.decode_kv_args_table[peer(n).name] = SimpleNamespace(endpoint=peer(n).ip, dst_port=peer(n).port,
                                                                dst_num_slots=64)
        per_peer[peer(n).name] = object()
        return True

    assert register(1) and register(2)
    clock.now += 300
    mgr.transfer_infos[7] = {peer(2).name: object()}  # a room of peer 2's, still in SGLang's table
    assert g.admit(Templates(backend, peer(2)).transfer_info(7, [1, 2]), "127.0.0.1") is not None
    assert not register(3)  # full, and nobody idle for 600 s: refused as before
    assert g.counts.rejected == {"registration": 1}
    clock.now += 400  # peer 1 idle 700 s, peer 2 used 400 s ago
    assert register(3)  # peer 1's place
    assert sorted(mgr.decode_kv_args_table) == [peer(2).name, peer(3).name] and sorted(per_peer) == [peer(2).name, peer(3).name]
    assert mgr.agent.removed == ([peer(1).name] if backend == "nixl" else [])
    assert counted["handshake_peers_forgotten_total"] == 1
    clock.now += 1000  # both idle now, but room 7 still names peer 2: peer 3 gives its place
    assert register(4) and sorted(mgr.decode_kv_args_table) == [peer(2).name, peer(4).name]
    assert host.forget_peer(peer(2).name) is PeerRemoval.IN_USE and host.forget_peer("nobody") is PeerRemoval.UNKNOWN
