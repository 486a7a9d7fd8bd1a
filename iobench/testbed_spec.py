"""The throttled testbed's pure parts: drive limits, the RAM budget, which controllers, the cgroup
lines to write, and the state document (`iobench testbed`; the I/O is in testbed.py).

A testbed is N loop devices, each an ext4 file system on an image in the testbed folder, whose
I/O a cgroup caps: cgroup v2 `io.max` where the io controller sits on the unified hierarchy,
cgroup v1 `blkio.throttle.*` otherwise. Its processes are held to a RAM budget by the memory
controller: cgroup v2 `memory.max`, cgroup v1 `memory.limit_in_bytes`; the page cache counts
against it. MB here is 10**6 bytes; a limit of 0 means none.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from core.errors import RigError, UsageError
from core.ramlimit import stat_value
from core.units import format_bytes

STATE_FILE = "testbed.json"
STATE_KIND = "replica-tuner-testbed"
STATE_SCHEMA = 3           # 2: the RAM budget (`ram`); 3: the pacing; schemas 1 and 2 are still read
STATE_SCHEMAS = (1, 2, 3)
CGROUP_PREFIX = "replica-tuner-testbed-"
V1, V2 = "v1", "v2"
# How a drive's ceiling is kept: "throttle", the cgroup's byte budget per time slice (a drive left
# idle banks credit); "service", a user-space daemon that serves each request in bytes / rate after
# the one before it (iobench/servedrive.py: nothing banked, as a real drive).
THROTTLE, SERVICE = "throttle", "service"
PACINGS = (THROTTLE, SERVICE)
MIN_SIZE = 32 << 20                 # bytes: below this mkfs.ext4 leaves too little room to be a drive
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")    # a folder name and a cgroup-safe word
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

# The v1 files, one rule per device each; a rule of 0 would remove the limit, so 0 is not written.
V1_FILES = (("read_mbs", "blkio.throttle.read_bps_device", 1e6), ("write_mbs", "blkio.throttle.write_bps_device", 1e6),
            ("read_iops", "blkio.throttle.read_iops_device", 1), ("write_iops", "blkio.throttle.write_iops_device", 1))
V2_KEYS = (("read_mbs", "rbps", 1e6), ("write_mbs", "wbps", 1e6), ("read_iops", "riops", 1), ("write_iops", "wiops", 1))


@dataclass(frozen=True)
class DriveLimits:
    """One drive's ceilings: MB/s (10**6 B/s) and IOPS; 0 is no limit."""

    name: str
    read_mbs: float
    write_mbs: float = 0
    read_iops: float = 0
    write_iops: float = 0


def parse_pairs(items, what: str, zero_ok: bool = False) -> dict[str, float]:
    """'a:200,b:120' or ['a:200', 'b:120'] -> {'a': 200.0, 'b': 120.0}, order kept.

    Numbers must be above 0 (or 0 and above where `zero_ok`: an IOPS limit of 0 is none)."""
    out: dict[str, float] = {}
    for item in (x.strip() for it in ([items] if isinstance(items, str) else items) for x in it.split(",")):
        name, _, value = item.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not name or name in out or not (number >= 0 if zero_ok else number > 0) or number == float("inf"):
            raise UsageError(f"{what} {item!r}: want NAME:NUMBER, each name once, the number "
                             f"{'0 or more' if zero_ok else 'above 0'} (e.g. a:200)")
        out[name] = number
    return out


def plan_drives(read_mbs: dict[str, float], write_mbs: float | dict[str, float] = 0,
                read_iops: dict[str, float] | None = None, write_iops: dict[str, float] | None = None
                ) -> tuple[DriveLimits, ...]:
    """The drives in the order given; `write_mbs` is one ceiling for all or per drive. Every name
    must be a plain folder name, and the per-drive limits may only name drives that exist."""
    if not read_mbs:
        raise UsageError("a testbed needs at least one drive: --drive NAME:MBPS (e.g. --drive a:30)")
    for name in read_mbs:
        if not NAME_RE.match(name):
            raise UsageError(f"drive name {name!r}: use 1-32 letters, digits, '-' or '_', starting with a letter or digit")
    writes = write_mbs if isinstance(write_mbs, dict) else {n: float(write_mbs) for n in read_mbs}
    for what, given in (("--write-mbs", writes), ("--iops", read_iops or {}), ("--write-iops", write_iops or {})):
        unknown = [n for n in given if n not in read_mbs]
        if unknown:
            raise UsageError(f"{what} names {', '.join(unknown)}, not a drive; drives are {', '.join(read_mbs)}")
        if any(v < 0 for v in given.values()):
            raise UsageError(f"{what}: limits are 0 (none) or more")
    return tuple(DriveLimits(n, float(mbs), float(writes.get(n, 0)), float((read_iops or {}).get(n, 0)),
                             float((write_iops or {}).get(n, 0))) for n, mbs in read_mbs.items())


