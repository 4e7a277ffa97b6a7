"""Handshake schemas against SGLang's own builders and parsers.

Oracles: messages built by SGLang 0.5.23's own builder methods must pass; every message the checks
admit must go through SGLang's own parsers (and, for AUX_DATA, its memory write) without raising or
writing outside the slot, over thousands of mutated and random messages per backend and side.
"""

import random
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from sglang_pd.harness.hostile_peer import MUTATIONS, PeerIdentity, Templates, mutate, random_frames
from sglang_pd.srt.wire import MessageKind
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.wire import check_message

pytestmark = pytest.mark.unit

PEER = PeerIdentity("127.0.0.1", 40001, "127.0.0.1:16001")
NIXL_PEER = PeerIdentity("127.0.0.1", 40001, "0b6e1c7e-agent")
PAGES, PAGE = 64, 16


def limits(backend: str, side: Side, **kw) -> FrameLimits:
    return FrameLimits(backend, side, PAGE, PAGES, 1 << 20, aux_item_lens=(32,), aux_slots=(8,), **kw)


def _mooncake_self():
    kv_args = SimpleNamespace(kv_data_ptrs=[4096, 8192], aux_data_ptrs=[12288], state_data_ptrs=[],
                              state_item_lens=[], state_layer_ids=[], kv_layer_ids=[0, 0], engine_rank=0,
                              kv_item_lens=[2048, 2048], state_dim_per_tensor=[])
    return SimpleNamespace(kv_args=kv_args, local_ip=PEER.ip, rank_port=PEER.port, attn_tp_size=1, dcp_size=1,
                           dcp_rank=0, enable_staging=False, get_session_id=lambda: PEER.name)


def _nixl_self():
    kv_args = SimpleNamespace(kv_data_ptrs=[4096, 8192], kv_data_lens=[2048 * 65] * 2, kv_item_lens=[2048, 2048],
                              kv_data_mem_kinds=["DRAM", "DRAM"], kv_layer_ids=[], aux_data_ptrs=[12288],
                              state_data_ptrs=[], state_item_lens=[], state_data_lens=[], state_layer_ids=[],
                              gpu_id=0, engine_rank=0)
    agent = SimpleNamespace(name=NIXL_PEER.name, get_agent_metadata=lambda: b"\x01metadata-blob")
    return SimpleNamespace(kv_args=kv_args, agent=agent, local_ip=NIXL_PEER.ip, rank_port=NIXL_PEER.port,
                           attn_tp_size=1, dcp_size=1, dcp_rank=0, enable_staging=False)


def sglang_built(backend: str) -> dict[str, list[bytes]]:
    """Registration and transfer info written by SGLang's own builders."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.disaggregation.nixl.conn import NixlKVManager

    cls, me = (MooncakeKVManager, _mooncake_self()) if backend == "mooncake" else (NixlKVManager, _nixl_self())
    info = cls.build_receiver_metadata_message(
        me, bootstrap_room=42, required_dst_info_num=1, kv_indices=np.array([5, 6, 7], dtype=np.int32),
        aux_index=3, state_indices=None, decode_prefix_len=16, is_dummy=False)
    return {"registration": cls.build_receiver_registration_message(me), "transfer_info": info}


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_sglang_built_messages_pass_and_templates_match_them(backend):
    built = sglang_built(backend)
    for kind, msg in built.items():
        verdict = check_message(msg, limits(backend, Side.PREFILL))
        assert verdict.reason is None and verdict.kind.value == kind, verdict
    peer = PEER if backend == "mooncake" else NIXL_PEER
    ours = Templates(backend, peer).transfer_info(42, [5, 6, 7], aux_index=3, decode_prefix_len=16)
    assert ours == built["transfer_info"]
    reg = Templates(backend, peer).registration([4096, 8192], 2048, [12288], num_slots=65,
                                                agent_metadata=b"\x01metadata-blob")
    assert len(reg) == len(built["registration"])
    assert check_message(reg, limits(backend, Side.PREFILL)).reason is None


def sglang_status(backend: str, room: int, status: int, reason: str | None = None) -> list[bytes]:
    """A transfer status written by SGLang's own encoder (NIXL tags it and carries the reason)."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.disaggregation.nixl.conn import NixlKVManager

    cls = MooncakeKVManager if backend == "mooncake" else NixlKVManager
    me = SimpleNamespace(kv_status_msg_tag=cls.kv_status_msg_tag,
                         kv_status_msg_carries_reason=cls.kv_status_msg_carries_reason, _prefill_unique_rank=lambda: 0)
    return CommonKVManager._encode_kv_status_message(me, bootstrap_room=room, status=status, failure_reason=reason)


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_decode_side_messages_pass(backend):
    lim = limits(backend, Side.DECODE)
    t = Templates(backend)
    msgs = [sglang_status(backend, 7, 4), sglang_status(backend, 7, 0, "prefill died"), t.status(7, 4), t.abort_ack(7)]
    msgs += [t.aux_data(7, 0, 5, b"x" * 32)] if backend == "mooncake" else []
    for msg in msgs:
        assert check_message(msg, lim).reason is None, msg
    assert sglang_status(backend, 7, 4) == t.status(7, 4)
    assert check_message(t.status(7, 4), lim).kind is MessageKind.STATUS


