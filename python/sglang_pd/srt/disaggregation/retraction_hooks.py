"""Thin hooks putting RadixResume on SGLang's decode resume path (retracted request -> running again).

SGLang's `resume_retracted_reqs` calls `_pre_alloc(req)` (no prefix: the whole sequence) and then
`restore_kv_cache` -> `Req.load_kv_cache` (copy the whole backup back). We give `_pre_alloc` the
re-matched, locked prefix instead, and make `load_kv_cache` copy only the rest.
"""

from __future__ import annotations

import logging

from sglang_pd import config
from sglang_pd.process_state import STATE

logger = logging.getLogger(__name__)

SETTING = f"{config.PREFIX}RADIX_RESUME"


def plain_radix_decode(queue) -> bool:
    """Decode radix cache on a plain (full-attention, device-only) tree: the case our paths own."""
    from sglang.srt.runtime_context import get_disagg

    return bool(get_disagg().disaggregation_decode_enable_radix_cache
                and not queue._uses_swa_tail_prealloc()
                and not queue.tree_cache.supports_mamba()
                and not queue.scheduler.enable_hisparse
                and not queue.scheduler.enable_decode_hicache)


def _is_resume(queue, req) -> bool:
    """`_pre_alloc` called by resume_retracted_reqs for a request backed up to CPU tensors."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.runtime_context import get_disagg

    kvcache = queue.token_to_kv_pool_allocator.get_kvcache()
    return (get_disagg().disaggregation_decode_retraction_backup == "cpu_tensor"
            and req.kv.retraction_backup is not None
            and type(kvcache).get_cpu_copy is MHATokenToKVPool.get_cpu_copy
            and any(r is req for r in queue.retracted_queue))


def around_pre_alloc(original, queue, req, prefix_indices=None, prefix_len=None, total_prefix_len=None):
    """A resumed request gets its re-matched prefix (locked) and only the rest preallocated."""
    if (prefix_indices is not None or not config.enabled(SETTING) or not plain_radix_decode(queue)
            or not _is_resume(queue, req)):
        return original(queue, req, prefix_indices, prefix_len, total_prefix_len)
    from sglang.srt.mem_cache.common import match_kv_cache

    tree = queue.tree_cache
    plan = STATE.radix_resume.match_and_lock(req, tree, queue._pre_alloc_fill_len(req), match_kv_cache)
    if plan.prefix_len == 0:
        return original(queue, req, None, None, None)
    indices = tree.prefix_device_indices(req)
    out = original(queue, req, indices, plan.prefix_len, plan.prefix_len)
    req.kv.cache_protected_len = plan.prefix_len  # the tree owns [0, prefix_len) of the row
    return out


def around_load_kv_cache(original, req, req_to_token_pool, token_to_kv_pool_allocator):
    """Restore only what resume did not take from the tree (full restore when it has no plan)."""
    def load_all():
        original(req, req_to_token_pool, token_to_kv_pool_allocator)

    if not STATE.radix_resume.restore(req, req_to_token_pool, token_to_kv_pool_allocator, load_all):
        load_all()
