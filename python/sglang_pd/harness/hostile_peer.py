"""A broken or hostile PD peer, for tests and the handshake benchmark: messages built by hand, mutated, pushed.

`Templates` writes well-formed handshake messages in SGLang 0.5.23's frame layouts (the unit tier
checks them against SGLang's own builders); `mutations` bends them the ways a broken peer or a fuzzer
does; `PeerSocket` pushes frames to a rank socket, optionally signed with a `PeerAuth` (a peer that
holds the secret) or with a wrong one (an impostor).
"""

from __future__ import annotations

import random
import socket
import struct
import time
from dataclasses import dataclass

import numpy as np
import zmq

from sglang_pd.srt.wire import NIXL_GUARD
from sglang_pd.srt.auth import PeerAuth, receiver_name


def _ascii(value) -> bytes:
    return str(value).encode("ascii")


def _u64s(values) -> bytes:
    return b"".join(struct.pack("Q", v) for v in values)


@dataclass(frozen=True)
class PeerIdentity:
    """Who the fake decode claims to be: its ZMQ endpoint and its transfer name."""

    ip: str = "127.0.0.1"
    port: int = 1
    name: str = "127.0.0.1:1"     # mooncake: session "host:port"; NIXL: agent name


class Templates:
    """Well-formed messages of one backend ("mooncake" or "nixl")."""

    def __init__(self, backend: str, peer: PeerIdentity = PeerIdentity()):
        if backend not in ("mooncake", "nixl"):
            raise ValueError(f"backend must be mooncake or nixl, got {backend!r}")
        self.backend, self.peer = backend, peer

    def _guarded(self, frames: list[bytes]) -> list[bytes]:
        return [NIXL_GUARD, *frames] if self.backend == "nixl" else frames

    def registration(self, kv_ptrs: list[int], kv_item_len: int, aux_ptrs: list[int] = (),
                     num_slots: int = 0, agent_metadata: bytes = b"metadata") -> list[bytes]:
        """The one-time registration of a decode rank's buffers with a prefill rank."""
        p = self.peer
        head = [b"None", _ascii(p.ip), _ascii(p.port), _ascii(p.name)]
        if self.backend == "mooncake":
            return head + [_u64s(kv_ptrs), _u64s(aux_ptrs), b"", b"0", b"1", _ascii(kv_item_len), b"", b"", b"",
                           b"", b"", b"", b"1", b"0", b"", _u64s([kv_item_len] * len(kv_ptrs))]
        return self._guarded(head + [
            agent_metadata, _u64s(kv_ptrs), _u64s(aux_ptrs), b"", b"0", b"1", b"0", _ascii(kv_item_len), b"", b"",
            b"", b"", _ascii(num_slots), b",".join([b"DRAM"] * len(kv_ptrs)), _u64s([kv_item_len] * len(kv_ptrs)),
            b"", b"", b"1", b"0", b""])

    def transfer_info(self, room: int, kv_indices, aux_index: int = 0, required: int = 1,
                      decode_prefix_len: int = 0) -> list[bytes]:
        """A room's destination pages (what decode sends once it has allocated them); bytes are sent as given."""
        p = self.peer
        indices = kv_indices if isinstance(kv_indices, bytes) else np.asarray(kv_indices, dtype=np.int32).tobytes()
        head = [_ascii(room), _ascii(p.ip), _ascii(p.port), _ascii(p.name), indices, _ascii(aux_index)]
        if self.backend == "mooncake":
            return head + [b"", _ascii(required), _ascii(decode_prefix_len), b""]
        return self._guarded(head + [_ascii(required), b"", _ascii(decode_prefix_len), b"0"])

    @staticmethod
    def abort(room: int, ip: str | None = None, port: int | None = None) -> list[bytes]:
        """Decode telling prefill a room is abandoned."""
        return [b"ABORT", _ascii(room)] + ([_ascii(ip), _ascii(port)] if ip is not None else [])

    def status(self, room: int, value: int, prefill_rank: int = 0, reason: bytes = b"") -> list[bytes]:
        """Prefill telling decode a room's transfer ended (4 = Success, 0 = Failed); NIXL tags it."""
        frames = [_ascii(room), _ascii(value), _ascii(prefill_rank)]
        return frames if self.backend == "mooncake" else [b"KV_STATUS", *frames, reason]

    @staticmethod
    def abort_ack(room: int) -> list[bytes]:
        """Prefill acknowledging decode's ABORT."""
        return [b"ABORT_ACK", _ascii(room)]

    @staticmethod
    def aux_data(room: int, buffer_index: int, aux_index: int, data: bytes) -> list[bytes]:
        """Mooncake prefill writing a room's aux (metadata) slot over TCP."""
        return [b"AUX_DATA", _ascii(room), _ascii(buffer_index), _ascii(aux_index),
                struct.pack(">I", len(data)), data]


