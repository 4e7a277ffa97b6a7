"""srt/admission - decode admission around the decode radix tree (logic only).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.admission.candidates import round_candidates
from sglang_pd.srt.admission.decode_admission import AdmissionError, DecodePrefixAdmission
from sglang_pd.srt.admission.radix_resume import RadixResume, ResumeError
from sglang_pd.srt.admission.room_renewal import mark_declined, needs_new_room, renew_room
from sglang_pd.srt.admission.round import AdmissionRound, PoolSizer

__all__ = [
    "AdmissionError", "AdmissionRound", "DecodePrefixAdmission", "PoolSizer", "RadixResume", "ResumeError",
    "mark_declined", "needs_new_room", "renew_room", "round_candidates"]
