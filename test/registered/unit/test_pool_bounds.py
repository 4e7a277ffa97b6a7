"""A transfer info's destination indices are held to the pools its decode registered (pool_bounds.py).

SGLang 0.5.23's prefill writes a room's KV to `dst_kv_ptrs[i] + page * item_len`, its aux data to
`dst_aux_ptrs[i] + aux_index * aux_item_len` and a hybrid model's state (mamba, SWA, ...) to
`dst_state_ptr + index * item_len` per state type; the mooncake registration carries no buffer lengths
(NIXL's carries the KV page count and, from newer decodes, the state buffers' lengths, not the aux
buffers' size), so an index past the pool made prefill write outside it. Here SGLang's own registration
builder (with our hook after it) writes decode's registration and SGLang's own metadata builder its transfer
infos, the real gate takes the bounds frame off, and SGLang's own prefill bootstrap thread (unmodified, as
in test_bootstrap_clear_race) reads the guarded socket a PUSH socket on 127.0.0.1 feeds with transfer infos.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from test_bootstrap_clear_race import NEXT_ROOM, PEER, ROOM, Prefill
from test_handshake_frames import _mooncake_self, _nixl_self

from sglang_pd.harness.hostile_peer import Templates
from sglang_pd.srt.wire import FrameError, FrameLimits, Side
from sglang_pd.srt.handshake import HandshakeGate
from sglang_pd.srt.handshake import PeerRecord
from sglang_pd.srt.wire.pool_bounds import (BOUNDS_MARKER, MAX_STATE_TYPES, PoolBounds, bounds_frame, bounds_of,
                                                       split_bounds)
from sglang_pd.srt.hooks.connection import common_conn

pytestmark = pytest.mark.unit

PAGES, AUX_SLOTS, ITEM, AUX_ITEM = 64, 8, 2048, 32
# A hybrid decode's state pools, in its state order: a mamba pool (conv and temporal buffers) of 5 slots and
# an SWA pool of 32 pages.
STATE_TYPES = ("mamba", "swa")
MAMBA_SLOTS, SWA_PAGES, MAMBA_ITEM, SWA_ITEM = 5, 32, 96, 512
STATE = SimpleNamespace(state_data_ptrs=[[1 << 20, 2 << 20], [3 << 20]], state_layer_ids=[[0, 0], [1]],
                        state_item_lens=[[MAMBA_ITEM, MAMBA_ITEM], [SWA_ITEM]],
                        state_data_lens=[[MAMBA_ITEM * MAMBA_SLOTS] * 2, [SWA_ITEM * SWA_PAGES]])


def decode_side(backend: str, state: SimpleNamespace | None = None):
    """(SGLang's manager class, a decode manager of `backend` as its builders read it), with our PEER's name
    and the pools above (`state`: its state pools; None: it has none)."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.disaggregation.nixl.conn import NixlKVManager

    cls, me = (MooncakeKVManager, _mooncake_self()) if backend == "mooncake" else (NixlKVManager, _nixl_self())
    me.kv_args.kv_data_lens, me.kv_args.kv_item_lens = [ITEM * PAGES] * 2, [ITEM] * 2
    me.kv_args.aux_data_lens, me.kv_args.aux_item_lens = [AUX_ITEM * AUX_SLOTS], [AUX_ITEM]
    me.kv_args.state_data_lens = []
    if state is not None:
        me.kv_args.__dict__.update(vars(state))
    if backend == "nixl":
        me.agent.name = PEER.name  # the peer Prefill's table registered
    return cls, me


def decode_registration(backend: str, state: SimpleNamespace | None = None) -> list[bytes]:
    """What a decode with sglang_pd sends: SGLang's own builder, then the hook table's AFTER row."""
    cls, me = decode_side(backend, state)
    return common_conn.after_build_receiver_registration_message(cls.build_receiver_registration_message(me), me)


def decode_transfer_info(backend: str, room: int, state_indices: list[list[int]]) -> list[bytes]:
    """A transfer info naming KV pages 1 and 2, aux slot 0 and `state_indices`, by SGLang's own builder."""
    cls, me = decode_side(backend)
    return cls.build_receiver_metadata_message(
        me, bootstrap_room=room, required_dst_info_num=1, kv_indices=np.array([1, 2], dtype=np.int32), aux_index=0,
        state_indices=state_indices, decode_prefix_len=0, is_dummy=False)


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
        mgr.failure_lock = threading.Lock()
        mgr.send_kv_status_message = lambda targets, bootstrap_room, status, failure_reason=None: told.append(
            (tuple(targets), bootstrap_room, status, failure_reason))
        gate.host.claimed.add(NEXT_ROOM)  # a local request waits on it (its sender exists)
        registration = decode_registration(backend)
        assert split_bounds(registration)[1] == PoolBounds(PAGES, AUX_SLOTS, ())  # no state pools
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
    assert g.admit(t.registration([4096], ITEM) + [BOUNDS_MARKER + b"4"], "p") is None  # ours, unreadable
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
                              aux_data_lens=[AUX_ITEM * 5, 64], aux_item_lens=[AUX_ITEM, 0],
                              state_data_lens=[], state_item_lens=[])
    bounds = bounds_of(kv_args)
    assert bounds == PoolBounds(10, 5, ())  # the elided (0-length) entry moves no bytes; the shortest buffer bounds
    assert split_bounds([b"a", bounds_frame(bounds)]) == ([b"a"], bounds)
    assert split_bounds([b"a", b"b"]) == ([b"a", b"b"], None)
    for bad in (b"", b"1", b"-1,2", b"1,2,3", b"1e3,2"):
        with pytest.raises(FrameError, match="pool bounds frame"):
            split_bounds([BOUNDS_MARKER + bad])


