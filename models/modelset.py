"""A model is one file or a set of files (docs/replicas.md): the noun, and finding it on disk.

Three layouts, one shape: a *path* (what an engine is pointed at) and the model's files relative
to a *root*.

| layout     | path                                | root            | files                          |
|------------|-------------------------------------|-----------------|--------------------------------|
| file       | the file                            | its directory   | its name                       |
| gguf-split | the set's first file (-00001-of-N)  | its directory   | every member's name, in order  |
| dir        | the directory                       | the directory   | every regular file under it    |

A replica of the model is the same files under another root, so one `ModelSet` describes every
member of a rig once its path is swapped (`at`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, replace

from core.errors import MissingError, RigError, UsageError
from core.fsutil import inside

from .formats import (
    FORMATS,
    GGUF,
    RAW,
    SAFETENSORS,
    SPLIT_NAME,
    gguf_split_fields,
    read_safetensors_header,
    sniff,
    split_name,
)

FILE, SPLIT, DIR = "file", "gguf-split", "dir"
LAYOUTS = (FILE, SPLIT, DIR)
HF_INDEX = "model.safetensors.index.json"


class NotAModel(UsageError):
    """Bytes that are no model format this project reads. Its message says only what the path is;
    a command that can take such bytes anyway (replicas' --format raw) says how, not this module:
    `NotAModel(e.what, its_fix)`."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what}; {fix}")
        self.what = what


@dataclass(frozen=True)
class ModelSet:
    path: str                  # absolute: the file, the split set's first file, or the directory
    layout: str                # FILE, SPLIT or DIR
    format: str                # GGUF, SAFETENSORS or RAW
    files: tuple[str, ...]     # relative to `root`, '/'-separated, in reading order

    @property
    def root(self) -> str:
        return self.path if self.layout == DIR else os.path.dirname(self.path)

    @property
    def name(self) -> str:
        """The name the model has in a destination directory (file, first member or directory);
        a Hugging Face cache snapshot (`models--ORG--NAME/snapshots/REV`) is named NAME, not by
        its revision's hash."""
        repo = hf_repository(self.path) if self.layout == DIR else None
        return os.path.basename(repo).split("--", 2)[-1] if repo else os.path.basename(self.path)

    @property
    def tree(self) -> str | None:
        """The folder that is the model's own (nothing else may be written in it, and its links
        may point only inside it): a directory model's folder, or a Hugging Face snapshot's
        repository folder (its blobs included); None for a file or a split set (their folder is
        the drive's)."""
        if self.layout != DIR:
            return None
        return hf_repository(self.path) or os.path.realpath(self.path)

    def abs(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self.abs(r) for r in self.files)

    def at(self, member_path: str) -> ModelSet:
        """The same model where another member keeps it (its file, first file or directory). A
        one-file model's replica may have another name than the primary: its file is its own."""
        path = os.path.abspath(member_path)
        if self.layout == FILE:
            return replace(self, path=path, files=(os.path.basename(path),))
        return replace(self, path=path)

    def in_dir(self, dest_dir: str) -> ModelSet:
        """The same model copied into `dest_dir` under its own name."""
        return self.at(os.path.join(os.path.abspath(dest_dir), self.name))


@dataclass(frozen=True)
class Extent:
    """A byte range of one of the model's files: what a read addresses (the same in every replica)."""

    file: str      # relative path, as in ModelSet.files
    offset: int    # bytes from the start of that file
    length: int    # bytes


def located_files(member_path: str, manifest) -> list[tuple[str, str, object]]:
    """(relative path, absolute path, that file's Manifest) for every file of the model a
    `ModelManifest` describes, where a member keeps it (`member_path`: its file, first file or
    directory). A one-file model is the member's file whatever name the manifest gives it."""
    if manifest.layout == FILE and len(manifest.files) == 1:
        f = manifest.files[0]
        return [(f.name or os.path.basename(member_path), os.path.abspath(member_path), f)]
    model = ModelSet(os.path.abspath(member_path), manifest.layout, manifest.format or RAW, manifest.names)
    return [(f.name, model.abs(f.name), f) for f in manifest.files]


def member_files(member, manifest) -> list[tuple[str, str, object]]:
    """`located_files` for the files a rig member (core.rig.Member) holds: every file, or a
    partial replica's own set (docs/replicas.md, "Partial replicas"). A file outside that set is
    not the member's: nothing checks, stamps, repairs or reports it there."""
    return [x for x in located_files(member.path, manifest) if member.holds_file(x[0])]


def one_file(path: str, fmt: str = RAW) -> ModelSet:
    path = os.path.abspath(path)
    return ModelSet(path, FILE, fmt, (os.path.basename(path),))


