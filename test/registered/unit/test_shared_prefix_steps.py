"""Shared-prefix decode across consecutive steps, on real SGLang pools.

Each case runs a sequence of decode steps through SGLang's TorchNativeAttnBackend and through
sglang_pd_shared_prefix on the same pools (bench/attention_world.py: every step each request gains one
token, as in a server), requires every step's output to equal torch_native's (max |diff| <= 1e-5,
fp32), and first asserts the state the case is about: the grouping of the step, the own tokens read
in place, the segment cache reused or gathered again. Own parts are read from the pool every step (no
state kept for them), so requests leaving and joining, a rewritten slot, a nested branch forming, a
forward stopped after one layer and a mixed forward are all checked against torch_native directly.
Ours runs first in every step (and layer), before this step's K/V is stored, as in a server.
"""

import random

import pytest
import torch

from sglang_pd.bench.attention_world import DecodeWorld, Geometry, random_tokens

pytestmark = pytest.mark.unit

TOLERANCE = 1e-5


def _world(geometry: Geometry = Geometry(9, 3, 64, 2), page_size: int = 1) -> DecodeWorld:
    """min_reads_saved 0: the sequences here are about segments forming, being reused and dissolving on
    small batches, which the default threshold would leave to the own-part kernel."""
    return DecodeWorld(geometry, page_size, pool_tokens=8192, max_requests=16, max_context=1024, seed=3,
                       shuffle_free_pages=True, min_reads_saved=0)


def _counter(world: DecodeWorld, name: str) -> int:
    return int(world.stats.counters.values[f"shared_attn_{name}_total"])


def _step(world: DecodeWorld) -> float:
    """One decode step through both backends, ours first (this step's K/V not yet in the pool); the
    largest output difference."""
    batch, inputs = world.decode_batch(), world.step_inputs()
    shared = world.run_step(world.shared, batch, inputs)
    plain = world.run_step(world.plain, batch, inputs)
    return max(float((a - b).abs().max()) for a, b in zip(plain, shared))


def _group(world: DecodeWorld, rng: random.Random, own_lens: list[int], prefix_len: int = 64) -> list[int]:
    system = random_tokens(prefix_len, rng)
    world.cache_prefix(system)
    return [world.add_request(world.matched_slots(system + random_tokens(3, rng)), n) for n in own_lens]


def _branch_of(world: DecodeWorld, position: int, shared: int, own: int) -> None:
    """A request whose row is `position`'s first `shared` slots, then `own` slots of its own."""
    row = world.rows.req_to_token[world.row_ids[position], :shared].to(torch.int64)
    world.add_row(torch.cat([row, world.alloc(own)]))


def test_continuing_requests_read_their_own_parts_in_place_and_reuse_the_segment():
    world = _world()
    own_lens = [5, 17, 30, 41]
    _group(world, random.Random(0), own_lens)
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_own_tokens == sum(n + 1 for n in own_lens)  # own part + this step's token
    assert _counter(world, "segment_gathered_tokens") == 64
    for step in range(1, 7):
        world.advance()
        assert _step(world) <= TOLERANCE
        assert world.stats.last_step.num_own_tokens == sum(n + 1 + step for n in own_lens)
    assert _counter(world, "segment_gathered_tokens") == 64  # the segment was reused by continuing members


def test_requests_that_leave_and_join_are_read_as_they_are_now():
    world = _world()
    rng = random.Random(2)
    _group(world, rng, [9, 20, 33, 12, 25])
    assert _step(world) <= TOLERANCE
    world.advance()
    world.remove(1)
    world.add_request(torch.empty(0, dtype=torch.int64), 14)  # joins with nothing shared
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_grouped_requests == 4
    for _ in range(3):
        world.advance()
        assert _step(world) <= TOLERANCE


