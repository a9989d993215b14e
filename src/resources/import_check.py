# provision's import check, run with the venv's python: argv[1] is a JSON list of modules,
# argv[2] is "1" to also compile a C extension against Python.h the way Triton compiles
# its launcher at the first kernel launch (a compiler from CC or PATH, the interpreter's
# include folder). Prints one JSON line: {"ok": true} or what failed, in Python's words.
import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile


def done(**result):
    print(json.dumps(result))
    sys.exit(0)


modules = json.loads(sys.argv[1])
for name in modules:
    try:
        importlib.import_module(name)
    except BaseException as e:  # an extension's loader error is an ImportError or OSError
        done(ok=False, stage="import", module=name, error=f"{type(e).__name__}: {e}")

if sys.argv[2] == "1":
    cc = os.environ.get("CC") or next(
        (p for p in map(shutil.which, ("cc", "gcc", "clang")) if p), None
    )
    if cc is None:
        done(ok=False, stage="compile", error="no C compiler (cc, gcc or clang) on PATH")
    include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(include, "Python.h")):
        done(ok=False, stage="compile", error=f"Python.h is not in {include}")
    work = tempfile.mkdtemp(prefix="provision-cprobe-")
    src = os.path.join(work, "provision_cprobe.c")
    with open(src, "w") as f:
        f.write(
            "#include <Python.h>\n"
            "static PyObject *answer(PyObject *s, PyObject *a) { return PyLong_FromLong(42); }\n"
            "static PyMethodDef m[] = {{\"answer\", answer, METH_NOARGS, 0}, {0}};\n"
            "static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, \"provision_cprobe\", 0, -1, m};\n"
            "PyMODINIT_FUNC PyInit_provision_cprobe(void) { return PyModule_Create(&d); }\n"
        )
    so = os.path.join(work, "provision_cprobe" + sysconfig.get_config_var("EXT_SUFFIX"))
    r = subprocess.run(
        [cc, src, "-O1", "-shared", "-fPIC", "-I" + include, "-o", so],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        tail = " / ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        shutil.rmtree(work, ignore_errors=True)
        done(ok=False, stage="compile", error=f"{cc} failed: {tail}")
    sys.path.insert(0, work)
    try:
        import provision_cprobe

        if provision_cprobe.answer() != 42:
            raise RuntimeError("the compiled helper answered wrongly")
    except BaseException as e:
        done(ok=False, stage="compile", error=f"the compiled helper does not load: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
done(ok=True)
