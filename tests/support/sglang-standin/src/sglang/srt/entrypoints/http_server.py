"""Stand-in for `sglang.srt.entrypoints.http_server` (THIS IS NOT SGLANG).

Prints SGLang's startup phase lines in SGLang's formats, then serves a small
HTTP API. Like the real server, the port stays closed while "loading" and
/health answers 503 until the warmup request has gone through.
"""

import dataclasses
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang import _standin
from sglang.srt.standin_model import HYBRID_0_5_10, MAMBA_RADIX_0_5_23, shard_count
from sglang.version import __version__

logger = logging.getLogger(__name__)

DATEFMT = "%Y-%m-%d %H:%M:%S"


def configure_logger(server_args, prefix: str = "") -> None:
    logging.basicConfig(
        level=getattr(logging, server_args.log_level.upper(), logging.INFO),
        format=f"[%(asctime)s{prefix}] %(message)s",
        datefmt=DATEFMT,
        force=True,
    )


class _Out:
    """Writes log lines the way the scheduler processes and uvicorn do."""

    def __init__(self, server_args) -> None:
        self.level = getattr(logging, server_args.log_level.upper(), logging.INFO)
        self.tp_size = server_args.tp_size
        self.lock = threading.Lock()

    def _write(self, stream, text: str) -> None:
        with self.lock:
            stream.write(text)
            stream.flush()

    def rank(self, rank: int, message: str, level: int = logging.INFO) -> None:
        """A scheduler line; "TP<rank>" appears only when tp_size > 1."""
        if level < self.level:
            return
        prefix = f" TP{rank}" if self.tp_size > 1 else ""
        self._write(sys.stderr, f"[{time.strftime(DATEFMT)}{prefix}] {message}\n")

    def all_ranks(self, message: str) -> None:
        for rank in range(self.tp_size):
            self.rank(rank, message)

    def uvicorn(self, message: str, levelname: str = "INFO") -> None:
        if getattr(logging, levelname) < self.level:
            return
        prefix = (levelname + ":").ljust(9)
        self._write(sys.stderr, f"[{time.strftime(DATEFMT)}] {prefix} {message}\n")

    def access(self, client: str, request_line: str, status: int) -> None:
        if logging.INFO < self.level:
            return
        from http import HTTPStatus

        phrase = HTTPStatus(status).phrase
        self._write(
            sys.stdout,
            f'[{time.strftime(DATEFMT)}] INFO:     {client} - "{request_line}" {status} {phrase}\n',
        )

    def raw(self, text: str) -> None:
        self._write(sys.stderr, text)


class _State:
    """What the tokenizer manager would know: starting, up, or exiting."""

    def __init__(self, server_args, knobs) -> None:
        self.server_args = server_args
        self.knobs = knobs
        self.status = "Starting"
        self.gracefully_exit = False
        self.model_config = server_args.get_model_config()
        self.max_total_num_tokens = 1048576


def _block_forever() -> None:
    while True:
        time.sleep(3600)


