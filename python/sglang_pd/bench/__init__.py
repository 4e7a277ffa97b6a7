"""Benchmark building blocks: streaming PD client, multi-turn workload, statistics and report."""
