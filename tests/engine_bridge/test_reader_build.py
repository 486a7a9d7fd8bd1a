"""The reader's compiled modules (engine_bridge/reader/build.py, setup.py; docs/reader.md "Compiled"):
compiled where a C compiler is, the .py files where they are not, or no longer what was compiled."""

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys

import pytest

from engine_bridge.reader import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PURE = os.environ.get("REPLICA_TUNER_PURE") == "1"

WHICH = """
import json, sys
import engine_bridge.reader.build as b
from engine_bridge.reader.split_reader import SplitReader
print(json.dumps({"how": b.HOW, "origins": {m: sys.modules[b.PACKAGE + "." + m].__spec__.origin for m in b.COMPILED}}))
"""


def _which(**env) -> dict:
    """HOW and where each compiled module was loaded from, in a fresh process with `env` added."""
    out = subprocess.run([sys.executable, "-c", WHICH], cwd=ROOT, env={**os.environ, **env}, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(PURE or shutil.which(build.c_compiler()) is None,
                    reason="the Python modules by choice (REPLICA_TUNER_PURE=1), or no C compiler to build them")
def test_where_a_compiler_is_the_installed_reader_is_compiled():
    """`make test` installs the project, compiling the reader's modules: a compile that failed (a type
    the compile rejects) or sources changed since are named here, not only slower reads."""
    assert build.HOW == "compiled", build.HOW
    seen = _which()
    assert seen["how"] == "compiled"
    for name, origin in seen["origins"].items():
        assert origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), (name, origin)


def test_with_replica_tuner_pure_the_reader_runs_its_python_modules():
    seen = _which(REPLICA_TUNER_PURE="1")
    assert seen["how"] == "python (REPLICA_TUNER_PURE=1)"
    assert seen["origins"] == {m: os.path.join(build.HERE, m + ".py") for m in build.COMPILED}


def test_sources_changed_since_the_build_are_not_run_compiled(tmp_path, monkeypatch):
    """The package's files as installed, then one source changed: the compiled copy would run the
    old code, so the reader says why it runs the .py files; a library missing, or a compile that
    failed at the last install, the same."""
    monkeypatch.delenv("REPLICA_TUNER_PURE", raising=False)
    folder = tmp_path / "reader"
    shutil.copytree(build.HERE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    as_installed = build.why_not_compiled(str(folder))
    if as_installed is not None:
        pytest.skip(f"nothing compiled to compare with: {as_installed}")
    with open(folder / "hedging.py", "a", encoding="utf-8") as f:
        f.write("\n# an edit after the build\n")
    assert "changed since the build" in build.why_not_compiled(str(folder))
    os.remove(folder / build.DIGEST)
    assert "changed since the build" in build.why_not_compiled(str(folder))
    lib = next(p for p in os.listdir(folder) if p.startswith("lanes.") and not p.endswith(".py"))
    os.remove(folder / lib)
    assert build.why_not_compiled(str(folder)) == "lanes not compiled"
    with open(folder / build.FAILED, "w", encoding="utf-8") as f:    # the last install's compile failed:
        f.write("mypyc: hedging.py:1: error: ...\n")                 # what it said, whatever is left
    assert build.why_not_compiled(str(folder)) == "not compiled at install: mypyc: hedging.py:1: error: ..."


def test_a_library_an_earlier_build_left_for_a_module_no_longer_compiled_is_never_imported(tmp_path):
    """An earlier build compiled more modules (a checkout that compiled `sources` too, then one that
    does not): its library for that module is still beside the .py, and Python would import it
    first — from a group library that no longer serves it, a crash at import. The .py is imported."""
    assert "sources" not in build.COMPILED and "lanes" in build.COMPILED
    folder = tmp_path / "reader"
    folder.mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in ("sources", "lanes"):
        (folder / f"{name}.py").write_text("", encoding="utf-8")
        (folder / f"{name}{suffix}").write_bytes(b"")
    (folder / f"{build.LIBRARY}{suffix}").write_bytes(b"")    # the group library itself
    (folder / f"other{suffix}").write_bytes(b"")            # no .py beside it: not one of the package's modules
    assert build.stale_libraries(str(folder)) == ["sources"]
    spec = build._Sources(["sources"]).find_spec(build.PACKAGE + ".sources")
    assert spec.origin == os.path.join(build.HERE, "sources.py")
    assert build._Sources(["sources"]).find_spec(build.PACKAGE + ".lanes") is None
