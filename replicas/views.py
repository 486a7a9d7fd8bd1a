"""What verify, repair and status show: their --json documents and their tables (Rich markup),
built from the results; the CLI only prints them. For a model of several files each member is a
roll-up with the keys a one-file model always had, plus one entry per file; the tables stay one
row per member, with a row under it for each file that is not as it should be."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

from rich.markup import escape
from rich.table import Table

from core.results import Document
from core.topology import Topology, topology_lines, topology_to_dict
from core.units import format_bytes, format_rate, plural

from .constants import MANIFEST_SCHEMA
from .verdict import MISMATCH, mismatch_text, verdict_to_dict

if TYPE_CHECKING:     # the results' types, named in annotations only: each command imports its own
    from .checks import FileCheck, MemberCheck, VerifyReport
    from .checksums import CheckResult
    from .manifest import ModelManifest
    from .repair import RepairResult
    from .status import MemberStatus


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def piece_json(b) -> dict:
    return {"index": b.index, "offset": b.offset, "length": b.length}


def one_blake3(manifest: ModelManifest | None) -> str | None:
    """The model's BLAKE3 when it is one file (what b3sum prints for it); None for several."""
    return manifest.files[0].blake3 if manifest is not None and len(manifest.files) == 1 else None


def _styled(state: str, extra: str = "") -> str:
    style = {"identical": "green", "verified": "green", "mismatch": "red", "broken": "red", "missing": "red",
             "gone": "blue"}.get(state, "yellow")
    return f"[{style}]{state}[/]" + (f" ({extra})" if extra else "")


def _listed(files, good: str):
    """The files to show under their member: those not in the good state, unless every file shares
    one state (a drive unplugged, a model never verified): the member's count says it then."""
    states = {f.state for f in files}
    return [] if len(states) == 1 else [f for f in files if f.state != good]


def _count(files, state: str) -> str:
    """'2 of 12 files' in that state; '' for the good state."""
    n = sum(f.state == state for f in files)
    return "" if state in ("identical", "verified") else f"{n} of {len(files)} files"


# ---------------------------------------------------------------------------------------------
# The commands' results (core.results): what each prints with --json.

@dataclass(frozen=True)
class InitView:
    """`replicas init`: the rig and the model it names."""

    rig: str
    path: str
    name: str
    layout: str
    format: str
    files: tuple[str, ...]

    KIND: ClassVar[str] = "init"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "files": list(self.files)}


class ManifestView(Document):
    """`replicas hash --json FILE`: the file's (or model's) manifest, plus `path`; `verify
    --manifest` reads it back."""

    KIND: ClassVar[str] = "manifest"
    SCHEMA: ClassVar[int] = MANIFEST_SCHEMA


@dataclass(frozen=True)
class HashesView:
    """`replicas hash --json A B ...`: one manifest per argument hashed."""

    manifests: tuple[dict, ...]

    KIND: ClassVar[str] = "hashes"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return {"manifests": list(self.manifests)}


@dataclass(frozen=True)
class CheckView:
    """`replicas hash --check --json`: each file a check file names, OK or not."""

    files: tuple[CheckResult, ...]

    KIND: ClassVar[str] = "check"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return {"failed": sum(not r.ok for r in self.files), "files": [dataclasses.asdict(r) for r in self.files]}


@dataclass(frozen=True)
class VerifyView:
    """`replicas verify`: the report against the manifest it checked."""

    report: VerifyReport
    manifest: ModelManifest
    manifest_file: str | None
    mode: str
    upstream: dict | None = None     # --upstream: member path -> UpstreamCheck

    KIND: ClassVar[str] = "verify"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        doc = verify_doc(self.report, self.manifest, self.manifest_file, self.mode)
        if self.upstream is not None:
            doc["upstream"] = {path: {"state": c.state, "problems": list(c.problems), "files_hashed": c.checked,
                                      "own_pass_bytes": c.bytes_read} for path, c in self.upstream.items()}
        return doc


@dataclass(frozen=True)
class RepairView:
    """`replicas repair`."""

    result: RepairResult

    KIND: ClassVar[str] = "repair"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return repair_doc(self.result)


@dataclass(frozen=True)
class StatusView:
    """`replicas status`: a row per member (and file)."""

    root: str
    layout: str
    format: str
    manifest: ModelManifest | None
    rows: Sequence[MemberStatus]
    topology: Topology | None = None     # what the members' drives share (None: not read)

    KIND: ClassVar[str] = "status"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return status_doc(self.root, self.layout, self.format, self.manifest, list(self.rows), self.topology)


# ---------------------------------------------------------------------------------------------
# verify

def file_check_json(f: FileCheck) -> dict:
    return {"file": f.file, "path": f.path, "state": f.state, "how": f.how, "bad": [piece_json(b) for b in f.bad],
            "size": f.size, "bytes_read": f.bytes_read, "seconds": f.seconds, "detail": f.detail,
            "stamped": f.stamped, "pieces_checked": f.pieces_checked, "parsed": f.parsed or None, "parses": f.parses}


