"""KV integrity before the tree (wire/kv_digest.py): the digest tells KV rows apart, the frame round-trips,
the tables hand each room's digest over once, and decode's gate takes a status's digest frame off (recorded
for the room when digests are on) while a digest frame on any other message is refused."""

import pytest
import torch

from sglang_pd.harness.hostile_peer import Templates
from sglang_pd.srt.handshake import HandshakeGate
from sglang_pd.srt.wire import FrameError, FrameLimits, ReceivedKvDigests, SentKvDigests, Side, kv_digest, split_kv_digest
from sglang_pd.srt.wire.kv_digest import digest_frame

from test_handshake_gate import PEER, RECV, Host, gate

pytestmark = pytest.mark.unit


def _layers(num_layers=3, slots=64, heads=2, dim=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(slots, heads, dim, generator=gen), torch.randn(slots, heads, dim, generator=gen))
            for _ in range(num_layers)]


def test_the_digest_depends_on_every_row_it_covers_and_on_nothing_else():
    layers, slots = _layers(), torch.tensor([5, 6, 7, 20])
    base = kv_digest(layers, slots)
    assert len(base) == 16 and kv_digest(_layers(), slots) == base  # the same bytes, the same digest
    for layer in range(3):
        for kv in range(2):
            changed = [(k.clone(), v.clone()) for k, v in layers]
            changed[layer][kv][20, 1, 3] += 1e-6  # one element of one covered row, one layer, K or V
            assert kv_digest(changed, slots) != base, (layer, kv)
    outside = [(k.clone(), v.clone()) for k, v in layers]
    outside[0][0][21] += 1.0  # a row the request does not own
    assert kv_digest(outside, slots) == base
    assert kv_digest(layers, torch.tensor([5, 6, 20, 7])) != base  # the order of the rows counts
    swapped = [(v, k) for k, v in layers]
    assert kv_digest(swapped, slots) != base  # K and V are not interchangeable


def test_the_frame_round_trips_and_a_malformed_one_is_refused():
    digest = bytes(range(16))
    assert split_kv_digest([b"1", b"4", b"0", digest_frame(digest)]) == ([b"1", b"4", b"0"], digest)
    assert split_kv_digest([b"1", b"4", b"0"]) == ([b"1", b"4", b"0"], None)
    with pytest.raises(FrameError, match="15 digest bytes"):
        split_kv_digest([b"1", digest_frame(digest)[:-1]])


def test_prefill_hands_each_rooms_digest_to_one_status_and_decode_checks_it_once():
    sent, received = SentKvDigests(), ReceivedKvDigests()
    sent.put(7, b"a" * 16)
    frame = sent.frame_for(7)
    assert frame == digest_frame(b"a" * 16) and sent.frame_for(7) is None  # consumed by the status
    received.record(7, split_kv_digest([b"7", frame])[1])
    assert received.check(7, b"a" * 16, 40).problem is None
    missing = received.check(7, b"a" * 16, 40)  # consumed: a second check finds none
    assert missing.missing and "no KV digest arrived for room 7" in missing.problem
    received.record(8, b"a" * 16)
    bad = received.check(8, b"b" * 16, 40)
    assert not bad.missing and "KV digest mismatch for room 8" in bad.problem
    assert received.snapshot() == {"num_recorded": 2, "num_matched": 1, "num_mismatched": 1, "num_missing": 1,
                                   "num_held": 0}


def _decode_gate(backend: str, received):
    limits = FrameLimits(backend, Side.DECODE, 16, 64, 1 << 20, aux_item_lens=(32,), aux_slots=(8,))
    return HandshakeGate(limits, Host(), None, None, None, receiver=RECV, kv_digests=received)


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_decodes_gate_takes_the_digest_off_a_status_and_records_it_when_on(backend):
    t = Templates(backend, PEER)
    digest = bytes(range(16))
    status = t.status(9, 4)
    received = ReceivedKvDigests()
    on = _decode_gate(backend, received)
    assert on.admit(status + [digest_frame(digest)], "p") == status  # SGLang sees the status as sent
    assert received.check(9, digest, 1).problem is None
    off = _decode_gate(backend, None)  # digests off here: the frame is still taken off, nothing recorded
    assert off.admit(status + [digest_frame(digest)], "p") == status
    assert off.admit(status + [digest_frame(digest)[:-1]], "p") is None  # unreadable frame: refused


def test_a_digest_frame_on_any_other_message_is_refused():
    host = Host()
    g = gate(host, side=Side.DECODE, kv_digests=ReceivedKvDigests())
    host.rooms.add(3)
    assert g.admit(Templates("mooncake", PEER).abort_ack(3) + [digest_frame(bytes(16))], "p") is None
    assert g.snapshot()["rejected"] == {"abort_ack": 1}
