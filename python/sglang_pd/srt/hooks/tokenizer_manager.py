"""Hook on SGLang's `TokenizerManager` (HTTP process): our meta_info fields as plain numbers."""

from __future__ import annotations

from sglang_pd.srt.disaggregation.request_fields import unwrap_request_fields


def after_update_request_meta_info(result, manager, meta_info, state, customized_info, index, finish_reason):
    """Unwrap our fields from SGLang's accumulated one-element lists into plain numbers."""
    unwrap_request_fields(meta_info)
    return result
