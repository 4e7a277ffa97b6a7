"""Per-request decode fields in each response's meta_info, through SGLang's customized_info channel.

Decode's `cached_tokens` is copied from prefill; these say what decode itself reused and received:
  decode_prefix_len            tokens reused from the decode radix tree
  decode_kv_pages_transferred  KV pages received from prefill for this request
  decode_kv_bytes_transferred  their bytes
  decode_prefill_path          who computed the rest of the prompt: "prefill" (PD transfer) or
                               "decode_local" (decode-local prefill; prefill declined the request)
  decode_local_prefill_tokens  prompt tokens decode computed itself (0 on the PD path)
Request-level keys are emitted once (at finish, or with the first streamed chunk); the HTTP-side
hook (srt/hooks/frontend/tokenizer_manager.py) turns SGLang's accumulated one-element list back into a
number. Streamed chunks after the first carry SGLang's accumulated one-element list again (that path
bypasses the hook); clients of streams read `v[0]` (see bench/pd_client.py).
"""

from __future__ import annotations

FIELDS = ("decode_prefix_len", "decode_kv_pages_transferred", "decode_kv_bytes_transferred",
          "decode_prefill_path", "decode_local_prefill_tokens")
PATH_PREFILL = "prefill"
PATH_DECODE_LOCAL = "decode_local"


def attach_request_fields(req, decode_prefix_len: int, num_pages: int, num_bytes: int,
                          path: str = PATH_PREFILL, num_local_tokens: int = 0) -> None:
    """Store the fields on the decode Req (mutates `req.customized_info`)."""
    if path not in (PATH_PREFILL, PATH_DECODE_LOCAL):
        raise ValueError(f"unknown prefill path {path!r}")
    info = req.customized_info if req.customized_info is not None else {}
    info.update(zip(FIELDS, ([decode_prefix_len], [num_pages], [num_bytes], [path], [num_local_tokens])))
    req.customized_info = info


def recorded_decode_prefix_len(req) -> int:
    """The decode_prefix_len `attach_request_fields` stored on `req` at its hand-off (0 when none was)."""
    return int(((getattr(req, "customized_info", None) or {}).get(FIELDS[0]) or [0])[0])


def unwrap_request_fields(meta_info: dict) -> None:
    """Turn SGLang's accumulated one-element list of each of our fields into a plain number (mutates)."""
    for key in FIELDS:
        value = meta_info.get(key)
        if isinstance(value, list) and len(value) == 1:
            meta_info[key] = value[0]
