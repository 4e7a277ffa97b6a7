"""Thin SGLang-facing hook functions, one module per upstream module patched (rows in sglang_pd/hooks.py)."""