# ---- mutations -----------------------------------------------------------------------------------------
def random_frames(rng: random.Random, max_frames: int = 12, max_len: int = 64) -> list[bytes]:
    """1..max_frames frames of random bytes (foreign traffic)."""
    return [rng.randbytes(rng.randrange(0, max_len)) for _ in range(rng.randrange(1, max_frames + 1))]


def _replace(frames, i, value):
    return frames[:i] + [value] + frames[i + 1:]


def _flip(frames, rng):
    i = rng.randrange(len(frames))
    data = bytearray(frames[i] or b"\0")
    for _ in range(rng.randrange(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return _replace(frames, i, bytes(data))


MUTATIONS = {
    "truncated": lambda f, rng: f[:rng.randrange(1, len(f))] if len(f) > 1 else [],
    "frame_dropped": lambda f, rng: (lambda i: f[:i] + f[i + 1:])(rng.randrange(len(f))),
    "frame_inserted": lambda f, rng: (lambda i: f[:i] + [rng.randbytes(rng.randrange(0, 16))] + f[i:])(
        rng.randrange(len(f) + 1)),
    "bytes_flipped": _flip,
    "frame_random": lambda f, rng: _replace(f, rng.randrange(len(f)), rng.randbytes(rng.randrange(0, 40))),
    "non_ascii": lambda f, rng: _replace(f, rng.randrange(len(f)), "é☃".encode() + rng.randbytes(2)),
    "negative": lambda f, rng: _replace(f, rng.randrange(len(f)), b"-" + str(rng.randrange(1, 10**6)).encode()),
    "huge_int": lambda f, rng: _replace(f, rng.randrange(len(f)), b"9" * rng.randrange(19, 40)),
    "empty_frames": lambda f, rng: [b""] * len(f),
    "duplicated": lambda f, rng: f + f,
    "oversized": lambda f, rng: _replace(f, rng.randrange(len(f)), rng.randbytes(rng.randrange(1 << 16, 3 << 20))),
    "unaligned": lambda f, rng: _replace(f, rng.randrange(len(f)), rng.randbytes(rng.choice([1, 3, 5, 7, 9]))),
}


def mutate(frames: list[bytes], rng: random.Random, kind: str | None = None) -> tuple[str, list[bytes]]:
    """(mutation name, mutated copy of `frames`); a random mutation unless `kind` is given."""
    kind = kind or rng.choice(sorted(MUTATIONS))
    return kind, MUTATIONS[kind](list(frames), rng)


# ---- sending ---------------------------------------------------------------------------------------------
class PeerSocket:
    """A PUSH socket to one rank socket (a context manager); `send` can sign or mis-sign."""

    def __init__(self, endpoint: str, linger_ms: int = 5000):
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, linger_ms)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.connect(endpoint)
        self.endpoint = endpoint

    def send(self, frames: list[bytes], auth: PeerAuth | None = None, receiver: str | None = None) -> None:
        """Push `frames` (with `auth`'s trailer when given, signed for `receiver`: by default the endpoint this
        socket is connected to); an empty list is sent as one empty frame."""
        frames = list(frames) or [b""]
        signed_for = receiver_name(receiver or self.endpoint)
        self._sock.send_multipart(frames + (auth.sign_frames(frames, signed_for) if auth else []))

    def send_raw(self, frames: list[bytes]) -> None:
        """Push exactly `frames` (a replay of captured bytes)."""
        self._sock.send_multipart(frames)

    def close(self) -> None:
        """Flush (up to the linger time) and close."""
        self._sock.close()
        self._ctx.term()

    def __enter__(self) -> "PeerSocket":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def send_unfinished_multipart(host: str, port: int, num_frames: int, frame_bytes: int = 1 << 20,
                              settle_s: float = 2.0) -> int:
    """A raw ZMTP 3.0 client with no key (NULL mechanism, Socket-Type PUSH, as SGLang's PD sockets speak)
    sends `num_frames` frames of `frame_bytes` flagged MORE and never a last one, waits `settle_s` for the
    receiver to take them in, closes. Returns how many frames the receiver's kernel took before the
    connection ended (all of them when the receiver keeps it open: libzmq then buffers them all)."""
    conn = socket.create_connection((host, port))
    sent = 0
    try:
        # greeting (NULL mechanism, as-server 0), then READY with Socket-Type PUSH
        conn.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32)
        ready = b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", 4) + b"PUSH"
        conn.sendall(bytes([0x04, len(ready)]) + ready)
        conn.settimeout(5)
        conn.recv(64)
        frame = bytes([0x01 | 0x02]) + struct.pack(">Q", frame_bytes) + b"x" * frame_bytes  # MORE, LONG size
        for _ in range(num_frames):
            conn.sendall(frame)
            sent += 1
    except OSError:  # the receiver dropped the connection (e.g. CURVE: the handshake failed)
        pass
    finally:
        time.sleep(settle_s)
        conn.close()
    return sent


