"""The own-part decode kernel: each request's own KV read in place from the pool (csrc/own_decode.c).

    own_slots(rows, own_starts, seq_lens) --OwnSlots--> OwnDecodeKernel.merge_own(q, k_buf, v_buf, own, acc)

A decode request's own part (what no shared segment covers: prompt suffix, earlier turns only it
reads, generated tokens) is attended per layer by one C call for the whole batch, merged in place
into the accumulators that already hold the shared segments' partials. The C source ships in the
package and is compiled once per process, at first use (about 0.3 s), into a temporary folder with
the C compiler of the machine that runs it (`$CC`, else `cc`), `-O3 -march=native` where the
compiler takes it: a cached binary could meet another CPU. No compiler, or a build that fails, is a
`KernelBuildError` naming the command and its output; the backend then refuses to start.

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
from typing import Sequence

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "own_decode.c"
SYMBOL = "sglang_pd_own_decode_merge"
BASE_FLAGS = ("-O3", "-std=gnu11", "-fopenmp-simd", "-shared", "-fPIC")
NATIVE_FLAG = "-march=native"
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_ERRORS = {1: "a slot outside the KV pool", 2: "shapes the kernel does not take", 3: "no memory for its scratch"}


class KernelBuildError(RuntimeError):
    """The C kernel could not be compiled or loaded here (message names the command and its output)."""


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


@functools.lru_cache(maxsize=1)
def _library() -> tuple[ctypes.CDLL, BuildInfo]:
    """Compile and load the kernel once per process; raises KernelBuildError."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelBuildError(f"no C compiler found (set CC, or install gcc): {SOURCE.name} is compiled at start-up")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sglang_pd-kernel-") as folder:
        out = Path(folder) / "own_decode.so"
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
            library = ctypes.CDLL(str(out))  # loaded before the folder goes: the mapping stays
        except OSError as exc:
            raise KernelBuildError(f"built {out.name} but could not load it: {exc}") from exc
    if native_refused:
        logger.warning("sglang_pd: %s refused %s (%s); the own-part kernel is built without it (slower)",
                       compiler, NATIVE_FLAG, native_refused)
    fn = getattr(library, SYMBOL)
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [pointer, pointer, pointer, ctypes.c_int32, i64, pointer, pointer, i64, i64, i64, i64, pointer, pointer]
    fn.restype = ctypes.c_int
    return library, BuildInfo(compiler, tuple(flags), round(time.perf_counter() - start, 3), native_refused)


def build_problem() -> str | None:
    """Why the kernel cannot be built or loaded in this process, or None (builds it if not yet built)."""
    try:
        _library()
    except KernelBuildError as exc:
        return str(exc)
    return None


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
        code = self._fn(q.data_ptr(), k_buf.data_ptr(), v_buf.data_ptr(), DTYPE_CODES[k_buf.dtype], num_slots,
                        own.indptr.data_ptr(), own.slots.data_ptr(), num_reqs, num_q_heads, num_kv_heads, head_dim,
                        acc_o.data_ptr(), acc_lse.data_ptr())
        if code:
            raise ValueError(f"own_decode: {_ERRORS.get(code, f'error {code}')} (pool of {num_slots} slots, "
                             f"{num_q_heads}/{num_kv_heads} heads, head_dim {head_dim})")

    def describe(self) -> dict:
        """JSON-able build information (read-only)."""
        return {"source": SOURCE.name, "compiler": self.build.compiler, "flags": list(self.build.flags),
                "build_s": self.build.seconds, "native_refused": self.build.native_refused,
                "machine": platform.machine()}


def main() -> int:
    """`python -m sglang_pd.srt.disaggregation.own_decode_kernel`: build the kernel here, print how."""
    print(OwnDecodeKernel().describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
