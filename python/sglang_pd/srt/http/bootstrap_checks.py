"""Checks of requests to prefill's bootstrap HTTP server (PUT/GET /route, /register_dp_rank, /query_dp_ranks).

Prefill ranks register their ZMQ endpoint with PUT /route; decode reads it back with GET /route and
then sends that endpoint its KV buffer addresses. SGLang 0.5.23 stores a PUT's fields as given: a
rank registered by anyone becomes the endpoint decode trusts, and one non-numeric size stored by the
first PUT makes every later GET fail. `request_problem` checks a request's shape and values (ranks
inside sizes, sizes equal to the ones already registered) before SGLang's handler reads it; the
server hook answers 400 with the problem. Authentication of the same requests is `peer_auth`'s.

Pure functions over plain values; nothing here imports SGLang.
"""

from __future__ import annotations

import json
from typing import Callable, Mapping

from sglang_pd.srt.auth import normalize_address
from sglang_pd.srt.wire import fields as ff
from sglang_pd.srt.wire import FrameError

ROUTE, REGISTER_DP_RANK, QUERY_DP_RANKS = "/route", "/register_dp_rank", "/query_dp_ranks"
GUARDED_PATHS = (ROUTE, REGISTER_DP_RANK, QUERY_DP_RANKS)   # /health stays open: it carries no data
MAX_SIZE = 4096
MAX_ROOMS_PER_QUERY = 4096
_SIZES = ("attn_tp_size", "attn_cp_size", "attn_dp_size", "pp_size", "system_dp_size")
_RANKS = {"attn_tp_rank": "attn_tp_size", "attn_cp_rank": "attn_cp_size", "attn_dp_rank": "attn_dp_size",
          "pp_rank": "pp_size", "system_dp_rank": "system_dp_size"}


def encode_json_body(payload) -> bytes:
    """The exact bytes a client sends for a JSON body (signed as sent)."""
    return json.dumps(payload, separators=(",", ":")).encode()


