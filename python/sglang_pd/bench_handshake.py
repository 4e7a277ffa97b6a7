"""Handshake overhead of peer authentication: the same PD handshake with and without a secret, side by side.

    python -m sglang_pd.bench_handshake [--num-messages 5000] [--num-http 500] [--out docs/results/security/bench_handshake.json]

What runs is the product's own code on real sockets over 127.0.0.1, in one process:
- ZMQ: a PUSH socket (signing like decode's / prefill's sockets when a secret is set) -> a PULL socket
  behind the `HandshakeGate` (authentication, frame checks, registered-peer lookup), one message at a
  time (send, then receive what the gate admits): the per-message latency a handshake pays. Message
  kinds as SGLang sends them: decode's registration and transfer info, prefill's transfer status.
- HTTP: SGLang's own bootstrap server (`CommonKVBootstrapServer`) with our guard, queried by SGLang's
  `requests` path with our client hook, as decode does with GET /route.
- the primitives alone: sign, verify, frame check (microseconds each).
Per PD request the handshake is one transfer info (decode -> prefill) and one status (prefill ->
decode); registration and GET /route happen once per decode-prefill pair (SGLang caches them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import zmq

from sglang_pd.config import Settings
from sglang_pd.harness.hostile_peer import PeerIdentity, Templates
from sglang_pd.srt.handshake import GuardedSocket, SigningSocket
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.wire import check_message
from sglang_pd.srt.handshake import HandshakeGate
from sglang_pd.srt.handshake import PeerRecord, PeerRemoval
from sglang_pd.srt.auth import PeerAuth, receiver_name
from sglang_pd.srt.state import ProcessKind, build_state, current, install, installed

PEER = PeerIdentity("127.0.0.1", 40001, "127.0.0.1:16001")
KEY = b"bench-secret-0123456789abcdef-0123456789"


class _Tables:
    """The KV manager tables the gate consults: one registered decode peer, every room claimed."""

    def registered_peer(self, name):
        return PeerRecord(PEER.ip, PEER.port) if name == PEER.name else None

    def num_registered(self):
        return 1

    def endpoint_registered(self, target):
        return tuple(target) == (PEER.ip, PEER.port)

    def forget_peer(self, name):
        return PeerRemoval.IN_USE  # the one peer is always in use here

    def room_claimed(self, room):
        return True

    def fail_room(self, room, reason, notify):
        raise AssertionError(f"benchmark message refused: {reason}")

    def drop_unclaimed(self, room, reason):
        return False

    def prune(self):
        pass

    def send_drained_tells(self):
        return [], []


def _messages(page_size: int, num_pages: int) -> dict[str, tuple[Side, list[bytes]]]:
    t = Templates("mooncake", PEER)
    return {
        "registration": (Side.PREFILL, t.registration([4096 * i for i in range(1, 9)], 2048, [1 << 20])),
        "transfer_info": (Side.PREFILL, t.transfer_info(7, list(range(num_pages)), decode_prefix_len=page_size)),
        "status": (Side.DECODE, t.status(7, 4)),
    }


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def _gate_failed(doing: str) -> None:
    raise RuntimeError(f"handshake gate failed while {doing} (the benchmark's messages are all valid)")


def bench_zmq(frames: list[bytes], side: Side, auth: PeerAuth | None, num: int, page_size: int) -> dict:
    """Median / p99 microseconds per message, send to admitted receive, one message in flight."""
    limits = FrameLimits("mooncake", side, page_size, 4096, 4 << 20, aux_item_lens=(64,), aux_slots=(64,))
    ctx = zmq.Context()
    raw_pull, raw_push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = raw_pull.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    raw_push.connect(endpoint)
    gate = HandshakeGate(limits, _Tables(), auth, None, None, receiver=receiver_name(endpoint))
    pull = GuardedSocket.around(raw_pull, gate, on_error=_gate_failed)
    push = SigningSocket.around(raw_push, auth, endpoint) if auth else raw_push
    lat = []
    for i in range(num + 200):
        t0 = time.perf_counter()
        push.send_multipart(frames)
        got = pull.recv_multipart()
        if i >= 200:  # warm-up
            lat.append((time.perf_counter() - t0) * 1e6)
    assert got == frames and gate.counts.num_admitted == num + 200
    for s in (raw_push, raw_pull):
        s.close(0)
    ctx.term()
    return {"median_us": statistics.median(lat), "p99_us": _pct(lat, 0.99), "num": num}


def bench_primitives(frames: list[bytes], side: Side, num: int, page_size: int) -> dict:
    """Microseconds per call of sign, verify and the frame check alone."""
    auth = PeerAuth([KEY])
    limits = FrameLimits("mooncake", side, page_size, 4096, 4 << 20, aux_item_lens=(64,), aux_slots=(64,))
    receiver = b"127.0.0.1:5757"
    signed = [frames + auth.sign_frames(frames, receiver) for _ in range(num)]
    t0 = time.perf_counter()
    for _ in range(num):
        auth.sign_frames(frames, receiver)
    t1 = time.perf_counter()
    for msg in signed:
        auth.verify_frames(msg, receiver)
    t2 = time.perf_counter()
    for _ in range(num):
        check_message(frames, limits)
    t3 = time.perf_counter()
    return {"sign_us": (t1 - t0) / num * 1e6, "verify_us": (t2 - t1) / num * 1e6, "check_us": (t3 - t2) / num * 1e6}


def bench_http(auth: PeerAuth | None, num: int) -> dict:
    """Median / p99 ms of GET /route against SGLang's bootstrap server behind our guard."""
    import requests

    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    from sglang_pd.harness.server import free_port

    from sglang_pd.srt.auth import BootstrapAddresses

    guard = current().peer_guard
    guard.auth = auth
    server = CommonKVBootstrapServer("127.0.0.1", free_port())
    url = f"http://127.0.0.1:{server.port}"
    guard.bootstrap_addresses = BootstrapAddresses([("127.0.0.1", server.port)])  # as prefill signs for its own
    session = requests.Session()
    rank = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
            "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
            "rank_ip": "127.0.0.1", "rank_port": 40000, "page_size": 16, "kv_cache_dtype": "float32"}
    deadline = time.monotonic() + 30
    while True:
        try:
            status = session.put(url + "/route", json=rank, timeout=5).status_code
            if status == 200:
                break
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        if time.monotonic() > deadline:
            raise RuntimeError(f"the benchmark's bootstrap server answered PUT /route with {status} for 30 s")
        time.sleep(0.05)
    query = url + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
    lat = []
    for i in range(num + 20):
        t0 = time.perf_counter()
        resp = session.get(query, timeout=5)
        if i >= 20:
            lat.append((time.perf_counter() - t0) * 1e3)
        assert resp.status_code == 200, resp.text
    server.close()
    guard.auth, guard.bootstrap_addresses = None, BootstrapAddresses()
    return {"median_ms": statistics.median(lat), "p99_ms": _pct(lat, 0.99), "num": num}


