"""Which kernels serve the shared-prefix backend on a device, or why none can (a start-up decision).

    choose_kernels(DeviceFacts) -> KernelChoice(kernels="cpu" | "triton", problem=None | words)

- `cpu`: `CpuDecodeKernels` (decode_kernels.py): torch's fused CPU attention + the C own-part kernel.
- `triton`: `TritonDecodeKernels` (triton_kernels.py): the GPU form. On CUDA it allocates per forward
  and its grid follows the batch's grouping, so no CUDA graph can replay it: the decode phase's graph
  must be off (`--cuda-graph-backend-decode disabled`) when this backend serves decode, and so must the
  prefill phase's when it serves extends (`--attention-backend sglang_pd_shared_prefix` without another
  `--prefill-attention-backend`). The phases are SGLang's resolved ones (serving_checks.py reads them). On a CPU device it runs only under Triton's interpreter
  (`TRITON_INTERPRET=1`: the tests' way to run the GPU form's code path here, ~1 s per layer).

`SGLANG_PD_SHARED_PREFIX_KERNELS` picks: `auto` (the device's own), `cpu` or `triton`. A choice the
device cannot run is refused by name, never replaced by another. Pure logic, no SGLang import.
"""

from __future__ import annotations

from dataclasses import dataclass

DISABLED = "disabled"  # SGLang's CUDA-graph phase backend that captures nothing


@dataclass(frozen=True)
class DeviceFacts:
    """What a model runner tells about where the backend would run (read by the hook)."""

    device: str                   # the runner's device: "cpu", "cuda", "cuda:1", ...
    setting: str                  # SGLANG_PD_SHARED_PREFIX_KERNELS (auto, cpu or triton: config.py parsed it)
    hip: bool                     # torch built for ROCm (its "cuda" device is an AMD GPU)
    interpreter: bool             # TRITON_INTERPRET=1 in this process's environment
    decode_graph: str | None      # the decode phase's CUDA-graph backend (None: unknown)
    prefill_graph: str | None     # the prefill phase's
    serves_extends: bool          # this backend runs the extend forwards (the resolved prefill backend)
    serves_decode: bool = True    # this backend runs the decode forwards (the resolved decode backend)


@dataclass(frozen=True)
class KernelChoice:
    """The kernels the backend builds, or the problem that refuses the server (exactly one is set)."""

    kernels: str | None
    problem: str | None = None


def _refused(problem: str) -> KernelChoice:
    return KernelChoice(None, problem)


def choose_kernels(facts: DeviceFacts) -> KernelChoice:
    """The kernel implementation for `facts`, or the words that refuse it (module docstring)."""
    kind = facts.device.split(":", 1)[0]
    if kind == "cpu":
        if facts.setting == "triton" and not facts.interpreter:
            return _refused("SGLANG_PD_SHARED_PREFIX_KERNELS=triton on device cpu: Triton kernels run on CPU tensors "
                            "only under Triton's interpreter (TRITON_INTERPRET=1, tests only); use auto or cpu")
        return KernelChoice("triton" if facts.setting == "triton" else "cpu")
    if kind != "cuda":
        return _refused(f"device {facts.device}: the backend has CPU and CUDA (Triton) kernels only")
    if facts.hip:
        return _refused("ROCm (torch built for HIP): the Triton kernels have not been run on an AMD GPU")
    if facts.setting == "cpu":
        return _refused(f"SGLANG_PD_SHARED_PREFIX_KERNELS=cpu on device {facts.device}: the CPU kernels read CPU "
                        "tensors only; use auto or triton")
    if facts.serves_decode and facts.decode_graph != DISABLED:
        return _refused(f"the decode CUDA graph ({facts.decode_graph}): the Triton form allocates its index and "
                        "partial buffers every forward and its grid follows the batch's grouping, so no graph can "
                        "replay it; start with --cuda-graph-backend-decode disabled")
    if facts.serves_extends and facts.prefill_graph != DISABLED:
        return _refused(f"the prefill CUDA graph ({facts.prefill_graph}) while this backend also serves extends: its "
                        "extends run eagerly only; start with --cuda-graph-backend-prefill disabled, or give the "
                        "extends another backend (--prefill-attention-backend triton)")
    return KernelChoice("triton")
