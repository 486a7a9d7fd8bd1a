"""What `replicas sync` reads from the disk before a byte is written (docs/replicas.md): the model
SOURCE names and what the rig already trusts about it; per destination, where the model ends up
and is built, what is at each file's name, what an interrupted copy left, which files the model
does not have; free space per file system for everything still to write. What these facts mean
is decided in `syncplan` (pure); `sync` carries the plan out.
"""

from __future__ import annotations

import os

from core import rig as rigmod
from core.errors import MissingError, UsageError, WriteError
from core.events import Notice, Reporter, emit
from core.fsutil import FileIdentity, allocated_bytes, free_bytes, inside, require_file

from .constants import PARTIAL_SUFFIX
from core.drives import drive_of
from models.formats import RAW, SPLIT_NAME, sniff
from .journal import journal_header, read_journal
from .manifest import Manifest
from .manifests import load_manifest
from models.modelset import DIR, SPLIT, ModelSet, NotAModel, check_outside_members, discover, from_rig, one_file
from .records import load_verdicts
from .stamps import VERIFIED, stamp_state
from .syncplan import (
    RESTART_REASON,
    SKIP,
    DestPlan,
    ExistingTarget,
    PartialState,
    SetPlan,
    check_space,
    drive_clash,
    extra_files,
    partial_plan,
    set_space_needed,
    target_plan,
)
from .verdict import standing_mismatch

__all__ = ["source_model", "trusted_manifests", "plan_destinations", "check_free_space", "drive_key", "SOURCE_FIX"]

SOURCE_FIX = "give the model's file, a member of its split set, or its directory"


# ---------------------------------------------------------------------------------------------
# The model to copy, and what is already trusted about it.

def source_model(source: str, rig: rigmod.Rig) -> ModelSet:
    """The model SOURCE names (a file, any member of a split set, a directory). A file whose
    bytes are no known format is copied as opaque bytes (raw), as sync always did; a rig that
    has a model allows only that model (SOURCE is it or a replica of it) and its file list."""
    rig_model = from_rig(rig)
    raw = rig_model is not None and rig_model.format == RAW
    if not os.path.lexists(source):
        raise MissingError(f"source {source}: no such file or directory; {SOURCE_FIX}")
    if os.path.isfile(source):
        require_file(source, "source", SOURCE_FIX)
        found = one_file(source, RAW) if raw or sniff(source) is None else discover(source)
    else:
        try:
            found = discover(source, RAW if raw else None)
        except NotAModel as e:
            raise NotAModel(e.what, f"to replicate it as opaque bytes, name it first with "
                                    f"`replicas init --model {source} --format raw`") from None
    if rig_model is None:
        return found
    if os.path.realpath(found.path) not in {os.path.realpath(m.path) for m in rig.members}:
        raise UsageError(f"the rig at {rig.root} holds model {rig.model.path}; sync from it (or a replica), "
                         f"or use another --rig for {source}")
    return rig_model.at(found.path) if rig.format else found


def trusted_manifests(rig: rigmod.Rig, model: ModelSet) -> dict[str, Manifest | None]:
    """Per file, the rig's manifest of it when the source file's stamp still vouches for it."""
    saved = load_manifest(rig, required=False)
    trusted: dict[str, Manifest | None] = {}
    for rel, path in zip(model.files, model.paths):
        try:
            m = saved.file(rel) if saved is not None else None
        except KeyError:
            m = None
        trusted[rel] = m if m is not None and stamp_state(path, m, rig) == VERIFIED else None
    return trusted


# ---------------------------------------------------------------------------------------------
# Planning: the facts about each destination, read before a byte is written.

def plan_destinations(model: ModelSet, dest_dirs: list[str], rig: rigmod.Rig, manifests: dict[str, Manifest | None],
                      idents: dict[str, FileIdentity], *, piece_size: int, replace_existing: bool,
                      allow_same_device: bool, report: Reporter = None,
                      holds: dict[str, tuple[str, ...]] | None = None) -> list[SetPlan]:
    """One SetPlan per destination (refusing a bad one with the fix); `holds`: per destination
    directory, the files a partial replica there holds (the others are not-held, never touched)."""
    try:
        src_key = drive_of(model.path).disk_key
    except OSError:
        src_key = None
    member_keys = {}
    for m in rig.members:
        if os.path.realpath(m.path) != os.path.realpath(model.path) and os.path.exists(m.path):
            member_keys[os.path.realpath(m.path)] = drive_of(m.path).disk_key
    plans, seen_keys, seen_targets = [], {}, set()
    for d in dest_dirs:
        if not os.path.exists(d):
            raise MissingError(f"destination {d}: no such directory (drive not mounted?); mount it or fix the path")
        if not os.path.isdir(d):
            raise UsageError(f"destination {d}: not a directory; give the directory to copy into")
        if not os.access(d, os.W_OK | os.X_OK):    # a write that cannot succeed: exit 4, as the README says
            raise WriteError(f"destination {d}: not writable (permissions or a read-only mount); check its "
                             "permissions or mount options")
        final = model.in_dir(d)
        if os.path.realpath(final.path) == os.path.realpath(model.path):
            raise UsageError(f"destination {d} is the source's own directory; choose another drive")
        check_outside_members(d, model, rig, f"destination {d}")
        if inside(model.path, final.path):
            raise UsageError(f"destination {d}: its copy {final.path} would hold the source {model.path}; choose another "
                             "folder")
        if os.path.realpath(final.path) in seen_targets:
            raise UsageError(f"destination {d} is given twice")
        seen_targets.add(os.path.realpath(final.path))
        key = drive_of(d).disk_key         # two partitions of one disk are one drive
        if not allow_same_device:
            clash = drive_clash(key, src_key, seen_keys, member_keys, os.path.realpath(final.path), model.path)
            if clash:
                raise UsageError(f"destination {d} is on the same physical drive as {clash} ({key}); a replica there "
                                 "adds no bandwidth — use --allow-same-device to copy anyway")
        seen_keys[key] = d
        plans.append(_plan_set(model, final, d, rig, manifests, idents, piece_size, replace_existing, report,
                               (holds or {}).get(d)))
    return plans


