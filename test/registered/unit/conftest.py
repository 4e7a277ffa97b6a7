"""Unit-tier fixtures: real SGLang tree/allocator/request objects, our ledger hooks applied for real."""

from array import array

import pytest

from sglang_pd.hooks import HOOK_TABLE
from sglang_pd.process_state import STATE
from sglang_pd.srt.disaggregation.decode_admission import DecodePrefixAdmission
from sglang_pd.srt.mem_cache.lock_ledger import LockLedger
from sglang_pd.srt.mem_cache.standalone import paged_tree
from sglang_pd.srt.mem_cache.tree_integrity import check_integrity

POOL_TOKENS = 64  # 16 pages of 4, or 64 pages of 1


@pytest.fixture(scope="session")
def ledger_hooks_applied():
    """Apply the HOOK_TABLE rows on BasePrefixCache.lock/unlock exactly as a scheduler process does."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for spec in HOOK_TABLE:
        if spec.target.endswith(("PrefixCache.lock", "PrefixCache.unlock", "RadixCache.lock", "RadixCache.unlock")):
            HookRegistry.register(spec.target, spec.fn, HookType[spec.hook_type])
    HookRegistry.apply_hooks()


@pytest.fixture
def ledger(ledger_hooks_applied):
    """A fresh ledger (and admission around it) installed as this process's STATE."""
    STATE.lock_ledger = LockLedger()
    STATE.decode_admission = DecodePrefixAdmission(STATE.lock_ledger)
    return STATE.lock_ledger


class Pool:
    """A real paged allocator of POOL_TOKENS tokens + a real tree: RadixCache (Python nodes) or
    UnifiedRadixCache (the servers' default, Rust tree core)."""

    def __init__(self, tree_kind: str, page_size: int):
        self.page_size = page_size
        self.allocator, self.tree = paged_tree(tree_kind, POOL_TOKENS, page_size)

    @staticmethod
    def key(token_ids):
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(token_ids=array("q", token_ids))

    def cache_tokens(self, token_ids: list[int]) -> None:
        """Allocate KV for the page-aligned part of `token_ids` and insert it (a finished request)."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        n = len(token_ids) - len(token_ids) % self.page_size
        slots = self.allocator.alloc(n)
        assert slots is not None, f"test pool too small for {n} tokens"
        result = self.tree.insert(InsertParams(key=self.key(token_ids[:n]), value=slots))
        if result.prefix_len:  # already cached part: give back the duplicate slots
            self.allocator.free(slots[: result.prefix_len])

    def match(self, token_ids):
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        return self.tree.match_prefix(MatchPrefixParams(key=self.key(token_ids)))

    def protected(self) -> int:
        return self.integrity(STATE.lock_ledger, idle=False).protected_tokens

    def integrity(self, ledger, idle=True):
        return check_integrity(self.tree, self.allocator, ledger, idle=idle)


@pytest.fixture(params=[("radix", 1), ("radix", 4), ("unified", 1), ("unified", 4)],
                ids=["radix-page1", "radix-page4", "unified-page1", "unified-page4"])
def pool(request) -> Pool:
    return Pool(*request.param)


def make_req(rid: str, token_ids: list[int], bootstrap_host: str | None = "127.0.0.1"):
    """A real SGLang Req as decode admission sees it."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, None, array("q", token_ids), SamplingParams(max_new_tokens=4))
    req.bootstrap_host = bootstrap_host
    return req
