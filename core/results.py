"""One shape for every result a command prints with --json (docs/architecture.md, "Results").

A command returns a result object; `core.cli.emit` renders it. Every document on stdout is one
JSON object whose first two keys are the envelope:

    {"schema": <int: the version of this kind's shape>, "kind": "<what it is>", ...the data}

A result is any object with a class-level `KIND` (str) and `SCHEMA` (int: the version this code
writes) and a `to_dict()` returning its data. A result that is a file the tools write (a plan, an
iobench result, a run's results, a manifest) returns that file's document, keys and all: `--json`
prints the same shape as the file, and a file written by an older version keeps its own
`schema`. Its `kind`, when it carries one, must be the result's KIND.

An error, when --json was given, is a document too (`ErrorResult`, kind "error"): the one-line
message and the exit code the command ends with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

ENVELOPE = ("schema", "kind")


@runtime_checkable
class Result(Protocol):
    KIND: ClassVar[str]
    SCHEMA: ClassVar[int]

    def to_dict(self) -> dict[str, Any]: ...


def envelope(result: Result) -> dict[str, Any]:
    """The document of `result`: schema and kind first, then its data. A result without KIND and
    SCHEMA, or whose data contradicts them, is a programming error (TypeError/ValueError), so a
    command that prints something else fails its tests instead of printing a shape of its own."""
    kind, schema = getattr(type(result), "KIND", None), getattr(type(result), "SCHEMA", None)
    if not isinstance(kind, str) or not kind or not isinstance(schema, int) or isinstance(schema, bool):
        raise TypeError(f"{type(result).__name__} is not a result: it needs a class-level KIND (str) and SCHEMA (int)")
    data = result.to_dict()
    if not isinstance(data, dict):
        raise TypeError(f"{type(result).__name__}.to_dict() returned {type(data).__name__}, not a dict")
    if data.get("kind", kind) != kind:
        raise ValueError(f"{type(result).__name__}: its data says kind {data['kind']!r}, the class says {kind!r}")
    own = data.get("schema", schema)
    if not isinstance(own, int) or isinstance(own, bool):
        raise ValueError(f"{type(result).__name__}: its data's schema {own!r} is not an int")
    return {"schema": own, "kind": kind, **{k: v for k, v in data.items() if k not in ENVELOPE}}


@dataclass(frozen=True)
class Document:
    """A result whose document its own module already builds as a dict (a run's results, a
    bench-results file): subclasses name the KIND and SCHEMA, the dict is the data."""

    doc: dict

    KIND: ClassVar[str] = ""
    SCHEMA: ClassVar[int] = 0

    def to_dict(self) -> dict[str, Any]:
        return self.doc


@dataclass(frozen=True)
class ErrorResult:
    """A command that failed, as data: the one line it said on stderr and its exit code."""

    error: str
    exit_code: int

    KIND: ClassVar[str] = "error"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error, "exit_code": self.exit_code}
