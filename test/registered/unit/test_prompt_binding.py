"""A bootstrap room bound to one prompt (prompt_binding.py): the digest, its frame, prefill's table and
decode's outgoing scope; and the real handshake gate taking the frame off a transfer info (SGLang's
parser sees upstream's frames only), recording it, and refusing a malformed or misplaced one."""

import pytest

from sglang_pd.harness.hostile_peer import PeerIdentity, Templates
from sglang_pd.srt.wire import FrameError, FrameLimits, Side
from sglang_pd.srt.handshake import HandshakeGate
from sglang_pd.srt.handshake import PeerRecord, PeerRemoval
from sglang_pd.srt.wire.prompt_binding import (DIGEST_BYTES, DIGEST_MARKER, OutgoingDigests, PromptDigests,
                                                         digest_frame, prompt_digest, split_digest)
from sglang_pd.srt.handshake import RoomTombstones, UnclaimedRooms

pytestmark = pytest.mark.unit

PEER = PeerIdentity("127.0.0.1", 40001, "127.0.0.1:16001")


def test_the_digest_names_the_exact_token_sequence():
    a = list(range(5, 105))
    assert len(prompt_digest(a)) == DIGEST_BYTES and prompt_digest(a) == prompt_digest(tuple(a))
    assert prompt_digest(a) != prompt_digest(a[:-1])                # length
    assert prompt_digest(a) != prompt_digest(a[:50] + [a[50] + 1] + a[51:])  # one token
    assert prompt_digest([1, 2]) != prompt_digest([2, 1])          # order
    assert prompt_digest([]) == prompt_digest([])


def test_split_takes_off_only_our_trailing_frame():
    frames = [b"5", b"127.0.0.1", b"40001"]
    assert split_digest(frames) == (frames, None)
    assert split_digest([]) == ([], None)
    d = prompt_digest([7, 8, 9])
    assert split_digest([*frames, digest_frame(d)]) == (frames, d)
    with pytest.raises(FrameError, match="3 digest bytes, not 16"):
        split_digest([*frames, DIGEST_MARKER + b"abc"])
    mid = [b"5", digest_frame(d), b"x"]                              # not last: not ours to take
    assert split_digest(mid) == (mid, None)


def test_prefill_table_matches_refuses_and_counts():
    table = PromptDigests()
    a, b = [5, 6, 7, 8], [5, 6, 7, 9]
    table.record(1, prompt_digest(a))
    assert table.check(1, a) is None                                # same prompt: served
    table.record(2, prompt_digest(a))
    reason = table.check(2, b)
    assert reason.startswith("sglang_pd: rejected by prefill: room 2's transfer info was sent for a different "
                             "prompt than this request's (4 tokens)")
    assert table.check(3, a) is None                                # no digest (plugin-less decode): served
    table.record(4, prompt_digest(a))
    table.record(4, None)                                           # a later info without the frame clears it
    assert table.check(4, b) is None
    table.record(5, prompt_digest(a))
    table.record(5, prompt_digest(b))                               # the room's latest info counts
    assert table.check(5, b) is None and table.check(5, a) is None  # consumed by the first check
    view = table.snapshot()
    assert {k: view[k] for k in ("num_rooms_held", "num_recorded", "num_matched", "num_mismatched", "num_absent")} \
        == {"num_rooms_held": 0, "num_recorded": 5, "num_matched": 2, "num_mismatched": 1, "num_absent": 3}


def test_a_matched_room_stays_bound_to_its_prompt_until_its_sender_is_cleared():
    """After the check passed, SGLang still sends the KV to the pages the room's LATEST transfer info
    names: a later info for the room must carry the same prompt, else it is refused (nothing recorded)."""
    table = PromptDigests()
    a, b = [5, 6, 7, 8], [5, 6, 7, 9]
    sender_a, sender_b = object(), object()
    assert table.record(9, prompt_digest(a)) is None
    assert table.check(9, a, sender_a) is None
    assert table.snapshot()["num_rooms_bound"] == 1
    reason = table.record(9, prompt_digest(b))
    assert reason.startswith("transfer info for room 9 was sent for a different prompt than the request this "
                             "prefill is already serving")
    assert table.record(9, None) is not None                        # no digest cannot rebind it either
    assert table.record(9, prompt_digest(a)) is None                # the same prompt again: accepted
    table.unbind(9, sender_b)                                       # another request's sender: no effect
    assert table.record(9, prompt_digest(b)) is not None
    table.unbind(9, sender_a)                                       # the room's request ended
    assert table.record(9, prompt_digest(b)) is None and table.check(9, b, sender_b) is None
    assert table.snapshot()["num_refused_after_bind"] == 3
    assert table.check(10, a, sender_a) is None                     # absent: nothing to bind
    assert table.record(10, prompt_digest(b)) is None


