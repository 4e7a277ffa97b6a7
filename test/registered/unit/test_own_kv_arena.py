"""The own-KV arena and the segment cache across consecutive decode steps, on real SGLang pools.

Each case runs a sequence of decode steps through SGLang's TorchNativeAttnBackend and through
sglang_pd_shared_prefix on the same pools (bench/attention_world.py: every step each request gains one
token, as in a server), requires every step's output to equal torch_native's (max |diff| <= 1e-5,
fp32), and first asserts the arena state the case is about: rows kept without a refill, a row moved
to a wider band by an arena-to-arena copy, a request that left and one that joined, a row whose slots
changed refilled, a front mask after a longer segment formed, a budget too small (gathered from the
pool), a forward that did not write every layer (everything refilled).
"""

import random

import pytest
import torch

from sglang_pd.bench.attention_world import DecodeWorld, Geometry, random_tokens
from sglang_pd.srt.disaggregation.own_kv_arena import MIN_BAND_COLUMNS, OwnKVArena, band_columns, band_for

pytestmark = pytest.mark.unit

TOLERANCE = 1e-5


def _world(budget: int | None = None, geometry: Geometry = Geometry(9, 3, 64, 2), page_size: int = 1) -> DecodeWorld:
    return DecodeWorld(geometry, page_size, pool_tokens=8192, max_requests=16, max_context=1024, seed=3,
                       shuffle_free_pages=True, arena_budget_tokens=budget)


def _counter(world: DecodeWorld, name: str) -> int:
    return int(world.stats.counters.values[f"shared_attn_{name}_total"])


def _step(world: DecodeWorld) -> float:
    """One decode step through both backends; the largest output difference."""
    batch, inputs = world.decode_batch(), world.step_inputs()
    plain = world.run_step(world.plain, batch, inputs)
    shared = world.run_step(world.shared, batch, inputs)
    return max(float((a - b).abs().max()) for a, b in zip(plain, shared))


def _group(world: DecodeWorld, rng: random.Random, own_lens: list[int], prefix_len: int = 64) -> list[int]:
    system = random_tokens(prefix_len, rng)
    world.cache_prefix(system)
    return [world.add_request(world.matched_slots(system + random_tokens(3, rng)), n) for n in own_lens]


def _arena(world: DecodeWorld) -> OwnKVArena:
    return world.shared.decoder.arena


def test_continuing_requests_are_filled_once_then_only_gain_their_step_token():
    world = _world()
    _group(world, random.Random(0), [5, 17, 30, 41])
    assert _step(world) <= TOLERANCE
    filled = _counter(world, "arena_filled_tokens")
    assert filled == 5 + 17 + 30 + 41  # the own parts before the first step's token
    assert _counter(world, "segment_gathered_tokens") == 64
    for _ in range(6):
        world.advance()
        assert _step(world) <= TOLERANCE
    assert _arena(world).num_rows == 4
    assert _counter(world, "arena_filled_tokens") == filled  # nothing refilled
    assert _counter(world, "segment_gathered_tokens") == 64  # the segment was reused
    assert _counter(world, "own_gathered_tokens") == 0


def test_a_full_row_moves_to_a_wider_band_by_an_arena_copy():
    world = _world()
    _group(world, random.Random(1), [MIN_BAND_COLUMNS - 1, 8])
    assert _step(world) <= TOLERANCE
    arena = _arena(world)
    assert [len(b.owners) for b in arena.bands] == [1, 1]  # 9 tokens in band 0; 64 need a wider band
    filled = _counter(world, "arena_filled_tokens")
    for _ in range(MIN_BAND_COLUMNS - 7):  # the 9-token row fills band 0's 64 columns and moves
        world.advance()
        assert _step(world) <= TOLERANCE
    assert len(arena.bands[0].owners) == 0 and arena.num_rows == 2
    assert _counter(world, "arena_filled_tokens") == filled  # moved by copying the arena row, not refilled


