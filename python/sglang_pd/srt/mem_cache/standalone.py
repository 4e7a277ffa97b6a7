"""SGLang's own KV allocator and radix tree built on CPU without a server (benchmarks, unit tests).

The one place that knows the constructor arguments of these upstream objects, so `bench_admission`
and the unit tier build exactly the same thing the servers use.
"""

from __future__ import annotations

from typing import Any

TREE_KINDS = ("radix", "unified")  # RadixCache (Python nodes) / UnifiedRadixCache (servers' default, Rust core)


def paged_tree(tree_kind: str, pool_tokens: int, page_size: int, kvcache: Any = None,
               req_to_token_pool: Any = None) -> tuple[Any, Any]:
    """A fresh (PagedTokenToKVPoolAllocator, tree) pair of `pool_tokens` slots on CPU.

    `kvcache`: the KV pool behind the allocator (None: slots only, no KV data). Raises ValueError for
    an unknown `tree_kind`.
    """
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    if tree_kind not in TREE_KINDS:
        raise ValueError(f"tree kind {tree_kind!r} is not one of {TREE_KINDS}")
    allocator = PagedTokenToKVPoolAllocator(size=pool_tokens, page_size=page_size, dtype=torch.float32,
                                            device="cpu", kvcache=kvcache, need_sort=False)
    params = CacheInitParams(disable=False, req_to_token_pool=req_to_token_pool,
                             token_to_kv_pool_allocator=allocator, page_size=page_size,
                             tree_components=(ComponentType.FULL,))
    tree = RadixCache(params) if tree_kind == "radix" else UnifiedRadixCache(params)
    return allocator, tree
