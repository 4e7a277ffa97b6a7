"""Group detection on its own (bare tensors): exact segments, nesting, thresholds, never a wrong group;
the partial-attention merge it relies on (torch for segments, the C kernel for own parts)."""

import random

import pytest
import torch

from sglang_pd.srt.attention.partials import merge, segment_partial
from sglang_pd.srt.attention.own_decode_kernel import OwnDecodeKernel, OwnSlots
from sglang_pd.srt.attention import find_prefix_groups

pytestmark = pytest.mark.unit


def _rows(lists: list[list[int]], width: int = 64) -> tuple[torch.Tensor, list[int]]:
    rows = torch.full((len(lists), width), 999_999, dtype=torch.int32)  # columns past seq_len: garbage
    for i, row in enumerate(lists):
        rows[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
    return rows, [len(r) for r in lists]


def _spans(grouping) -> list[tuple[int, int, tuple[int, ...]]]:
    return sorted((s.start, s.end, s.members) for s in grouping.segments)


def test_one_shared_prefix_then_own_parts():
    prefix = list(range(100, 120))
    rows, lens = _rows([prefix + [1, 2], prefix + [3], prefix + [4, 5, 6]])
    g = find_prefix_groups(rows, lens)
    assert _spans(g) == [(0, 20, (0, 1, 2))]
    assert g.own_starts == (20, 20, 20) and g.own_lens() == [2, 1, 3]
    assert g.segments[0].slots.tolist() == prefix
    assert (g.num_groups, g.num_grouped_requests, g.num_shared_tokens, g.num_reads_saved) == (1, 3, 20, 40)
    assert g.coverage_problems() == []


def test_nested_branches_and_several_groups():
    sys_a, sys_b, branch = list(range(100, 130)), list(range(200, 220)), list(range(300, 310))
    rows, lens = _rows([sys_a + branch + [1], sys_a + branch + [2, 3], sys_a + [4], sys_b + [5], sys_b + [6], [7, 8]])
    g = find_prefix_groups(rows, lens)
    assert _spans(g) == [(0, 20, (3, 4)), (0, 30, (0, 1, 2)), (30, 40, (0, 1))]
    assert g.own_starts == (40, 40, 30, 20, 20, 0)
    assert g.coverage_problems() == []


def test_sharing_that_ends_mid_page_is_cut_at_the_last_identical_slot():
    page = list(range(16, 32))  # one page of 16 slots; the two rows share its first 5 slots only
    rows, lens = _rows([list(range(0, 16)) + page + [40], list(range(0, 16)) + page[:5] + [50, 51]])
    g = find_prefix_groups(rows, lens)
    assert _spans(g) == [(0, 21, (0, 1))]
    assert g.own_starts == (21, 21)


def test_a_request_whose_earlier_row_is_inside_the_shared_prefix_reads_only_its_last_slot_in_place():
    """Request 0's 23 earlier slots are the start of the others' rows; its 24th (this forward's token,
    stored by each layer after the segments were gathered) is never shared, even where the others'
    rows hold the same slot there."""
    prefix = list(range(10, 50))
    rows, lens = _rows([prefix[:24], prefix + [1], prefix + [2, 3]])
    g = find_prefix_groups(rows, lens)
    assert _spans(g) == [(0, 23, (0, 1, 2)), (23, 40, (1, 2))]
    assert g.own_lens() == [1, 1, 2]
    assert g.coverage_problems() == []
    g = find_prefix_groups(*_rows([prefix, prefix]))  # two rows alike to the end: the last column stays apart
    assert _spans(g) == [(0, 39, (0, 1))] and g.own_lens() == [1, 1]


def test_same_slots_in_another_order_or_position_are_not_shared():
    rows, lens = _rows([[1, 2, 3, 4], [2, 1, 3, 4], [9, 1, 2, 3]])
    g = find_prefix_groups(rows, lens)
    assert g.segments == () and g.own_starts == (0, 0, 0)


def test_short_runs_stay_in_own_parts_or_fold_into_a_longer_nested_run():
    shared3, deeper = [1, 2, 3], list(range(100, 120))
    rows, lens = _rows([shared3 + [7, 8], shared3 + deeper + [9], shared3 + deeper + [10]])
    g = find_prefix_groups(rows, lens, min_shared_len=16)
    # 3 tokens shared by all three are below the threshold: requests 1 and 2 read them in their
    # 23-token segment; request 0 reads them in its own part.
    assert _spans(g) == [(0, 23, (1, 2))]
    assert g.own_starts == (0, 23, 23)
    assert g.coverage_problems() == []
    assert find_prefix_groups(rows, lens, min_shared_len=1).num_groups == 2


def test_a_run_is_grouped_only_when_it_saves_enough_reads_and_a_nested_one_can_still_be():
    """(members - 1) x length against min_reads_saved: the 100-token stem shared by 3 saves 200 reads,
    the 150 tokens two of them share after it 150, those two's whole 250-token run 250."""
    stem, deeper = list(range(100, 200)), list(range(300, 450))
    rows, lens = _rows([stem + [1], stem + deeper + [2], stem + deeper + [3]], width=260)
    assert _spans(find_prefix_groups(rows, lens, min_reads_saved=150)) == [(0, 100, (0, 1, 2)), (100, 250, (1, 2))]
    g = find_prefix_groups(rows, lens, min_reads_saved=151)
    assert _spans(g) == [(0, 100, (0, 1, 2))] and g.own_starts == (100, 100, 100)
    g = find_prefix_groups(rows, lens, min_reads_saved=201)  # the stem alone does not pay; the longer pair does
    assert _spans(g) == [(0, 250, (1, 2))] and g.own_starts == (0, 250, 250) and g.coverage_problems() == []
    g = find_prefix_groups(rows, lens, min_reads_saved=251)
    assert g.segments == () and g.own_starts == (0, 0, 0)


@pytest.mark.parametrize("seed", range(20))
def test_random_sharing_trees_are_covered_exactly_and_every_segment_is_identical_in_all_members(seed):
    rng = random.Random(seed)
    next_slot = iter(range(1000, 10**6))
    stems = [[next(next_slot) for _ in range(rng.randrange(1, 40))] for _ in range(3)]
    lists = []
    for _ in range(rng.randrange(2, 12)):
        row = list(rng.choice(stems))[:rng.randrange(1, 41)]
        if rng.random() < 0.5:  # one of two branches, possibly after different stem lengths
            branch = 500 + 100 * rng.randrange(2)
            row += list(range(branch, branch + rng.randrange(0, 20)))
        row += [next(next_slot) for _ in range(rng.randrange(0, 10))]
        lists.append(row or [next(next_slot)])
    rows, lens = _rows(lists, width=120)
    g = find_prefix_groups(rows, lens, min_shared_len=rng.choice([1, 4, 16]), min_reads_saved=rng.choice([0, 20, 60]))
    assert g.coverage_problems() == []
    for seg in g.segments:
        assert len(seg.members) >= 2
        assert list(seg.members) == sorted(set(seg.members))  # ascending: the decoder relies on it
        for m in seg.members:
            assert rows[m, seg.start:seg.end].tolist() == seg.slots.tolist()
            assert seg.end <= lens[m] - 1  # this forward's token is read in place, never from a segment


def test_bad_inputs_are_refused():
    rows, lens = _rows([[1, 2], [1, 3]], width=2)
    with pytest.raises(ValueError, match="min_shared_len"):
        find_prefix_groups(rows, lens, min_shared_len=0)
    with pytest.raises(ValueError, match="min_reads_saved"):
        find_prefix_groups(rows, lens, min_reads_saved=-1)
    with pytest.raises(ValueError, match="do not hold"):
        find_prefix_groups(rows, [2, 3])
    assert find_prefix_groups(rows[:0], []).segments == ()


def _attention(q, keys, values):
    """Reference: softmax(q k^T) v per head, q [Hq, D], keys/values [n, Hkv, D] (GQA by repeat)."""
    group = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).transpose(0, 1)
    v = values.repeat_interleave(group, dim=1).transpose(0, 1)
    return torch.softmax((q.unsqueeze(1) * k).sum(-1), dim=-1).unsqueeze(1).bmm(v).squeeze(1)