def test_state_bounds_frame_round_trips_and_the_two_number_frame_still_reads():
    kv_args = SimpleNamespace(kv_data_lens=[ITEM * 10], kv_item_lens=[ITEM], aux_data_lens=[AUX_ITEM * 5],
                              aux_item_lens=[AUX_ITEM],
                              state_data_lens=[[MAMBA_ITEM * 7, 0, MAMBA_ITEM * 9], [SWA_ITEM * 32], [0]],
                              state_item_lens=[[MAMBA_ITEM, MAMBA_ITEM, MAMBA_ITEM], [SWA_ITEM], [64]])
    bounds = bounds_of(kv_args)
    assert bounds == PoolBounds(10, 5, (7, 32, 0))  # per state type the shortest non-empty buffer; 0: no lengths
    assert bounds_frame(bounds) == BOUNDS_MARKER + b"10,5;7,32,0"
    assert split_bounds([b"a", bounds_frame(bounds)]) == ([b"a"], bounds)
    assert split_bounds([bounds_frame(PoolBounds(10, 5, ()))]) == ([], PoolBounds(10, 5, ()))  # no state pools
    # the previous version's frame: state bounds unknown
    assert split_bounds([b"a", BOUNDS_MARKER + b"10,5"]) == ([b"a"], PoolBounds(10, 5, None))
    assert bounds_frame(PoolBounds(10, 5)) == BOUNDS_MARKER + b"10,5"
    most = PoolBounds(1, 2, tuple(range(MAX_STATE_TYPES)))
    assert split_bounds([bounds_frame(most)])[1] == most


