"""srt/transfer - what prefill sends and how its transfer workers survive (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.transfer.batches import descriptor_batches
from sglang_pd.srt.transfer.nixl_host_memory import HOST_MEMORY_KIND, HostMemoryScope
from sglang_pd.srt.transfer.prefill_log import PrefillTransferLog
from sglang_pd.srt.transfer.watch import TransferWatch
from sglang_pd.srt.transfer.worker_recovery import ChunkTap, record, recover_room

__all__ = [
    "ChunkTap", "HOST_MEMORY_KIND", "HostMemoryScope", "PrefillTransferLog", "TransferWatch", "descriptor_batches",
    "record", "recover_room"]
