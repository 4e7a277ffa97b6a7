"""NIXL host-memory pieces: progress thread off only inside a host-memory manager, the stall bound,
and its configuration (real nixl_agent_config objects; the transfer-state strings are NIXL's own)."""

import time

import pytest

from sglang_pd.srt.disaggregation import nixl_host_memory as nhm

pytestmark = pytest.mark.unit


def _config(*args, **kwargs):
    from nixl._api import nixl_agent_config

    changed = nhm.before_agent_config_init(*args, **kwargs)
    if changed is not None:
        args, kwargs = changed
    return nixl_agent_config(*args, **kwargs)


def test_progress_thread_off_only_for_host_memory_managers():
    assert _config(backends=[], num_threads=8).enable_pthread is True  # e.g. hicache's own agent
    token = nhm._HOST_MEMORY.set(True)
    try:
        assert _config(backends=[], num_threads=8).enable_pthread is False
    finally:
        nhm._HOST_MEMORY.reset(token)


def test_stall_deadline_turns_unfinished_into_err():
    nhm._worker.deadline, nhm._worker.reported, nhm._worker.stalled, nhm._worker.room = \
        time.monotonic() + 60, False, False, 5
    assert nhm.after_check_xfer_state("PROC", None, None) == "PROC"   # within the bound
    nhm._worker.deadline = time.monotonic() - 1
    assert nhm.after_check_xfer_state("PROC", None, None) == "ERR"    # past it
    assert nhm.after_check_xfer_state("DONE", None, None) == "DONE"   # finished is finished
    nhm._worker.stalled = True
    assert nhm.after_check_xfer_state("DONE", None, None) == "ERR"    # injected stall never ends
    nhm._worker.deadline = None
    assert nhm.after_check_xfer_state("PROC", None, None) == "PROC"   # outside an awaited batch


def test_stall_timeout_config(monkeypatch):
    monkeypatch.delenv(nhm.STALL_ENV, raising=False)
    assert nhm.stall_timeout_s() == nhm.DEFAULT_STALL_TIMEOUT_S
    monkeypatch.setenv(nhm.STALL_ENV, "2.5")
    assert nhm.stall_timeout_s() == 2.5
    for bad, msg in (("soon", "is not a number"), ("0", "must be > 0")):
        monkeypatch.setenv(nhm.STALL_ENV, bad)
        with pytest.raises(ValueError, match=msg):
            nhm.stall_timeout_s()
