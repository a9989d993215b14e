"""Reads <model-path>/config.json the way the real server sees it: the first
entry of `architectures` picks the model-specific rules, and a missing or
remote model fails with the same messages transformers gives offline."""

import json
import os

# Hybrid (Mamba/GDN) architectures as 0.5.10's ServerArgs treats them:
#   "extra"    radix cache with --mamba-scheduler-strategy extra_buffer allowed
#   "no_extra" radix cache allowed, extra_buffer rejected
#   "no_cache" radix cache disabled outright
HYBRID_0_5_10 = {
    "Qwen3NextForCausalLM": "extra",
    "Qwen3_5MoeForConditionalGeneration": "extra",
    "Qwen3_5ForConditionalGeneration": "extra",
    "NemotronHForCausalLM": "no_extra",
    "FalconH1ForCausalLM": "no_extra",
    "JetNemotronForCausalLM": "no_extra",
    "JetVLMForConditionalGeneration": "no_extra",
    "Lfm2ForCausalLM": "no_extra",
    "GraniteMoeHybridForCausalLM": "no_extra",
    "KimiLinearForCausalLM": "no_cache",
    "BailingMoeV2_5ForCausalLM": "no_cache",
}

# 0.5.23: architectures routed through the hybrid-Mamba radix cache, and the
# subset that supports the extra_buffer strategy (arg_groups/overrides.py).
MAMBA_RADIX_0_5_23 = {
    "KimiLinearForCausalLM", "BailingMoeV2_5ForCausalLM", "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM", "NemotronHForCausalLM",
    "FalconH1ForCausalLM", "JetNemotronForCausalLM", "JetVLMForConditionalGeneration",
    "Lfm2ForCausalLM",
}
EXTRA_BUFFER_0_5_23 = {
    "KimiLinearForCausalLM", "BailingMoeV2_5ForCausalLM", "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM", "NemotronHForCausalLM",
    "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
}

_OFFLINE = (
    "We couldn't connect to 'https://huggingface.co' to load the files, and "
    "couldn't find them in the cached files.\nCheck your internet connection or "
    "see how to run the library in offline mode at "
    "'https://huggingface.co/docs/transformers/installation#offline-mode'."
)


class HfConfig:
    """The parts of a Hugging Face config the stand-in uses."""

    def __init__(self, raw: dict) -> None:
        self.raw = raw
        self.architectures = raw.get("architectures")
        self.model_type = raw.get("model_type")
        text = raw.get("text_config")
        self.text = text if isinstance(text, dict) else raw

    def has_mamba_layers(self) -> bool:
        layer_types = self.text.get("layer_types") or self.raw.get("layer_types") or []
        return any(t == "mamba" for t in layer_types)

    def context_len(self) -> int:
        for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
            if isinstance(self.text.get(key), int):
                return self.text[key]
        return 2048

    def is_multimodal(self) -> bool:
        return "vision_config" in self.raw


def load_hf_config(model_path: str) -> HfConfig:
    """Load config.json, failing like transformers does without network."""
    if not os.path.isdir(model_path):
        if model_path.startswith(("/", ".")) or model_path.count("/") > 1:
            raise OSError(
                "Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
                f"'{model_path}'. Use `repo_type` argument if needed."
            )
        raise OSError(_OFFLINE)
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"Unrecognized model in {model_path}. Should have a `model_type` key in its config.json."
        )
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        raise OSError(f"It looks like the config file at '{path}' is not a valid JSON file.") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ValueError(
            f"Unrecognized model in {model_path}. Should have a `model_type` key in its config.json."
        )
    return HfConfig(raw)


def shard_count(model_path: str) -> int:
    """Number of *.safetensors files, as the loader's progress bar counts them."""
    try:
        return sum(1 for name in os.listdir(model_path) if name.endswith(".safetensors"))
    except OSError:
        return 0