def test_prefill_table_is_bounded_oldest_first():
    table = PromptDigests(max_rooms=3)
    for room in range(5):
        table.record(room, prompt_digest([room]))
    assert table.snapshot()["num_rooms_held"] == 3
    assert table.check(0, [99]) is None and table.check(1, [99]) is None   # dropped: absent
    assert table.check(4, [99]) is not None                                # held: checked


def test_decode_frame_exists_only_while_its_room_is_being_sent():
    out = OutgoingDigests()
    assert out.frame_for(7) is None
    with out.sending(7, [1, 2, 3]):
        assert out.frame_for(7) == digest_frame(prompt_digest([1, 2, 3]))
        assert out.frame_for(8) is None
    assert out.frame_for(7) is None and out.num_sent == 1
    with pytest.raises(RuntimeError):
        with out.sending(9, [4]):
            raise RuntimeError("send failed")
    assert out.frame_for(9) is None                                 # cleared on the failure path too


class Host:
    """The gate's view of a KV manager, as plain tables."""

    def __init__(self):
        self.peers = {PEER.name: PeerRecord(PEER.ip, PEER.port)}
        self.failed = []

    def registered_peer(self, name):
        return self.peers.get(name)

    def num_registered(self):
        return len(self.peers)

    def endpoint_registered(self, target):
        return any((r.endpoint, r.port) == tuple(target) for r in self.peers.values())

    def forget_peer(self, name):
        return PeerRemoval.IN_USE

    def room_claimed(self, room):
        return True

    def fail_room(self, room, reason, notify):
        self.failed.append((room, reason, notify))
        return True

    def drop_unclaimed(self, room, reason):
        return False

    def prune(self):
        pass

    def send_drained_tells(self):
        return [], []


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_the_gate_takes_the_frame_off_records_it_and_refuses_a_bad_one(backend):
    host, table = Host(), PromptDigests()
    limits = FrameLimits(backend, Side.PREFILL, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    gate = HandshakeGate(limits, host, None, UnclaimedRooms(10), RoomTombstones(10), digests=table)
    t = Templates(backend, PEER)
    info = t.transfer_info(5, [1, 2], decode_prefix_len=16)
    d = prompt_digest([11, 12, 13])
    assert gate.admit([*info, digest_frame(d)], "10.0.0.9") == info          # SGLang sees upstream's frames
    assert table.check(5, [11, 12, 13], "sender of room 5") is None and table.snapshot()["num_matched"] == 1
    info7 = t.transfer_info(7, [3], decode_prefix_len=16)
    assert gate.admit(info7, "10.0.0.9") == info7                              # no frame: as upstream
    assert gate.admit([*info, digest_frame(prompt_digest([14]))], "10.0.0.9") is None  # room 5 serves [11, 12, 13]
    assert host.failed[-1][0] == 5 and "already serving in that room" in host.failed[-1][1]
    assert gate.admit([*t.transfer_info(6, [1]), DIGEST_MARKER + b"short"], "10.0.0.9") is None
    room, reason, _ = host.failed[-1]
    assert room == 6 and "prompt digest frame has 5 digest bytes" in reason
    assert len(host.failed) == 2
    registration = t.registration([4096], 2048, [8192], num_slots=64)
    assert gate.admit([*registration, digest_frame(d)], "10.0.0.9") is None   # only a transfer info carries one
    view = gate.snapshot()
    assert view["rejected"] == {"transfer_info": 2, "registration": 1}
    assert "a prompt digest frame ends a registration message" in view["peers"]["10.0.0.9"]["last"]
    assert view["prompt_digests"]["num_recorded"] == 1 and len(host.failed) == 2  # no room named: none failed