def parse_size(text: str) -> int:
    """'3G', '512M', '1073741824' -> bytes (binary units, as truncate and losetup read them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise UsageError(f"--size {text!r}: give bytes or a number with K, M, G or T (e.g. 3G)")
    size = int(m.group(1)) * SIZE_UNITS[m.group(2).upper()]
    if size < MIN_SIZE:
        raise UsageError(f"--size {text!r}: each drive needs at least {MIN_SIZE >> 20} MiB")
    return size


# ---- the RAM budget --------------------------------------------------------------------------

REF_RAM = (128, 518)        # the reference rig: 128 GB of RAM for a 518 GB model (docs/iobench.md)
RAM_HELP = ("give a size (2G), a share of the model's bytes (25%, 128/518, or ref: the reference rig's 128/518) with "
            "an optional allowance for the processes' own memory (ref+768M), or none")


@dataclass(frozen=True)
class RamSpec:
    """--ram as given: a size in bytes, or a share of the model's bytes plus `own` bytes for the
    processes' own memory (an engine's expert cache, interpreters: RAM the page cache cannot have)."""

    text: str
    size: int = 0
    share: float = 0.0
    share_text: str = ""    # '25%', '128/518'
    own: int = 0

    @property
    def needs_model(self) -> bool:
        return self.share > 0


def _ram_size(text: str, what: str, whole: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)(?:I?B)?", text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"{what} {whole!r}: {RAM_HELP}")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2)])


def parse_ram(text: str, what: str = "--ram") -> RamSpec | None:
    """'2G' (binary units, as --size), '25%', '128/518', 'ref' (REF_RAM), a share with '+SIZE'
    for the processes' own memory ('ref+768M'), or 'none' (None: no budget)."""
    t = str(text).strip().upper().replace(" ", "")
    if t in ("NONE", "OFF"):
        return None
    head, plus, tail = t.partition("+")
    own = _ram_size(tail, what, text) if plus else 0
    share, said = 0.0, ""
    if head == "REF":
        share, said = REF_RAM[0] / REF_RAM[1], f"{REF_RAM[0]}/{REF_RAM[1]}"
    elif head.endswith("%"):
        try:
            share, said = float(head[:-1]) / 100, head
        except ValueError:
            share = float("nan")
    elif "/" in head:
        a, _, b = head.partition("/")
        share, said = (int(a) / int(b), head) if a.isdigit() and b.isdigit() and int(b) else (float("nan"), "")
    else:
        if plus:
            raise UsageError(f"{what} {text!r}: '+SIZE' adds to a share of the model (ref+768M); {RAM_HELP}")
        return RamSpec(str(text).strip(), size=_ram_size(head, what, text))
    if not share > 0 or share == float("inf"):
        raise UsageError(f"{what} {text!r}: {RAM_HELP}")
    return RamSpec(str(text).strip(), share=share, share_text=said, own=own)


def ram_bytes(spec: RamSpec, model_bytes: int = 0, what: str = "--ram") -> int:
    """The budget in bytes: the size, or the share of `model_bytes` plus the allowance."""
    if not spec.needs_model:
        return spec.size
    if model_bytes <= 0:
        raise UsageError(f"{what} {spec.text}: a share of the model's bytes needs the model: give --ram-of with the "
                         "model's file or folder, or its size (e.g. --ram-of 518G)")
    return int(spec.share * model_bytes) + spec.own


def ram_text(limit: int, spec: str, model_bytes: int) -> str:
    """The budget in words: 'RAM budget 821.4 MiB = 128/518 of the model's 216.3 MiB (53.4 MiB) +
    768.0 MiB for the processes' own memory'; 'no RAM budget'."""
    if limit <= 0:
        return "no RAM budget"
    parsed = parse_ram(spec) if spec else None
    if parsed is None or not parsed.needs_model or model_bytes <= 0:
        return f"RAM budget {format_bytes(limit)}"
    said = f"RAM budget {format_bytes(limit)} = {parsed.share_text} of the model's {format_bytes(model_bytes)}"
    if not parsed.own:
        return said
    return (f"{said} ({format_bytes(int(parsed.share * model_bytes))}) + {format_bytes(parsed.own)} for the processes' "
            "own memory")


