"""Order of the resolution hooks the stand-in imitates (0.5.23 line)."""

from sglang.srt.arg_groups.model_hook import handle_model_specific_adjustments
from sglang.srt.arg_groups.serving_hook import (
    handle_missing_default_values,
    handle_other_validations,
    handle_speculative_decoding,
)


def run_hook(step, server_args) -> None:
    step(server_args)


def run_resolution_pipeline(server_args) -> None:
    if str(server_args.model_path).lower() in ("none", "dummy"):
        return
    run_hook(handle_missing_default_values, server_args)
    run_hook(handle_model_specific_adjustments, server_args)
    run_hook(handle_speculative_decoding, server_args)
    run_hook(handle_other_validations, server_args)
