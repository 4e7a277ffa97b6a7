"""Hook on SGLang's engine set-up (entrypoints/engine.py, main process), before any subprocess starts:
settings that need the server's mode are refused here (srt/auth/bootstrap_addresses.py), so is an
sglang_pd_shared_prefix backend its device or machine cannot run (srt/hooks/attention_backend.py), and how
its subprocesses start is chosen (srt/processes/start_method.py)."""

from __future__ import annotations

import sys

from sglang_pd.srt.attention.serving_checks import resolved
from sglang_pd.srt.hooks.attention_backend import start_up_problem
from sglang_pd.srt.state import current


def after_set_envs_and_config(result, server_args):
    """SGLang has just set multiprocessing's start method to spawn; on a CPU server, switch to a forkserver
    that imported the children's modules (started here, with the environment SGLang set), and say so once.
    Settings this server's mode cannot run with stop it first (exit 2), naming the setting."""
    guard = current().peer_guard
    problem = (guard.bootstrap_addresses.start_up_problem(str(server_args.disaggregation_mode), guard.auth is not None)
               or start_up_problem(server_args))
    if problem is not None:
        print(f"[sglang_pd] refusing to start: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    cfg = resolved(server_args)  # resolution's declarations over the raw fields (a raw device may be None)
    choice = current().start_method.apply(str(cfg.device), bool(cfg.enable_memory_saver), cfg.numa_node is not None)
    print(f"[sglang_pd] subprocesses start by {choice.method}: {choice.reason}", file=sys.stderr, flush=True)
    return result
