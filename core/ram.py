"""The RAM a process may fill with the page cache, as the kernel will hold it to: the tightest of its
memory cgroup's limit (and the groups' above it) and MemTotal (core/ramlimit.py has the rules).

    >>> ram_limit().describe()
    'cgroup v1 limit 53.4 MiB (memory.limit_in_bytes of /replica-tuner-testbed-…)'   # under a testbed budget
    'MemTotal 23.5 GiB'                                                              # elsewhere

Every path comes from `proc` (default /proc) and from the mount points /proc/PID/mountinfo
names, so tests point it at a tree recorded in a temporary folder. Nothing raises on what cannot
be read: a file that is not there is a limit that is not there. Outside Linux there is no /proc:
the answer is `RamLimit(0, "MemTotal")`, RAM unknown.
"""

from __future__ import annotations

import os

from .ramlimit import (
    V1,
    RamLimit,
    cgroup_hierarchies,
    groups_up,
    mem_total,
    memory_hierarchy,
    proc_cgroups,
    tightest,
    v1_candidates,
    v2_candidates,
)


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def ram_limit(pid: int = 0, proc: str = "/proc", groups: dict[str, str] | None = None) -> RamLimit:
    """The RAM process `pid` (0: this one) may fill, and its source. `groups` ({controller: group},
    as /proc/PID/cgroup says them) asks instead about a process that would run in those groups
    (`iobench testbed show`: what a command run in the testbed sees)."""
    me = str(pid) if pid else "self"
    total = mem_total(_read(os.path.join(proc, "meminfo")) or "")
    if groups is None:
        groups = proc_cgroups(_read(os.path.join(proc, me, "cgroup")) or "")
    found = memory_hierarchy(cgroup_hierarchies(_read(os.path.join(proc, me, "mountinfo")) or ""), groups)
    if found is None:
        return tightest([], total)
    h, group = found
    up = groups_up(h, group)
    if h.kind == V1:
        limits = {folder: _read(os.path.join(folder, "memory.limit_in_bytes")) or "" for _, folder in up}
        own_stat = _read(os.path.join(up[0][1], "memory.stat")) if up else None
        return tightest(v1_candidates(up, limits, own_stat), total)
    files = {(folder, knob): text for _, folder in up for knob in ("memory.max", "memory.high")
             if (text := _read(os.path.join(folder, knob))) is not None}
    return tightest(v2_candidates(up, files), total)


def own_resident(proc: str = "/proc") -> int:
    """Bytes this process holds resident now (/proc/self/statm's resident pages; 0 unknown). A
    process that starts an engine stays beside it, in the same memory budget."""
    text = _read(os.path.join(proc, "self", "statm")) or ""
    try:
        return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (IndexError, ValueError, OSError, AttributeError):
        return 0