def _fmt_interval(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


def _progress(out: _Out, knobs, total: int) -> None:
    """The safetensors progress bar: tqdm's carriage-return updates, or plain lines."""
    desc = "Loading safetensors checkpoint shards"
    start = time.monotonic()
    step = knobs.load_seconds / total
    for done in range(total + 1):
        if done:
            time.sleep(step)
        elapsed = time.monotonic() - start
        if done == 0:
            tail = "[00:00<?, ?it/s]"
        else:
            rate = elapsed / done
            speed = f"{rate:.2f}s/it" if rate >= 1 else f"{1 / max(rate, 1e-9):.2f}it/s"
            tail = f"[{_fmt_interval(elapsed)}<{_fmt_interval(rate * (total - done))}, {speed}]"
        text = f"{desc}: {100 * done // total:3d}% Completed | {done}/{total} {tail}"
        out.raw(f"{text}\n" if knobs.progress == "lines" else f"\r{text}")
    if knobs.progress == "tqdm":
        out.raw("\n")


def _draft_type(arch: str) -> str:
    """The class the real loader uses for a model's built-in MTP draft layer."""
    if arch.startswith("Qwen3_5"):
        return "Qwen3_5ForCausalLMMTP"
    return f"{arch}MTP"


def run_scheduler_process(knobs) -> None:
    """Where the real scheduler would fail while loading (crash_at=load)."""
    raise RuntimeError(knobs.crash_message)


def _load_model(out: _Out, state: _State) -> None:
    server_args, knobs = state.server_args, state.knobs
    hf_config = state.model_config.hf_config
    arch = hf_config.architectures[0]
    hang = knobs.mode == "hang"

    out.all_ranks("Init torch distributed begin.")
    if hang and knobs.hang_at == "distributed_init":
        _block_forever()
    out.all_ranks("sglang is using nccl==2.27.5")
    out.all_ranks("Init torch distributed ends. elapsed=0.82 s, mem usage=0.77 GB")
    out.all_ranks("Load weight begin. avail mem=93.62 GB")
    if hang and knobs.hang_at == "load_weight":
        _block_forever()
    out.rank(0, "Using model weights format ['*.safetensors']")
    if knobs.mode == "crash" and knobs.crash_at == "load":
        try:
            run_scheduler_process(knobs)
        except Exception:
            out.rank(0, f"Scheduler hit an exception: {traceback.format_exc()}", logging.ERROR)
            logger.error("Received sigquit from a child process. It usually means the child failed.")
            # The real launcher kills its whole process tree, itself included.
            os.kill(os.getpid(), signal.SIGKILL)
    _progress(out, knobs, shard_count(server_args.model_path) or 10)
    out.all_ranks(
        f"Load weight end. elapsed={knobs.load_seconds + 0.4:.2f} s, type={arch}, "
        "avail mem=32.41 GB, mem usage=61.21 GB."
    )
    if server_args.speculative_algorithm is not None:
        out.all_ranks("Load weight begin. avail mem=32.41 GB")
        out.all_ranks(
            f"Load weight end. elapsed=1.10 s, type={_draft_type(arch)}, avail mem=30.12 GB, mem usage=2.29 GB."
        )
    if arch in HYBRID_0_5_10 or arch in MAMBA_RADIX_0_5_23:
        out.all_ranks(
            "Mamba Cache is allocated. max_mamba_cache_size: 96, conv_state size: 0.21GB, "
            "ssm_state size: 6.33GB "
        )
    out.all_ranks(
        f"KV Cache is allocated. #tokens: {state.max_total_num_tokens}, K size: 6.00 GB, V size: 6.00 GB"
    )
    out.all_ranks("Memory pool end. avail mem=11.52 GB")
    if not server_args.disable_cuda_graph:
        out.all_ranks("Capture cuda graph begin. This can take up to several minutes. avail mem=11.40 GB")
        out.all_ranks("Capture cuda graph end. Time elapsed: 4.87 s. mem usage=0.93 GB. avail mem=10.47 GB.")
        if server_args.speculative_algorithm is not None:
            out.all_ranks("Capture draft cuda graph begin. This can take up to several minutes. avail mem=10.47 GB")
            out.all_ranks("Capture draft cuda graph end. Time elapsed: 2.01 s. mem usage=0.31 GB. avail mem=10.16 GB.")
    out.rank(
        0,
        f"max_total_num_tokens={state.max_total_num_tokens}, "
        f"chunked_prefill_size={server_args.chunked_prefill_size or 8192}, "
        f"max_prefill_tokens={server_args.max_prefill_tokens}, "
        f"max_running_requests={server_args.max_running_requests or 2048}, "
        f"context_len={state.model_config.context_len}, available_gpu_mem=10.16 GB",
    )


def _warmup(out: _Out, state: _State) -> None:
    """The real warmup: GET /model_info, one POST /generate, then "fired up"."""
    client = f"127.0.0.1:{random.randint(32768, 60999)}"
    out.access(client, "GET /model_info HTTP/1.1", 200)
    if state.knobs.mode == "hang" and state.knobs.hang_at == "warmup":
        _block_forever()
    time.sleep(state.knobs.warmup_seconds)
    out.rank(
        0,
        "Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, ",
    )
    out.access(client, "POST /generate HTTP/1.1", 200)
    state.status = "Up"
    logger.info("The server is fired up and ready to roll!")


def _model_card(state: _State) -> dict:
    name = state.server_args.served_model_name
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": state.model_config.context_len,
    }


