# provision's SGLang preflight (embedded in the agent): run the INSTALLED SGLang's own
# argument handling on the unit's exact argv, without starting a server.
#
#   env -i <the unit's Environment= lines> HF_HUB_OFFLINE=1 \
#     timeout 120 /root/ml-env/bin/python - <ExecStart argv after -m sglang.launch_server> <<'EOF'
#   <this file>
#   EOF
#
# The last line on stdout is one JSON object:
#   {"ok": bool, "error": str, "traceback": str, "stage": "import"|"parse"|"resolve"|"done"}
# "error" is SGLang's own message (argparse's "error:" line, or the exception
# line such as "ValueError: Speculative decoding for ... no_buffer.To use ...").
# Works against SGLang 0.5.10 .. 0.5.23 and the stand-in in tests/support/sglang-standin.
import contextlib
import io
import json
import sys
import traceback

result = {"ok": False, "error": "", "traceback": "", "stage": "import"}
try:
    from sglang.srt.server_args import prepare_server_args

    result["stage"] = "parse"
    captured = io.StringIO()
    try:
        # <= 0.5.18 validates inside ServerArgs.__post_init__, i.e. here.
        with contextlib.redirect_stderr(captured):
            server_args = prepare_server_args(sys.argv[1:])
    except SystemExit as exit_:
        # argparse printed usage and "sglang serve: error: ..." to stderr.
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        result["error"] = lines[-1] if lines else f"argparse exited with status {exit_.code}"
        result["traceback"] = captured.getvalue()
        raise
    finally:
        sys.stderr.write(captured.getvalue())
    resolve = getattr(server_args, "resolve_once", None)
    if callable(resolve):
        # 0.5.19+: prepare_server_args only parses; resolution validates.
        result["stage"] = "resolve"
        resolve()
    result["stage"] = "done"
    result["ok"] = True
except SystemExit:
    pass
except BaseException as exc:  # noqa: BLE001 - report whatever SGLang raised, verbatim
    result["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    result["traceback"] = traceback.format_exc()
sys.stdout.write("\n" + json.dumps(result) + "\n")
