"""What a stranger who reaches a PD rank port can make libzmq buffer before any code of ours runs.

A rank socket is bound in a child process exactly as sglang_pd's KV-manager hook binds prefill's (SGLang's
get_zmq_socket_on_host through our hook: ZMQ_MAXMSGSIZE, a cap per frame; with --curve also the CURVE
server options of SGLANG_PD_PEER_CURVE=1, keys derived from a test secret). A raw TCP client speaks
ZMTP 3.0 with the NULL mechanism, as SGLang's PD sockets use, and sends frames of 1 MiB with the MORE
flag and never a last frame. libzmq keeps an unfinished multipart message until its last frame arrives
and has no cap on the number of frames, so without CURVE the child's resident memory grows with every
frame, and recv_multipart (and so the gate) never sees the message. With CURVE the handshake fails
(the stranger has no key) and libzmq takes no message frame from that connection.

    .venv/bin/python scripts/probes/security/peer_fuzz/unfinished_multipart.py [--curve] [--frames N] \
        > docs/results/security/peer_fuzz/unfinished_multipart[_curve].log

Prints one JSON line: the child's RSS before and after, the frames the kernel accepted from the client.
"""

import argparse
import json
import subprocess
import sys
import time

from sglang_pd.harness.hostile_peer import send_unfinished_multipart

FRAME_CAP = 16 << 20   # sglang_pd's per-frame cap on prefill's rank socket (zmq_frame_cap's floor)
FRAME_BYTES = 1 << 20
TEST_SECRET = b"unfinished-multipart-test-secret-0123456789"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def child(curve: bool) -> None:
    import zmq
    from sglang.srt.utils.network import get_zmq_socket_on_host

    from sglang_pd.srt.auth import derive_keys
    from sglang_pd.srt.auth import PeerAuth
    from sglang_pd.srt.hooks.connection.network import around_get_zmq_socket_on_host, rank_socket_options

    keys = derive_keys(PeerAuth([TEST_SECRET])) if curve else None
    with rank_socket_options(FRAME_CAP, keys):
        port, sock = around_get_zmq_socket_on_host(get_zmq_socket_on_host, zmq.Context(), zmq.PULL, "127.0.0.1")
    mechanism = {zmq.NULL: "NULL", zmq.CURVE: "CURVE"}[sock.getsockopt(zmq.MECHANISM)]
    print(json.dumps({"port": port, "mechanism": mechanism}), flush=True)
    while True:
        if sock.poll(200):
            sock.recv_multipart()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--curve", action="store_true", help="bind the rank socket with SGLANG_PD_PEER_CURVE=1's options")
    p.add_argument("--frames", type=int, default=400)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.curve)
    proc = subprocess.Popen([sys.executable, __file__, "--child"] + (["--curve"] if args.curve else []),
                            stdout=subprocess.PIPE, text=True)
    try:
        bound = json.loads(proc.stdout.readline())
        time.sleep(0.5)
        before = rss_mib(proc.pid)
        sent = send_unfinished_multipart("127.0.0.1", bound["port"], args.frames, FRAME_BYTES)
        after = rss_mib(proc.pid)
        print(json.dumps({"mechanism": bound["mechanism"], "per_frame_cap_bytes": FRAME_CAP,
                          "frames_to_send": args.frames, "frames_sent": sent, "frame_bytes": FRAME_BYTES,
                          "last_frame_sent": False, "receiver_rss_mib_before": round(before, 1),
                          "receiver_rss_mib_after": round(after, 1)}))
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
