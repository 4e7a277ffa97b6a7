"""Issue 16's messages, each a regression test: none stops a PD server; a bad transfer info fails only its room.

Pushed over ZMQ to the prefill rank socket, exactly where a broken or hostile decode peer writes. On
the authenticated deployments (pd_page16, pd_nixl) every message is signed with the deployment's
secret, so it is the frame checks behind authentication that refuse it (a trusted peer gone wrong);
on pd_page1 (no secret) they are the only defence.
"""

import concurrent.futures as cf
import random
import time

import pytest

from sglang_pd.harness import PDDeployment
from sglang_pd.harness.deployment_requests import new_bootstrap_room
from sglang_pd.harness.hostile_peer import (PeerIdentity, PeerSocket, Templates, TransferPeer, assert_threads_alive,
                                            handshake_view, random_frames, rank_endpoint, wait_received)
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.auth import PeerAuth

pytestmark = pytest.mark.integration


@pytest.fixture(params=["pd_page1", "pd_page16", "pd_nixl"])
def dep(request) -> PDDeployment:
    return request.getfixturevalue(request.param)


def auth_of(dep: PDDeployment) -> PeerAuth | None:
    """A peer holding the deployment's secret (None when the deployment has none)."""
    path = dep.env.get("SGLANG_PD_PEER_SECRET_FILE")
    return PeerAuth.from_file(path) if path else None


def backend_of(dep: PDDeployment) -> str:
    return "nixl" if dep.config.transfer_backend == "nixl" else "mooncake"


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(40)]


def assert_still_serving(dep: PDDeployment, plain_url: str, seed: int) -> None:
    """Threads alive on both sides, one PD request equal to the plain server's, nothing left held."""
    assert_threads_alive(handshake_view(dep, dep.prefill), "prefill")
    assert_threads_alive(handshake_view(dep, dep.decodes[0]), "decode")
    prompt = _prompt(seed)
    assert dep.generate_pd(prompt, 8)[1]["output_ids"] == dep.generate(plain_url, prompt, 8)["output_ids"]
    dep.wait_clean()


def test_issue_messages_leave_prefill_serving(dep: PDDeployment, plain_url: str):
    auth, backend = auth_of(dep), backend_of(dep)
    t = Templates(backend)
    guard = [b"NixlMsgGuard"] if backend == "nixl" else []
    registration = t.registration([4096], 2048)
    at = len(guard)
    rng = random.Random(16)
    messages = {
        "one frame None": [b"None"],
        "WATERMARK": [b"WATERMARK"],
        "registration, non-numeric port": registration[:at + 2] + [b"port"] + registration[at + 3:],
        "non-ASCII room": guard + [b"\xff\xfe\x00"] + t.transfer_info(5, [1])[at + 1:],
        **{f"random {i}": random_frames(rng) for i in range(40)},
    }
    endpoint = rank_endpoint(dep, dep.prefill)
    before = handshake_view(dep, dep.prefill)["gate"]
    with PeerSocket(endpoint) as peer:
        for frames in messages.values():
            peer.send(frames, auth)
    with PeerSocket(endpoint) as peer:  # its own connection: libzmq drops the peer that sends it
        peer.send([random.Random(64).randbytes(64 << 20)], auth)
    view = wait_received(dep, dep.prefill, before["num_received"] + len(messages))
    time.sleep(1.0)
    gate = handshake_view(dep, dep.prefill)["gate"]
    assert gate["num_received"] == before["num_received"] + len(messages), "the 64 MiB frame reached the gate"
    assert sum(gate["rejected"].values()) - sum(before["rejected"].values()) == len(messages), gate
    assert gate["auth_refused"] == before["auth_refused"]  # signed (or no auth): refused by the frame checks
    assert view["gate"]["num_admitted"] == before["num_admitted"]
    assert_still_serving(dep, plain_url, seed=1)


