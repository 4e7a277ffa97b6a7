"""KV page-transfer benchmark pieces behind `python -m sglang_pd.bench_transfer` (see README.md).

Pure index math (`page_runs`, `layout`, `buffers`, `descriptors`) is importable and testable without
any transport installed; the transports (`nixl_endpoint`, `mooncake_endpoint`) import their packages
only when an endpoint is built, inside the spawned processes of `process_pair`.
"""
