"""The engines this tool plans for, by name. Adding an engine is adding its package and a line here.

`register` adds an engine for as long as a `with` block runs (a test's own engine, defined in the
tests folder, goes through every stage that way) and takes it out again.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from core.errors import UsageError

from . import colibri, ds4_argodrive, llamacpp
from .base import Engine
from .handoff import bad_characters

ENGINES: dict[str, Engine] = {e.name: e for e in (ds4_argodrive.ENGINE, colibri.ENGINE, llamacpp.ENGINE)}
DEFAULT_ENGINE = ds4_argodrive.NAME


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"engine {name!r} is not known; known engines: {', '.join(ENGINES)}") from None


def check_reads_model(engine: str, fmt: str, layout: str, files, path: str) -> None:
    """UsageError (one line) when `engine` cannot read a model of this format and layout (its
    `reads_model`), naming the engines that can."""
    e = get_engine(engine)
    why = e.reads_model(fmt, layout, tuple(files)) if e.reads_model is not None else ""
    if why:
        can = [x.name for x in readers_of(fmt, layout, files)]
        hint = f"plan and run it with --engine {' or --engine '.join(can)}" if can else "no engine this tool plans for reads it"
        raise UsageError(f"{path}: {why}; {hint}")


def readers_of(fmt: str, layout: str, files) -> list[Engine]:
    """The registered engines that read a model of this format and layout, the one each states it
    prefers most first (`Engine.preference`: highest first, a tie to the name that sorts first)."""
    files = tuple(files)
    found = [e for e in ENGINES.values() if e.reads_model is not None and not e.reads_model(fmt, layout, files)]
    return sorted(found, key=lambda e: (-(e.preference(fmt, layout, files) if e.preference else 0), e.name))


def engine_for_model(fmt: str, layout: str, files) -> str:
    """The engine that reads a model of this format and layout and claims it most (`readers_of`);
    the default engine when none does (its reads can still be replayed on any geometry)."""
    readers = readers_of(fmt, layout, files)
    return readers[0].name if readers else DEFAULT_ENGINE


@contextmanager
def register(engine: Engine) -> Iterator[Engine]:
    """`engine` is known by its name until the block ends (UsageError for a name already taken)."""
    if engine.name in ENGINES:
        raise UsageError(f"engine {engine.name!r} is already registered")
    ENGINES[engine.name] = engine
    try:
        yield engine
    finally:
        ENGINES.pop(engine.name, None)


def path_refusals(path: str, fmt: str, layout: str, files) -> list[tuple[str, list[str]]]:
    """(engine, the characters it refuses) for each registered engine that reads a model of this
    format and layout and could not be given `path` as a source (its `path_forbidden`: the list
    separators of its environment variables). Asked of the engines, never listed here."""
    out = []
    for e in ENGINES.values():
        if e.reads_model is not None and e.reads_model(fmt, layout, tuple(files)):
            continue                                      # this engine does not read the model anyway
        bad = bad_characters(path, e.path_forbidden)
        if bad:
            out.append((e.name, bad))
    return out
