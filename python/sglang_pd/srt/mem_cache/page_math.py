"""Page math shared by decode admission and prefill transfer planning (the rules for decode_prefix_len
are prefix_len.py's).

All lengths are token counts; all functions are pure (no mutation) and raise ValueError on
arguments that cannot describe a KV layout (page_size < 1, negative lengths).
"""

from __future__ import annotations

import enum


def check_page_size(page_size: int) -> None:
    """Raise ValueError unless page_size >= 1."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")


def page_align_floor(num_tokens: int, page_size: int) -> int:
    """Largest multiple of `page_size` that is <= `num_tokens`."""
    check_page_size(page_size)
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return num_tokens - num_tokens % page_size


def kv_to_page_num(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold `num_tokens` tokens (ceil division)."""
    check_page_size(page_size)
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return -(-num_tokens // page_size)


def bytes_per_page(kv_args) -> int:
    """Bytes one KV page occupies over all layers (K and V): the sum of SGLang's kv_item_lens."""
    return int(sum(kv_args.kv_item_lens))


def request_kv_len(req) -> int:
    """KV tokens a request holds or is about to hold: prompt + generated tokens."""
    return len(req.origin_input_ids) + len(req.output_ids)


class RequestKind(str, enum.Enum):
    """What kind of request reaches the tree: only NORMAL ones may use or enter it."""

    NORMAL = "normal"
    WARMUP = "warmup"            # server warmup / fake bootstrap: no prefill peer
    HEALTH_CHECK = "health_check"


def request_kind(req) -> RequestKind:
    """Classify a request with SGLang's own predicates (health-check rid, fake bootstrap)."""
    from sglang.srt.disaggregation.checksum import is_health_check_req
    from sglang.srt.disaggregation.utils import _is_fake_transfer

    if is_health_check_req(req):
        return RequestKind.HEALTH_CHECK
    if _is_fake_transfer(req):
        return RequestKind.WARMUP
    return RequestKind.NORMAL


def is_tree_exempt(req) -> bool:
    """True for requests whose KV must never enter a radix tree.

    Marked ones (`skip_radix_cache_insert`), health checks and warmup / fake-bootstrap requests
    (no prefill peer): their tokens are synthetic, and caching them would both waste pages and serve
    their KV to real requests that happen to share a prefix.
    """
    return bool(req.skip_radix_cache_insert) or request_kind(req) is not RequestKind.NORMAL


def maybe_cache_unfinished_req(req, tree_cache) -> bool:
    """Publish a running request's computed KV [0, extend_end) into the tree, unless exempt.

    Mutates the tree (insert) and the request (`prefix_len = extend_end`, its row re-pointed at the
    tree's copies), exactly as SGLang's checkpoint contract requires; an exempt request only
    advances `prefix_len`. Returns True iff the tree was offered the KV.
    """
    if req.finished():
        raise ValueError(f"request {req.rid} is finished: release it instead of checkpointing")
    published = not is_tree_exempt(req)
    if published:
        req.skip_radix_cache_insert = False
        tree_cache.checkpoint(req, up_to=req.extend_end)
    else:
        req.skip_radix_cache_insert = True
    req.prefix_len = req.extend_end
    return published
