"""Reading and writing verification stamps: an extended attribute on files the tool wrote,
a sidecar record in rig/stamps/ for the primary (the user's file is never modified, not even
its xattrs) and wherever the file system has no user xattrs (exFAT, FAT, some FUSE, old tmpfs).
"""

from __future__ import annotations

import errno
import hashlib
import os
import time

import xattr

from core.fsutil import FileIdentity, atomic_write_bytes
from core.rig import Rig

from core import platform
from .manifest import Manifest, ModelManifest
from models.modelset import located_files
from .stamp import Stamp, make_stamp, stamp_from_bytes, stamp_matches, stamp_to_bytes

VERIFIED, STALE, UNVERIFIED, MISSING = "verified", "stale", "unverified", "missing"

_NO_XATTR = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES, errno.EROFS}


def sidecar_path(rig: Rig, path: str) -> str:
    key = hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:20]
    return os.path.join(rig.stamps_dir, key + ".json")


def read_stamps(path: str, rig: Rig) -> list[Stamp]:
    """Every stamp we can find for a file: its xattr, then its sidecar record."""
    found = []
    try:
        s = stamp_from_bytes(xattr.getxattr(path, platform.stamp_xattr_name()))
        if s:
            found.append(s)
    except OSError:
        pass
    try:
        with open(sidecar_path(rig, path), "rb") as f:
            s = stamp_from_bytes(f.read())
        if s and os.path.realpath(s.path) == os.path.realpath(path):
            found.append(s)
    except OSError:
        pass
    return found


def write_stamp(path: str, manifest: Manifest, rig: Rig, *, tag_file: bool,
                identity: FileIdentity | None = None, verified_at: float | None = None) -> str:
    """Record a full verification. Returns 'xattr' or 'sidecar' (where it went).

    tag_file: whether the file is ours to tag (a replica we wrote); the primary never is.
    """
    ident = identity or FileIdentity.of(path)
    stamp = make_stamp(manifest, ident, time.time() if verified_at is None else verified_at, os.path.abspath(path))
    if tag_file:
        try:
            xattr.setxattr(path, platform.stamp_xattr_name(), stamp_to_bytes(stamp))
            if FileIdentity.of(path) == ident:  # tagging must not change what the stamp records
                _drop_sidecar(rig, path)
                return "xattr"
        except OSError as e:
            if e.errno not in _NO_XATTR:
                raise
    atomic_write_bytes(sidecar_path(rig, path), stamp_to_bytes(stamp))
    return "sidecar"


def _drop_sidecar(rig: Rig, path: str) -> None:
    try:
        os.unlink(sidecar_path(rig, path))
    except FileNotFoundError:
        pass


def clear_stamp(path: str, rig: Rig) -> None:
    """Forget any verification of this file (before the tool modifies it)."""
    try:
        xattr.removexattr(path, platform.stamp_xattr_name())
    except OSError:
        pass
    _drop_sidecar(rig, path)


def stamp_state(path: str, manifest: Manifest | ModelManifest, rig: Rig,
                holds: tuple[str, ...] | None = None) -> str:
    """'verified' (a stamp still matches), 'stale' (a stamp exists but the file or manifest
    changed), 'unverified' (no stamp) or 'missing' (no such file).

    Given a ModelManifest, `path` is a member's path (file, first file or directory) and the
    answer rolls up the stamp of each of its files: verified only when every file's is (a partial
    replica: every file of `holds`, the files it holds)."""
    if isinstance(manifest, ModelManifest):
        states = [stamp_state(p, fm, rig) for rel, p, fm in located_files(path, manifest)
                  if holds is None or rel in holds] or [VERIFIED]
        return next(s for s in (MISSING, STALE, UNVERIFIED, VERIFIED) if s in states)
    try:
        ident = FileIdentity.of(path)
    except FileNotFoundError:
        return MISSING
    except OSError:
        return MISSING
    stamps = read_stamps(path, rig)
    if any(stamp_matches(s, ident, manifest) for s in stamps):
        return VERIFIED
    return STALE if stamps else UNVERIFIED


def last_verified(path: str, rig: Rig) -> float | None:
    """Unix time of the newest full verification recorded for this file, if any."""
    times = [s.verified_at for s in read_stamps(path, rig)]
    return max(times) if times else None
