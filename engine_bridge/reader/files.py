"""One source's model files, opened as the reads need them.

A source is a member's copy of the whole model (a `ModelSet`): one file, a split GGUF set or a
directory of shards. Its files are opened lazily, on the first read that names one, and at most
`OPEN_FILES_PER_SOURCE` of them stay open: when more are needed the least recently used file no
lane is reading is closed (it is opened again if a later read names it). A model of 163 shards
over 3 sources so holds at most 3 x 16 descriptors, well under macOS's default limit of 256,
while a one-file model keeps its one descriptor for the whole run as before.

A file opened late is checked against the identity its path had when the reader opened (device
and inode): a shard replaced in between is refused like a failing read, so its source is
degraded instead of reading another file's bytes.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from typing import Callable, Sequence

from core.coldio import ColdReader

OPEN_FILES_PER_SOURCE = 16     # descriptors one source keeps open at most (busy files excepted)

Identity = tuple[int, int, int]     # (device, inode, size in bytes) of a source file at open


class SourceFiles:
    """The open readers of one source's files, by file index (the model's `files` order).

    paths: absolute path of each file in this source. identity: (device, inode, size) of each,
    taken when the reader opened. opener: makes a reader for a path (raises OSError).
    """

    def __init__(self, paths: Sequence[str], identity: Sequence[Identity], opener: Callable[[str], ColdReader],
                 limit: int = OPEN_FILES_PER_SOURCE):
        self.paths, self.identity, self.opener = tuple(paths), tuple(identity), opener
        self.limit = max(1, limit)
        self._lock = threading.Lock()
        self._open: OrderedDict[int, ColdReader] = OrderedDict()    # least recently used first
        self._busy = [0] * len(self.paths)
        self._closed = False

    def acquire(self, fi: int) -> ColdReader:
        """The reader of file `fi`, opened if it is not; `release(fi)` when the read is done."""
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "source closed", self.paths[fi])
            r = self._open.get(fi)
            if r is not None:
                self._open.move_to_end(fi)
                self._busy[fi] += 1
                return r
        fresh = self._open_checked(fi)          # outside the lock: a slow drive must not hold the others
        with self._lock:
            r = self._open.get(fi)
            if r is None and not self._closed:
                r, fresh = fresh, None
                self._open[fi] = r
            if r is not None:
                self._busy[fi] += 1
                self._open.move_to_end(fi)
            idle = self._evictable()
        for x in ([fresh] if fresh is not None else []) + idle:
            _close(x)
        if r is None:
            raise OSError(errno.EBADF, "source closed", self.paths[fi])
        return r

    def release(self, fi: int) -> None:
        with self._lock:
            self._busy[fi] -= 1
            idle = self._evictable()
        for x in idle:
            _close(x)

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    @property
    def how(self) -> str:
        """How the first open file reads ('o_direct', 'f_nocache', 'fadvise', 'cached'), '' if none is."""
        with self._lock:
            return next((r.how for r in self._open.values()), "")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            readers, self._open = list(self._open.values()), OrderedDict()
        for r in readers:
            _close(r)

    def holds(self, fi: int) -> bool:
        """Whether this source holds file `fi` (a partial replica holds some of the model's files)."""
        return self.identity[fi] is not None

    @property
    def whole(self) -> bool:
        """Whether this source holds every file of the model (not a partial replica)."""
        return all(x is not None for x in self.identity)

    def _open_checked(self, fi: int) -> ColdReader:
        if self.identity[fi] is None:
            raise OSError(errno.ENOENT, "a file this partial replica does not hold", self.paths[fi])
        r = self.opener(self.paths[fi])
        fd = getattr(r, "fd", None)
        if isinstance(fd, int) and fd >= 0:
            st = os.fstat(fd)
            dev, ino, _ = self.identity[fi]
            if (st.st_dev, st.st_ino) != (dev, ino):
                _close(r)
                raise OSError(errno.ESTALE, "file replaced by another inode since the reader opened", self.paths[fi])
        return r

    def _evictable(self) -> list[ColdReader]:
        """Over the limit: take out the least recently used idle readers (lock held)."""
        out = []
        extra = len(self._open) - self.limit
        if extra <= 0:
            return out
        for fi in list(self._open):
            if extra <= 0:
                break
            if self._busy[fi] == 0:
                out.append(self._open.pop(fi))
                extra -= 1
        return out


def _close(r: ColdReader) -> None:
    try:
        r.close()
    except OSError:
        pass
