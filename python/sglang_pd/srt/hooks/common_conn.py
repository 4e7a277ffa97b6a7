"""Hooks on SGLang's common KV transfer classes (disaggregation/common/conn.py), shared by the mooncake
and NIXL managers (subclasses of CommonKVManager):

- CommonKVManager.__init__ (AROUND): bind the rank socket with a frame cap, put the `HandshakeGate`
  in front of it (every receiving thread of both backends reads it), watch the PD threads.
- CommonKVManager._send_multipart_locked (BEFORE) and CommonKVReceiver._connect (AROUND): every
  message prefill sends decode (status, ABORT_ACK, AUX_DATA) and decode sends prefill (registration,
  transfer info, ABORT, BOOTSTRAP, room decline) carries the auth trailer when a secret is configured.
- CommonKVSender.__init__ (AFTER): the room is claimed by a local request; a room a rejected message
  failed before its request existed fails now instead of waiting for the bootstrap timeout.
- CommonKVSender.clear (AROUND): runs only while prefill's bootstrap thread is between two messages
  (guarded_socket.py; a clear inside its handling of a transfer info ended the thread; the transfer
  workers' own removals of a finished room from `transfer_infos` wait the same way, HeldRooms); a request that
  failed after its decode's transfer info came has that decode told (once no write into its pages can
  still land: manager_host.py); then the room
  is no longer bound to its prompt; a room whose request failed is remembered, so a decode transfer
  info that arrives after is refused and its decode told at once.
- CommonKVSender._prepare_send_indices (AFTER): KV pages really handed to the transport, per room.
- Mooncake/NixlKVManager.build_receiver_registration_message (AFTER): decode's registration ends with its
  pools' bounds (pool_bounds.py), which prefill's gate holds its transfer infos' indices to.
- the room decline (srt/handshake/room_decline.py), both ends of it:

    decode:  send_decline(receiver, notice)    -> every prefill rank of the receiver's room (signed)
    prefill: the gate checks it, consume_decline_first takes it -> RoomDeclineTable (fail now, or tombstone)

The logic lives in srt/disaggregation/ (handshake_gate, handshake_frames, peer_auth, manager_host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading

from sglang_pd.config import PEER_SECRET_FILE
from sglang_pd.srt.auth import curve_keys
from sglang_pd.srt.handshake.sockets import Between, GuardedSocket, HeldRooms, SigningSocket
from sglang_pd.srt.handshake.fields import FrameLimits, Side
from sglang_pd.srt.handshake.gate import HandshakeGate
from sglang_pd.srt.handshake.manager_host import ManagerHost, registered_targets
from sglang_pd.srt.handshake.pool_bounds import bounds_frame, bounds_of
from sglang_pd.srt.handshake.prompt_binding import PromptDigests
from sglang_pd.srt.handshake.room_decline import DeclineError, DeclineNotice, decline_frames, parse_decline
from sglang_pd.srt.handshake.room_expiry import RoomTombstones, UnclaimedRooms
from sglang_pd.srt.threads.thread_watch import ThreadRole, ThreadWatch, Watchdog
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.hooks.network import rank_socket_options
from sglang_pd.srt.mem_cache.page_math import bytes_per_page
from sglang_pd.srt.state import current, mode_name

logger = logging.getLogger(__name__)
_MIB = 1 << 20


# ---- the rank socket ----------------------------------------------------------------------------------
def around_manager_init(original, mgr, args, disaggregation_mode, server_args, is_mla_backend=False):
    """Build SGLang's manager with a capped rank socket, then guard the socket and watch the threads."""
    before = threading.enumerate()
    limits = frame_limits(args, type(mgr).__module__, mode_name(disaggregation_mode))
    if limits is None and current().peer_guard.auth is not None:  # fail closed: a secret set, no guard possible
        raise RuntimeError(unguarded_with_secret(type(mgr)))
    with rank_socket_options(zmq_frame_cap(limits) if limits else None, current().peer_guard.curve):
        original(mgr, args, disaggregation_mode, server_args, is_mla_backend)
    if limits is None:
        logger.warning("sglang_pd: %s rank socket is not guarded (only mooncake and nixl are)", type(mgr).__name__)
        return
    _install(mgr, limits, before)


