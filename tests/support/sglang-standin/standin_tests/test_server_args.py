"""Argument handling of the stand-in, driven through src/resources/service/sglang_preflight.py (the
same script the provisioner's preflight runs against the real SGLang).

Expected messages are the real ones, recorded from sglang==0.5.10 and
sglang==0.5.23 (see docs/sglang-notes.md)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from standin_tests.helpers import SEED_ARGS, SPEC_MAMBA_ERROR, env, preflight, write_model

ARCH = "Qwen3_5MoeForConditionalGeneration"


class ServerArgsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = write_model(os.path.join(cls.tmp.name, "Qwen3.5-122B-A10B"))
        cls.seed = ["--model-path", cls.model, *SEED_ARGS, "--host", "0.0.0.0"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def resolved(self, argv, **env_overrides) -> dict:
        """ServerArgs fields after parsing (and resolving, on 0.5.23)."""
        code = (
            "import json, sys\n"
            "from sglang.srt.server_args import prepare_server_args\n"
            "a = prepare_server_args(sys.argv[1:])\n"
            "getattr(a, 'resolve_once', lambda: None)()\n"
            "print(json.dumps({k: getattr(a, k, None) for k in sys.stdin.read().split()}))\n"
        )
        keys = "tp_size speculative_algorithm mamba_scheduler_strategy mamba_radix_cache_strategy " \
               "disable_overlap_schedule served_model_name max_running_requests device"
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv], input=keys, capture_output=True, text=True,
            env=env(**env_overrides), timeout=60,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return json.loads(proc.stdout)

    # --- the seeds' case on the 0.5.10 line ---------------------------------

    def test_seed_unit_without_the_two_flags_fails_with_the_real_error(self):
        r = preflight(self.seed)
        self.assertFalse(r["ok"])
        self.assertEqual(r["stage"], "parse")
        self.assertEqual(r["error"], SPEC_MAMBA_ERROR.format(arch=ARCH))
        for frame in ("in prepare_server_args", "in from_cli_args", 'File "<string>"',
                      "in __post_init__", "in _handle_mamba_radix_cache"):
            self.assertIn(frame, r["traceback"])

    def test_seed_unit_with_the_two_flags_passes(self):
        r = preflight(self.seed + ["--mamba-scheduler-strategy", "extra_buffer"],
                      SGLANG_ENABLE_SPEC_V2="1")
        self.assertTrue(r["ok"], r)
        self.assertEqual(r["stage"], "done")

    def test_extra_buffer_without_spec_v2_parses_but_disables_overlap(self):
        argv = self.seed + ["--mamba-scheduler-strategy", "extra_buffer"]
        self.assertTrue(preflight(argv)["ok"])
        self.assertTrue(self.resolved(argv)["disable_overlap_schedule"])
        self.assertFalse(self.resolved(argv, SGLANG_ENABLE_SPEC_V2="1")["disable_overlap_schedule"])

    def test_architecture_comes_from_config_json(self):
        with tempfile.TemporaryDirectory() as d:
            nxt = write_model(os.path.join(d, "next"), "Qwen3NextForCausalLM", "qwen3_next")
            dense = write_model(os.path.join(d, "dense"), "Qwen3ForCausalLM", "qwen3")
            r = preflight(["--model-path", nxt, *SEED_ARGS])
            self.assertEqual(r["error"], SPEC_MAMBA_ERROR.format(arch="Qwen3NextForCausalLM"))
            self.assertTrue(preflight(["--model-path", dense, *SEED_ARGS])["ok"])

    def test_abbreviations_and_defaults_resolve_like_argparse(self):
        argv = self.seed + ["--mamba-scheduler-strategy", "extra_buffer"]
        fields = self.resolved(argv, SGLANG_ENABLE_SPEC_V2="1")
        self.assertEqual(fields["tp_size"], 4)  # --tp abbreviates --tp-size
        self.assertEqual(fields["speculative_algorithm"], "EAGLE")  # NEXTN is rewritten
        self.assertEqual(fields["max_running_requests"], 48)
        self.assertEqual(fields["served_model_name"], "qwen3.5-122b")

    # --- argparse errors ------------------------------------------------------

    def test_unknown_flag_is_rejected_like_argparse(self):
        r = preflight(self.seed + ["--frobnicate", "1"])
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"], "sglang serve: error: unrecognized arguments: --frobnicate 1")
        self.assertTrue(r["traceback"].startswith("usage: sglang serve [-h] --model-path MODEL_PATH"))
        proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", *self.seed, "--frobnicate", "1"],
                              capture_output=True, text=True, env=env(), timeout=60)
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(proc.stderr.strip().splitlines()[-1],
                         "sglang serve: error: unrecognized arguments: --frobnicate 1")

    def test_ambiguous_abbreviation_and_bad_choice(self):
        r = preflight(self.seed + ["--speculative-num", "3"])
        self.assertEqual(r["error"], "sglang serve: error: ambiguous option: --speculative-num could "
                                     "match --speculative-num-steps, --speculative-num-draft-tokens")
        r = preflight(self.seed + ["--kv-cache-dtype", "bf17"])
        self.assertEqual(r["error"], "sglang serve: error: argument --kv-cache-dtype: invalid choice: "
                                     "'bf17' (choose from 'auto', 'fp8_e5m2', 'fp8_e4m3', 'bf16', "
                                     "'bfloat16', 'fp4_e2m1')")

    def test_missing_model_path_argument(self):
        r = preflight(SEED_ARGS)
        self.assertEqual(
            r["error"], "sglang serve: error: the following arguments are required: --model-path/--model"
        )

    # --- the model folder -----------------------------------------------------

    def test_model_folder_problems_fail_like_transformers_offline(self):
        with tempfile.TemporaryDirectory() as d:
            r = preflight(["--model-path", d, *SEED_ARGS])
            self.assertEqual(r["error"], f"ValueError: Unrecognized model in {d}. "
                                         "Should have a `model_type` key in its config.json.")
        r = preflight(["--model-path", "/shared/models/absent", *SEED_ARGS])
        self.assertTrue(r["error"].startswith("OSError: Repo id must be in the form"), r["error"])
        r = preflight(["--model-path", "Qwen/Qwen3.5-122B-A10B", *SEED_ARGS])
        self.assertTrue(r["error"].startswith("OSError: We couldn't connect to 'https://huggingface.co'"))

    # --- hosts without a GPU --------------------------------------------------

    def test_no_gpu_host(self):
        r = preflight(self.seed, SGLANG_STANDIN_NO_GPU="1")
        self.assertEqual(r["error"], "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) is available.")
        r = preflight(self.seed + ["--device", "cpu", "--mamba-scheduler-strategy", "extra_buffer"],
                      SGLANG_STANDIN_NO_GPU="1")
        self.assertEqual(r["error"], "AssertionError: Mamba extra_buffer is only supported on CUDA devices with FLA backend")

    # --- the 0.5.23 line ------------------------------------------------------

    def test_line_0_5_23_renamed_flag_and_auto_strategy(self):
        line = {"SGLANG_STANDIN_LINE": "0.5.23"}
        self.assertTrue(preflight(self.seed, **line)["ok"])
        fields = self.resolved(self.seed, **line)
        self.assertEqual(fields["mamba_radix_cache_strategy"], "extra_buffer")
        self.assertIsNone(fields["mamba_scheduler_strategy"])
        r = preflight(self.seed + ["--mamba-scheduler-strategy", "extra_buffer"], **line)
        self.assertEqual(
            r["error"], "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"
        )
        r = preflight(self.seed + ["--mamba-radix-cache-strategy", "no_buffer"], **line)
        self.assertEqual(r["stage"], "resolve")
        self.assertEqual(r["error"], "AssertionError: no_buffer do not support overlap schedule. "
                                     "Try to set disable_overlap_schedule=True.")
        self.assertIn("in validate_mamba_no_buffer", r["traceback"])
        r = preflight(self.seed, SGLANG_STANDIN_NO_GPU="1", **line)
        self.assertEqual(r["error"], "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) "
                                     "or platform plugin is available.")

    def test_version_names_the_line_and_the_stand_in(self):
        for line in ("0.5.10", "0.5.23"):
            proc = subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__version__)"],
                                  capture_output=True, text=True, env=env(SGLANG_STANDIN_LINE=line))
            self.assertEqual(proc.stdout.strip(), f"{line}+standin")
        proc = subprocess.run([sys.executable, "-c", "import sglang"], capture_output=True, text=True,
                              env=env(SGLANG_STANDIN_LINE="0.4.0"))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("SGLANG_STANDIN_LINE='0.4.0' is not one of", proc.stderr)


if __name__ == "__main__":
    unittest.main()
