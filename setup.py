"""The build's one step beyond pyproject.toml: the split reader's per-piece bookkeeping compiled to C.

The modules in `engine_bridge.reader.build.COMPILED` (the lanes, the hedger, the balancer, re-weighting
and their rules) run for every piece of every read; compiled with mypyc they cost a read about half
the CPU they cost as Python, which on drives faster than the reader is the engine's own time
(docs/reader.md "Compiled"). They stay plain Python modules: without a C compiler, when the
compile fails, or with REPLICA_TUNER_PURE=1 set at install time, the build goes on without them
and the reader runs them as Python, deciding exactly the same.
"""

import contextlib
import io
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _build_list():
    """engine_bridge/reader/build.py, loaded on its own (the package needs what is not installed yet)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_reader_build", os.path.join(HERE, "engine_bridge", "reader",
                                                                                  "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BUILD = _build_list()
FAILED = os.path.join(HERE, *BUILD.PACKAGE.split("."), BUILD.FAILED)


def not_compiled(why: str) -> None:
    """One warning line, and the reason kept where the reader says why it runs its Python modules."""
    why = why if len(why) <= 300 else why[:297] + "..."
    sys.stderr.write(f"replica-tuner: the reader's modules were not compiled ({why}); they run as Python\n")
    with open(FAILED, "w", encoding="utf-8") as f:
        f.write(why + "\n")


class OptionalBuild(build_ext):
    """Builds the compiled modules, or none of them: they share one library, so a partial build
    would leave modules that cannot load. A failure is one warning line, and the install goes on."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # any compiler or toolchain failure: the Python modules serve
            for ext in self.extensions:
                lib = self.get_ext_fullpath(ext.name)
                if os.path.exists(lib):
                    os.remove(lib)
            not_compiled(f"the C compile failed: {e}")
            return
        if self.extensions:        # what was compiled, for the reader to tell its sources changed since
            out = os.path.dirname(self.get_ext_fullpath(BUILD.GROUP + "__mypyc"))
            with open(os.path.join(out, BUILD.DIGEST), "w", encoding="ascii") as f:
                f.write(BUILD.sources_digest(os.path.dirname(FAILED)) + "\n")


def extensions():
    if os.path.exists(FAILED):
        os.remove(FAILED)
    if os.environ.get(BUILD.PURE_ENV) == "1":
        return []
    cc = BUILD.c_compiler()
    if shutil.which(cc) is None:
        not_compiled(f"no C compiler: {cc} is not on PATH")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        not_compiled("mypyc is not installed")
        return []
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):     # mypy's errors, when the sources do not check
            return mypycify([*BUILD.MYPY_FLAGS, *map(BUILD.module_path, BUILD.COMPILED)], group_name=BUILD.GROUP)
    except (Exception, SystemExit) as e:
        first = next((ln for ln in said.getvalue().splitlines() if ": error:" in ln), str(e))
        not_compiled(f"mypyc: {first}")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuild})
