"""The sglang-router process our launcher starts, given its API key through an inherited pipe rather than
its command line (where every local user could read it with `ps` or /proc/<pid>/cmdline).

    python -m sglang_pd.router_child [--api-key-fd FD] <sglang-router arguments>

sglang-router takes its key only as `--api-key KEY` on its command line. This entry point parses the
other arguments with sglang-router's own parser (`sglang_router.launch_router.parse_router_args`), sets
`RouterArgs.api_key` to the key read from file descriptor FD, and runs sglang-router's own
`launch_router` in this process, exactly as `python -m sglang_router.launch_router` does.

Why a pipe: the launcher writes the key into it and closes its end before it execs this module, so the
key is in no argv and no environment (/proc/<pid>/environ stays readable by the same user for the
process's whole life); the pipe is read to its end once at start and closed. With `--api-key-fd` given,
a key that cannot be read (closed descriptor, empty pipe, malformed) ends this process with exit 2 and a
line naming the descriptor: the router never starts without the key it was meant to have.
"""

from __future__ import annotations

import os
import select
import sys

KEY_FD_FLAG = "--api-key-fd"
# The launcher writes the whole key before any reader exists: a write up to PIPE_BUF never blocks on an
# empty pipe, so a longer key is refused up front (see launch_router.read_api_key).
MAX_KEY_BYTES = select.PIPE_BUF


class KeyNotReadable(RuntimeError):
    """--api-key-fd was given but no usable key came through it; the message names the descriptor."""


def pass_key(api_key: str) -> int:
    """A pipe holding `api_key` (write end already closed): its read end, left open across exec."""
    data = api_key.encode("utf-8")
    if not data or len(data) > MAX_KEY_BYTES:
        raise ValueError(f"API key must be 1..{MAX_KEY_BYTES} bytes to fit the pipe, got {len(data)}")
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)  # fits the empty pipe whole (checked above), so this cannot block
    finally:
        os.close(write_fd)  # the reader then sees end-of-file after the key
    os.set_inheritable(read_fd, True)
    return read_fd


def _read_to_end(fd: int) -> bytes:
    """Everything in `fd` up to end-of-file (at most MAX_KEY_BYTES + 1 bytes: a descriptor that never ends
    cannot hold the router here); `fd` is closed."""
    data = b""
    try:
        while len(data) <= MAX_KEY_BYTES and (chunk := os.read(fd, MAX_KEY_BYTES + 1)):
            data += chunk
    except OSError as exc:
        raise KeyNotReadable(f"{KEY_FD_FLAG} {fd}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # a descriptor that was never open: the read above has already said so
    return data


def read_key(fd: int) -> str:
    """The key in pipe `fd` (one word, as launch_router.read_api_key accepts it); the descriptor is closed.
    KeyNotReadable names the descriptor and what is wrong, never the content."""
    data = _read_to_end(fd)
    if len(data) > MAX_KEY_BYTES:
        raise KeyNotReadable(f"{KEY_FD_FLAG} {fd}: more than {MAX_KEY_BYTES} bytes, not a key from our launcher")
    try:
        key = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise KeyNotReadable(f"{KEY_FD_FLAG} {fd}: the key is not UTF-8 text") from None
    if not key or any(c.isspace() for c in key):
        raise KeyNotReadable(f"{KEY_FD_FLAG} {fd}: no API key in the pipe (empty, or not one word)")
    return key


def split_argv(argv: list[str]) -> tuple[int | None, list[str]]:
    """(key descriptor or None, sglang-router's own arguments): our flag may only lead the command line,
    so it can never be mistaken for one of the router's values."""
    if argv[:1] != [KEY_FD_FLAG]:
        return None, argv
    if len(argv) < 2 or not argv[1].isdigit():
        raise KeyNotReadable(f"{KEY_FD_FLAG} needs a descriptor number, got {argv[1:2] or 'nothing'}")
    return int(argv[1]), argv[2:]


def main(argv: list[str] | None = None) -> int:
    """Read the key (if a descriptor is given), then run sglang-router in this process until it stops."""
    try:
        fd, router_args = split_argv(sys.argv[1:] if argv is None else argv)
        api_key = read_key(fd) if fd is not None else None
    except KeyNotReadable as exc:
        print(f"router_child: {exc}; not starting the router without its API key", file=sys.stderr, flush=True)
        return 2
    # Imported only now: a missing key is reported without paying for sglang-router's import.
    from sglang_router.launch_router import launch_router, parse_router_args

    parsed = parse_router_args(router_args)
    if api_key is not None:
        parsed.api_key = api_key
    launch_router(parsed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
