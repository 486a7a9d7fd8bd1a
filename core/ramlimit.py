"""How much RAM a process may fill with the page cache, from what Linux says (pure; core/ram.py
reads the files).

The tightest of: the memory limit of the cgroup the process runs in and of every group above it
(cgroup v1 `memory.limit_in_bytes`, whose own `memory.stat` also says the effective
`hierarchical_memory_limit`; cgroup v2 `memory.max` and `memory.high`, each group up the
hierarchy), and the machine's RAM (/proc/meminfo `MemTotal`). The page cache counts against a
memory cgroup's limit, so a process in a group of 2 GiB keeps at most 2 GiB of the model cached,
whatever the machine has (docs/iobench.md, "A RAM budget"). The limit is RAM for the process's
own memory and the page cache together: what the cache gets is what the processes leave of it.

The inputs are the texts of /proc/PID/cgroup (which group, per hierarchy), /proc/PID/mountinfo
(where each hierarchy is mounted, and which part of it: a container sees its own group as the
root) and the groups' own files.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .mounts import parse_mountinfo
from .units import format_bytes

V1, V2 = "v1", "v2"
V1_UNLIMITED = 1 << 62      # bytes: v1 writes PAGE_COUNTER_MAX pages (9223372036854771712) for "no limit"
MEMTOTAL = "MemTotal"


@dataclass(frozen=True)
class RamLimit:
    """The RAM a process may fill, in bytes, and where the figure comes from: `source` is
    "cgroup v1", "cgroup v2" or "MemTotal"; `knob` the file that set it and `group` the group it
    is a file of (as /proc/PID/cgroup names groups), both empty for MemTotal. `mem_total` is the
    machine's RAM (0: unknown)."""

    bytes: int
    source: str
    knob: str = ""
    group: str = ""
    mem_total: int = 0

    @property
    def from_cgroup(self) -> bool:
        return self.source in (f"cgroup {V1}", f"cgroup {V2}")

    def describe(self) -> str:
        """'cgroup v1 limit 100.0 MiB (memory.limit_in_bytes of /replica-tuner-testbed-…)', 'MemTotal 23.5 GiB'."""
        if not self.from_cgroup:
            return f"{self.source} {format_bytes(self.bytes)}" if self.bytes else "RAM unknown (no MemTotal, no cgroup limit)"
        return f"{self.source} limit {format_bytes(self.bytes)} ({self.knob} of {self.group})"


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy: `point` where it is mounted, `root` the group seen at that
    point ('/' unless a container's view), `kind` v1 or v2, `controllers` (v1: from its mount
    options; v2: empty, its controllers are in cgroup.controllers)."""

    point: str
    root: str
    kind: str
    controllers: tuple[str, ...] = ()


def proc_cgroups(text: str) -> dict[str, str]:
    """{controller: group path} from /proc/PID/cgroup: '4:memory:/a/b' -> {'memory': '/a/b'};
    '2:cpu,cpuacct:/' names both; the unified (v2) line '0::/x' is the key ''."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(",") if parts[1] else [""]:
            out.setdefault(name, parts[2])
    return out


def cgroup_hierarchies(mountinfo: str) -> list[Hierarchy]:
    """The cgroup hierarchies mounted, from /proc/PID/mountinfo's text (fields: id, parent,
    maj:min, root, mount point, options, optional fields, '-', type, source, super options)."""
    out = []
    for e in parse_mountinfo(mountinfo):
        if e.fs_type == "cgroup2":
            out.append(Hierarchy(e.mount_point, e.root, V2))
        elif e.fs_type == "cgroup":
            out.append(Hierarchy(e.mount_point, e.root, V1, tuple(o for o in e.super_options if o not in ("rw", "ro"))))
    return out


def memory_hierarchy(hierarchies: list[Hierarchy], groups: dict[str, str]) -> tuple[Hierarchy, str] | None:
    """(the hierarchy the memory controller is on, the process's group in it): the v1 hierarchy
    mounted with `memory`, else the unified one (whether it has the memory controller its files
    say: a group without `memory.max` has none). None when the process is in neither."""
    for h in hierarchies:
        if h.kind == V1 and "memory" in h.controllers and "memory" in groups:
            return h, groups["memory"]
    for h in hierarchies:
        if h.kind == V2 and "" in groups:
            return h, groups[""]
    return None


