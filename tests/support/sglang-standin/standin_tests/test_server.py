"""The stand-in server in each mode, on a free loopback port: log phases in
SGLang's formats, the port closed while loading, /health 503 until warm."""

import json
import os
import re
import signal
import socket
import tempfile
import time
import unittest

from standin_tests.helpers import (
    SEED_ARGS,
    TIMESTAMP,
    Server,
    free_port,
    http_get,
    preflight,
    write_model,
)

FIX = ["--mamba-scheduler-strategy", "extra_buffer"]
SPEC_V2 = {"SGLANG_ENABLE_SPEC_V2": "1"}


class ServerModesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = write_model(os.path.join(cls.tmp.name, "Qwen3.5-122B-A10B"), shards=4)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start(self, extra_args=FIX, **env_overrides) -> Server:
        server = Server(self.model, free_port(), extra_args, **{**SPEC_V2, **env_overrides})
        self.addCleanup(server.stop, signal.SIGKILL)
        return server

    def test_ok_mode_serves_after_warmup(self):
        s = self.start(SGLANG_STANDIN_MODE="ok", SGLANG_STANDIN_WARMUP_SECONDS="1.5")
        s.wait_for_line(r"Uvicorn running on http://127\.0\.0\.1:%d " % s.port)
        status, _ = http_get(s.port, "/health")
        self.assertEqual(status, 503, "warming up must answer 503")
        s.wait_for_line(r"The server is fired up and ready to roll!")
        self.assertEqual(http_get(s.port, "/health")[0], 200)
        self.assertEqual(http_get(s.port, "/health_generate")[0], 200)

        status, body = http_get(s.port, "/v1/models")
        self.assertEqual(status, 200)
        models = json.loads(body)
        self.assertEqual(models["object"], "list")
        card = models["data"][0]
        self.assertEqual((card["id"], card["root"], card["owned_by"]), ("qwen3.5-122b",) * 2 + ("sglang",))
        self.assertEqual(card["max_model_len"], 262144)

        info = json.loads(http_get(s.port, "/model_info")[1])
        self.assertEqual(info["architectures"], ["Qwen3_5MoeForConditionalGeneration"])
        self.assertEqual(info["model_path"], self.model)
        server_info = json.loads(http_get(s.port, "/server_info")[1])
        self.assertEqual(server_info["tp_size"], 4)
        self.assertEqual(server_info["version"], "0.5.10+standin")
        self.assertEqual(http_get(s.port, "/v1/models/other")[0], 404)
        self.assertEqual(http_get(s.port, "/nothing")[0], 404)

        self.assertEqual(s.stop(), 0)
        out = s.text()
        phases = [
            "server_args=ServerArgs(model_path=",
            "TP0] Init torch distributed begin.",
            "TP3] Init torch distributed ends.",
            "TP0] Load weight begin.",
            "Loading safetensors checkpoint shards: 100% Completed | 4/4",
            "TP0] Load weight end.",
            "TP0] Memory pool end.",
            "TP0] Capture cuda graph begin.",
            "TP0] Capture cuda graph end.",
            "TP0] max_total_num_tokens=",
            "INFO:     Uvicorn running on",
            '"GET /model_info HTTP/1.1" 200 OK',
            "The server is fired up and ready to roll!",
            '"GET /health HTTP/1.1" 503 Service Unavailable',
            "INFO:     Shutting down",
        ]
        positions = [out.find(p) for p in phases]
        self.assertNotIn(-1, positions, f"missing phase lines in:\n{out}")
        self.assertEqual(positions[:13], sorted(positions[:13]), "phases out of order")
        self.assertRegex(out, TIMESTAMP + r" TP3\] Load weight end\. elapsed=[\d.]+ s, "
                              r"type=Qwen3_5MoeForConditionalGeneration, ")
        self.assertRegex(out, TIMESTAMP + r"\] The server is fired up and ready to roll!")

    def test_slow_mode_keeps_the_port_closed_while_loading(self):
        s = self.start(SGLANG_STANDIN_MODE="slow", SGLANG_STANDIN_LOAD_SECONDS="2",
                       SGLANG_STANDIN_WARMUP_SECONDS="0.2", SGLANG_STANDIN_PROGRESS="lines")
        began = s.wait_for_line(r"TP0\] Load weight begin\.")
        self.assertIsNone(http_get(s.port, "/health")[0], "port must be closed while loading")
        first = s.wait_for_line(r"shards:   0% Completed \| 0/4")
        s.wait_for_line(r"shards:  50% Completed \| 2/4")
        self.assertIsNone(http_get(s.port, "/health")[0])
        last = s.wait_for_line(r"shards: 100% Completed \| 4/4")
        self.assertGreaterEqual(last - first, 1.5, "progress must be spread over the load time")
        self.assertGreaterEqual(last - began, 1.5)
        s.wait_for_line(r"The server is fired up and ready to roll!")
        self.assertEqual(http_get(s.port, "/health")[0], 200)

    def test_hang_at_distributed_init(self):
        s = self.start(SGLANG_STANDIN_MODE="hang")
        s.wait_for_line(r"TP3\] Init torch distributed begin\.")
        time.sleep(1.5)
        self.assertIsNone(s.proc.poll(), "a hang must not exit")
        self.assertIsNone(http_get(s.port, "/health")[0], "port must stay closed")
        self.assertNotIn("Init torch distributed ends.", s.text())
        self.assertEqual(s.stop(signal.SIGTERM), -signal.SIGTERM)

    def test_hang_at_warmup_keeps_health_at_503(self):
        s = self.start(SGLANG_STANDIN_MODE="hang", SGLANG_STANDIN_HANG_AT="warmup")
        s.wait_for_line(r"Uvicorn running on")
        time.sleep(1.2)
        self.assertEqual(http_get(s.port, "/health")[0], 503)
        self.assertEqual(http_get(s.port, "/v1/models")[0], 200)
        self.assertNotIn("fired up", s.text())

    def test_crash_at_start_prints_a_traceback_and_exits_1(self):
        s = self.start(SGLANG_STANDIN_MODE="crash", SGLANG_STANDIN_CRASH_MESSAGE="boom for the test")
        self.assertEqual(s.proc.wait(10), 1)
        s.stop()
        out = s.text()
        self.assertIn('launch_server.py", line 59, in <module>', out)
        self.assertIn("server_args = prepare_server_args(sys.argv[1:])", out)
        self.assertTrue(out.rstrip().endswith("ValueError: boom for the test"), out)

    def test_crash_after_parsing_is_invisible_to_the_preflight(self):
        knobs = {"SGLANG_STANDIN_MODE": "crash", "SGLANG_STANDIN_CRASH_AT": "start",
                 "SGLANG_STANDIN_CRASH_MESSAGE": "late boom"}
        self.assertTrue(preflight(["--model-path", self.model, *SEED_ARGS, *FIX], **knobs)["ok"])
        s = self.start(**knobs)
        self.assertEqual(s.proc.wait(10), 1)
        s.stop()
        self.assertIn("in run_server", s.text())
        self.assertTrue(s.text().rstrip().endswith("RuntimeError: late boom"), s.text())

    def test_seed_unit_crashes_with_the_real_message(self):
        s = self.start(extra_args=[])
        self.assertEqual(s.proc.wait(10), 1)
        s.stop()
        out = s.text()
        self.assertIn("in _handle_mamba_radix_cache", out)
        self.assertIn("--mamba-scheduler-strategy no_buffer.To use radix cache", out)
        self.assertNotIn("Init torch distributed", out)

    def test_crash_while_loading_kills_the_process(self):
        s = self.start(SGLANG_STANDIN_MODE="crash", SGLANG_STANDIN_CRASH_AT="load",
                       SGLANG_STANDIN_CRASH_MESSAGE="CUDA out of memory (stand-in)")
        self.assertEqual(s.proc.wait(10), -signal.SIGKILL)
        s.stop()
        out = s.text()
        self.assertRegex(out, TIMESTAMP + r" TP0\] Scheduler hit an exception: Traceback")
        self.assertIn("RuntimeError: CUDA out of memory (stand-in)", out)
        self.assertIn("Received sigquit from a child process. It usually means the child failed.", out)

    def test_port_in_use(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            s = Server(self.model, taken.getsockname()[1], FIX)
            self.addCleanup(s.stop, signal.SIGKILL)
            self.assertEqual(s.proc.wait(10), 1)
        s.stop()
        self.assertRegex(s.text(), r"ERROR:    \[Errno 98\] error while attempting to bind on address")

    def test_line_0_5_23_starts_with_the_seed_unit(self):
        s = self.start(extra_args=[], SGLANG_STANDIN_LINE="0.5.23", SGLANG_STANDIN_WARMUP_SECONDS="0.2")
        s.wait_for_line(r"The server is fired up and ready to roll!")
        info = json.loads(http_get(s.port, "/server_info")[1])
        self.assertEqual(info["mamba_radix_cache_strategy"], "extra_buffer")
        self.assertEqual(info["version"], "0.5.23+standin")
        self.assertTrue(re.search(r"Loading safetensors checkpoint shards: 100% Completed \| 4/4", s.text()))


if __name__ == "__main__":
    unittest.main()