def from_rig(rig) -> ModelSet | None:
    """The rig's model as rig.toml describes it (no disk access); None before `replicas init`."""
    if rig.model is None:
        return None
    if rig.layout == FILE or not rig.files:
        return one_file(rig.model.path, rig.format or RAW)
    return ModelSet(rig.model.path, rig.layout, rig.format or RAW, tuple(rig.files))


def member_set(rig, member) -> ModelSet:
    """The model's files where `member` (primary or replica) keeps them."""
    model = from_rig(rig)
    return model.at(member.path) if model else one_file(member.path)


def check_outside_members(path: str, model: ModelSet, rig, what: str) -> None:
    """Refuse (exit 2) a place to write that lies inside the model's own folder or inside a
    member's copy of it (real paths, so a link or a Hugging Face snapshot's blobs count): a
    replica, a rig or a scratch file there changes the model it copies (its folder then holds
    twice the files)."""
    trees = [("the source model", model.tree)]
    for m in rig.members:
        if os.path.exists(m.path):
            trees.append((f"member '{m.name}'", member_set(rig, m).tree if rig.model is not None else None))
    for who, tree in trees:
        if tree and inside(path, tree):
            raise UsageError(f"{what} is inside {who}'s folder {tree}; writing there would change the model — "
                             "choose a folder outside it")


# ---------------------------------------------------------------------------------------------
# Finding a model on disk.

HF_PREFIXES = ("models--", "datasets--", "spaces--")


def hf_repository(path: str) -> str | None:
    """The repository folder of a Hugging Face cache snapshot (`REPO/snapshots/REV`, REPO named
    `models--ORG--NAME`, as `hf download` lays it out: each file a link into REPO/blobs), or None
    when `path` is no snapshot folder. Real paths: the snapshot may be reached through a link."""
    real = os.path.realpath(path)
    snapshots = os.path.dirname(real)
    repo = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.basename(repo).startswith(HF_PREFIXES):
        return repo
    return None


def _snapshot_of(path: str) -> str:
    """A Hugging Face cache repository folder (`models--ORG--NAME`, holding blobs/, refs/ and
    snapshots/) stands for the snapshot its refs/main names (what `hf download` last fetched); any
    other folder is itself. A repository whose refs/main names no snapshot is one line, listing them."""
    snapshots = os.path.join(path, "snapshots")
    if not os.path.basename(os.path.normpath(path)).startswith(HF_PREFIXES) or not os.path.isdir(snapshots):
        return path
    try:
        with open(os.path.join(path, "refs", "main"), encoding="utf-8") as f:
            rev = f.read().strip()
    except (OSError, UnicodeDecodeError):
        rev = ""
    if rev and os.sep not in rev and os.path.isdir(os.path.join(snapshots, rev)):
        return os.path.join(snapshots, rev)
    have = sorted(os.listdir(snapshots))
    raise UsageError(f"model {path}: a Hugging Face cache repository whose refs/main names no snapshot here; give one "
                     f"of its snapshots ({', '.join(os.path.join(snapshots, h) for h in have[:3]) or 'none'})")


def _followed(link: str, model_path: str, tree: str) -> os.stat_result:
    """The stat of the regular file a link inside a model directory points to. Followed only
    inside the model's own tree (a Hugging Face snapshot's links point into its repository's
    blobs/): a replica copies the bytes, and is made of regular files. Anything else is one line
    naming the link and where it points: exit 3 for a link that cannot be followed (a loop, a
    link to nowhere: a file of the model missing), 2 for one out of the model or to a folder."""
    rel = os.path.relpath(link, model_path)
    where = f"model directory {model_path}: {rel}"
    try:
        real = os.path.realpath(link, strict=True)
    except OSError as e:
        what = "a symbolic link loop" if e.errno == errno.ELOOP else f"a link to nowhere ({os.readlink(link)})"
        raise MissingError(f"{where} is {what}; replace it with the file it stands for, or remove it") from None
    if not inside(real, tree):
        raise UsageError(f"{where} is a symbolic link out of the model's folder (to {real}); a model's links may point "
                         "only inside it (as a Hugging Face snapshot's point into its blobs) — copy the file in, or remove "
                         "the link")
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{where} is a link to a folder or a special file ({real}); a model's links may point only to "
                         "its files — remove it")
    return st

