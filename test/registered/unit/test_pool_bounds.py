"""A transfer info's destination indices are held to the pools its decode registered (pool_bounds.py).

SGLang 0.5.23's prefill writes a room's KV to `dst_kv_ptrs[i] + page * item_len` and its aux data to
`dst_aux_ptrs[i] + aux_index * aux_item_len`; the mooncake registration carries no buffer lengths (NIXL's
carries the KV page count, not the aux buffers' size), so an index past the pool made prefill write
outside it. Here SGLang's own registration builder (with our hook after it) writes decode's registration,
the real gate takes its bounds frame off, and SGLang's own prefill bootstrap thread (unmodified, as in
test_bootstrap_clear_race) reads the guarded socket a PUSH socket on 127.0.0.1 feeds with transfer infos.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from test_bootstrap_clear_race import NEXT_ROOM, PEER, ROOM, Prefill
from test_handshake_frames import _mooncake_self, _nixl_self

from sglang_pd.harness.hostile_peer import Templates
from sglang_pd.srt.disaggregation.frame_fields import FrameError
from sglang_pd.srt.disaggregation.handshake_frames import FrameLimits, Side
from sglang_pd.srt.disaggregation.handshake_gate import HandshakeGate, PeerRecord
from sglang_pd.srt.disaggregation.pool_bounds import MARKER, PoolBounds, bounds_frame, bounds_of, split_bounds
from sglang_pd.srt.hooks import common_conn

pytestmark = pytest.mark.unit

PAGES, AUX_SLOTS, ITEM, AUX_ITEM = 64, 8, 2048, 32


def decode_registration(backend: str) -> list[bytes]:
    """What a decode with sglang_pd sends: SGLang's own builder, then the hook table's AFTER row."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.disaggregation.nixl.conn import NixlKVManager

    cls, me = (MooncakeKVManager, _mooncake_self()) if backend == "mooncake" else (NixlKVManager, _nixl_self())
    me.kv_args.kv_data_lens, me.kv_args.kv_item_lens = [ITEM * PAGES] * 2, [ITEM] * 2
    me.kv_args.aux_data_lens, me.kv_args.aux_item_lens = [AUX_ITEM * AUX_SLOTS], [AUX_ITEM]
    if backend == "nixl":
        me.agent.name = PEER.name  # the peer Prefill's table registered
    return common_conn.after_build_receiver_registration_message(cls.build_receiver_registration_message(me), me)


