"""The own-part decode kernel: each request's own KV read in place from the pool (csrc/own_decode.c).

    own_slots(rows, own_starts, seq_lens) --OwnSlots--> OwnDecodeKernel.merge_own(q, k_buf, v_buf, own, acc)

A decode request's own part (what no shared segment covers: prompt suffix, earlier turns only it
reads, generated tokens) is attended per layer by one C call for the whole batch, merged in place
into the accumulators that already hold the shared segments' partials. The C source ships in the
package and is compiled once per process, at first use (about 0.3 s), into a temporary folder with
the C compiler of the machine that runs it (`$CC`, else `cc`), `-O3 -march=native` where the
compiler takes it: a cached binary could meet another CPU. No compiler, or a build that fails, is a
`KernelBuildError` naming the command and its output; the backend then refuses to start.

`-fno-fast-math` comes after whatever a `$CC` wrapper puts first: a reassociating float mode once
folded the exp's rounding away (outputs off by up to 0.3), and a `-ffast-math` link adds a start-up
routine that switches the loading thread to flush-to-zero, changing every later torch op. The loaded
kernel is then checked before it serves (`self_test_problem`: a few float32 tokens, MHA and GQA,
against torch; and the thread's float mode unchanged by the load): a kernel that fails either check
is a `KernelBuildError` naming the compiler and flags, so the server does not start on it.

Why not torch: the own parts are scattered pool slots; torch must first gather them into a dense
tensor (a copy per layer) or keep a dense copy between steps (the own-KV arena this replaces: a
fill per joining request, moves, drops and per-band step bookkeeping). Measured side by side under
churn (bench_attention --churn): the arena's step 10.7 ms, this kernel's 6.4 ms, same outputs.
Single-threaded (SGLang's CPU servers here run one torch thread). Pure ctypes, no SGLang import.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "own_decode.c"
SYMBOL = "sglang_pd_own_decode_merge"
BASE_FLAGS = ("-O3", "-std=gnu11", "-fno-fast-math", "-fopenmp-simd", "-shared", "-fPIC")
NATIVE_FLAG = "-march=native"
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_ERRORS = {1: "a slot outside the KV pool", 2: "shapes the kernel does not take", 3: "no memory for its scratch"}
# The self-test's bound on max |diff| against torch: float32 rounding of these few tokens stays near
# 1e-6, a wrong exp or merge is off by 1e-2 and more.
SELF_TEST_TOLERANCE = 1e-4


class KernelBuildError(RuntimeError):
    """The C kernel could not be compiled or loaded here, or failed its start-up checks (the message names
    the command, and its output or what the check found)."""


@dataclass(frozen=True)
class OwnSlots:
    """Every request's own KV slots, request after request (CSR)."""

    indptr: torch.Tensor  # int64 [B + 1]: request b's slots are slots[indptr[b]:indptr[b + 1]]
    slots: torch.Tensor   # int32 [num_tokens]

    @property
    def num_tokens(self) -> int:
        """Own KV tokens a layer reads (no padding)."""
        return self.slots.numel()


def own_slots(rows: torch.Tensor, own_starts: Sequence[int], seq_lens: Sequence[int]) -> OwnSlots:
    """The own parts [own_starts[i], seq_lens[i]) of rows (req_to_token rows [B, >= max seq_len]) as
    OwnSlots. Read-only."""
    starts = torch.tensor(own_starts, dtype=torch.int64)
    ends = torch.tensor(seq_lens, dtype=torch.int64)
    columns = torch.arange(rows.shape[1], dtype=torch.int64).view(1, -1)
    inside = (columns >= starts.view(-1, 1)) & (columns < ends.view(-1, 1))
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int64)
    torch.cumsum(ends - starts, 0, out=indptr[1:])
    return OwnSlots(indptr, rows[inside].to(torch.int32).contiguous())


@dataclass(frozen=True)
class BuildInfo:
    """How this process's kernel was built (shown on /sglang_pd/stats)."""

    compiler: str
    flags: tuple[str, ...]
    seconds: float
    native_refused: str  # why -march=native was left out ("" when used)


