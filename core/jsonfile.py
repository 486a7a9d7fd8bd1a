"""The one reader and writer of the rig's JSON files (manifest, iobench results, plans, routing
traces, profiles, harness results).

Every loader calls `read_json`, so a bad file means the same thing everywhere: a missing file is
exit 3 (MissingError); a directory, an unreadable file, bytes that are not UTF-8 JSON, or a
document of another kind or schema is exit 2 (RigError). Each message is one line: the file, what
is wrong with it, and the fix (`remedy`, e.g. "run `planner solve`").
"""

from __future__ import annotations

import json
from typing import Any

from .errors import MissingError, RigError
from .fsutil import atomic_write_text


def read_json(path: str, kind: str, remedy: str, schema: int | None = None,
              kind_key: str | None = "kind") -> dict[str, Any]:
    """Load `path` as a JSON object of `kind`.

    `kind` names the file in messages ("plan", "manifest"); when `kind_key` is set the document's
    own `kind` value must equal `kind` (files written before kinds existed pass kind_key=None).
    `schema`, when given, must equal the document's `schema`.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise MissingError(f"{path}: no such {kind} file; {remedy}") from None
    except IsADirectoryError:
        raise RigError(f"{path}: is a directory, not a {kind} file; {remedy}") from None
    except OSError as e:
        raise RigError(f"{path}: cannot read the {kind} file ({e.strerror or e}); {remedy}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RigError(f"{path}: not UTF-8 text, so not a {kind} file; {remedy}") from None
    except json.JSONDecodeError as e:
        raise RigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {remedy}") from None
    if not isinstance(doc, dict):
        raise RigError(f"{path}: expected a JSON object, found {type(doc).__name__}; {remedy}")
    if kind_key is not None and doc.get(kind_key) != kind:
        found = doc.get(kind_key)
        raise RigError(f"{path}: is not a {kind} file ({kind_key} is {found!r}, expected {kind!r}); {remedy}")
    if schema is not None and doc.get("schema") != schema:
        raise RigError(f"{path}: {kind} schema {doc.get('schema')!r} is not {schema}, the one this version reads; {remedy}")
    return doc


def write_json(path: str, doc: dict, indent: int | None = 1) -> str:
    """Write a JSON document atomically (temporary name, fsync, rename); returns the path."""
    atomic_write_text(path, json.dumps(doc, indent=indent) + "\n")
    return path
