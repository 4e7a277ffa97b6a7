"""The one predicate every decode hook asks: does sglang_pd take over this prealloc queue's requests?"""

from __future__ import annotations


def owns_decode_queue(queue) -> bool:
    """Decode radix cache on a plain (full-attention, device-only) tree: the path sglang_pd owns.

    Hybrid trees (SWA tail, mamba), HiSparse and decode-side HiCache keep SGLang's own paths: their
    prefixes are not plain device pages that our admission, rounds and resume account for.
    """
    from sglang.srt.runtime_context import get_disagg

    return bool(get_disagg().disaggregation_decode_enable_radix_cache
                and not queue._uses_swa_tail_prealloc()
                and not queue.tree_cache.supports_mamba()
                and not queue.scheduler.enable_hisparse
                and not queue.scheduler.enable_decode_hicache)
