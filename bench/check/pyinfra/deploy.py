"""The state of bench/check/state.json, declared for pyinfra; scripts/bench-check runs it as
`pyinfra inventory.py deploy.py --dry`, with BENCH_VARS naming vars.json (state.json with the
mirror filled in)."""

import json
import os
from io import StringIO

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files, pip, server

with open(os.environ["BENCH_VARS"]) as f:
    state = json.load(f)
src, cuda, env, app = state["apt_source"], state["cuda"], state["ml_env"], state["app"]

files.put(
    name="APT source",
    src=StringIO(src["content"]),
    dest=src["path"],
    user="root",
    group="root",
    mode=src["mode"],
)

apt.packages(
    name="Packages, pinned ones at their version",
    packages=state["packages"] + [cuda["package"]] + env["apt"],
)

# pyinfra has no assertion: a toolkit that reports another release is a change to make.
nvcc = host.get_fact(Command, command=f"{cuda['home']}/bin/nvcc --version 2>&1 || true")
if f"release {cuda['version']}," not in (nvcc or ""):
    server.shell(
        name=f"CUDA toolkit {cuda['version']} (nvcc reports another release)",
        commands=[f"apt-get install -y --reinstall {cuda['package']}"],
    )

files.put(
    name="CUDA on PATH for login shells",
    src=StringIO(cuda["profile_content"]),
    dest=cuda["profile_path"],
    user="root",
    group="root",
    mode=cuda["profile_mode"],
)

pip.packages(
    name="Python venv with pinned packages from the wheelhouse",
    packages=env["packages"],
    virtualenv=env["path"],
    virtualenv_kwargs={"python": f"python{env['python']}", "venv": True},
    extra_install_args=f"--no-index --find-links {env['wheelhouse']}",
)

files.directory(
    name="App directory",
    path=app["dir"],
    user=app["owner"],
    group=app["group"],
    mode=app["dir_mode"],
)

files.put(
    name="App config",
    src=StringIO(app["content"]),
    dest=app["file"],
    user=app["owner"],
    group=app["group"],
    mode=app["file_mode"],
)
