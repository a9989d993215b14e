"""Stand-in for `sglang.srt.entrypoints` (NOT SGLang)."""
