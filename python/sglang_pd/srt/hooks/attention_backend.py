"""`--attention-backend sglang_pd_shared_prefix`: decode attention by shared physical prefix.

Registered by name in SGLang's own attention-backend registry (`ATTENTION_BACKENDS`) and argument
choices (`ATTENTION_BACKEND_CHOICES`) by the plugin, so a server selects it on its command line.
The backend wraps SGLang's `TorchNativeAttnBackend` (built from the same model runner) and:

- decode forwards: grouped once per forward (`init_forward_metadata`) by the KV slots the requests'
  req_to_token rows share (prefix_groups.py) and planned by `SharedPrefixDecoder` (each segment read
  once for all its members, own parts read in place from the pool by a C kernel,
  own_decode_kernel.py); every layer then runs `SharedPrefixDecoder.attend`;
- extend forwards (prefill servers, decode-local prefill): causal self-attention attends with only the
  new queries (local_extend_attention.offset_causal_extend);
- what it does not serve goes to the wrapped backend: decode layer calls counted by reason
  (`AttentionFallback`: sliding-window layers, cross attention, logit cap, encoder tokens, hybrid SWA
  pool, beam search), and extend layer calls that are not plain causal self-attention; idle forwards.

Kernels: CPU devices `CpuDecodeKernels`, CUDA devices `TritonDecodeKernels` (attention/device_form.py;
checked here on CPU tensors under Triton's interpreter only, no CUDA forward has run: docs/gpu/README.md).
A MIXED forward (one-token rows attended by the plan) reaches a backend only where SGLang keeps MIXED
(NPU, context parallel): 0.5.23's eager runner hands it over as EXTEND elsewhere. Refused at start-up,
in words (ValueError; the server's own process refuses first, attention/serving_checks.py): devices,
CUDA graphs and kernel builds this backend cannot run, server features no run has taken through it,
torch.compile, MLA, non-MHA/SWA pools, fp8 KV, unexpected KV layouts. Logic lives in srt/attention.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from sglang_pd.srt.attention import (MixedRows, offset_causal_extend,
                                                                  offset_causal_extend_rows)
from sglang_pd.srt.attention import OwnDecodeKernel
from sglang_pd.srt.attention import find_prefix_groups
from sglang_pd.srt.attention import RequestKey
from sglang_pd.srt.attention import AttentionFallback, SharedAttentionStats
from sglang_pd.srt.attention import CpuDecodeKernels, DecodePlan, SharedPrefixDecoder
from sglang_pd.srt.attention import KernelChoice, serving_checks
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.state import current

BACKEND_NAME = "sglang_pd_shared_prefix"
# A run shared by >= 2 requests becomes a group only from this many tokens: shorter runs cost more
# in per-group work than they save in KV reads (bench_attention).
MIN_SHARED_TOKENS = 16
# ... and only when the token reads it saves per layer ((members - 1) x length), times the query heads
# that read each token, reach this. A segment costs a fused-kernel call, a merge and their dispatch per
# layer (~70-85 us here), far more than the reads a small group spares: measured side by side with
# grouping on and off (bench_attention --versus-group-all, docs/results/shared_prefix/min_reads_saved/), the
# break-even was ~2,000 saved reads with 4 query heads (capacity) and ~1,000 with 9 (SmolLM2).
MIN_SAVED_HEAD_READS = 8192


def min_reads_saved_for(num_q_heads: int) -> int:
    """Saved token reads per layer a segment needs before it is worth its own kernel call."""
    return -(-MIN_SAVED_HEAD_READS // max(1, num_q_heads))


def register_backend_choice() -> None:
    """Make BACKEND_NAME a valid --attention-backend / --decode-attention-backend value (idempotent)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])


def register_backend_factory() -> None:
    """Put create_backend in SGLang's ATTENTION_BACKENDS under BACKEND_NAME (idempotent)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(create_backend)


def kernel_choice(runner) -> KernelChoice:
    """The kernels this runner's device takes (attention/serving_checks.py)."""
    return serving_checks.kernel_choice(runner, BACKEND_NAME, current().settings.shared_prefix_kernels)


