"""Stand-in for `sglang.srt.arg_groups` (NOT SGLang): the 0.5.19+ resolution
pipeline that `ServerArgs.resolve_once()` runs, reduced to the rules provision
can trip over."""
