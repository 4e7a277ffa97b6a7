"""Running decode requests' own KV, kept between steps so that a step reads it in place.

    OwnKVArena.plan(requests, rows, pool) --ArenaStep--> per layer: write_step_kv, then band_kv per band

Why: a decode step attends every running request's own part (the columns of its req_to_token row no
shared segment covers, prefix_groups.py). Gathering those scattered pool rows again in every layer of
every step was 36% of a decode step with 32 running requests of ~300 own tokens (py-spy, capacity
model, shared-prefix backend before the arena). Here an own part is copied once, when its request
joins (or moves to a wider band), and a step adds only its new token, copied from the pool after SGLang
stored it, so the arena holds exactly what the pool holds.

Layout: band b holds rows of `band_columns(b)` columns (64, 96, 128, 192, 256, ...: each 1.5 or 1.33
times the last), per layer a K and a V tensor
[rows, kv heads, columns, head_dim] (float32 whatever the pool's dtype). Rows 0..n-1 of a band are in
use (a dropped row's place is taken by the band's last row), so a layer attends a band as one strided
[n, kv heads, width, head_dim] view, width = the longest row in it: no copy, and padding stays within
a factor 1.5 of each row's length. A full row moves to the next band by an arena-to-arena copy. A row
holds its request's KV from request position `start` on. When the request's own part now starts later
(a segment covers more of it), the front columns are masked, as long as they are no more than the
columns read; otherwise (a mostly masked row, or an own part that now starts earlier: the request
shares less than before) the row is refilled, a one-time copy. (Rows never start later than the own
part: a request's earlier turns are in the radix tree, but only that request reads them, and a
one-member segment per request costs an attention call per request per layer.)

Validity, checked every forward: a row is kept only for a request that (a) was in the previous decode
forward with seq_len one less (`continuing`, same rid and req_pool_idx), (b) starts its own part at or
after the row's start, masking no more columns than it reads, and (c) whose req_to_token slots over the
row are still the recorded ones. A request in two consecutive decode forwards never left SGLang's
running batch in between (finishing, aborting and retraction all leave it out of the next forward;
SGLang retracts only while it keeps at least one request running), so it held those slots all along,
and SGLang never rewrites a held slot's KV. Everything else is refilled from the pool, and so is every
row after a planned forward that did not write every layer (`write_step_kv` not called for a layer: a
fallback or an error).

Memory: at most `budget_tokens` row columns over all bands, each 2 x kv heads x head_dim float32 per
layer; a request that would need more is left out (`ArenaStep.overflow`: the caller gathers it from the
pool, as without the arena). Pure torch, no SGLang import. Not thread-safe: the scheduler thread owns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

MIN_BAND_COLUMNS = 64
MIN_BAND_TOKENS = 512  # a band's first allocation: 8 rows of 64 columns, 1 row of 512 or more


class RequestKey(NamedTuple):
    """Who a batch position is: SGLang's request id and its req_to_token row."""

    rid: str
    req_pool_index: int


class OwnPart(NamedTuple):
    """One batch position's own part in one decode forward: request positions [own_start, seq_len)."""

    key: RequestKey
    own_start: int
    seq_len: int
    continuing: bool  # in the previous decode forward with seq_len - 1

    @property
    def num_tokens(self) -> int:
        """Own tokens, this step's included."""
        return self.seq_len - self.own_start


@dataclass(frozen=True)
class BandStep:
    """One band's rows in one decode forward."""

    band: int
    positions: torch.Tensor    # int64 [n]: batch position of band rows 0..n-1
    offset: int                # where its rows start in ArenaStep.positions
    write_rows: torch.Tensor   # int64 [n * Hkv]: band rows ([rows * Hkv * columns, D] view) this step's token goes to
    width: int                 # columns a layer reads (the longest row)
    bias: torch.Tensor | None  # float32 [n, 1, 1, width]: 0 on a row's own columns, -inf elsewhere


