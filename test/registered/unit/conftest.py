"""Unit-tier fixtures: real SGLang tree/allocator/request objects, our ledger hooks applied for real."""

import threading
from array import array

import pytest

from sglang_pd.config import Settings
from sglang_pd.srt.hooks.ledger_hooks import apply_ledger_hooks
from sglang_pd.srt.mem_cache.standalone import paged_tree
from sglang_pd.srt.mem_cache import check_integrity

POOL_TOKENS = 64  # 16 pages of 4, or 64 pages of 1


@pytest.fixture(scope="session")
def ledger_hooks_applied():
    """Apply the hook table's lock/unlock rows exactly as a scheduler process does."""
    apply_ledger_hooks()


@pytest.fixture(autouse=True)
def pd_state():
    """A fresh scheduler-process state (default settings) installed for each test; the previous restored.

    Autouse: once a test applied the lock/unlock hooks they stay applied for the session, and a hook
    without an installed state raises (as it should in a server)."""
    from sglang_pd.srt.state import ProcessKind, build_state, install

    state = build_state(ProcessKind.SCHEDULER, Settings())
    previous = install(state)
    yield state
    install(previous)


@pytest.fixture
def ledger(pd_state, ledger_hooks_applied):
    """The installed state's lock ledger (the one the lock/unlock hooks record into)."""
    return pd_state.lock_ledger


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
        from sglang_pd.srt.state import current

        return self.integrity(current().lock_ledger, idle=False).protected_tokens

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


@pytest.fixture
def gets_while_held():
    """run(client, path, n, reached, release) -> (how many had reached the held step, responses): starts n
    GETs of `path` at once, waits until one reached the app's held step (it appends to `reached` and waits
    for `release`), gives the others 0.2 s to arrive, counts, then releases (always) and collects them."""
    def run(client, path: str, n: int, reached: list, release: threading.Event) -> tuple[int, list]:
        responses = []
        callers = [threading.Thread(target=lambda: responses.append(client.get(path))) for _ in range(n)]
        for t in callers:
            t.start()
        for _ in range(200):
            if reached:
                break
            threading.Event().wait(0.01)
        threading.Event().wait(0.2)
        num_reached = len(reached)
        release.set()
        for t in callers:
            t.join(5)
        return num_reached, responses
    return run
