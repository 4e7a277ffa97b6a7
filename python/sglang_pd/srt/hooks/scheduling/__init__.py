"""Hooks on SGLang's scheduler: its event loop, the decode queues, prefill's bootstrap queue, batches and the radix tree."""