def _bad_transfer_infos(backend: str, room: int, peer: PeerIdentity, page_size: int) -> dict:
    """name -> (transfer info for `room` from the registered `peer`, what the refusal must say)."""
    t = Templates(backend, peer)
    good = t.transfer_info(room, [1, 2, 3], decode_prefix_len=16)
    at = 1 if backend == "nixl" else 0
    prefix_at = at + 8

    def with_frame(i, value):
        return good[:i] + [value] + good[i + 1:]

    bad_name, name_reason = ((b"no-colon", "no ':<port>'") if backend == "mooncake"
                             else (b"agent with spaces", "not a plain identifier"))
    # Checked per request by prefix_len.check_for_prompt at finalize_bootstrap (it knows the prompt): past the
    # page grid on page 16, past the 40-token prompt on page 1 (every length is aligned to page size 1).
    per_request = ((b"17", "not aligned to page size 16") if page_size == 16
                   else (b"48", "exceeds the prompt length 40"))
    stranger = Templates(backend, PeerIdentity("127.0.0.1", 7, "127.0.0.1:7")).transfer_info(room, [1, 2, 3])
    return {
        "peer name upstream cannot parse": (with_frame(at + 3, bad_name), name_reason),
        "peer that never registered": (stranger, "never registered"),
        "truncated": (good[:at + 5], "5 frames"),
        "torn kv indices": (with_frame(at + 4, b"\x01\x02\x03"), "not a multiple of 4"),
        "non-ASCII decode_prefix_len": (with_frame(prefix_at, "十六".encode()), "is not an integer"),
        "negative decode_prefix_len": (with_frame(prefix_at, b"-16"), "decode_prefix_len -16 is outside"),
        "decode_prefix_len off the page grid or past the prompt": (with_frame(prefix_at, per_request[0]),
                                                                    per_request[1]),
        "over-long decode_prefix_len": (with_frame(prefix_at, b"99999999"), "decode_prefix_len 99999999 is outside"),
        "random bytes after the room": (good[:at + 1] + [random.Random(room).randbytes(9) for _ in range(8)],
                                        "endpoint"),
    }


def _waiting_rooms(dep: PDDeployment) -> list[int]:
    return handshake_view(dep, dep.prefill)["rooms"]["by_status"].get("1", [])  # KVPoll.Bootstrapping


def _registered_peer(dep: PDDeployment, backend: str, peer_socket: PeerSocket, auth) -> TransferPeer:
    """Register a peer that is not the real decode (a real transfer endpoint: NIXL must load its agent
    metadata), so each bad shape below is refused for its own reason."""
    peer = TransferPeer(backend, handshake_view(dep, dep.prefill)["pool"], 4, "bad-frames")
    peer_socket.send(peer.registration(), auth)
    deadline = time.monotonic() + 30
    while peer.identity.name not in handshake_view(dep, dep.prefill)["rooms"]["registered_peers"]:
        assert time.monotonic() < deadline, "the test peer did not register"
        time.sleep(0.1)
    return peer


def test_bad_transfer_info_fails_only_its_room(dep: PDDeployment, plain_url: str):
    auth, backend = auth_of(dep), backend_of(dep)
    rng = random.Random(7)
    with cf.ThreadPoolExecutor(1) as pool, PeerSocket(rank_endpoint(dep, dep.prefill)) as peer_socket:
        peer = _registered_peer(dep, backend, peer_socket, auth)
        try:
            for i, name in enumerate(_bad_transfer_infos(backend, 0, peer.identity, dep.config.page_size)):
                room = new_bootstrap_room(rng)
                frames, reason = _bad_transfer_infos(backend, room, peer.identity, dep.config.page_size)[name]
                waiting = pool.submit(dep.post_generate, dep.prefill.url, _prompt(100 + i), 8, 120,
                                      **dep.pairing(room))
                deadline = time.monotonic() + 30
                while room not in _waiting_rooms(dep):
                    assert time.monotonic() < deadline and not waiting.done(), f"room {room} never waited ({name})"
                    time.sleep(0.1)
                peer_socket.send(frames, auth)
                resp = waiting.result(timeout=60)
                assert resp.status_code >= 400 and str(room) in resp.text and reason in resp.text, (name, resp.text)
            assert peer.bytes_received() == 0
        finally:
            peer.close()
    assert_still_serving(dep, plain_url, seed=2)
