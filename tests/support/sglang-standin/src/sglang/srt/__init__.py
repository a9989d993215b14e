"""Stand-in for the `sglang.srt` package (NOT SGLang)."""
