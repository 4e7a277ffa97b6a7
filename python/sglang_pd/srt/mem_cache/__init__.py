"""Page math, lock ledger and prefix-admission helpers (no SGLang server needed to test them)."""