def test_a_rewritten_slot_is_read_as_the_pool_holds_it_now():
    world = _world()
    _group(world, random.Random(3), [10, 30])
    assert _step(world) <= TOLERANCE
    world.advance()
    # SGLang rewrote request 1's row at an own position (e.g. de-duplicated against the tree): a slot
    # holding other KV replaces it; the plain backend reads the new slot, so must we.
    position, column = 1, 64 + 7
    new_slot = int(world.alloc(1)[0])
    world.rows.req_to_token[world.row_ids[position], column] = new_slot
    assert _step(world) <= TOLERANCE
    start = int(world.shared.plan.own.indptr[position])
    assert int(world.shared.plan.own.slots[start + 7]) == new_slot


def test_a_nested_branch_forms_a_second_segment():
    world = _world()
    first, _ = _group(world, random.Random(4), [80, 6])
    assert _step(world) <= TOLERANCE
    world.advance()
    _branch_of(world, first, 64 + 30, 5)  # shares 30 of request 0's own tokens: a nested segment
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 2  # the system prompt (all three), the branch (0 and 2)
    assert world.stats.last_step.num_shared_tokens == 64 + 30
    for _ in range(3):
        world.advance()
        assert _step(world) <= TOLERANCE


def test_a_group_that_forms_and_dissolves():
    world = _world()
    rng = random.Random(10)
    system = random_tokens(64, rng)
    world.cache_prefix(system)
    world.add_request(world.matched_slots(system + random_tokens(3, rng)), 20)  # alone: its own part is all of it
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 0 and world.stats.last_step.num_own_tokens == 64 + 21
    world.advance()
    world.add_request(world.matched_slots(system + random_tokens(3, rng)), 9)  # the group forms
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 1 and world.stats.last_step.num_own_tokens == 22 + 10
    world.advance()
    world.remove(0)  # the second is alone again: no segment, its whole row is its own part
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 0 and not world.shared.plan.segments
    assert world.stats.last_step.num_own_tokens == world.seq_lens[0]


def test_a_batch_planned_again_without_a_new_token_gathers_its_segment_again():
    world = _world()
    _group(world, random.Random(8), [10, 20])
    assert _step(world) <= TOLERANCE
    assert _step(world) <= TOLERANCE  # same seq_lens: not a continuation (no token was added)
    assert _counter(world, "segment_gathered_tokens") == 2 * 64


def test_requests_readmitted_into_their_rows_gather_their_segment_again():
    """Every request retracted at once (a pause, a weight update), its KV recomputed, and readmitted under
    its rid into the row it had, with no decode forward in between: by rid, row and seq_len the next step
    looks like a continuation, but SGLang's ReqToTokenPool bumped the rows' generation when it allocated
    them again, so the segment is gathered again and the pool's new KV read."""
    world = _world()
    _group(world, random.Random(12), [10, 20])
    assert _step(world) <= TOLERANCE
    prefix = world.rows.req_to_token[world.row_ids[0], :64].to(torch.int64)
    rows_before = list(world.row_ids)
    for position in range(len(world.row_ids)):
        world.readmit(position)
    assert world.row_ids == rows_before  # the same rows: only their generation tells the requests apart
    for layer in range(len(world.layers)):  # the shared prefix's KV recomputed (new weights)
        for buf in (world.kv.k_buffer[layer], world.kv.v_buffer[layer]):
            buf[prefix] = torch.randn((len(prefix), *buf.shape[1:]), generator=world.gen)
    world.advance()
    assert _step(world) <= TOLERANCE
    assert _counter(world, "segment_gathered_tokens") == 2 * 64


