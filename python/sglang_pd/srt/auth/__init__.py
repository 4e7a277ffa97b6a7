"""srt/auth - who may talk to a PD server (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.auth.bootstrap_addresses import BootstrapAddresses
from sglang_pd.srt.auth.curve_keys import CurveKeys, derive_keys
from sglang_pd.srt.auth.peer_auth import (AuthFailure, HTTP_HEADER, HTTP_RESPONSE_HEADER, PeerAuth, TRAILER_FRAMES,
                                          receiver_name)
from sglang_pd.srt.auth.peer_sources import PeerSources, normalize_address, this_host_names

__all__ = [
    "AuthFailure", "BootstrapAddresses", "CurveKeys", "HTTP_HEADER", "HTTP_RESPONSE_HEADER", "PeerAuth", "PeerSources", "TRAILER_FRAMES",
    "derive_keys", "normalize_address", "receiver_name", "this_host_names"]
