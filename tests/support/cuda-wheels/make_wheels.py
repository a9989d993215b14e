"""Builds the lab's stand-in CUDA wheels, offline, with the host's C compiler:
`make_wheels.py OUTDIR` writes

- OUTDIR/wheelhouse/lab_cuda_runtime-13.0-...whl: `nvidia/cu13/lib/libcudart.so.13`, as
  the `nvidia-cuda-runtime` 13 wheel a cu130 torch brings into the venv;
- OUTDIR/wheelhouse/labkernel-1.0-...whl: the kernel package as PyPI serves it, built for
  CUDA 12 (its `common_ops.so` needs `libcudart.so.12`);
- OUTDIR/kernels-cu130/labkernel-1.0+cu130-...whl: the same built for CUDA 13, as SGLang's
  release page serves `+cu130` kernels.

`import labkernel` loads `common_ops.so` with the system loader, so the CUDA 12 build fails
in a CUDA 13 venv with the loader's own words. README.md says what this imitates."""
import os
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from make_wheel import record_line  # noqa: E402  (tests/support/make_wheel.py)

TAG = "py3-none-linux_x86_64"
# Where the runtime libraries of the nvidia-* wheels are, seen from a package folder in
# site-packages: CUDA 12's `nvidia/cuda_runtime/lib`, CUDA 13's `nvidia/cu13/lib`.
RUNPATH = "$ORIGIN/../nvidia/cuda_runtime/lib:$ORIGIN/../nvidia/cu13/lib"
INIT = '''"""Stand-in for a CUDA kernel package (provision's tests/support/cuda-wheels)."""
import ctypes
import os

__version__ = "{version}"
try:
    common_ops = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "common_ops.so"))
except OSError as e:  # the loader's words, as an extension module's import gives them
    raise ImportError(str(e)) from None
'''


def wheel(outdir, name, version, files):
    dist = f"{name}-{version}"
    files = dict(files)
    files[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: provision test stand-in (not NVIDIA's or SGLang's)\n"
    ).encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: provision-tests\nRoot-Is-Purelib: false\nTag: {TAG}\n"
    ).encode()
    record = [record_line(p, d) for p, d in files.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, f"{dist}-{TAG}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            info = zipfile.ZipInfo(p)
            info.external_attr = 0o755 << 16 if p.endswith(".so") or ".so." in p else 0o644 << 16
            z.writestr(info, d)
    return path


def cc(args):
    subprocess.run(["cc", *args], check=True)


def main():
    out = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        src = os.path.join(work, "rt.c")
        with open(src, "w") as f:
            f.write("int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }\n")
        libs = {}
        for major in ("12", "13"):
            lib = os.path.join(work, f"libcudart.so.{major}")
            cc(["-shared", "-fPIC", f"-Wl,-soname,libcudart.so.{major}", "-o", lib, src])
            libs[major] = lib
        ops_src = os.path.join(work, "ops.c")
        with open(ops_src, "w") as f:
            f.write(
                "int cudaRuntimeGetVersion(int *v);\n"
                "int labkernel_cuda_version(void) { int v = 0; cudaRuntimeGetVersion(&v); return v; }\n"
            )
        ops = {}
        for major in ("12", "13"):
            so = os.path.join(work, f"common_ops.{major}.so")
            cc(["-shared", "-fPIC", "-Wl,--no-as-needed", f"-Wl,-rpath,{RUNPATH}",
                "-Wl,--enable-new-dtags", "-o", so, ops_src, libs[major]])
            ops[major] = so
        read = lambda p: open(p, "rb").read()
        print(wheel(os.path.join(out, "wheelhouse"), "lab_cuda_runtime", "13.0",
                    {"nvidia/cu13/lib/libcudart.so.13": read(libs["13"])}))
        for major, where, version in (("12", "wheelhouse", "1.0"), ("13", "kernels-cu130", "1.0+cu130")):
            print(wheel(os.path.join(out, where), "labkernel", version, {
                "labkernel/__init__.py": INIT.format(version=version).encode(),
                "labkernel/common_ops.so": read(ops[major]),
            }))


if __name__ == "__main__":
    main()