def test_requests_that_leave_and_join_keep_the_others_valid():
    world = _world()
    rng = random.Random(2)
    _group(world, rng, [9, 20, 33, 12, 25])
    assert _step(world) <= TOLERANCE
    filled = _counter(world, "arena_filled_tokens")
    world.advance()
    world.remove(1)  # a middle row leaves: the band's last row takes its place
    world.add_request(torch.empty(0, dtype=torch.int64), 14)  # joins with nothing shared
    assert _step(world) <= TOLERANCE
    assert _arena(world).num_rows == 5
    assert _counter(world, "arena_filled_tokens") == filled + 14  # only the newcomer was filled
    for _ in range(3):
        world.advance()
        assert _step(world) <= TOLERANCE


def test_a_row_whose_slots_changed_is_refilled_from_the_pool():
    world = _world()
    _group(world, random.Random(3), [10, 30])
    assert _step(world) <= TOLERANCE
    world.advance()
    filled = _counter(world, "arena_filled_tokens")
    # SGLang rewrote request 1's row at an own position (e.g. de-duplicated against the tree): a slot
    # holding other KV replaces it; the plain backend reads the new slot, so must we.
    position, column = 1, 64 + 7
    world.rows.req_to_token[world.row_ids[position], column] = int(world.alloc(1)[0])
    assert _step(world) <= TOLERANCE
    assert _counter(world, "arena_filled_tokens") == filled + (world.seq_lens[position] - 1 - 64)


def _branch_of(world: DecodeWorld, position: int, shared: int, own: int) -> None:
    """A request whose row is `position`'s first `shared` slots, then `own` slots of its own."""
    row = world.rows.req_to_token[world.row_ids[position], :shared].to(torch.int64)
    world.add_row(torch.cat([row, world.alloc(own)]))


@pytest.mark.parametrize("own_len, refilled", [(80, False), (40, True)])
def test_a_longer_segment_masks_the_front_of_a_row_or_refills_a_mostly_masked_one(own_len, refilled):
    world = _world()
    first, _ = _group(world, random.Random(4), [own_len, 6])
    assert _step(world) <= TOLERANCE
    world.advance()
    filled = _counter(world, "arena_filled_tokens")
    _branch_of(world, first, 64 + 30, 5)  # shares 30 of request 0's own tokens: a nested segment
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 2  # the system prompt (all three), the branch (0 and 2)
    own_after = world.seq_lens[first] - 1 - (64 + 30)  # request 0's own part before this step's token
    # kept with its 30 front columns masked while they are no more than what it reads; else refilled
    assert _counter(world, "arena_filled_tokens") == filled + 4 + (own_after if refilled else 0)
    for _ in range(3):
        world.advance()
        assert _step(world) <= TOLERANCE


def test_the_last_request_of_a_group_is_refilled_once_with_the_prefix_it_no_longer_shares():
    world = _world()
    _group(world, random.Random(9), [12, 30])
    assert _step(world) <= TOLERANCE
    world.advance()
    filled = _counter(world, "arena_filled_tokens")
    world.remove(0)  # request 1 is now alone: no shared segment, its own part starts at 0
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 0 and not world.shared.plan.segments
    assert _counter(world, "arena_filled_tokens") == filled + world.seq_lens[0] - 1  # the whole row, once
    for _ in range(3):
        world.advance()
        assert _step(world) <= TOLERANCE
    assert _counter(world, "arena_filled_tokens") == filled + world.seq_lens[0] - 4  # then only extended


def test_the_first_request_of_a_group_is_refilled_without_the_prefix_once_the_group_forms():
    world = _world()
    rng = random.Random(10)
    system = random_tokens(64, rng)
    world.cache_prefix(system)
    world.add_request(world.matched_slots(system + random_tokens(3, rng)), 20)  # alone: its own part is all of it
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 0
    assert _counter(world, "arena_filled_tokens") == 64 + 20
    world.advance()
    world.add_request(world.matched_slots(system + random_tokens(3, rng)), 9)  # the group forms
    assert _step(world) <= TOLERANCE
    assert world.stats.last_step.num_groups == 1
    # 64 masked front columns would be more than the 22 it reads: refilled without them (one time)
    assert _counter(world, "arena_filled_tokens") == 64 + 20 + 21 + 9
    assert _counter(world, "segment_gathered_tokens") == 64


