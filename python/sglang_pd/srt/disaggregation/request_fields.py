"""Per-request decode fields in each response's meta_info, through SGLang's customized_info channel.

Decode's `cached_tokens` is copied from prefill; these say what decode itself reused and received:
  decode_prefix_len            tokens reused from the decode radix tree
  decode_kv_pages_transferred  KV pages received from prefill for this request
  decode_kv_bytes_transferred  their bytes
Request-level keys are emitted once (at finish, or with the first streamed chunk); the HTTP-side
hook turns SGLang's accumulated one-element list back into a number. Streamed chunks after the
first carry SGLang's accumulated one-element list again (that path bypasses the hook); clients of
streams read `v[0]` (see bench/pd_client.py).
"""

from __future__ import annotations

FIELDS = ("decode_prefix_len", "decode_kv_pages_transferred", "decode_kv_bytes_transferred")


def attach_request_fields(req, decode_prefix_len: int, num_pages: int, num_bytes: int) -> None:
    """Store the three fields on the decode Req (mutates `req.customized_info`)."""
    info = req.customized_info if req.customized_info is not None else {}
    info.update(zip(FIELDS, ([decode_prefix_len], [num_pages], [num_bytes])))
    req.customized_info = info


def around_is_request_level_key(original, streamer, key):
    """Our fields are per request, not per token."""
    return key in FIELDS or original(streamer, key)


def after_update_request_meta_info(result, manager, meta_info, state, customized_info, index, finish_reason):
    """Unwrap our fields from SGLang's accumulated list into plain numbers."""
    for key in FIELDS:
        value = meta_info.get(key)
        if isinstance(value, list) and len(value) == 1:
            meta_info[key] = value[0]
    return result
