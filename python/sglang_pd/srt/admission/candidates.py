"""Which queued requests one admission round plans (round.py), in the order SGLang's prealloc loop meets them.

SGLang's `pop_preallocated` walks its prealloc queue in order and admits a request only once its
bootstrap is done (`waiting_for_input`); it skips a rebootstrap (prealloc'd on its own path) and an
aborted request, and it stops when no request row or metadata slot is left. A round plans exactly the
requests that loop can reach from the one it asked about first: planning more would lock prefixes the
loop never takes this call (released again by `close()`, a wasted match and eviction).

Pure: reads the queue entries (duck-typed: SGLang's `DecodeRequest` with `.req`, `.waiting_for_input`,
`.is_rebootstrap`), mutates nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable


def round_candidates(entries: Iterable[Any], first_req: Any, num_free_rows: int,
                     is_aborted: Callable[[Any], bool]) -> list[Any]:
    """The requests of `entries` from `first_req` on that SGLang's loop may admit, in its order, at most
    `num_free_rows` (free request rows and metadata slots, whichever is fewer). `is_aborted(req)` is
    SGLang's abort predicate (its `FINISH_ABORT`)."""
    reqs, started = [], False
    for entry in entries:
        req = entry.req
        started = started or req is first_req
        if not started or not entry.waiting_for_input or entry.is_rebootstrap or is_aborted(req):
            continue
        reqs.append(req)
        if len(reqs) >= num_free_rows:
            break
    return reqs
