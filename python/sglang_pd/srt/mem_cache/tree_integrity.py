"""check_integrity(): invariants of a radix tree, its KV allocator and the lock ledger, as code.

Invariants (token counts of the full-attention KV; the root holds no tokens):
  1. free + evictable + protected + in-flight == total, with in-flight >= 0
     (in-flight: slots held by live requests outside the tree);
  2. the ledger explains the protected tokens: none outstanding -> protected == 0; otherwise
     max(lock sizes) <= protected <= sum(lock sizes) when every lock's size is known;
  3. trees with Python nodes (RadixCache): every node's lock_ref equals the ledger locks on it or
     below, and evictable/protected equal the tokens of unlocked/locked nodes;
  4. when the scheduler is idle: no outstanding lock, protected == 0, in-flight == 0 (no leak).

Read-only. Works on RadixCache and UnifiedRadixCache (Rust or Python core). Call it on the thread
that owns the tree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from sglang_pd.srt.mem_cache.lock_ledger import LockLedger


@dataclass(frozen=True)
class IntegrityReport:
    """Result of one check; `ok` is True iff `problems` is empty."""

    ok: bool
    problems: tuple[str, ...]
    idle: bool
    tree_class: str
    node_check: bool  # invariant 3 was checked (the tree exposes its nodes)
    evictable_tokens: int
    protected_tokens: int
    free_tokens: int
    total_tokens: int
    in_flight_tokens: int
    num_outstanding_locks: int

    def as_dict(self) -> dict:
        """JSON-able form."""
        out = asdict(self)
        out["problems"] = list(self.problems)
        return out


def tree_sizes(tree_cache: Any) -> tuple[int, int]:
    """(evictable, protected) full-attention tokens of the tree."""
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

    # The base class answers 0 for full_*; only trees with separate components override it.
    if type(tree_cache).full_evictable_size is not BasePrefixCache.full_evictable_size:
        return int(tree_cache.full_evictable_size()), int(tree_cache.full_protected_size())
    return int(tree_cache.evictable_size()), int(tree_cache.protected_size())


def _python_nodes(tree_cache: Any) -> list[Any] | None:
    from sglang.srt.mem_cache.radix_cache import RadixCache

    if not isinstance(tree_cache, RadixCache):
        return None
    out, stack = [], list(tree_cache.root_node.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _node_problems(tree_cache: Any, nodes: list[Any], ledger: LockLedger) -> list[str]:
    root = tree_cache.root_node
    expected: Counter = Counter()
    for node in ledger.locked_nodes():
        while node is not None and node is not root:
            expected[id(node)] += 1
            node = node.parent
    problems = [f"node 0x{id(n):x} ({len(n.key)} tokens): lock_ref {n.lock_ref} but the ledger holds "
                f"{expected[id(n)]} lock(s) on it or below" for n in nodes if n.lock_ref != expected[id(n)]]
    evictable = sum(len(n.key) for n in nodes if n.lock_ref == 0)
    protected = sum(len(n.key) for n in nodes if n.lock_ref > 0)
    if (evictable, protected) != (tree_cache.evictable_size(), tree_cache.protected_size()):
        problems.append(f"tree reports evictable/protected {tree_cache.evictable_size()}/"
                        f"{tree_cache.protected_size()} tokens, its nodes hold {evictable}/{protected}")
    return problems


def _ledger_problems(protected: int, ledger: LockLedger) -> list[str]:
    sizes = [r.num_tokens for r in ledger.outstanding()]
    if not sizes:
        return [f"{protected} tokens protected but no lock is outstanding"] if protected else []
    if any(s is None for s in sizes):
        return []
    if not max(sizes) <= protected <= sum(sizes):
        return [f"{protected} tokens protected, outside what the {len(sizes)} outstanding lock(s) "
                f"cover ({max(sizes)}..{sum(sizes)})"]
    return []


def check_integrity(tree_cache: Any, allocator: Any, ledger: LockLedger, *, idle: bool) -> IntegrityReport:
    """Check invariants 1-4 above; a violation is reported in `problems`, never raised."""
    evictable, protected = tree_sizes(tree_cache)
    free, total = int(allocator.available_size()), int(allocator.size)
    in_flight = total - free - evictable - protected
    problems = []
    if in_flight < 0:
        problems.append(f"free {free} + tree {evictable + protected} exceeds total {total} tokens (double free?)")
    problems += _ledger_problems(protected, ledger)
    nodes = _python_nodes(tree_cache)
    if nodes is not None:
        problems += _node_problems(tree_cache, nodes, ledger)
    num_locks = len(ledger.outstanding())
    if idle and num_locks:
        problems.append(f"idle but {num_locks} lock(s) outstanding: {ledger.owners()}")
    if idle and in_flight > 0:
        problems.append(f"idle but {in_flight} tokens are neither free nor in the tree (leak)")
    return IntegrityReport(not problems, tuple(problems), idle, type(tree_cache).__name__, nodes is not None,
                           evictable, protected, free, total, in_flight, num_locks)
