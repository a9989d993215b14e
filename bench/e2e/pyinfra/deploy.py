"""examples/lab.yaml declared for pyinfra: the node side (the container's config as Proxmox
has it, read with `pct config` over the node's SSH) and the guest (packages, venv, pinned
package, checkout, editable install, model files, unit, service). scripts/bench-e2e runs it
as `pyinfra inventory.py deploy.py --dry` with BENCH_VARS naming its vars.json.

pyinfra has no Proxmox API operations, so the container is a fact and, where it differs from
the declaration, a `pct set` to run; the other things without a pyinfra operation that can
check them (a commit, an editable install, a model file's size) are facts of commands, each
with the operation that would repair it. Each check is as cheap as provision's routine one:
the model files are stat'ed, not hashed.
"""

import json
import os
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.facts.files import File
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files, pip, server, systemd

with open(os.environ["BENCH_VARS"]) as f:
    v = json.load(f)


class PctConfig(FactBase):
    """`pct config VMID` as a dict (comment lines left out), plus `status` from `pct
    status`; None when the container does not exist."""

    def command(self, vmid):
        return f"pct config {int(vmid)} 2>/dev/null && pct status {int(vmid)}"

    def process(self, output):
        cfg = {}
        for line in output:
            if line.startswith("#") or ": " not in line:
                continue
            key, value = line.split(": ", 1)
            cfg[key] = value
        return cfg or None


def net0_fields(value):
    return dict(kv.split("=", 1) for kv in value.split(",") if "=" in kv)


if host.data.get("role") == "node":
    ct = v["container"]
    vmid = ct["vmid"]
    cfg = host.get_fact(PctConfig, vmid=vmid)
    if cfg is None:
        server.shell(
            name=f"container {vmid}: create",
            commands=[f"pct create {vmid} {shlex.quote(ct['template'])} --hostname {ct['hostname']}"],
        )
    else:
        want = {
            "hostname": ct["hostname"],
            "cores": "2",
            "memory": "1024",
            "swap": "0",
            "onboot": "0",
            "mp0": f"{ct['shared_dir']},mp=/shared,backup=0",
        }
        drift = {k: val for k, val in want.items() if cfg.get(k) != val}
        if sorted(cfg.get("tags", "").split(";")) != ["lab", "llm"]:
            drift["tags"] = "lab;llm"
        if cfg.get("unprivileged", "0") != "0":
            drift["unprivileged"] = "0"
        if "size=4G" not in cfg.get("rootfs", ""):
            drift["rootfs"] = "local:4"
        net = net0_fields(cfg.get("net0", ""))
        want_net = {"name": "eth0", "bridge": ct["bridge"], "ip": ct["ip"], "gw": ct["gateway"]}
        if any(net.get(k) != val for k, val in want_net.items()):
            drift["net0"] = ",".join(f"{k}={val}" for k, val in want_net.items())
        for key, value in drift.items():
            server.shell(
                name=f"container {vmid}: {key} = {value}",
                commands=[f"pct set {vmid} --{key} {shlex.quote(value)}"],
            )
        if cfg.get("status") != "running":
            server.shell(name=f"container {vmid}: start", commands=[f"pct start {vmid}"])

if host.data.get("role") == "guest":
    g = v["guest"]
    venv, checkout, model_dir = g["venv"], g["checkout"], g["model_dir"]

    apt.packages(name="apt: python3.11, python3.11-venv, git", packages=["python3.11", "python3.11-venv", "git"])

    pip.venv(name=f"venv {venv}", path=venv, python="python3.11")

    pip.packages(
        name="pip_packages: labpkg==1.0 from the wheelhouse",
        packages=["labpkg==1.0"],
        virtualenv=venv,
        extra_install_args="--no-index --find-links /shared/wheels",
    )

    head = host.get_fact(Command, command=f"git -C {checkout} rev-parse HEAD 2>/dev/null || true")
    if (head or "").strip() != g["revision"]:
        server.shell(
            name=f"git_checkout {checkout} at {g['revision'][:12]}",
            commands=[
                f"[ -d {checkout}/.git ] || git clone -q --no-checkout {shlex.quote(g['repo'])} {checkout}",
                f"git -C {checkout} fetch -q origin && git -C {checkout} checkout -q --detach {g['revision']}",
            ],
        )

    # The editable install's .pth names the checkout's real folder: provision's stable paths
    # are links to the generation it built (docs/generations.md). One command for both.
    pth = host.get_fact(
        Command,
        command=f"cat {venv}/lib/python3.11/site-packages/__editable__.sglang-*.pth 2>/dev/null; echo; readlink -f {checkout}",
    )
    lines = (pth or "").strip().splitlines()
    real = lines[-1] if lines else checkout
    if not any(p in "\n".join(lines[:-1]) for p in (checkout, real)):
        server.shell(
            name=f"pip_editable {checkout}/python",
            commands=[f"{venv}/bin/pip install --no-index --find-links /shared/wheels -e {checkout}/python"],
        )

    files.directory(name=f"directory {os.path.dirname(model_dir)}", path=os.path.dirname(model_dir),
                    user="root", group="root", mode="755")
    files.directory(name=f"model folder {model_dir}", path=model_dir)
    for mf in g["model_files"]:
        dest = f"{model_dir}/{mf['path']}"
        st = host.get_fact(File, path=dest)
        if not st or st.get("size") != mf["size"]:
            url = f"{g['hub']}/lab/tiny-qwen/resolve/main/{mf['path']}"
            server.shell(
                name=f"model file {mf['path']}",
                commands=[
                    f"curl -fsSL -H \"Authorization: Bearer $HF_TOKEN\" -o {dest}.part {shlex.quote(url)}",
                    f"echo '{mf['sha256']}  {dest}.part' | sha256sum -c --quiet && mv {dest}.part {dest}",
                ],
            )

    files.put(
        name="file /etc/systemd/system/sglang-tiny.service",
        src=StringIO(g["unit"]),
        dest="/etc/systemd/system/sglang-tiny.service",
        user="root",
        group="root",
        mode="644",
    )

    systemd.service(
        name="service sglang-tiny.service enabled and running",
        service="sglang-tiny.service",
        running=True,
        enabled=True,
    )
