"""Room decline: the wire frames (read by upstream's own ABORT parser too) and the prefill-side table that
closes the decline-before-room race, on real threads."""

import threading
import time

import pytest

from sglang_pd.srt.wire import (DeclineError, DeclineNotice, RoomDeclineTable,
                                                       decline_frames, parse_decline)
from sglang_pd.srt.wire import MessageKind
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.wire import check_message
from sglang_pd.srt.metrics import PDCounters

pytestmark = pytest.mark.unit


def test_frames_round_trip_and_upstream_reads_them_as_an_abort_of_the_room():
    from sglang.srt.disaggregation.common.conn import AbortNotification

    notice = DeclineNotice(1234567890123, None, "served by decode: 17 tokens")
    frames = decline_frames(notice, "127.0.0.1", 4567)
    assert parse_decline(frames) == notice
    rejected = DeclineNotice(5, 503, "predicted TTFT too high; retry_after_s=2")
    assert parse_decline(decline_frames(rejected, "10.0.0.2", 1)) == rejected
    # A prefill without the plugin parses the same message as upstream's ABORT of that room (its
    # generation frame 0 arms no drain-ack), so it still drops the room.
    upstream = AbortNotification.from_zmq(frames)
    assert (upstream.room, upstream.decode_ip, upstream.decode_port) == (1234567890123, "127.0.0.1", 4567)
    assert upstream.deferred_ack_target().generation == 0


def test_upstream_messages_are_not_declines_and_broken_declines_are_named():
    from sglang.srt.disaggregation.common.conn import AbortNotification

    plain_abort = AbortNotification(room=7, decode_ip="1.2.3.4", decode_port=9, generation=3).to_zmq()
    assert parse_decline(plain_abort) is None
    assert parse_decline([b"7", b"127.0.0.1", b"1"]) is None
    frames = decline_frames(DeclineNotice(7, None, "x"), "127.0.0.1", 1)
    with pytest.raises(DeclineError, match="expected 8"):
        parse_decline(frames[:7])
    with pytest.raises(DeclineError, match="unreadable"):
        parse_decline(frames[:6] + [b"two hundred", b"x"])
    with pytest.raises(ValueError):
        DeclineNotice(7, 200, "200 is spelled None")


def test_the_rank_socket_schema_admits_a_decline_and_names_what_is_wrong_with_a_broken_one():
    """Prefill's rank socket checks every message before upstream parses it: a decline is a message of
    its own there (both backends), well-formed ones pass, broken ones are refused with their room."""
    frames = decline_frames(DeclineNotice(99, 503, "x" * 100), "127.0.0.1", 4567)
    broken = {"generation": (4, b"3", "decline generation"), "status": (6, b"two hundred", "unreadable decline"),
              "port": (3, b"http", "port"), "message": (7, b"m" * 5000, "more than 4096")}
    for backend in ("mooncake", "nixl"):
        limits = FrameLimits(backend, Side.PREFILL, 16, 64, 1 << 20)
        verdict = check_message(frames, limits)
        assert (verdict.kind, verdict.reason, verdict.room) == (MessageKind.DECLINE, None, 99)
        assert check_message(frames[:7], limits).reason.startswith("malformed decline (room 99)")
        for at, value, named in broken.values():
            bad = check_message(frames[:at] + [value] + frames[at + 1:], limits)
            assert bad.kind is MessageKind.DECLINE and bad.room == 99 and named in bad.reason, bad.reason


class FakeRooms:
    """Prefill's room table as the callback sees it: rooms that exist, rooms failed (with the message)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.existing: set[int] = set()
        self.failed: dict[int, list[str]] = {}

    def create(self, room):
        with self.lock:
            self.existing.add(room)

    def fail_if_known(self, room, message):
        with self.lock:
            if room not in self.existing:
                return False
            self.failed.setdefault(room, []).append(message)
            return True


def test_decline_after_the_room_exists_fails_it_at_once():
    counters, rooms = PDCounters(), FakeRooms()
    table = RoomDeclineTable(counters)
    rooms.create(11)
    assert table.receive(DeclineNotice(11, None, "local"), rooms.fail_if_known)
    assert rooms.failed == {11: ["local"]} and counters.get("prefill_decline_tombstones_total") == 0
    assert not table.on_room_created(11, rooms.fail_if_known), "failed once, not again"
    assert table.take(11) == DeclineNotice(11, None, "local") and table.take(11) is None
    assert table.pending() == 0


def test_decline_before_the_room_leaves_a_tombstone_that_fails_it_on_creation():
    counters, rooms = PDCounters(), FakeRooms()
    table = RoomDeclineTable(counters)
    assert not table.receive(DeclineNotice(12, None, "early"), rooms.fail_if_known)
    assert rooms.failed == {} and counters.get("prefill_decline_tombstones_total") == 1
    assert table.snapshot()["num_tombstones"] == 1
    rooms.create(12)
    assert table.on_room_created(12, rooms.fail_if_known)
    assert rooms.failed == {12: ["early"]} and table.snapshot()["num_tombstones"] == 0
    assert table.take(12).message == "early"
    assert not table.on_room_created(13, rooms.fail_if_known), "a room nobody declined is left alone"


def test_tombstones_of_halves_that_never_come_expire():
    now = [100.0]
    counters = PDCounters()
    table = RoomDeclineTable(counters, ttl_s=60, max_entries=2, clock=lambda: now[0])
    never = FakeRooms().fail_if_known
    table.receive(DeclineNotice(1, None, "a"), never)
    now[0] = 130.0
    table.receive(DeclineNotice(2, None, "b"), never)
    now[0] = 170.0
    assert table.expire() == 1 and table.pending() == 1  # room 1 is 70 s old, room 2 only 40 s
    table.receive(DeclineNotice(3, None, "c"), never)
    table.receive(DeclineNotice(4, None, "d"), never)  # over max_entries: the oldest (2) goes
    assert table.take(2) is None and table.take(4) is not None
    assert counters.get("prefill_declines_expired_total") == 2


def test_every_room_is_failed_exactly_once_whoever_wins_the_race():
    """The bootstrap thread declines rooms while the scheduler thread creates them, in random order:
    each room is failed exactly once (no decline lost, none applied twice)."""
    counters, rooms = PDCounters(), FakeRooms()
    table = RoomDeclineTable(counters)
    room_ids = list(range(1000, 3000))
    start = threading.Barrier(2)

    def bootstrap_thread():
        start.wait()
        for room in room_ids:
            table.receive(DeclineNotice(room, None, "d"), rooms.fail_if_known)
            time.sleep(0)  # hand the GIL over: the threads interleave room by room

    def scheduler_thread():
        start.wait()
        for room in reversed(room_ids):  # meet the other thread halfway: both orders happen
            rooms.create(room)
            table.on_room_created(room, rooms.fail_if_known)
            time.sleep(0)

    threads = [threading.Thread(target=bootstrap_thread), threading.Thread(target=scheduler_thread)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(rooms.failed) == room_ids
    assert all(len(messages) == 1 for messages in rooms.failed.values())
    tombstoned = counters.get("prefill_decline_tombstones_total")
    assert 0 < tombstoned < len(room_ids), "both orders of the race were exercised"
    assert all(table.take(room) is not None for room in room_ids) and table.pending() == 0
