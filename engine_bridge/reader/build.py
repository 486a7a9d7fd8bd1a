"""Which of the reader's modules the build compiles, and whether the compiled ones are used.

The modules below run for every piece of every read: the install compiles them with mypyc when it
can (setup.py; docs/reader.md "Compiled"). A compiled module is a shared library beside its .py,
and Python imports it first; all of them share one library (`GROUP`), so they are used together or
not at all. The build writes the digest of the sources it compiled beside them (`DIGEST`).
`use_compiled` (called by the package's __init__ before any of them is imported) falls back to the
.py files when any of them is missing, when the sources are not the ones compiled (a pull or an
edit since the build: the library would run the old code), or when REPLICA_TUNER_PURE=1 is set.
`HOW` says which runs and why.

No imports beyond the standard library: setup.py loads this file on its own, before the project's
dependencies are installed.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys

PACKAGE = "engine_bridge.reader"
COMPILED = ("attempts", "tally", "hedging", "hedger", "balancing", "balancer", "reweighting", "reweigher", "lanes")
GROUP = PACKAGE + ".native"        # the library they share: engine_bridge/reader/native__mypyc.*.so
LIBRARY = GROUP.rsplit(".", 1)[1] + "__mypyc"     # that library's name in the package's folder, less its suffix
# mypy's checks the compile rests on; an Optional attribute read where the code knows it is set
# (a piece's ticket, the hedger's condition) is checked at run time by the compiled code instead
MYPY_FLAGS = ("--ignore-missing-imports", "--follow-imports=silent", "--disable-error-code", "union-attr")
HERE = os.path.dirname(os.path.abspath(__file__))
DIGEST = "native.sources"          # beside the library: `sources_digest()` of what it was compiled from
FAILED = "native.failed"           # in the source tree when the install could not compile them: why

PURE_ENV = "REPLICA_TUNER_PURE"     # =1: the Python modules (nothing compiled at install, nothing compiled used)

HOW = "python"                      # set by use_compiled: "compiled" or "python (why)"


def c_compiler() -> str:
    """The C compiler a build would call: $CC's program, or cc."""
    return (os.environ.get("CC") or "cc").split()[0]


def module_path(name: str) -> str:
    """A compiled module's source, relative to the project's root (as setup.py names it)."""
    return os.path.join(*PACKAGE.split("."), name + ".py")


def sources_digest(folder: str = HERE) -> str:
    """One sha256 over the compiled modules' sources in `folder`, in `COMPILED`'s order."""
    h = hashlib.sha256()
    for name in COMPILED:
        with open(os.path.join(folder, name + ".py"), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _library(stem: str, folder: str) -> str | None:
    """The compiled library `stem` in `folder` (any of this Python's suffixes), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, stem + suffix)
        if os.path.exists(path):
            return path
    return None


def why_not_compiled(folder: str = HERE) -> str | None:
    """Why the compiled modules in `folder` (the package's) cannot be used (None: they can)."""
    if os.environ.get(PURE_ENV) == "1":
        return f"{PURE_ENV}=1"
    try:                                # the last install could not compile them (older libraries may be left)
        with open(os.path.join(folder, FAILED), encoding="utf-8") as f:
            return f"not compiled at install: {f.read().strip()}"
    except OSError:
        pass
    if _library(LIBRARY, folder) is None:
        return "not compiled at install"
    missing = [name for name in COMPILED if _library(name, folder) is None]
    if missing:
        return f"{', '.join(missing)} not compiled"
    try:
        with open(os.path.join(folder, DIGEST), encoding="ascii") as f:
            built = f.read().strip()
    except OSError:
        built = ""
    if built != sources_digest(folder):
        return "the sources changed since the build; reinstall (make venv, or pip install -e .) to compile them again"
    return None


def stale_libraries(folder: str = HERE) -> list[str]:
    """Modules of the package with a library in `folder` that the build no longer compiles: left by
    an earlier build that compiled more of them (Python would import that library, which the group
    library of this build cannot serve)."""
    out = []
    for entry in sorted(os.listdir(folder)):
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            name = entry[:-len(suffix)]
            if entry.endswith(suffix) and name not in COMPILED and name != LIBRARY \
                    and os.path.exists(os.path.join(folder, name + ".py")):
                out.append(name)
                break
    return out


class _Sources:
    """Finds the .py files of `names`, modules of the package, ahead of their libraries (Python's own
    order is the other way round)."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        pkg, _, name = fullname.rpartition(".")
        if pkg != PACKAGE or name not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.join(HERE, name + ".py"))


def use_compiled() -> str:
    """Decide once, before any compiled module is imported, which copy of them runs; returns `HOW`.
    A library an earlier build left for a module no longer compiled is never used (`stale_libraries`)."""
    global HOW
    if any(f"{PACKAGE}.{name}" in sys.modules for name in COMPILED):
        return HOW                      # already decided (and imported)
    why = why_not_compiled()
    names = stale_libraries()
    if why is None:
        HOW = "compiled"
    else:
        HOW = f"python ({why})"
        names += COMPILED
    if names and not any(isinstance(f, _Sources) for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources(names))
    return HOW