def test_a_batch_planned_again_without_a_new_token_is_refilled():
    world = _world()
    _group(world, random.Random(8), [10, 20])
    assert _step(world) <= TOLERANCE
    filled = _counter(world, "arena_filled_tokens")
    assert _step(world) <= TOLERANCE  # same seq_lens: not a continuation (no token was added)
    assert _counter(world, "arena_filled_tokens") == 2 * filled


def test_a_budget_too_small_gathers_the_rest_from_the_pool():
    world = _world(budget=MIN_BAND_COLUMNS * 8)  # one band-0 chunk of 8 rows
    _group(world, random.Random(5), [10, 12, 100, 14])
    for _ in range(3):
        assert _step(world) <= TOLERANCE
        world.advance()
    assert _arena(world).num_rows == 3 and _arena(world).num_tokens <= MIN_BAND_COLUMNS * 8
    assert _counter(world, "own_gathered_tokens") > 0  # the 100-token part, every step


def test_no_arena_gathers_every_own_part_every_step():
    world = _world(budget=0)
    _group(world, random.Random(6), [10, 12])
    for _ in range(2):
        assert _step(world) <= TOLERANCE
        world.advance()
    assert _arena(world).num_tokens == 0 and _counter(world, "arena_filled_tokens") == 0


def test_a_forward_that_did_not_write_every_layer_refills_everything():
    world = _world()
    _group(world, random.Random(7), [10, 20])
    assert _step(world) <= TOLERANCE
    world.advance()
    batch, inputs = world.decode_batch(), world.step_inputs()
    world.shared.init_forward_metadata(batch)
    q, k, v = inputs[0]
    world.shared.forward(q, k, v, world.layers[0], batch)  # the forward stops after its first layer
    world.advance()
    filled = _counter(world, "arena_filled_tokens")
    assert _step(world) <= TOLERANCE
    assert _counter(world, "arena_filled_tokens") == filled + sum(n - 1 - 64 for n in world.seq_lens)


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
    for backend in (world.plain, world.shared):
        backend.init_forward_metadata(batch)
    for layer in world.layers:
        q = torch.randn(sum(lens), g.num_q_heads * g.head_dim, generator=world.gen)
        k, v = torch.randn(2, sum(lens), g.num_kv_heads, g.head_dim, generator=world.gen)
        plain = world.plain.forward(q, k, v, layer, batch)
        shared = world.shared.forward(q, k, v, layer, batch)
        diff = max(diff, float((plain - shared).abs().max()))
    return diff


def test_a_mixed_forward_attends_its_decode_rows_by_shared_prefix_and_keeps_their_rows():
    world = _world()
    rng = random.Random(11)
    _group(world, rng, [10, 20, 30])
    assert _step(world) <= TOLERANCE
    world.advance()
    filled = _counter(world, "arena_filled_tokens")
    # a local extend of 5 new tokens joins the decode step of the three running requests
    system = world.rows.req_to_token[world.row_ids[0], :64].to(torch.int64)
    newcomer = world.add_row(torch.cat([system, world.alloc(12)]))
    diff = _mixed_step(world, {newcomer: 5})
    print(f"MAXDIFF mixed {diff:.2e}")
    assert diff <= TOLERANCE
    plan = world.shared.plan
    assert plan is not None and plan.batch_size == 3  # the decode rows only
    assert _counter(world, "arena_filled_tokens") == filled  # their rows continued: nothing refilled
    assert _counter(world, "extend_queries") == 5 * len(world.layers)
    world.advance()
    assert _step(world) <= TOLERANCE  # the next decode step: the three continue, the newcomer is placed
    assert _counter(world, "arena_filled_tokens") == filled + 12


def test_band_widths_leave_room_for_the_next_token():
    assert [band_columns(b) for b in range(6)] == [64, 96, 128, 192, 256, 384]
    assert [band_for(n) for n in (1, 63, 64, 95, 96, 127, 128)] == [0, 0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError):
        OwnKVArena(0, 1, 1, 10)