@pytest.mark.parametrize("heads", [(4, 4), (9, 3), (8, 1)], ids=["mha", "gqa", "mqa"])
def test_segment_plus_own_parts_merge_to_full_attention(heads):
    gen = torch.Generator().manual_seed(0)
    num_q, num_kv = heads
    q = torch.randn(3, num_q, 8, generator=gen)
    shared_k, shared_v = torch.randn(2, 20, num_kv, 8, generator=gen)
    own = [torch.randn(2, n, num_kv, 8, generator=gen) for n in (5, 2, 0)]  # request 2: no own keys
    # the own keys live in a pool at scattered slots, as SGLang's KV pool holds them
    pool_k, pool_v = torch.randn(2, 40, num_kv, 8, generator=gen)
    slots = torch.randperm(40, generator=gen)[:7].to(torch.int32)
    pool_k[slots[:5].long()], pool_v[slots[:5].long()] = own[0][0], own[0][1]
    pool_k[slots[5:].long()], pool_v[slots[5:].long()] = own[1][0], own[1][1]
    o, l = segment_partial(q, shared_k.transpose(0, 1).contiguous(), shared_v.transpose(0, 1).contiguous())
    out, lse = o.contiguous(), l.contiguous()
    OwnDecodeKernel().merge_own(q, pool_k, pool_v, OwnSlots(torch.tensor([0, 5, 7, 7]), slots), out, lse)
    for i in range(3):
        keys = torch.cat([shared_k, own[i][0]])
        values = torch.cat([shared_v, own[i][1]])
        assert torch.allclose(out[i], _attention(q[i], keys, values), atol=1e-5)


