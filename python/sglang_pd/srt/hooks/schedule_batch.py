"""Hooks on SGLang's `ScheduleBatch` and `Req` (managers/schedule_batch.py): retraction count, partial restore."""

from __future__ import annotations

import logging

from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


def after_retract_decode(result, batch):
    """Count decode retractions (their locks are released through the ledger-checked unlock)."""
    retracted, _ratio, _to_abort = result
    current().counters.add("decode_retractions_total", len(retracted))
    return result


def around_load_kv_cache(original, req, req_to_token_pool, token_to_kv_pool_allocator):
    """Restore only what radix-aware resume did not take from the tree (full restore without a plan)."""
    state = current()

    def load_all():
        original(req, req_to_token_pool, token_to_kv_pool_allocator)

    try:
        restored = state.radix_resume.restore(req, req_to_token_pool, token_to_kv_pool_allocator, load_all)
    except Exception:  # the tree's prefix slots hold the same KV, so a full restore is still correct
        state.hook_failed("radix_resume_restore", "partial restore of %s failed; restoring it in full", req.rid)
        restored = False
    if not restored and req.kv.retraction_backup is not None:
        load_all()
