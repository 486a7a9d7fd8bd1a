"""`replicas forget`: a member leaves the rig. Its entry goes from rig.toml and what the rig
keeps about it goes too (the verdicts, verify progress and sidecar stamps of each of its files);
the member's files, and its drive, are never touched, so a member whose drive is gone can be forgotten."""

from __future__ import annotations

import dataclasses
import os

from core import rig as rigmod
from core.errors import UsageError
from core.rig import Member, Rig

from models.modelset import DIR, member_set
from .records import load_scrub, load_verdicts, record_scrub, record_verdicts
from .stamp import stamp_from_bytes
from .stamps import sidecar_path


def _paths_of(rig: Rig, member: Member) -> tuple[set[str], str | None]:
    """The paths the rig may keep records under for a member: the member's own path and every
    file of the model there; for a directory model also anything under the directory (a file
    the model had before)."""
    paths = {member.path} | set(member_set(rig, member).paths)
    return paths, (member.path.rstrip(os.sep) + os.sep if rig.layout == DIR else None)


def _mine(path: str, paths: set[str], under: str | None) -> bool:
    path = os.path.abspath(path)
    return path in paths or (under is not None and path.startswith(under))


def _sidecars_of(rig: Rig, paths: set[str], under: str | None) -> list[str]:
    """The sidecar stamps recorded for these paths: the one under each path's key, and any whose
    record names one (the key hashes the real path, which may have resolved differently while
    the drive was there)."""
    found = {sidecar_path(rig, p) for p in paths}
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
        if s is not None and _mine(s.path, paths, under):
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
    paths, under = _paths_of(rig, m)
    rigmod.save_rig(updated)
    record_verdicts(rig, {p: None for p in set(load_verdicts(rig)) | paths if _mine(p, paths, under)})
    record_scrub(rig, {p: None for p in set(load_scrub(rig)) | paths if _mine(p, paths, under)})
    for p in _sidecars_of(rig, paths, under):
        os.unlink(p)
    return m
