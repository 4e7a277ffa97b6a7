"""Transfer endpoints a test process registers with a real prefill (Mooncake TCP, NIXL over UCX), on loopback."""
