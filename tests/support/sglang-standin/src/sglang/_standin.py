"""Settings of the SGLang stand-in: which release line it imitates, and the
behaviour knobs tests set through environment variables.

THIS PACKAGE IS NOT SGLANG. It is a test double for the provision tool's tests.
"""

import os

# The release line this copy imitates. build_wheel.py rewrites this line when
# it builds a wheel with --line; SGLANG_STANDIN_LINE overrides it at run time.
BUILD_LINE = "0.5.10"
BUILD_VERSION = "0.5.10+standin"

# What differs between the two imitated lines, as far as provision can see.
LINES = {
    # 0.5.10 .. 0.5.13: the flag is --mamba-scheduler-strategy and "auto"
    # resolves to no_buffer, so speculative decoding on a hybrid GDN model
    # needs extra_buffer plus SGLANG_ENABLE_SPEC_V2=1.
    "0.5.10": {"mamba_flag": "--mamba-scheduler-strategy", "mamba_dest": "mamba_scheduler_strategy"},
    # 0.5.20 and later: the flag is --mamba-radix-cache-strategy (the old name
    # is gone) and "auto" resolves to extra_buffer when overlap is wanted.
    "0.5.23": {"mamba_flag": "--mamba-radix-cache-strategy", "mamba_dest": "mamba_radix_cache_strategy"},
}

MODES = ("ok", "crash", "hang", "slow")
HANG_POINTS = ("distributed_init", "load_weight", "warmup")
# "args" is visible to a preflight that parses the argv; "start" and "load" are not.
CRASH_POINTS = ("args", "start", "load")
PROGRESS_STYLES = ("tqdm", "lines")


class StandinConfigError(Exception):
    """A knob holds a value the stand-in does not know."""


def line() -> str:
    """The imitated release line, e.g. "0.5.10"."""
    value = os.environ.get("SGLANG_STANDIN_LINE", BUILD_LINE)
    if value not in LINES:
        raise StandinConfigError(
            f"SGLANG_STANDIN_LINE={value!r} is not one of {sorted(LINES)}"
        )
    return value


def version_string() -> str:
    """The version the stand-in reports; the local label marks it as a stand-in."""
    return f"{line()}+standin"


def _choice(name: str, default: str, allowed) -> str:
    value = os.environ.get(name, default)
    if value not in allowed:
        raise StandinConfigError(f"{name}={value!r} is not one of {list(allowed)}")
    return value


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StandinConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise StandinConfigError(f"{name}={raw!r} must not be negative")
    return value


class Knobs:
    """The behaviour requested through SGLANG_STANDIN_* environment variables."""

    def __init__(self) -> None:
        self.mode = _choice("SGLANG_STANDIN_MODE", "ok", MODES)
        self.hang_at = _choice("SGLANG_STANDIN_HANG_AT", "distributed_init", HANG_POINTS)
        self.crash_at = _choice("SGLANG_STANDIN_CRASH_AT", "args", CRASH_POINTS)
        self.crash_message = os.environ.get(
            "SGLANG_STANDIN_CRASH_MESSAGE",
            "SGLang stand-in: crash requested by SGLANG_STANDIN_MODE=crash",
        )
        self.load_seconds = _seconds(
            "SGLANG_STANDIN_LOAD_SECONDS", 10.0 if self.mode == "slow" else 0.3
        )
        self.warmup_seconds = _seconds("SGLANG_STANDIN_WARMUP_SECONDS", 1.0)
        self.progress = _choice("SGLANG_STANDIN_PROGRESS", "tqdm", PROGRESS_STYLES)
        # Pretend the host has no GPU, as a preflight on a GPU-less machine sees.
        self.no_gpu = os.environ.get("SGLANG_STANDIN_NO_GPU", "") not in ("", "0")
