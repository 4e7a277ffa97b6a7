"""srt/handshake - the gate in front of SGLang's PD rank sockets, and the rooms around it.

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.handshake.decline_delivery import consume_decline, fail_room_if_known, send_decline
from sglang_pd.srt.handshake.gate import HandshakeGate
from sglang_pd.srt.handshake.gate_host import PeerRecord, PeerRemoval
from sglang_pd.srt.handshake.manager_host import ManagerHost
from sglang_pd.srt.handshake.peer_defenses import PeerGuard, build_peer_guard, start_up_line
from sglang_pd.srt.handshake.prefill_rooms import PrefillRooms
from sglang_pd.srt.handshake.rank_socket import (
    expected_threads, frame_limits, reader_comes_straight_back, unguarded_with_secret, with_dcp_place, zmq_frame_cap)
from sglang_pd.srt.handshake.room_expiry import RoomTombstones, UnclaimedRooms
from sglang_pd.srt.handshake.sockets import Between, GuardedSocket, HeldRooms, SigningSocket

__all__ = [
    "Between", "GuardedSocket", "HandshakeGate", "HeldRooms", "ManagerHost", "PeerGuard", "PeerRecord",
    "PeerRemoval", "PrefillRooms", "RoomTombstones", "SigningSocket", "UnclaimedRooms", "build_peer_guard",
    "consume_decline", "expected_threads", "fail_room_if_known", "frame_limits", "reader_comes_straight_back",
    "send_decline", "start_up_line", "unguarded_with_secret", "with_dcp_place", "zmq_frame_cap"]
