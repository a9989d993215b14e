"""Shared helpers: a fake model folder, the seed unit's argv, and a running
stand-in server whose output is collected line by line."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
PREFLIGHT = os.path.join(ROOT, "..", "..", "..", "src", "resources", "service", "sglang_preflight.py")

# The ExecStart of the seeds' first unit (Qwen3.5-122B-A10B, TP=4, MTP), minus
# the two flags whose absence crashed it; the model path is filled in per test.
SEED_ARGS = [
    "--served-model-name", "qwen3.5-122b", "--tp", "4", "--trust-remote-code",
    "--attention-backend", "triton", "--kv-cache-dtype", "bf16",
    "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder",
    "--speculative-algo", "NEXTN", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
]

# SGLang 0.5.10's message, verbatim: note that there is no space after "no_buffer.".
SPEC_MAMBA_ERROR = (
    "ValueError: Speculative decoding for {arch} is not compatible with radix cache "
    "when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative "
    "decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
)

TIMESTAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def write_model(folder: str, arch: str = "Qwen3_5MoeForConditionalGeneration",
                model_type: str = "qwen3_5_moe", shards: int = 0) -> str:
    """A model folder as provision lays it out: config.json (+ optional shard files)."""
    os.makedirs(folder, exist_ok=True)
    config = {
        "architectures": [arch],
        "model_type": model_type,
        "text_config": {
            "max_position_embeddings": 262144,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "mtp_num_hidden_layers": 1,
        },
        "vision_config": {"depth": 27},
    }
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        open(os.path.join(folder, name), "wb").close()
    return folder


def env(**overrides) -> dict:
    """The environment for a stand-in child: src on PYTHONPATH, no stray knobs."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    base["PYTHONPATH"] = SRC
    base["PYTHONUNBUFFERED"] = "1"
    base.update({k: str(v) for k, v in overrides.items()})
    return base


def preflight(argv, **env_overrides) -> dict:
    """Run preflight_reference.py (as `python - ARGV`) against the stand-in."""
    with open(PREFLIGHT, encoding="utf-8") as f:
        script = f.read()
    proc = subprocess.run(
        [sys.executable, "-", *argv], input=script, capture_output=True, text=True,
        env=env(**env_overrides), timeout=60,
    )
    last = proc.stdout.strip().splitlines()[-1]
    result = json.loads(last)
    result["stderr"] = proc.stderr
    return result


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 2.0):
    """(status, body) of a GET on loopback; status None when nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (ConnectionError, urllib.error.URLError, socket.timeout):
        return None, b""


class Server:
    """`python -m sglang.launch_server` of the stand-in, output captured with arrival times."""

    def __init__(self, model: str, port: int, extra_args=(), **env_overrides) -> None:
        args = ["--model-path", model, *SEED_ARGS, "--host", "127.0.0.1", "--port", str(port), *extra_args]
        self.port = port
        self.lines = []  # (monotonic time, stream name, text)
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(**env_overrides),
        )
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, "stderr"), daemon=True),
        ]
        for t in self.readers:
            t.start()

    def _read(self, stream, name: str) -> None:
        buf = b""
        while True:
            chunk = stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                with self.lock:
                    self.lines.append((time.monotonic(), name, line.decode(errors="replace")))
        if buf:
            with self.lock:
                self.lines.append((time.monotonic(), name, buf.decode(errors="replace")))

    def text(self) -> str:
        with self.lock:
            return "\n".join(line for _, _, line in self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 10.0) -> float:
        """Arrival time of the first line matching `pattern` (a regex)."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            with self.lock:
                for when, _, line in self.lines:
                    if regex.search(line):
                        return when
            if self.proc.poll() is not None:
                time.sleep(0.1)  # let the readers drain
                with self.lock:
                    for when, _, line in self.lines:
                        if regex.search(line):
                            return when
                raise AssertionError(f"exited ({self.proc.returncode}) before {pattern!r}:\n{self.text()}")
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n{self.text()}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for t in self.readers:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if not stream.closed:
                stream.close()
        return self.proc.returncode
