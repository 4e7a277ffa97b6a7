"""Thin SGLang-facing adapters: hook functions and registry entries that hand off to our logic classes."""