def test_malformed_state_bounds_frames_are_refused():
    too_many = b"1,2;" + b",".join([b"3"] * (MAX_STATE_TYPES + 1))
    assert split_bounds([BOUNDS_MARKER + b"1,2;3,0"])[1] == PoolBounds(1, 2, (3, 0))  # the well-formed neighbour
    for bad in (b"1,2;x", b"1,2;1,", b"1,2;,1", b"1,2;-1", b"1,2;1;2", b"1,2;;", b"1,2;1 ", b"1,2;" + b"9" * 13,
                too_many):
        with pytest.raises(FrameError, match="pool bounds frame"):
            split_bounds([BOUNDS_MARKER + bad])
    lim = FrameLimits("mooncake", Side.PREFILL, 16, 128, 1 << 20)
    g = HandshakeGate(lim, Host(PeerRecord(PEER.ip, PEER.port)), None, None, None)
    t = Templates("mooncake", PEER)
    assert g.admit(t.registration([4096], ITEM) + [BOUNDS_MARKER + too_many], "p") is None  # refused at the gate
    assert "pool bounds frame" in g.snapshot()["peers"]["p"]["last"]


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_state_indices_beyond_the_registered_state_pools_are_refused_before_sglang_reads_them(backend):
    from sglang.srt.disaggregation.base.conn import KVPoll

    prefill = Prefill(backend, guarded=True)
    try:
        mgr, gate = prefill.mgr, prefill.sock.gate
        gate.limits = dataclasses.replace(gate.limits, state_types=STATE_TYPES)  # prefill's own, same order
        told = []
        mgr.failure_lock = threading.Lock()
        mgr.send_kv_status_message = lambda targets, bootstrap_room, status, failure_reason=None: told.append(
            (tuple(targets), bootstrap_room, status, failure_reason))
        for room in (NEXT_ROOM, 9, 10):  # local requests wait on them (their senders exist)
            gate.host.claimed.add(room)
            mgr.request_status.setdefault(room, KVPoll.Bootstrapping)
        registration = decode_registration(backend, STATE)
        assert split_bounds(registration)[1] == PoolBounds(PAGES, AUX_SLOTS, (MAMBA_SLOTS, SWA_PAGES))
        assert gate.admit(registration, "127.0.0.1") == registration[:-1]

        # the last mamba slot and the last SWA page: admitted, parsed and held by SGLang's own thread
        prefill.push.send_multipart(decode_transfer_info(backend, ROOM, [[MAMBA_SLOTS - 1], [0, SWA_PAGES - 1]]))
        _wait(lambda: PEER.name in mgr.transfer_infos.get(ROOM, {}), "SGLang's thread never held the info")
        assert [list(x) for x in mgr.transfer_infos[ROOM][PEER.name].dst_state_indices] == [
            [MAMBA_SLOTS - 1], [0, SWA_PAGES - 1]]

        refused = ((NEXT_ROOM, [[MAMBA_SLOTS], [1]], f"state type 0 (mamba) index names {MAMBA_SLOTS}, outside "
                                                     f"the {MAMBA_SLOTS} slots of that state pool"),
                   (9, [[1], [2, SWA_PAGES]], f"state type 1 (swa) index names {SWA_PAGES}, outside the "
                                              f"{SWA_PAGES} slots of that state pool"),
                   (10, [[1], [2], [0]], "state indices name 3 state types, more than the 2 state pools"))
        for n, (room, state_indices, why) in enumerate(refused, start=1):
            prefill.push.send_multipart(decode_transfer_info(backend, room, state_indices))
            _wait(lambda: gate.counts.num_out_of_pool == n, f"room {room}'s state indices were not refused")
            assert room not in mgr.transfer_infos  # SGLang never parsed it
            (targets, told_room, status, reason) = told[-1]
            assert (targets, told_room, status) == (((PEER.ip, PEER.port),), room, KVPoll.Failed)
            assert why in reason and PEER.name in reason and mgr.failure_records[room] == reason
            assert mgr.request_status[room] == KVPoll.Failed
        view = gate.snapshot()
        assert view["rejected"] == {"transfer_info": 3} and view["num_out_of_pool"] == 3
        assert prefill.thread.is_alive()
    finally:
        prefill.close()


