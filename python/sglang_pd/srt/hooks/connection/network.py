"""Hook on sglang.srt.utils.network.get_zmq_socket_on_host: a frame-size cap and, when set, CURVE on PD
rank sockets.

libzmq reads a listener's options when it binds, so both must be on the socket before SGLang's bind.
The KV-manager hook (common_conn.around_manager_init) sets `rank_socket_options` around its
construction; inside it, the PULL socket SGLang creates gets ZMQ_MAXMSGSIZE (a peer sending a larger
frame is disconnected by libzmq before the frame is buffered) and, with SGLANG_PD_PEER_CURVE=1, the
CURVE server options (curve_keys.py); the manager's context then makes CURVE clients of the PUSH sockets
SGLang creates from it afterwards (to its peers' rank sockets). Other sockets of the process are untouched.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

from sglang_pd.srt.auth import curve_keys
from sglang_pd.srt.auth import CurveKeys


class RankSocketOptions(NamedTuple):
    frame_cap: int | None
    curve: CurveKeys | None


_OPTIONS: contextvars.ContextVar[RankSocketOptions | None] = contextvars.ContextVar(
    "sglang_pd_rank_socket_options", default=None)


@contextlib.contextmanager
def rank_socket_options(frame_cap: int | None, curve: CurveKeys | None = None):
    """Within this block, PULL sockets made by get_zmq_socket_on_host refuse frames over `frame_cap` and, with
    `curve`, are CURVE servers whose context makes CURVE clients from then on."""
    token = _OPTIONS.set(RankSocketOptions(frame_cap, curve))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def around_get_zmq_socket_on_host(original, context, socket_type, host=None, restrict_peers=False):
    """Bind with our options set when inside `rank_socket_options` and the socket is a PULL."""
    import zmq

    opts = _OPTIONS.get()
    if opts is None or socket_type != zmq.PULL:
        return original(context, socket_type, host, restrict_peers)
    before_bind = {} if opts.frame_cap is None else {zmq.MAXMSGSIZE: opts.frame_cap}
    if opts.curve is not None:
        before_bind.update(curve_keys.server_options(opts.curve))
    curve_keys.set_context_defaults(context, before_bind)  # pyzmq: defaults for sockets this context creates
    try:
        port, sock = original(context, socket_type, host, restrict_peers)
    finally:
        curve_keys.drop_context_defaults(context, before_bind)
    if opts.curve is not None:
        curve_keys.check_socket(sock, server=True, what=f"the rank socket on port {port}")
        curve_keys.set_context_defaults(context, curve_keys.client_options(opts.curve))
    return port, sock
