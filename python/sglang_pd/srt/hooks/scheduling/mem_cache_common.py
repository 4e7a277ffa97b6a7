"""Hooks on SGLang's `mem_cache/common.py`: checkpoint_kv_cache through maybe_cache_unfinished_req, and
(tests only) the KV probe at release_kv_cache."""

from __future__ import annotations

from sglang_pd.srt.fault_injection import Fault, read_kv
from sglang_pd.srt.mem_cache import maybe_cache_unfinished_req
from sglang_pd.srt.state import current


def replace_checkpoint_kv_cache(req, tree_cache) -> None:
    """Same contract as SGLang's checkpoint_kv_cache, plus: warmup/health/fake never enter the tree."""
    maybe_cache_unfinished_req(req, tree_cache)


def before_release_kv_cache(req, tree_cache, *, checkpoint):
    """Test probe KV_PROBE: copy the prompt's KV (every layer, every prompt position of the row) of the
    room's request before its row is released, kept for the test to read (`kv_probes`). Read-only."""
    faults = current().faults
    if not faults.enabled or req.bootstrap_room is None or not req.kv.holds_kv:
        return None
    room = int(req.bootstrap_room)
    if faults.take(Fault.KV_PROBE, room):
        slots = tree_cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :len(req.origin_input_ids)]
        faults.keep_probe(room, read_kv(tree_cache.token_to_kv_pool_allocator.get_kvcache(), slots.long()))
    return None