@pytest.mark.parametrize("shift", [0.0, 40.0, -40.0], ids=["close", "first-dominates", "second-dominates"])
def test_merge_of_two_partials_is_attention_over_both_key_sets(shift):
    """The lerp/softplus merge against softmax over the union, also when one side's scores dwarf the
    other's (sigmoid saturates, softplus switches to its linear branch), and an empty accumulator."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 8, generator=gen)
    ka, va = torch.randn(2, 9, 4, 8, generator=gen)
    kb, vb = torch.randn(2, 6, 4, 8, generator=gen)
    va = va + shift  # values differ per side, so a wrong weight shows in the output
    ka = ka * (1 + abs(shift) / 8) if shift > 0 else ka
    kb = kb * (1 + abs(shift) / 8) if shift < 0 else kb
    o_a, l_a = segment_partial(q, ka.transpose(0, 1).contiguous(), va.transpose(0, 1).contiguous())
    o_b, l_b = segment_partial(q, kb.transpose(0, 1).contiguous(), vb.transpose(0, 1).contiguous())
    out, lse = merge(o_a, l_a, o_b, l_b)
    full_k, full_v = torch.cat([ka, kb]), torch.cat([va, vb])
    for i in range(2):
        assert torch.allclose(out[i], _attention(q[i], full_k, full_v), atol=1e-5, rtol=1e-5)
    scores = torch.einsum("qhd,nhd->qhn", q, full_k)
    assert torch.allclose(lse, torch.logsumexp(scores, dim=-1), atol=1e-5, rtol=1e-6)
    empty_out, empty_lse = merge(torch.zeros_like(o_b), torch.full_like(l_b, float("-inf")), o_b, l_b)
    assert torch.equal(empty_out, o_b) and torch.equal(empty_lse, l_b)
