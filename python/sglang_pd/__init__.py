"""sglang_pd: PD-disaggregated serving with a decode-side radix cache, as an SGLang plugin."""

__version__ = "0.1.0"
SUPPORTED_SGLANG_VERSION = "0.5.23"