def _int(value, what: str, lo: int, hi: int) -> int:
    """A JSON integer (not a string, not a bool: SGLang stores some of these fields as given)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FrameError(f"{what} {value!r:.40} is not an integer")
    if not lo <= value <= hi:
        raise FrameError(f"{what} {value} is outside [{lo}, {hi}]")
    return value


def _json(body: bytes):
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise FrameError("body is not JSON") from None


def route_put_problem(body: bytes, registered_sizes: Mapping[str, int | None]) -> str | None:
    """Why a prefill rank's PUT /route must not be stored, or None.

    `registered_sizes`: the server's attn_tp_size / attn_cp_size / pp_size / dp_size so far (None
    before the first registration); a later rank must agree with them."""
    try:
        data = _json(body)
        if not isinstance(data, dict):
            raise FrameError("body is not a JSON object")
        sizes = {k: _int(data.get(k), k, 1, MAX_SIZE) for k in _SIZES}
        for rank, size in _RANKS.items():
            _int(data.get(rank), rank, 0, sizes[size] - 1)
        ff.host(str(data.get("rank_ip", "")).encode("ascii", "replace"), "rank_ip")
        _int(data.get("rank_port"), "rank_port", 1, 65535)
        _int(data.get("page_size"), "page_size", 1, 1 << 20)
        if data.get("prefill_http_port") is not None:
            _int(data["prefill_http_port"], "prefill_http_port", 1, 65535)
        for key in ("kv_cache_dtype", "kv_layout", "load_balance_method", "decode_allocation_policy"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise FrameError(f"{key} is not a string")
        dp_size = sizes["attn_dp_size"] if sizes["system_dp_size"] == 1 else sizes["system_dp_size"]
        wanted = {"attn_tp_size": sizes["attn_tp_size"], "attn_cp_size": sizes["attn_cp_size"],
                  "pp_size": sizes["pp_size"], "dp_size": dp_size}
        for key, value in wanted.items():
            have = registered_sizes.get(key)
            if have is not None and have != value:
                raise FrameError(f"{key} {value} differs from the {have} already registered")
    except FrameError as exc:
        return f"PUT /route refused: {exc}"
    return None


def names_this_server(receiver: str, port: int, names: frozenset[str]) -> bool:
    """Whether `receiver` (`host:port` from a signed request) names a bootstrap server listening on `port`
    under one of `names` (this host's addresses and host names)."""
    host, sep, got_port = receiver.rpartition(":")
    if not sep or not got_port.isdigit() or int(got_port) != port:
        return False
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host.lower() in names or normalize_address(host) in names


def rank_key(data: Mapping) -> tuple[int, int, int, int]:
    """The slot a PUT /route body registers, as SGLang 0.5.23 keys its table: (dp group, cp rank, tp rank,
    pp rank). `data` already passed `route_put_problem`."""
    dp_group = data["attn_dp_rank"] if data["system_dp_size"] == 1 else data["system_dp_rank"]
    return dp_group, data["attn_cp_rank"], data["attn_tp_rank"], data["pp_rank"]


def route_move_problem(body: bytes, registered_at: Callable[[tuple[int, int, int, int]], tuple[str, int] | None]
                       ) -> str | None:
    """Why an (unauthenticated) PUT /route must not move a rank: the slot it names is already registered at
    another endpoint (`registered_at`: slot -> (rank_ip, rank_port), None when free). The same endpoint
    again is fine. Without a secret a rank's first registration stands for the bootstrap server's lifetime:
    the server lives in prefill's own process, so a restarted prefill brings a new one."""
    data = json.loads(body)
    key = rank_key(data)
    have = registered_at(key)
    if have is None or (str(have[0]), int(have[1])) == (str(data["rank_ip"]), int(data["rank_port"])):
        return None
    return (f"PUT /route refused: rank (dp {key[0]}, cp {key[1]}, tp {key[2]}, pp {key[3]}) is registered at "
            f"{have[0]}:{have[1]}; without SGLANG_PD_PEER_SECRET_FILE a rank's first registration stands until "
            f"this prefill server restarts (a stranger's PUT could otherwise move it to {data['rank_ip']}:"
            f"{data['rank_port']})")


def route_get_problem(query: Mapping[str, str]) -> str | None:
    """Why a GET /route query is malformed, or None (all four ranks, -1 for 'server info')."""
    try:
        for key in ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"):
            ff.ascii_int(str(query.get(key, "")).encode("ascii", "replace"), key, -1, MAX_SIZE)
    except FrameError as exc:
        return f"GET /route refused: {exc}"
    return None


def register_dp_rank_problem(body: bytes) -> str | None:
    """Why a POST /register_dp_rank body is malformed, or None."""
    try:
        data = _json(body)
        if not isinstance(data, dict):
            raise FrameError("body is not a JSON object")
        _int(data.get("bootstrap_room"), "bootstrap_room", 0, ff.MAX_ROOM)
        _int(data.get("dp_rank"), "dp_rank", 0, MAX_SIZE - 1)
    except FrameError as exc:
        return f"POST /register_dp_rank refused: {exc}"
    return None


def query_dp_ranks_problem(body: bytes) -> str | None:
    """Why a POST /query_dp_ranks body is malformed, or None."""
    try:
        data = _json(body)
        rooms = data.get("bootstrap_rooms") if isinstance(data, dict) else None
        if not isinstance(rooms, list) or len(rooms) > MAX_ROOMS_PER_QUERY:
            raise FrameError(f"bootstrap_rooms is not a list of at most {MAX_ROOMS_PER_QUERY} rooms")
        for room in rooms:
            _int(room, "bootstrap room", 0, ff.MAX_ROOM)
    except FrameError as exc:
        return f"POST /query_dp_ranks refused: {exc}"
    return None


def request_problem(method: str, path: str, query: Mapping[str, str], body: bytes,
                    registered_sizes: Mapping[str, int | None]) -> str | None:
    """Why a request to a guarded bootstrap path must not reach SGLang's handler, or None."""
    if path == ROUTE:
        if method == "PUT":
            return route_put_problem(body, registered_sizes)
        return route_get_problem(query) if method == "GET" else None
    if path == REGISTER_DP_RANK:
        return register_dp_rank_problem(body)
    if path == QUERY_DP_RANKS:
        return query_dp_ranks_problem(body)
    return None
