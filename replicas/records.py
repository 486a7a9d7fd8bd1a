"""The rig's records of verification: rig/verdicts.json (the last verdict per member, which
`status` shows) and rig/scrub.json (how far an interrupted `verify --full` got). Both are read
through core.jsonfile.read_json and written atomically with write_json; a missing file holds
nothing yet. Members are keyed by their path as rig.toml names them."""

from __future__ import annotations

import os
import threading

from core.jsonfile import read_json, write_json
from core.rig import Rig

from .constants import SCRUB_SCHEMA, VERDICTS_SCHEMA
from .verdict import (
    SCRUB_KIND,
    SCRUB_REMEDY,
    VERDICTS_KIND,
    VERDICTS_REMEDY,
    ScrubMark,
    Verdict,
    scrub_from_doc,
    scrub_to_doc,
    verdicts_from_doc,
    verdicts_to_doc,
)

# Verify's drive threads, repair and sync record from one process; the lock keeps their
# read-modify-write of one file whole.
_LOCK = threading.Lock()


def load_verdicts(rig: Rig) -> dict[str, Verdict]:
    if not os.path.lexists(rig.verdicts_file):
        return {}
    doc = read_json(rig.verdicts_file, VERDICTS_KIND, VERDICTS_REMEDY, schema=VERDICTS_SCHEMA, what="verdicts")
    return verdicts_from_doc(doc, rig.verdicts_file)


def record_verdicts(rig: Rig, changes: dict[str, Verdict | None]) -> None:
    """Set (or, with None, drop) the verdicts of the given member paths; others are kept."""
    if not changes:
        return
    with _LOCK:
        verdicts = load_verdicts(rig)
        before = dict(verdicts)
        for path, v in changes.items():
            if v is None:
                verdicts.pop(path, None)
            else:
                verdicts[path] = v
        if verdicts == before:
            return
        os.makedirs(rig.root, exist_ok=True)
        write_json(rig.verdicts_file, verdicts_to_doc(verdicts))


def load_scrub(rig: Rig) -> dict[str, ScrubMark]:
    if not os.path.lexists(rig.scrub_file):
        return {}
    doc = read_json(rig.scrub_file, SCRUB_KIND, SCRUB_REMEDY, schema=SCRUB_SCHEMA, what="verify progress")
    return scrub_from_doc(doc, rig.scrub_file)


def record_scrub(rig: Rig, changes: dict[str, ScrubMark | None]) -> None:
    """Set (or drop) the progress marks of the given member paths; the file goes when empty."""
    if not changes:
        return
    with _LOCK:
        marks = load_scrub(rig)
        for path, m in changes.items():
            if m is None:
                marks.pop(path, None)
            else:
                marks[path] = m
        if marks:
            os.makedirs(rig.root, exist_ok=True)
            write_json(rig.scrub_file, scrub_to_doc(marks))
        elif os.path.lexists(rig.scrub_file):
            os.unlink(rig.scrub_file)
