"""The split reader's sources: what it accepts at open, and which sources stay healthy after.

A source is a member's copy of the whole model (a `models.modelset.ModelSet`: one file, a split
GGUF set or a directory), primary first. At open every source must hold the primary's files, each
a regular file of the primary file's size on its own inode (what the engine refuses, we refuse,
naming the member and the file). While reads run, `SourceHealth` decides which sources still get
pieces: a source whose piece failed or came back short, or one of whose files vanished, was
replaced or shrank, is degraded as a whole for the rest of the run, and a failed piece goes to
the healthy source with the largest base weight not yet tried. A source late again and again (the
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
from core.coldio import ColdReader
from models.modelset import FILE, ModelSet

from .files import Identity, SourceFiles
from .readstats import ReaderEvent

FIX = "a source is the model or a replica of it on a mounted drive"


def source_name(i: int, model: ModelSet) -> str:
    """How messages name a source: its index and the member's path (file, first file or directory)."""
    return f"source {i} ({model.path})"


def check_sources(models: Sequence[ModelSet], holds: Sequence[frozenset[str] | None] = ()) -> list[tuple[Identity | None, ...]]:
    """Per source, the (device, inode, size) of each of the model's files; refuses what the
    engine would refuse, naming the member and the file. `holds`: per source, the files a
    partial replica holds (None, or no entry: every file); a file it does not hold has no
    identity (None) and is never read there."""
    primary = models[0]
    for i, m in enumerate(models[1:], 1):
        if m.layout != primary.layout or (m.layout != FILE and m.files != primary.files):
            raise UsageError(f"{source_name(i, m)}: lists files {_few(m.files)} but the primary has "
                             f"{_few(primary.files)}; every source must be the same model")
    seen: dict[tuple[int, int], str] = {}
    ident: list[tuple[Identity | None, ...]] = []
    for i, m in enumerate(models):
        # one file: "source 1 /g/model.gguf: …"; several: "source 1 (/g/model): file /g/model/a.safetensors: …"
        role = f"source {i}" if m.layout == FILE else f"{source_name(i, m)}: file"
        per: list[Identity | None] = []
        held = holds[i] if i and i < len(holds) else None
        for fi, (rel, p) in enumerate(zip(m.files, m.paths)):
            if held is not None and rel not in held:
                per.append(None)
                continue
            st = require_file(p, role, FIX)
            first = ident[0][fi] if ident else None         # the primary's: it holds every file
            if first is not None and st.st_size != first[2]:
                raise UsageError(f"{role} {p}: size {st.st_size} differs from the primary's {first[2]} "
                                 f"({primary.paths[fi]}); a replica must be a byte-identical copy: re-copy it with "
                                 "`replicas sync`")
            key = (st.st_dev, st.st_ino)
            if key in seen:
                raise UsageError(f"{role} {p}: same file as {seen[key]} (one inode); give each source once, "
                                 "each replica a distinct copy")
            seen[key] = p
            per.append((st.st_dev, st.st_ino, st.st_size))
        ident.append(tuple(per))
    return ident


def _few(files: Sequence[str]) -> str:
    return ", ".join(files[:3]) + (f" … ({len(files)} in all)" if len(files) > 3 else "")


def open_sources(models: Sequence[ModelSet], identity: Sequence[Sequence[Identity]],
                 opener: Callable[[str], ColdReader]) -> list[SourceFiles]:
    """The files of each source; the first file of each is opened now (a drive that cannot be read
    is refused at open, and `how` is known), the others when a read names them. On a failure the
    ones already open are closed again."""
    out: list[SourceFiles] = []
    i, m = 0, models[0]
    try:
        for i, m in enumerate(models):
            files = SourceFiles(m.paths, identity[i], opener)
            out.append(files)
            first = next((fi for fi, x in enumerate(identity[i]) if x is not None), None)
            if first is not None:          # a partial replica: its first file it holds
                files.acquire(first)
                files.release(first)
    except OSError as e:
        close_sources(out)
        rel = m.files[0]
        raise MissingError(f"{source_name(i, m)}: file {rel}: cannot open {e.filename or m.paths[0]} for reading "
                           f"({e.strerror or e}); check the drive is mounted and the file readable") from None
    return out


