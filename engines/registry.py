"""The engines this tool plans for, by name. Adding an engine is adding its module and a line here."""

from __future__ import annotations

from core.errors import UsageError

from . import colibri, ds4_argodrive
from .base import Engine
from .handoff import bad_characters

ENGINES: dict[str, Engine] = {e.name: e for e in (ds4_argodrive.ENGINE, colibri.ENGINE)}
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
        can = [x.name for x in ENGINES.values() if x.reads_model is not None and not x.reads_model(fmt, layout, tuple(files))]
        hint = f"plan and run it with --engine {' or --engine '.join(can)}" if can else "no engine this tool plans for reads it"
        raise UsageError(f"{path}: {why}; {hint}")


def engine_for_model(fmt: str, layout: str, files) -> str:
    """The first registered engine that reads a model of this format and layout; the default
    engine when none does (its reads can still be replayed on any geometry)."""
    for e in ENGINES.values():
        if e.reads_model is not None and not e.reads_model(fmt, layout, tuple(files)):
            return e.name
    return DEFAULT_ENGINE


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
