"""SGLANG_PD_PEER_CURVE=1 on real ZMQ sockets made by SGLang's own get_zmq_socket_on_host through our hook:
key derivation, who can send to a rank socket, the PUSH sockets made afterwards, and what a stranger's
unfinished multipart message costs the receiving process."""

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from sglang_pd.config import PEER_CURVE, PEER_SECRET_FILE, SettingsError
from sglang_pd.config import Settings
from sglang_pd.srt.auth import curve_keys
from sglang_pd.srt.auth import PeerAuth
from sglang_pd.srt.hooks.connection.network import around_get_zmq_socket_on_host, rank_socket_options

pytestmark = pytest.mark.unit

KEY = b"k" * 40
OTHER_KEY = b"o" * 40
CAP = 16 << 20
SCRIPT = Path(__file__).resolve().parents[3] / "scripts/probes/security/peer_fuzz/unfinished_multipart.py"


def _bind(context, keys):
    """A rank socket as SGLang's KV manager binds it, inside the manager hook's options."""
    from sglang.srt.utils.network import get_zmq_socket_on_host

    with rank_socket_options(CAP, keys):
        return around_get_zmq_socket_on_host(get_zmq_socket_on_host, context, zmq.PULL, "127.0.0.1")


def _arrives(server, sender, timeout_ms=1000) -> bool:
    sender.send_multipart([b"hello", b"rank"])
    if not server.poll(timeout_ms):
        return False
    assert server.recv_multipart() == [b"hello", b"rank"]
    return True


def _plain_push(port, **options):
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in options.items():
        sock.setsockopt(getattr(zmq, option), value)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def test_the_pair_comes_from_the_signing_key_and_hides_its_secret():
    keys = curve_keys.derive_keys(PeerAuth([KEY]))
    assert keys == curve_keys.derive_keys(PeerAuth([KEY, OTHER_KEY]))  # the first key signs, and derives
    assert keys != curve_keys.derive_keys(PeerAuth([OTHER_KEY, KEY]))
    assert zmq.curve_public(keys.secret) == keys.public and len(keys.secret) == 40
    assert keys.secret.decode() not in repr(keys) and "hidden" in repr(keys)


def test_only_curve_clients_holding_the_secret_reach_a_curve_rank_socket():
    keys = curve_keys.derive_keys(PeerAuth([KEY]))
    context = zmq.Context()
    port, server = _bind(context, keys)
    assert server.getsockopt(zmq.MECHANISM) == zmq.CURVE and server.getsockopt(zmq.CURVE_SERVER) == 1
    assert server.getsockopt(zmq.MAXMSGSIZE) == CAP
    assert zmq.CURVE_SERVER not in context.sockopts  # the server options were for the bind only
    # what SGLang's manager makes from its context afterwards (its _connect): a CURVE client of the pair
    peer = context.socket(zmq.PUSH)
    peer.setsockopt(zmq.LINGER, 0)
    curve_keys.check_socket(peer, server=False, what="peer")
    peer.connect(f"tcp://127.0.0.1:{port}")
    stranger = _plain_push(port)
    wrong = curve_keys.derive_keys(PeerAuth([OTHER_KEY]))
    wrong_secret = _plain_push(port, CURVE_SERVERKEY=wrong.public, CURVE_PUBLICKEY=wrong.public,
                               CURVE_SECRETKEY=wrong.secret)
    try:
        assert not _arrives(server, stranger)
        assert not _arrives(server, wrong_secret)
        assert _arrives(server, peer)
    finally:
        for sock in (peer, stranger, wrong_secret, server):
            sock.close(linger=0)
        context.term()


def test_without_curve_the_rank_socket_takes_anyone_as_before():
    context = zmq.Context()
    port, server = _bind(context, None)
    stranger = _plain_push(port)
    try:
        assert server.getsockopt(zmq.MECHANISM) == zmq.NULL and not context.sockopts.get(zmq.CURVE_SERVERKEY)
        assert _arrives(server, stranger)
    finally:
        stranger.close(linger=0)
        server.close(linger=0)
        context.term()


def test_a_socket_in_the_clear_is_refused_by_name():
    sock = zmq.Context.instance().socket(zmq.PUSH)
    try:
        with pytest.raises(RuntimeError, match="decode's socket to tcp://x:1 is not a CURVE client"):
            curve_keys.check_socket(sock, server=False, what="decode's socket to tcp://x:1")
    finally:
        sock.close(linger=0)


def test_a_curve_client_still_reports_disconnects_to_its_monitor():
    """SGLang's manager watches each cached PUSH socket with an inproc monitor (a PAIR socket made by the
    same context, so it gets the CURVE client defaults too): the monitor must still see the disconnect."""
    keys = curve_keys.derive_keys(PeerAuth([KEY]))
    context = zmq.Context()
    port, server = _bind(context, keys)
    peer = context.socket(zmq.PUSH)
    peer.setsockopt(zmq.LINGER, 0)
    monitor = peer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    peer.connect(f"tcp://127.0.0.1:{port}")
    try:
        assert _arrives(server, peer)
        server.close(linger=0)
        assert monitor.poll(5000), "no disconnect event from the monitor"
        assert monitor.recv_multipart()
    finally:
        monitor.close(linger=0)
        peer.close(linger=0)
        context.term()


def test_curve_needs_the_secret_file(tmp_path):
    with pytest.raises(SettingsError, match=f"{PEER_CURVE}=1 needs {PEER_SECRET_FILE}"):
        Settings.from_env({PEER_CURVE: "1"})
    secret = tmp_path / "secret"
    secret.write_bytes(hashlib.sha256(KEY).hexdigest().encode() + b"\n")  # a key the secret file accepts
    secret.chmod(0o600)
    assert Settings.from_env({PEER_CURVE: "1", PEER_SECRET_FILE: str(secret)}).peer_curve


def _unfinished_multipart(curve: bool) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--frames", "150"]
                         + (["--curve"] if curve else []), capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_strangers_unfinished_multipart_is_not_buffered_by_a_curve_rank_socket():
    """150 frames of 1 MiB with MORE and never a last one, sent by a raw ZMTP client (NULL mechanism): the
    plain rank socket's process grows by about what was sent (the control: the test can fail), the CURVE
    one does not, as libzmq drops a connection whose handshake fails before it takes any message frame."""
    plain, curve = _unfinished_multipart(curve=False), _unfinished_multipart(curve=True)
    assert plain["receiver_rss_mib_after"] - plain["receiver_rss_mib_before"] > 100
    assert curve["receiver_rss_mib_after"] - curve["receiver_rss_mib_before"] < 10
    assert curve["mechanism"] == "CURVE" and plain["mechanism"] == "NULL"
