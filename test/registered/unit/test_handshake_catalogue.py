"""The message catalogue (srt/wire/catalogue.py) is what the checks run on, not a description of them.

One well-formed message per catalogue entry (backend x side x kind) passes; the same message is refused by
a catalogue that lacks its entry; the frame counts and the appended frames the gate takes off are the
catalogue's; every entry has a schema and every schema an entry; every frame names a module that exists.
"""

import importlib

import pytest
from test_handshake_frames import NIXL_PEER, PEER, limits, sglang_built, sglang_status
from test_handshake_gate import Host

from sglang_pd.harness.hostile_peer import Templates
from sglang_pd.srt.auth import TRAILER_FRAMES, PeerAuth
from sglang_pd.srt.wire import catalogue as cat
from sglang_pd.srt.wire.catalogue import CATALOGUE, MessageKind
from sglang_pd.srt.wire import Side
from sglang_pd.srt.wire.frames import SCHEMAS, check_message
from sglang_pd.srt.handshake.gate import MAX_MESSAGE_FRAMES, HandshakeGate
from sglang_pd.srt.handshake import PeerRecord
from sglang_pd.srt.wire.prompt_binding import PromptDigests, digest_frame, prompt_digest
from sglang_pd.srt.wire import DeclineNotice, decline_frames

pytestmark = pytest.mark.unit

# Every message a rank socket must accept, written out here (not read from the catalogue): an entry removed
# from the catalogue fails its case below, an entry added without a case fails the last comparison.
_PREFILL = ["decline", "ABORT", "BOOTSTRAP", "WATERMARK", "STAGING_RSP"]
_DECODE = ["ABORT_ACK", "STAGING_REQ", "CHUNK_READY"]
EXPECTED = {
    ("mooncake", Side.PREFILL): _PREFILL + ["mooncake registration", "mooncake transfer info"],
    ("nixl", Side.PREFILL): _PREFILL + ["NIXL registration", "NIXL transfer info"],
    ("mooncake", Side.DECODE): _DECODE + ["AUX_DATA", "transfer status"],
    ("nixl", Side.DECODE): _DECODE + ["NIXL transfer status"],
}
ENTRIES = [(backend, side, name) for (backend, side), names in EXPECTED.items() for name in names]


def sample(backend: str, side: Side, name: str) -> list[bytes]:
    """A well-formed message of catalogue entry `name` (SGLang's own builders where the test can call them)."""
    t = Templates(backend, PEER if backend == "mooncake" else NIXL_PEER)
    built = {
        "ABORT": lambda: t.abort(7, PEER.ip, PEER.port),
        "decline": lambda: decline_frames(DeclineNotice(7, 503, "busy"), PEER.ip, PEER.port),
        "BOOTSTRAP": lambda: [b"BOOTSTRAP", b"7", PEER.ip.encode(), str(PEER.port).encode()],
        "WATERMARK": lambda: [b"WATERMARK", b"3", b"17", b"sess-1"],
        "STAGING_RSP": lambda: [b"STAGING_RSP", b"7", b"0", b"4096", b"1", b"8192", b"sess-1"],
        "STAGING_REQ": lambda: [b"STAGING_REQ", b"7", b"0", b"4", b"sess-1", b"0"],
        "CHUNK_READY": lambda: [b"CHUNK_READY", b"7", b"0", b"0", b"4", b"writer-1", b"0"],
        "mooncake registration": lambda: sglang_built(backend)["registration"],
        "NIXL registration": lambda: sglang_built(backend)["registration"],
        "mooncake transfer info": lambda: sglang_built(backend)["transfer_info"],
        "NIXL transfer info": lambda: sglang_built(backend)["transfer_info"],
        "transfer status": lambda: sglang_status(backend, 7, 4),
        "NIXL transfer status": lambda: sglang_status(backend, 7, 0, "prefill died"),
        "ABORT_ACK": lambda: t.abort_ack(7),
        "AUX_DATA": lambda: t.aux_data(7, 0, 5, b"x" * 32),
    }
    return built[name]()


def spec_of(backend: str, side: Side, name: str) -> cat.MessageSpec:
    return next(s for s in CATALOGUE[(backend, side)] if s.name == name)


def without(backend: str, side: Side, name: str) -> cat.Catalogue:
    """A copy of the catalogue that lacks one entry."""
    copy = dict(CATALOGUE)
    copy[(backend, side)] = tuple(s for s in CATALOGUE[(backend, side)] if s.name != name)
    return copy