# ---- which controller ------------------------------------------------------------------------

@dataclass(frozen=True)
class Controller:
    """The block I/O controller a testbed uses: `kind` v1 or v2, `mount` its hierarchy's root."""

    kind: str
    mount: str


def cgroup_mounts(proc_mounts: str) -> tuple[str | None, str | None]:
    """(the cgroup2 mount, the cgroup-v1 mount carrying blkio) from /proc/mounts' text."""
    v2 = v1 = None
    for line in proc_mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        where, fstype, options = unescape_mount(parts[1]), parts[2], parts[3].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = where
        elif fstype == "cgroup" and "blkio" in options and v1 is None:
            v1 = where
    return v2, v1


def v1_mount(proc_mounts: str, controller: str) -> str | None:
    """Where the cgroup-v1 hierarchy carrying `controller` is mounted, from /proc/mounts' text."""
    for line in proc_mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and controller in parts[3].split(","):
            return unescape_mount(parts[1])
    return None


def choose_memory(v2_mount: str | None, v2_controllers: str, v1_memory: str | None) -> tuple[Controller | None, str]:
    """The memory controller that holds a testbed to its RAM budget, and a line saying which or why
    none: v2 where the unified hierarchy offers `memory`, else the v1 memory hierarchy."""
    if v2_mount and "memory" in v2_controllers.split():
        return Controller(V2, v2_mount), f"cgroup v2 memory controller at {v2_mount}"
    if v1_memory:
        return Controller(V1, v1_memory), f"cgroup v1 memory controller at {v1_memory}"
    v2 = f"the unified hierarchy at {v2_mount} has no memory controller" if v2_mount else "no cgroup2 mount"
    return None, f"no memory controller ({v2}; no cgroup-v1 memory mount)"


def choose_controller(v2_mount: str | None, v2_controllers: str, v1_mount: str | None,
                      v1_has_throttle: bool) -> tuple[Controller | None, str]:
    """The controller to use and why: v2 `io` when the unified hierarchy offers it (its root's
    cgroup.controllers lists `io`), else v1 blkio with its throttle files; else None and the reason."""
    if v2_mount and "io" in v2_controllers.split():
        return Controller(V2, v2_mount), f"cgroup v2 io controller at {v2_mount}"
    if v1_mount and v1_has_throttle:
        return Controller(V1, v1_mount), f"cgroup v1 blkio throttle at {v1_mount}"
    reasons = []
    reasons.append(f"the unified hierarchy at {v2_mount} has no io controller" if v2_mount else "no cgroup2 mount")
    reasons.append(f"the blkio hierarchy at {v1_mount} has no throttle files (kernel without "
                   "CONFIG_BLK_DEV_THROTTLING)" if v1_mount else "no cgroup-v1 blkio mount")
    return None, "; ".join(reasons)


def cgroup_name(root: str) -> str:
    """The group's folder name: fixed prefix and a hash of the testbed's real path, so two
    testbeds never share a group and a group is recognisably ours."""
    return CGROUP_PREFIX + hashlib.sha1(root.encode()).hexdigest()[:10]


def v1_lines(majmin: str, limits: DriveLimits, clear: bool = False) -> list[tuple[str, str]]:
    """(file in the v1 blkio group, line to write) for each limit the drive has; with `clear`, also
    `MAJ:MIN 0` for each it has not: in v1 writing 0 removes the device's rule from that file (a
    limit lifted while the testbed is up must be written, or the old one stays in force)."""
    return [(fname, f"{majmin} {int(getattr(limits, attr) * scale)}")
            for attr, fname, scale in V1_FILES if clear or getattr(limits, attr) > 0]


# the memory group's highest use since it was last restarted (a write of 0 restarts it: v1 always,
# v2 on kernels that take one), per controller
PEAK_FILE = {V1: "memory.max_usage_in_bytes", V2: "memory.peak"}


def memory_line(kind: str, limit: int) -> tuple[str, str]:
    """(file in the memory group, what to write) for a RAM budget of `limit` bytes (0: none)."""
    if kind == V2:
        return "memory.max", str(limit) if limit > 0 else "max"
    return "memory.limit_in_bytes", str(limit) if limit > 0 else "-1"


