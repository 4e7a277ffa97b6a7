"""Hook on sglang.srt.utils.network.get_zmq_socket_on_host: a frame-size cap on PD rank sockets.

libzmq reads a listener's options when it binds, so the cap must be on the socket before SGLang's
bind. The KV-manager hook (common_conn.around_manager_init) sets `frame_cap` around its
construction; inside it, the PULL socket SGLang creates gets ZMQ_MAXMSGSIZE, and a peer sending a
larger frame is disconnected by libzmq before the frame is buffered (memory stays bounded). Other
sockets of the process are untouched.
"""

from __future__ import annotations

import contextlib
import contextvars

_CAP: contextvars.ContextVar[int | None] = contextvars.ContextVar("sglang_pd_zmq_frame_cap", default=None)


@contextlib.contextmanager
def frame_cap(num_bytes: int | None):
    """Within this block, PULL sockets made by get_zmq_socket_on_host refuse frames over `num_bytes`."""
    token = _CAP.set(num_bytes)
    try:
        yield
    finally:
        _CAP.reset(token)


def around_get_zmq_socket_on_host(original, context, socket_type, host=None, restrict_peers=False):
    """Bind with ZMQ_MAXMSGSIZE set when inside `frame_cap` and the socket is a PULL."""
    import zmq

    cap = _CAP.get()
    if cap is None or socket_type != zmq.PULL:
        return original(context, socket_type, host, restrict_peers)
    context.setsockopt(zmq.MAXMSGSIZE, cap)  # pyzmq: default option for sockets this context creates
    try:
        return original(context, socket_type, host, restrict_peers)
    finally:
        context.sockopts.pop(zmq.MAXMSGSIZE, None)
