"""Defaults, speculative decoding and the stand-in's crash knob (0.5.23 line)."""

from sglang import _standin
from sglang.srt.server_args import get_device


def handle_missing_default_values(server_args) -> None:
    if server_args.tokenizer_path is None:
        server_args.tokenizer_path = server_args.model_path
    if server_args.served_model_name is None:
        server_args.served_model_name = server_args.model_path
    if server_args.device is None:
        server_args.device = get_device()


def handle_speculative_decoding(server_args) -> None:
    if server_args.speculative_algorithm is None:
        return
    server_args.speculative_algorithm = server_args.speculative_algorithm.upper()
    if server_args.speculative_algorithm == "NEXTN":
        server_args.speculative_algorithm = "EAGLE"
    if server_args.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        server_args.choose_speculative_defaults()


def handle_other_validations(server_args) -> None:
    knobs = _standin.Knobs()
    if knobs.mode == "crash" and knobs.crash_at == "args":
        raise ValueError(knobs.crash_message)