def member_check_json(m: MemberCheck) -> dict:
    """A member's roll-up (the keys a one-file verify always had; bad pieces name their file) and
    every file's check."""
    return {"path": m.path, "name": m.name, "role": m.role, "state": m.state, "how": m.how,
            "bad": [{"file": b.file, **piece_json(b)} for b in m.bad], "size": m.size, "bytes_read": m.bytes_read,
            "seconds": m.seconds, "detail": m.detail, "stamped": m.stamped, "pieces_checked": m.pieces_checked,
            "files": [file_check_json(f) for f in m.files]}


def verify_doc(rep: VerifyReport, manifest: ModelManifest, manifest_file: str | None, mode: str) -> dict:
    return {"schema": 1, "kind": "verify", "manifest_blake3": one_blake3(manifest), "model_digest": manifest.digest(),
            "layout": manifest.layout, "manifest_file": manifest_file, "mode": mode,
            "sample_seed": rep.sample_seed, "seconds": round(rep.seconds, 3), "exit_code": rep.exit_code,
            "members": [member_check_json(m) for m in rep.members]}


def _check_cells(c) -> tuple[str, str, str]:
    """read, rate and note of a member's or a file's check."""
    rate = format_rate(c.bytes_read / c.seconds) if c.bytes_read and c.seconds else ""
    note = c.detail or (plural(len(c.bad), "bad piece") if c.bad else "") or (f"stamped ({c.stamped})" if c.stamped else "")
    return format_bytes(c.bytes_read), rate, note


def verify_table(rep: VerifyReport, manifest: ModelManifest, manifest_file: str | None, mode: str) -> Table:
    ident = f"{(one_blake3(manifest) or manifest.digest())[:16]}…"
    t = Table(title=f"verify ({mode}) against " + (f"{manifest_file} ({ident})" if manifest_file else ident))
    for col in ("member", "path", "state", "how", "read", "rate", "note"):
        t.add_column(col)
    several = len(manifest.files) > 1
    for m in rep.members:
        read, rate, note = _check_cells(m)
        if several:     # the files' own notes are on their rows
            note = plural(len(m.bad), "bad piece") if m.bad else (f"stamped ({m.stamped})" if m.stamped else "")
        t.add_row(m.name, m.path, _styled(m.state, _count(m.files, m.state) if several else ""), m.how, read, rate, note)
        for f in _listed(m.files, "identical") if several else ():
            t.add_row("", f"  {f.file}", _styled(f.state), f.how, *_check_cells(f))
    return t


def verify_problems(rep: VerifyReport) -> list[str]:
    """One line per bad piece and, for a model of several files, per missing or unreadable
    file, each naming the file's full path (stderr)."""
    lines = []
    for m in rep.members:
        for f in m.files:
            if f.state in ("missing", "unreadable") and len(m.files) > 1 or f.state == "broken":
                lines.append(f"{f.path}: {f.state}: {f.detail}")
            lines += [f"{f.path}: bad piece {b.index} at byte {b.offset}, {b.length} bytes" for b in f.bad]
    return lines


# ---------------------------------------------------------------------------------------------
# repair

def repair_doc(res: RepairResult) -> dict:
    return {"schema": 1, "kind": "repair", "path": res.path, "donor": res.donor, "bytes_copied": res.bytes_copied,
            "repaired": [{"file": b.file, **piece_json(b)} for b in res.repaired],
            "restored": list(res.restored), "after": res.after.state,
            "files": [{"file": f.file, "path": f.path, "after": f.state} for f in res.after.files],
            "seconds": round(res.seconds, 3)}


def repair_text(res: RepairResult) -> tuple[str, list[str]]:
    """The result line (stdout) and a line per file still not identical (stderr)."""
    if not res.repaired and not res.restored and res.after.state == "identical":
        return f"{res.path}: already identical; nothing to repair", []
    if not res.repaired and not res.restored:     # e.g. broken: the same bytes in every copy
        return f"{res.path}: nothing a re-copy can mend; {res.after.state}", [
            f"{f.path}: {f.state}" + (f": {f.detail}" if f.detail else "") for f in res.after.files if f.state != "identical"]
    what = [f"re-copied {plural(len(res.repaired), 'piece')}"] if res.repaired or not res.restored else []
    what += [f"restored {plural(len(res.restored), 'missing file')}"] if res.restored else []
    # A model of several files: the files that were mended, by their own paths (the member's path
    # is a split set's first file, which may not be one of them).
    touched = {b.file for b in res.repaired} | set(res.restored)
    where = [f.path for f in res.after.files if f.file in touched] if len(res.after.files) > 1 else []
    line = (f"{', '.join(where) or res.path}: {' and '.join(what)} ({format_bytes(res.bytes_copied)}) from {res.donor}; "
            + (f"{res.path} now {res.after.state}" if where else f"now {res.after.state}"))
    return line, [f"{f.path}: still {f.state}" + (f": {f.detail}" if f.detail else "")
                  for f in res.after.files if f.state != "identical"]