def discover(path: str, fmt: str | None = None) -> ModelSet:
    """The model at `path`: a GGUF or safetensors file, any member of a split GGUF set (the whole
    set is taken), or a directory of model files. `fmt=RAW` accepts any file or directory as
    opaque bytes. Bad input: one line naming the path and the fix (MissingError exit 3, else 2)."""
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if not os.path.lexists(path):
        raise MissingError(f"model {path}: no such file or directory; give the model's file, a member of its split set, or "
                           "its directory")
    path = os.path.abspath(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        # The model itself may be reached through a link; it keeps the name it was given (a GGUF in
        # a Hugging Face snapshot is a link to blobs/<sha256>: its replica is named NAME.gguf).
        # A link to a folder, or to a file of a split set under another name, is taken where it points.
        try:
            real = os.path.realpath(path, strict=True)
        except OSError as e:
            what = "a symbolic link loop" if e.errno == errno.ELOOP else f"a link to nowhere ({os.readlink(path)})"
            raise MissingError(f"model {path}: {what}; give the model's file or directory") from None
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode) or (SPLIT_NAME.match(os.path.basename(path)) is None
                                         and SPLIT_NAME.match(os.path.basename(real)) is not None):
            path = real
    if stat.S_ISDIR(st.st_mode):
        return _directory(_snapshot_of(path), fmt)
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"model {path}: not a regular file or directory; give the model's file or directory")
    _readable(path)
    found = sniff(path)
    if fmt == RAW:
        return one_file(path, RAW)
    if found is None:
        raise NotAModel(f"model {path}: not a GGUF or safetensors file (its first bytes say neither)",
                        "give a model's GGUF or safetensors file, any file of its split set, or its directory")
    if fmt is not None and fmt != found:
        raise UsageError(f"model {path}: --format {fmt} given but the file is {found}")
    m = SPLIT_NAME.match(os.path.basename(path))
    if found == GGUF and m and int(m["count"]) > 1:
        return _split_set(path, m["prefix"], int(m["count"]))
    return one_file(path, found)


def _readable(path: str) -> None:
    if not os.access(path, os.R_OK):
        raise MissingError(f"model file {path}: not readable; check its permissions")


def _split_set(path: str, prefix: str, count: int) -> ModelSet:
    root = os.path.dirname(path)
    names = tuple(split_name(prefix, i, count) for i in range(1, count + 1))
    missing = [n for n in names if not os.path.isfile(os.path.join(root, n))]
    if missing:
        raise MissingError(f"split GGUF set {os.path.join(root, names[0])}: {len(missing)} of {count} files missing "
                           f"({', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}); download the whole set")
    for i, n in enumerate(names):
        p = os.path.join(root, n)
        _readable(p)
        fields = gguf_split_fields(p)
        if fields != (i, count):
            said = "no split.no / split.count" if fields is None else f"split.no={fields[0]}, split.count={fields[1]}"
            raise RigError(f"{p}: the name says part {i + 1} of {count} but its metadata has {said}; "
                           "the set is mixed up or renamed — re-download or re-split it")
    return ModelSet(os.path.join(root, names[0]), SPLIT, GGUF, names)


def _directory(path: str, fmt: str | None) -> ModelSet:
    files = []
    tree = hf_repository(path) or os.path.realpath(path)
    for dirpath, dirnames, filenames in os.walk(path):      # followlinks=False: a linked folder is refused, never walked
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                st = _followed(p, path, tree)      # read through; a replica holds the bytes
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"model directory {path}: {os.path.relpath(p, path)} is not a regular file "
                                 "(a fifo, socket or device); remove it from the model's directory")
            _readable(p)
            files.append(os.path.relpath(p, path).replace(os.sep, "/"))
    if not files:
        raise UsageError(f"model directory {path}: holds no files; give the model's directory")
    files.sort()
    if fmt == RAW:
        return ModelSet(path, DIR, RAW, tuple(files))
    kinds = {r: sniff(os.path.join(path, r)) for r in files}
    bad = [r for r in files if r.endswith(".safetensors") and kinds[r] != SAFETENSORS]
    if bad:
        raise RigError(f"model directory {path}: {bad[0]} is named .safetensors but is not one (truncated download?); "
                       "re-download it")
    found = SAFETENSORS if SAFETENSORS in kinds.values() else GGUF if GGUF in kinds.values() else None
    if found is None:
        raise NotAModel(f"model directory {path}: holds no GGUF or safetensors file",
                        "give a model's directory, GGUF or safetensors file")
    if fmt is not None and fmt != found:
        raise UsageError(f"model directory {path}: --format {fmt} given but its model files are {found}")
    if found == SAFETENSORS:
        _check_index(path, set(files))
        for r in files:
            if kinds[r] == SAFETENSORS:
                read_safetensors_header(os.path.join(path, r))
    return ModelSet(path, DIR, found, tuple(files))


def _check_index(path: str, files: set[str]) -> None:
    """Every shard `model.safetensors.index.json` names must be there (a partial download is refused)."""
    index = os.path.join(path, HF_INDEX)
    if HF_INDEX not in files:
        return
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise RigError(f"{index}: not a safetensors index ({e}); re-download it") from None
    shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
    missing = [s for s in shards if s not in files]
    if missing:
        raise MissingError(f"model directory {path}: {HF_INDEX} names {len(missing)} shard(s) that are not there "
                           f"({', '.join(missing[:3])}); finish the download")
