"""What moved out of hooks/common_conn.py, tested without SGLang's server: rank_socket (FrameLimits from
KVArgs, DCP place, the threads a manager runs, the bootstrap hold's switch), prefill_rooms (a room's life
around its sender, over a real ManagerHost and real tombstones / digests) and decline_delivery (both ends
of a room decline, over a real RoomDeclineTable). SGLang's manager and receiver are small fakes of their
tables and sockets; the units under test are real."""

import threading
from collections import defaultdict
from types import SimpleNamespace

import pytest
from sglang.srt.disaggregation.base.conn import KVPoll

from sglang_pd.srt.handshake import consume_decline, fail_room_if_known, send_decline
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.handshake import ManagerHost
from sglang_pd.srt.handshake import PrefillRooms
from sglang_pd.srt.wire.prompt_binding import PromptDigests, prompt_digest
from sglang_pd.srt.handshake import (expected_threads, frame_limits, reader_comes_straight_back,
                                                 with_dcp_place)
from sglang_pd.srt.wire import DeclineNotice, RoomDeclineTable, decline_frames
from sglang_pd.srt.handshake import RoomTombstones
from sglang_pd.srt.metrics import PDCounters
from sglang_pd.srt.threads import ThreadRole

pytestmark = pytest.mark.unit

DECODE = ("10.0.0.2", 7000)
MOONCAKE = "sglang.srt.disaggregation.mooncake.conn"


def kv_args(**kw):
    base = dict(kv_data_lens=[4096 * 100], kv_item_lens=[4096], aux_item_lens=[64], aux_data_lens=[64 * 32],
                page_size=16, state_types=[])
    return SimpleNamespace(**{**base, **kw})


def test_frame_limits_from_kv_args():
    lim = frame_limits(kv_args(), MOONCAKE, "prefill", staging=True)
    assert (lim.backend, lim.side, lim.page_size, lim.max_kv_pages) == ("mooncake", Side.PREFILL, 16, 108)
    assert lim.aux_slots == (32,) and lim.aux_item_lens == (64,) and lim.staging
    assert lim.max_frame_bytes == 4 << 20
    decode = frame_limits(kv_args(aux_item_lens=[2 << 20], aux_data_lens=[2 << 20]), "x.nixl.conn", "decode", False)
    assert decode.backend == "nixl" and decode.max_frame_bytes == (2 << 20) + 64 and not decode.staging
    assert frame_limits(kv_args(), "sglang.srt.disaggregation.mori.conn", "prefill", False) is None
    assert frame_limits(kv_args(), MOONCAKE, "null", False) is None


def test_dcp_place_of_a_prefill_manager():
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 64, 1 << 20)
    mla = SimpleNamespace(dcp_size=1, dcp_rank=0, is_mla_backend=True, is_hybrid_mla_backend=False,
                          kv_args=SimpleNamespace(kv_item_lens=[16 * 576, 16 * 576, 16 * 64], num_draft_entries=1))
    placed = with_dcp_place(lim, mla)
    assert (placed.dcp_size, placed.dcp_rank, placed.dcp_relayout_token_bytes) == (1, 0, (576, 576))
    plain = SimpleNamespace(**{**vars(mla), "dcp_size": 2, "dcp_rank": 1})
    assert with_dcp_place(lim, plain).dcp_relayout_token_bytes is None and with_dcp_place(lim, plain).dcp_rank == 1
    decode = FrameLimits("mooncake", Side.DECODE, 16, 64, 1 << 20)
    assert with_dcp_place(decode, mla) is decode


def test_threads_a_manager_runs_and_the_bootstrap_holds_switch():
    assert expected_threads(SimpleNamespace(), Side.DECODE) == {ThreadRole.STATUS_LISTENER: 1, ThreadRole.HEARTBEAT: 1}
    assert expected_threads(SimpleNamespace(), Side.PREFILL) is None  # queues not built yet
    assert expected_threads(SimpleNamespace(transfer_queues=[1, 2, 3]), Side.PREFILL)[ThreadRole.TRANSFER_WORKER] == 3
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 64, 1 << 20)
    mgr = lambda switch, deferred=None: SimpleNamespace(  # noqa: E731
        deferred_bootstrap=deferred, server_args=SimpleNamespace(enable_pd_role_switch=switch))
    assert reader_comes_straight_back(mgr(False), lim)
    assert not reader_comes_straight_back(mgr(True), lim)  # SGLang polls the raw socket first
    assert reader_comes_straight_back(mgr(True, deferred=object()), lim)
    assert reader_comes_straight_back(mgr(True), FrameLimits("nixl", Side.PREFILL, 16, 64, 1 << 20))


class Manager:
    """SGLang's prefill manager tables that ManagerHost and the decline path read and write."""

    def __init__(self):
        self.request_status, self.transfer_infos, self.failure_records = {}, {}, {}
        self._staging_outstanding = defaultdict(int)
        self.decode_kv_args_table = {"d": SimpleNamespace(endpoint=DECODE[0], dst_port=DECODE[1])}
        self.told = []

    def send_kv_status_message(self, targets, bootstrap_room, status, failure_reason=None):
        self.told.append((list(targets), bootstrap_room, status, failure_reason))

    def record_failure(self, room, reason):
        self.failure_records[room] = reason

    def update_status(self, room, status):
        self.request_status[room] = status


