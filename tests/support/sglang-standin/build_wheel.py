#!/usr/bin/env python3
"""Build the SGLang STAND-IN (NOT SGLang) as a wheel, with the standard library only.

A fresh `python3 -m venv` on Debian bookworm has pip and setuptools but not the
`wheel` package, so `pip install --no-index <this folder>` cannot build it
there. A prebuilt wheel installs with pip alone:

    python3 build_wheel.py --line 0.5.10 --out /tmp/wheels
    /root/ml-env/bin/pip install --no-index /tmp/wheels/sglang-0.5.10+standin-py3-none-any.whl

--line picks the imitated release line (0.5.10 or 0.5.23); it becomes the
default of SGLANG_STANDIN_LINE and the wheel's version ("<line>+standin").
"""

import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")
LINES = ("0.5.10", "0.5.23")
# Fixed timestamp so the same sources and line give the same wheel bytes.
ZIP_TIME = (2026, 3, 9, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _package_files():
    for root, dirs, files in os.walk(os.path.join(SRC, "sglang")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".json")):
                path = os.path.join(root, name)
                yield path, os.path.relpath(path, SRC).replace(os.sep, "/")


def _with_line(text: str, line: str) -> str:
    text, n1 = re.subn(r'^BUILD_LINE = ".*"$', f'BUILD_LINE = "{line}"', text, flags=re.M)
    text, n2 = re.subn(
        r'^BUILD_VERSION = ".*"$', f'BUILD_VERSION = "{line}+standin"', text, flags=re.M
    )
    if (n1, n2) != (1, 1):
        raise SystemExit("build_wheel: _standin.py no longer has BUILD_LINE/BUILD_VERSION")
    return text


def build(line: str, out_dir: str) -> str:
    """Write the wheel into out_dir and return its path."""
    version = f"{line}+standin"
    dist_info = f"sglang-{version}.dist-info"
    os.makedirs(out_dir, exist_ok=True)
    wheel_path = os.path.join(out_dir, f"sglang-{version}-py3-none-any.whl")
    entries = []
    for path, arcname in _package_files():
        with open(path, "rb") as f:
            data = f.read()
        if arcname == "sglang/_standin.py":
            data = _with_line(data.decode(), line).encode()
        entries.append((arcname, data))
    metadata = (
        "Metadata-Version: 2.1\n"
        "Name: sglang\n"
        f"Version: {version}\n"
        "Summary: NOT SGLang: a test stand-in for the provision tool's tests\n"
        "Requires-Python: >=3.10\n"
    )
    entries += [
        (f"{dist_info}/METADATA", metadata.encode()),
        (
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: sglang-standin build_wheel.py\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n",
        ),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\nsglang = sglang.cli:main\n"),
        (f"{dist_info}/top_level.txt", b"sglang\n"),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    record += f"{dist_info}/RECORD,,\n"
    entries.append((f"{dist_info}/RECORD", record.encode()))
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    os.replace(tmp, wheel_path)
    return wheel_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", choices=LINES, default="0.5.10")
    parser.add_argument("--out", default=os.path.join(HERE, "dist"))
    args = parser.parse_args(argv)
    print(build(args.line, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
