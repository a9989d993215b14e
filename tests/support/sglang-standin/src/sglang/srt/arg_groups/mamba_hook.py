"""Validation of the hybrid-Mamba radix cache strategy (0.5.23 line)."""

from sglang.srt.server_args import is_cuda
from sglang.srt.standin_model import EXTRA_BUFFER_0_5_23


def validate_mamba_extra_buffer(view, hf_config) -> None:
    assert hf_config.architectures[0] in EXTRA_BUFFER_0_5_23, (
        f"extra_buffer is not supported for {hf_config.architectures[0]}; use no_buffer."
    )
    assert is_cuda(), "extra_buffer requires platform support for Mamba cache state snapshots."
    if view.mamba_radix_cache_strategy == "extra_buffer_lazy":
        assert view.disaggregation_mode == "null", (
            "extra_buffer_lazy unsupported under PD disaggregation; use "
            "--mamba-radix-cache-strategy extra_buffer."
        )
    if view.speculative_num_draft_tokens is not None:
        assert view.mamba_track_interval >= view.speculative_num_draft_tokens


def validate_mamba_no_buffer(view, model_arch: str) -> None:
    assert view.page_size in (1, None), "no_buffer only supports page_size=1."
    assert view.disable_overlap_schedule, (
        "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."
    )
    assert view.attention_backend != "trtllm_mha", (
        "no_buffer do not support trtllm_mha attention backend."
    )
