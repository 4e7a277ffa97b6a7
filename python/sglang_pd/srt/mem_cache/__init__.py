"""srt/mem_cache - page math, the decode_prefix_len rules, lock ledger, tree integrity.

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.mem_cache.lock_ledger import LockLedger, LockState, owner_scope
from sglang_pd.srt.mem_cache.page_math import (
    RequestKind, bytes_per_page, kv_to_page_num, maybe_cache_unfinished_req, page_align_floor, request_kind,
    request_kv_len)
from sglang_pd.srt.mem_cache.prefix_len import check_for_prompt, check_in_pool
from sglang_pd.srt.mem_cache.tree_integrity import IntegrityReport, check_integrity

__all__ = [
    "IntegrityReport", "LockLedger", "LockState", "RequestKind", "bytes_per_page", "check_for_prompt",
    "check_in_pool", "check_integrity", "kv_to_page_num", "maybe_cache_unfinished_req", "owner_scope",
    "page_align_floor", "request_kind", "request_kv_len"]
