"""Stand-in for `sglang.srt.server_args` (THIS IS NOT SGLANG).

Same entry points as the real module: `prepare_server_args(argv)`,
`ServerArgs.add_cli_args(parser)`, `ServerArgs.from_cli_args(args)`, and the
validation runs at the same point as in the imitated line:

* 0.5.10: inside `ServerArgs.__post_init__`, so `prepare_server_args` raises;
* 0.5.23: `prepare_server_args` only parses; `ServerArgs.resolve_once()`
  (called by launch_server.run_server) resolves and validates.

Only the rules provision can trip over are imitated (hybrid Mamba/GDN models
with speculative decoding and the radix cache, missing GPU, unreadable model
config); see docs/sglang-notes.md for the real code they mirror.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import os
from typing import Any, List, Optional

from sglang import _standin
from sglang.srt import standin_cli
from sglang.srt.standin_model import HYBRID_0_5_10, load_hf_config

logger = logging.getLogger(__name__)

LINE = _standin.line()
_CLI = standin_cli.load_cli_data(LINE)
MAMBA_FLAG = _standin.LINES[LINE]["mamba_flag"]
FLA_CHUNK_SIZE = 64

NO_ACCELERATOR = {
    "0.5.10": "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) is available.",
    "0.5.23": "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available.",
}


def env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "y", "on")


def is_cuda() -> bool:
    """Whether CUDA is usable; false when SGLANG_STANDIN_NO_GPU pretends a GPU-less host."""
    return not _standin.Knobs().no_gpu


def get_device() -> str:
    if not is_cuda():
        raise RuntimeError(NO_ACCELERATOR[LINE])
    return "cuda"


class ModelConfig:
    """What the server derives from config.json (architecture, context length)."""

    def __init__(self, server_args: "ServerArgs") -> None:
        self.hf_config = load_hf_config(server_args.model_path)
        self.context_len = server_args.context_length or self.hf_config.context_len()

    @classmethod
    def from_server_args(cls, server_args: "ServerArgs") -> "ModelConfig":
        return cls(server_args)


class _ServerArgsBehaviour:
    """Methods of ServerArgs; the fields come from the recorded CLI data."""

    def __post_init__(self):
        if LINE != "0.5.10":
            return  # later lines leave construction unresolved; see resolve_once()
        if self.model_path.lower() in ["none", "dummy"]:
            return
        self._handle_missing_default_values()
        self._handle_piecewise_cuda_graph()
        self._handle_model_specific_adjustments()
        self._handle_speculative_decoding()
        self._handle_other_validations()

    def _handle_missing_default_values(self):
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if self.device is None:
            self.device = get_device()
        if self.mamba_scheduler_strategy == "auto":
            self.mamba_scheduler_strategy = "no_buffer"

    def _handle_piecewise_cuda_graph(self):
        # The real method is the first to load the model config.
        self.get_model_config()

    def _handle_model_specific_adjustments(self):
        hf_config = self.get_model_config().hf_config
        model_arch = hf_config.architectures[0]
        rule = HYBRID_0_5_10.get(model_arch)
        if model_arch == "GraniteMoeHybridForCausalLM" and not hf_config.has_mamba_layers():
            rule = None
        if rule == "no_cache":
            self._handle_mamba_radix_cache(model_arch=model_arch, support_mamba_cache=False)
        elif rule == "no_extra":
            self._handle_mamba_radix_cache(
                model_arch=model_arch, support_mamba_cache_extra_buffer=False
            )
            if model_arch in ("NemotronHForCausalLM", "Lfm2ForCausalLM"):
                assert self.attention_backend != "triton", (
                    f"{model_arch} does not support triton attention backend, "
                    "as the first layer might not be an attention layer"
                )
        elif rule == "extra":
            self._handle_mamba_radix_cache(model_arch=model_arch)

    def _handle_mamba_radix_cache(
        self,
        model_arch: str,
        support_mamba_cache: bool = True,
        support_mamba_cache_extra_buffer: bool = True,
    ):
        if not support_mamba_cache:
            logger.warning(f"Disabling Radix Cache for {model_arch} as it is not yet supported.")
            self.disable_radix_cache = True
            return

        if not support_mamba_cache_extra_buffer:
            assert (
                not self.enable_mamba_extra_buffer()
            ), f"mamba extra_buffer is not supported for {model_arch} model"

        if (
            self.linear_attn_decode_backend == "flashinfer"
            and self.mamba_scheduler_strategy == "no_buffer"
        ):
            raise ValueError(
                "FlashInfer GDN decode (--linear-attn-decode-backend flashinfer) is not "
                "compatible with --mamba-scheduler-strategy no_buffer. "
                "Please use --mamba-scheduler-strategy extra_buffer instead. "
                "See https://github.com/sgl-project/sglang/issues/20791"
            )

        if self.enable_mamba_extra_buffer():  # extra_buffer
            if self.disable_radix_cache:
                raise ValueError(
                    "mamba extra_buffer is not compatible with --disable-radix-cache "
                    "Overlap scheduling is already supported with no_buffer + disable_radix_cache. "
                    "Please use --mamba-scheduler-strategy no_buffer instead."
                )
            assert is_cuda(), "Mamba extra_buffer is only supported on CUDA devices with FLA backend"
            if self.speculative_num_draft_tokens is not None:
                assert (
                    self.mamba_track_interval >= self.speculative_num_draft_tokens
                ), f"mamba_track_interval {self.mamba_track_interval} must be greater than or equal to speculative_num_draft_tokens {self.speculative_num_draft_tokens}"
        elif not self.disable_radix_cache:  # no_buffer
            if self.speculative_algorithm is None:
                logger.warning(
                    "Disabling overlap schedule since mamba no_buffer is not compatible with "
                    "overlap schedule, try to use --disable-radix-cache if overlap schedule is necessary"
                )
                self.disable_overlap_schedule = True
            else:
                # No space after "no_buffer." on purpose: the real message has none.
                raise ValueError(
                    f"Speculative decoding for {model_arch} is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
                    "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
                )

    def _handle_speculative_decoding(self):
        if self.speculative_algorithm is None:
            return
        if self.speculative_algorithm == "NEXTN":
            self.speculative_algorithm = "EAGLE"
        if self.speculative_algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
            return
        if self.max_running_requests is None:
            self.max_running_requests = 48
            logger.warning(
                "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests."
            )
        if env_bool("SGLANG_ENABLE_SPEC_V2"):
            self.disable_overlap_schedule = False
            logger.warning(
                "Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is turned on."
            )
            if self.speculative_eagle_topk is not None and self.speculative_eagle_topk > 1:
                raise ValueError("Spec v2 currently only supports topk = 1 for speculative decoding.")
        else:
            self.disable_overlap_schedule = True
            logger.warning(
                "Overlap scheduler is disabled when spec v2 is off or using unsupported speculative algorithm. "
                "You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler. "
            )
        self.choose_speculative_defaults()

    def choose_speculative_defaults(self):
        if self.speculative_num_steps is None:
            assert self.speculative_eagle_topk is None and self.speculative_num_draft_tokens is None
            self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens = (3, 1, 4)

    def _handle_other_validations(self):
        knobs = _standin.Knobs()
        if knobs.mode == "crash" and knobs.crash_at == "args":
            raise ValueError(knobs.crash_message)

    def enable_mamba_extra_buffer(self) -> bool:
        return self.mamba_scheduler_strategy == "extra_buffer"

    def get_model_config(self) -> ModelConfig:
        if "model_config" in self.__dict__:
            return self.__dict__["model_config"]
        self.__dict__["model_config"] = ModelConfig.from_server_args(self)
        return self.__dict__["model_config"]

    def check_server_args(self):
        assert (self.tp_size * self.pp_size) % self.nnodes == 0, "tp_size must be divisible by number of nodes"

    def url(self, port: Optional[int] = None) -> str:
        host = self.host
        if not host or host == "0.0.0.0":
            host = "127.0.0.1"
        return f"http://{host}:{port if port is not None else self.port}"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        standin_cli.add_options(parser, _CLI)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        if LINE == "0.5.10":
            args.tp_size = args.tensor_parallel_size
            args.pp_size = args.pipeline_parallel_size
            args.attn_cp_size = args.attention_context_parallel_size
            args.moe_dp_size = args.moe_data_parallel_size
            args.dp_size = args.data_parallel_size
            args.ep_size = args.expert_parallel_size
        attrs = [attr.name for attr in dataclasses.fields(cls) if hasattr(args, attr.name)]
        return cls(**{attr: getattr(args, attr) for attr in attrs})


class _Resolvable:
    """0.5.19+ only: resolution and validation run here, not in __post_init__."""

    def resolve_once(self) -> None:
        if getattr(self, "_resolution_finished", False):
            return
        from sglang.srt.arg_groups.pipeline import run_resolution_pipeline

        run_resolution_pipeline(self)
        self._resolution_finished = True


def _dataclass_field(default: Any):
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d))
    return dataclasses.field(default=default)


ServerArgs = dataclasses.make_dataclass(
    "ServerArgs",
    [(name, Any, _dataclass_field(default)) for name, default in standin_cli.field_defaults(_CLI)],
    # 0.5.10 has no resolve_once at all; callers probe for it with getattr.
    bases=(_ServerArgsBehaviour,) if LINE == "0.5.10" else (_ServerArgsBehaviour, _Resolvable),
    namespace={"__module__": __name__, "__doc__": "Server arguments of the stand-in (NOT SGLang)."},
)


def prepare_server_args(argv: List[str]) -> ServerArgs:
    """Parse argv like `sglang serve`; on 0.5.10 this also validates."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    if "--config" in argv:
        raise NotImplementedError("the SGLang stand-in does not implement --config files")
    raw_args = parser.parse_args(argv)
    if LINE != "0.5.10":
        logging.basicConfig(
            level=getattr(logging, raw_args.log_level.upper()),
            format="[%(asctime)s] %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S",
            force=True,
        )
    return ServerArgs.from_cli_args(raw_args)
