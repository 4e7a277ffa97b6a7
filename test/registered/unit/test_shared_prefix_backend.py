"""sglang_pd_shared_prefix vs SGLang's own TorchNativeAttnBackend on real SGLang pools.

Every case builds real MHATokenToKVPool / ReqToTokenPool / paged allocator / RadixCache objects
(bench/attention_world.py), gives requests the rows decode gives them (prefixes matched in the
tree, or rows written slot by slot for the mid-page and inside-the-prefix cases), runs one decode
step of every layer through both backends with the same q/k/v, and requires max |diff| <= 1e-5
(fp32) and the grouping the case is about (so equality is never the result of not sharing). Ours runs
first in every step, on a pool that does not hold this step's K/V yet, as in a server: a slot read
before the layer stores it would show (torch_native first would have stored it for us).
"""

import random
from types import SimpleNamespace

import pytest
import torch

from sglang_pd.bench.attention_world import DecodeWorld, Geometry, random_tokens
from sglang_pd.srt.attention.stats import AttentionFallback, fallback_metric
from sglang_pd.srt.hooks import attention_backend as ab

pytestmark = pytest.mark.unit

TOLERANCE = 1e-5
GEOMETRIES = {"mha": Geometry(4, 4, 64, 2), "gqa": Geometry(9, 3, 64, 2), "mqa": Geometry(8, 1, 32, 2)}