# ---- reading a deployment's guard state (tests) -------------------------------------------------------------
def handshake_view(dep, server) -> dict:
    """The `handshake` section of a server's first scheduler (/sglang_pd/stats): gate, threads, rooms, pool."""
    return dep.scheduler_state(server)["handshake"]


def rank_endpoint(dep, server) -> str:
    """tcp://ip:port of a server's rank socket (prefill: where decode writes; decode: where prefill writes)."""
    return handshake_view(dep, server)["endpoint"]


def wait_received(dep, server, at_least: int, timeout_s: float = 60.0) -> dict:
    """Poll until the server's gate has received `at_least` messages in total; returns its handshake view.

    Raises AssertionError at once when a PD thread of the server is dead (its reader then receives
    nothing more: the count stalls because of the death, which is the failure to report), else when
    the count is still short after `timeout_s`; both messages carry the thread view and the gate's."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        view = handshake_view(dep, server)
        received = view["gate"]["num_received"]
        if received >= at_least:
            return view
        if view["threads"]["dead"]:
            raise AssertionError(f"{server.name}: PD thread(s) dead {view['threads']['dead']} after its gate received "
                                 f"{received} of {at_least} messages (server log: {server.log_path}); "
                                 f"threads {view['threads']}; gate {view['gate']}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{server.name} gate received {received} < {at_least} messages in {timeout_s:.0f} s; "
                                 f"threads {view['threads']}; gate {view['gate']}")
        time.sleep(0.2)


def assert_threads_alive(view: dict, side: str) -> None:
    """The PD threads of a server were found and none is dead, and prefill's request clears and transfer
    workers' room removals wait for its bootstrap thread to be between messages (raises AssertionError
    naming what is wrong)."""
    assert view["bootstrap_hold"] == ("on" if side == "prefill" else "decode: none"), view["bootstrap_hold"]
    assert view["transfer_infos_held"] is (side == "prefill"), view["transfer_infos_held"]
    threads = view["threads"]
    roles = threads["by_role"]
    wanted = {"bootstrap", "transfer_worker"} if side == "prefill" else {"status_listener", "heartbeat"}
    assert threads["discovered"] and wanted <= set(roles), threads
    assert threads["dead"] == {} and len(threads["alive"]) == sum(roles.values()), threads


def captured_frames(view: dict) -> dict[str, list[bytes]]:
    """Real messages a fault-injection server admitted last, per kind, trailer included (for replays)."""
    import base64

    captured = view["gate"].get("captured") or {}
    return {kind: [base64.b64decode(f) for f in frames] for kind, frames in captured.items()}


class TransferPeer:
    """A process-local transfer endpoint (a Mooncake TransferEngine or a NIXL agent) with zeroed KV and
    aux buffers laid out like a prefill pool (`pool`: the `handshake.pool` view of /sglang_pd/stats), so
    a registration of it is one prefill can really write to: any KV sent to it lands in `kv` / `aux`."""

    def __init__(self, backend: str, pool: dict, num_pages: int, name: str):
        from sglang_pd.harness.server import free_port

        self.backend, self.num_pages = backend, num_pages
        self.item = pool["kv_item_lens"][0]
        self.kv = [np.zeros(self.item * num_pages, dtype=np.uint8) for _ in range(pool["num_kv_buffers"])]
        self.aux = [np.zeros(n * 4, dtype=np.uint8) for n in pool["aux_item_lens"]]
        if backend == "mooncake":
            from sglang_pd.harness.endpoints.mooncake_endpoint import MooncakeEndpoint

            self.endpoint = MooncakeEndpoint(name, self.kv + self.aux)
            transfer_name, self.metadata = self.endpoint.info()["session"], b""
        else:
            from sglang_pd.harness.endpoints.nixl_endpoint import NixlEndpoint

            self.endpoint = NixlEndpoint(f"{name}-{free_port()}", self.kv + self.aux)
            transfer_name, self.metadata = self.endpoint.agent.name, self.endpoint.info()["metadata"]
        self.identity = PeerIdentity("127.0.0.1", free_port(), transfer_name)
        self.templates = Templates(backend, self.identity)

    def registration(self) -> list[bytes]:
        """Its registration with a prefill rank (buffer addresses, NIXL agent metadata)."""
        return self.templates.registration([b.ctypes.data for b in self.kv], self.item,
                                           [b.ctypes.data for b in self.aux], num_slots=self.num_pages,
                                           agent_metadata=self.metadata or b"metadata")

    def claim(self, room: int) -> list[bytes]:
        """A transfer info asking for `room`'s KV pages into its buffers."""
        return self.templates.transfer_info(room, list(range(self.num_pages)))

    def bytes_received(self) -> int:
        """Nonzero bytes in its buffers (polls NIXL notifications first)."""
        if self.backend == "nixl":
            self.endpoint.progress()
        return int(sum(np.count_nonzero(b) for b in self.kv + self.aux))

    def close(self) -> None:
        """Release the endpoint."""
        self.endpoint.close()