@pytest.mark.parametrize("backend,side,name", ENTRIES)
def test_a_catalogued_kind_passes_and_is_refused_once_its_entry_is_removed(backend, side, name):
    msg, lim = sample(backend, side, name), limits(backend, side, staging=True)
    verdict = check_message(msg, lim)
    assert verdict.reason is None and verdict.kind is spec_of(backend, side, name).kind, verdict
    refused = check_message(msg, lim, catalogue=without(backend, side, name))
    assert refused.reason is not None, refused


def test_schemas_and_catalogue_name_the_same_kinds():
    catalogued = {key: [spec.name for spec in specs] for key, specs in CATALOGUE.items()}
    assert {key: sorted(names) for key, names in catalogued.items()} == {k: sorted(v) for k, v in EXPECTED.items()}
    assert {name for _, _, name in ENTRIES} == set(SCHEMAS)


def test_frame_counts_are_the_catalogues():
    msg = sample("mooncake", Side.PREFILL, "BOOTSTRAP") + [b"0"]
    lim = limits("mooncake", Side.PREFILL)
    assert "a BOOTSTRAP has 4" in check_message(msg, lim).reason
    spec = spec_of("mooncake", Side.PREFILL, "BOOTSTRAP")
    longer = spec._replace(frames=spec.frames + (cat.Frame("extra", "tests", optional=True),))
    catalogue = dict(CATALOGUE)
    catalogue[("mooncake", Side.PREFILL)] = tuple(longer if s is spec else s for s in CATALOGUE[("mooncake", Side.PREFILL)])
    assert check_message(msg, lim, catalogue=catalogue).reason is None


def test_staging_messages_pass_only_with_the_staging_buffer_on():
    for side, name in ((Side.PREFILL, "STAGING_RSP"), (Side.DECODE, "CHUNK_READY")):
        msg = sample("mooncake", side, name)
        assert "staging buffer is off" in check_message(msg, limits("mooncake", side)).reason
        assert check_message(msg, limits("mooncake", side, staging=True)).reason is None


def test_another_backends_tag_is_named():
    verdict = check_message(sample("mooncake", Side.DECODE, "AUX_DATA"), limits("nixl", Side.DECODE))
    assert verdict.kind is MessageKind.AUX_DATA and verdict.reason == "AUX_DATA is a mooncake message"


def test_the_gate_takes_off_only_the_appended_frames_the_catalogue_lists(monkeypatch):
    host = Host()
    host.peers[PEER.name] = PeerRecord(PEER.ip, PEER.port)
    lim = limits("mooncake", Side.PREFILL)
    info = Templates("mooncake", PEER).transfer_info(9, [1, 2]) + [digest_frame(prompt_digest([1, 2, 3]))]
    gate = HandshakeGate(lim, host, None, None, None, digests=PromptDigests())
    assert gate.admit(info, "p") == info[:-1]
    key = ("mooncake", Side.PREFILL)
    monkeypatch.setitem(CATALOGUE, key, tuple(s._replace(appended=()) if s.kind is MessageKind.TRANSFER_INFO else s
                                              for s in CATALOGUE[key]))
    gate = HandshakeGate(lim, host, None, None, None, digests=PromptDigests())
    assert gate.admit(info, "p") is None
    assert "a prompt digest frame ends a transfer_info message" in gate.snapshot()["peers"]["p"]["first"]


def test_the_catalogue_is_well_formed():
    for (backend, side), specs in CATALOGUE.items():
        for spec in specs:
            flags = [f.optional for f in spec.frames]
            assert flags == sorted(flags), f"{spec.name}: a required frame after an optional one"
            assert spec.max_frames <= cat.MAX_FRAMES
            assert spec.staging == (spec.kind is MessageKind.STAGING)
            for frame in spec.frames + spec.appended:
                importlib.import_module(frame.module)
    auth = PeerAuth([b"k" * 40])
    assert len(cat.AUTH_TRAILER) == TRAILER_FRAMES == len(auth.sign_frames([b"x"], b"127.0.0.1:5000"))
    for frame in cat.AUTH_TRAILER:
        importlib.import_module(frame.module)
    assert MAX_MESSAGE_FRAMES == cat.MAX_FRAMES + TRAILER_FRAMES + 1  # the unread cap: 38 frames, as before
