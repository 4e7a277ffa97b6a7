"""Fuzz: >= 2,000 mutated, truncated, oversized and random messages at each rank socket of each backend.

Per deployment (pd_page1: mooncake without a secret; pd_page16: mooncake, authenticated; pd_nixl: NIXL,
authenticated) and per side (prefill's socket, decode's socket): messages derived from well-formed
templates (prefill's include a room decline) by random mutations plus purely random ones, sent fast in rounds of 500. After each round the
test waits until the gate has read every message, then checks (through /sglang_pd/stats) that the PD
threads of both servers are alive. On authenticated deployments 9 in 10 messages are signed with the
deployment's secret (so they reach the frame checks) and 1 in 10 is not (refused by authentication).
Then a normal request: served, output equal to the plain server's, nothing held, /health 200.
"""

import random
from collections import Counter

import pytest
import requests

from sglang_pd.harness import PDDeployment
from sglang_pd.harness.deployment_requests import new_bootstrap_room
from sglang_pd.harness.hostile_peer import (PeerIdentity, PeerSocket, Templates, assert_threads_alive,
                                            handshake_view, mutate, random_frames, rank_endpoint, wait_received)
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.handshake.gate import MAX_MESSAGE_FRAMES
from sglang_pd.srt.auth import TRAILER_FRAMES, PeerAuth
from sglang_pd.srt.wire import DeclineNotice, decline_frames

pytestmark = pytest.mark.integration

NUM_MESSAGES = 2000
ROUND = 500
FUZZ_PEER = PeerIdentity("127.0.0.1", 3, "127.0.0.1:3")


@pytest.fixture(params=["pd_page1", "pd_page16", "pd_nixl"])
def dep(request) -> PDDeployment:
    return request.getfixturevalue(request.param)


def _seeds(backend: str, side: str, rng: random.Random) -> list[list[bytes]]:
    t = Templates(backend, FUZZ_PEER)
    room = new_bootstrap_room(rng)
    if side == "prefill":
        decline = decline_frames(DeclineNotice(new_bootstrap_room(rng), 503, "fuzz"), "127.0.0.1", 3)
        return [t.registration([4096, 8192], 2048, [12288], num_slots=64), t.transfer_info(room, [1, 2, 3]),
                t.transfer_info(room, [], decode_prefix_len=32), t.abort(room), t.abort(room, "127.0.0.1", 3),
                decline]
    seeds = [t.status(room, 4), t.status(room, 0), t.abort_ack(room)]
    return seeds + ([t.aux_data(room, 0, 1, b"\x01" * 16)] if backend == "mooncake" else [])


def _corpus(backend: str, side: str, rng: random.Random) -> list[tuple[str, list[bytes]]]:
    seeds = _seeds(backend, side, rng)
    out = []
    for i in range(NUM_MESSAGES):
        if i % 8 == 0:
            out.append(("random", random_frames(rng)))
        else:
            out.append(mutate(rng.choice(seeds), rng))
    return out


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_fuzz_rank_socket(dep: PDDeployment, plain_url: str, side: str):
    server = dep.prefill if side == "prefill" else dep.decodes[0]
    backend = "nixl" if dep.config.transfer_backend == "nixl" else "mooncake"
    secret = dep.env.get("SGLANG_PD_PEER_SECRET_FILE")
    auth = PeerAuth.from_file(secret) if secret else None
    rng = random.Random(f"{backend}-{side}-{bool(auth)}")
    corpus = _corpus(backend, side, rng)
    before = handshake_view(dep, server)["gate"]
    kinds: Counter = Counter()
    unsigned, unread, unsigned_unread = 0, 0, 0
    with PeerSocket(rank_endpoint(dep, server)) as peer:
        for start in range(0, len(corpus), ROUND):
            for i, (kind, frames) in enumerate(corpus[start:start + ROUND], start):
                sign = auth is not None and i % 10 != 9
                unsigned += not sign
                # more frames than any PD message (with trailer and digest): dropped before auth reads it
                too_long = len(frames) + (TRAILER_FRAMES if sign else 0) > MAX_MESSAGE_FRAMES
                unread += too_long
                unsigned_unread += too_long and not sign
                peer.send(frames, auth if sign else None)
                kinds[kind] += 1
            view = wait_received(dep, server, before["num_received"] + start + min(ROUND, len(corpus) - start))
            assert_threads_alive(view, side)  # checked while the fuzz runs, not only at the end
            assert_threads_alive(handshake_view(dep, dep.prefill if side == "decode" else dep.decodes[0]),
                                 "decode" if side == "prefill" else "prefill")
    gate = handshake_view(dep, server)["gate"]
    received = gate["num_received"] - before["num_received"]
    refused = sum(gate["auth_refused"].values()) - sum(before["auth_refused"].values())
    rejected = sum(gate["rejected"].values()) - sum(before["rejected"].values())
    admitted = gate["num_admitted"] - before["num_admitted"]
    later = sum(gate["refused_after_admit"].values()) - sum(before["refused_after_admit"].values())
    print(f"FUZZ {dep.config.transfer_backend} {side} auth={'on' if auth else 'off'}: sent {len(corpus)} "
          f"received {received} admitted {admitted} (of which refused by NIXL's metadata load {later}) rejected "
          f"{rejected} auth-refused {refused} kinds {dict(kinds)}")
    assert received == len(corpus) and admitted + rejected + refused == received
    assert gate["num_unread"] - before["num_unread"] == unread
    assert refused == (unsigned - unsigned_unread if auth else 0)
    assert rejected > len(corpus) // 2, "most mutations must be refused by the frame checks"
    unclaimed = gate.get("unclaimed_rooms")  # prefill only: bytes held for unclaimed rooms, never negative
    if unclaimed is not None:
        assert unclaimed["num_bytes"] >= 0 and (unclaimed["num_tracked"] or not unclaimed["num_bytes"]), unclaimed
    prompt = [random.Random(side).randrange(3, VOCAB_SIZE) for _ in range(40)]
    assert dep.generate_pd(prompt, 8)[1]["output_ids"] == dep.generate(plain_url, prompt, 8)["output_ids"]
    dep.wait_clean()
    for s in (dep.prefill, dep.decodes[0]):
        assert requests.get(s.url + "/health", timeout=60).status_code == 200
