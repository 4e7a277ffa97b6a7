"""Transfer-info frame checks against messages built by SGLang's own decode-side builders' layout."""

import numpy as np
import pytest

from sglang_pd.srt.disaggregation.transfer_info_guard import MOONCAKE, NIXL, check_frames

pytestmark = pytest.mark.unit


def _mooncake(room=b"42", kv=None, aux=b"3", required=b"1", prefix=b"16"):
    kv = np.array([5, 6, 7], dtype=np.int32).tobytes() if kv is None else kv
    return [room, b"127.0.0.1", b"5000", b"session", kv, aux, b"", required, prefix, b""]


def _nixl(**kw):
    m = _mooncake(**kw)
    # nixl: required at 6, state at 7; guard frame first
    return [b"NixlMsgGuard", m[0], m[1], m[2], b"agent", m[4], m[5], m[7], m[6], m[8], b"0"]


def test_well_formed_and_control_messages_pass():
    assert check_frames(_mooncake(), MOONCAKE) == (None, 42)
    assert check_frames(_nixl(), NIXL) == (None, 42)
    assert check_frames(_mooncake(prefix=b""), MOONCAKE).reason is None  # no decode radix cache
    assert check_frames([b"None", b"x"], MOONCAKE) == (None, None)        # peer registration
    assert check_frames([b"NixlMsgGuard", b"None"], NIXL) == (None, None)


@pytest.mark.parametrize("kw,needle", [
    ({"prefix": b"abc"}, "decode_prefix_len b'abc' is not an integer"),
    ({"prefix": b"-16"}, "decode_prefix_len -16 is below 0"),
    ({"kv": b"\x01\x02\x03\x04\x05"}, "5 bytes, not a multiple of 4"),
    ({"aux": b"x"}, "aux index b'x' is not an integer"),
    ({"required": b"0"}, "required_dst_info_num 0 is below 1"),
])
def test_malformed_frames_name_the_problem_and_the_room(kw, needle):
    for layout, build in ((MOONCAKE, _mooncake), (NIXL, _nixl)):
        verdict = check_frames(build(**kw), layout)
        assert verdict.room == 42 and needle in verdict.reason, (layout.backend, verdict)


def test_unreadable_rooms_and_foreign_traffic():
    assert check_frames([b"room-x"] + _mooncake()[1:], MOONCAKE) == (
        "mooncake: room 'room-x' is not a number", None)
    assert "foreign traffic" in check_frames(_mooncake(), NIXL).reason
    assert "has 3 frames" in check_frames([b"7", b"a", b"b"], MOONCAKE).reason
    assert check_frames([], MOONCAKE).reason == "mooncake: empty message"