def _wait(predicate, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_indices_beyond_the_registered_pool_are_refused_before_sglang_computes_an_address(backend):
    from sglang.srt.disaggregation.base.conn import KVPoll

    prefill = Prefill(backend, guarded=True)
    try:
        mgr, gate = prefill.mgr, prefill.sock.gate
        told = []
        mgr.failure_lock = __import__("threading").Lock()
        mgr.send_kv_status_message = lambda targets, bootstrap_room, status, failure_reason=None: told.append(
            (tuple(targets), bootstrap_room, status, failure_reason))
        gate.host.claimed.add(NEXT_ROOM)  # a local request waits on it (its sender exists)
        registration = decode_registration(backend)
        assert split_bounds(registration)[1] == PoolBounds(PAGES, AUX_SLOTS)
        # the reader idles in recv; the registration goes through the gate the way the reader takes it
        body = gate.admit(registration, "127.0.0.1")
        assert body == registration[:-1]  # SGLang's parser never sees our frame
        t = prefill.templates

        # in range (the last page and the last aux slot): admitted, parsed and held by SGLang's own thread
        prefill.push.send_multipart(t.transfer_info(ROOM, [0, PAGES - 1], aux_index=AUX_SLOTS - 1))
        _wait(lambda: PEER.name in mgr.transfer_infos.get(ROOM, {}), "SGLang's thread never held the info")
        info = mgr.transfer_infos[ROOM][PEER.name]
        assert list(info.dst_kv_indices) == [0, PAGES - 1] and info.dst_aux_index == AUX_SLOTS - 1

        # a page index equal to the page count: refused, counted, the room failed and its decode told
        prefill.push.send_multipart(t.transfer_info(NEXT_ROOM, [1, PAGES], aux_index=0))
        _wait(lambda: gate.counts.num_out_of_pool == 1, "the out-of-pool page was not refused")
        assert NEXT_ROOM not in mgr.transfer_infos  # SGLang never parsed it
        assert mgr.request_status[NEXT_ROOM] == KVPoll.Failed
        reason = mgr.failure_records[NEXT_ROOM]
        assert f"kv page indices names {PAGES}, outside the {PAGES} pages" in reason and PEER.name in reason
        assert told == [(((PEER.ip, PEER.port),), NEXT_ROOM, KVPoll.Failed, reason)]

        # an aux index equal to the slot count (the pages in range): refused the same way
        prefill.push.send_multipart(t.transfer_info(9, [1, 2], aux_index=AUX_SLOTS))
        _wait(lambda: gate.counts.num_out_of_pool == 2, "the out-of-pool aux index was not refused")
        assert 9 not in mgr.transfer_infos and told[-1][1] == 9
        assert f"aux index names {AUX_SLOTS}, outside the {AUX_SLOTS} slots of its aux buffers" in told[-1][3]
        view = gate.snapshot()
        assert view["rejected"] == {"transfer_info": 2} and view["num_out_of_pool"] == 2
        assert view["peers"]["127.0.0.1"]["dropped"] == 2  # one peer: logged once, counted twice
        assert prefill.thread.is_alive()
    finally:
        prefill.close()


class Host:
    """Just the registered-peer table the transfer-info state check reads."""

    def __init__(self, record):
        self.record = record

    def registered_peer(self, name):
        return self.record if name == PEER.name else None

    def num_registered(self):
        return 1

    def endpoint_registered(self, target):
        return tuple(target) == (PEER.ip, PEER.port)

    def room_claimed(self, room):
        return False

    def fail_room(self, room, reason, notify):
        return False


def test_a_registration_without_bounds_clears_them_and_our_frame_elsewhere_is_refused():
    counted = {}
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 128, 1 << 20)
    g = HandshakeGate(lim, Host(PeerRecord(PEER.ip, PEER.port)), None, None, None,
                      on_count=lambda name, n: counted.__setitem__(name, counted.get(name, 0) + n))
    t = Templates("mooncake", PEER)
    assert g.admit(t.registration([4096], ITEM) + [bounds_frame(PoolBounds(4, 2))], "p") is not None
    assert g.admit(t.transfer_info(1, [4]), "p") is None and counted["transfer_infos_out_of_pool_total"] == 1
    assert g.admit(t.transfer_info(2, [3], aux_index=2), "p") is None
    assert g.admit(t.transfer_info(3, [3], aux_index=1), "p") is not None
    assert g.admit(t.registration([4096], ITEM), "p") is not None  # a decode without sglang_pd: no bounds now
    assert g.admit(t.transfer_info(4, [100], aux_index=7), "p") is not None  # served as upstream would
    assert g.admit(t.transfer_info(5, [1]) + [bounds_frame(PoolBounds(4, 2))], "p") is None
    assert "pool bounds frame ends a transfer_info" in g.snapshot()["peers"]["p"]["last"]
    assert g.admit(t.registration([4096], ITEM) + [MARKER + b"4"], "p") is None  # ours, unreadable
    assert g.counts.num_out_of_pool == 2


def test_nixl_page_count_and_our_frame_the_smaller_applies():
    lim = FrameLimits("nixl", Side.PREFILL, 16, 128, 1 << 20)
    g = HandshakeGate(lim, Host(PeerRecord(PEER.ip, PEER.port, num_slots=32)), None, None, None)
    t = Templates("nixl", PEER)
    assert g.admit(t.transfer_info(1, [32]), "p") is None  # SGLang's own count, no frame of ours
    assert g.admit(t.registration([4096], ITEM, num_slots=32) + [bounds_frame(PoolBounds(16, 0))], "p")
    assert g.admit(t.transfer_info(2, [16], aux_index=1000), "p") is None  # aux 0 slots: unknown, not checked
    assert g.admit(t.transfer_info(3, [15], aux_index=1000), "p") is not None


def test_bounds_of_skips_empty_entries_and_the_frame_round_trips():
    kv_args = SimpleNamespace(kv_data_lens=[ITEM * 10, 0, ITEM * 12], kv_item_lens=[ITEM, ITEM, ITEM],
                              aux_data_lens=[AUX_ITEM * 5, 64], aux_item_lens=[AUX_ITEM, 0])
    bounds = bounds_of(kv_args)
    assert bounds == PoolBounds(10, 5)  # the elided (0-length) entry moves no bytes; the shortest buffer bounds
    assert split_bounds([b"a", bounds_frame(bounds)]) == ([b"a"], bounds)
    assert split_bounds([b"a", b"b"]) == ([b"a", b"b"], None)
    for bad in (b"", b"1", b"-1,2", b"1,2,3", b"1e3,2"):
        with pytest.raises(FrameError, match="pool bounds frame"):
            split_bounds([MARKER + bad])
