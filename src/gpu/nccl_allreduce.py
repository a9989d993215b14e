"""NCCL all-reduce preflight: one process per GPU, spawned and watched by one launcher.

`provision gpu nccl` feeds this file to `python3 -` followed by a call of `launcher_main`
with its configuration, so nothing has to be installed on the target. The launcher starts one
rank per GPU (this same source, run with `-c`), watches them against a deadline and prints one
JSON object per line, each prefixed with PREFIX, on stdout; the Rust side parses them.
Python 3.8 or later; nothing beyond the standard library and torch.
"""
import collections
import json
import os
import socket
import subprocess
import sys
import threading
import time

PREFIX = "PROVISION-NCCL "

# NVLink multicast (NVLS) can put GPUs that others share out of service, and a preflight has
# no use for it; these stay set unless the caller's environment says otherwise.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

TAIL_LINES = 40


def emit(obj):
    sys.stdout.write(PREFIX + json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def rank_main():
    """One rank: join the group, all-reduce, report timings. Reads its settings from env."""
    cfg = json.loads(os.environ["PROVISION_NCCL_RANK"])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    device_index = cfg["devices"][rank]
    t0 = time.monotonic()

    def stage(name):
        emit({"event": "stage", "rank": rank, "stage": name, "t": round(time.monotonic() - t0, 3)})

    stage("import")
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(device_index)
    device = torch.device("cuda", device_index)
    stage("rendezvous")
    # The launcher's deadline is what detects a hang; torch's own must not fire first.
    pg_timeout = datetime.timedelta(seconds=cfg["timeout_s"] + 600)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=pg_timeout)
    if cfg.get("hang_rank") == rank:
        # Testing only (--simulate-hang-rank): joined the store, never joins NCCL, so every
        # other rank waits in NCCL's communicator setup, as a real hang at init does.
        stage("simulated_hang")
        while True:
            time.sleep(3600)
    if cfg.get("crash_rank") == rank:
        stage("simulated_crash")
        raise RuntimeError("simulated crash (provision gpu nccl --simulate-crash-rank)")

    stage("nccl_init")
    t_init = time.monotonic()
    check = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(check)
    torch.cuda.synchronize()
    init_s = time.monotonic() - t_init
    want = world * (world + 1) / 2
    lo, hi = check.min().item(), check.max().item()
    if lo != want or hi != want:
        emit({"event": "wrong_sum", "rank": rank, "want": want, "min": lo, "max": hi})
        sys.exit(3)

    n = max(1, cfg["bytes"] // 4)
    data = torch.ones((n,), dtype=torch.float32, device=device)
    stage("warmup")
    for _ in range(cfg["warmup"]):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    stage("allreduce")
    start = time.perf_counter()
    for _ in range(cfg["iters"]):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    emit({
        "event": "rank_result",
        "rank": rank,
        "device": device_index,
        "device_name": torch.cuda.get_device_name(device),
        "bytes": n * 4,
        "iters": cfg["iters"],
        "elapsed_s": elapsed,
        "init_s": init_s,
    })
    dist.destroy_process_group()
    stage("done")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    """A running rank and what it has said so far."""

    def __init__(self, rank, proc):
        self.rank = rank
        self.proc = proc
        self.stage = "starting"
        self.stage_since = time.monotonic()
        self.result = None
        self.failure = None
        self.stdout_tail = collections.deque(maxlen=TAIL_LINES)
        self.stderr_tail = collections.deque(maxlen=TAIL_LINES)
        self.lock = threading.Lock()
        self.readers = [
            threading.Thread(target=self.read_stdout, daemon=True),
            threading.Thread(target=self.read_stderr, daemon=True),
        ]
        for r in self.readers:
            r.start()

    def read_stdout(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line.startswith(PREFIX):
                # NCCL_DEBUG writes to stdout; keep it for the report.
                self.stdout_tail.append(line)
                continue
            try:
                ev = json.loads(line[len(PREFIX):])
            except ValueError:
                self.stdout_tail.append(line)
                continue
            with self.lock:
                if ev.get("event") == "stage":
                    self.stage = ev["stage"]
                    self.stage_since = time.monotonic()
                elif ev.get("event") == "rank_result":
                    self.result = ev
                elif ev.get("event") == "wrong_sum":
                    self.failure = ev

    def read_stderr(self):
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def describe(self, now):
        with self.lock:
            return {
                "rank": self.rank,
                "stage": self.stage,
                "for_s": round(now - self.stage_since, 3),
                "stdout_tail": list(self.stdout_tail)[-10:],
                "stderr_tail": list(self.stderr_tail)[-20:],
            }


def launcher_main(cfg):
    t0 = time.monotonic()
    deadline = t0 + cfg["timeout_s"]
    os.environ.update(cfg["env"])
    for key, value in SAFE_ENV.items():
        os.environ.setdefault(key, value)
    if cfg.get("visible_devices"):
        os.environ["CUDA_VISIBLE_DEVICES"] = cfg["visible_devices"]
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        emit({"event": "torch_missing", "python": sys.executable, "error": str(e)})
        return 0
    if not (dist.is_available() and dist.is_nccl_available()):
        emit({"event": "nccl_missing", "python": sys.executable, "torch": torch.__version__})
        return 0
    devices = cfg["devices"]
    visible = torch.cuda.device_count()
    if visible < 1 or max(devices) >= visible:
        emit({
            "event": "too_few_gpus",
            "wanted": devices,
            "visible": visible,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        })
        return 0
    nccl = torch.cuda.nccl.version()
    nccl = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
    emit({
        "event": "start",
        "world": len(devices),
        "devices": devices,
        "visible": visible,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "python": sys.executable,
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "t": round(time.monotonic() - t0, 3),
    })

    rank_cfg = {k: cfg[k] for k in ("devices", "bytes", "iters", "warmup", "timeout_s")}
    rank_cfg["hang_rank"] = cfg.get("hang_rank")
    rank_cfg["crash_rank"] = cfg.get("crash_rank")
    port = str(free_port())
    source = cfg["source"] + "\nrank_main()\n"
    ranks = []
    for rank in range(len(devices)):
        env = dict(os.environ)
        env.update({
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(len(devices)),
            "LOCAL_WORLD_SIZE": str(len(devices)),
            "PROVISION_NCCL_RANK": json.dumps(rank_cfg),
            "PYTHONUNBUFFERED": "1",
        })
        # Same process group as the launcher: a transport that kills the group kills all.
        proc = subprocess.Popen(
            [sys.executable, "-c", source],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        ranks.append(Rank(rank, proc))

    def stop_all():
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
        for r in ranks:
            r.proc.wait()
            for t in r.readers:
                t.join(timeout=2)

    while True:
        now = time.monotonic()
        codes = [r.proc.poll() for r in ranks]
        failed = [r for r, c in zip(ranks, codes) if c is not None and c != 0]
        if failed:
            first = failed[0]
            # Give the other ranks a moment to fail too, so the report names the first cause.
            time.sleep(0.2)
            stop_all()
            emit({
                "event": "crash",
                "rank": first.rank,
                "code": first.proc.returncode,
                "wrong_sum": first.failure,
                "after_s": round(now - t0, 3),
                "ranks": [r.describe(now) for r in ranks],
            })
            return 0
        if all(c == 0 for c in codes):
            for r in ranks:
                for t in r.readers:
                    t.join(timeout=2)
            results = [r.result for r in ranks]
            if any(res is None for res in results):
                emit({
                    "event": "crash",
                    "rank": results.index(None),
                    "code": 0,
                    "wrong_sum": None,
                    "after_s": round(now - t0, 3),
                    "ranks": [r.describe(now) for r in ranks],
                })
                return 0
            world = len(devices)
            per_iter = max(res["elapsed_s"] for res in results) / cfg["iters"]
            size = results[0]["bytes"]
            algbw = size / per_iter / 1e9
            emit({
                "event": "result",
                "world": world,
                "devices": devices,
                "device_names": [res["device_name"] for res in results],
                "bytes": size,
                "iters": cfg["iters"],
                "time_per_iter_s": per_iter,
                "algbw_gbps": algbw,
                # nccl-tests' bus bandwidth for all-reduce: the link load, comparable across
                # GPU counts.
                "busbw_gbps": algbw * 2 * (world - 1) / world,
                "init_s": max(res["init_s"] for res in results),
                "elapsed_s": round(time.monotonic() - t0, 3),
            })
            return 0
        if now >= deadline:
            described = [r.describe(now) for r in ranks]
            stop_all()
            emit({
                "event": "hung",
                "after_s": round(now - t0, 3),
                "timeout_s": cfg["timeout_s"],
                "ranks": described,
            })
            return 0
        time.sleep(0.05)