ISSUE_MESSAGES = {  # the shapes issue 16 found killing prefill's bootstrap thread, and why we refuse them
    "one frame None": ([b"None"], "registration has 10..20"),
    "WATERMARK": ([b"WATERMARK"], "staging buffer is off"),
    "non-numeric port": (Templates("mooncake", PEER).registration([1], 8)[:2] + [b"port"]
                         + Templates("mooncake", PEER).registration([1], 8)[3:], "port b'port' is not an integer"),
    "non-ASCII room": ([b"\xff\xfe"] + Templates("mooncake", PEER).transfer_info(1, [1])[1:], "is not a non-negative"),
    "session without ':'": (Templates("mooncake", PeerIdentity(name="nocolon")).transfer_info(9, [1]), "no ':<port>'"),
}


@pytest.mark.parametrize("name", sorted(ISSUE_MESSAGES))
def test_issue_messages_are_refused_with_a_reason(name):
    msg, needle = ISSUE_MESSAGES[name]
    verdict = check_message(msg, limits("mooncake", Side.PREFILL))
    assert verdict.reason and needle in verdict.reason, verdict
    if name == "session without ':'":
        assert verdict.room == 9  # readable: this room fails, the scheduler never splits the session


@pytest.mark.parametrize("frames,needle", [
    ({"decode_prefix_len": -16}, "decode_prefix_len -16 is outside"),
    ({"decode_prefix_len": PAGES * PAGE + PAGE}, "outside"),
    ({"kv_indices": list(range(PAGES + 1))}, "more than the 64 this pool can address"),
    ({"kv_indices": [-1]}, "negative index"),
    ({"required": 0}, "required_dst_info_num 0 is outside"),
])
@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_out_of_bounds_transfer_info_names_its_room(backend, frames, needle):
    args = {"kv_indices": [1, 2], "decode_prefix_len": 16, **frames}
    msg = Templates(backend, PEER if backend == "mooncake" else NIXL_PEER).transfer_info(
        77, args["kv_indices"], decode_prefix_len=args["decode_prefix_len"], required=frames.get("required", 1))
    verdict = check_message(msg, limits(backend, Side.PREFILL))
    assert verdict.room == 77 and needle in verdict.reason, verdict


def test_aux_data_bounds_and_foreign_nixl_traffic():
    lim = limits("mooncake", Side.DECODE)
    assert "outside [0, 7]" in check_message(Templates.aux_data(7, 0, 8, b"x"), lim).reason
    assert "overflow the 32-byte aux slot" in check_message(Templates.aux_data(7, 0, 1, b"x" * 33), lim).reason
    assert "outside [0, 0]" in check_message(Templates.aux_data(7, 1, 1, b"x"), lim).reason
    assert "foreign traffic" in check_message(Templates("mooncake", PEER).transfer_info(1, [1]),
                                              limits("nixl", Side.PREFILL)).reason
    assert check_message([b"1", b"9", b"0"], lim).reason  # status value outside KVPoll
    assert "not a NIXL decode message" in check_message([b"1", b"4", b"0"], limits("nixl", Side.DECODE)).reason


