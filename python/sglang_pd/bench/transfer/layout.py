"""KV pool geometry and the benchmark's cases (one request's scattered pages on both sides).

The pool is laid out as SGLang lays it out: one buffer per layer for K and one for V, each of
pool_tokens tokens of kv_heads * head_dim ELEM_BYTES-sized elements; a page is page_size tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sglang_pd.bench.transfer.page_runs import place_runs, random_run_lengths

ELEM_BYTES = 4                      # fp32-sized elements; stored as int32 so every element is unique


@dataclass(frozen=True)
class Geometry:
    """KV pool shape: 2 * layers buffers of pool_tokens tokens, token = kv_heads * head_dim elements."""

    layers: int
    kv_heads: int
    head_dim: int
    pool_tokens: int

    @property
    def num_buffers(self) -> int:
        """K and V buffer per layer."""
        return 2 * self.layers

    @property
    def token_elems(self) -> int:
        """Elements of one token in one buffer."""
        return self.kv_heads * self.head_dim

    @property
    def buffer_elems(self) -> int:
        """Elements of one whole buffer."""
        return self.pool_tokens * self.token_elems

    def page_bytes(self, page_size: int) -> int:
        """Bytes of one page of one buffer."""
        return page_size * self.token_elems * ELEM_BYTES


@dataclass(frozen=True)
class Case:
    """One request: its page size, tokens, and scattered page indices on both sides."""

    page_size: int
    tokens: int
    src_pages: np.ndarray
    dst_pages: np.ndarray

    def bytes_moved(self, geom: Geometry) -> int:
        """Bytes one transfer of this request moves, over every buffer."""
        return len(self.src_pages) * geom.page_bytes(self.page_size) * geom.num_buffers


def make_case(geom: Geometry, page_size: int, tokens: int, max_run: int, seed: int) -> Case:
    """Scattered source/destination pages for a request of `tokens` tokens (same runs both sides).

    Deterministic in (seed, page_size, tokens); raises ValueError when the pool is too small."""
    rng = np.random.default_rng([seed, page_size, tokens])
    n_pages = math.ceil(tokens / page_size)
    pool_pages = geom.pool_tokens // page_size
    lengths = random_run_lengths(n_pages, max_run, rng)
    return Case(page_size, tokens, place_runs(lengths, pool_pages, rng), place_runs(lengths, pool_pages, rng))

