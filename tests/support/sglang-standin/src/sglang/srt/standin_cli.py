"""Builds the stand-in's argparse parser from the recorded CLI surface of the
imitated SGLang release (standin_data/cli-<line>.json).

The JSON lists every option of the real `ServerArgs.add_cli_args` (names,
arity, types, choices, defaults) so that unknown flags, abbreviations such as
`--tp` or `--speculative-algo`, and bad choices are accepted or rejected exactly
as the real parser does. It was recorded by introspecting the parser of the
PyPI wheels sglang==0.5.10 and sglang==0.5.23; no SGLang code is copied.
"""

import argparse
import json
import logging
import os
import re
from decimal import Decimal

logger = logging.getLogger("sglang.srt.server_args")

DATA_DIR = os.path.join(os.path.dirname(__file__), "standin_data")


def load_cli_data(line: str) -> dict:
    """The recorded CLI surface of one release line."""
    with open(os.path.join(DATA_DIR, f"cli-{line}.json"), encoding="utf-8") as f:
        return json.load(f)


# Converters carry the real converters' names because argparse puts the name
# into its error text ("invalid int value: 'x'").
def loads(value: str):
    return json.loads(value)


def json_list_type(value: str):
    return json.loads(value)


def nullable_str(value: str):
    return None if value.lower() in ("", "none", "null") else value


def human_readable_int(value: str) -> int:
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * 2 ** (10 * "KMGT".index(suffix[0]) + 10)
        return int(Decimal(number) * 10 ** (3 * "kMGT".index(suffix) + 3))
    return int(value)


def parse_cuda_graph_backend_arg(value: str):
    return value


def parse_cuda_graph_config_arg(value: str):
    return value


CONVERTERS = {
    "int": int,
    "float": float,
    "str": str,
    "loads": loads,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}


def print_deprecated_warning(message: str) -> None:
    logger.warning(f"\033[1;33m{message}\033[0m")


class DeprecatedAction(argparse.Action):
    """A retired flag: stops with its error message, or warns and continues."""

    def __init__(self, option_strings, dest, error_message=None, nargs=0, **kwargs):
        self.error_message = error_message
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if self.error_message is not None:
            parser.error(self.error_message)
        print_deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and "
            "will be removed in future versions."
        )


class DeprecatedStoreTrueAction(argparse.Action):
    """A deprecated boolean that still stores True and warns."""

    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kw):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, self.const)


class DeprecatedAliasStoreAction(argparse.Action):
    """A renamed valued flag: stores under the new name and warns."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, values)


class DeprecatedStoreConstAction(argparse.Action):
    """An old valued flag whose one accepted value became a boolean."""

    def __init__(self, option_strings, dest, const_value=True, new_flag=None, **kwargs):
        self.const_value = const_value
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, self.const_value)


class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [v.strip() for v in values or []])


def _plain(value):
    """Undo the JSON wrapping of values that JSON cannot hold (inf, reprs)."""
    if isinstance(value, dict) and "float" in value:
        return float(value["float"])
    if isinstance(value, dict) and "repr" in value:
        return None
    return value


def add_options(parser: argparse.ArgumentParser, data: dict) -> None:
    """Register every recorded option on `parser`."""
    for opt in data["options"]:
        flags = opt["flags"]
        kw = {"dest": opt["dest"]}
        if opt.get("hidden"):
            kw["help"] = argparse.SUPPRESS
        kind = opt["kind"]
        if "default" in opt:
            kw["default"] = _plain(opt["default"])
        if kind in ("store", "append", "lora_paths", "deprecated_alias"):
            if "type" in opt:
                kw["type"] = CONVERTERS.get(opt["type"], str)
            if "nargs" in opt:
                kw["nargs"] = opt["nargs"]
            if "choices" in opt:
                kw["choices"] = [_plain(c) for c in opt["choices"]]
            if opt.get("required"):
                kw["required"] = True
            if kind == "append":
                kw["action"] = "append"
            elif kind == "lora_paths":
                kw["action"] = LoRAPathAction
            elif kind == "deprecated_alias":
                kw["action"] = DeprecatedAliasStoreAction
                kw["new_flag"] = opt.get("new_flag")
        elif kind == "store_true":
            kw["action"] = "store_true"
        elif kind == "store_false":
            kw["action"] = "store_false"
        elif kind == "store_const":
            kw["action"] = "store_const"
            kw["const"] = _plain(opt.get("const"))
        elif kind == "boolean_optional":
            # BooleanOptionalAction derives the "--no-" spellings itself.
            flags = [f for f in flags if not f.startswith("--no-")] or flags
            kw["action"] = argparse.BooleanOptionalAction
        elif kind == "deprecated":
            kw["action"] = DeprecatedAction
            kw["error_message"] = opt.get("error_message")
        elif kind == "deprecated_store_true":
            kw["action"] = DeprecatedStoreTrueAction
            kw["new_flag"] = opt.get("new_flag")
        elif kind == "deprecated_store_const":
            kw["action"] = DeprecatedStoreConstAction
            kw["const_value"] = _plain(opt.get("const_value", True))
            kw["new_flag"] = opt.get("new_flag")
            if "choices" in opt:
                kw["choices"] = opt["choices"]
        else:
            raise ValueError(f"stand-in CLI data has an unknown option kind {kind!r}")
        parser.add_argument(*flags, **kw)


def field_defaults(data: dict) -> list:
    """(name, default) for every ServerArgs field, in declaration order."""
    return [(name, _plain(default)) for name, default in data["fields"]]
