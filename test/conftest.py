"""Shared pytest set-up: the CPU env for in-process imports of SGLang."""

from sglang_pd.harness.cpu_env import CPU_ENV, is_cpu_only

if is_cpu_only():
    import os

    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
