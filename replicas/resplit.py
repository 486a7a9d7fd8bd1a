"""Re-split a GGUF model one tensor per file, with llama.cpp's own split metadata (docs/replicas.md,
"One tensor per file").

llama.cpp reads a model through one mmap per file, so a drive can only be chosen per file; its
split loader takes `PREFIX-00001-of-0000N.gguf` and derives the others by name. A model in one
file or a few large splits is rewritten here as the set `llama-gguf-split --split
--split-max-tensors 1` would write (the layout is `models.ggufsplit`'s, pure): the first member
holds the model's metadata and its first tensor, every other member one tensor. Tensor bytes are
streamed from the source in IO_BLOCK pieces (never a whole tensor in RAM), each member is written
under a temporary name, fsynced, and only when every member is complete are they all renamed;
nothing that already exists in the destination is ever replaced. The source is opened read-only.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import ClassVar

from core.constants import IO_BLOCK
from core.errors import Interrupted, MissingError, UsageError, WriteError
from core.events import Progress, Reporter, emit
from core.fsutil import free_bytes, fsync_dir
from core.results import Document
from models.formats import GGUF
from models.ggufsplit import KV, Member, TensorEntry, plan_members, split_prefix
from models.modelset import FILE, SPLIT, ModelSet, discover
from models.tensortable import open_gguf

RESPLIT_SCHEMA = 1


class ResplitResult(Document):
    """What `resplit` wrote (kind "resplit")."""

    KIND: ClassVar[str] = "resplit"
    SCHEMA: ClassVar[int] = RESPLIT_SCHEMA


@dataclass(frozen=True)
class SplitSource:
    """A GGUF model's metadata (of its first file) and its tensors in file order."""
    model: ModelSet
    kvs: tuple[KV, ...]
    tensors: tuple[TensorEntry, ...]


def read_split_source(model: ModelSet) -> SplitSource:
    """The metadata pairs (exact bytes) and tensors of a GGUF file or split set, from headers only."""
    if model.format != GGUF or model.layout not in (FILE, SPLIT):
        raise UsageError(f"{model.path}: a {model.format} {model.layout} model; only a GGUF file or split GGUF set is "
                         "re-split (llama.cpp's format)")
    kvs: list[KV] = []
    tensors: list[TensorEntry] = []
    for i, (rel, path) in enumerate(zip(model.files, model.paths)):
        r = open_gguf(path)
        size = os.path.getsize(path)
        if i == 0:
            for key, field in r.fields.items():
                if key.startswith("GGUF."):           # the reader's names for the header's own numbers
                    continue
                n = sum(int(p.nbytes) for p in field.parts)
                kvs.append(KV(key, bytes(r.data[field.offset:field.offset + n])))
        for t in r.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise UsageError(f"{path}: truncated: tensor {t.name} ends at byte {end} but the file has {size}; "
                                 "re-copy the model")
            tensors.append(TensorEntry(t.name, tuple(int(x) for x in t.shape), int(t.tensor_type), int(t.n_bytes),
                                       rel, int(t.data_offset)))
        del r
    return SplitSource(model, tuple(kvs), tuple(tensors))


def _copy(src_fd: int, dst_fd: int, offset: int, length: int, buf: memoryview, on_block, cancel) -> None:
    """Copy `length` bytes at `offset` of src_fd to dst_fd's current position, one block at a time."""
    done = 0
    while done < length:
        if cancel is not None and cancel.is_set():
            raise Interrupted("resplit interrupted; the temporary files were removed, nothing was renamed")
        n = min(len(buf), length - done)
        got = os.preadv(src_fd, [buf[:n]], offset + done)
        if got != n:
            raise MissingError(f"the source ended early ({got} of {n} bytes at offset {offset + done}); it changed "
                               "while being read — re-run when it is complete")
        _write_all(dst_fd, buf[:n])
        done += n
        on_block(n)


