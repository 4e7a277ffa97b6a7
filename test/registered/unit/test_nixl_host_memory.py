"""NIXL host-memory pieces: progress thread off only inside a host-memory manager's scope, the stall
bound per worker thread (real nixl_agent_config objects; the transfer-state strings are NIXL's own)."""

import threading

import pytest

from sglang_pd.config import Settings
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.hooks.connection import nixl_api
from sglang_pd.srt.state import ProcessKind, build_state, install

pytestmark = pytest.mark.unit


@pytest.fixture
def state():
    state = build_state(ProcessKind.SCHEDULER, Settings(nixl_stall_timeout_s=60, fault_injection=True))
    previous = install(state)
    yield state
    install(previous)


def _config(**kwargs):
    from nixl._api import nixl_agent_config

    config = nixl_agent_config.__new__(nixl_agent_config)
    args, kw = (config,), kwargs
    changed = nixl_api.before_agent_config_init(config, **kwargs)
    if changed is not None:  # what HookRegistry does with a BEFORE hook's (args, kwargs)
        args, kw = changed
    nixl_agent_config.__init__(*args, **kw)
    return config


def test_progress_thread_off_only_for_host_memory_managers(state):
    assert _config(backends=[], num_threads=8).enable_pthread is True  # e.g. hicache's own agent
    with state.nixl_host_memory.entered(True):
        config = _config(backends=[], num_threads=8)
        assert config.enable_pthread is False and config.num_threads == 8  # the rest passed through
    assert not state.nixl_host_memory.active()


def test_stall_past_the_deadline_is_cancelled_then_failed(state):
    watch = state.transfer_watch
    cancels = []
    cancel = lambda: cancels.append(1) or True  # noqa: E731  NIXL confirmed the transfer stopped
    watch.on_chunk(5)
    assert watch.check("PROC", cancel) == "PROC"                      # outside an awaited batch
    with watch.armed(now_s=1000.0):
        assert watch.check("PROC", cancel, now_s=1059.0) == "PROC"   # within the bound
        assert watch.check("DONE", cancel, now_s=1061.0) == "DONE"   # finished is finished
        assert cancels == []
        assert watch.check("PROC", cancel, now_s=1061.0) == "ERR"    # past it: cancelled, then failed
        assert cancels == [1]
    assert state.prefill_log.snapshot()["num_nixl_stalls"] == 1
    state.faults.arm_room(Fault.NIXL_STALL, 6)
    watch.on_chunk(6)
    with watch.armed(now_s=1000.0):
        assert watch.check("DONE", cancel, now_s=1001.0) == "PROC"   # injected stall never finishes...
        assert watch.check("DONE", cancel, now_s=1061.0) == "ERR"    # ...until the bound cancels it


def test_a_transfer_nixl_cannot_cancel_is_never_reported_failed(state):
    """It may still write into decode's pages: it keeps reading as running, cancel retried each second."""
    watch, attempts = state.transfer_watch, []
    cannot = lambda: attempts.append(1) and False  # noqa: E731
    watch.on_chunk(7)
    with watch.armed(now_s=0.0):
        assert watch.check("PROC", cannot, now_s=61.0) == "PROC"
        assert watch.check("PROC", cannot, now_s=61.5) == "PROC" and len(attempts) == 1  # rate-limited
        assert watch.check("PROC", cannot, now_s=62.1) == "PROC" and len(attempts) == 2
        assert watch.check("DONE", cannot, now_s=63.0) == "DONE"  # it finished on its own
    assert state.counters.get("nixl_uncancellable_stalls_total") == 1
    assert state.prefill_log.snapshot()["num_nixl_stalls"] == 0


def test_a_handle_we_cancelled_is_not_read_again(state):
    """NIXL frees a released handle: the hook answers ERR without touching it."""
    from sglang_pd.srt.hooks.connection.nixl_api import around_check_xfer_state

    class Released:
        _released = True  # what nixl_xfer_handle.release() sets

    def original(agent, handle):
        raise AssertionError("a released handle must not be read")

    assert around_check_xfer_state(original, None, Released()) == "ERR"


def test_each_worker_thread_has_its_own_room_and_deadline(state):
    watch = state.transfer_watch
    watch.on_chunk(1)
    seen = {}

    def other():
        seen["room"] = watch.room()
        watch.on_chunk(2)
        seen["after"] = watch.room()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == {"room": None, "after": 2} and watch.room() == 1


def test_stall_timeout_comes_from_settings():
    from sglang_pd.config import SettingsError

    assert build_state(ProcessKind.SCHEDULER, Settings.from_env({})).transfer_watch.timeout_s == 60
    assert build_state(ProcessKind.SCHEDULER, Settings.from_env(
        {"SGLANG_PD_NIXL_STALL_TIMEOUT_S": "2.5"})).transfer_watch.timeout_s == 2.5
    for bad, msg in (("soon", "is not a number"), ("0", "must be > 0")):
        with pytest.raises(SettingsError, match=msg):
            Settings.from_env({"SGLANG_PD_NIXL_STALL_TIMEOUT_S": bad})
