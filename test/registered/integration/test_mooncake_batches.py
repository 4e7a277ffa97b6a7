"""Mooncake over TCP, two real engines in two processes: a batch over the transport's per-peer queue
limit lands byte for byte when our hook sends it in parts, and is refused (rc -1) when sent as one.
Upstream's own `MooncakeKVManager._transfer_data` and engine wrapper do the sending, on a real
TransferEngine."""

import multiprocessing as mp
from types import SimpleNamespace

import numpy as np
import pytest

from sglang_pd.config import Settings
from sglang_pd.srt.hooks.connection.mooncake_conn import around_transfer_data
from sglang_pd.srt.state import ProcessKind, build_state, install

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
NUM_DESCRIPTORS = 6000  # ~24 layers x K/V of a 125-token fragmented prompt at page size 1
ITEM = 1024
BUF = 2 * NUM_DESCRIPTORS * ITEM


def _engine():
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    assert engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "") == 0
    return engine


def _target(queue, done, result):
    engine = _engine()
    buf = np.zeros(BUF, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    queue.put((f"{HOST}:{engine.get_rpc_port()}", buf.ctypes.data))
    done.wait(120)
    result.put(buf[::ITEM].tobytes())  # first byte of every slot


@pytest.fixture
def state():
    previous = install(build_state(ProcessKind.SCHEDULER, Settings()))
    yield
    install(previous)


def test_oversized_batch_is_refused_whole_and_lands_in_parts(state):
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import MooncakeTransferEngine

    ctx = mp.get_context("spawn")
    queue, result, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    target = ctx.Process(target=_target, args=(queue, done, result), daemon=True)
    target.start()
    try:
        session, remote = queue.get(timeout=60)
        engine = _engine()
        src = np.arange(BUF // ITEM, dtype=np.uint8).repeat(ITEM) | 1  # every slot nonzero
        assert engine.register_memory(src.ctypes.data, src.nbytes) == 0
        slots = np.arange(0, 2 * NUM_DESCRIPTORS, 2)  # every other slot: nothing merges
        blocks = [(src.ctypes.data + s * ITEM, remote + s * ITEM, ITEM) for s in slots.tolist()]
        wrapper = MooncakeTransferEngine.__new__(MooncakeTransferEngine)  # upstream's wrapper, on our engine
        wrapper.engine = engine
        mgr = SimpleNamespace(engine=wrapper)
        assert around_transfer_data(MooncakeKVManager._transfer_data, mgr, session, blocks) == 0
        # The same batch whole is refused (and, seen here, leaves the session refusing later batches
        # too: what made upstream blacklist the decode session), so it goes last.
        assert MooncakeKVManager._transfer_data(mgr, session, blocks) != 0, "the transport accepted it whole"
        done.set()
        landed = np.frombuffer(result.get(timeout=60), dtype=np.uint8)
        assert (landed[slots] == src[slots * ITEM]).all() and (landed[slots + 1] == 0).all()
    finally:
        done.set()
        target.join(30)
        if target.is_alive():
            target.kill()