def unguarded_with_secret(manager_cls) -> str:
    """Why a server with a peer secret refuses a KV manager whose rank socket sglang_pd cannot guard."""
    return (f"sglang_pd: {PEER_SECRET_FILE} is set, but the rank socket of {manager_cls.__name__} "
            f"({manager_cls.__module__}) cannot be authenticated (sglang_pd guards mooncake and nixl only): "
            "refusing to serve unauthenticated peers; use --disaggregation-transfer-backend mooncake or nixl, "
            f"or unset {PEER_SECRET_FILE}")


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
    state_types = tuple(str(getattr(t, "value", t)) for t in getattr(args, "state_types", None) or [])
    return FrameLimits(backend, side, int(args.page_size), max_pages + 8, max_frame,
                       staging=bool(envs.SGLANG_DISAGG_STAGING_BUFFER.get()),
                       aux_item_lens=aux_items, aux_slots=aux_slots, state_types=state_types)


def zmq_frame_cap(limits: FrameLimits) -> int:
    """libzmq's hard cap: well above any field's own limit, so most oversize frames reach the gate (logged)."""
    return max(16 * _MIB, 2 * limits.max_frame_bytes)


def with_dcp_place(limits: FrameLimits, mgr) -> FrameLimits:
    """Prefill: `limits` with the manager's DCP size and rank (known once SGLang built it) and, when it
    relays KV out to a larger decode DCP (MLA, DCP 1), its non-draft entries' bytes per token."""
    if limits.side is not Side.PREFILL:
        return limits
    size, rank = int(mgr.dcp_size), int(mgr.dcp_rank)
    relayout = None
    if size == 1 and (mgr.is_mla_backend or mgr.is_hybrid_mla_backend):  # upstream's requires_dcp_relayout
        items = list(mgr.kv_args.kv_item_lens)
        relayout = tuple(n // limits.page_size for n in items[:len(items) - int(mgr.kv_args.num_draft_entries)])
    return dataclasses.replace(limits, dcp_size=size, dcp_rank=rank, dcp_relayout_token_bytes=relayout)


def _install(mgr, limits: FrameLimits, before) -> None:
    limits = with_dcp_place(limits, mgr)
    prefill = limits.side is Side.PREFILL
    state = current()
    guard, ttl = state.peer_guard, state.peer_guard.room_ttl_s
    host = ManagerHost(mgr, limits, held_ttl_s=ttl, on_count=state.counters.add)
    guard.tombstones = RoomTombstones(ttl) if prefill else None
    guard.failed_rooms = RoomTombstones(ttl) if prefill else None
    guard.digests = PromptDigests() if prefill else None
    guard.gate = HandshakeGate(limits, host, guard.auth, UnclaimedRooms(ttl) if prefill else None,
                               guard.tombstones, on_count=state.counters.add, capture=state.settings.fault_injection,
                               digests=guard.digests, failed_rooms=guard.failed_rooms)
    hold = prefill and _reader_comes_straight_back(mgr, limits)
    mgr.server_socket = GuardedSocket.around(mgr.server_socket, guard.gate, on_error=_count_gate_error,
                                             before_admit=_injected_reader_exit, hold=hold)
    if hold:  # a transfer worker's pop of a finished room waits for the same turn as a clear
        mgr.transfer_infos = HeldRooms(mgr.transfer_infos, mgr.server_socket, _count_room_pop_turn)
    guard.bootstrap_hold = "on" if hold else ("off: --enable-pd-role-switch" if prefill else "decode: none")
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


def _reader_comes_straight_back(mgr, limits: FrameLimits) -> bool:
    """Whether prefill's bootstrap thread calls the socket's recv_multipart again right after handling a
    message (the hold is released there). Not with mooncake under --enable-pd-role-switch: SGLang then
    polls the raw socket for up to 500 ms first, and every clear would wait for that poll; the hold is
    off there (logged; `bootstrap_hold` in /sglang_pd/stats) and upstream's race stays."""
    if limits.backend != "mooncake" or mgr.deferred_bootstrap is not None:
        return True
    if not getattr(mgr.server_args, "enable_pd_role_switch", False):
        return True
    logger.warning("sglang_pd: --enable-pd-role-switch: prefill's bootstrap thread polls before each recv, so a "
                   "request's clear is not kept out of its handling of a message (SGLang 0.5.23's race on a "
                   "cleared room stays: the thread can die of a KeyError, /health then answers 503)")
    return False


def expected_threads(mgr, side: Side) -> dict[ThreadRole, int] | None:
    """The PD threads SGLang's manager runs once built (None while prefill's queues do not exist yet)."""
    if side is Side.DECODE:
        return {ThreadRole.STATUS_LISTENER: 1, ThreadRole.HEARTBEAT: 1}
    queues = getattr(mgr, "transfer_queues", None)
    return None if queues is None else {ThreadRole.BOOTSTRAP: 1, ThreadRole.TRANSFER_WORKER: len(queues)}


def _on_thread_death(name: str, role: ThreadRole) -> None:
    logger.error("sglang_pd: PD thread %r (%s) is dead: this server can no longer pair requests with its peers; "
                 "/health now answers 503 (restart the server)", name, role.value)
    state = current()
    state.counters.set("pd_threads_dead", len(state.peer_guard.dead_threads()))


def _injected_reader_exit() -> None:
    """Test-only (SGLANG_PD_ENABLE_FAULT_INJECTION): end the reading thread as an upstream parse error would."""
    if current().faults.take(Fault.RANK_READER_EXIT):
        raise RuntimeError("sglang_pd test fault rank_reader_exit: the rank socket's reading thread ends here")


def _count_gate_error(doing: str) -> None:
    """Called inside the except block of the gate's caller: counted and logged, the message dropped."""
    state = current()
    state.peer_guard.num_gate_errors += 1
    state.hook_failed("handshake_gate", "while %s; the message was dropped", doing)


# ---- outgoing messages ----------------------------------------------------------------------------------
def before_send_multipart_locked(mgr, endpoint, parts, is_ipv6=False):
    """Append the auth trailer to what this manager sends a peer (no-op without a secret)."""
    auth = current().peer_guard.auth
    if auth is None:
        return None
    parts = [bytes(p) for p in parts]
    return (mgr, endpoint, parts + auth.sign_frames(parts)), {"is_ipv6": is_ipv6}


def after_build_receiver_registration_message(result, mgr):
    """Decode: its registration ends with the pool-bounds frame (pool_bounds.py: its KV pages, aux slots and
    state slots per state type); prefill's gate takes it off and refuses transfer infos naming an index
    beyond them."""
    return [*result, bounds_frame(bounds_of(mgr.kv_args))]


def after_build_receiver_metadata_message(result, mgr, *, bootstrap_room, required_dst_info_num, kv_indices,
                                          aux_index, state_indices, decode_prefix_len, is_dummy,
                                          device_kv_indices=None):
    """Decode: a transfer info built while its request's send is under way ends with the prompt digest
    frame (prompt_binding.py); prefill's gate takes it off and checks it against its own request."""
    frame = current().peer_guard.outgoing.frame_for(int(bootstrap_room))
    return result if frame is None else [*result, frame]


def around_receiver_connect(original, cls, endpoint, is_ipv6=False):
    """Decode's PUSH sockets to prefill ranks sign every message (no-op without a secret), and with
    SGLANG_PD_PEER_CURVE=1 are CURVE clients (the receivers' shared context makes them so; checked). A
    classmethod upstream: SGLang's registry hands the hook the class first."""
    guard = current().peer_guard
    if guard.curve is not None:
        curve_keys.set_context_defaults(cls._ctx, curve_keys.client_options(guard.curve))
    sock, lock = original(cls, endpoint, is_ipv6)
    if guard.curve is not None:
        curve_keys.check_socket(sock, server=False, what=f"decode's socket to {endpoint}")
    return (sock, lock) if guard.auth is None else (SigningSocket.around(sock, guard.auth), lock)


def after_manager_connect(result, mgr, endpoint, is_ipv6=False):
    """With SGLANG_PD_PEER_CURVE=1, every PUSH socket a manager made to a peer's rank socket must be a CURVE
    client (its context's defaults, set when the rank socket was bound, make it one): checked, never used
    in the clear."""
    if current().peer_guard.curve is not None:
        curve_keys.check_socket(result, server=False, what=f"{type(mgr).__name__}'s socket to {endpoint}")
    return result


def after_sender_init(result, sender, mgr, bootstrap_addr, bootstrap_room, req_has_disagg_prefill_dp_rank=False):
    """Record the room as claimed by a local request; fail it at once if a rejected message failed it before."""
    guard = current().peer_guard
    tombstones, host = guard.tombstones, guard.host
    if host is not None:
        host.claimed.add(int(bootstrap_room))
        if host.forget_held_tell(int(bootstrap_room)):  # the old request's decode is left to its timeout
            current().counters.add("prefill_failure_tells_dropped_total")
    if guard.failed_rooms is not None:  # a new request on the room: later transfer infos are for it
        guard.failed_rooms.discard(int(bootstrap_room))
    reason = tombstones.take(int(bootstrap_room)) if tombstones is not None else None
    if reason is not None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        mgr.record_failure(int(bootstrap_room), reason)
        mgr.update_status(int(bootstrap_room), KVPoll.Failed)
    return result


def around_sender_clear(original, sender):
    """Prefill: SGLang clears the request's sender (upstream's end of a room's life here) only while the
    bootstrap thread is between two messages (guarded_socket.py: its handling of a transfer info for this
    room read `transfer_infos[room]` again after a clear popped it, and the thread died of the KeyError).
    A request that failed here after its decode's transfer info came (an abort on prefill before its
    forward, or during its transfer) has its decode told, with the reason (SGLang tells it only when a
    transfer fails: decode held the pages and prefix lock until its waiting timeout); not for a room decode
    itself declined; and only once no write into decode's pages can still land (ManagerHost.tell_failed:
    during a transfer the message waits for the worker's writes to settle).
    Then the room is no longer bound to its prompt (prompt_binding.py) nor claimed; if the request failed
    (bootstrap timeout, abort, a failed transfer) the room is remembered with the reason SGLang recorded,
    for the gate to refuse a decode transfer info that arrives after (SGLang would re-create the room)."""
    current().counters.add("prefill_sender_clears_total")
    sock = getattr(sender.kv_mgr, "server_socket", None)
    guarded = isinstance(sock, GuardedSocket)  # else a backend we do not guard (no hold, no host)
    with sock.between_messages() if guarded else contextlib.nullcontext() as turn:
        if guarded:
            _count_turn(turn, sender, sock.hold_wait_s)
        waiting = _decodes_waiting(sender)
        result = original(sender)
        _tell_decodes_of_failure(sender, waiting)
        _after_clear(sender)
    return result


def _decodes_waiting(sender) -> list[tuple[str, int]]:
    """Registered decode endpoints whose transfer info for the sender's room SGLang holds (read before the
    clear pops it); empty for a room decode declined (it asked for the failure) or without a room."""
    guard = current().peer_guard
    room = sender.bootstrap_room
    if room is None or guard.host is None or int(room) in guard.declining:
        return []
    infos = dict(sender.kv_mgr.transfer_infos.get(int(room)) or {})
    return registered_targets(infos, guard.host.registered_peer)


def _tell_decodes_of_failure(sender, targets: list[tuple[str, int]]) -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    host = current().peer_guard.host
    if sender.bootstrap_room is None or host is None:
        return
    room = int(sender.bootstrap_room)
    targets = host.not_yet_told_failed(room, targets)  # e.g. a failed transfer: SGLang's worker told them
    if not targets or getattr(sender, "conclude_state", None) != KVPoll.Failed:
        return
    why = sender.kv_mgr.failure_records.get(room) or "failed (no reason recorded)"
    # while a transfer worker may still write into decode's pages: held, told once they settle (counted then)
    if host.tell_failed(room, targets, f"prefill's request failed: {why}", counter="prefill_failures_told_total"):
        host.forget_told(room)  # sent after the room's clear: nothing later would forget the note of it
        current().counters.add("prefill_failures_told_total")


def after_send_kv_status_message(result, mgr, *, targets, bootstrap_room, status, failure_reason=None):
    """Prefill: remember which decode endpoints were sent a Failed status for a room (SGLang's transfer
    workers tell decode of a failed transfer), so the clear's tell does not send it twice."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    host = current().peer_guard.host
    if (host is not None and host.limits.side is Side.PREFILL and getattr(host, "mgr", None) is mgr
            and status == KVPoll.Failed and targets):
        host.note_failed_sent(int(bootstrap_room), targets)
    return result


def _report_turn(turn: Between, waited: str, timed_out: str, message: str, *args) -> None:
    """Count a change of the rooms that waited for the bootstrap thread (`waited`), or one that waited the
    whole cap and ran anyway (`timed_out`, also logged with `message`)."""
    state = current()
    if turn is Between.WAITED:
        state.counters.add(waited)
    elif turn is Between.TIMED_OUT:
        state.counters.add(timed_out)
        logger.error(message + " (if that message names this room, SGLang's thread may die of it: /health then "
                     "answers 503)", *args)


def _count_turn(turn: Between, sender, wait_s: float) -> None:
    _report_turn(turn, "clears_waited_for_bootstrap_total", "clear_bootstrap_wait_timeouts_total",
                 "sglang_pd: clearing room %s: prefill's bootstrap thread held one message for over %g s; "
                 "cleared anyway", sender.bootstrap_room, wait_s)


def _count_room_pop_turn(turn: Between, room) -> None:
    """HeldRooms' report: a removal from `transfer_infos` outside a clear (a transfer worker done with a room)."""
    _report_turn(turn, "room_pops_waited_for_bootstrap_total", "room_pop_bootstrap_wait_timeouts_total",
                 "sglang_pd: removing room %s from prefill's transfer infos: the bootstrap thread held one message "
                 "past the wait's cap; removed anyway", room)


def _after_clear(sender) -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    guard = current().peer_guard
    if sender.bootstrap_room is None:
        return
    room = int(sender.bootstrap_room)
    if guard.host is not None:  # SGLang popped the room: a transfer info arriving now is nobody's (TTL expiry)
        guard.host.claimed.discard(room)
    if guard.digests is not None:
        guard.digests.unbind(room, sender)
    if guard.failed_rooms is not None and getattr(sender, "conclude_state", None) == KVPoll.Failed:
        why = sender.kv_mgr.failure_records.get(room) or "failed (no reason recorded)"
        guard.failed_rooms.bury(room, why)


def after_prepare_send_indices(result, sender, kv_indices, state_indices=None):
    """Count the KV pages the sender really hands to its transport (after CP/shard filtering)."""
    page_indices, _index_slice, _is_last, should_skip = result
    if not should_skip:
        state = current()
        try:
            state.prefill_log.record_pages_sent(int(sender.bootstrap_room), len(page_indices),
                                                len(page_indices) * bytes_per_page(sender.kv_mgr.kv_args))
        except Exception:
            state.hook_failed("prepare_send_indices", "failed to count sent pages")
    return result


def consume_decline_first(original, mgr, msg) -> bool:
    """Prefill: consume a room decline before upstream's ABORT parser sees it; else upstream's handling.

    `original` is the manager's `_handle_abort_notification`, which upstream calls first on every
    message of its bootstrap thread (already admitted by the gate, auth trailer removed). Returns
    True when the message was consumed (upstream skips it).
    """
    if mode_name(mgr.disaggregation_mode) == "prefill" and _consume_decline(mgr, msg):
        return True
    return original(mgr, msg)


# ---- room decline ----------------------------------------------------------------------------------
def send_decline(receiver, notice: DeclineNotice) -> int:
    """Decode: tell every prefill rank of `receiver`'s room to drop it and answer with `notice`.

    The receiver must be initialised (its prefill ranks resolved). Marks it abort-notified, so its
    cleanup sends no second (upstream) ABORT. Returns the ranks told; raises RuntimeError when there
    is no rank to tell, zmq errors when a send fails (nothing is marked then).
    """
    infos = getattr(receiver, "bootstrap_infos", None)
    if not infos:
        raise RuntimeError(f"room {notice.room}: no prefill rank resolved to decline to")
    frames = decline_frames(notice, receiver.kv_mgr.local_ip, receiver.kv_mgr.rank_port)
    for info in infos:
        sock, lock = receiver._connect_to_bootstrap_server(info)
        with lock:
            sock.send_multipart(frames)
    receiver.abort_notified = True
    return len(infos)


def _fail_room_if_known(mgr, room: int, message: str) -> bool:
    """Fail `room` in prefill's manager if it exists and is not done (the bootstrap poll then answers)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    status = mgr.request_status.get(room)
    if status is None or status == KVPoll.Success:
        return False
    mgr.record_failure(room, message)
    mgr.update_status(room, KVPoll.Failed)
    return True


def _consume_decline(mgr, msg) -> bool:
    """Prefill's bootstrap thread: True when `msg` was a decline (handled here, never parsed upstream)."""
    state = current()
    try:
        notice = parse_decline(msg)
    except DeclineError as exc:
        state.counters.add("prefill_declines_malformed_total")
        logger.error("sglang_pd: dropped a malformed room decline: %s", exc)
        return True
    if notice is None:
        return False
    state.room_declines.receive(notice, lambda room, message: _fail_room_if_known(mgr, room, message))
    return True


def fail_declined_room(mgr, room: int) -> bool:
    """Prefill's scheduler: `room` was just created; fail it at once if a decline already waits for it."""
    return current().room_declines.on_room_created(room, lambda r, message: _fail_room_if_known(mgr, r, message))
