"""Hooks on the `nixl` package's agent API (nixl/_api.py): progress thread off for host memory, stall bound."""

from __future__ import annotations

from sglang_pd.srt.state import current


def before_agent_config_init(config, enable_prog_thread=True, enable_listen_thread=False, listen_port=8888,
                             capture_telemetry=False, num_threads=0, backends=["UCX"], sync_mode=None):  # noqa: B006
    """Inside a host-memory NixlKVManager: no busy-polling progress thread (the worker drives progress)."""
    if not current().nixl_host_memory.active():
        return None
    return (config,), dict(enable_prog_thread=False, enable_listen_thread=enable_listen_thread,
                           listen_port=listen_port, capture_telemetry=capture_telemetry, num_threads=num_threads,
                           backends=list(backends), sync_mode=sync_mode)


def around_check_xfer_state(original, agent, handle):
    """Past this worker's deadline an unfinished transfer is cancelled, then reads as ERR (upstream then
    fails the room and tells decode). A handle we released is not read again: NIXL freed it."""
    if getattr(handle, "_released", False):  # nixl_xfer_handle's own flag, set only by a successful release
        return "ERR"
    return current().transfer_watch.check(original(agent, handle), cancel=lambda: _cancel(agent, handle))


def _cancel(agent, handle) -> bool:
    """Release (cancel) a transfer; True only if NIXL confirms it: an active transfer it cannot cancel raises."""
    try:
        agent.release_xfer_handle(handle)
    except Exception:
        return False
    return True
