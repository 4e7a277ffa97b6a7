"""Hooks on sglang.srt.disaggregation.common.conn: rank sockets guarded, handshake messages signed.

- CommonKVManager.__init__ (AROUND): bind the rank socket with a frame cap, put the `HandshakeGate`
  in front of it (every receiving thread of both backends reads it), watch the PD threads.
- CommonKVManager._send_multipart_locked (BEFORE) and CommonKVReceiver._connect (AROUND): every
  message prefill sends decode (status, ABORT_ACK, AUX_DATA) and decode sends prefill (registration,
  transfer info, ABORT, BOOTSTRAP) carries the auth trailer when a secret is configured.
- CommonKVSender.__init__ (AFTER): a room a rejected message failed before its request existed fails
  now instead of waiting for the bootstrap timeout.
- CommonKVBootstrapServer._setup_routes (AFTER): the bootstrap HTTP routes authenticated and checked
  (server side; the client side is srt/hooks/requests_sessions.py).
The logic lives in srt/disaggregation/ (handshake_gate, handshake_frames, peer_auth, bootstrap_http).
"""

from __future__ import annotations

import logging
import threading

from sglang_pd.process_state import STATE, mode_name
from sglang_pd.srt.disaggregation import bootstrap_http
from sglang_pd.srt.disaggregation.guarded_socket import GuardedSocket, SigningSocket
from sglang_pd.srt.disaggregation.handshake_frames import FrameLimits, Side
from sglang_pd.srt.disaggregation.handshake_gate import HandshakeGate, PeerRecord
from sglang_pd.srt.disaggregation.peer_auth import HTTP_HEADER, HTTP_RESPONSE_HEADER
from sglang_pd.srt.disaggregation.peer_guard import room_ttl_s
from sglang_pd.srt.disaggregation.room_expiry import RoomTombstones, UnclaimedRooms
from sglang_pd.srt.disaggregation.thread_watch import ThreadRole, ThreadWatch, Watchdog
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.fault_injection import enabled as fault_injection_enabled
from sglang_pd.srt.hooks.network import frame_cap

logger = logging.getLogger(__name__)
_MIB = 1 << 20


# ---- the rank socket ----------------------------------------------------------------------------------
def around_manager_init(original, mgr, args, disaggregation_mode, *rest, **kwargs):
    """Build SGLang's manager with a capped rank socket, then guard the socket and watch the threads."""
    before = threading.enumerate()
    limits = frame_limits(args, type(mgr).__module__, mode_name(disaggregation_mode))
    with frame_cap(zmq_frame_cap(limits) if limits else None):
        original(mgr, args, disaggregation_mode, *rest, **kwargs)
    if limits is None:
        logger.warning("sglang_pd: %s rank socket is not guarded (only mooncake and nixl are)", type(mgr).__name__)
        return
    _install(mgr, limits, before)