# ---- oracle: what the checks admit, SGLang's readers parse -----------------------------------------------
def _prefill_self(lim: FrameLimits, mla: bool = False, kv_item_lens=(2048, 2048)):
    """The attributes SGLang's registration reader uses of its own manager (DCP place, KV geometry)."""
    kv_args = SimpleNamespace(page_size=lim.page_size, num_draft_entries=0, kv_item_lens=list(kv_item_lens))
    return SimpleNamespace(dcp_size=lim.dcp_size, dcp_rank=lim.dcp_rank, is_mla_backend=mla,
                           is_hybrid_mla_backend=False, kv_args=kv_args)


def register_like_prefill(info, backend: str, me) -> None:
    """What prefill's bootstrap thread does with a parsed registration before storing it (SGLang's code):
    the DCP pairing check, and mooncake's relayout geometry check when a relayout is needed."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager

    if CommonKVManager.requires_dcp_relayout(me, info.dst_dcp_size, info.dst_dcp_rank) and backend == "mooncake":
        num_entries = len(me.kv_args.kv_item_lens)
        CommonKVManager.prepare_dcp_token_item_lens(me, [info.dst_kv_item_len] * num_entries, info.dst_dcp_size)


def parse_like_prefill(msg: list[bytes], backend: str, me=None) -> None:
    """What prefill's bootstrap thread and scheduler do with a message (SGLang's own parsers)."""
    from sglang.srt.disaggregation.common.conn import AbortNotification

    if msg[0] == b"ABORT":
        AbortNotification.from_zmq(msg)
        return
    if backend == "nixl":
        from sglang.srt.disaggregation.nixl.conn import KVArgsRegisterInfo, TransferInfo

        assert msg[0] == b"NixlMsgGuard"
        msg = msg[1:]
    else:
        from sglang.srt.disaggregation.mooncake.conn import KVArgsRegisterInfo, TransferInfo
    room = msg[0].decode("ascii")
    msg[3].decode("ascii")
    if room == "None":
        register_like_prefill(KVArgsRegisterInfo.from_zmq(msg), backend, me)
        return
    int(room)
    info = TransferInfo.from_zmq(msg)
    if backend == "mooncake":
        int(info.mooncake_session_id.rsplit(":", 1)[1])  # add_transfer_request, scheduler thread


def parse_like_decode(msg: list[bytes], aux: np.ndarray, tag: bytes | None = None) -> None:
    """What decode's listener does: status parse, ABORT_ACK parse, AUX_DATA written into a real buffer."""
    from sglang.srt.disaggregation.common.conn import AbortAck, CommonKVManager
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    if msg[0] == b"AUX_DATA":
        kv_args = SimpleNamespace(aux_data_ptrs=[aux.ctypes.data + 64], aux_item_lens=[32])
        MooncakeKVManager._handle_aux_data(SimpleNamespace(kv_args=kv_args), msg)
    elif msg[0] == b"ABORT_ACK":
        AbortAck.from_zmq(msg)
    else:
        parsed = CommonKVManager.parse_kv_status_message(SimpleNamespace(kv_status_msg_tag=tag), msg)
        assert parsed is not None


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_every_admitted_mutation_parses_in_sglang(backend):
    rng = random.Random(16)
    peer = PEER if backend == "mooncake" else NIXL_PEER
    t = Templates(backend, peer)
    seeds = [*sglang_built(backend).values(), t.registration([4096], 2048, [1], num_slots=65),
             t.transfer_info(5, [1, 2, 3], decode_prefix_len=32), t.abort(5), t.abort(5, "127.0.0.1", 9)]
    lim = limits(backend, Side.PREFILL)
    admitted = rejected = 0
    for i in range(3000):
        msg = random_frames(rng) if i % 10 == 0 else mutate(rng.choice(seeds), rng)[1]
        if check_message(msg, lim).reason is None:
            parse_like_prefill(msg, backend, _prefill_self(lim))
            admitted += 1
        else:
            rejected += 1
    assert admitted > 100 and rejected > 1000, (admitted, rejected)


