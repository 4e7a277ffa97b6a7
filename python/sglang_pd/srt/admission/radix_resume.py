"""Radix-aware resume of a retracted decode request: re-match the tree, restore only what is not cached.

Upstream decode retraction backs the request's KV up to host (`cpu_tensor`), frees its row and drops
its tree lock; resume re-allocates the whole sequence and copies every token back. While the request
waited, the tree may still hold a prefix of its sequence (the shared system prompt, or its own tokens
published by the running-request checkpoint). This class owns the better path:

    retract (upstream: back up, free, unlock - the ledger records the release)
      -> resume: match (prompt + generated tokens) -> page-align -> lock with the rid as owner
      -> SGLang preallocates only the tokens past the prefix
      -> restore copies only backup[prefix_len:fill_len) into those new slots.

`fill_len` is SGLang's preallocation length for a resumed request (prompt + outputs - 1: the last
sampled token has no KV yet) and equals the length of the backup. At least one token is always
restored, so SGLang never preallocates an empty extension.

Page ownership: the row's [0, prefix_len) are the TREE's pages (locked, shared with every request
reading that prefix); only [prefix_len, fill_len) are the request's. Nothing here ever writes into the
tree's pages. If the partial restore fails, `restore_in_full` first gives the request pages of its own
for the prefix (allocated, evicting unlocked leaves if needed, while the prefix lock still holds), points
the row at them and releases the lock: the request is then exactly as SGLang's own resume leaves it
(no prefix, no lock, `cache_protected_len` 0), and SGLang's full restore writes only its own pages.
(SGLang's full restore writes the whole row, `req_to_token[row, :fill_len]`: run on the row as
preallocated for a partial restore, it would overwrite the tree's prefix pages with the backup's KV
of the same tokens, which another request's computation may have left numerically different, while
other requests read them.) Without pages for that, `restore_in_full` raises ResumeError having written
nothing: the row still aliases the locked prefix (the hook then aborts the request).

Mutating: `match_and_lock`, `restore`, `restore_in_full`, `abandon`. Read-only: `plan_for`, `snapshot`.
Scheduler thread only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from sglang_pd.srt.mem_cache import page_align_floor
from sglang_pd.srt.mem_cache import owner_scope
from sglang_pd.srt.metrics import PDCounters


@dataclass(frozen=True)
class ResumePlan:
    """What radix-aware resume decided for one retracted request."""

    rid: str
    fill_len: int       # KV tokens the request owns at resume (== tokens in its backup)
    prefix_len: int     # page-aligned tokens reused from the tree (locked; == the tree's whole match)

    @property
    def num_restored_tokens(self) -> int:
        """Tokens copied back from the backup: the part the tree did not hold."""
        return self.fill_len - self.prefix_len


class ResumeError(RuntimeError):
    """A plan or backup that cannot describe the request's KV (a bug, not user input)."""


def slice_cpu_backup(kv_cache_cpu: list, start: int, chunk_size: int) -> list:
    """The tokens [start:] of an MHATokenToKVPool CPU backup, in the same layout.

    Layout (SGLang's MHATokenToKVPool.get_cpu_copy): one list per layer of chunks `[k, v]`, each chunk
    `chunk_size` tokens along dim 0 (the last may be shorter). Pure: the input is not modified.
    """
    import torch

    if start < 0 or chunk_size < 1:
        raise ResumeError(f"bad backup slice start={start} chunk_size={chunk_size}")
    out = []
    for layer in kv_cache_cpu:
        k = torch.cat([chunk[0] for chunk in layer])[start:]
        v = torch.cat([chunk[1] for chunk in layer])[start:]
        out.append([[k[i:i + chunk_size], v[i:i + chunk_size]] for i in range(0, k.shape[0], chunk_size)])
    return out


