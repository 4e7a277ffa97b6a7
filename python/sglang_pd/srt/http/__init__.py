"""srt/http - checks and middleware of the HTTP servers (logic).

What other packages use, exported here; README.md in this folder names each module's job.
"""

from sglang_pd.srt.http.bootstrap_checks import names_this_server
from sglang_pd.srt.http.bootstrap_middleware import bootstrap_middleware
from sglang_pd.srt.http.health import HealthGuardMiddleware
from sglang_pd.srt.http.pairing_checks import check_pairing
from sglang_pd.srt.http.request_checks import (
    check_input_ids, check_logprob_start_len, check_parallel_samples, check_request_ids, check_sampling_limits,
    check_stop_regex, check_top_logprobs_num, num_prompts)
from sglang_pd.srt.http.retry_after import RetryAfterMiddleware

__all__ = [
    "HealthGuardMiddleware", "RetryAfterMiddleware", "bootstrap_middleware", "check_input_ids",
    "check_logprob_start_len", "check_pairing", "check_parallel_samples", "check_request_ids",
    "check_sampling_limits", "check_stop_regex", "check_top_logprobs_num", "names_this_server", "num_prompts"]