@dataclass(frozen=True)
class ArenaStep:
    """What the arena serves in one decode forward."""

    bands: tuple[BandStep, ...]
    positions: torch.Tensor    # int64 [rows]: every band's positions, band after band
    step_rows: torch.Tensor    # int64 [rows * Hkv]: pool rows ([slots * Hkv, D] view) of their step token, same order
    overflow: tuple[int, ...]  # batch positions whose own part the arena does not hold (budget)
    num_filled_tokens: int     # own tokens copied from the pool for this forward (per layer)

    @property
    def num_read_tokens(self) -> int:
        """Own-part columns a layer reads from the arena, padding included."""
        return sum(b.positions.numel() * b.width for b in self.bands)


class _Band:
    """Rows of one width; rows 0..len(owners)-1 are in use."""

    def __init__(self, columns: int):
        self.columns = columns
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.slots = torch.empty(0, columns, dtype=torch.int64)
        self.owners: list[RequestKey] = []
        self.starts: list[int] = []
        self.lengths: list[int] = []

    @property
    def capacity(self) -> int:
        """Rows allocated."""
        return self.slots.shape[0]

    def grow(self, rows: int, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
        """Reallocate to `rows` rows, keeping the rows in use. New rows are zeroed: a layer reads a row's
        padding columns (masked by -inf scores, so weighted by 0), and 0 x NaN from uninitialised
        memory would be NaN."""
        used = len(self.owners)
        shape = (rows, num_kv_heads, self.columns, head_dim)

        def fresh(old: torch.Tensor | None) -> torch.Tensor:
            new = torch.empty(shape, dtype=torch.float32)
            if old is not None and used:
                new[:used].copy_(old[:used])
            new[used:].zero_()
            return new

        self.k = [fresh(self.k[i] if self.k else None) for i in range(num_layers)]
        self.v = [fresh(self.v[i] if self.v else None) for i in range(num_layers)]
        slots = torch.empty((rows, self.columns), dtype=torch.int64)
        slots[:used] = self.slots[:used]
        self.slots = slots

    def release(self) -> None:
        """Free the storage of a band with no row in use (capacity 0 after)."""
        if self.owners:
            raise RuntimeError(f"band of {self.columns} columns still has {len(self.owners)} rows in use")
        self.k, self.v = [], []
        self.slots = torch.empty(0, self.columns, dtype=torch.int64)

    def drop(self, row: int) -> None:
        """Forget `row`; the last row in use takes its place."""
        last = len(self.owners) - 1
        if row != last:
            length = self.lengths[last]
            for t in (*self.k, *self.v):
                t[row, :, :length].copy_(t[last, :, :length])
            self.slots[row, :length] = self.slots[last, :length]
            for meta in (self.owners, self.starts, self.lengths):
                meta[row] = meta[last]
        for meta in (self.owners, self.starts, self.lengths):
            meta.pop()


def band_columns(band: int) -> int:
    """Columns of band `band`'s rows: MIN_BAND_COLUMNS x 1, 1.5, 2, 3, 4, 6, 8, ..."""
    return MIN_BAND_COLUMNS * (3 if band % 2 else 2) * 2 ** (band // 2) // 2


def band_for(num_tokens: int) -> int:
    """The narrowest band whose rows hold `num_tokens` plus the next step's token."""
    band = 0
    while band_columns(band) < num_tokens + 1:
        band += 1
    return band


class OwnKVArena:
    """Own-part KV of the running decode requests (module docstring). Mutated by plan / write_step_kv."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, budget_tokens: int):
        if min(num_layers, num_kv_heads, head_dim) < 1 or budget_tokens < 0:
            raise ValueError(f"bad arena shape: {num_layers} layers, {num_kv_heads} kv heads, head_dim "
                             f"{head_dim}, budget {budget_tokens} tokens")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.budget_tokens = budget_tokens
        self.bands: list[_Band] = []
        self._unwritten: set[int] = set()

    @property
    def num_tokens(self) -> int:
        """Row columns allocated over all bands (what the budget bounds)."""
        return sum(b.capacity * b.columns for b in self.bands)

    @property
    def num_rows(self) -> int:
        """Rows in use (requests whose own part the arena holds)."""
        return sum(len(b.owners) for b in self.bands)

    def clear(self) -> None:
        """Forget every row (buffers stay allocated)."""
        for band in self.bands:
            for meta in (band.owners, band.starts, band.lengths):
                meta.clear()

    def plan(self, parts: Sequence[OwnPart], rows: torch.Tensor, pool_k: Sequence[torch.Tensor],
             pool_v: Sequence[torch.Tensor]) -> ArenaStep:
        """Keep, move, drop, place and fill rows for one decode forward over `parts` (one per batch position).

        rows[i, :seq_len] are position i's KV slots (this step's token at seq_len - 1, its KV not yet
        stored); pool_k / pool_v: each layer's pool buffers [slots, kv heads, head_dim]. Mutates the
        arena; every layer must then call write_step_kv once before reading a band."""
        if self._unwritten:
            self.clear()
        rows = rows.to(torch.int64)
        index = {p.key: i for i, p in enumerate(parts) if p.num_tokens > 0}
        self._move(self._check(parts, index, rows), parts, index)
        self._extend(parts, index, rows)
        held = {key for band in self.bands for key in band.owners}
        wanted: dict[int, list[int]] = {}
        for i, part in enumerate(parts):
            if part.num_tokens > 0 and part.key not in held:
                wanted.setdefault(band_for(part.num_tokens), []).append(i)
        num_filled, overflow = 0, []
        for b, positions in sorted(wanted.items()):
            granted = self._reserve(b, len(positions))
            new_rows = [self._append(b, parts[i].key, parts[i].own_start, parts[i].num_tokens,
                                     rows[i, parts[i].own_start:parts[i].seq_len]) for i in positions[:granted]]
            overflow += positions[granted:]
            num_filled += self._fill(b, new_rows, pool_k, pool_v)
        steps, step_slots, offset = [], [], 0
        for b, band in enumerate(self.bands):
            if band.owners:
                band_step, slots = self._band_step(b, parts, index, rows, offset)
                steps.append(band_step)
                step_slots.append(slots)
                offset += len(band.owners)
        self._unwritten = set(range(self.num_layers)) if steps else set()
        heads = torch.arange(self.num_kv_heads, dtype=torch.int64).view(1, -1)
        slots = torch.cat(step_slots) if step_slots else torch.empty(0, dtype=torch.int64)
        positions = torch.cat([s.positions for s in steps]) if steps else torch.empty(0, dtype=torch.int64)
        return ArenaStep(tuple(steps), positions, (slots.view(-1, 1) * self.num_kv_heads + heads).reshape(-1),
                         tuple(sorted(overflow)), num_filled)

    def _check(self, parts: Sequence[OwnPart], index: dict[RequestKey, int],
               rows: torch.Tensor) -> list[tuple[int, int]]:
        """Drop every row that is not valid for this forward; return the valid rows whose band has no
        room for this step's token, as (band, row) (kept for `_move`)."""
        full = []
        for b, band in enumerate(self.bands):
            positions = [index.get(key) for key in band.owners]
            keep = [i is not None and self._fits(band, row, parts[i]) for row, i in enumerate(positions)]
            candidates = [row for row, ok in enumerate(keep) if ok]
            if candidates:
                for row, same in zip(candidates, self._same_slots(band, candidates, [positions[r] for r in candidates],
                                                                  rows)):
                    keep[row] = same
            for row in range(len(keep) - 1, -1, -1):  # descending: the row that moves in was already kept
                if not keep[row]:
                    band.drop(row)
            full += [(b, row) for row in range(len(band.owners)) if band.lengths[row] == band.columns]
        return full

    @staticmethod
    def _fits(band: _Band, row: int, part: OwnPart) -> bool:
        """Conditions (a) and (b) of the module docstring."""
        start, length = band.starts[row], band.lengths[row]
        return (part.continuing and start + length == part.seq_len - 1
                and 0 <= part.own_start - start <= part.seq_len - part.own_start)

    @staticmethod
    def _same_slots(band: _Band, band_rows: list[int], positions: list[int], rows: torch.Tensor) -> list[bool]:
        """Condition (c): whether each band row's recorded slots still are its request's slots."""
        starts = torch.tensor([band.starts[r] for r in band_rows], dtype=torch.int64).view(-1, 1)
        lengths = torch.tensor([band.lengths[r] for r in band_rows], dtype=torch.int64).view(-1, 1)
        width = int(lengths.max())
        columns = torch.arange(width, dtype=torch.int64).view(1, -1)
        inside = columns < lengths
        current = rows[torch.tensor(positions, dtype=torch.int64).view(-1, 1),
                       torch.where(inside, starts + columns, starts)]
        recorded = band.slots[torch.tensor(band_rows, dtype=torch.int64), :width]
        return ((current == recorded) | ~inside).all(dim=1).tolist()

    def _move(self, full: list[tuple[int, int]], parts: Sequence[OwnPart], index: dict[RequestKey, int]) -> None:
        """Copy each full row into a wider band (arena to arena: contiguous, unlike a refill from the
        pool), then drop it; a row no band can take (budget) is dropped (its request is placed anew)."""
        by_target: dict[int, list[tuple[int, int]]] = {}
        for b, row in full:
            band = self.bands[b]
            by_target.setdefault(band_for(band.lengths[row] + 1), []).append((b, row))
        for target, sources in sorted(by_target.items()):
            granted = self._reserve(target, len(sources))
            for b, row in sources[:granted]:
                band = self.bands[b]
                length = band.lengths[row]
                new = self._append(target, band.owners[row], band.starts[row], length, band.slots[row, :length])
                dst = self.bands[target]
                for src_t, dst_t in zip((*band.k, *band.v), (*dst.k, *dst.v)):
                    dst_t[new, :, :length].copy_(src_t[row, :, :length])
        for b in sorted({b for b, _ in full}):
            for row in sorted((r for bb, r in full if bb == b), reverse=True):
                self.bands[b].drop(row)

    def _extend(self, parts: Sequence[OwnPart], index: dict[RequestKey, int], rows: torch.Tensor) -> None:
        """Record this step's slot on every kept row (its KV arrives with write_step_kv)."""
        for band in self.bands:
            if band.owners:
                kept = torch.tensor([index[key] for key in band.owners], dtype=torch.int64)
                step = torch.tensor([parts[index[key]].seq_len - 1 for key in band.owners], dtype=torch.int64)
                lengths = torch.tensor(band.lengths, dtype=torch.int64)
                band.slots[torch.arange(len(band.owners)), lengths] = rows[kept, step]
                band.lengths = [n + 1 for n in band.lengths]

    def _reserve(self, b: int, count: int) -> int:
        """Make room in band `b` (created if new) for up to `count` more rows, growing it once (double,
        at least MIN_BAND_TOKENS columns' worth of rows and what is needed) within the budget; returns how
        many rows fit. (A fixed minimum row count made a lone request's 1024-column row allocate and zero
        8 rows: half of the capacity preset's budget.)"""
        while len(self.bands) <= b:
            self.bands.append(_Band(band_columns(len(self.bands))))
        band = self.bands[b]
        need = len(band.owners) + count - band.capacity
        if need > 0:
            room = (self.budget_tokens - self.num_tokens) // band.columns
            if room < need:  # the budget is short: give back the storage of bands no request uses now
                for idle in self.bands:
                    if not idle.owners and idle.capacity and idle is not band:
                        idle.release()
                room = (self.budget_tokens - self.num_tokens) // band.columns
            add = min(max(need, -(-MIN_BAND_TOKENS // band.columns), band.capacity), room)
            if add > 0:
                band.grow(band.capacity + add, self.num_layers, self.num_kv_heads, self.head_dim)
        return min(count, band.capacity - len(band.owners))

    def _append(self, b: int, key: RequestKey, start: int, length: int, slots: torch.Tensor) -> int:
        """A new row in band `b` (room reserved) holding `length` columns from request position `start`;
        returns its index. The KV is copied by the caller."""
        band = self.bands[b]
        row = len(band.owners)
        band.owners.append(key)
        band.starts.append(start)
        band.lengths.append(length)
        band.slots[row, :length] = slots
        return row

    def _fill(self, b: int, new_rows: list[int], pool_k: Sequence[torch.Tensor],
              pool_v: Sequence[torch.Tensor]) -> int:
        """Copy the new rows' KV before this step's token from the pool, every layer; returns tokens.

        The new rows are consecutive (just appended), so each layer's K (and V) is one gather from the
        pool and one copy into the rows' block (contiguous writes; a scattered index_copy_ was ~4x
        slower). Rows shorter than the block are padded with their last filled slot: columns past a
        row's length are masked when read and overwritten as the row grows."""
        band = self.bands[b]
        filled = [band.lengths[row] - 1 for row in new_rows]  # this step's token comes with write_step_kv
        width = max(filled, default=0)
        if width == 0:
            return 0
        first, count = new_rows[0], len(new_rows)
        if new_rows != list(range(first, first + count)):
            raise RuntimeError(f"arena rows to fill are not consecutive: {new_rows}")
        columns = torch.arange(width, dtype=torch.int64).view(1, -1)
        last = (torch.tensor(filled, dtype=torch.int64).clamp_(min=1) - 1).view(-1, 1)
        slots = band.slots[first:first + count].gather(1, torch.minimum(columns, last))
        heads = torch.arange(self.num_kv_heads, dtype=torch.int64).view(1, -1, 1)
        src_rows = (slots.view(count, 1, width) * self.num_kv_heads + heads).reshape(-1)
        shape = (count, self.num_kv_heads, width, self.head_dim)
        for layer in range(self.num_layers):
            for arena, pool in ((band.k[layer], pool_k[layer]), (band.v[layer], pool_v[layer])):
                arena[first:first + count, :, :width].copy_(pool.view(-1, self.head_dim).index_select(0, src_rows).view(shape))
        return sum(filled)

    def _band_step(self, b: int, parts: Sequence[OwnPart], index: dict[RequestKey, int], rows: torch.Tensor,
                   offset: int) -> tuple[BandStep, torch.Tensor]:
        """Band `b`'s step (its rows starting at `offset` in the forward's row order) and the pool
        slots of its rows' step token."""
        band, heads = self.bands[b], torch.arange(self.num_kv_heads, dtype=torch.int64).view(1, -1)
        positions = torch.tensor([index[key] for key in band.owners], dtype=torch.int64)
        lengths = torch.tensor(band.lengths, dtype=torch.int64)
        front = torch.tensor([parts[index[key]].own_start - start for key, start in zip(band.owners, band.starts)],
                             dtype=torch.int64)
        step_slots = band.slots[torch.arange(len(band.owners)), lengths - 1]  # _extend recorded them
        row_ids = torch.arange(len(band.owners), dtype=torch.int64).view(-1, 1)
        write_rows = ((row_ids * self.num_kv_heads + heads) * band.columns + (lengths - 1).view(-1, 1)).reshape(-1)
        width = int(lengths.max())
        bias = None
        if int(front.max()) > 0 or int(lengths.min()) < width:
            columns = torch.arange(width, dtype=torch.int64).view(1, -1)
            outside = (columns < front.view(-1, 1)) | (columns >= lengths.view(-1, 1))
            bias = torch.zeros(len(band.owners), width, dtype=torch.float32).masked_fill_(outside, float("-inf")).view(-1, 1, 1, width)
        return BandStep(b, positions, offset, write_rows, width, bias), step_slots

    def write_step_kv(self, layer: int, step: ArenaStep, k_buf: torch.Tensor, v_buf: torch.Tensor) -> None:
        """Copy this step's token of every row from layer `layer`'s pool buffers (after SGLang stored
        it) into the arena. Mutates the arena."""
        if step.bands:
            heads = self.num_kv_heads
            for pool, which in ((k_buf, "k"), (v_buf, "v")):
                tokens = pool.view(-1, self.head_dim).index_select(0, step.step_rows).float()
                for band_step in step.bands:
                    arena = getattr(self.bands[band_step.band], which)[layer]
                    first = band_step.offset * heads
                    arena.view(-1, self.head_dim).index_copy_(
                        0, band_step.write_rows, tokens[first:first + band_step.write_rows.numel()])
        self._unwritten.discard(layer)

    def band_kv(self, layer: int, band_step: BandStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s keys and values of a band's rows in use: [n, kv heads, width, head_dim] views."""
        band = self.bands[band_step.band]
        num, width = band_step.positions.numel(), band_step.width
        return band.k[layer][:num, :, :width], band.v[layer][:num, :, :width]

    def snapshot(self) -> dict:
        """JSON-able view for /sglang_pd/stats (read-only): budget, allocation, rows per band."""
        return {"budget_tokens": self.budget_tokens, "allocated_tokens": self.num_tokens, "rows": self.num_rows,
                "bands": [{"columns": b.columns, "rows_allocated": b.capacity, "rows_in_use": len(b.owners)}
                          for b in self.bands]}
