"""The engines this tool plans for, by name. Adding an engine is adding its module and a line here."""

from __future__ import annotations

from core.errors import UsageError

from . import colibri, ds4_argodrive
from .base import Engine

ENGINES: dict[str, Engine] = {e.name: e for e in (ds4_argodrive.ENGINE, colibri.ENGINE)}
DEFAULT_ENGINE = ds4_argodrive.NAME


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"engine {name!r} is not known; known engines: {', '.join(ENGINES)}") from None
