"""srt/auth - who may talk to a PD server (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.auth.curve_keys import CurveKeys, derive_keys
from sglang_pd.srt.auth.peer_auth import AuthFailure, HTTP_HEADER, HTTP_RESPONSE_HEADER, PeerAuth, TRAILER_FRAMES
from sglang_pd.srt.auth.peer_sources import PeerSources

__all__ = [
    "AuthFailure", "CurveKeys", "HTTP_HEADER", "HTTP_RESPONSE_HEADER", "PeerAuth", "PeerSources", "TRAILER_FRAMES",
    "derive_keys"]