def _apply_http_hooks() -> None:
    """The HOOK_TABLE rows of the bootstrap server and the requests client, applied as in a server process."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_pd.srt.hooks.table import HOOK_TABLE

    for spec in HOOK_TABLE:
        if spec.target.endswith(("_setup_routes", "Session.request")):
            HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
    HookRegistry.apply_hooks()


def run(num_messages: int, num_http: int, page_size: int, num_pages: int) -> dict:
    """Every measurement, without and with authentication (in this process's state: built here if none)."""
    if not installed():
        install(build_state(ProcessKind.HTTP, Settings.from_env()))
    _apply_http_hooks()
    results = {"config": {"num_messages": num_messages, "num_http": num_http, "page_size": page_size,
                          "num_pages_in_transfer_info": num_pages}, "zmq": {}, "primitives": {}}
    for kind, (side, frames) in _messages(page_size, num_pages).items():
        results["zmq"][kind] = {mode: bench_zmq(frames, side, auth, num_messages, page_size)
                                for mode, auth in (("off", None), ("on", PeerAuth([KEY])))}
        results["primitives"][kind] = bench_primitives(frames, side, num_messages, page_size)
    results["http_get_route"] = {mode: bench_http(auth, num_http)
                                 for mode, auth in (("off", None), ("on", PeerAuth([KEY])))}
    per_request = {mode: sum(results["zmq"][k][mode]["median_us"] for k in ("transfer_info", "status"))
                   for mode in ("off", "on")}
    results["per_request_us"] = {**per_request, "added_us": per_request["on"] - per_request["off"]}
    return results


def report(results: dict) -> str:
    """The side-by-side table."""
    lines = ["kind              auth off (us, p50 / p99)   auth on (us, p50 / p99)   added (us)   "
             "sign / verify / check (us)"]
    for kind, modes in results["zmq"].items():
        off, on, prim = modes["off"], modes["on"], results["primitives"][kind]
        lines.append(f"{kind:<17} {off['median_us']:>10.1f} / {off['p99_us']:<10.1f}   {on['median_us']:>10.1f} / "
                     f"{on['p99_us']:<10.1f}   {on['median_us'] - off['median_us']:>9.1f}   "
                     f"{prim['sign_us']:.1f} / {prim['verify_us']:.1f} / {prim['check_us']:.1f}")
    http = results["http_get_route"]
    lines.append(f"GET /route (ms)   {http['off']['median_ms']:>10.3f} / {http['off']['p99_ms']:<10.3f}   "
                 f"{http['on']['median_ms']:>10.3f} / {http['on']['p99_ms']:<10.3f}   "
                 f"{(http['on']['median_ms'] - http['off']['median_ms']) * 1e3:>9.1f}")
    per = results["per_request_us"]
    lines.append(f"per PD request (transfer info + status): {per['off']:.1f} us off, {per['on']:.1f} us on, "
                 f"+{per['added_us']:.1f} us")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-messages", type=int, default=5000)
    parser.add_argument("--num-http", type=int, default=500)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--num-pages", type=int, default=64, help="pages named by the transfer info")
    parser.add_argument("--out", type=Path, default=Path("docs/results/security/bench_handshake.json"))
    args = parser.parse_args(argv)
    if min(args.num_messages, args.num_http, args.page_size, args.num_pages) < 1:
        parser.error("--num-messages, --num-http, --page-size and --num-pages must be >= 1")
    t0 = time.perf_counter()
    results = run(args.num_messages, args.num_http, args.page_size, args.num_pages)
    results["seconds"] = time.perf_counter() - t0
    print(report(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out} ({results['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
