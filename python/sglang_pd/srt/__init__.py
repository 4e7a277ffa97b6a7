"""Server-side pieces of sglang_pd: run inside SGLang's scheduler and HTTP processes."""
