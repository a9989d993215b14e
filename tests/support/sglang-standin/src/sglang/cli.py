"""`sglang serve ARGS` of the stand-in (NOT SGLang): the same as
`python -m sglang.launch_server ARGS`."""

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        sys.stderr.write("usage: sglang serve --model-path MODEL_PATH [options]  (SGLang stand-in)\n")
        sys.exit(2)
    sys.argv = [os.path.join(os.path.dirname(__file__), "launch_server.py")] + sys.argv[2:]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
