"""Whether an iobench result still covers a rig's members, and what to measure when it does not
(pure: the identities are read by the caller, `state.identities`).

A result covers a member when it measured a drive of that name at the member's path (a file of it,
for a model that is a folder), on the same
drive by its stable identity (`core.drives`: file system UUID, else the disk's serial, else its
name), and — when the chain recorded the member's files as they were when it was measured — the
files are still those (`same_file`: size, mtime_ns, inode, device, and ctime unless a verify
stamped the file; a copy keeps its source's mtime and may get a deleted file's inode number).

- every member covered: reuse the result;
- a member is on a drive the result never measured, or on another drive than it measured: measure
  every drive (the drives' together runs and shared links include it);
- otherwise only the members whose files changed: measured alone, the others' figures kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .constants import REUSE, RUN


@dataclass(frozen=True)
class MeasureChoice:
    action: str                    # REUSE or RUN
    names: tuple[str, ...]         # the members to measure (all of them for a full measurement)
    why: str


# How a verdict was made when only a verify touched the file (its stamp moves the ctime, not the bytes).
VERIFIED_IN_PLACE = frozenset({"stamp", "full", "sample"})


def _files(ident: dict) -> list:
    return [list(f) for f in ident.get("files", ())]


def same_file(then: list, now: list) -> bool:
    """Whether a file is the one measured: [rel, size, mtime_ns, inode, device, ctime_ns, how] then
    and now. The same size, mtime, inode and device, and the same ctime unless what last judged the
    file is a verify (which stamps it in place); a copy (`how` sync, or a repair) is a new file even
    where the file system gave it the old inode number."""
    if len(then) < 7 or len(now) < 7 or then[1] is None or now[1] is None:
        return then == now
    return then[:5] == now[:5] and (then[5] == now[5] or now[6] in VERIFIED_IN_PLACE)


def _same_files(then: list, now: list) -> bool:
    return len(then) == len(now) and all(same_file(a, b) for a, b in zip(then, now))


def choose_measure(members: Sequence[tuple[str, str, dict]], drives: Sequence[tuple[str, str, str]] | None,
                   recorded: dict | None, bench: str = "", always: bool = False) -> MeasureChoice:
    """`members`: (name, real path, identity) of each member, in the rig's order; `drives`: (name,
    real path, drive key) of each drive the newest result measured (None: the rig has none);
    `recorded`: {name: identity} the chain recorded with that result (None: not recorded by it)."""
    every = tuple(m[0] for m in members)
    if always:
        return MeasureChoice(RUN, every, "asked to measure every drive again")
    if drives is None:
        return MeasureChoice(RUN, every, "the rig has no iobench result yet")
    by_name = {d[0]: d for d in drives}
    new, moved, changed = [], [], []
    for name, path, ident in members:
        d = by_name.get(name)
        if d is None or not (d[1] == path or d[1].startswith(path.rstrip("/") + "/")):   # a folder model: a file in it
            new.append(name)
        elif d[2] and ident.get("drive") and d[2] != ident["drive"]:
            moved.append(name)
        elif any(f[1] is None for f in _files(ident)):
            changed.append(name)
        elif recorded is not None and not _same_files(_files(recorded.get(name) or {}), _files(ident)):
            changed.append(name)
    if new or moved:
        why = "; ".join(x for x in (f"{bench or 'the newest result'} never measured {', '.join(new)}" if new else "",
                                    f"{', '.join(moved)} is on another drive than {bench or 'it'} measured" if moved else "")
                        if x)
        return MeasureChoice(RUN, every, why + ": every drive is measured (together runs include it)")
    if changed:
        their = "its files" if len(changed) == 1 else "their files"
        return MeasureChoice(RUN, tuple(changed), f"{', '.join(changed)}: {their} changed since {bench} measured them "
                                                  "(a new copy); measured alone, the other drives' figures kept")
    how = "same drives, files unchanged since measured" if recorded is not None else \
        "same drives by their identity (the result was made outside this chain)"
    return MeasureChoice(REUSE, (), f"{bench} covers {', '.join(every)} ({how})")