def test_a_forward_stopped_after_one_layer_leaves_nothing_stale():
    world = _world()
    _group(world, random.Random(7), [10, 20])
    assert _step(world) <= TOLERANCE
    world.advance()
    batch, inputs = world.decode_batch(), world.step_inputs()
    world.shared.init_forward_metadata(batch)
    q, k, v = inputs[0]
    world.shared.forward(q, k, v, world.layers[0], batch)  # the forward stops after its first layer
    world.advance()
    assert _step(world) <= TOLERANCE


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_many_steps_with_churn_on_gqa_pages(page_size):
    world = _world(geometry=Geometry(9, 3, 64, 2), page_size=page_size)
    rng = random.Random(page_size)
    _group(world, rng, [rng.randrange(1, 90) for _ in range(6)], prefix_len=page_size * (-(-70 // page_size)))
    diff = 0.0
    for step in range(24):
        diff = max(diff, _step(world))
        world.advance()
        if step % 5 == 4:
            world.remove(rng.randrange(len(world.seq_lens)))
            world.add_request(torch.empty(0, dtype=torch.int64), rng.randrange(1, 70))
    print(f"MAXDIFF churn page{page_size} {diff:.2e}")
    assert diff <= TOLERANCE


def _mixed_step(world: DecodeWorld, num_new: dict[int, int]) -> float:
    """One MIXED forward (SGLang's mixed chunk): positions in `num_new` extend that many tokens, the others
    decode one; both backends on the same q/k/v; the largest output difference."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    n = len(world.seq_lens)
    lens = [num_new.get(i, 1) for i in range(n)]
    seq_lens = torch.tensor(world.seq_lens)
    rows = world.rows.req_to_token[torch.tensor(world.row_ids)]
    out_loc = torch.cat([rows[i, seq_lens[i] - lens[i]:seq_lens[i]] for i in range(n)]).long()
    batch = ForwardBatch(forward_mode=ForwardMode.MIXED, batch_size=n, input_ids=torch.zeros(sum(lens), dtype=torch.int64),
                         req_pool_indices=torch.tensor(world.row_ids), seq_lens=seq_lens, out_cache_loc=out_loc,
                         seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens,
                         extend_prefix_lens=seq_lens - torch.tensor(lens), extend_seq_lens=torch.tensor(lens),
                         extend_seq_lens_cpu=lens, rids=list(world.rids))
    g = world.geometry
    diff = 0.0
    for backend in (world.shared, world.plain):
        backend.init_forward_metadata(batch)
    for layer in world.layers:
        q = torch.randn(sum(lens), g.num_q_heads * g.head_dim, generator=world.gen)
        k, v = torch.randn(2, sum(lens), g.num_kv_heads, g.head_dim, generator=world.gen)
        shared = world.shared.forward(q, k, v, layer, batch)  # first: stores this layer's K/V itself
        plain = world.plain.forward(q, k, v, layer, batch)
        diff = max(diff, float((plain - shared).abs().max()))
    return diff


def test_a_mixed_forward_attends_its_decode_rows_by_shared_prefix():
    world = _world()
    rng = random.Random(11)
    _group(world, rng, [10, 20, 30])
    assert _step(world) <= TOLERANCE
    world.advance()
    # a local extend of 5 new tokens joins the decode step of the running requests, and the first of them
    # extends 4 (so the decode rows 1, 2 are query rows 4, 5, not their batch positions)
    system = world.rows.req_to_token[world.row_ids[0], :64].to(torch.int64)
    newcomer = world.add_row(torch.cat([system, world.alloc(12)]))
    diff = _mixed_step(world, {0: 4, newcomer: 5})
    print(f"MAXDIFF mixed {diff:.2e}")
    assert diff <= TOLERANCE
    plan = world.shared.plan
    assert plan is not None and plan.batch_size == 2  # the decode rows only
    assert _counter(world, "extend_queries") == 9 * len(world.layers)
    world.advance()
    assert _step(world) <= TOLERANCE  # the next decode step: all four decode
    assert world.stats.last_step.batch_size == 4 and world.stats.last_step.num_grouped_requests == 4


def test_the_averaged_merge_fault_is_off_by_far_more_than_the_tolerance(pd_state):
    """The power check's break on real pools: with shared_merge_average armed (the integration test arms
    it on a server) a grouped step's output departs from torch_native's by orders of magnitude more than
    TOLERANCE; the step after it, disarmed, is within TOLERANCE again."""
    from sglang_pd.srt.fault_injection import Fault

    pd_state.faults.enabled = True
    world = _world()
    _group(world, random.Random(5), [5, 17, 30, 41])
    pd_state.faults.arm(Fault.SHARED_MERGE_AVERAGE, 1)
    assert _step(world) > 1000 * TOLERANCE
    assert pd_state.faults.fired == {Fault.SHARED_MERGE_AVERAGE: 1}
    world.advance()
    assert _step(world) <= TOLERANCE
