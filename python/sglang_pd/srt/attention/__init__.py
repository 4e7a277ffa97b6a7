"""srt/attention - shared-prefix decode attention and the local extend's attention (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.attention.decode_kernels import CpuDecodeKernels, DecodeKernels
from sglang_pd.srt.attention.device_form import DeviceFacts, KernelChoice, choose_kernels
from sglang_pd.srt.attention.local_extend import MixedRows, offset_causal_extend, offset_causal_extend_rows
from sglang_pd.srt.attention.own_decode_kernel import OwnDecodeKernel, build_problem
from sglang_pd.srt.attention.partials import missing_kernel
from sglang_pd.srt.attention.prefix_groups import find_prefix_groups
from sglang_pd.srt.attention.segment_kv_cache import RequestKey
from sglang_pd.srt.attention.shared_prefix import DecodePlan, SharedPrefixDecoder
from sglang_pd.srt.attention.stats import AttentionFallback, SharedAttentionStats

__all__ = [
    "AttentionFallback", "CpuDecodeKernels", "DecodeKernels", "DecodePlan", "DeviceFacts", "KernelChoice",
    "MixedRows", "OwnDecodeKernel", "RequestKey", "SharedAttentionStats", "SharedPrefixDecoder", "build_problem",
    "choose_kernels", "find_prefix_groups", "missing_kernel", "offset_causal_extend", "offset_causal_extend_rows"]