def resplit(source: str, dest_dir: str, prefix: str | None = None, max_tensors: int = 1,
            report: Reporter = None, cancel: threading.Event | None = None) -> dict:
    """Write the GGUF model at `source` (a file, or any member of a split set) as a split set in
    `dest_dir` with `max_tensors` tensors per file (1: one tensor per file), named
    `PREFIX-%05d-of-%05d.gguf` (PREFIX: the source's name without `.gguf` and split suffix).
    Progress events (phase 'copy') go to `report`; `cancel` stops between blocks (Interrupted,
    temporary files removed). Returns the ResplitResult shape."""
    model = discover(source)
    src = read_split_source(model)
    prefix = prefix or split_prefix(model.name)
    if "/" in prefix or not prefix:
        raise UsageError(f"prefix {prefix!r}: a file name prefix, without '/'")
    try:
        members = plan_members(prefix, list(src.kvs), list(src.tensors), max_tensors)
    except ValueError as e:
        raise UsageError(f"{model.path}: {e}") from None
    dest_dir = os.path.abspath(dest_dir)
    if not os.path.isdir(dest_dir):
        raise UsageError(f"{dest_dir}: not a directory; create the destination folder first")
    taken = [m.name for m in members if os.path.lexists(os.path.join(dest_dir, m.name))]
    if taken:
        raise UsageError(f"{os.path.join(dest_dir, taken[0])}: already exists ({len(taken)} of the {len(members)} files); "
                         "a re-split never replaces a file: give an empty folder or another prefix")
    total = sum(m.size for m in members)
    if free_bytes(dest_dir) < total:
        raise WriteError(f"{dest_dir}: {free_bytes(dest_dir):,} B free, the set needs {total:,} B; free space or choose "
                         "another destination")
    tmps = [os.path.join(dest_dir, f"{m.name}.tmp-{os.getpid()}") for m in members]
    fds: dict[str, int] = {}
    buf = memoryview(bytearray(IO_BLOCK))
    done = 0
    renamed = 0

    def on_block(n: int) -> None:
        nonlocal done
        done += n
        emit(report, Progress(dest_dir, "copy", done, total))

    try:
        for rel, path in zip(model.files, model.paths):
            fds[rel] = os.open(path, os.O_RDONLY)
        for m, tmp in zip(members, tmps):
            _write_member(m, tmp, fds, buf, on_block, cancel)
        for m, tmp in zip(members, tmps):
            final = os.path.join(dest_dir, m.name)
            if os.path.lexists(final):
                raise UsageError(f"{final}: appeared while the set was written; nothing of it was replaced")
            os.rename(tmp, final)
            renamed += 1
        fsync_dir(dest_dir)
    except OSError as e:
        raise WriteError(f"{dest_dir}: writing the split set failed ({e.strerror or e}); check free space and "
                         "permissions") from None
    finally:
        for fd in fds.values():
            os.close(fd)
        for tmp in tmps:
            if os.path.lexists(tmp):
                os.unlink(tmp)
        if renamed and renamed < len(members):     # a half-renamed set would load as a broken model
            for m in members[:renamed]:
                try:
                    os.unlink(os.path.join(dest_dir, m.name))
                except OSError:
                    pass
    return {"schema": RESPLIT_SCHEMA, "kind": ResplitResult.KIND, "source": model.path, "source_files": list(model.files),
            "dir": dest_dir, "prefix": prefix, "path": os.path.join(dest_dir, members[0].name),
            "files": [m.name for m in members], "bytes": total, "tensors": len(src.tensors),
            "max_tensors": max_tensors}


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_member(m: Member, tmp: str, fds: dict[str, int], buf: memoryview, on_block, cancel) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, m.header)
        on_block(len(m.header))
        for p in m.tensors:
            if os.lseek(fd, 0, os.SEEK_CUR) != p.offset:
                raise RuntimeError(f"{m.name}: tensor {p.tensor.name} would land at the wrong offset")
            _copy(fds[p.tensor.file], fd, p.tensor.offset, p.tensor.nbytes, buf, on_block, cancel)
            if p.pad:
                _write_all(fd, bytes(p.pad))
                on_block(p.pad)
        if os.lseek(fd, 0, os.SEEK_CUR) != m.size:
            raise RuntimeError(f"{m.name}: wrote {os.lseek(fd, 0, os.SEEK_CUR)} B, the layout says {m.size} B")
        os.fsync(fd)
    finally:
        os.close(fd)
