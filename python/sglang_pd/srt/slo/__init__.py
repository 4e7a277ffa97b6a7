"""srt/slo - SLO-aware decode admission (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.slo.controller import SloController
from sglang_pd.srt.slo.early_rejection import retry_after_from

__all__ = [
    "SloController", "retry_after_from"]
