"""NIXL host-memory pieces: progress thread off only inside a host-memory manager's scope, the stall
bound per worker thread (real nixl_agent_config objects; the transfer-state strings are NIXL's own)."""

import threading

import pytest

from sglang_pd.config import Settings
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.hooks import nixl_api
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


def test_stall_deadline_turns_unfinished_into_err(state):
    watch = state.nixl_stall
    watch.on_chunk(5)
    assert watch.check("PROC") == "PROC"                      # outside an awaited batch
    with watch.armed(now_s=1000.0):
        assert watch.check("PROC", now_s=1059.0) == "PROC"   # within the bound
        assert watch.check("PROC", now_s=1061.0) == "ERR"    # past it
        assert watch.check("DONE", now_s=1061.0) == "DONE"   # finished is finished
    assert state.prefill_log.snapshot()["num_nixl_stalls"] == 1  # counted once per batch
    state.faults.arm_room(Fault.NIXL_STALL, 6)
    watch.on_chunk(6)
    with watch.armed(now_s=1000.0):
        assert watch.check("DONE", now_s=1001.0) == "PROC"   # injected stall never finishes...
        assert watch.check("DONE", now_s=1061.0) == "ERR"    # ...until the bound fails it


def test_each_worker_thread_has_its_own_room_and_deadline(state):
    watch = state.nixl_stall
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

    assert build_state(ProcessKind.SCHEDULER, Settings.from_env({})).nixl_stall.timeout_s == 60
    assert build_state(ProcessKind.SCHEDULER, Settings.from_env(
        {"SGLANG_PD_NIXL_STALL_TIMEOUT_S": "2.5"})).nixl_stall.timeout_s == 2.5
    for bad, msg in (("soon", "is not a number"), ("0", "must be > 0")):
        with pytest.raises(SettingsError, match=msg):
            Settings.from_env({"SGLANG_PD_NIXL_STALL_TIMEOUT_S": bad})
