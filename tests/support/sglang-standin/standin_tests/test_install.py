"""Offline install into a fresh venv, the way a lab container's ml-env gets it:
build the wheel with the standard library, `pip install --no-index` it, run it."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from standin_tests.helpers import ROOT

# Debian bookworm's own interpreter is what lab containers have; fall back to
# the interpreter running the tests elsewhere.
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _venv_unavailable() -> str:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip, venv"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"{SYSTEM_PYTHON} cannot create venvs (install python3-venv): {probe.stderr.strip()}"
    return ""


@unittest.skipIf(_venv_unavailable(), _venv_unavailable())
class OfflineInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sglang-standin-")
        cls.venv = os.path.join(cls.tmp, "ml-env")
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", cls.venv], check=True, timeout=120)
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.pip = os.path.join(cls.venv, "bin", "pip")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def build(self, line: str) -> str:
        out = os.path.join(self.tmp, "wheels")
        proc = subprocess.run(
            [sys.executable, os.path.join(ROOT, "build_wheel.py"), "--line", line, "--out", out],
            capture_output=True, text=True, check=True, timeout=60,
        )
        return proc.stdout.strip()

    def run_venv(self, *args, **kw):
        # A clean environment: nothing from the test runner's PYTHONPATH or knobs.
        clean = {"PATH": os.path.dirname(self.python) + os.pathsep + "/usr/bin:/bin", "HOME": self.tmp}
        return subprocess.run(list(args), capture_output=True, text=True, env=clean, timeout=120, **kw)

    def test_install_offline_and_run_help(self):
        for line, flag in (("0.5.10", "--mamba-scheduler-strategy"), ("0.5.23", "--mamba-radix-cache-strategy")):
            with self.subTest(line=line):
                wheel = self.build(line)
                self.assertTrue(wheel.endswith(f"sglang-{line}+standin-py3-none-any.whl"), wheel)
                pip = self.run_venv(self.pip, "install", "--no-index", "--isolated", "--force-reinstall", wheel)
                self.assertEqual(pip.returncode, 0, pip.stdout + pip.stderr)

                proc = self.run_venv(self.python, "-m", "sglang.launch_server", "--help")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertTrue(proc.stdout.startswith("usage: sglang serve [-h] --model-path MODEL_PATH"))
                self.assertIn(flag, proc.stdout)

                version = self.run_venv(self.python, "-c",
                                        "import importlib.metadata as m, sglang; "
                                        "print(m.version('sglang'), sglang.__version__)")
                self.assertEqual(version.stdout.split(), [f"{line}+standin"] * 2)
                script = self.run_venv(os.path.join(self.venv, "bin", "sglang"), "serve", "--help")
                self.assertEqual(script.returncode, 0, script.stderr)

    def test_same_sources_give_the_same_wheel(self):
        first = self.build("0.5.10")
        with open(first, "rb") as f:
            before = f.read()
        with open(self.build("0.5.10"), "rb") as f:
            self.assertEqual(before, f.read())


if __name__ == "__main__":
    unittest.main()
