"""Hooks on SGLang's common KV transfer classes (disaggregation/common/conn.py), shared by the mooncake
and NIXL managers (subclasses of CommonKVManager). Thin: they read SGLang's objects and call the logic in
srt/handshake/ (rank_socket, gate, sockets, manager_host, prefill_rooms, decline_delivery, pool_bounds,
prompt_binding) and srt/auth/.

- CommonKVManager.__init__ (AROUND): bind the rank socket with a frame cap, put the `HandshakeGate`
  in front of it (every receiving thread of both backends reads it), watch the PD threads.
- CommonKVManager._send_multipart_locked (BEFORE) and CommonKVReceiver._connect (AROUND): every
  message prefill sends decode and decode sends prefill carries the auth trailer when a secret is set.
- CommonKVSender.__init__ (AFTER) / CommonKVSender.clear (AROUND): the room's life around its request
  (prefill_rooms.py); the clear runs only while prefill's bootstrap thread is between two messages
  (sockets.py; a clear inside its handling of a transfer info ended the thread).
- CommonKVSender._prepare_send_indices (AFTER): KV pages really handed to the transport, per room.
- Mooncake/NixlKVManager.build_receiver_registration_message (AFTER): decode's registration ends with its
  pools' bounds (pool_bounds.py); build_receiver_metadata_message (AFTER): its prompt digest.
- room declines consumed on prefill's bootstrap thread (decline_delivery.py; decode sends them with
  `decline_delivery.send_decline`).
"""

from __future__ import annotations

import contextlib
import logging
import threading

from sglang_pd.srt.auth import curve_keys, receiver_name
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.handshake import consume_decline, fail_room_if_known
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.handshake import HandshakeGate
from sglang_pd.srt.handshake import ManagerHost
from sglang_pd.srt.wire import bounds_frame, bounds_of
from sglang_pd.srt.handshake import PrefillRooms
from sglang_pd.srt.wire import PromptDigests
from sglang_pd.srt.handshake import (expected_threads, frame_limits, reader_comes_straight_back,
                                                 unguarded_with_secret, with_dcp_place, zmq_frame_cap)
from sglang_pd.srt.handshake import RoomTombstones, UnclaimedRooms
from sglang_pd.srt.handshake import Between, GuardedSocket, HeldRooms, SigningSocket
from sglang_pd.srt.hooks.connection.network import rank_socket_options
from sglang_pd.srt.mem_cache import bytes_per_page
from sglang_pd.srt.state import current, mode_name
from sglang_pd.srt.threads import ThreadRole, ThreadWatch, Watchdog

logger = logging.getLogger(__name__)


# ---- the rank socket ----------------------------------------------------------------------------------
def around_manager_init(original, mgr, args, disaggregation_mode, server_args, is_mla_backend=False):
    """Build SGLang's manager with a capped rank socket, then guard the socket and watch the threads."""
    from sglang.srt.environ import envs

    before = threading.enumerate()
    limits = frame_limits(args, type(mgr).__module__, mode_name(disaggregation_mode),
                          staging=bool(envs.SGLANG_DISAGG_STAGING_BUFFER.get()))
    if limits is None and current().peer_guard.auth is not None:  # fail closed: a secret set, no guard possible
        raise RuntimeError(unguarded_with_secret(type(mgr)))
    if mode_name(disaggregation_mode) == "prefill":  # SGLang's __init__ registers its ranks there: before it
        current().peer_guard.bootstrap_addresses.add_prefill_own(
            server_args.host, server_args.disaggregation_bootstrap_port, server_args.dist_init_addr)
    with rank_socket_options(zmq_frame_cap(limits) if limits else None, current().peer_guard.curve):
        original(mgr, args, disaggregation_mode, server_args, is_mla_backend)
    if limits is None:
        logger.warning("sglang_pd: %s rank socket is not guarded (only mooncake and nixl are)", type(mgr).__name__)
        return
    _install(mgr, limits, before)


def _install(mgr, limits: FrameLimits, before) -> None:
    limits = with_dcp_place(limits, mgr)
    prefill = limits.side is Side.PREFILL
    state = current()
    guard, ttl = state.peer_guard, state.peer_guard.room_ttl_s
    host = ManagerHost(mgr, limits, held_ttl_s=ttl, on_count=state.counters.add)
    guard.tombstones = RoomTombstones(ttl) if prefill else None
    guard.failed_rooms = RoomTombstones(ttl) if prefill else None
    guard.digests = PromptDigests() if prefill else None
    ip = f"[{mgr.local_ip}]" if ":" in str(mgr.local_ip) else mgr.local_ip
    guard.endpoint = f"tcp://{ip}:{mgr.rank_port}"  # what this rank advertises: peers sign for it
    guard.gate = HandshakeGate(limits, host, guard.auth, UnclaimedRooms(ttl) if prefill else None,
                               guard.tombstones, on_count=state.counters.add, capture=state.settings.fault_injection,
                               digests=guard.digests, failed_rooms=guard.failed_rooms, sources=guard.sources,
                               receiver=receiver_name(guard.endpoint),
                               kv_digests=guard.received_kv if guard.kv_digest and not prefill else None)
    hold = prefill and reader_comes_straight_back(mgr, limits)
    mgr.server_socket = GuardedSocket.around(mgr.server_socket, guard.gate, on_error=_count_gate_error,
                                             before_admit=_injected_reader_exit, hold=hold)
    if hold:  # a transfer worker's pop of a finished room waits for the same turn as a clear
        mgr.transfer_infos = HeldRooms(mgr.transfer_infos, mgr.server_socket, _count_room_pop_turn)
    guard.bootstrap_hold = "on" if hold else ("off: --enable-pd-role-switch" if prefill else "decode: none")
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
    return (mgr, endpoint, parts + auth.sign_frames(parts, receiver_name(endpoint))), {"is_ipv6": is_ipv6}


