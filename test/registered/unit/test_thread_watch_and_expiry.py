"""PD thread deaths are found and reported once; unclaimed rooms and tombstones stay bounded."""

import threading

import pytest

from sglang_pd.srt.handshake import RoomTombstones, UnclaimedRooms
from sglang_pd.srt.threads.thread_watch import ThreadRole, ThreadWatch, role_of

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _start(target):
    thread = threading.Thread(target=target, daemon=True)  # unnamed: Python names it after the target
    thread.start()
    return thread


def test_roles_come_from_the_names_python_gives_sglangs_threads():
    def bootstrap_thread():
        pass

    assert role_of(threading.Thread(target=bootstrap_thread).name) is ThreadRole.BOOTSTRAP
    assert role_of("Thread-9 (decode_listener_thread)") is ThreadRole.STATUS_LISTENER
    assert role_of("HeartbeatChecker") is ThreadRole.HEARTBEAT
    assert role_of("Thread-3 (run)") is None and role_of("MainThread") is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_thread_is_reported_once_and_old_threads_are_ignored():
    stop = threading.Event()

    def transfer_worker():
        stop.wait()

    def bootstrap_thread():
        raise_after.wait()
        raise RuntimeError("injected: what an unhandled parse error does to SGLang's thread")

    raise_after = threading.Event()
    old = _start(transfer_worker)
    before = threading.enumerate()
    deaths = []
    watch = ThreadWatch(before, lambda: {ThreadRole.BOOTSTRAP: 1, ThreadRole.TRANSFER_WORKER: 1},
                        lambda name, role: deaths.append((name, role)))
    workers = [_start(transfer_worker), _start(bootstrap_thread)]
    assert watch.tick(threading.enumerate()) == [] and watch.discovered
    assert old.name not in watch.snapshot()["alive"]
    raise_after.set()
    workers[1].join(5)
    assert watch.tick(threading.enumerate()) == [workers[1].name]
    assert watch.tick(threading.enumerate()) == []  # reported once
    assert deaths == [(workers[1].name, ThreadRole.BOOTSTRAP)]
    assert watch.dead() == {workers[1].name: "bootstrap"}
    stop.set()


def test_a_thread_never_seen_counts_as_dead_after_the_discovery_timeout():
    clock = Clock()
    deaths = []
    watch = ThreadWatch(threading.enumerate(), lambda: {ThreadRole.STATUS_LISTENER: 1},
                        lambda name, role: deaths.append(role), discover_timeout_s=5, clock=clock)
    assert watch.tick([]) == [] and not watch.discovered
    clock.now = 6
    assert watch.tick([]) == ["status_listener#0 (never seen)"] and deaths == [ThreadRole.STATUS_LISTENER]


def test_unclaimed_rooms_expire_by_age_count_and_bytes():
    clock = Clock()
    rooms = UnclaimedRooms(ttl_s=10, max_rooms=3, max_bytes=100, clock=clock)
    held = {}
    for room in (1, 2, 3):
        rooms.note(room, 10)
        held[room] = True
    drop = lambda room: held.pop(room, None) is not None
    assert rooms.sweep(lambda r: r == 2, drop) == []          # young; room 2 claimed -> forgotten
    rooms.note(4, 10)
    rooms.note(5, 10)
    held.update({4: True, 5: True})
    assert rooms.sweep(lambda r: False, drop) == [1]          # 4 tracked > max_rooms 3: oldest dropped
    clock.now = 5
    rooms.note(6, 95)
    held[6] = True
    assert rooms.sweep(lambda r: False, drop) == [3, 4, 5]    # bytes over 100: oldest first until under
    clock.now = 14
    assert rooms.sweep(lambda r: False, drop) == [] and 6 in held
    clock.now = 16
    assert rooms.sweep(lambda r: False, drop) == [6]
    assert rooms.snapshot()["num_expired"] == 5 and rooms.snapshot()["num_bytes"] == 0


def test_tombstones_are_bounded_and_expire():
    clock = Clock()
    tombs = RoomTombstones(ttl_s=5, max_rooms=2, clock=clock)
    for room in (1, 2, 3):
        tombs.bury(room, f"bad {room}")
    assert tombs.take(1) is None and tombs.take(2) == "bad 2" and tombs.take(2) is None
    clock.now = 6
    assert tombs.take(3) is None and len(tombs) == 0


def test_unclaimed_bytes_stay_consistent_when_a_room_gets_several_transfer_infos():
    """Regression: a second transfer info for a tracked room added its bytes to the room but not to the
    total, so forgetting the room drove the total negative (/sglang_pd/stats showed num_bytes -108)."""
    clock = Clock()
    rooms = UnclaimedRooms(ttl_s=10, clock=clock)
    rooms.note(7, 108)
    rooms.note(7, 108)   # a second decode rank (or a resend) names the same room
    rooms.note(8, 50)
    assert rooms.snapshot()["num_bytes"] == 266
    assert rooms.sweep(lambda r: r == 7, lambda r: True) == []   # claimed: forgotten, not dropped
    assert rooms.snapshot()["num_bytes"] == 50 and rooms.snapshot()["num_tracked"] == 1
    clock.now = 11
    assert rooms.sweep(lambda r: False, lambda r: True) == [8]
    assert rooms.snapshot() == {"num_tracked": 0, "num_bytes": 0, "num_expired": 1, "ttl_s": 10.0}
