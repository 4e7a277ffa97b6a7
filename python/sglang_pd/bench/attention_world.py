"""Real SGLang decode-attention objects on CPU without a server (bench_attention and the unit tier).

`DecodeWorld` holds SGLang's own MHATokenToKVPool (random K/V), ReqToTokenPool, paged allocator and
RadixCache, the plain `TorchNativeAttnBackend` and our `SharedPrefixAttnBackend` over the same pools,
and real `RadixAttention` layers. Requests get rows the way decode gives them: a prefix the tree
matched (shared slots) + own slots; `decode_batch` builds the ForwardBatch of one decode step, and
`run_step` runs one backend over every layer with the same q/k/v, as the model would.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from sglang_pd.srt.attention import SharedAttentionStats
from sglang_pd.srt.mem_cache.standalone import paged_tree
from sglang_pd.srt.metrics import PDCounters


@dataclass(frozen=True)
class Geometry:
    """Attention shape of a model: heads, head size, layers."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int


GEOMETRIES = {
    "capacity": Geometry(4, 4, 64, 4),   # the capacity preset's Llama (README)
    "smollm2": Geometry(9, 3, 64, 30),   # SmolLM2-135M: GQA, 9 query heads on 3 kv heads
}


class DecodeWorld:
    """Real pools + both backends for one geometry and page size. Single-threaded; mutates its pools."""

    def __init__(self, geometry: Geometry, page_size: int, pool_tokens: int, max_requests: int,
                 max_context: int, seed: int = 0, shuffle_free_pages: bool = False,
                 min_reads_saved: int | None = None, kernels: str = "cpu"):
        """`kernels`: the shared backend's DecodeKernels, "cpu" or "triton" (CPU tensors: under
        TRITON_INTERPRET=1 only)."""
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

        self.geometry, self.page_size = geometry, page_size
        self.gen = torch.Generator().manual_seed(seed)
        g = geometry
        self.kv = MHATokenToKVPool(size=pool_tokens, page_size=page_size, dtype=torch.float32,
                                   head_num=g.num_kv_heads, head_dim=g.head_dim, layer_num=g.num_layers,
                                   device="cpu", enable_memory_saver=False)
        self.rows = ReqToTokenPool(size=max_requests, max_context_len=max_context, device="cpu",
                                   enable_memory_saver=False)
        self.allocator, self.tree = paged_tree("radix", pool_tokens, page_size, kvcache=self.kv,
                                               req_to_token_pool=self.rows)
        if shuffle_free_pages:  # a long-running server's free list is scattered, not in pool order
            pages = self.allocator.free_pages
            self.allocator.free_pages = pages[torch.randperm(len(pages), generator=self.gen)]
        self._runner = SimpleNamespace(device="cpu", req_to_token_pool=self.rows, token_to_kv_pool=self.kv)
        self.stats = SharedAttentionStats(PDCounters())
        self.plain = TorchNativeAttnBackend(self._runner)
        self.min_reads_saved = min_reads_saved  # None: the backend's default for this geometry
        self.kernels = kernels
        self.shared = self.shared_backend(self.stats)
        self.layers = [RadixAttention(g.num_q_heads, g.head_dim, g.head_dim ** -0.5, g.num_kv_heads, layer_id=i)
                       for i in range(g.num_layers)]
        self.seq_lens: list[int] = []
        self.row_ids: list[int] = []
        self.rids: list[str] = []
        self._num_added = 0

    def shared_backend(self, stats: SharedAttentionStats, min_reads_saved: int | None = None):
        """Another SharedPrefixAttnBackend over this world's pools, grouping with `min_reads_saved` (None:
        this world's setting)."""
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        from sglang_pd.srt.hooks.attention_backend import SharedPrefixAttnBackend

        return SharedPrefixAttnBackend(TorchNativeAttnBackend(self._runner), stats, self.geometry.num_q_heads,
                                       min_reads_saved=self.min_reads_saved if min_reads_saved is None
                                       else min_reads_saved, kernels=self.kernels)

    def alloc(self, num_tokens: int) -> torch.Tensor:
        """`num_tokens` fresh slots (whole pages taken) with random K/V in every layer."""
        pages = -(-num_tokens // self.page_size)
        slots = self.allocator.alloc(pages * self.page_size)
        if slots is None:
            raise MemoryError(f"pool cannot give {pages} pages")
        slots = slots[:num_tokens]
        for layer in range(self.geometry.num_layers):
            for buf in (self.kv.k_buffer[layer], self.kv.v_buffer[layer]):
                buf[slots] = torch.randn((num_tokens, *buf.shape[1:]), generator=self.gen)
        return slots

    def cache_prefix(self, tokens: list[int]) -> torch.Tensor:
        """A finished request left `tokens` (page-aligned) in the radix tree; returns their slots."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        if len(tokens) % self.page_size:
            raise ValueError(f"{len(tokens)} tokens are not whole pages of {self.page_size}")
        slots = self.alloc(len(tokens))
        self.tree.insert(InsertParams(key=RadixKey(token_ids=array("q", tokens)), value=slots))
        return slots

    def matched_slots(self, tokens: list[int]) -> torch.Tensor:
        """The KV slots the radix tree gives a prompt starting with `tokens` (what decode admission gets)."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        match = self.tree.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=array("q", tokens))))
        return self.tree.path_device_indices(match.last_device_node)[:match.device_prefix_len]

    def add_request(self, prefix_slots: torch.Tensor, own_len: int) -> int:
        """A running request: row = prefix_slots + `own_len` fresh slots + this step's token slot.

        Returns its batch position (requests are batched in the order added)."""
        row = torch.cat([prefix_slots.to(torch.int64), self.alloc(own_len + 1)])
        return self.add_row(row)

    def add_row(self, row: torch.Tensor) -> int:
        """A running request whose row is exactly `row` (its last slot takes this step's token), in a
        req_to_token row from SGLang's own ReqToTokenPool.alloc_rows (a retired request's row first,
        its generation bumped). Returns its batch position (last)."""
        index = self._alloc_row()
        self.rows.req_to_token[index, :len(row)] = row.to(self.rows.req_to_token.dtype)
        self.row_ids.append(index)
        self.seq_lens.append(len(row))
        self.rids.append(f"req-{self._num_added}")  # unique, as SGLang's rids are
        self._num_added += 1
        return len(self.row_ids) - 1

    def retire(self, position: int) -> None:
        """The request at batch `position` finished: it leaves the batch and its req_to_token row is
        free for a later request (its KV slots stay allocated; the pool is sized for a whole run)."""
        self.rows.free_rows([self.row_ids[position]])
        self.remove(position)

    def readmit(self, position: int) -> None:
        """The request at batch `position` was retracted and is admitted again under its rid, keeping its
        place in the batch and its slots: its row is freed and allocated anew (SGLang hands back the row
        just freed, its generation bumped); the row's slots are written again."""
        old = self.row_ids[position]
        row = self.rows.req_to_token[old, :self.seq_lens[position]].clone()
        self.rows.free_rows([old])
        self.row_ids[position] = self._alloc_row()
        self.rows.req_to_token[self.row_ids[position], :len(row)] = row

    def _alloc_row(self) -> int:
        rows = self.rows.alloc_rows(1)
        if rows is None:
            raise MemoryError(f"ReqToTokenPool has no free row (size {self.rows.size})")
        return rows[0]

    def advance(self) -> None:
        """The next decode step: every request gets one more slot, which takes that step's token."""
        slots = self.alloc(len(self.seq_lens))
        for position, slot in enumerate(slots.tolist()):
            self.rows.req_to_token[self.row_ids[position], self.seq_lens[position]] = slot
            self.seq_lens[position] += 1

    def remove(self, position: int) -> None:
        """The request at batch `position` leaves the batch (its slots stay allocated)."""
        for batch_list in (self.row_ids, self.seq_lens, self.rids):
            batch_list.pop(position)

    def decode_batch(self):
        """SGLang's ForwardBatch of one decode step over every request added so far."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        seq_lens = torch.tensor(self.seq_lens, dtype=torch.int64)
        pool_idx = torch.tensor(self.row_ids, dtype=torch.int64)
        out_loc = self.rows.req_to_token[pool_idx, seq_lens - 1].to(torch.int64)
        return ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=len(self.seq_lens),
                            input_ids=torch.zeros(len(self.seq_lens), dtype=torch.int64),
                            req_pool_indices=pool_idx, seq_lens=seq_lens, out_cache_loc=out_loc,
                            seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens, rids=list(self.rids))

    def step_inputs(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Random (q, k, v) per layer for one decode step, shaped as RadixAttention hands them over."""
        g, n = self.geometry, len(self.seq_lens)
        return [(torch.randn(n, g.num_q_heads * g.head_dim, generator=self.gen),
                 torch.randn(n, g.num_kv_heads, g.head_dim, generator=self.gen),
                 torch.randn(n, g.num_kv_heads, g.head_dim, generator=self.gen)) for _ in self.layers]

    def run_step(self, backend, batch, inputs) -> list[torch.Tensor]:
        """One decode step of `backend`: metadata once, then every layer (stores k/v, attends)."""
        backend.init_forward_metadata(batch)
        return [backend.forward(q, k, v, layer, batch) for layer, (q, k, v) in zip(self.layers, inputs)]


def random_tokens(num: int, rng: random.Random) -> list[int]:
    """`num` token ids (the tree keys prefixes by them; their values do not matter here)."""
    return [rng.randrange(3, 50_000) for _ in range(num)]