def _compile(compiler: str, flags: Sequence[str], out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([compiler, *flags, "-o", str(out), str(SOURCE), "-lm"], capture_output=True, text=True,
                          timeout=120)


def _flushes_subnormals() -> bool:
    """Whether this thread's float mode flushes float32 subnormals to zero (FTZ/DAZ)."""
    return float((torch.tensor([2.0 ** -140]) * 2.0).item()) == 0.0


def _build_and_load(compiler: str, folder: Path) -> tuple[ctypes.CDLL, tuple[str, ...], str]:
    """Compile SOURCE into `folder` and load it: (library, flags used, why -march=native was refused or "")."""
    out = folder / "own_decode.so"
    flags, native_refused = (*BASE_FLAGS, NATIVE_FLAG), ""
    try:
        done = _compile(compiler, flags, out)
        if done.returncode != 0:
            native_refused = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
            flags = BASE_FLAGS
            done = _compile(compiler, flags, out)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"{compiler} could not compile {SOURCE}: {exc}") from exc
    if done.returncode != 0:
        raise KernelBuildError(f"{compiler} {' '.join(flags)} {SOURCE} failed ({done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
    try:
        return ctypes.CDLL(str(out)), tuple(flags), native_refused  # the mapping outlives the folder
    except OSError as exc:
        raise KernelBuildError(f"built {out.name} but could not load it: {exc}") from exc


@functools.lru_cache(maxsize=1)
def _library() -> tuple[ctypes.CDLL, BuildInfo]:
    """Compile, load and check the kernel once per process; raises KernelBuildError."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelBuildError(f"no C compiler found (set CC, or install gcc): {SOURCE.name} is compiled at start-up")
    start, flushing_before = time.perf_counter(), _flushes_subnormals()
    with tempfile.TemporaryDirectory(prefix="sglang_pd-kernel-") as folder:
        library, flags, native_refused = _build_and_load(compiler, Path(folder))
    command = f"{compiler} {' '.join(flags)} {SOURCE.name}"
    if _flushes_subnormals() and not flushing_before:
        raise KernelBuildError(f"{command}: loading the kernel switched this thread's float mode to flush-to-zero "
                               "(a -ffast-math link's start-up routine); torch results would change")
    fn = getattr(library, SYMBOL)
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [pointer, pointer, pointer, ctypes.c_int32, i64, pointer, pointer, i64, i64, i64, i64, pointer, pointer]
    fn.restype = ctypes.c_int
    problem = self_test_problem(functools.partial(_merge_own, fn))
    if problem is not None:
        raise KernelBuildError(f"{command} built a kernel that computes wrong values: {problem}")
    if native_refused:
        logger.warning("sglang_pd: %s refused %s (%s); the own-part kernel is built without it (slower)",
                       compiler, NATIVE_FLAG, native_refused)
    return library, BuildInfo(compiler, flags, round(time.perf_counter() - start, 3), native_refused)


def build_problem() -> str | None:
    """Why the kernel cannot be built or loaded in this process, or None (builds it if not yet built)."""
    try:
        _library()
    except KernelBuildError as exc:
        return str(exc)
    return None


MergeOwn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, OwnSlots, torch.Tensor, torch.Tensor], None]


def self_test_problem(merge_own: MergeOwn) -> str | None:
    """How `merge_own` (OwnDecodeKernel.merge_own's contract) departs from plain softmax attention in
    torch, or None: float32 pools, MHA (2/2 heads) and GQA (4/2), one request of 40 own tokens (three
    blocks of the kernel) merged into nothing, one of 3 merged into a partial, one with none. Scores
    spread over ~+-15, so a wrong exp shows. Read-only apart from its own tensors; about a millisecond."""
    gen = torch.Generator().manual_seed(0)
    for num_q_heads, num_kv_heads in ((2, 2), (4, 2)):
        k_buf, v_buf = torch.randn(2, 64, num_kv_heads, 32, generator=gen)
        own = OwnSlots(torch.tensor([0, 40, 43, 43]), torch.randperm(64, generator=gen)[:43].to(torch.int32))
        q = torch.randn(3, num_q_heads, 32, generator=gen)
        acc_o, acc_lse = torch.randn(3, num_q_heads, 32, generator=gen), torch.randn(3, num_q_heads, generator=gen)
        acc_lse[0] = float("-inf")
        expected_o, expected_lse = _merged_reference(q, k_buf, v_buf, own, acc_o, acc_lse)
        merge_own(q, k_buf, v_buf, own, acc_o, acc_lse)
        diff = float(torch.cat([(acc_o - expected_o).flatten(), (acc_lse - expected_lse).flatten()]).abs().max())
        if not diff <= SELF_TEST_TOLERANCE:  # NaN too
            return (f"{num_q_heads}/{num_kv_heads} heads: max |diff| {diff:.3g} against torch "
                    f"(tolerance {SELF_TEST_TOLERANCE:g})")
    return None


def _merged_reference(q, k_buf, v_buf, own: OwnSlots, acc_o, acc_lse) -> tuple[torch.Tensor, torch.Tensor]:
    """What merge_own must leave in (acc_o, acc_lse), computed in torch (new tensors)."""
    out_o, out_lse = acc_o.clone(), acc_lse.clone()
    for b in range(q.shape[0]):
        slots = own.slots[own.indptr[b]:own.indptr[b + 1]].long()
        if not slots.numel():
            continue
        group = q.shape[1] // k_buf.shape[1]
        keys, values = (buf[slots].repeat_interleave(group, dim=1) for buf in (k_buf, v_buf))  # [n, Hq, D]
        scores = torch.einsum("hd,nhd->hn", q[b], keys)
        own_o, own_lse = torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), values), torch.logsumexp(scores, -1)
        out_lse[b] = torch.logaddexp(acc_lse[b], own_lse)
        out_o[b] = ((acc_lse[b] - out_lse[b]).exp()[:, None] * acc_o[b]
                    + (own_lse - out_lse[b]).exp()[:, None] * own_o)
    return out_o, out_lse


def _merge_own(fn, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, own: OwnSlots, acc_o: torch.Tensor,
               acc_lse: torch.Tensor) -> None:
    """OwnDecodeKernel.merge_own through the loaded C function `fn`."""
    num_reqs, num_q_heads, head_dim = q.shape
    num_slots, num_kv_heads = k_buf.shape[0], k_buf.shape[1]
    if (q.dtype != torch.float32 or acc_o.dtype != torch.float32 or acc_lse.dtype != torch.float32
            or not all(t.is_contiguous() for t in (q, k_buf, v_buf, acc_o, acc_lse, own.indptr, own.slots))
            or k_buf.dtype not in DTYPE_CODES or v_buf.dtype != k_buf.dtype or v_buf.shape != k_buf.shape
            or k_buf.dim() != 3 or k_buf.shape[2] != head_dim or acc_o.shape != q.shape
            or acc_lse.shape != q.shape[:2] or own.indptr.numel() != num_reqs + 1 or own.slots.dtype != torch.int32):
        raise ValueError(f"own_decode: cannot read q {tuple(q.shape)} {q.dtype}, pool {tuple(k_buf.shape)} "
                         f"{k_buf.dtype}, accumulators {tuple(acc_o.shape)} / {tuple(acc_lse.shape)}, "
                         f"{own.indptr.numel() - 1} requests")
    code = fn(q.data_ptr(), k_buf.data_ptr(), v_buf.data_ptr(), DTYPE_CODES[k_buf.dtype], num_slots,
              own.indptr.data_ptr(), own.slots.data_ptr(), num_reqs, num_q_heads, num_kv_heads, head_dim,
              acc_o.data_ptr(), acc_lse.data_ptr())
    if code:
        raise ValueError(f"own_decode: {_ERRORS.get(code, f'error {code}')} (pool of {num_slots} slots, "
                         f"{num_q_heads}/{num_kv_heads} heads, head_dim {head_dim})")


class OwnDecodeKernel:
    """The loaded C kernel (module docstring). Stateless; calls are not reentrant-sensitive."""

    def __init__(self):
        """Raises KernelBuildError when the kernel cannot be built here."""
        library, self.build = _library()
        self._fn = getattr(library, SYMBOL)

    def merge_own(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, own: OwnSlots,
                  acc_o: torch.Tensor, acc_lse: torch.Tensor) -> None:
        """Merge every request's attention over its own slots of pool buffers k_buf / v_buf ([slots, Hkv,
        D], float32/bfloat16/float16, contiguous) into acc_o [B, Hq, D] / acc_lse [B, Hq] (float32,
        contiguous; lse -inf where nothing is accumulated yet). q [B, Hq, D] float32 contiguous, scaled.
        Mutates acc_o and acc_lse only. Raises ValueError on tensors the kernel cannot read."""
        _merge_own(self._fn, q, k_buf, v_buf, own, acc_o, acc_lse)

    def describe(self) -> dict:
        """JSON-able build information (read-only)."""
        return {"source": SOURCE.name, "compiler": self.build.compiler, "flags": list(self.build.flags),
                "build_s": self.build.seconds, "native_refused": self.build.native_refused,
                "machine": platform.machine()}


def main() -> int:
    """`python -m sglang_pd.srt.attention.own_decode_kernel`: build the kernel here, print how."""
    print(OwnDecodeKernel().describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