def memory_use(kind: str, stat_text: str) -> tuple[int, int]:
    """(page cache, anonymous) bytes a memory group holds, from its memory.stat (v1: the totals
    over its subgroups where given)."""
    if kind == V2:
        keys = (("file",), ("anon",))
    else:
        keys = (("total_cache", "cache"), ("total_rss", "rss"))
    out = []
    for names in keys:
        out.append(next((v for n in names if (v := stat_value(stat_text, n)) is not None), 0))
    return out[0], out[1]


def v2_line(majmin: str, limits: DriveLimits) -> str:
    """The `io.max` line for a drive: every key given, `max` where there is no limit."""
    keys = [f"{key}={int(getattr(limits, attr) * scale) if getattr(limits, attr) > 0 else 'max'}"
            for attr, key, scale in V2_KEYS]
    return f"{majmin} {' '.join(keys)}"


# ---- what /proc and /sys say -----------------------------------------------------------------

def unescape_mount(text: str) -> str:
    """A path as /proc/mounts and mountinfo write it (space, tab, newline, backslash octal-escaped)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mounted_devices(mountinfo: str) -> dict[str, str]:
    """{mount point: maj:min of what is mounted there} from /proc/self/mountinfo's text (the last
    mount on a point wins, as it is the one seen)."""
    out: dict[str, str] = {}
    for line in mountinfo.splitlines():
        parts = line.split()
        if len(parts) >= 5:
            out[unescape_mount(parts[4])] = parts[2]
    return out


def backing_path(sysfs_text: str) -> str:
    """The image path in /sys/block/loopN/loop/backing_file (the kernel adds ' (deleted)' when
    the file is gone)."""
    text = sysfs_text.rstrip("\n")
    return text[:-len(" (deleted)")] if text.endswith(" (deleted)") else text


# ---- the state document ----------------------------------------------------------------------

@dataclass
class DriveState:
    """One drive as built so far: paths are set before anything is made, `device` and `majmin`
    once the loop device is attached, `mounted` once its file system is mounted. A drive paced by
    its service time also has `served`, the folder its daemon shows the image in (the loop
    device's backing file is the image there), `control`, the daemon's rates, and `daemon`, its
    pid once started."""

    name: str
    image: str
    mount: str
    limits: DriveLimits
    device: str = ""
    majmin: str = ""
    mounted: bool = False
    served: str = ""
    control: str = ""
    daemon: int = 0

    @property
    def backing(self) -> str:
        """The loop device's backing file: the image, or its paced view."""
        return f"{self.served}/{self.image.rsplit('/', 1)[-1]}" if self.served else self.image

    @property
    def served_log(self) -> str:
        """Where the daemon of a paced drive writes (its start-up errors, what it served); "" otherwise."""
        return f"{self.served}.log" if self.served else ""


@dataclass
class RamState:
    """The testbed's RAM budget and the memory group that holds its processes to it. `controller`
    is v1 or v2, or "" where the machine has no memory controller (then no group, and `note` says
    why); `limit` is the budget in bytes (0: none), `spec` the --ram it came from and
    `model_bytes` what a share was taken of."""

    controller: str = ""
    cgroup: str = ""
    enabled_memory: bool = False    # v2: we added `memory` to the parent's subtree_control
    limit: int = 0
    spec: str = ""
    model_bytes: int = 0
    note: str = ""

    def text(self) -> str:
        """The budget in words, or why there can be none."""
        if not self.controller:
            return f"no RAM budget ({self.note})" if self.note else "no RAM budget"
        return ram_text(self.limit, self.spec, self.model_bytes)


@dataclass
class TestbedState:
    """What a testbed made, written to <root>/testbed.json before and after every step, so that
    `down` can take apart a testbed left half-built by a crash. `phase` is building, up or down."""

    __test__ = False            # not a pytest class, whatever its name

    root: str
    controller: str
    cgroup: str
    size: int
    drives: list[DriveState]
    made_root: bool = False
    enabled_io: bool = False    # v2: we added `io` to the parent's subtree_control
    phase: str = "building"
    created: str = ""
    ram: RamState = field(default_factory=RamState)
    pacing: str = THROTTLE

    KIND: ClassVar[str] = STATE_KIND      # a result (core.results): `testbed up/show --json`, the file's shape
    SCHEMA: ClassVar[int] = STATE_SCHEMA

    def to_dict(self) -> dict:
        return state_to_doc(self)

    def drive(self, name: str) -> DriveState:
        for d in self.drives:
            if d.name == name:
                return d
        raise UsageError(f"no drive {name!r} in the testbed at {self.root}; drives are "
                         f"{', '.join(d.name for d in self.drives)}")


def new_state(root: str, controller: Controller, drives: tuple[DriveLimits, ...], size: int, made_root: bool,
              created: str, memory: Controller | None = None, memory_note: str = "",
              pacing: str = THROTTLE) -> TestbedState:
    """The plan of a testbed at `root` (a real path): images are hidden files in it, mount points
    are named after the drives, the groups live under their controllers' mounts (one group where
    both are on the unified hierarchy); paced by service time, each drive's daemon shows its
    image in a hidden folder beside it and reads its rates from a hidden file."""
    if pacing not in PACINGS:
        raise UsageError(f"--pacing {pacing!r}: not one of {', '.join(PACINGS)}")
    name = cgroup_name(root)
    ram = (RamState(memory.kind, f"{memory.mount.rstrip('/')}/{name}", note=memory_note) if memory
           else RamState(note=memory_note))
    served = pacing == SERVICE
    return TestbedState(root=root, controller=controller.kind, cgroup=f"{controller.mount.rstrip('/')}/{name}",
                        size=size, made_root=made_root, created=created, ram=ram, pacing=pacing,
                        drives=[DriveState(d.name, f"{root}/.{d.name}.img", f"{root}/{d.name}", d,
                                           served=f"{root}/.{d.name}.served" if served else "",
                                           control=f"{root}/.{d.name}.pace.json" if served else "")
                                for d in drives])


def state_to_doc(state: TestbedState) -> dict:
    doc = {"kind": STATE_KIND, "schema": STATE_SCHEMA}
    doc.update(asdict(state))
    for d in doc["drives"]:
        d.update(d.pop("limits"))      # flat: name, paths, device, then the limits
    return doc


def state_from_doc(doc: dict, where: str) -> TestbedState:
    """A TestbedState from a checked document (kind and schema already checked by the loader); a
    schema 1 document (before RAM budgets) has no memory group."""
    remedy = "it was not written by `iobench testbed up`; remove what it names by hand"
    try:
        drives = [DriveState(d["name"], d["image"], d["mount"],
                             DriveLimits(d["name"], float(d["read_mbs"]), float(d["write_mbs"]), float(d["read_iops"]),
                                         float(d["write_iops"])),
                             str(d["device"]), str(d["majmin"]), bool(d["mounted"]), str(d.get("served", "")),
                             str(d.get("control", "")), int(d.get("daemon", 0))) for d in doc["drives"]]
        if doc.get("schema") == 1:
            ram = RamState(note="built before RAM budgets")
        else:
            r = doc["ram"]
            ram = RamState(str(r["controller"]), str(r["cgroup"]), bool(r["enabled_memory"]), int(r["limit"]),
                           str(r["spec"]), int(r["model_bytes"]), str(r["note"]))
        state = TestbedState(root=str(doc["root"]), controller=str(doc["controller"]), cgroup=str(doc["cgroup"]),
                             size=int(doc["size"]), drives=drives, made_root=bool(doc["made_root"]),
                             enabled_io=bool(doc["enabled_io"]), phase=str(doc["phase"]), created=str(doc["created"]),
                             ram=ram, pacing=str(doc.get("pacing", THROTTLE)))
    except (KeyError, TypeError, ValueError) as e:
        raise RigError(f"{where}: testbed state is missing or has a bad field ({e}); {remedy}") from None
    ours = (lambda group: group.rsplit("/", 1)[-1].startswith(CGROUP_PREFIX))   # noqa: E731
    if (state.controller not in (V1, V2) or not ours(state.cgroup) or state.ram.controller not in ("", V1, V2)
            or bool(state.ram.controller) != bool(state.ram.cgroup) or (state.ram.cgroup and not ours(state.ram.cgroup))):
        raise RigError(f"{where}: testbed state names a group {state.cgroup!r} / {state.ram.cgroup!r} that is not a "
                       f"testbed's; {remedy}")
    if state.pacing not in PACINGS or any(bool(d.served) != (state.pacing == SERVICE) for d in drives):
        raise RigError(f"{where}: testbed state has an unknown pacing {state.pacing!r} or drives that do not match "
                       f"it; {remedy}")
    inside = [p for d in drives for p in (d.image, d.mount, d.served, d.control) if p and p.rsplit("/", 1)[0] != state.root]
    if inside:
        raise RigError(f"{where}: testbed state names paths outside its folder ({', '.join(inside)}); {remedy}")
    return state


def state_text(state: TestbedState) -> str:
    return json.dumps(state_to_doc(state), indent=1) + "\n"
