"""Small file-system helpers: atomic writes, directory fsync, free space, file identity."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import MissingError, RigError, UsageError, WriteError


@dataclass(frozen=True)
class FileIdentity:
    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, path: str) -> "FileIdentity":
        st = os.stat(path)
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)

    @classmethod
    def of_fd(cls, fd: int) -> "FileIdentity":
        st = os.fstat(fd)
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies under it, on real paths (links resolved, so a destination
    reached through a link is still found inside)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@contextmanager
def folder_lock(path: str, busy: str, *, wait: bool = False):
    """Hold an exclusive lock on `path` for the `with` block — a folder (flock on the folder
    itself: nothing is created in it), or a lock file of the tool's own (created) — so two writers
    of one place are serialised (`wait`) or the second refused at once with `busy` (UsageError,
    exit 2). Released when the process ends, however it ends."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if os.path.isdir(path) else \
        os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise UsageError(busy) from None
        yield
    finally:
        os.close(fd)


def check_output(path: str, what: str, ours=None, *, force: bool = False, forceable: bool = True) -> str:
    """A file the user named for the tool to write (`--csv`, `--trace-out`, `export -o`, a
    stand-in), checked before any work, at once rather than after the run: its folder must exist
    (else MissingError, exit 3, as a missing destination of sync; no folder is created) and be
    writable (else WriteError, exit 4), and a path already there is
    written only when `ours(first bytes)` says the tool wrote it (a CSV of ours to append to, a
    profile, a trace) or with `force` (`forceable`: the command has a --force) — else one line,
    exit 2: user files are never overwritten.
    A symbolic link is never ours. Returns the path, absolute."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise MissingError(f"{what} {path}: its folder {parent} does not exist or is not a folder; create it or give "
                         "another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise WriteError(f"{what} {path}: its folder {parent} is not writable; give another path")
    if os.path.lexists(path) and not force:
        mine = False
        if not os.path.islink(path) and os.path.isfile(path) and ours is not None:
            try:
                with open(path, "rb") as f:
                    mine = bool(ours(f.read(4096)))
            except OSError:
                mine = False
        if not mine:
            raise UsageError(f"{what} {path}: exists and was not written by replica-tuner; give another name"
                             + (" (or --force to replace it)" if forceable else ""))
    return path


def describe_link(path: str) -> str | None:
    """What a symbolic link at `path` is when it cannot be followed to something ("a symbolic link
    loop", "a link to nowhere (TARGET)"); None when it is no link or resolves."""
    if not os.path.islink(path):
        return None
    try:
        os.path.realpath(path, strict=True)
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop"
        try:
            return f"a link to nowhere ({os.readlink(path)})"
        except OSError:
            return "a link that cannot be followed"


def require_file(path: str, role: str, fix: str, *, executable: bool = False) -> os.stat_result:
    """The stat of a regular file we must read (or run): a missing or unreadable file is
    MissingError (exit 3), anything that is not a regular file UsageError (exit 2). Messages
    read '<role> <path>: <what>; <fix>'."""
    what = f"{role} {path}" if role else path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MissingError(f"{what}: no such file; {fix}") from None
    except OSError as e:
        raise MissingError(f"{what}: cannot be read ({e.strerror or e}); {fix}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what}: not a regular file; {fix}")
    if not os.access(path, os.R_OK):
        raise MissingError(f"{what}: not readable (permission denied); {fix}")
    if executable and not os.access(path, os.X_OK):
        raise UsageError(f"{what}: not executable (chmod +x); {fix}")
    return st


def read_text(path: str, what: str, remedy: str) -> str:
    """A UTF-8 text file the user gives (a fleet file, a sums file): missing is MissingError (exit 3),
    unreadable or not UTF-8 is RigError (exit 2); each one line naming the file, `what` it is and the
    `remedy`."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise MissingError(f"{path}: no such {what}; {remedy}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RigError(f"{path}: cannot be read as a {what} ({e}); {remedy}") from None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write through a temporary name in the same directory, fsync, rename, fsync the directory."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise WriteError(f"cannot write {path}: {e.strerror or e}") from e
    fsync_dir(d)


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def allocated_bytes(path: str) -> int:
    """Bytes the file system has allocated to a file (0 if it does not exist)."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0
