"""Shared-prefix decode attention in Triton (the GPU form), over SGLang's paged KV pool in place.

    TritonDecodeKernels.index(segments, own) --TritonIndex--> TritonDecodeKernels.attend(layer, q, ...) per layer

Three kernels, all ours (SGLang's Triton kernels are the references in the tests, not callees):
- `_partial_kernel`, the one attention kernel of both levels: a problem is a list of batch positions
  (queries) and a list of pool slots (keys); every query head of every listed position attends every
  slot, non-causal, online softmax, out + log-sum-exp. Prefix level (`segment_partials`): one problem
  per shared segment, its members' queries against its slots, so the segment's KV is read once per
  block of BLOCK_M query rows (members x query heads of one kv head), by `tl.dot`. Own level
  (`own_partials`): one problem per request, its own slots in CSR (indptr + indices, OwnSlots). An
  empty key list gives out 0 and lse -inf. Keys and values are read in place from the pool buffers
  [slots, kv heads, head_dim] by slot index: no gather, page size does not matter (slots are tokens).
- `_merge_kernel`: the exact N-way merge of a request's partials (its segments', its own) into the
  output, in one pass (online softmax over the partials; all -inf gives 0, lse -inf).
Own level, why not SGLang's `decode_attention_fwd` (it takes kv_indptr/kv_indices): its stage 2
writes the output only, not the log-sum-exp the merge needs, and a request with no own keys would
divide 0 by 0; its per-split LSEs are an internal layout. It is the whole-row reference in the tests.
Merge, why not SGLang's `merge_state`: two partials per call, aligned rows, NaN when both sides are
empty (-inf - -inf); ours merges any number by row index. It is compared with ours in the tests.

Numerics: the pool's K/V tiles are converted to float32 and both dots run in IEEE float32
(`input_precision="ieee"`: no TF32 on GPUs that would use it), accumulators float32; output in q's dtype.
A 16-bit tensor-core dot for bf16/fp16 pools would be faster and is not done.

Capture-readiness: NOT capture-ready. `index` builds new index tensors every forward (host lists ->
device) and `attend` allocates its partial buffers every layer call, and the grid depends on the batch's
grouping: a CUDA server with this path needs the decode CUDA graph off, which the start-up check
(device_form.py) demands in words. These kernels and the backend's forwards through them run here only
under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, test/registered/unit/
test_triton_shared_prefix.py); no CUDA forward has run.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import triton
import triton.language as tl

from sglang_pd.srt.attention.own_decode_kernel import OwnSlots
from sglang_pd.srt.attention.prefix_groups import SharedSegment
from sglang_pd.srt.attention.segment_kv_cache import RequestKey, SegmentStep

BLOCK_M = 16  # query rows (positions x query heads of one kv head) per program; tl.dot needs >= 16
BLOCK_N = 16  # keys per step of the online softmax


@triton.jit
def _partial_kernel(Q, K, V, O, LSE, q_indptr, q_batch, kv_indptr, kv_indices, row_offset, sm_scale,
                    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_or, stride_oh,
                    stride_lr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (problem p, kv head, row block): rows are (position j of the problem, query head g of the
    kv head); partial row row_offset + q_indptr[p] + j of O / LSE."""
    p = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_start = tl.load(q_indptr + p)
    num_rows = (tl.load(q_indptr + p + 1) - q_start) * GROUP
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = offs_m < num_rows
    member = offs_m // GROUP
    q_head = kv_head * GROUP + offs_m % GROUP
    batch = tl.load(q_batch + q_start + member, mask=row_mask, other=0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_mask = offs_d < HEAD_DIM
    dv_mask = offs_dv < V_DIM
    q = tl.load(Q + batch[:, None] * stride_qb + q_head[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    kv_start = tl.load(kv_indptr + p)
    kv_end = tl.load(kv_indptr + p + 1)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start in range(kv_start, kv_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        slot = tl.load(kv_indices + offs_n, mask=n_mask, other=0).to(tl.int64)
        k = tl.load(K + slot[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every block has a key
        alpha = tl.exp(m_i - m_new)
        weights = tl.exp(s - m_new[:, None])
        v = tl.load(V + slot[:, None] * stride_vs + kv_head * stride_vh + offs_dv[None, :],
                    mask=n_mask[:, None] & dv_mask[None, :], other=0.0).to(tl.float32)
        l_i = l_i * alpha + tl.sum(weights, 1)
        acc = acc * alpha[:, None] + tl.dot(weights, v, input_precision="ieee")
        m_i = m_new
    filled = l_i > 0.0
    out = acc / tl.where(filled, l_i, 1.0)[:, None]
    lse = tl.where(filled, m_i + tl.log(tl.where(filled, l_i, 1.0)), float("-inf"))
    row = (row_offset + q_start + member).to(tl.int64)
    tl.store(O + row[:, None] * stride_or + q_head[:, None] * stride_oh + offs_dv[None, :], out,
             mask=row_mask[:, None] & dv_mask[None, :])
    tl.store(LSE + row * stride_lr + q_head, lse, mask=row_mask)


@triton.jit
def _merge_kernel(O_PART, LSE_PART, merge_indptr, merge_rows, OUT, OUT_LSE, stride_pr, stride_ph, stride_lr,
                  stride_ob, stride_oh, stride_lb, V_DIM: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Program (batch position b, query head h): merge partial rows merge_rows[merge_indptr[b]:...]."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK_DV)
    mask = offs < V_DIM
    m = float("-inf")
    total = 0.0
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for i in range(tl.load(merge_indptr + b), tl.load(merge_indptr + b + 1)):
        row = tl.load(merge_rows + i).to(tl.int64)
        lse = tl.load(LSE_PART + row * stride_lr + h)
        part = tl.load(O_PART + row * stride_pr + h * stride_ph + offs, mask=mask, other=0.0)
        m_new = tl.maximum(m, lse)
        pivot = tl.where(m_new == float("-inf"), 0.0, m_new)  # both empty so far: weights exp(-inf) = 0
        scale = tl.exp(m - pivot)
        weight = tl.exp(lse - pivot)
        acc = acc * scale + weight * part
        total = total * scale + weight
        m = m_new
    filled = total > 0.0
    out = acc / tl.where(filled, total, 1.0)
    tl.store(OUT + b * stride_ob + h * stride_oh + offs, out.to(OUT.dtype.element_ty), mask=mask)
    tl.store(OUT_LSE + b * stride_lb + h, tl.where(filled, m + tl.log(tl.where(filled, total, 1.0)), float("-inf")))


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def attend_problems(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, q_indptr: torch.Tensor,
                    q_batch: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, max_positions: int,
                    sm_scale: float, out: torch.Tensor, lse: torch.Tensor, row_offset: int = 0) -> None:
    """Problem p: positions q_batch[q_indptr[p]:q_indptr[p+1]] of q [B, Hq, D] against pool slots
    kv_indices[kv_indptr[p]:kv_indptr[p+1]] of k_buf / v_buf [slots, Hkv, D]; writes (softmax out,
    lse) of position j of problem p into row row_offset + q_indptr[p] + j of out [R, Hq, Dv] / lse [R, Hq]
    (float32).
    `max_positions`: the most positions of any problem (sets the grid). Mutates out and lse only."""
    num_problems = q_indptr.numel() - 1
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, v_dim = k_buf.shape[1], v_buf.shape[2]
    if num_q_heads % num_kv_heads or k_buf.stride(2) != 1 or v_buf.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError(f"{num_q_heads} query heads over {num_kv_heads} kv heads, or a non-unit head_dim stride")
    group = num_q_heads // num_kv_heads
    if num_problems == 0 or max_positions == 0:
        return
    grid = (num_problems, num_kv_heads, triton.cdiv(max_positions * group, BLOCK_M))
    _partial_kernel[grid](q, k_buf, v_buf, out, lse, q_indptr, q_batch, kv_indptr, kv_indices, row_offset, sm_scale,
                          q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
                          out.stride(0), out.stride(1), lse.stride(0), GROUP=group, HEAD_DIM=head_dim, V_DIM=v_dim,
                          BLOCK_D=_block(head_dim), BLOCK_DV=_block(v_dim), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)


def segment_partials(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, members: torch.Tensor,
                     slots: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix level for one segment: positions `members` of q [B, Hq, D] against pool `slots` (read
    once per block of query rows). Returns new (out [m, Hq, Dv], lse [m, Hq]) float32. Read-only on inputs."""
    out, lse = _partial_buffers(q, v_buf, members.numel())
    indptr = torch.tensor([0, members.numel()], dtype=torch.int32, device=q.device)
    kv_indptr = torch.tensor([0, slots.numel()], dtype=torch.int32, device=q.device)
    attend_problems(q, k_buf, v_buf, indptr, members.to(q.device), kv_indptr, slots.to(q.device), members.numel(),
                    sm_scale, out, lse)
    return out, lse


def own_partials(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, own: OwnSlots,
                 sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The own level: position b of q [B, Hq, D] against its own slots (CSR, OwnSlots) read in place.
    Returns new (out [B, Hq, Dv], lse [B, Hq]) float32; a request with no own slots gets 0 / -inf."""
    batch = q.shape[0]
    out, lse = _partial_buffers(q, v_buf, batch)
    positions = torch.arange(batch, dtype=torch.int32, device=q.device)
    attend_problems(q, k_buf, v_buf, torch.arange(batch + 1, dtype=torch.int32, device=q.device), positions,
                    own.indptr.to(q.device), own.slots.to(q.device), 1, sm_scale, out, lse)
    return out, lse


def merge_partials(o_part: torch.Tensor, lse_part: torch.Tensor, merge_indptr: torch.Tensor, merge_rows: torch.Tensor,
                   out: torch.Tensor, out_lse: torch.Tensor) -> None:
    """out[b] / out_lse[b] = the exact merge of partial rows merge_rows[merge_indptr[b]:merge_indptr[b+1]]
    of o_part [R, Hq, Dv] / lse_part [R, Hq] (float32). out in any float dtype; out_lse float32. Mutates
    out and out_lse only."""
    batch, num_q_heads, v_dim = out.shape
    if batch == 0:
        return
    _merge_kernel[(batch, num_q_heads)](o_part, lse_part, merge_indptr, merge_rows, out, out_lse, o_part.stride(0),
                                        o_part.stride(1), lse_part.stride(0), out.stride(0), out.stride(1),
                                        out_lse.stride(0), V_DIM=v_dim, BLOCK_DV=_block(v_dim))


def _partial_buffers(q: torch.Tensor, v_buf: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(rows, q.shape[1], v_buf.shape[2], dtype=torch.float32, device=q.device),
            torch.empty(rows, q.shape[1], dtype=torch.float32, device=q.device))


class TritonIndex(NamedTuple):
    """One forward's index tensors (on the pool's device), built once, read by every layer.

    Partial rows: segment s's members take rows seg_q_indptr[s]:seg_q_indptr[s+1]; position b's own
    part takes row num_segment_rows + b; position b merges rows merge_rows[merge_indptr[b]:...]."""

    seg_q_indptr: torch.Tensor   # int32 [S + 1]
    seg_q_batch: torch.Tensor    # int32 [segment rows]: batch positions
    seg_kv_indptr: torch.Tensor  # int32 [S + 1]
    seg_kv_indices: torch.Tensor  # int32 [segment tokens]: pool slots
    own_q_indptr: torch.Tensor   # int32 [B + 1]: 0..B (one position per own problem)
    own_q_batch: torch.Tensor    # int32 [B]: 0..B-1
    own_kv_indptr: torch.Tensor  # int32 [B + 1]
    own_kv_indices: torch.Tensor  # int32 [own tokens]
    merge_indptr: torch.Tensor   # int32 [B + 1]
    merge_rows: torch.Tensor     # int32 [segment rows + B]
    max_members: int
    num_segment_rows: int        # own rows start here


def build_index(segments: Sequence[SegmentStep], own: OwnSlots, batch_size: int, device) -> TritonIndex:
    """The index tensors of one forward (host lists -> `device`; allocates). Read-only on its inputs."""
    seg_q, seg_kv, seg_batch, seg_slots = [0], [0], [], []
    rows_of: list[list[int]] = [[] for _ in range(batch_size)]
    for seg in segments:
        for member in seg.members.tolist():
            rows_of[member].append(len(seg_batch))
            seg_batch.append(member)
        seg_q.append(len(seg_batch))
        seg_slots.append(seg.slots.to(torch.int32).cpu())
        seg_kv.append(seg_kv[-1] + seg.slots.numel())
    num_seg_rows = len(seg_batch)
    merge_indptr, merge_rows = [0], []
    for b, rows in enumerate(rows_of):
        merge_rows.extend(rows + [num_seg_rows + b])
        merge_indptr.append(len(merge_rows))
    ints = lambda values: torch.tensor(values, dtype=torch.int32).to(device)  # noqa: E731
    slots = torch.cat(seg_slots) if seg_slots else torch.empty(0, dtype=torch.int32)
    return TritonIndex(ints(seg_q), ints(seg_batch), ints(seg_kv), slots.to(device),
                       ints(list(range(batch_size + 1))), ints(list(range(batch_size))),
                       own.indptr.to(torch.int32).to(device), own.slots.to(torch.int32).to(device),
                       ints(merge_indptr), ints(merge_rows), max((s.members.numel() for s in segments), default=0),
                       num_seg_rows)


class TritonDecodeKernels:
    """The DecodeKernels implementation for Triton (module docstring): segments read in place by slot, no
    gathered copy, so nothing is kept between forwards. Stateless."""

    def segment_steps(self, segments: Sequence[SharedSegment], keys: Sequence[RequestKey], continuing: Sequence[bool],
                      pool_k: Sequence[torch.Tensor], pool_v: Sequence[torch.Tensor]) -> tuple[SegmentStep, ...]:
        """Each segment as its members and slots (read in place every layer, never gathered). Read-only."""
        return tuple(SegmentStep(torch.tensor(seg.members, dtype=torch.int64), (), (), False, seg.slots)
                     for seg in segments)

    def index(self, segments: Sequence[SegmentStep], own: OwnSlots, batch_size: int, device) -> TritonIndex:
        """This forward's index tensors (build_index)."""
        return build_index(segments, own, batch_size, device)

    def attend(self, layer: int, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan, scale: float,
               average_merge: bool = False) -> torch.Tensor:
        """q [B, Hq, D] (unscaled) against plan's segments and own parts in k_buf / v_buf; returns new
        [B, Hq, Dv] in q's dtype. Read-only on the pool. Raises ValueError for the CPU-only merge fault."""
        if average_merge:
            raise ValueError("the shared_merge_average fault exists on the CPU path only")
        index: TritonIndex = plan.index
        batch, num_q_heads = q.shape[0], q.shape[1]
        rows = index.merge_rows.numel()
        o_part = torch.empty(rows, num_q_heads, v_buf.shape[2], dtype=torch.float32, device=q.device)
        lse_part = torch.empty(rows, num_q_heads, dtype=torch.float32, device=q.device)
        attend_problems(q, k_buf, v_buf, index.seg_q_indptr, index.seg_q_batch, index.seg_kv_indptr,
                        index.seg_kv_indices, index.max_members, scale, o_part, lse_part)
        attend_problems(q, k_buf, v_buf, index.own_q_indptr, index.own_q_batch, index.own_kv_indptr,
                        index.own_kv_indices, 1, scale, o_part, lse_part, index.num_segment_rows)
        out = torch.empty(batch, num_q_heads, v_buf.shape[2], dtype=q.dtype, device=q.device)
        merge_partials(o_part, lse_part, index.merge_indptr, index.merge_rows, out,
                       torch.empty(batch, num_q_heads, dtype=torch.float32, device=q.device))
        return out

    def describe(self) -> dict:
        """JSON-able description (read-only)."""
        return {"kernels": "triton", "module": __name__, "block_m": BLOCK_M, "block_n": BLOCK_N}