def _model_info(state: _State) -> dict:
    server_args, hf = state.server_args, state.model_config.hf_config
    return {
        "model_path": server_args.model_path,
        "tokenizer_path": server_args.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": server_args.preferred_sampling_params,
        "weight_version": server_args.weight_version,
        "has_image_understanding": hf.is_multimodal(),
        "has_audio_understanding": False,
        "model_type": hf.model_type,
        "architectures": hf.architectures,
    }


def _server_info(state: _State) -> dict:
    args = dataclasses.asdict(state.server_args)
    return {
        **args,
        "status": "ready",
        "max_total_num_tokens": state.max_total_num_tokens,
        "max_req_input_len": state.model_config.context_len - 5,
        "internal_states": [{"last_gen_throughput": 0.0}],
        "version": __version__,
        "standin": True,
    }


def _handler(state: _State, out: _Out):
    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's name
            pass

        def _send(self, status: int, body=None) -> None:
            data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
            self.send_response(status)
            if body is not None:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            out.access(f"{self.client_address[0]}:{self.client_address[1]}", self.requestline, status)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate"):
                up = state.status == "Up" and not state.gracefully_exit
                self._send(200 if up else 503)
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [_model_card(state)]})
            elif path.startswith("/v1/models/"):
                model = path[len("/v1/models/"):]
                if model == state.server_args.served_model_name:
                    self._send(200, _model_card(state))
                else:
                    self._send(404, {"error": {
                        "message": f"The model '{model}' does not exist",
                        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
                    }})
            elif path in ("/model_info", "/get_model_info"):
                if path == "/get_model_info":
                    logger.warning(
                        "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                        "Please use '/model_info' instead."
                    )
                self._send(200, _model_info(state))
            elif path in ("/server_info", "/get_server_info"):
                if path == "/get_server_info":
                    logger.warning(
                        "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                        "Please use '/server_info' instead."
                    )
                self._send(200, _server_info(state))
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            known = ("/health", "/health_generate", "/v1/models", "/model_info", "/server_info")
            self._send(405 if self.path in known else 404,
                       {"detail": "Method Not Allowed" if self.path in known else "Not Found"})

    return Handler


def _bind(state: _State, out: _Out) -> ThreadingHTTPServer:
    host, port = state.server_args.host, state.server_args.port

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

    try:
        return Server((host, port), _handler(state, out))
    except OSError as e:
        out.uvicorn(
            f"[Errno {e.errno}] error while attempting to bind on address ({host!r}, {port}): "
            f"[errno {e.errno}] {os.strerror(e.errno or 0).lower()}",
            "ERROR",
        )
        sys.exit(1)


def launch_server(server_args) -> None:
    """Run the startup phases, then serve until SIGTERM/SIGINT."""
    knobs = _standin.Knobs()
    if knobs.mode == "crash" and knobs.crash_at == "start":
        raise RuntimeError(knobs.crash_message)
    configure_logger(server_args)
    out = _Out(server_args)
    logger.info(f"server_args={server_args!r}")
    state = _State(server_args, knobs)
    _load_model(out, state)

    pid = os.getpid()
    out.uvicorn(f"Started server process [{pid}]")
    out.uvicorn("Waiting for application startup.")
    out.uvicorn("Application startup complete.")
    httpd = _bind(state, out)
    shown_host = f"[{server_args.host}]" if ":" in server_args.host else server_args.host
    out.uvicorn(f"Uvicorn running on http://{shown_host}:{server_args.port} (Press CTRL+C to quit)")

    stop = threading.Event()

    def on_signal(signum, frame):
        if signum == signal.SIGTERM:
            logger.warning(
                f"SIGTERM received. signum={signum} frame={frame}. Draining requests and shutting down..."
            )
        state.gracefully_exit = True
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    threading.Thread(target=_warmup, args=(out, state), name="warmup", daemon=True).start()
    while not stop.wait(0.5):
        pass
    out.uvicorn("Shutting down")
    httpd.shutdown()
    httpd.server_close()
    out.uvicorn("Waiting for application shutdown.")
    out.uvicorn("Application shutdown complete.")
    out.uvicorn(f"Finished server process [{pid}]")
