"""What the chain did last, step by step (rig/tune-rig.json), and the identities its reuse rules
compare: each member's drive (`core.drives`) and files (size, mtime_ns, inode, device, ctime_ns).

Each step records, when it finishes, the key of its inputs and what it made; a rerun whose key is
unchanged reuses what it made. The file is written after each step, so an interrupted chain keeps
every step it finished (docs/tune-rig.md, "Reuse and resume").
"""

from __future__ import annotations

import hashlib
import json
import os

from core.constants import TUNE_RIG_FILE
from core.drives import drive_of
from core.errors import ReplicaTunerError
from core.jsonfile import read_json, write_json
from core.rig import Member, Rig
from models.modelset import member_files

from .constants import STATE_KIND, STATE_SCHEMA


def state_path(rig: Rig) -> str:
    return os.path.join(rig.root, TUNE_RIG_FILE)


def load_state(rig: Rig) -> dict:
    """{step: its record} of the last chain on this rig; {} when there is none or this version
    cannot read it (the chain then redoes what it cannot prove, and rewrites the file)."""
    path = state_path(rig)
    if not os.path.exists(path):
        return {}
    try:
        doc = read_json(path, STATE_KIND, "it is rewritten by the next `engine-bridge tune-rig`", schema=STATE_SCHEMA)
        steps = doc["steps"]
        return dict(steps) if isinstance(steps, dict) else {}
    except (ReplicaTunerError, KeyError, TypeError):
        return {}


def save_step(rig: Rig, step: str, record: dict) -> None:
    """Record one finished step (read, update, write atomically: one chain per rig at a time)."""
    steps = load_state(rig)
    steps[step] = record
    os.makedirs(rig.root, exist_ok=True)
    write_json(state_path(rig), {"schema": STATE_SCHEMA, "kind": STATE_KIND, "steps": steps})


def key_of(doc: dict) -> str:
    """A step's key: the SHA-256 of its inputs as canonical JSON."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=list).encode()).hexdigest()


# How each step's inputs are named when one changed.
INPUT_NAMES = {"rig": "rig.toml", "model": "the model", "bench": "the measurement", "engine": "the engine",
               "cache_experts": "the expert cache", "cache": "the expert cache", "plan": "the plan",
               "name": "the profile's name", "allow_unverified": "--allow-unverified", "binary": "the engine's binary",
               "args": "the engine's arguments", "budget": "the budget", "top": "--top", "timeout": "--timeout",
               "min_gain": "--min-gain", "tolerance": "--share-tolerance", "prompt_tokens": "--prompt-tokens"}


def changed(record: dict, inputs: dict) -> str:
    """What differs between the inputs a step recorded and these, named for people ('' none)."""
    old = record.get("inputs")
    if not isinstance(old, dict):
        return "its inputs"
    names = [INPUT_NAMES.get(k, k) for k in inputs if old.get(k) != inputs[k]]
    return ", ".join(dict.fromkeys(names))


def file_digest(path: str) -> str:
    """SHA-256 of a small file the chain's keys depend on (rig.toml); '' when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def member_identity(member: Member, manifest, verdicts: dict | None = None) -> dict:
    """{"drive": the drive's stable key (core.drives), "files": [[rel, size, mtime_ns, inode, device,
    ctime_ns, how its last verdict was made ('' none)] or [rel, None] for a file that is gone]} of
    one member; `verdicts` the rig's (replicas.records.load_verdicts); `manifest` the rig's ModelManifest
    (None: the member's path alone)."""
    located = member_files(member, manifest) if manifest is not None else [(os.path.basename(member.path), member.path, None)]
    files = []
    for rel, path, _ in located:
        try:
            st = os.stat(path)
            # ctime too: a copy keeps its source's mtime (sync), and a file system hands a deleted
            # file's inode number to the next file, so size, mtime and inode alone cannot tell a
            # new copy on a drive from the one that was measured. A verify that stamps a file
            # moves its ctime as well: what last judged the file (its verdict's `how`) tells them
            # apart (`coverage.same_file`).
            v = (verdicts or {}).get(path)
            files.append([rel, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns, v.how if v else ""])
        except OSError:
            files.append([rel, None])
    try:
        drive = drive_of(member.path if os.path.exists(member.path) else os.path.dirname(member.path)).key
    except OSError:
        drive = ""
    return {"drive": drive, "files": files}


def identities(rig: Rig, manifest) -> dict[str, dict]:
    """{member name: member_identity} of every member of the rig."""
    from replicas.records import load_verdicts

    try:
        verdicts = load_verdicts(rig)
    except ReplicaTunerError:
        verdicts = {}
    return {m.name: member_identity(m, manifest, verdicts) for m in rig.members}
