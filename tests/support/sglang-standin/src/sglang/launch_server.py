"""Launch the inference server -- of the SGLang STAND-IN (THIS IS NOT SGLANG).

`python -m sglang.launch_server ARGS` behaves like the real entry point as far
as the provision tool can see: the same argument parsing and validation, the
same log phase lines, and an HTTP server with /health, /v1/models, /model_info
and /server_info. It never loads a model and never touches a GPU.

Behaviour knobs (environment variables, see the README next to pyproject.toml):
  SGLANG_STANDIN_LINE            0.5.10 | 0.5.23      release line to imitate
  SGLANG_STANDIN_MODE            ok | crash | hang | slow
  SGLANG_STANDIN_HANG_AT         distributed_init | load_weight | warmup
  SGLANG_STANDIN_CRASH_AT        args | start | load
  SGLANG_STANDIN_CRASH_MESSAGE   text of the requested crash
  SGLANG_STANDIN_LOAD_SECONDS    time spent "loading weights"
  SGLANG_STANDIN_WARMUP_SECONDS  time /health answers 503 after the port opens
  SGLANG_STANDIN_PROGRESS        tqdm | lines   (shape of the shard progress)
  SGLANG_STANDIN_NO_GPU          1 = behave like a host without a GPU

prepare_server_args is called on line 59, as in SGLang 0.5.10's traceback.
"""

import os
import sys
import warnings

from sglang import _standin
from sglang.srt.server_args import prepare_server_args


def kill_process_tree(parent_pid, include_parent: bool = True) -> None:
    """The stand-in runs in one process: there are no children to kill."""
    if _standin.line() != "0.5.10":
        import logging

        logging.getLogger(__name__).info(
            f"kill_process_tree called: parent_pid={parent_pid}, "
            f"include_parent={include_parent}, pid={os.getpid()}"
        )


def run_server(server_args):
    """Resolve (0.5.19+ lines) and run the HTTP server."""
    if _standin.line() != "0.5.10":
        server_args.resolve_once()
    from sglang.srt.entrypoints.http_server import launch_server

    launch_server(server_args)


if __name__ == "__main__":
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but "
        "'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )

    server_args = prepare_server_args(sys.argv[1:])

    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
