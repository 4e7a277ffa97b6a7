"""bench_transfer's pure pieces (sglang_pd.bench.transfer): coalesce_page_runs' contract, the scattered
page allocator, and the destination check that makes every benchmark row trustworthy."""

import doctest

import numpy as np
import pytest

from sglang_pd.bench.transfer import page_runs
from sglang_pd.bench.transfer.buffers import VerificationError, make_buffers, page_view, verify_pages
from sglang_pd.bench.transfer.descriptors import case_descriptors, descriptor_arrays
from sglang_pd.bench.transfer.layout import Geometry, make_case
from sglang_pd.bench.transfer.page_runs import coalesce_page_runs, place_runs, random_run_lengths

pytestmark = pytest.mark.unit


def _expand(runs):
    return [(s + k, d + k) for s, d, n in runs for k in range(n)]


def test_docstring_examples():
    failures, tried = doctest.testmod(page_runs, verbose=False)
    assert failures == 0 and tried >= 3


@pytest.mark.parametrize("src, dst, want", [
    ([], [], []),
    ([7], [3], [(7, 3, 1)]),
    ([0, 1, 2, 3], [5, 6, 7, 8], [(0, 5, 4)]),                    # one run
    ([0, 1, 2], [5, 7, 8], [(0, 5, 1), (1, 7, 2)]),               # dst jumps: split
    ([0, 2, 3], [5, 6, 7], [(0, 5, 1), (2, 6, 2)]),               # src jumps: split
    ([3, 2, 1], [3, 2, 1], [(3, 3, 1), (2, 2, 1), (1, 1, 1)]),    # descending never merges
    ([4, 4, 5], [1, 1, 2], [(4, 1, 1), (4, 1, 2)]),               # repeats are kept, not merged
    ([0, 1, 0, 1], [0, 1, 2, 3], [(0, 0, 2), (0, 2, 2)]),
])
def test_edge_cases(src, dst, want):
    assert coalesce_page_runs(src, dst) == want
    assert coalesce_page_runs(tuple(src), np.array(dst, dtype=np.int32)) == want
    assert _expand(want) == list(zip(src, dst))


@pytest.mark.parametrize("src, dst, msg", [
    ([1, 2], [1], "differ in length"),
    ([-1], [0], ">= 0"),
    ([[1]], [[1]], "1-D"),
    ([1.5], [2.0], "integers"),
])
def test_bad_input(src, dst, msg):
    with pytest.raises(ValueError, match=msg):
        coalesce_page_runs(src, dst)


def test_random_roundtrip_and_maximal():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(1, 200))
        src = np.cumsum(rng.integers(0, 3, size=n)) + 5     # steps of 0, 1, 2 on both sides
        dst = np.cumsum(rng.integers(0, 3, size=n))
        before = src.copy()
        runs = coalesce_page_runs(src, dst)
        assert _expand(runs) == list(zip(src.tolist(), dst.tolist()))
        assert all(n >= 1 for _, _, n in runs)
        for (s0, d0, n0), (s1, d1, _) in zip(runs, runs[1:]):    # no two neighbours could merge
            assert (s1, d1) != (s0 + n0, d0 + n0)
        assert np.array_equal(src, before)                       # pure


def test_scattered_pages_are_disjoint_runs_in_the_pool():
    rng = np.random.default_rng(2)
    for n_pages, pool, max_run in ((1, 1, 1), (37, 80, 8), (512, 1024, 8), (100, 100, 3), (64, 128, 1)):
        lengths = random_run_lengths(n_pages, max_run, rng)
        assert lengths.sum() == n_pages and lengths.min() >= 1 and lengths.max() <= max_run
        pages = place_runs(lengths, pool, rng)
        assert len(pages) == n_pages == len(set(pages.tolist()))
        assert pages.min() >= 0 and pages.max() < pool
        # each run is consecutive in the pool, so coalescing finds at most len(lengths) runs
        assert len(coalesce_page_runs(pages, pages)) <= len(lengths)
    with pytest.raises(ValueError, match="do not fit"):
        place_runs(np.array([3, 3]), 5, rng)


def test_verify_pages_catches_a_single_wrong_element():
    geom = Geometry(layers=1, kv_heads=1, head_dim=4, pool_tokens=32)
    case = make_case(geom, page_size=2, tokens=8, max_run=2, seed=0)
    src, dst = make_buffers(geom, pattern=True), make_buffers(geom, pattern=False)
    with pytest.raises(VerificationError):
        verify_pages(dst, geom, case)                 # nothing copied yet
    for s, d in zip(src, dst):
        page_view(d, geom, 2)[case.dst_pages] = page_view(s, geom, 2)[case.src_pages]
    verify_pages(dst, geom, case)
    page_view(dst[1], geom, 2)[case.dst_pages[-1], 3] += 1
    with pytest.raises(VerificationError, match="buffer 1"):
        verify_pages(dst, geom, case)
    with pytest.raises(VerificationError, match="buffer 0"):   # K and V buffers hold distinct values
        verify_pages(dst[::-1], geom, case)


def test_descriptors_cover_every_buffer():
    runs = np.array([[2, 5, 3], [9, 0, 1]])
    local, remote = descriptor_arrays(runs, [1000, 50000], [7000, 90000], page_bytes=16)
    assert local.tolist() == [[1032, 48, 0], [1144, 16, 0], [50032, 48, 0], [50144, 16, 0]]
    assert remote.tolist() == [[7080, 48, 0], [7000, 16, 0], [90080, 48, 0], [90000, 16, 0]]


def test_array_form_is_the_list_form():
    rng = np.random.default_rng(3)
    src = np.cumsum(rng.integers(0, 3, size=300))
    dst = np.cumsum(rng.integers(0, 3, size=300))
    assert page_runs.coalesce_runs_array(src, dst).tolist() == [list(r) for r in coalesce_page_runs(src, dst)]
    assert page_runs.coalesce_runs_array([], []).shape == (0, 3)


def test_coalesced_descriptors_move_the_same_bytes_as_per_page_ones():
    geom = Geometry(layers=2, kv_heads=1, head_dim=4, pool_tokens=256)
    case = make_case(geom, page_size=4, tokens=64, max_run=8, seed=3)
    addrs = ([10_000, 20_000, 30_000, 40_000], [50_000, 60_000, 70_000, 80_000])
    page_bytes = geom.page_bytes(4)
    per_local, per_remote = case_descriptors(geom, case, False, addrs)
    co_local, co_remote = case_descriptors(geom, case, True, addrs)
    assert len(per_local) == len(case.src_pages) * geom.num_buffers
    assert len(co_local) < len(per_local) and len(co_local) % geom.num_buffers == 0

    def pages(local, remote):       # every (src byte address, dst byte address) page pair covered
        return sorted((int(la) + k, int(ra) + k) for (la, n, _), (ra, _, _) in zip(local, remote)
                      for k in range(0, int(n), page_bytes))

    assert pages(co_local, co_remote) == pages(per_local, per_remote)
