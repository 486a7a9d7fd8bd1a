"""What a verification stamp is and when it may be trusted (pure).

A stamp records the manifest it was verified against and the file's (size, mtime_ns, inode,
device) at verification time. Quick verify trusts it only while all four still match and the
manifest is the same; ctime is never used (writing the stamp itself changes ctime).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .constants import STAMP_SCHEMA
from .manifest import Manifest


@dataclass(frozen=True)
class Stamp:
    manifest: str        # Manifest.digest() it was verified against
    blake3: str          # whole-file BLAKE3 (for humans reading the xattr)
    size: int            # bytes
    mtime_ns: int
    inode: int
    device: int
    verified_at: float   # unix seconds of the full verification
    path: str = ""       # path at verification time (sidecar records need it)
    schema: int = STAMP_SCHEMA


def make_stamp(manifest: Manifest, identity, verified_at: float, path: str = "") -> Stamp:
    return Stamp(manifest.digest(), manifest.blake3, identity.size, identity.mtime_ns, identity.inode,
                 identity.device, verified_at, path)


def stamp_matches(stamp: Stamp, identity, manifest: Manifest) -> bool:
    """True when the file is, by every cheap measure, the one that was verified."""
    return (stamp.schema == STAMP_SCHEMA and stamp.manifest == manifest.digest()
            and stamp.size == identity.size == manifest.size and stamp.mtime_ns == identity.mtime_ns
            and stamp.inode == identity.inode and stamp.device == identity.device)


def stamp_to_bytes(stamp: Stamp) -> bytes:
    return json.dumps(asdict(stamp), sort_keys=True, separators=(",", ":")).encode()


def stamp_from_bytes(data: bytes) -> Stamp | None:
    """None for anything that is not a stamp we wrote (never trust what we cannot parse)."""
    try:
        d = json.loads(data)
        if not isinstance(d, dict) or d.get("schema") != STAMP_SCHEMA:
            return None
        return Stamp(**{k: d[k] for k in Stamp.__dataclass_fields__})
    except (ValueError, TypeError, KeyError):
        return None
