"""Builds a tiny pure-Python wheel, offline, for tests that install packages into a lab
container's venv from a local wheelhouse: `make_wheel.py NAME VERSION OUTDIR`.

The wheel holds one module `<name>.py` with `__version__`; it is a real wheel that pip
installs and lists (dist-info with METADATA, WHEEL and RECORD)."""
import base64
import hashlib
import os
import sys
import zipfile


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def main():
    name, version, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {
        f"{module}.py": f'__version__ = "{version}"\n'.encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Summary: provision test package\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: provision-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ).encode(),
    }
    record = [record_line(p, d) for p, d in files.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, f"{dist}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(p, d)
    print(path)


if __name__ == "__main__":
    main()
