"""srt/wire - what a PD rank-socket message is, frame by frame.

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.wire.catalogue import (
    AUTH_TRAILER, KV_DIGEST, MAX_FRAMES, MessageKind, NIXL_GUARD, POOL_BOUNDS, PROMPT_DIGEST, appended_frames,
    max_appended, side_appends)
from sglang_pd.srt.wire.fields import FrameError, FrameLimits, MAX_ROOM, Side
from sglang_pd.srt.wire.frames import check_message
from sglang_pd.srt.wire.kv_digest import KvCheck, ReceivedKvDigests, SentKvDigests, kv_digest, split_kv_digest
from sglang_pd.srt.wire.pool_bounds import (
    PoolBounds, beyond_state_pools, bounds_frame, bounds_of, split_bounds, state_slots)
from sglang_pd.srt.wire.prompt_binding import OutgoingDigests, PromptDigests, split_digest
from sglang_pd.srt.wire.room_decline import DeclineError, DeclineNotice, RoomDeclineTable, decline_frames, parse_decline
from sglang_pd.srt.wire.verdict import Verdict

__all__ = [
    "AUTH_TRAILER", "KV_DIGEST", "KvCheck", "ReceivedKvDigests", "SentKvDigests", "kv_digest", "split_kv_digest",
    "DeclineError", "DeclineNotice", "FrameError", "FrameLimits", "MAX_FRAMES", "MAX_ROOM",
    "MessageKind", "NIXL_GUARD", "OutgoingDigests", "POOL_BOUNDS", "PROMPT_DIGEST", "PoolBounds", "PromptDigests",
    "RoomDeclineTable", "Side", "Verdict", "appended_frames", "beyond_state_pools", "bounds_frame", "bounds_of",
    "check_message", "decline_frames", "max_appended", "parse_decline", "side_appends", "split_bounds",
    "split_digest", "state_slots"]