def close_sources(sources: Sequence[SourceFiles]) -> None:
    for s in sources:
        s.close()


def source_change(path: str, identity: Identity) -> str | None:
    """Why the file at `path` is no longer the source file opened with `identity`, or None."""
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

    models, weights (base), identity (per file, as `check_sources` returns it): per source,
    primary first. report: called with each `ReaderEvent` outside the lock (from lane threads too).
    """

    def __init__(self, models: Sequence[ModelSet], weights: Sequence[int], identity: Sequence[Sequence[Identity]],
                 report: Callable | None = None):
        self.models, self.weights, self.identity = tuple(models), tuple(weights), tuple(map(tuple, identity))
        self.paths = tuple(m.path for m in self.models)
        self._report = report
        self._lock = threading.Lock()
        self._degraded = [False] * len(self.paths)
        self._slow = [False] * len(self.paths)     # degraded for lateness: probes may bring it back
        self._src_events = [0] * len(self.paths)
        self._events: list[ReaderEvent] = []
        # the sources in the split: replaced, never changed in place, when one goes or returns; read
        # without the lock, as an attribute by the reader's compiled modules (`healthy()` is a call
        # of Python from them, ~7 a decode read with the embedded engine's features: docs/reader.md "Round 31")
        self.in_split = list(range(len(self.paths)))

    def _out(self) -> list[bool]:
        return [d or s for d, s in zip(self._degraded, self._slow)]

    def _changed(self) -> None:
        """A source left or rejoined the split (lock held): a new list of the healthy ones."""
        self.in_split = [i for i, d in enumerate(self._out()) if not d]

    def healthy(self) -> list[int]:
        """The sources in the split. The same list object until one leaves or rejoins (callers must
        not change it; the lanes ask on every piece, so it is read without the lock)."""
        return self.in_split

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

    def event(self, kind: str, src: int, message: str, off: int = 0, ln: int = 0, file: str = "",
              detail: dict | None = None) -> None:
        """Keep and report an event; `file` (relative, as in the model's files) when it is about one."""
        ev = ReaderEvent(kind, src, self.paths[src], message, off, ln, time.monotonic_ns(), file, detail)
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
            self._changed()
            left = list(self.in_split)
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
            self._changed()
            left = list(self.in_split)
        plan = ":".join(str(self.weights[i]) for i in left)
        self.event("recovered", src, f"source {src} recovered ({why}); reads go to sources {left} with weights {plan}")
        return True

    def piece_failed(self, src: int, off: int, ln: int, e: BaseException, file: str = "") -> None:
        where = f"piece ({off}, {ln})" + (f" of {file}" if file and len(self.models[src].files) > 1 else "")
        if isinstance(e, ShortRead):
            kind, why = "short_read", f"{where} came back short (file truncated?)"
        else:
            kind, why = "read_failed", f"{where} failed: {getattr(e, 'strerror', None) or e}"
        self.event(kind, src, why, off, ln, file)
        self.degrade(src, why)

    def failover_source(self, tried: Sequence[int]) -> int | None:
        """The healthy source not yet tried with the largest base weight (ties to the lower index)."""
        with self._lock:
            cands = [i for i, d in enumerate(self._out()) if not d and i not in tried]
        if not cands:
            return None
        return max(cands, key=lambda i: (self.weights[i], -i))

    def check(self) -> list[int]:
        """Re-stat every file of every healthy source; degrade a source one of whose files vanished,
        was replaced or shrank. Returns the indices degraded by this check."""
        lost = []
        for i, m in enumerate(self.models):
            with self._lock:
                failed = self._degraded[i]
            if failed:
                continue
            for fi, (rel, p) in enumerate(zip(m.files, m.paths)):
                if self.identity[i][fi] is None:      # a file this partial replica does not hold
                    continue
                why = source_change(p, self.identity[i][fi])
                if why:
                    self.event("vanished", i, f"{p}: {why}", file=rel)
                    self.degrade(i, why if len(m.files) == 1 else f"{rel}: {why}")
                    lost.append(i)
                    break
        return lost
