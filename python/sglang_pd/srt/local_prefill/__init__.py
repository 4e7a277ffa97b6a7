"""srt/local_prefill - decode-local prefill (logic only).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.local_prefill.decision import LocalDecision, LocalFallback, uncached_awaited
from sglang_pd.srt.local_prefill.queue import LocalPrefill

__all__ = [
    "LocalDecision", "LocalFallback", "LocalPrefill", "uncached_awaited"]
