"""Model-specific resolution (0.5.23 line): which architectures use the
hybrid-Mamba radix cache and what `auto` resolves to."""

from sglang.srt.arg_groups.mamba_hook import (
    validate_mamba_extra_buffer,
    validate_mamba_no_buffer,
)
from sglang.srt.standin_model import EXTRA_BUFFER_0_5_23, MAMBA_RADIX_0_5_23


def supports_mamba_cache_extra_buffer(server_args, hf_config) -> bool:
    return (
        hf_config.architectures[0] in EXTRA_BUFFER_0_5_23
        and server_args.linear_attn_backend == "triton"
    )


def mamba_extra_buffer_of(server_args) -> bool:
    return server_args.disable_radix_cache is False and server_args.mamba_radix_cache_strategy in (
        "extra_buffer",
        "extra_buffer_lazy",
    )


def handle_model_specific_adjustments(server_args) -> None:
    hf_config = server_args.get_model_config().hf_config
    handle_mamba_radix_cache(server_args, hf_config)


def handle_mamba_radix_cache(server_args, hf_config) -> None:
    model_arch = hf_config.architectures[0]
    in_branch = model_arch in MAMBA_RADIX_0_5_23
    if model_arch == "GraniteMoeHybridForCausalLM":
        in_branch = hf_config.has_mamba_layers()
    if in_branch and not server_args.disable_radix_cache:
        server_args.uses_mamba_radix_cache = True
        if server_args.mamba_radix_cache_strategy == "auto":
            wants_overlap = not server_args.disable_overlap_schedule
            wants_paging = server_args.page_size is not None and server_args.page_size > 1
            if (wants_overlap or wants_paging) and supports_mamba_cache_extra_buffer(
                server_args, hf_config
            ):
                server_args.mamba_radix_cache_strategy = "extra_buffer"
            else:
                server_args.mamba_radix_cache_strategy = "no_buffer"
                server_args.disable_overlap_schedule = True
    if not server_args.uses_mamba_radix_cache:
        if mamba_extra_buffer_of(server_args):
            raise ValueError(
                f"--mamba-radix-cache-strategy {server_args.mamba_radix_cache_strategy} "
                f"needs mamba state, got {model_arch}."
            )
        return
    if mamba_extra_buffer_of(server_args):
        validate_mamba_extra_buffer(server_args, hf_config)
    else:
        validate_mamba_no_buffer(server_args, model_arch)
