"""The one reader and writer of the rig's JSON files (manifest, iobench results, plans, routing
traces, profiles, harness results).

Every loader calls `read_json` (or `parse_json` on text it already holds), so a bad file means
the same thing everywhere: a missing file is exit 3 (MissingError); a directory, an unreadable
file, bytes that are not UTF-8 JSON, a document that is not an object or is of another kind or
schema is exit 2 (RigError). Each message is one line: the file, what is wrong with it, and the
fix (`remedy`, e.g. "run `planner solve`").
"""

from __future__ import annotations

import json
from typing import Any

from .errors import MissingError, RigError
from .fsutil import atomic_write_text


# What a JSON value of each Python type is called in a message ("not a whole number", never "not a int").
TYPE_WORDS = {int: "a whole number", float: "a number", str: "text", list: "a list", dict: "an object", bool: "true or false"}


def type_word(typ: type) -> str:
    return TYPE_WORDS.get(typ, _a(typ.__name__))


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def parse_json(raw: bytes | str, where: str, kind: str, remedy: str, schema: int | tuple[int, ...] | None = None,
               kind_key: str | None = "kind", what: str | None = None) -> dict[str, Any]:
    """Check `raw` (the bytes or text of `where`) is a JSON object of `kind`, without touching disk.

    `kind` is the value the document's `kind_key` must hold (kind_key=None for files written
    before kinds existed); `what` names the file in messages ("iobench result"), default `kind`.
    `schema`, when given, must equal the document's integer `schema`.
    """
    what = what or kind
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RigError(f"{where}: not UTF-8 text, so not {_a(what)} file; {remedy}") from None
    if not raw.strip():
        raise RigError(f"{where}: is empty, not {_a(what)} file; {remedy}")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RigError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {remedy}") from None
    except RecursionError:
        raise RigError(f"{where}: JSON nested too deeply to be {_a(what)} file; {remedy}") from None
    if not isinstance(doc, dict):
        raise RigError(f"{where}: expected a JSON object, found {type(doc).__name__}, so not {_a(what)} file; {remedy}")
    if kind_key is not None and doc.get(kind_key) != kind:
        raise RigError(f"{where}: not {_a(what)} file ({kind_key} is {doc.get(kind_key)!r}, expected {kind!r}); {remedy}")
    found = doc.get("schema")
    # bool is an int to Python; `"schema": true` is not schema 1.
    wanted = (schema,) if isinstance(schema, int) else schema
    if wanted is not None and (isinstance(found, bool) or found not in wanted):
        said = " or ".join(map(str, wanted))
        raise RigError(f"{where}: {what} schema {found!r} is not {said}, {'the one' if len(wanted) == 1 else 'those'} "
                       f"this version reads; {remedy}")
    return doc


def read_json(path: str, kind: str, remedy: str, schema: int | tuple[int, ...] | None = None,
              kind_key: str | None = "kind", what: str | None = None) -> dict[str, Any]:
    """Load `path` as a JSON object of `kind` (see `parse_json` for the checks)."""
    what = what or kind
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise MissingError(f"{path}: no such {what} file; {remedy}") from None
    except IsADirectoryError:
        raise RigError(f"{path}: is a directory, not {_a(what)} file; {remedy}") from None
    except OSError as e:
        # NotADirectoryError (a path through a file), PermissionError, EIO: the file is there
        # but cannot be read as given.
        raise RigError(f"{path}: cannot read the {what} file ({e.strerror or e}); {remedy}") from None
    return parse_json(raw, path, kind, remedy, schema, kind_key, what)


def write_json(path: str, doc: dict, indent: int | None = 1) -> str:
    """Write a JSON document atomically (temporary name, fsync, rename); returns the path."""
    atomic_write_text(path, json.dumps(doc, indent=indent) + "\n")
    return path