def frame_limits(args, module: str, mode: str) -> FrameLimits | None:
    """What this manager's pools let a peer name; None for backends we do not guard."""
    backend = next((b for b in ("mooncake", "nixl") if f".{b}." in f".{module}."), None)
    if backend is None or mode not in ("prefill", "decode"):
        return None
    from sglang.srt.environ import envs

    lens, items = list(args.kv_data_lens or []), list(args.kv_item_lens or [])
    max_pages = lens[0] // items[0] if lens and items and items[0] else 1 << 20
    aux_items = tuple(int(n) for n in args.aux_item_lens or [])
    aux_slots = tuple(int(d) // int(i) if i else 0 for d, i in zip(args.aux_data_lens or [], aux_items))
    side = Side(mode)
    # Prefill's largest legitimate frames: page-index lists and NIXL agent metadata (KBs per agent).
    if side is Side.PREFILL:
        max_frame = max(4 * _MIB, 4 * (max_pages + 64))
    else:
        max_frame = max(_MIB, max(aux_items, default=0) + 64)
    return FrameLimits(backend, side, int(args.page_size), max_pages + 8, max_frame,
                       staging=bool(envs.SGLANG_DISAGG_STAGING_BUFFER.get()),
                       aux_item_lens=aux_items, aux_slots=aux_slots)


def zmq_frame_cap(limits: FrameLimits) -> int:
    """libzmq's hard cap: well above any field's own limit, so most oversize frames reach the gate (logged)."""
    return max(16 * _MIB, 2 * limits.max_frame_bytes)


def _install(mgr, limits: FrameLimits, before) -> None:
    guard = STATE.peer_guard
    host = ManagerHost(mgr, limits)
    prefill = limits.side is Side.PREFILL
    ttl = room_ttl_s()
    guard.tombstones = RoomTombstones(ttl) if prefill else None
    guard.gate = HandshakeGate(limits, host, guard.auth, UnclaimedRooms(ttl) if prefill else None,
                               guard.tombstones, on_count=STATE.counters.add, capture=fault_injection_enabled())
    mgr.server_socket = GuardedSocket.around(mgr.server_socket, guard.gate, on_error=_count_gate_error,
                                             before_admit=_injected_reader_exit)
    ip = f"[{mgr.local_ip}]" if ":" in str(mgr.local_ip) else mgr.local_ip
    guard.endpoint = f"tcp://{ip}:{mgr.rank_port}"
    guard.rooms_view = host.rooms_view
    guard.host = host
    guard.pool = {"page_size": limits.page_size, "num_pages": limits.max_kv_pages - 8,
                  "num_kv_buffers": len(mgr.kv_args.kv_data_ptrs), "kv_item_lens": list(mgr.kv_args.kv_item_lens[:1]),
                  "aux_item_lens": list(limits.aux_item_lens)}
    guard.watch = ThreadWatch(before, lambda: expected_threads(mgr, limits.side), _on_thread_death)
    Watchdog(guard.watch).start()
    logger.info("sglang_pd: %s %s rank socket %s guarded (auth %s, frames <= %d bytes, %d pages)",
                limits.backend, limits.side.value, guard.endpoint, "on" if guard.auth else "OFF",
                limits.max_frame_bytes, limits.max_kv_pages)


def expected_threads(mgr, side: Side) -> dict[ThreadRole, int] | None:
    """The PD threads SGLang's manager runs once built (None while prefill's queues do not exist yet)."""
    if side is Side.DECODE:
        return {ThreadRole.STATUS_LISTENER: 1, ThreadRole.HEARTBEAT: 1}
    queues = getattr(mgr, "transfer_queues", None)
    return None if queues is None else {ThreadRole.BOOTSTRAP: 1, ThreadRole.TRANSFER_WORKER: len(queues)}


def _on_thread_death(name: str, role: ThreadRole) -> None:
    logger.error("sglang_pd: PD thread %r (%s) is dead: this server can no longer pair requests with its peers; "
                 "/health now answers 503 (restart the server)", name, role.value)
    STATE.counters.set("pd_threads_dead", len(STATE.peer_guard.dead_threads()))


def _injected_reader_exit() -> None:
    """Test-only (SGLANG_PD_ENABLE_FAULT_INJECTION): end the reading thread as an upstream parse error would."""
    if STATE.faults.take(Fault.RANK_READER_EXIT):
        raise RuntimeError("sglang_pd test fault rank_reader_exit: the rank socket's reading thread ends here")


def _count_gate_error() -> None:
    STATE.peer_guard.num_gate_errors += 1
    STATE.count_hook_error("handshake_gate")


class ManagerHost:
    """SGLang's KV manager as the gate's `GateHost` (reads and fails rooms through SGLang's own methods).

    A prefill room is *claimed* while a local request's sender exists for it (added by the sender hook,
    pruned once SGLang clears the room); SGLang itself creates a room's status entry as soon as a
    transfer info names it, so its status table alone cannot tell a waiting request from a foreign room."""

    def __init__(self, mgr, limits: FrameLimits):
        self.mgr, self.limits = mgr, limits
        self.claimed: set[int] = set()

    def registered_peer(self, name: str) -> PeerRecord | None:
        info = getattr(self.mgr, "decode_kv_args_table", {}).get(name)
        if info is None:
            return None
        slots = getattr(info, "dst_num_slots", None) if self.limits.backend == "nixl" else None
        return PeerRecord(str(info.endpoint), int(info.dst_port), int(slots) if slots else None)

    def num_registered(self) -> int:
        return len(getattr(self.mgr, "decode_kv_args_table", {}))

    def room_claimed(self, room: int) -> bool:
        if self.limits.side is Side.DECODE:
            return room in self.mgr.request_status
        return room in self.claimed and room in self.mgr.request_status

    def fail_room(self, room: int, reason: str, notify) -> bool:
        from sglang.srt.disaggregation.base.conn import KVPoll

        claimed = self.room_claimed(room)
        if claimed:
            self.mgr.record_failure(room, reason)
            self.mgr.update_status(room, KVPoll.Failed)
        if notify is not None:
            self.mgr.send_kv_status_message(targets=[notify], bootstrap_room=room, status=KVPoll.Failed,
                                            failure_reason=reason)
        return claimed

    def drop_unclaimed(self, room: int) -> bool:
        if self.room_claimed(room):
            return False
        self.mgr.req_to_decode_prefix_len.pop(room, None)
        held = self.mgr.transfer_infos.pop(room, None) is not None
        self.mgr.request_status.pop(room, None)  # created by SGLang for the foreign room; no request uses it
        return held

    def prune(self) -> None:
        """Forget claims of rooms SGLang has cleared (their requests ended)."""
        for room in [r for r in list(self.claimed) if r not in self.mgr.request_status]:
            self.claimed.discard(room)

    def rooms_view(self) -> dict:
        """Rooms by upstream status (KVPoll value) and, for prefill, held transfer infos / peers."""
        statuses = list(self.mgr.request_status.items())
        by_status: dict[int, list[int]] = {}
        for room, status in statuses:
            by_status.setdefault(int(status), []).append(int(room))
        view = {"by_status": {str(s): sorted(r)[:64] for s, r in by_status.items()}, "num_rooms": len(statuses)}
        if self.limits.side is Side.PREFILL:
            view["transfer_info_rooms"] = sorted(int(r) for r in list(self.mgr.transfer_infos))[:64]
            view["registered_peers"] = sorted(list(self.mgr.decode_kv_args_table))[:64]
        return view


# ---- outgoing messages ----------------------------------------------------------------------------------
def before_send_multipart_locked(mgr, endpoint, parts, is_ipv6=False):
    """Append the auth trailer to what this manager sends a peer (no-op without a secret)."""
    auth = STATE.peer_guard.auth
    if auth is None:
        return None
    parts = [bytes(p) for p in parts]
    return (mgr, endpoint, parts + auth.sign_frames(parts)), {"is_ipv6": is_ipv6}


def around_receiver_connect(original, *args, **kwargs):
    """Decode's PUSH sockets to prefill ranks sign every message (no-op without a secret)."""
    sock, lock = original(*args, **kwargs)
    auth = STATE.peer_guard.auth
    return (sock, lock) if auth is None else (SigningSocket.around(sock, auth), lock)


def after_sender_init(result, sender, mgr, bootstrap_addr, bootstrap_room, *args, **kwargs):
    """Record the room as claimed by a local request; fail it at once if a rejected message failed it before."""
    tombstones = STATE.peer_guard.tombstones
    host = STATE.peer_guard.host
    if host is not None:
        host.claimed.add(int(bootstrap_room))
    reason = tombstones.take(int(bootstrap_room)) if tombstones is not None else None
    if reason is not None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        mgr.record_failure(int(bootstrap_room), reason)
        mgr.update_status(int(bootstrap_room), KVPoll.Failed)
    return result


# ---- the bootstrap HTTP server (prefill's HTTP process) ------------------------------------------------
def after_setup_routes(result, server):
    """Put authentication and request checks in front of the bootstrap server's routes."""
    server.app.middlewares.append(_bootstrap_middleware(server))
    return result


def _count_http(name: str) -> None:
    """Count in this (HTTP) process, exporting to /metrics once SGLang's metrics are known to be on."""
    if not STATE.counters.bound:
        try:
            from sglang.srt.entrypoints.http_server import get_global_state

            args = get_global_state().tokenizer_manager.server_args
            if args.enable_metrics:
                STATE.counters.bind(mode_name(args.disaggregation_mode),
                                    mode_name(args.disaggregation_transfer_backend))
        except Exception:  # a bootstrap server outside SGLang's HTTP server (benchmark): count only
            logger.debug("sglang_pd: bootstrap guard counts without Prometheus", exc_info=True)
    STATE.counters.add(name, 1)


def _registered_sizes(server) -> dict:
    return {"attn_tp_size": server.attn_tp_size, "attn_cp_size": server.attn_cp_size,
            "pp_size": server.pp_size, "dp_size": server.dp_size}


def _bootstrap_middleware(server):
    from aiohttp import web

    guard = STATE.peer_guard

    @web.middleware
    async def sglang_pd_bootstrap_guard(request, handler):
        if request.path not in bootstrap_http.GUARDED_PATHS:
            return await handler(request)
        body = await request.read()
        peer = request.remote or "unknown"
        nonce = None
        if guard.auth is not None:
            verdict = guard.auth.verify_http_request(request.method, request.raw_path, body,
                                                     request.headers.get(HTTP_HEADER))
            if verdict.failure is not None:
                guard.http.add("auth_refused", verdict.failure.value, peer,
                               f"sglang_pd: bootstrap {request.method} {request.path} refused: auth "
                               f"{verdict.failure.value}")
                _count_http("peer_auth_refused_total")
                return web.Response(status=401, text=f"sglang_pd: unauthenticated ({verdict.failure.value})")
            nonce = verdict.nonce
        problem = bootstrap_http.request_problem(request.method, request.path, request.query, body,
                                                 _registered_sizes(server))
        if problem is not None:
            guard.http.add("malformed", request.path, peer, f"sglang_pd: bootstrap {problem}")
            _count_http("handshake_messages_rejected_total")
            response = web.Response(status=400, text=f"sglang_pd: {problem}")
        else:
            response = await handler(request)
        if nonce is not None:
            response.headers[HTTP_RESPONSE_HEADER] = guard.auth.sign_http_response(
                nonce, response.status, bytes(response.body or b""))
        return response

    return sglang_pd_bootstrap_guard
