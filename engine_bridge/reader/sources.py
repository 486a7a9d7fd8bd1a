"""The split reader's sources: what it accepts at open, and which sources stay healthy after.

At open every source must be a regular file of the primary's size on its own inode (what the
engine refuses, we refuse, naming the file). While reads run, `SourceHealth` decides which
sources still get pieces: a source whose piece failed or came back short, or whose file vanished,
was replaced or shrank, is degraded for the rest of the run, and a failed piece goes to the
healthy source with the largest base weight not yet tried. A source late again and again (the
hedger decides, `hedger.py`) is degraded the same way but only until probes find it on time again
(`degrade(..., slow=True)`, `restore`). Everything it does is an event, kept and passed to
`report` (called from lane threads: keep it quick and thread-safe).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Sequence

from core.errors import MissingError, UsageError
from core.fsutil import require_file
from replicas.coldio import ColdReader

from .readstats import ReaderEvent

Identity = tuple[int, int, int]     # (device, inode, size in bytes) of a source file at open


def check_sources(paths: Sequence[str]) -> list[Identity]:
    """(device, inode, size) of each source; refuses what the engine would refuse."""
    seen: dict[tuple[int, int], str] = {}
    ident: list[Identity] = []
    for i, p in enumerate(paths):
        st = require_file(p, f"source {i}", "a source is the model file or a replica of it on a mounted drive")
        if ident and st.st_size != ident[0][2]:
            raise UsageError(f"{p}: size {st.st_size} differs from the primary's {ident[0][2]} ({paths[0]}); "
                             "a replica must be a byte-identical copy: re-copy it with `replicas sync`")
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise UsageError(f"{p}: same file as {seen[key]} (one inode); give each source once, "
                             "each replica a distinct copy")
        seen[key] = p
        ident.append((st.st_dev, st.st_ino, st.st_size))
    return ident


def open_sources(paths: Sequence[str], opener: Callable[[str], ColdReader]) -> list[ColdReader]:
    """One reader per source; on a failure the ones already open are closed again."""
    readers: list[ColdReader] = []
    p = ""
    try:
        for p in paths:
            readers.append(opener(p))
    except OSError as e:
        close_readers(readers)
        raise MissingError(f"{e.filename or p}: cannot open for reading ({e.strerror or e}); "
                           "check the drive is mounted and the file readable") from None
    return readers


def close_readers(readers: Sequence[ColdReader]) -> None:
    for r in readers:
        try:
            r.close()
        except OSError:
            pass


def source_change(path: str, identity: Identity) -> str | None:
    """Why the file at `path` is no longer the source opened with `identity`, or None."""
    dev, ino, size = identity
    try:
        st = os.stat(path)
    except OSError as e:
        return f"file gone ({e.strerror})"
    if (st.st_dev, st.st_ino) != (dev, ino):
        return "file replaced by another inode"
    if st.st_size < size:
        return f"file truncated to {st.st_size} of {size} bytes"
    return None


class ShortRead(Exception):
    """A piece came back with fewer bytes than the file must hold there."""


class SourceHealth:
    """Which sources still get pieces, and the events that say why one stopped.

    paths, weights (base), identity: per source, primary first. report: called with each
    `ReaderEvent` outside the lock (from lane threads too).
    """

    def __init__(self, paths: Sequence[str], weights: Sequence[int], identity: Sequence[Identity],
                 report: Callable | None = None):
        self.paths, self.weights, self.identity = tuple(paths), tuple(weights), tuple(identity)
        self._report = report
        self._lock = threading.Lock()
        self._degraded = [False] * len(self.paths)
        self._slow = [False] * len(self.paths)     # degraded for lateness: probes may bring it back
        self._src_events = [0] * len(self.paths)
        self._events: list[ReaderEvent] = []

    def _out(self) -> list[bool]:
        return [d or s for d, s in zip(self._degraded, self._slow)]

    def healthy(self) -> list[int]:
        with self._lock:
            return [i for i, d in enumerate(self._out()) if not d]

    @property
    def degraded(self) -> tuple[bool, ...]:
        """Per source: gets no pieces now (failed for good, or late until it recovers)."""
        with self._lock:
            return tuple(self._out())

    def slow(self, src: int) -> bool:
        """Degraded for lateness only (not failed): probes may bring it back."""
        with self._lock:
            return self._slow[src] and not self._degraded[src]

    def snapshot(self) -> tuple[tuple[bool, ...], tuple[int, ...], tuple[ReaderEvent, ...], tuple[bool, ...]]:
        """(degraded, events per source, every event so far, degraded for lateness), taken together."""
        with self._lock:
            slow = tuple(s and not d for d, s in zip(self._degraded, self._slow))
            return tuple(self._out()), tuple(self._src_events), tuple(self._events), slow

    def event(self, kind: str, src: int, message: str, off: int = 0, ln: int = 0) -> None:
        ev = ReaderEvent(kind, src, self.paths[src], message, off, ln, time.monotonic_ns())
        with self._lock:
            self._events.append(ev)
            self._src_events[src] += 1
        if self._report is not None:
            self._report(ev)

    def degrade(self, src: int, why: str, slow: bool = False) -> bool:
        """Stop giving `src` pieces: for good, or (slow=True) until `restore`. True if it changed."""
        with self._lock:
            was_out = self._degraded[src] or self._slow[src]
            if self._degraded[src] or (slow and self._slow[src]):
                return False
            if slow:
                self._slow[src] = True
            else:
                self._degraded[src] = True
            left = [i for i, d in enumerate(self._out()) if not d]
        if was_out:        # late first, now failing too: already out of the plan, say only why it stays out
            self.event("degraded", src, f"source {src} degraded for good ({why})")
            return True
        plan = ":".join(str(self.weights[i]) for i in left) if left else "none"
        self.event("degraded", src, f"source {src} degraded ({why}); reads go to sources {left or 'none'} "
                                    f"with weights {plan}" + ("; probing it for recovery" if slow else ""))
        return True

    def restore(self, src: int, why: str) -> bool:
        """Give a source degraded for lateness (not a failed one) pieces again. True if it changed."""
        with self._lock:
            if not self._slow[src] or self._degraded[src]:
                return False
            self._slow[src] = False
            left = [i for i, d in enumerate(self._out()) if not d]
        plan = ":".join(str(self.weights[i]) for i in left)
        self.event("recovered", src, f"source {src} recovered ({why}); reads go to sources {left} with weights {plan}")
        return True

    def piece_failed(self, src: int, off: int, ln: int, e: BaseException) -> None:
        if isinstance(e, ShortRead):
            kind, why = "short_read", f"piece ({off}, {ln}) came back short (file truncated?)"
        else:
            kind, why = "read_failed", f"piece ({off}, {ln}) failed: {getattr(e, 'strerror', None) or e}"
        self.event(kind, src, why, off, ln)
        self.degrade(src, why)

    def failover_source(self, tried: Sequence[int]) -> int | None:
        """The healthy source not yet tried with the largest base weight (ties to the lower index)."""
        with self._lock:
            cands = [i for i, d in enumerate(self._out()) if not d and i not in tried]
        if not cands:
            return None
        return max(cands, key=lambda i: (self.weights[i], -i))

    def check(self) -> list[int]:
        """Re-stat every healthy source; degrade one whose file vanished, was replaced or shrank.
        Returns the indices degraded by this check."""
        lost = []
        for i, p in enumerate(self.paths):
            with self._lock:
                failed = self._degraded[i]
            if failed:
                continue
            why = source_change(p, self.identity[i])
            if why:
                self.event("vanished", i, f"{p}: {why}")
                self.degrade(i, why)
                lost.append(i)
        return lost