def _pages(world: DecodeWorld, num_tokens: int) -> int:
    return -(-num_tokens // world.page_size) * world.page_size


def no_sharing(world, rng) -> int:
    for i in range(4):
        prefix = random_tokens(_pages(world, 40), rng)
        world.cache_prefix(prefix)
        world.add_request(world.matched_slots(prefix), 10 + 9 * i)
    world.add_request(torch.empty(0, dtype=torch.int64), 33)
    return 0


def one_group(world, rng) -> int:
    system = random_tokens(_pages(world, 100), rng)
    world.cache_prefix(system)
    for i in range(5):
        world.add_request(world.matched_slots(system + random_tokens(3, rng)), 5 + 11 * i)
    return 1


def several_groups(world, rng) -> int:
    """Two system prompts, a conversation branch nested under the first, one request on its own."""
    sys_a, sys_b = random_tokens(_pages(world, 64), rng), random_tokens(_pages(world, 48), rng)
    branch = sys_a + random_tokens(_pages(world, 32), rng)
    for tokens in (sys_a, branch, sys_b):
        world.cache_prefix(tokens)
    for tokens, own in ((branch, 7), (branch, 30), (sys_a, 12), (sys_b, 3), (sys_b, 41)):
        world.add_request(world.matched_slots(tokens + random_tokens(2, rng)), own)
    world.add_request(torch.empty(0, dtype=torch.int64), 20)
    return 3


def mid_page(world, rng) -> int:
    """Two rows share 37 slots: with pages of 16 or 64 the shared run ends inside a page."""
    run = world.alloc(_pages(world, 100))
    world.add_row(torch.cat([run[:100], world.alloc(9)]))
    world.add_row(torch.cat([run[:37], world.alloc(25)]))
    world.add_row(torch.cat([run[:37], world.alloc(4)]))
    return 1


def inside_prefix(world, rng) -> int:
    """Request 0's whole earlier row (39 slots) is the start of the others' rows; its token this step
    has a slot of its own, as every decode token has: segments [0, 39) for all three, [39, 100) for 1 and 2."""
    run = world.alloc(_pages(world, 100))
    world.add_row(torch.cat([run[:39], world.alloc(1)]))
    world.add_row(torch.cat([run[:100], world.alloc(6)]))
    world.add_row(torch.cat([run[:100], world.alloc(1)]))
    return 2


def alike_to_the_end(world, rng) -> int:
    """Requests 0 and 1 have the same 40 slots, this step's included, and request 2's row starts with
    them. No server gives two requests one current slot; here it checks that a row's last column, whose
    K/V the layer stores during the forward, is never in a segment gathered before that store: the
    segment is [0, 39), then each reads on in place."""
    run = world.alloc(_pages(world, 100))
    world.add_row(run[:40])
    world.add_row(run[:40])
    world.add_row(torch.cat([run[:100], world.alloc(1)]))
    return 1


SCENARIOS = {f.__name__: f for f in (no_sharing, one_group, several_groups, mid_page, inside_prefix,
                                     alike_to_the_end)}


def _world(geometry: str, page_size: int, seed: int = 0, min_reads_saved: int | None = 0) -> DecodeWorld:
    """Scattered pages (rows are not runs of consecutive slots). min_reads_saved 0 by default: these
    cases are small, and each is about a grouping the backend would skip as not worth a kernel call."""
    return DecodeWorld(GEOMETRIES[geometry], page_size, pool_tokens=4096, max_requests=8, max_context=512, seed=seed,
                       shuffle_free_pages=True, min_reads_saved=min_reads_saved)


def _max_diff(world: DecodeWorld, steps: int = 2) -> float:
    diff = 0.0
    for _ in range(steps):  # the second step re-plans the same batch and reuses the workspace
        batch, inputs = world.decode_batch(), world.step_inputs()
        shared = world.run_step(world.shared, batch, inputs)  # first: this step's K/V not yet stored
        plain = world.run_step(world.plain, batch, inputs)
        diff = max(diff, max(float((a - b).abs().max()) for a, b in zip(plain, shared)))
    return diff


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("geometry", ["mha", "gqa"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_shared_prefix_decode_equals_torch_native(scenario, geometry, page_size):
    world = _world(geometry, page_size)
    expected_groups = SCENARIOS[scenario](world, random.Random(page_size))
    diff = _max_diff(world)
    step = world.stats.last_step
    print(f"MAXDIFF {scenario} {geometry} page{page_size} groups={step.num_groups} {diff:.2e}")
    assert step.num_groups == expected_groups, step
    if scenario == "mid_page":  # the shared run is cut at the last identical slot, inside a page
        assert step.num_shared_tokens == 37
    if scenario == "alike_to_the_end":  # the last column (slot 39) stays out of the segment
        assert step.num_shared_tokens == 39
    assert diff <= TOLERANCE
    assert world.stats.counters.values["shared_attn_decode_steps_total"] == 2
    assert world.stats.counters.values["shared_attn_kv_reads_saved_tokens_total"] == 2 * step.num_reads_saved


def test_the_default_threshold_groups_what_pays_and_reads_the_rest_in_place():
    """The backend's own threshold (ceil(8192 / query heads) saved reads per layer: 2048 for MHA 4/4, 911
    for SmolLM2's 9 query heads): a 300-token prefix shared by 8 (2,100 saved) is grouped, one shared by
    2 beside it (300 saved) is read by the own-part kernel; outputs equal torch_native either way."""
    from sglang_pd.srt.hooks.attention_backend import min_reads_saved_for

    assert (min_reads_saved_for(4), min_reads_saved_for(9), min_reads_saved_for(1)) == (2048, 911, 8192)
    world = DecodeWorld(GEOMETRIES["mha"], 16, pool_tokens=8192, max_requests=12, max_context=512, seed=5,
                        shuffle_free_pages=True)
    assert world.shared.min_reads_saved == 2048
    rng = random.Random(5)
    for group_size in (8, 2):
        prefix = random_tokens(304, rng)
        world.cache_prefix(prefix)
        slots = world.matched_slots(prefix + random_tokens(4, rng))[:300]
        for _ in range(group_size):
            world.add_request(slots, rng.randrange(5, 40))
    diff = _max_diff(world)
    step = world.stats.last_step
    assert (step.num_groups, step.num_grouped_requests, step.num_shared_tokens) == (1, 8, 300), step
    assert diff <= TOLERANCE


def test_mqa_one_kv_head():
    world = _world("mqa", 16)
    assert several_groups(world, random.Random(1)) == 3
    diff = _max_diff(world)
    print(f"MAXDIFF several_groups mqa page16 {diff:.2e}")
    assert diff <= TOLERANCE and world.stats.last_step.num_groups == 3


def test_sliding_window_layers_fall_back_to_the_wrapped_backend_and_are_counted():
    from sglang.srt.layers.radix_attention import RadixAttention

    world = _world("mha", 16)
    one_group(world, random.Random(0))
    g = world.geometry
    world.layers = [RadixAttention(g.num_q_heads, g.head_dim, g.head_dim ** -0.5, g.num_kv_heads, layer_id=i,
                                   sliding_window_size=24) for i in range(g.num_layers)]
    batch, inputs = world.decode_batch(), world.step_inputs()
    shared = world.run_step(world.shared, batch, inputs)
    plain = world.run_step(world.plain, batch, inputs)
    assert all(torch.equal(a, b) for a, b in zip(plain, shared))
    counters = world.stats.counters.values
    assert counters[fallback_metric(AttentionFallback.SLIDING_WINDOW)] == g.num_layers
    assert world.stats.snapshot()["fallback_layer_calls"]["sliding_window"] == g.num_layers


def test_a_beam_search_batch_falls_back_to_the_wrapped_backend_and_is_counted():
    """SGLang's beam search (beam_search/batch_tail.py) appends each group's member rows after the
    requests' rows in req_pool_indices / seq_lens (seq_len: the leader's) and leaves rids one per
    request: a batch wider than its rids is served by torch_native, every layer counted."""
    world = _world("gqa", 1)
    rng = random.Random(0)
    system = random_tokens(48, rng)
    world.cache_prefix(system)
    leader = world.add_request(world.matched_slots(system + random_tokens(3, rng)), 12)
    world.add_request(world.matched_slots(system + random_tokens(3, rng)), 30)
    prompt = world.rows.req_to_token[world.row_ids[leader], :50].to(torch.int64)
    for _ in range(2):  # member rows: the leader's prompt KV, then generated tokens of their own
        world.add_row(torch.cat([prompt, world.alloc(world.seq_lens[leader] - 50)]))
    batch, inputs = world.decode_batch(), world.step_inputs()
    batch.rids = batch.rids[:2]
    shared = world.run_step(world.shared, batch, inputs)
    plain = world.run_step(world.plain, batch, inputs)
    assert all(torch.equal(a, b) for a, b in zip(plain, shared))
    assert world.shared.plan is None
    counters = world.stats.counters.values
    assert counters[fallback_metric(AttentionFallback.BEAM_SEARCH)] == len(world.layers)
    assert counters["shared_attn_decode_steps_total"] == 0
    assert world.stats.snapshot()["fallback_layer_calls"]["beam_search"] == len(world.layers)


def _extend_batch(world: DecodeWorld, num_new: int):
    """An EXTEND ForwardBatch whose requests compute their last `num_new` tokens (the rest cached)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    n = len(world.seq_lens)
    seq_lens = torch.tensor(world.seq_lens)
    rows = world.rows.req_to_token[torch.tensor(world.row_ids)]
    out_loc = torch.cat([rows[i, seq_lens[i] - num_new:seq_lens[i]] for i in range(n)]).long()
    return ForwardBatch(forward_mode=ForwardMode.EXTEND, batch_size=n, input_ids=torch.zeros(num_new * n, dtype=torch.int64),
                        req_pool_indices=torch.tensor(world.row_ids), seq_lens=seq_lens, out_cache_loc=out_loc,
                        seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens, extend_prefix_lens=seq_lens - num_new,
                        extend_seq_lens=torch.full((n,), num_new), rids=list(world.rids))


@pytest.mark.parametrize("geometry", ["mha", "gqa"])
def test_extend_batches_attend_only_their_new_queries_and_equal_torch_native(geometry):
    world = _world(geometry, 16)
    one_group(world, random.Random(0))
    batch, g = _extend_batch(world, 3), world.geometry
    q = torch.randn(3 * len(world.seq_lens), g.num_q_heads * g.head_dim)
    k, v = torch.randn(2, q.shape[0], g.num_kv_heads, g.head_dim)
    for backend in (world.plain, world.shared):
        backend.init_forward_metadata(batch)
    plain = world.plain.forward(q, k, v, world.layers[0], batch)
    shared = world.shared.forward(q, k, v, world.layers[0], batch)
    diff = float((plain - shared).abs().max())
    print(f"MAXDIFF extend {geometry} {diff:.2e}")
    assert diff <= TOLERANCE
    assert world.shared.plan is None and world.stats.counters.values["shared_attn_decode_steps_total"] == 0
    assert world.stats.counters.values["shared_attn_extend_queries_total"] == q.shape[0]


def test_sliding_window_extends_are_delegated_unchanged():
    from sglang.srt.layers.radix_attention import RadixAttention

    world = _world("mha", 16)
    one_group(world, random.Random(0))
    batch, g = _extend_batch(world, 3), world.geometry
    layer = RadixAttention(g.num_q_heads, g.head_dim, g.head_dim ** -0.5, g.num_kv_heads, layer_id=0,
                           sliding_window_size=24)
    q = torch.randn(3 * len(world.seq_lens), g.num_q_heads * g.head_dim)
    k, v = torch.randn(2, q.shape[0], g.num_kv_heads, g.head_dim)
    for backend in (world.plain, world.shared):
        backend.init_forward_metadata(batch)
    assert torch.equal(world.plain.forward(q, k, v, layer, batch), world.shared.forward(q, k, v, layer, batch))
    assert world.stats.counters.values["shared_attn_extend_queries_total"] == 0


def test_a_decode_forward_of_an_unplanned_batch_is_refused():
    world = _world("mha", 1)
    one_group(world, random.Random(0))
    planned, other = world.decode_batch(), world.decode_batch()
    world.shared.init_forward_metadata(planned)
    q, k, v = world.step_inputs()[0]
    with pytest.raises(RuntimeError, match="did not plan"):
        world.shared.forward(q, k, v, world.layers[0], other)


def test_registered_by_name_and_refused_where_it_cannot_serve():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_pd.srt.state import current

    ab.register_backend_choice()
    ab.register_backend_factory()
    ab.register_backend_factory()  # idempotent
    assert ATTENTION_BACKEND_CHOICES.count(ab.BACKEND_NAME) == 1
    assert ATTENTION_BACKENDS[ab.BACKEND_NAME] is ab.create_backend
    world = _world("mha", 1)
    heads = SimpleNamespace(num_attention_heads=4, get_total_num_kv_heads=lambda: 4)  # what ModelConfig answers
    runner = SimpleNamespace(device="cpu", use_mla_backend=False, req_to_token_pool=world.rows,
                             token_to_kv_pool=world.kv, model_config=heads)
    backend = ATTENTION_BACKENDS[ab.BACKEND_NAME](runner)
    assert isinstance(backend, ab.SharedPrefixAttnBackend) and backend.min_reads_saved == 2048
    snapshot = current().shared_attention.snapshot()
    assert snapshot["backend"] == ab.BACKEND_NAME and snapshot["min_reads_saved"] == 2048
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    fp8_pool = MHATokenToKVPool(size=64, page_size=1, dtype=torch.float8_e4m3fn, head_num=4, head_dim=64,
                                layer_num=1, device="cpu", enable_memory_saver=False)
    for change, message in ((dict(device="cuda"), r"decode CUDA graph \(None\).*--cuda-graph-backend-decode disabled"),
                            (dict(device="npu"), "device npu"),
                            (dict(use_mla_backend=True), "MLA"),
                            (dict(token_to_kv_pool=object()), "KV pool object"),
                            (dict(token_to_kv_pool=fp8_pool), "quantised KV")):
        with pytest.raises(ValueError, match=message):
            ab.create_backend(SimpleNamespace(**{**vars(runner), **change}))


def _cuda_runner(world, decode_graph: str, prefill_graph: str, prefill_backend: str):
    graphs = SimpleNamespace(decode=SimpleNamespace(backend=decode_graph), prefill=SimpleNamespace(backend=prefill_graph))
    return SimpleNamespace(device="cuda", use_mla_backend=False, req_to_token_pool=world.rows, token_to_kv_pool=world.kv,
                           model_config=SimpleNamespace(num_attention_heads=4, get_total_num_kv_heads=lambda: 4),
                           server_args=SimpleNamespace(cuda_graph_config=graphs),
                           prefill_attention_backend_str=prefill_backend)


def test_a_cuda_runner_gets_the_triton_kernels_once_its_graphs_are_off(monkeypatch):
    """The hook reads the runner's CUDA-graph phases and its prefill backend into the decision
    (attention/device_form.py); the factory builds TritonDecodeKernels for CUDA. Its forwards through
    those kernels run under the interpreter in test_triton_shared_prefix.py."""
    world = _world("mha", 1)
    backend = ab.create_backend(_cuda_runner(world, "disabled", "breakable", "triton"))
    assert backend.decoder.kernels.describe()["kernels"] == "triton"
    assert ab.create_backend(_cuda_runner(world, "disabled", "disabled", ab.BACKEND_NAME)).decoder.kernels.describe()[
        "kernels"] == "triton"
    for runner, words in ((_cuda_runner(world, "full", "disabled", "triton"), "--cuda-graph-backend-decode disabled"),
                          (_cuda_runner(world, "disabled", "breakable", ab.BACKEND_NAME),
                           "--cuda-graph-backend-prefill disabled")):
        with pytest.raises(ValueError, match=words):
            ab.create_backend(runner)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    with pytest.raises(ValueError, match="ROCm"):
        ab.create_backend(_cuda_runner(world, "disabled", "disabled", "triton"))


def test_the_kernel_setting_is_read_from_the_process_settings(pd_state, monkeypatch):
    """SGLANG_PD_SHARED_PREFIX_KERNELS=triton on a CPU device: refused without the interpreter, built
    with it."""
    import dataclasses

    pd_state.settings = dataclasses.replace(pd_state.settings, shared_prefix_kernels="triton")  # this test's state
    world = _world("mha", 1)
    runner = SimpleNamespace(device="cpu", use_mla_backend=False, req_to_token_pool=world.rows,
                             token_to_kv_pool=world.kv, model_config=SimpleNamespace(
                                 num_attention_heads=4, get_total_num_kv_heads=lambda: 4))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="only under Triton's interpreter"):
        ab.create_backend(runner)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ab.create_backend(runner).decoder.kernels.describe()["kernels"] == "triton"


def test_refused_on_a_torch_without_the_fused_cpu_attention_kernel(monkeypatch):
    """The partials run a torch-internal kernel: a torch without it is refused at start-up, by name."""
    from sglang_pd.srt.attention import partials as attention_partials

    world = _world("mha", 1)
    runner = SimpleNamespace(device="cpu", use_mla_backend=False, req_to_token_pool=world.rows,
                             token_to_kv_pool=world.kv)
    assert ab.unsupported_runner(runner) is None
    monkeypatch.setattr(attention_partials, "_KERNEL_NAME", "_no_such_kernel_for_cpu")
    with pytest.raises(ValueError, match="_no_such_kernel_for_cpu"):
        ab.create_backend(runner)


def test_metric_names_stay_distinct_once_prometheus_drops_the_total_suffix():
    from sglang_pd.srt.metrics.pd_metrics import METRICS

    exported = [name.removesuffix("_total") if kind == "counter" else name for name, (kind, _) in METRICS.items()]
    assert len(exported) == len(set(exported))


def test_the_servers_own_process_refuses_what_its_arguments_already_tell():
    """start_up_problem (called by the engine hook before any subprocess): None for a server that does
    not name the backend or can run it; the runner-time words for one that cannot (the C-compiler case
    runs as a real server in test_bad_settings.py)."""
    graphs = lambda decode, prefill: SimpleNamespace(decode=SimpleNamespace(backend=decode),  # noqa: E731
                                                     prefill=SimpleNamespace(backend=prefill))
    args = lambda **kw: SimpleNamespace(**{**dict(device="cpu", attention_backend="torch_native",  # noqa: E731
                                                  decode_attention_backend=None, prefill_attention_backend=None,
                                                  cuda_graph_config=graphs("disabled", "disabled")), **kw})
    assert ab.start_up_problem(args()) is None
    assert ab.start_up_problem(args(attention_backend=ab.BACKEND_NAME)) is None  # this box builds the C kernel
    assert ab.start_up_problem(args(device="cuda", attention_backend=None, decode_attention_backend=ab.BACKEND_NAME,
                                    prefill_attention_backend="triton")) is None
    refused = ab.start_up_problem(args(device="cuda", attention_backend=ab.BACKEND_NAME,
                                       cuda_graph_config=graphs("full", "breakable")))
    assert refused.startswith(f"--attention-backend {ab.BACKEND_NAME} cannot serve this server: the decode CUDA graph")
    refused = ab.start_up_problem(args(device="cuda", attention_backend=ab.BACKEND_NAME,
                                       cuda_graph_config=graphs("disabled", "breakable")))
    assert "--cuda-graph-backend-prefill disabled" in refused
    for feature, value, words in (("speculative_algorithm", "EAGLE", "speculative decoding"),
                                  ("enable_two_batch_overlap", True, "--enable-two-batch-overlap"),
                                  ("enable_pd_role_switch", True, "--enable-pd-role-switch"),
                                  ("attn_dp_size", 2, "attention data parallelism")):
        assert words in ab.start_up_problem(args(attention_backend=ab.BACKEND_NAME, **{feature: value}))


def test_cuda_graph_entry_points_answer_or_refuse_in_words():
    world = _world("mha", 1)
    assert world.shared.get_cuda_graph_seq_len_fill_value() == 1
    with pytest.raises(ValueError, match="cannot be captured in a CUDA graph"):
        world.shared.init_cuda_graph_state(8, 8)