def unsupported_runner(runner, choice: KernelChoice | None = None) -> str | None:
    """Why this model runner cannot use the backend at all, or None (`choice`: kernel_choice(runner))."""
    return serving_checks.runner_problem(runner, choice or kernel_choice(runner))


def start_up_problem(server_args) -> str | None:
    """In the server's own process, before any subprocess (the engine hook): why a server naming this backend
    cannot serve with it as far as its arguments tell, in create_backend's words; None otherwise."""
    problem = serving_checks.server_args_problem(server_args, BACKEND_NAME, current().settings.shared_prefix_kernels)
    return None if problem is None else f"--attention-backend {BACKEND_NAME} cannot serve this server: {problem}"


def create_backend(runner):
    """SGLang's factory call for BACKEND_NAME: the backend around a TorchNativeAttnBackend.

    Raises ValueError when the runner's configuration cannot be served (see unsupported_runner)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    choice = kernel_choice(runner)
    problem = unsupported_runner(runner, choice)
    if problem is not None:
        raise ValueError(f"--attention-backend {BACKEND_NAME} cannot serve this server: {problem}")
    stats = current().shared_attention
    config = runner.model_config  # query heads on this rank: its KV heads x the model's GQA factor
    num_q_heads = runner.token_to_kv_pool.head_num * config.num_attention_heads // config.get_total_num_kv_heads()
    backend = SharedPrefixAttnBackend(TorchNativeAttnBackend(runner), stats, num_q_heads, kernels=choice.kernels)
    stats.on_backend_created(BACKEND_NAME, backend.decoder.kernels.describe(), backend.min_reads_saved)
    return backend


def _layer_fallback(layer) -> AttentionFallback | None:
    if layer.is_cross_attention:
        return AttentionFallback.CROSS_ATTENTION
    if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
        return AttentionFallback.SLIDING_WINDOW
    if layer.logit_cap and layer.logit_cap > 0:
        return AttentionFallback.LOGIT_CAP
    return None


def _extend_lens(forward_batch) -> list[int]:
    lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
    return [int(n) for n in (lens if lens is not None else forward_batch.extend_seq_lens.tolist())]


def _extend_fallback(layer, forward_batch) -> bool:
    """True when an extend layer call is not plain causal self-attention over the pool."""
    from sglang.srt.layers.radix_attention import AttentionType

    return (layer.is_cross_attention or layer.attn_type == AttentionType.ENCODER_ONLY
            or forward_batch.encoder_lens is not None
            or (layer.sliding_window_size is not None and layer.sliding_window_size > -1))


class SharedPrefixAttnBackend(AttentionBackend):
    """SGLang AttentionBackend: shared-prefix decode, everything else by the wrapped `inner` backend."""

    def __init__(self, inner, stats: SharedAttentionStats, num_q_heads: int, min_shared_tokens: int = MIN_SHARED_TOKENS,
                 min_reads_saved: int | None = None, kernels: str = "cpu"):
        """`num_q_heads`: query heads per layer on this rank (sets `min_reads_saved` when it is None; 0
        groups every shared run of `min_shared_tokens`). `kernels`: "cpu" (CpuDecodeKernels) or "triton"
        (TritonDecodeKernels; on CPU tensors only under TRITON_INTERPRET=1). Raises KernelBuildError when
        the own-part C kernel cannot be built here."""
        super().__init__()
        self.inner = inner
        self.stats = stats
        self.min_shared_tokens = min_shared_tokens
        self.min_reads_saved = min_reads_saved_for(num_q_heads) if min_reads_saved is None else min_reads_saved
        pool = inner.token_to_kv_pool
        self.layer_ids = range(pool.start_layer, pool.start_layer + pool.layer_num)
        if kernels == "triton":
            from sglang_pd.srt.attention.triton_kernels import TritonDecodeKernels  # imports triton: only here

            self.decoder = SharedPrefixDecoder(TritonDecodeKernels())
        elif kernels == "cpu":
            self.decoder = SharedPrefixDecoder(CpuDecodeKernels(pool.head_num, pool.head_dim, OwnDecodeKernel()))
        else:
            raise ValueError(f"kernels {kernels!r}: cpu or triton")
        self.plan: DecodePlan | None = None
        self.batch_fallback: AttentionFallback | None = None
        self.planned_batch = None  # the ForwardBatch the plan was built for (a plan never serves another)

    def init_forward_metadata(self, forward_batch) -> None:
        """Once per forward: the wrapped backend's metadata, and for a decode forward (or the decode rows
        of a mixed one: its one-token rows) the grouping + plan."""
        self.inner.init_forward_metadata(forward_batch)
        self.plan, self.batch_fallback, self.planned_batch = None, None, forward_batch
        self.decode_rows = None
        mode = forward_batch.forward_mode
        if not (mode.is_decode() or mode.is_mixed()):
            return
        if forward_batch.encoder_lens is not None:
            self.batch_fallback = AttentionFallback.ENCODER_LENS
        elif self.inner.use_sliding_window_kv_pool:
            self.batch_fallback = AttentionFallback.SWA_KV_POOL
        elif forward_batch.rids is not None and len(forward_batch.rids) != forward_batch.batch_size:
            # SGLang's beam search (beam_search/batch_tail.py) appends its member rows to req_pool_indices
            # and seq_lens but not to rids: those rows have no request id to follow between steps, and
            # ForwardBatch carries no other beam marker.
            self.batch_fallback = AttentionFallback.BEAM_SEARCH
        elif mode.is_decode():
            self.plan = self._plan(forward_batch, list(range(forward_batch.batch_size)))
        else:
            self.decode_rows = MixedRows.of(_extend_lens(forward_batch))
            if self.decode_rows.positions:
                self.plan = self._plan(forward_batch, self.decode_rows.positions)

    def _plan(self, forward_batch, positions: list[int]) -> DecodePlan:
        """The decode plan of batch `positions` (each attending one new token)."""
        if forward_batch.rids is None:
            raise RuntimeError(f"{BACKEND_NAME}: decode ForwardBatch without rids: requests cannot be told apart "
                               "between steps")
        all_seq_lens = (forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None
                        else forward_batch.seq_lens).tolist()
        seq_lens = [all_seq_lens[i] for i in positions]
        row_pool = self.inner.req_to_token_pool
        pool_indices = forward_batch.req_pool_indices.cpu()[torch.tensor(positions)]
        # grouped on the host (one copy of the batch's rows per forward on a GPU); the kernels' index
        # tensors go to the pool's device (DecodeKernels.index)
        rows = row_pool.req_to_token[pool_indices.to(row_pool.req_to_token.device), :max(seq_lens)].cpu()
        grouping = find_prefix_groups(rows, seq_lens, self.min_shared_tokens, self.min_reads_saved)
        generations = row_pool.req_generation[pool_indices].tolist()  # bumped on every row allocation
        keys = [RequestKey(forward_batch.rids[i], idx, generation)
                for i, idx, generation in zip(positions, pool_indices.tolist(), generations)]
        pool = self.inner.token_to_kv_pool
        plan = self.decoder.plan(grouping, rows, keys, [pool.get_key_buffer(i) for i in self.layer_ids],
                                 [pool.get_value_buffer(i) for i in self.layer_ids])
        self.stats.on_step(grouping, plan)
        faults = current().faults
        self.decoder.average_merge = bool(faults.enabled and plan.segments and faults.take(Fault.SHARED_MERGE_AVERAGE))
        return plan

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        """Causal self-attention extends attend with only their new queries (offset_causal_extend, where
        torch_native computes a query block as long as the whole sequence); in a mixed forward the
        one-token rows (the decoding requests) attend by shared prefix with the decode plan. Anything
        else (cross or encoder-only attention, sliding window, encoder tokens, hybrid SWA pool) is
        delegated unchanged."""
        if forward_batch is not self.planned_batch:
            raise RuntimeError(f"{BACKEND_NAME}: extend forward of a batch init_forward_metadata did not see")
        if _extend_fallback(layer, forward_batch) or self.inner.use_sliding_window_kv_pool:
            return self.inner.forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        pool = self.inner.token_to_kv_pool
        if save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = q3.new_empty((q3.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        rows = self.decode_rows if self.plan is not None else None
        extend_positions = rows.others if rows is not None else list(range(forward_batch.batch_size))
        if extend_positions:
            self._offset_causal(q3, out, k_buf, v_buf, layer, forward_batch, extend_positions,
                                None if rows is None else rows.other_tokens)
        if rows is not None:
            tokens = torch.tensor(rows.tokens, dtype=torch.int64, device=q3.device)
            attended = self.decoder.attend(layer.layer_id - self.layer_ids.start, q3.index_select(0, tokens), k_buf,
                                           v_buf, self.plan, layer.scaling)
            out.index_copy_(0, tokens, attended.to(out.dtype))
        self.stats.on_extend(q3.shape[0] - (len(rows.tokens) if rows is not None else 0))
        return out.reshape(q3.shape[0], layer.tp_q_head_num * layer.v_head_dim)

    def _offset_causal(self, q3, out, k_buf, v_buf, layer, forward_batch, positions: list[int],
                       tokens: list[int] | None) -> None:
        """offset_causal_extend over batch `positions` whose query rows are `tokens` (None: all, in order)."""
        offset_causal_extend_rows(q3, out, k_buf, v_buf, self.inner.req_to_token_pool.req_to_token,
                                  forward_batch.req_pool_indices, forward_batch.seq_lens,
                                  forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens, positions, tokens,
                                  scaling=layer.scaling, enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        """Store this step's K/V, then attend by shared prefix (or fall back, counted by reason)."""
        if forward_batch is not self.planned_batch:
            raise RuntimeError(f"{BACKEND_NAME}: decode forward of a batch init_forward_metadata did not plan")
        reason = self.batch_fallback or _layer_fallback(layer)
        if reason is not None:
            self.stats.on_fallback(reason)
            return self.inner.forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        pool = self.inner.token_to_kv_pool
        if save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = self.decoder.attend(layer.layer_id - self.layer_ids.start, q3, pool.get_key_buffer(layer.layer_id),
                                  pool.get_value_buffer(layer.layer_id), self.plan, layer.scaling)
        return out.reshape(q3.shape[0], layer.tp_q_head_num * layer.v_head_dim)

    def get_cuda_graph_seq_len_fill_value(self):
        """Padded sequences' length when SGLang pads a batch (as its Triton backend: 1)."""
        return 1

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        """Refused in words: start-up refuses every set-up that captures this backend (device_form.py)."""
        raise ValueError(f"{BACKEND_NAME} cannot be captured in a CUDA graph: its plan and buffers change every "
                         "forward; run its phase with --cuda-graph-backend-decode disabled")

    def support_triton(self):
        """SGLang's own Triton helpers for the batch (positions, cache locations) are not used: the torch
        path, as the wrapped TorchNativeAttnBackend (both kernel forms)."""
        return False


# ---- decode-local prefill: the local extend's attention -------------------------------------------
def around_run_sdpa_forward_extend(original, backend, query, output, k_cache, v_cache, req_to_token,
                                   req_pool_indices, seq_lens, extend_prefix_lens, extend_seq_lens,
                                   encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
                                   is_cross_attn=False, sliding_window_size=None):
    """On a decode scheduler with decode-local prefill, causal extends (only local extends run there)
    attend with only their own queries (attention/local_extend.py); everything else, and prefill, as
    upstream."""
    state = current()
    plain_causal = causal and encoder_lens is None and not is_cross_attn and (
        sliding_window_size is None or sliding_window_size <= -1)
    if not (plain_causal and state.local_prefill.enabled and state.counters.role == "decode"):
        return original(backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling, enable_gqa=enable_gqa,
                        causal=causal, is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    return offset_causal_extend(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                extend_prefix_lens, extend_seq_lens, scaling=scaling, enable_gqa=enable_gqa)