def _plan_set(model, final, d, rig, manifests, idents, piece_size, replace_existing, report, holds=None) -> SetPlan:
    staging, work = "", final
    if model.layout == DIR:
        if os.path.lexists(final.path):
            if os.path.islink(final.path) or not os.path.isdir(final.path):
                raise UsageError(f"{final.path} exists and is not a directory; move it away")
        else:
            # A new directory model is built under a temporary name (docs/replicas.md).
            staging = final.path + PARTIAL_SUFFIX
            if os.path.lexists(staging) and (os.path.islink(staging) or not os.path.isdir(staging)):
                raise UsageError(f"{staging} exists and is not a directory; it was not made by replicas — move it away")
            work = model.at(staging)
    files = []
    for rel, source in zip(model.files, model.paths):
        target = work.abs(rel)
        if holds is not None and rel not in holds:
            files.append(DestPlan(os.path.dirname(target), target, SKIP))
            continue
        files.append(_plan_one(source, idents[rel], os.path.dirname(target), target, rig, manifests[rel], piece_size,
                               replace_existing, report))
    return SetPlan(d, final.path, tuple(files), model.files, staging, extra_files(model.files, _tree(model, work)))


def _tree(model: ModelSet, work: ModelSet) -> list[str]:
    """What is in a destination's model tree now: every file under a directory model; the split
    set's name pattern among a split set's siblings; nothing for one file (its directory is the
    drive's, not the model's)."""
    if model.layout == DIR:
        found = []
        for dirpath, dirnames, filenames in os.walk(work.root):
            for n in filenames + [x for x in dirnames if os.path.islink(os.path.join(dirpath, x))]:
                found.append(os.path.relpath(os.path.join(dirpath, n), work.root).replace(os.sep, "/"))
        return found
    if model.layout == SPLIT:
        prefix = SPLIT_NAME.match(model.files[0])["prefix"]
        try:
            names = os.listdir(work.root)
        except OSError:
            return []
        return [n for n in names if (m := SPLIT_NAME.match(n.removesuffix(".partial.journal").removesuffix(".partial")))
                and m["prefix"] == prefix]
    return []


def _existing(target: str, manifest: Manifest | None, rig: rigmod.Rig) -> ExistingTarget | None:
    if not os.path.lexists(target):
        return None
    regular = os.path.isfile(target) and not os.path.islink(target)
    if not regular:
        return ExistingTarget(regular=False, size=0, verified=False)
    # A stamp older than a mismatch verify found is not trusted: the file is read again.
    verified = (manifest is not None and stamp_state(target, manifest, rig) == VERIFIED
                and not standing_mismatch(load_verdicts(rig).get(target), manifest))
    return ExistingTarget(regular=True, size=os.path.getsize(target), verified=verified)


def _plan_one(source, src_ident, d, target, rig, manifest, piece_size, replace_existing, report) -> DestPlan:
    plan = target_plan(d, target, _existing(target, manifest, rig), src_ident.size, replace_existing)
    if not plan.writes or not os.path.exists(plan.partial):
        return plan
    header, durable = read_journal(plan.journal)
    plan = partial_plan(plan, PartialState(ours=header is not None,
                                           same_source=header == journal_header(source, src_ident, piece_size),
                                           durable=frozenset(durable)))
    if plan.reason == RESTART_REASON:
        emit(report, Notice(target, "source or piece size changed since the interrupted copy: starting over"))
    return plan


def free_space(path: str) -> int | None:
    """Free bytes where `path` lives; None when its file system reports no size at all
    (statvfs f_blocks == 0: ramfs, some network and FUSE mounts)."""
    if os.statvfs(path).f_blocks == 0:
        return None
    return free_bytes(path)


def drive_key(path: str) -> str:
    try:
        return drive_of(path).key
    except OSError:
        return "path:" + path


def check_free_space(plans: list[SetPlan], sizes: dict[str, int], report: Reporter = None) -> None:
    """WriteError unless every file system holding writing destinations has room for every file
    still to write there (with headroom), before a byte is written; one notice per file system
    whose free space is unknown."""
    by_fs: dict[int, list[SetPlan]] = {}
    for sp in plans:
        if sp.writes:
            by_fs.setdefault(os.stat(sp.dest_dir).st_dev, []).append(sp)
    for group in by_fs.values():
        need = sum(set_space_needed((sizes[rel], allocated_bytes(p.partial)) for rel, p in zip(sp.rels, sp.files)
                                    if p.writes) for sp in group)
        notice = check_space([sp.dest_dir for sp in group], need, free_space(group[0].dest_dir))
        if notice:
            emit(report, Notice(", ".join(sp.dest_dir for sp in group), notice, warning=True))


