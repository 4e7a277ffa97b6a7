"""Hooks on SGLang's `ScheduleBatch` and `Req` (managers/schedule_batch.py): retraction count, partial restore,
and the allocation of a decode-local prefill extend (the pages decode preallocated, nothing new)."""

from __future__ import annotations

import logging
from http import HTTPStatus

from sglang_pd.srt.admission import ResumeError
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


def after_retract_decode(result, batch):
    """Count decode retractions (their locks are released through the ledger-checked unlock)."""
    retracted, _ratio, _to_abort = result
    current().counters.add("decode_retractions_total", len(retracted))
    return result


def around_load_kv_cache(original, req, req_to_token_pool, token_to_kv_pool_allocator):
    """Restore only what radix-aware resume did not take from the tree (full restore without a plan).

    If the partial restore fails, the full restore runs into pages the request owns (`restore_in_full`
    detaches the row from the tree's prefix pages first: SGLang's restore writes the whole row). If
    no such pages can be had, the request is aborted instead of writing the tree's pages."""
    state = current()

    def load_all():
        original(req, req_to_token_pool, token_to_kv_pool_allocator)

    try:
        restored = state.radix_resume.restore(req, req_to_token_pool, token_to_kv_pool_allocator, load_all)
    except Exception:
        state.hook_failed("radix_resume_restore", "partial restore of %s failed; restoring it in full", req.rid)
        restored = False
    if not restored and req.kv.retraction_backup is not None:
        try:
            state.radix_resume.restore_in_full(req, req_to_token_pool, token_to_kv_pool_allocator, load_all)
        except ResumeError:
            state.hook_failed("radix_resume_restore", "%s cannot be restored into pages of its own; aborting it",
                              req.rid)
            _abort_unrestored(req)


def _abort_unrestored(req) -> None:
    """End a resumed request whose KV could not be restored (mutates `req`): its backup is dropped, its
    row (the tree's locked prefix + its own unrestored pages) goes back through SGLang's release at its
    finish, and its tokens are never inserted into the tree."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req.kv.retraction_backup = None
    req.skip_radix_cache_insert = True
    req.to_finish = FINISH_ABORT("sglang_pd: retracted request could not be restored (no free KV pages)",
                                 HTTPStatus.SERVICE_UNAVAILABLE)


def around_alloc_for_extend(original, batch):
    """A decode-local prefill extend writes into the pages decode admission preallocated for exactly these
    tokens (its rows already hold prefix + suffix): no second allocation, no row rewrite. Any other batch
    allocates as SGLang does. Returns what alloc_for_extend returns: (out_cache_loc, req_pool_indices on
    the device, on the CPU). Raises RuntimeError if a row does not hold its whole prompt."""
    import torch

    if not current().local_prefill.is_extend_batch(batch):
        return original(batch)
    rows = [int(req.kv.req_pool_idx) for req in batch.reqs]
    for req in batch.reqs:
        if req.kv.kv_allocated_len != req.extend_end:
            raise RuntimeError(f"local extend of {req.rid}: row holds {req.kv.kv_allocated_len} slots, "
                               f"the prompt needs {req.extend_end}")
    table = batch.req_to_token_pool.req_to_token
    slots = [table[row, req.prefix_len:req.extend_end] for row, req in zip(rows, batch.reqs)]
    if current().faults.enabled:
        slots = [_shifted_for_fault(req, s) for req, s in zip(batch.reqs, slots)]
    out_cache_loc = torch.cat(slots)
    rows_cpu = torch.tensor(rows, dtype=torch.int64)
    return out_cache_loc.to(torch.int64), rows_cpu.to(batch.device, non_blocking=True), rows_cpu


def _shifted_for_fault(req, slots):
    """Test fault LOCAL_EXTEND_KV_SHIFT: the room's extend writes each token's KV into the slot of the
    position before it (the first token's into the last slot: rolled by one), so the row holds its KV at
    the wrong positions."""
    import torch

    from sglang_pd.srt.fault_injection import Fault

    if len(slots) < 2 or not current().faults.take(Fault.LOCAL_EXTEND_KV_SHIFT, int(req.bootstrap_room)):
        return slots
    return torch.roll(slots, 1)
