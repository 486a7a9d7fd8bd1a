"""`replicas forget`: a member leaves the rig. Its entry goes from rig.toml and what the rig
keeps about it goes too (its verdict, its verify progress, its sidecar stamps); the member's
file, and its drive, are never touched, so a member whose drive is gone can be forgotten."""

from __future__ import annotations

import dataclasses
import os

from core import rig as rigmod
from core.errors import UsageError
from core.rig import Member, Rig

from .records import record_scrub, record_verdicts
from .stamp import stamp_from_bytes
from .stamps import sidecar_path


def _sidecars_of(rig: Rig, path: str) -> list[str]:
    """The sidecar stamps recorded for `path`: the one under its key, and any whose record names
    it (the key hashes the real path, which may have resolved differently while the drive was
    there)."""
    found = {sidecar_path(rig, path)}
    try:
        names = os.listdir(rig.stamps_dir)
    except FileNotFoundError:
        names = []
    for n in names:
        p = os.path.join(rig.stamps_dir, n)
        try:
            with open(p, "rb") as f:
                s = stamp_from_bytes(f.read())
        except OSError:
            continue
        if s is not None and os.path.abspath(s.path) == os.path.abspath(path):
            found.add(p)
    return sorted(p for p in found if os.path.lexists(p))


def forget_member(rig: Rig, path_or_name: str) -> Member:
    """Remove a member (by path or drive name) from the rig; returns it. The primary can go only
    when no replica is left, since replicas are copies of it."""
    m = rig.member(path_or_name)
    if m.role == "primary" and rig.replicas:
        raise UsageError(f"{m.path} is the rig's model (the primary); forget its replicas first "
                         f"({', '.join(r.name for r in rig.replicas)}) or start another rig with --rig")
    updated = dataclasses.replace(rig, model=None) if m.role == "primary" else \
        dataclasses.replace(rig, replicas=tuple(r for r in rig.replicas if r.path != m.path))
    rigmod.save_rig(updated)
    record_verdicts(rig, {m.path: None})
    record_scrub(rig, {m.path: None})
    for p in _sidecars_of(rig, m.path):
        os.unlink(p)
    return m
