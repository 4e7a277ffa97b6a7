"""Hooks on SGLang's PD connections: KV managers, senders and receivers, the rank and bootstrap sockets, signed HTTP."""