def rooms_over(mgr, counts):
    host = ManagerHost(mgr, FrameLimits("mooncake", Side.PREFILL, 16, 64, 1 << 20))
    return PrefillRooms(host, RoomTombstones(60), RoomTombstones(60), PromptDigests(), set(),
                        lambda name, n: counts.__setitem__(name, counts.get(name, 0) + n))


def test_a_rooms_life_around_its_sender():
    mgr, counts = Manager(), {}
    rooms = rooms_over(mgr, counts)
    rooms.tombstones.bury(5, "rejected before its request")
    rooms.failed_rooms.bury(6, "an old request failed")
    assert rooms.claim(5) == "rejected before its request" and rooms.claim(6) is None
    assert rooms.host.claimed == {5, 6} and rooms.failed_rooms.reason(6) is None
    mgr.transfer_infos[6] = {"d": SimpleNamespace(endpoint=DECODE[0], dst_port=DECODE[1])}
    waiting = rooms.decodes_waiting(6, lambda: mgr.transfer_infos.get(6))
    assert waiting == [DECODE]
    rooms.tell_failure(6, waiting, failed=False, why=None)  # a success: nobody told
    assert mgr.told == []
    rooms.tell_failure(6, waiting, failed=True, why="Aborted by AbortReq.")
    assert mgr.told == [([DECODE], 6, KVPoll.Failed, "prefill's request failed: Aborted by AbortReq.")]
    assert counts == {"prefill_failures_told_total": 1}
    sender = object()
    assert rooms.digests.record(6, prompt_digest([1, 2])) is None and rooms.digests.check(6, [1, 2], sender) is None
    rooms.end_claim(6, sender, failed=True, why=None)
    assert 6 not in rooms.host.claimed and rooms.failed_rooms.reason(6) == "failed (no reason recorded)"
    assert rooms.digests.snapshot()["num_rooms_bound"] == 0


def test_declined_rooms_and_writes_in_flight_are_not_told_at_once():
    mgr, counts = Manager(), {}
    rooms = rooms_over(mgr, counts)
    mgr.transfer_infos[7] = {"d": SimpleNamespace(endpoint=DECODE[0], dst_port=DECODE[1])}
    rooms.declining.add(7)
    assert rooms.decodes_waiting(7, lambda: mgr.transfer_infos.get(7)) == []  # decode asked for the failure
    mgr._staging_outstanding[8] = 1
    rooms.tell_failure(8, [DECODE], failed=True, why="x")
    assert mgr.told == [] and 8 in rooms.host.held_tells  # sent once the write settles
    assert rooms.claim(8) is None and counts == {"prefill_failure_tells_dropped_total": 1}  # a new request: dropped
    idle = PrefillRooms(None, None, None, None, set())
    assert idle.claim(9) is None and idle.decodes_waiting(9, lambda: 1 / 0) == []  # no host: nothing read


def test_a_decline_is_consumed_on_prefill_and_sent_to_every_rank_on_decode():
    mgr, counters = Manager(), PDCounters()
    table = RoomDeclineTable(counters)
    msg = decline_frames(DeclineNotice(3, 503, "busy"), *DECODE)
    assert consume_decline(mgr, msg, table, counters) and mgr.request_status == {}  # no room yet: a tombstone
    assert counters.get("prefill_decline_tombstones_total") == 1
    mgr.request_status[3] = KVPoll.Bootstrapping
    assert table.on_room_created(3, lambda r, m: fail_room_if_known(mgr, r, m))
    assert mgr.request_status[3] == KVPoll.Failed and mgr.failure_records[3] == "busy"
    mgr.request_status[4] = KVPoll.Success
    assert not fail_room_if_known(mgr, 4, "late") and mgr.request_status[4] == KVPoll.Success
    assert not consume_decline(mgr, [b"ABORT", b"3"], table, counters)  # upstream's ABORT: not ours
    assert consume_decline(mgr, msg[:7], table, counters)  # marked but unreadable: dropped, counted
    assert counters.get("prefill_declines_malformed_total") == 1

    sent = []
    sock = SimpleNamespace(send_multipart=sent.append)
    receiver = SimpleNamespace(bootstrap_infos=[{"rank": 0}, {"rank": 1}], abort_notified=False,
                               kv_mgr=SimpleNamespace(local_ip=DECODE[0], rank_port=DECODE[1]),
                               _connect_to_bootstrap_server=lambda info: (sock, threading.Lock()))
    assert send_decline(receiver, DeclineNotice(3, 503, "busy")) == 2
    assert sent == [msg, msg] and receiver.abort_notified
    with pytest.raises(RuntimeError, match="no prefill rank"):
        send_decline(SimpleNamespace(bootstrap_infos=[]), DeclineNotice(3, None, "x"))