def after_encode_kv_status_message(result, mgr, *, bootstrap_room, status, failure_reason):
    """Prefill, SGLANG_PD_KV_DIGEST on: a room's Success status ends with the digest of the KV it sent
    (wire/kv_digest.py), before the auth trailer; a Failed one drops the room's digest."""
    guard = current().peer_guard
    if not guard.kv_digest:
        return result
    from sglang.srt.disaggregation.base.conn import KVPoll

    if int(status) != int(KVPoll.Success):
        guard.sent_kv.drop(int(bootstrap_room))
        return result
    frame = guard.sent_kv.frame_for(int(bootstrap_room))
    if frame is None:
        return result
    current().counters.add("kv_digests_sent_total")
    return [*result, frame]


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
    return (sock, lock) if guard.auth is None else (SigningSocket.around(sock, guard.auth, endpoint), lock)


def after_manager_connect(result, mgr, endpoint, is_ipv6=False):
    """With SGLANG_PD_PEER_CURVE=1, every PUSH socket a manager made to a peer's rank socket must be a CURVE
    client (its context's defaults, set when the rank socket was bound, make it one): checked, never used
    in the clear."""
    if current().peer_guard.curve is not None:
        curve_keys.check_socket(result, server=False, what=f"{type(mgr).__name__}'s socket to {endpoint}")
    return result


def _prefill_rooms() -> PrefillRooms:
    """The room bookkeeping of this process's guarded manager (pieces left None where none was installed)."""
    state = current()
    guard = state.peer_guard
    return PrefillRooms(guard.host, guard.tombstones, guard.failed_rooms, guard.digests, guard.declining,
                        state.counters.add)


def after_sender_init(result, sender, mgr, bootstrap_addr, bootstrap_room, req_has_disagg_prefill_dp_rank=False):
    """Record the room as claimed by a local request; fail it at once if a rejected message failed it before."""
    reason = _prefill_rooms().claim(int(bootstrap_room))
    if reason is not None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        mgr.record_failure(int(bootstrap_room), reason)
        mgr.update_status(int(bootstrap_room), KVPoll.Failed)
    return result


def around_sender_clear(original, sender):
    """Prefill: SGLang clears the request's sender (upstream's end of a room's life here) only while the
    bootstrap thread is between two messages (sockets.py: its handling of a transfer info for this room
    read `transfer_infos[room]` again after a clear popped it, and the thread died of the KeyError). The
    decodes whose transfer info came are read before the clear and, if the request failed, told after it
    (SGLang tells them only when a transfer fails); then the room's claim ends (prefill_rooms.py)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    current().counters.add("prefill_sender_clears_total")
    sock = getattr(sender.kv_mgr, "server_socket", None)
    guarded = isinstance(sock, GuardedSocket)  # else a backend we do not guard (no hold, no host)
    with sock.between_messages() if guarded else contextlib.nullcontext() as turn:
        if guarded:
            _count_turn(turn, sender, sock.hold_wait_s)
        rooms, room = _prefill_rooms(), sender.bootstrap_room
        waiting = [] if room is None else rooms.decodes_waiting(
            int(room), lambda: sender.kv_mgr.transfer_infos.get(int(room)))
        result = original(sender)
        if room is not None:
            failed = getattr(sender, "conclude_state", None) == KVPoll.Failed
            why = sender.kv_mgr.failure_records.get(int(room)) if failed else None
            rooms.tell_failure(int(room), waiting, failed, why)
            rooms.end_claim(int(room), sender, failed, why)
    return result


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
    state = current()
    if mode_name(mgr.disaggregation_mode) == "prefill" and consume_decline(mgr, msg, state.room_declines,
                                                                            state.counters):
        return True
    return original(mgr, msg)


def fail_declined_room(mgr, room: int) -> bool:
    """Prefill's scheduler: `room` was just created; fail it at once if a decline already waits for it."""
    return current().room_declines.on_room_created(room, lambda r, message: fail_room_if_known(mgr, r, message))