def group_folder(h: Hierarchy, group: str) -> str | None:
    """The folder of `group` (a path as /proc/PID/cgroup gives it) under the hierarchy's mount
    point; None when the group is outside what is mounted there."""
    if h.root in ("/", ""):
        rel = group
    elif group == h.root or group.startswith(h.root.rstrip("/") + "/"):
        rel = group[len(h.root.rstrip("/")):]
    else:
        return None
    rel = rel.strip("/")
    return posixpath.join(h.point, rel) if rel else h.point


def groups_up(h: Hierarchy, group: str) -> list[tuple[str, str]]:
    """(group, its folder) for `group` and every group above it that is mounted, nearest first."""
    out = []
    while True:
        folder = group_folder(h, group)
        if folder is None:
            break
        out.append((group, folder))
        if group in ("/", "", h.root):
            break
        group = posixpath.dirname(group.rstrip("/")) or "/"
    return out


def parse_v1_limit(text: str) -> int | None:
    """memory.limit_in_bytes (or hierarchical_memory_limit): bytes, None for no limit or unreadable."""
    try:
        n = int(text.strip())
    except ValueError:
        return None
    return n if 0 < n < V1_UNLIMITED else None


def parse_v2_limit(text: str) -> int | None:
    """memory.max / memory.high: bytes, None for 'max' or unreadable."""
    return parse_v1_limit(text) if text.strip() != "max" else None


def stat_value(text: str, key: str) -> int | None:
    """One 'key value' line of a cgroup's memory.stat, memory.events or memory.oom_control."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


def mem_total(meminfo: str) -> int:
    """MemTotal from /proc/meminfo's text, in bytes (0 when absent)."""
    for line in meminfo.splitlines():
        if line.startswith(MEMTOTAL + ":"):
            parts = line.split()
            try:
                return int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
            except (IndexError, ValueError):
                return 0
    return 0


def tightest(candidates: list[RamLimit], total: int) -> RamLimit:
    """The smallest of the cgroup limits found and MemTotal (the machine wins a tie: a limit as
    large as the RAM holds nothing back)."""
    best = RamLimit(total, MEMTOTAL, mem_total=total)
    for c in candidates:
        if c.bytes > 0 and (best.bytes <= 0 or c.bytes < best.bytes):
            best = RamLimit(c.bytes, c.source, c.knob, c.group, total)
    return best


def v1_candidates(up: list[tuple[str, str]], limits: dict[str, str], hierarchical: str | None) -> list[RamLimit]:
    """The v1 limits of the groups `up` (nearest first; `limits`: folder -> memory.limit_in_bytes
    text). `hierarchical`: the own group's memory.stat text, whose hierarchical_memory_limit is the
    kernel's own answer (an ancestor's limit only binds with use_hierarchy)."""
    found = [RamLimit(n, f"cgroup {V1}", "memory.limit_in_bytes", group)
             for group, folder in up if (n := parse_v1_limit(limits.get(folder, ""))) is not None]
    if hierarchical is None or not up:
        return found
    n = stat_value(hierarchical, "hierarchical_memory_limit")
    if n is None or n >= V1_UNLIMITED:
        return found[:1] if found and found[0].group == up[0][0] else []
    named = next((f for f in found if f.bytes == n), None)
    return [named or RamLimit(n, f"cgroup {V1}", "hierarchical_memory_limit", up[0][0])]


def v2_candidates(up: list[tuple[str, str]], files: dict[tuple[str, str], str]) -> list[RamLimit]:
    """The v2 limits of the groups `up` (nearest first; `files`: (folder, 'memory.max' or
    'memory.high') -> text, absent where the group has no such file)."""
    out = []
    for group, folder in up:
        for knob in ("memory.max", "memory.high"):
            n = parse_v2_limit(files.get((folder, knob), ""))
            if n is not None:
                out.append(RamLimit(n, f"cgroup {V2}", knob, group))
    return out
