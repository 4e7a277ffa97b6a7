"""Decode admission, prefill transfer planning/recording, transport helpers, metrics."""
