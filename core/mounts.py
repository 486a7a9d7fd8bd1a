"""Which mount holds a path, from /proc/self/mountinfo (Linux): its file system type, source and
device number. Read by the drive lookup (`core.drives`), the RAM test (`core.tiers`) and the
cgroup lookup (`core.ramlimit`); kept apart from them so that a command that only asks "is this
file in RAM?" (`replicas hash`) does not pay for importing the drive lookup."""

from __future__ import annotations

from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class MountEntry:
    mount_point: str
    fs_type: str
    source: str
    majmin: str
    root: str = "/"                      # the mounted file system's folder seen at mount_point
    super_options: tuple[str, ...] = ()


def _unescape(text: str) -> str:
    """A path as mountinfo writes it (space, tab, newline, backslash octal-escaped)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and len(text) >= i + 4 and all(c in "01234567" for c in text[i + 1:i + 4]):
            out.append(chr(int(text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse mountinfo's text (pure). Fields: id, parent, maj:min, root, mount point, options,
    optional fields, '-', type, source, super options."""
    entries = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f = left.split()
        r = right.split()
        if len(f) < 5 or len(r) < 2:
            continue
        entries.append(MountEntry(mount_point=_unescape(f[4]), fs_type=r[0], source=_unescape(r[1]), majmin=f[2],
                                  root=_unescape(f[3]), super_options=tuple(r[2].split(",")) if len(r) > 2 else ()))
    return entries


def mount_for(path: str, entries: list[MountEntry]) -> MountEntry | None:
    """The entry with the longest mount point containing path (the last one wins on ties: over-mounts)."""
    best = None
    for e in entries:
        mp = e.mount_point.rstrip("/") or "/"
        if path == mp or path.startswith(mp if mp.endswith("/") else mp + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/"):
                best = e
    return best


def mount_of(real: str) -> MountEntry | None:
    """The mount holding `real` (a resolved path), or None where there is no mountinfo (not Linux)."""
    try:
        with open(MOUNTINFO) as f:
            text = f.read()
    except OSError:
        return None
    return mount_for(real, parse_mountinfo(text))