DCP_AT = {"mooncake": 16, "nixl": 22}  # dcp size frame of a registration (NIXL: after its guard frame)


@pytest.mark.parametrize("place", ["dcp1", "dcp2_rank1", "mla_relayout"])
@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_registrations_pairing_a_dcp_sglang_refuses_are_refused(backend, place):
    """Regression (page-16 fuzz): a registration whose DCP rank did not match this rank passed the checks,
    then SGLang's requires_dcp_relayout raised in prefill's bootstrap thread and the thread ended.
    Oracle: SGLang's own DCP pairing (and mooncake's relayout geometry) code on the same values."""
    size, rank = {"dcp1": (1, 0), "dcp2_rank1": (2, 1), "mla_relayout": (1, 0)}[place]
    mla = place == "mla_relayout"
    relayout = (2048 // PAGE, 2048 // PAGE) if mla else None
    lim = limits(backend, Side.PREFILL, dcp_size=size, dcp_rank=rank, dcp_relayout_token_bytes=relayout)
    me = _prefill_self(lim, mla=mla)
    t = Templates(backend, PEER if backend == "mooncake" else NIXL_PEER)
    num_admitted = num_refused = 0
    for item_len in (2048, 4096):
        base = t.registration([4096, 8192], item_len, [12288], num_slots=65)
        for peer_size, peer_rank in [(s, r) for s in (b"", b"1", b"2", b"4") for r in (b"", b"0", b"1", b"3")]:
            msg = list(base)
            msg[DCP_AT[backend]:DCP_AT[backend] + 2] = [peer_size, peer_rank]
            verdict = check_message(msg, lim)
            try:
                parse_like_prefill(list(msg), backend, me)
                sglang_error = None
            except RuntimeError as exc:
                sglang_error = exc
            assert (verdict.reason is None) == (sglang_error is None), (peer_size, peer_rank, verdict, sglang_error)
            num_admitted += verdict.reason is None
            num_refused += verdict.reason is not None
    assert num_admitted and num_refused


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_every_admitted_decode_message_parses_and_stays_in_its_slot(backend):
    rng = random.Random(61)
    aux = np.zeros(64 + 8 * 32 + 64, dtype=np.uint8)  # canaries of 64 bytes either side of 8 slots
    t = Templates(backend)
    seeds = [t.status(3, 4), t.status(3, 0, reason=b"why"), t.abort_ack(3), t.aux_data(3, 0, 7, b"\x07" * 32)]
    lim = limits(backend, Side.DECODE)
    tag = b"KV_STATUS" if backend == "nixl" else None
    admitted = 0
    for i in range(3000):
        if i % 3 == 0:  # well-formed, random values: statuses and aux writes anywhere they may go
            room = rng.randrange(2**63)
            msg = rng.choice([t.status(room, rng.randrange(5), rng.randrange(8)),
                              t.aux_data(room, 0, rng.randrange(8), rng.randbytes(rng.randrange(33)))])
        else:
            msg = random_frames(rng) if i % 10 == 1 else mutate(rng.choice(seeds), rng)[1]
        if check_message(msg, lim).reason is None:
            parse_like_decode(msg, aux, tag)
            admitted += 1
    assert admitted > 500
    assert not aux[:64].any() and not aux[64 + 8 * 32:].any(), "an admitted AUX_DATA wrote outside the aux slots"


def test_mutations_cover_what_the_issue_lists():
    assert {"truncated", "oversized", "non_ascii", "negative", "unaligned", "bytes_flipped"} <= set(MUTATIONS)
    assert struct.calcsize("Q") == 8