def test_nixl_state_lengths_in_its_own_registration_bound_state_indices_without_our_frame():
    """A decode without sglang_pd: NIXL's registration still carries its state buffers' lengths, read by
    SGLang's own parser into the registration table the gate's host reads."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.nixl.conn import KVArgsRegisterInfo

    prefill = Prefill("nixl", guarded=True)
    try:
        mgr, gate = prefill.mgr, prefill.sock.gate
        mgr.failure_lock = threading.Lock()
        mgr.send_kv_status_message = lambda *a, **k: None
        gate.host.claimed.add(NEXT_ROOM)
        upstream = decode_registration("nixl", STATE)[:-1]  # no frame of ours
        mgr.decode_kv_args_table[PEER.name] = KVArgsRegisterInfo.from_zmq(upstream[1:])  # after the guard frame
        assert gate.host.registered_peer(PEER.name).state_slots == (MAMBA_SLOTS, SWA_PAGES)
        assert gate.admit(upstream, "127.0.0.1") == upstream
        prefill.push.send_multipart(decode_transfer_info("nixl", ROOM, [[MAMBA_SLOTS - 1], [SWA_PAGES - 1]]))
        _wait(lambda: PEER.name in mgr.transfer_infos.get(ROOM, {}), "SGLang's thread never held the info")
        prefill.push.send_multipart(decode_transfer_info("nixl", NEXT_ROOM, [[0], [SWA_PAGES]]))
        _wait(lambda: gate.counts.num_out_of_pool == 1, "the out-of-pool SWA page was not refused")
        assert mgr.request_status[NEXT_ROOM] == KVPoll.Failed and NEXT_ROOM not in mgr.transfer_infos
        assert (f"state type 1 (unknown to prefill) index names {SWA_PAGES}, outside the {SWA_PAGES} slots"
                in mgr.failure_records[NEXT_ROOM])
    finally:
        prefill.close()


def test_state_indices_are_read_by_prefills_own_state_types_and_bounded_by_the_smaller_count():
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    def info(room, state_indices):
        return MooncakeKVManager.build_receiver_metadata_message(
            decode_side("mooncake")[1], bootstrap_room=room, required_dst_info_num=1,
            kv_indices=np.array([1], dtype=np.int32), aux_index=0, state_indices=state_indices, decode_prefix_len=0,
            is_dummy=False)

    lim = FrameLimits("mooncake", Side.PREFILL, 16, 128, 1 << 20, state_types=("mamba", "dsa_tail", "swa"))
    g = HandshakeGate(lim, Host(PeerRecord(PEER.ip, PEER.port)), None, None, None)
    t = Templates("mooncake", PEER)
    assert g.admit(t.registration([4096], ITEM) + [bounds_frame(PoolBounds(16, 4, (5, 3, 0)))], "p")
    # a DSA tail list is (row, offset, count, offset, count, ring size): only its row (2 < 3) indexes the pool;
    # the SWA pool reports no lengths (0): not checked
    assert g.admit(info(1, [[4], [2, 10, 6, 0, 0, 16], [999]]), "p") is not None
    assert g.admit(info(2, [[4], [3, 0, 1, 0, 0, 16]]), "p") is None
    assert "state type 1 (dsa_tail) index names 3, outside the 3 slots" in g.snapshot()["peers"]["p"]["last"]
    assert g.admit(info(3, [[5]]), "p") is None
    assert g.admit(info(4, [[0], [], [], []]), "p") is None  # four state types, three pools
    assert g.admit(info(5, [[-1]]), "p") is None  # malformed (the schema), not out of pool
    assert "state indices contains a negative index (-1)" in g.snapshot()["peers"]["p"]["last"]
    assert g.counts.num_out_of_pool == 3
    assert g.admit(info(6, []), "p") is not None  # no state indices named
    # NIXL's own state lengths and our frame: per state type the smaller count applies
    g.host.record = PeerRecord(PEER.ip, PEER.port, state_slots=(8, 3, 6))
    assert g.admit(info(7, [[4], [0, 0, 1, 0, 0, 16], [5]]), "p") is not None
    assert g.admit(info(8, [[4], [0, 0, 1, 0, 0, 16], [6]]), "p") is None
    # a decode with no state pools lists none; the previous version's frame leaves state unchecked
    assert g.admit(t.registration([4096], ITEM) + [bounds_frame(PoolBounds(16, 4, ()))], "p")
    g.host.record = PeerRecord(PEER.ip, PEER.port)
    assert g.admit(info(9, [[0]]), "p") is None
    assert "state indices name 1 state types, more than the 0 state pools" in g.snapshot()["peers"]["p"]["last"]
    assert g.admit(t.registration([4096], ITEM) + [BOUNDS_MARKER + b"16,4"], "p")
    assert g.admit(info(10, [[100], [100], [100], [100]]), "p") is not None
    assert g.counts.num_out_of_pool == 5
