"""Hook on SGLang's `mem_cache/common.py`: checkpoint_kv_cache through maybe_cache_unfinished_req."""

from __future__ import annotations

from sglang_pd.srt.mem_cache.common import maybe_cache_unfinished_req


def replace_checkpoint_kv_cache(req, tree_cache) -> None:
    """Same contract as SGLang's checkpoint_kv_cache, plus: warmup/health/fake never enter the tree."""
    maybe_cache_unfinished_req(req, tree_cache)
