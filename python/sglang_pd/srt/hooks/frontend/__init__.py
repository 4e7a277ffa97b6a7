"""Hooks on SGLang's HTTP server, tokenizer and detokenizer managers: what a request brings and its answer carries."""
