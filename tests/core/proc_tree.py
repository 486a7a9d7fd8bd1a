"""A /proc and cgroup tree recorded in a temporary folder, laid out as Linux lays it out:
proc/meminfo, proc/PID/cgroup and proc/PID/mountinfo (whose mount points are folders of the tree),
and each cgroup hierarchy's groups as folders holding their memory files."""

from __future__ import annotations

from pathlib import Path

MEMTOTAL_KB = 24683792            # this size of machine: 23.5 GiB


class ProcTree:
    def __init__(self, root: Path, mem_total_kb: int = MEMTOTAL_KB):
        self.root = root
        self.proc = root / "proc"
        self.proc.mkdir(parents=True, exist_ok=True)
        (self.proc / "meminfo").write_text(f"MemTotal:       {mem_total_kb} kB\nMemFree:        1000 kB\n")
        self.mounts: list[str] = []

    def mount_v1(self, controllers: str, root: str = "/") -> Path:
        """A v1 hierarchy with `controllers` ('memory', 'cpu,cpuacct'), its group `root` at the mount."""
        point = self.root / "sys" / "fs" / "cgroup" / controllers
        point.mkdir(parents=True, exist_ok=True)
        self.mounts.append(f"{30 + len(self.mounts)} 25 0:{30 + len(self.mounts)} {root} {point} rw,nosuid,nodev,noexec,"
                           f"relatime shared:{len(self.mounts) + 9} - cgroup cgroup rw,{controllers}")
        return point

    def mount_v2(self, root: str = "/", name: str = "unified") -> Path:
        point = self.root / "sys" / "fs" / "cgroup" / name
        point.mkdir(parents=True, exist_ok=True)
        self.mounts.append(f"{30 + len(self.mounts)} 25 0:{30 + len(self.mounts)} {root} {point} rw,nosuid,nodev,noexec,"
                           "relatime shared:8 - cgroup2 cgroup2 rw,nsdelegate")
        return point

    def group(self, point: Path, rel: str, files: dict[str, str] | None = None) -> Path:
        """The group folder `rel` under a mount point, with the files given ({'memory.max': '1048576'})."""
        d = point / rel.strip("/") if rel.strip("/") else point
        d.mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():
            (d / name).write_text(text + "\n")
        return d

    def process(self, cgroup_lines: str, pid: str = "self") -> None:
        """/proc/PID/cgroup with these lines, and the mountinfo of every hierarchy mounted so far."""
        d = self.proc / pid
        d.mkdir(exist_ok=True)
        (d / "cgroup").write_text(cgroup_lines.strip() + "\n")
        (d / "mountinfo").write_text("22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                                     + "".join(m + "\n" for m in self.mounts))
