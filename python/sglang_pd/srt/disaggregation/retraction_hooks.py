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


def _cpu_backup_of_plain_kv(allocator) -> bool:
    """Retraction backs KV up as CPU tensors of a plain MHA pool (the layout RadixResume slices)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.runtime_context import get_disagg

    return (get_disagg().disaggregation_decode_retraction_backup == "cpu_tensor"
            and type(allocator.get_kvcache()).get_cpu_copy is MHATokenToKVPool.get_cpu_copy)


def _is_resume(queue, req) -> bool:
    """`_pre_alloc` called by resume_retracted_reqs for a request backed up to CPU tensors."""
    return (req.kv.retraction_backup is not None and _cpu_backup_of_plain_kv(queue.token_to_kv_pool_allocator)
            and any(r is req for r in queue.retracted_queue))


def around_pre_alloc(original, queue, req, prefix_indices=None, prefix_len=None, total_prefix_len=None):
    """A resumed request gets its re-matched prefix (locked) and only the rest preallocated."""
    if (prefix_indices is not None or not config.enabled(SETTING) or not plain_radix_decode(queue)
            or not _is_resume(queue, req)):
        return original(queue, req, prefix_indices, prefix_len, total_prefix_len)
    from sglang.srt.mem_cache.common import match_kv_cache

    tree = queue.tree_cache
    try:
        plan = STATE.radix_resume.match_and_lock(req, tree, queue._pre_alloc_fill_len(req), match_kv_cache)
        indices = tree.prefix_device_indices(req) if plan.prefix_len else None
    except Exception:  # never take the scheduler down: resume the upstream way, holding nothing
        STATE.count_hook_error("radix_resume")
        logger.exception("sglang_pd: radix-aware resume of %s failed; restoring it in full", req.rid)
        STATE.radix_resume.abandon(req, tree)
        return original(queue, req, None, None, None)
    if plan.prefix_len == 0:
        return original(queue, req, None, None, None)
    out = original(queue, req, indices, plan.prefix_len, plan.prefix_len)
    req.kv.cache_protected_len = plan.prefix_len  # the tree owns [0, prefix_len) of the row
    return out


def around_load_kv_cache(original, req, req_to_token_pool, token_to_kv_pool_allocator):
    """Restore only what resume did not take from the tree (full restore when it has no plan)."""
    def load_all():
        original(req, req_to_token_pool, token_to_kv_pool_allocator)

    try:
        restored = STATE.radix_resume.restore(req, req_to_token_pool, token_to_kv_pool_allocator, load_all)
    except Exception:  # the tree's prefix slots hold the same KV, so a full restore is still correct
        STATE.count_hook_error("radix_resume_restore")
        logger.exception("sglang_pd: partial restore of %s failed; restoring it in full", req.rid)
        restored = False
    if not restored and req.kv.retraction_backup is not None:
        load_all()
