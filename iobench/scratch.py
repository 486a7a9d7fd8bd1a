"""Measuring a drive that holds no replica yet: a scratch file written there, measured, removed.

`planner whatif` prices a drive before a byte of the model is copied to it. Its ceilings come
from iobench's own trials on a scratch file in a folder on that drive: written once (its write
speed is what a copy would get there), read cold with the engine's read shapes, and removed. Only
the file this module created is removed: it is made with O_CREAT|O_EXCL under a name no other
tool uses (SCRATCH_PREFIX), and removed only while its identity (device, inode) is still the one
it was created with, so nothing else at that path is ever deleted.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass, replace

from core.coldio import aligned_buffer
from core.errors import Interrupted, MissingError, UsageError, WriteError
from core.events import Progress, Reporter, emit
from core.fsutil import FileIdentity, free_bytes

from .bench import make_target, run_bench
from .constants import MiB
from .layout import ExpertLayout
from .result import BenchResult
from .schedule import RunOptions

SCRATCH_PREFIX = ".replica-tuner-scratch-"
WRITE_BLOCK = 8 * MiB           # bytes per write; the scratch file's size is rounded up to it
FREE_HEADROOM = 1 << 30         # bytes left free on the drive after the scratch file (at most; 5 % of a smaller drive)


@dataclass(frozen=True)
class Scratch:
    path: str
    size: int                    # bytes
    identity: FileIdentity | None  # (size, mtime, inode, device) once written; None while writing
    write_Bps: float             # bytes/s the write reached, fsync included
    direct: bool                 # written with O_DIRECT (no page cache between the writes and the drive)
    device: int = 0              # of the file as created (its inode may be reused once it is gone)
    inode: int = 0


def check_folder(directory: str) -> str:
    """The folder, absolute; MissingError when it is not one."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        raise MissingError(f"{directory}: no such folder; give a folder on the drive to measure")
    return directory


def write_scratch(directory: str, size: int, report: Reporter = None, cancel: threading.Event | None = None) -> Scratch:
    """Create a scratch file of `size` bytes (rounded up to WRITE_BLOCK) of random bytes in
    `directory` and time its writing to the drive. Refuses a folder that is missing, or a size
    that would leave less than FREE_HEADROOM free."""
    directory = check_folder(directory)
    size = max(WRITE_BLOCK, -(-int(size) // WRITE_BLOCK) * WRITE_BLOCK)
    free = free_bytes(directory)
    st = os.statvfs(directory)
    headroom = min(FREE_HEADROOM, st.f_frsize * st.f_blocks // 20)
    if size + headroom > free:
        raise UsageError(f"{directory}: {size:,} B of scratch would leave less than {headroom:,} B free "
                         f"({free:,} B free); give a smaller --scratch-size")
    path = os.path.join(directory, f"{SCRATCH_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.bin")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    direct = getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags | direct, 0o600)
    except OSError:
        fd, direct = os.open(path, flags, 0o600), 0     # no O_DIRECT here: buffered, then fsync
    st = os.fstat(fd)
    scratch = Scratch(path, size, None, 0.0, bool(direct), st.st_dev, st.st_ino)
    buf = aligned_buffer(WRITE_BLOCK)
    buf[:] = secrets.token_bytes(WRITE_BLOCK)     # random: a compressing drive cannot shortcut it
    try:
        t0 = time.perf_counter()
        done = 0
        while done < size:
            if cancel is not None and cancel.is_set():
                raise Interrupted(f"stopped writing the scratch file {path}")
            buf[:8] = done.to_bytes(8, "little")  # no two blocks alike
            n = os.write(fd, buf)
            if n <= 0:
                raise WriteError(f"{path}: the drive took no bytes at {done:,}")
            done += n
            emit(report, Progress(task="scratch write", phase="write", done=done, total=size))
        os.fsync(fd)
        seconds = time.perf_counter() - t0
        ident = FileIdentity.of_fd(fd)
    except OSError as e:
        os.close(fd)
        remove_scratch(scratch)
        raise WriteError(f"{path}: writing the scratch file failed ({e.strerror or e}); it was removed") from None
    except BaseException:
        os.close(fd)
        remove_scratch(scratch)
        raise
    finally:
        buf.release()
    os.close(fd)
    return replace(scratch, identity=ident, write_Bps=size / seconds if seconds > 0 else 0.0)


def remove_scratch(s: Scratch) -> bool:
    """Remove the scratch file if it is still the one `write_scratch` created: the same device and
    inode, and once written the same size and mtime too (a file system reuses a freed inode at
    once); returns whether it was removed."""
    try:
        now = FileIdentity.of(s.path)
    except FileNotFoundError:
        return False
    if (now.device, now.inode) != (s.device, s.inode) or not os.path.basename(s.path).startswith(SCRATCH_PREFIX):
        return False
    if s.identity is not None and now != s.identity:
        return False
    os.unlink(s.path)
    return True


def bench_scratch(directory: str, name: str, size: int, opts: RunOptions, component_bytes: int,
                  report: Reporter = None, cancel: threading.Event | None = None) -> BenchResult:
    """Write a scratch file in `directory`, measure it alone with iobench's trials (decode reads of
    `component_bytes`, the rig's model's component, over the whole file) and remove it. The result
    names the drive `name` and records the scratch file in `settings.scratch` (its folder, size,
    write speed, and that it was removed)."""
    s = write_scratch(directory, size, report, cancel)
    try:
        layout = ExpertLayout(component_bytes, ((0, s.size),), max(1, s.size // max(1, component_bytes)))
        note = (f"a scratch file of {s.size:,} B written at {s.write_Bps / 1e6:,.1f} MB/s"
                f"{' (O_DIRECT)' if s.direct else ' (buffered, then fsync)'} and removed after: no replica yet")
        target = make_target(s.path, name, layout, (note,))
        result = run_bench([target], replace(opts, together=False), report=report, cancel=cancel)
    finally:
        removed = remove_scratch(s)
    return replace(result, settings={**result.settings, "scratch": {
        "directory": os.path.abspath(directory), "size": s.size, "write_Bps": s.write_Bps, "direct": s.direct,
        "removed": removed}})
