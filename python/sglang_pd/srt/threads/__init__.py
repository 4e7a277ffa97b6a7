"""srt/threads - the PD threads: liveness, scheduling policy, idle waits (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.threads.helper_threads import HelperThreadPolicy
from sglang_pd.srt.threads.idle_wait import IdleWait
from sglang_pd.srt.threads.thread_watch import ThreadRole, ThreadWatch, Watchdog
from sglang_pd.srt.threads.worker_priority import TransferWorkerPriority

__all__ = [
    "HelperThreadPolicy", "IdleWait", "ThreadRole", "ThreadWatch", "TransferWorkerPriority", "Watchdog"]