class RadixResume:
    """Owns re-match + lock for resumed requests, the partial restore, and the saving counters."""

    def __init__(self, counters: PDCounters):
        self.counters = counters
        # id(req) -> (req, plan, the tree holding its locked prefix): matched, restore not done yet. Keyed by
        # the request object, not its rid: two requests under one rid (several tokenizers, a direct
        # scheduler call) must not take each other's plan; the entry keeps its request, so its id is not
        # reused while it is pending.
        self._pending: dict[int, tuple[Any, ResumePlan, Any]] = {}

    def match_and_lock(self, req: Any, tree_cache: Any, fill_len: int, match_fn: Callable) -> ResumePlan:
        """Match the request's own tokens [0, fill_len) and lock the page-aligned hit as `req.lock`.

        `match_fn` is SGLang's `match_kv_cache(req, tree, token_ids, max_prefix_len=...)`; it adopts the
        hit as the request's prefix (`req.prefix_len`, `req.last_node`). A zero-length hit takes no
        lock. Raises ResumeError if the request still holds a lock (retraction must have dropped it).
        """
        if getattr(req, "lock", None) is not None:
            raise ResumeError(f"{req.rid}: resumed while still holding a tree lock")
        token_ids = (req.origin_input_ids + req.output_ids)[:fill_len]  # both array('q') in SGLang
        if len(token_ids) != fill_len or fill_len < 1:
            raise ResumeError(f"{req.rid}: fill_len {fill_len} does not fit its {len(token_ids)} tokens")
        page_size = int(tree_cache.page_size)
        max_prefix_len = page_align_floor(fill_len - 1, page_size)
        result = match_fn(req, tree_cache, token_ids, max_prefix_len=max_prefix_len)
        matched = int(result.device_prefix_len)
        prefix_len = page_align_floor(min(matched, max_prefix_len), page_size)
        if prefix_len != matched:
            raise ResumeError(f"{req.rid}: tree matched {matched} tokens; usable prefix is {prefix_len}")
        if prefix_len > 0:
            with owner_scope(str(req.rid), num_tokens=prefix_len):
                req.lock = tree_cache.lock(result.last_device_node)
        plan = ResumePlan(str(req.rid), fill_len, prefix_len)
        self._pending[id(req)] = (req, plan, tree_cache)
        return plan

    def restore(self, req: Any, req_to_token_pool: Any, allocator: Any, load_all: Callable[[], None]) -> bool:
        """Copy back only the backup's tokens past the planned prefix; False if `req` has no plan.

        Requires the row to be preallocated by SGLang for this plan (prefix slots from the tree, the
        rest fresh). Writes only [prefix_len, fill_len) of the row, the request's own pages. With an
        empty prefix, `load_all()` (SGLang's full restore) runs instead. Clears
        `req.kv.retraction_backup`. If the copy raises, the plan stays pending for `restore_in_full`.
        """
        entry = self._pending.get(id(req))
        if entry is None:
            return False
        plan = entry[1]
        backup = req.kv.retraction_backup
        if backup is None:  # nothing to restore, nor to fall back on: the plan ends here
            self._pending.pop(id(req), None)
            raise ResumeError(f"{req.rid}: no retraction backup to restore")
        if plan.prefix_len > 0:
            kvcache = allocator.get_kvcache()
            slots = req_to_token_pool.req_to_token[req.kv.req_pool_idx, plan.prefix_len:plan.fill_len]
            suffix = slice_cpu_backup(backup.cpu_tensors, plan.prefix_len, kvcache.cpu_offloading_chunk_size)
            allocator.load_cpu_copy(suffix, slots)
        else:
            load_all()
        self._done(req, plan)
        return True

    def restore_in_full(self, req: Any, req_to_token_pool: Any, allocator: Any, load_all: Callable[[], None]) -> None:
        """The fallback after a failed `restore`: SGLang's full restore (`load_all`), into pages `req` owns.

        A pending plan with a prefix is first detached from the tree (`_own_prefix_pages`): own pages
        for [0, prefix_len) in the row, the prefix lock released, the prefix unbound. Without a plan
        the row holds only the request's pages already. Raises ResumeError, having written nothing, if
        no pages can be had for the prefix (the caller must then not restore into this row).
        """
        entry = self._pending.get(id(req))
        if entry is not None and entry[1].prefix_len > 0:
            self._own_prefix_pages(req, entry[1], entry[2], req_to_token_pool, allocator)
        load_all()
        if entry is not None:
            self._done(req, replace(entry[1], prefix_len=0))  # counted as what it was: a full copy

    def _own_prefix_pages(self, req: Any, plan: ResumePlan, tree_cache: Any, req_to_token_pool: Any,
                          allocator: Any) -> None:
        """Point the row's [0, prefix_len) at fresh pages of the request and release the prefix lock.

        Allocates before changing anything (evicting unlocked leaves if the pool is short; the locked
        prefix cannot be evicted meanwhile). Raises ResumeError if that fails: the row and the lock are
        then unchanged (only unlocked leaves may have been evicted).
        """
        slots = self._alloc_own(plan.prefix_len, tree_cache, allocator)
        if slots is None:
            raise ResumeError(f"{req.rid}: no free pages for a full restore of its {plan.prefix_len}-token "
                              f"prefix; it stays on the tree's pages, not restored")
        req_to_token_pool.write((req.kv.req_pool_idx, slice(0, plan.prefix_len)), slots)
        self._unbind_prefix(req, tree_cache)  # the row no longer reads the tree's pages

    @staticmethod
    def _alloc_own(num_tokens: int, tree_cache: Any, allocator: Any) -> Any | None:
        """`num_tokens` (page-aligned) fresh slots, evicting from the tree if needed; None if impossible."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        short = num_tokens - allocator.available_size()
        if short > 0:
            tree_cache.evict_for_alloc(EvictParams(num_tokens=short))
        return allocator.alloc(num_tokens)

    def abandon(self, req: Any, tree_cache: Any) -> None:
        """Undo a failed `match_and_lock`: release its lock, drop its plan, unbind the match (mutates)."""
        self._pending.pop(id(req), None)
        self._unbind_prefix(req, tree_cache)

    @staticmethod
    def _unbind_prefix(req: Any, tree_cache: Any) -> None:
        """Release `req.lock` and leave the request as SGLang's own resume has it: no prefix (mutates)."""
        if getattr(req, "lock", None) is not None:
            tree_cache.unlock(req.lock)
            req.lock = None
        req.prefix_len = 0
        req.kv.cache_protected_len = 0  # the request owns its whole row
        req.last_node = None  # SGLang binds the root prefix again when the request is scheduled

    def _done(self, req: Any, plan: ResumePlan) -> None:
        """The backup is consumed: drop the plan, clear the backup, count."""
        self._pending.pop(id(req), None)
        req.kv.retraction_backup = None
        self._count(plan)

    def _count(self, plan: ResumePlan) -> None:
        self.counters.add("resume_requests_total")
        self.counters.add("resume_backup_tokens_total", plan.fill_len)       # a full restore's copy
        self.counters.add("resume_restored_tokens_total", plan.num_restored_tokens)  # this path's copy

    def plan_for(self, req: Any) -> ResumePlan | None:
        """The plan of request `req` (the object) matched but not yet restored (None otherwise)."""
        entry = self._pending.get(id(req))
        return None if entry is None else entry[1]

    def snapshot(self) -> dict:
        """JSON-able counters (from PDCounters): restored tokens with re-match vs a full restore's."""
        backup = int(self.counters.get("resume_backup_tokens_total"))
        restored = int(self.counters.get("resume_restored_tokens_total"))
        return {
            "num_resumed": int(self.counters.get("resume_requests_total")),
            "num_backup_tokens": backup,
            "num_restored_tokens": restored,
            "num_reused_tokens": backup - restored,  # taken from the tree instead
            "pending": [asdict(plan) for _req, plan, _tree in self._pending.values()],  # each names its rid
        }