# ---------------------------------------------------------------------------------------------
# status

def member_status_json(x: MemberStatus) -> dict:
    """A member's row (the keys a one-file status always had) and every file's."""
    doc = {k: v for k, v in dataclasses.asdict(x).items() if k not in ("verdict", "files")}
    return {**doc, "verdict": verdict_to_dict(x.verdict) if x.verdict else None,
            "files": [{"file": f.file, "path": f.path, "size": f.size, "state": f.state,
                       "last_verified": f.last_verified,
                       "verdict": verdict_to_dict(f.verdict) if f.verdict else None} for f in x.files]}


def status_doc(root: str, layout: str, fmt: str, manifest: ModelManifest | None, rows: list[MemberStatus],
               topology: Topology | None = None) -> dict:
    return {"schema": 1, "kind": "status", "rig": root, "manifest_blake3": one_blake3(manifest),
            "model_digest": manifest.digest() if manifest else None,
            "layout": manifest.layout if manifest else layout, "format": (manifest.format if manifest else "") or fmt,
            "members": [member_status_json(x) for x in rows],
            "topology": topology_to_dict(topology) if topology is not None else None}


def topology_text(topology: Topology) -> str:
    """What the members' drives share, one line each (nothing for a rig of one drive)."""
    if len(topology.drives) < 2:
        return ""
    return "".join(f"{line}\n" for line in topology_lines(topology))


def _status_text(x, extra: str = "") -> str:
    if x.state == MISMATCH and x.verdict is not None:
        return f"[red]{mismatch_text(x.verdict, when(x.verdict.at))}[/]" + (f" ({extra})" if extra else "")
    return _styled(x.state, extra) if x.state != "unverified" else x.state + (f" ({extra})" if extra else "")


def _when_or_never(t: float | None) -> str:
    return when(t) if t else "never"


def status_table(root: str, manifest: ModelManifest | None, rows: list[MemberStatus]) -> Table:
    if manifest:
        n = f", {plural(len(manifest.files), 'file')}" if len(manifest.files) > 1 else ""
        one = one_blake3(manifest)
        title = f" — model {format_bytes(manifest.size)}{n}, " + (f"BLAKE3 {one[:16]}…" if one else f"digest "
                                                                                                    f"{manifest.digest()[:16]}…")
    else:
        title = " — no manifest yet"
    # Six columns that fit 80 terminal columns: the name and its role, the drive's mount point,
    # file system and device as words that wrap, and a path folded rather than cut to "/…" (a
    # pipe gets every row on one line, see core.cli). A state never wraps inside a word.
    t = Table(title=f"rig {root}" + title)
    t.add_column("member", overflow="fold")
    t.add_column("path", overflow="fold")
    t.add_column("drive", overflow="fold")
    t.add_column("size", no_wrap=True, justify="right")
    t.add_column("state", min_width=10)
    t.add_column("last full verify")
    for x in rows:
        several = len(x.files) > 1
        extra = _count(x.files, x.state) if several else ""
        if x.state == "gone":
            extra = ", ".join(e for e in (extra, "RAM, emptied at reboot: `replicas sync` restores it") if e)
        of = len(manifest.files) if manifest else "?"
        role = x.role if x.holds is None else f"{x.role}, partial: {len(x.holds)} of {of} files"
        t.add_row(f"{escape(x.name)} [dim]({role})[/]", x.path,
                  f"{x.mount_point} {x.fs_type}{' (RAM)' if x.memory else ''} {x.device} ({x.disk})",
                  format_bytes(x.size) if x.size is not None else "—",
                  _status_text(x, extra), _when_or_never(x.last_verified))
        for f in _listed(x.files, "verified") if several else ():
            t.add_row("", f"  {f.file}", "", format_bytes(f.size) if f.size is not None else "—",
                      _status_text(f), _when_or_never(f.last_verified))
    return t


def partial_lines(choices) -> list[str]:
    """`sync --partial`: per destination, what it holds and what that is predicted to buy."""
    lines = []
    for c in choices:
        pct = 100 * c.bytes / c.model_bytes if c.model_bytes else 0.0
        line = (f"partial {c.dest}: {len(c.holds)} shard(s), {format_bytes(c.bytes)} of {format_bytes(c.model_bytes)} "
                f"({pct:.0f} %, budget {format_bytes(c.budget)}, stopped: {c.stop}); carries {100 * c.coverage_held:.1f} % "
                f"of the held-out miss bytes ({100 * c.coverage_rank:.1f} % of the ranked)")
        if c.share is not None:
            line += f"; bandwidth share {100 * c.share:.1f} %"
        if c.gain is not None and c.gain_full is not None:
            line += f"; predicted gain +{100 * c.gain:.1f} % (a full replica: +{100 * c.gain_full:.1f} %)"
        lines.append(line)
        lines.append(f"  ranking: {c.history}")
    return lines
