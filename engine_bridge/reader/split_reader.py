"""The split reader: executes an engine's reads across the primary and its replicas.

A source is a member's copy of the whole model (`models.modelset.ModelSet`: one file, a split
GGUF set or a directory of shards); a read addresses one of the model's files, `(file, offset,
length)` (a `models.modelset.Extent`), and its pieces go to the same file in each source. The
engine's read pattern (`engines.pattern`) says how each read is cut: `submit_read` takes one of
its `Read`s with its pieces as the engine gave them (ds4-argodrive's cut of every read, colibri's
whole expert on one drive or its striped legs); `submit` cuts a bare `(offset, length)` with the
engine's own split rule (`Engine.split`, never arithmetic of our own) for an engine that cuts
reads. Each piece goes to its source's persistent lanes (`lanes.py`), and the read completes at
the barrier, when its last piece lands. Ranges need not be 4 KiB-aligned, so cold (O_DIRECT)
reads work on any model and every piece yields exact bytes.

Beyond the engine: a piece that fails (OSError) or comes back short is re-read from another
healthy source, the failing source is marked degraded and gets no further pieces (its share goes
to the others by their weights); a source whose file vanishes or shrinks mid-run is degraded the
same way (`sources.py`). Every such event is kept in `stats()` and passed to `report` (called
from lane threads: keep it quick and thread-safe). Only when no source can deliver a piece does
a read raise `MissingError`.

With `hedge=True` a drive that slows to a crawl or hangs does not hold the barrier either: a
piece that misses its deadline is re-issued on the healthiest other replica and the first
complete copy wins; a drive late again and again is degraded and probed until it recovers
(`hedger.py`, `hedging.py`; docs/reader.md).

With `reweigh=True` the weights themselves follow the drives: from what each source delivered
over its busy time in windows of seconds, weight moves away from a drive that falls behind and back
when it recovers (never below a floor share, never off the last healthy source, only after
`confirm` windows off a band: bursts do not move it). The new weights cut the following reads:
`submit`'s, and the engine's read pattern, which asks `weights_now(phase)` at every step. Every
change is a 'reweighted' event (`reweigher.py`, `reweighting.py`).

With `balance=True` the reads already cut follow the drives too: pieces are queued as chunks, a
drive keeps only a short queue in the kernel, and an idle drive takes the first chunk of a slower
one's queue when it would finish it sooner (`balancing.py`; counted as `stolen_bytes`).

This module is the facade: it checks the configuration, hands pieces to the lanes and puts the
lanes' and the sources' counters together.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Callable, Sequence

from core.errors import MissingError, UsageError
from engines.registry import DEFAULT_ENGINE, get_engine
from engines.split import check_weights
from core.coldio import CachedReader, ColdReader, align_down
from models.modelset import ModelSet, one_file

from . import build
from .buffers import BufferPool, check_buffer, span
from .hedger import Hedger
from .lanes import Lanes, ReadTicket
from .readstats import PhaseSourceStats, PhaseStats, ReaderEvent, ReaderStats, SourceStats, format_stats, healthy_split
from .reweigher import Reweigher
from .settings import ReaderSettings, check_settings
from .sources import SourceHealth, check_sources, close_sources, open_sources

PHASES = ("prefill", "decode")
HEALTH_INTERVAL_S = 1.0        # how often submit() re-stats the source files (vanished/truncated)
SAMPLE_BYTES = 1 << 20         # the most a re-weighting sample reads

__all__ = ["SplitReader", "ReadTicket", "CachedReader", "ReaderStats", "SourceStats", "ReaderEvent", "format_stats",
           "span"]


class SplitReader:
    """Reads byte ranges of a model's files split across its sources (primary first, then replicas).

    sources: the primary then its replicas, each the whole model where that member keeps it (a
    `ModelSet`; a path is taken as a one-file model): the same files, byte-identical, on distinct
    inodes. Files are opened when a read first names one, at most `files.OPEN_FILES_PER_SOURCE`
    open per source.
    weights: base (prefill) weights, one per source, integers 1..100.
    decode_weights: weights used when phase == 'decode' (default: the base weights).
    settings: what the reader does beyond the engine's reads and with how many lanes per source
    (`ReaderSettings`: hedging, re-weighting, balancing and their knobs); default: none of it, 8
    lanes, so a bare reader does exactly the engine's reads (the embedded engine passes
    `settings.EMBEDDED`). cold: O_DIRECT / F_NOCACHE reads (False: page-cache reads, for the
    reader's ceiling). opener: makes the per-source reader (default ColdReader or CachedReader);
    tests inject failing readers through it. pool_bytes: released buffers kept (default
    `buffers.pool_limit()`: 512 MiB, at most an eighth of the RAM the process may fill).
    clock: the hedger's and the re-weighting's clock, ns (tests inject one). holds: per source, the
    files a partial replica holds (None: every file); the engine's pattern sends it only reads of those.
    """

    def __init__(self, sources: Sequence[ModelSet | str], weights: Sequence[int],
                 decode_weights: Sequence[int] | None = None, *, settings: ReaderSettings | None = None,
                 engine: str = DEFAULT_ENGINE, report: Callable | None = None, cold: bool = True,
                 opener: Callable[[str], ColdReader] | None = None, health_interval: float = HEALTH_INTERVAL_S,
                 pool_bytes: int | None = None, clock: Callable[[], int] | None = None,
                 holds: Sequence[frozenset[str] | None] = ()):
        models = [m if isinstance(m, ModelSet) else one_file(os.fspath(m)) for m in sources]
        paths = [m.path for m in models]
        if not paths:
            raise UsageError("split reader: give at least one source (the primary model)")
        weights = check_weights(tuple(weights), engine)
        if len(weights) != len(paths):
            raise UsageError(f"split reader: {len(weights)} weights ({':'.join(map(str, weights))}) for {len(paths)} "
                             "sources; give one weight per source, primary first")
        decode = weights if decode_weights is None else check_weights(tuple(decode_weights), engine)
        if len(decode) != len(paths):
            raise UsageError(f"split reader: {len(decode)} decode weights ({':'.join(map(str, decode))}) for "
                             f"{len(paths)} sources; give exactly one per source"
                             + (f" (with another count {get_engine(engine).decode_miscount})"
                                if get_engine(engine).decode_miscount else ""))
        settings = ReaderSettings() if settings is None else settings
        try:
            check_settings(settings)
        except ValueError as e:
            raise UsageError(f"split reader: {e}") from None
        self.models, self.paths = tuple(models), tuple(paths)
        self.weights, self.decode_weights = weights, decode
        self.engine, self.cold = engine, cold
        # what it does: one source has nobody to hedge on, re-weigh against or take work from
        several = len(paths) > 1
        self.settings = replace(settings, hedge=settings.hedge and several, reweigh=settings.reweigh and several,
                                balance=settings.balance and several)
        self._health_interval = health_interval
        identity = check_sources(models, holds)
        self.files = models[0].files
        self._index = {rel: i for i, rel in enumerate(self.files)}
        self.sizes = {rel: ident[2] for rel, ident in zip(self.files, identity[0])}    # bytes per file
        self.size = sum(self.sizes.values())                                           # bytes of the model
        self._sources = open_sources(models, identity, opener or (ColdReader if cold else CachedReader))
        self.how = tuple(f.how for f in self._sources)
        self._health = SourceHealth(models, weights, identity, report)
        self._last_health = time.monotonic()
        self._closed = False
        self._pool = BufferPool(pool_bytes)
        st = self.settings
        self._hedger = (Hedger(self._health, weights, decode, self._pool, st.hedge_policy, clock or time.monotonic_ns)
                        if st.hedge else None)
        if self._hedger is not None:    # a hedge goes only to a source holding the piece's file
            self._hedger.can_serve = lambda src, fi: self._sources[src].holds(fi)
        e = get_engine(engine)
        self._split = e.split           # the engine's cut of a read by weight (None: it places whole reads)
        self._reweigher = (Reweigher({"prefill": weights, "decode": decode}, st.reweigh_policy,
                                     clock or time.monotonic_ns, e.weight_min, e.weight_max)
                           if st.reweigh else None)
        self._owed: list[int] = []      # sources owed a re-weighting sample (taken from the next read)
        self._lanes = Lanes(self._sources, self._health, st.lanes, self._pool, self._hedger, self._reweigher,
                            st.balance_policy if st.balance else None)
        if self._hedger is not None and self._reweigher is not None:
            self._hedger.comeback = self._come_back     # a drive that relapses comes back at its pace

    @property
    def lanes(self) -> int:
        return self.settings.lanes

    @property
    def hedge(self) -> bool:
        return self.settings.hedge

    @property
    def reweigh(self) -> bool:
        return self.settings.reweigh

    @property
    def balance(self) -> bool:
        return self.settings.balance

    # -- reads ------------------------------------------------------------------------------

    def submit(self, offset: int, length: int, phase: str = "prefill", buffer=None, *,
               file: str | None = None) -> ReadTicket:
        """Start one read of bytes [offset, offset+length) of the model's file `file` (its
        relative path, as in `ModelSet.files`; may be omitted for a one-file model), cut by the
        engine's own split rule (`Engine.split`) with the phase's weights over the healthy
        sources; its pieces go to the lanes at once. `ticket.result()` waits for it. An engine
        that does not cut reads by itself (it places whole experts) gives its reads as a pattern:
        `submit_read`.

        buffer: optional page-aligned writable buffer (from `aligned_buffer`) of at least
        `span(offset, length)` bytes to read into, so a caller with its own staging buffers avoids
        allocating (and faulting in) a fresh one per read; the bytes land at
        `offset - align_down(offset)` in it. Default: a buffer of the reader's, which
        `ticket.release()` hands back for reuse once the caller is done with the bytes.
        """
        healthy, weights, epoch = self._healthy_now(phase)
        pieces = tuple(healthy_split(offset, length, weights, healthy, self.engine))
        return self._start(offset, length, phase, buffer, file, pieces, healthy, epoch)

    def submit_read(self, read, phase: str = "prefill", buffer=None) -> ReadTicket:
        """Start one read of an engine's read pattern (`engines.pattern.Read`: its file, range and
        pieces, each on the source the engine gave it). A piece whose source has been degraded
        since the pattern was made goes to the healthy source the reader's failover picks."""
        healthy, weights, epoch = self._healthy_now(phase)
        pieces = []
        for p in read.pieces:
            if p.length <= 0:
                continue
            src = p.source
            if src not in healthy:
                src = self._health.failover_source([src])
                if src is None:
                    raise MissingError(f"split reader: every source is degraded ({', '.join(self.paths)}); "
                                       "check the drives and re-run")
                if not self._sources[src].holds(self._file_index(read.file)) and 0 in healthy:
                    src = 0                # a partial replica without the file: the primary holds every file
            pieces.append((src, p.offset, p.length))
        pieces = tuple(pieces)
        if self._reweigher is not None and self._split is not None and pieces != tuple(
                healthy_split(read.offset, read.length, weights, healthy, self.engine)):
            epoch = -1          # cut with other weights than those in force: re-weighting does not judge it
        return self._start(read.offset, read.length, phase, buffer, read.file, pieces, healthy, epoch)

    def healthy(self) -> tuple[int, ...]:
        """The sources reads may go to now (not degraded)."""
        return tuple(self._health.healthy())

    def weights_now(self, phase: str) -> tuple[int, ...]:
        """The weights reads of `phase` are cut with now: the plan's, or re-weighting's latest."""
        if self._reweigher is None:
            return self.decode_weights if phase == "decode" else self.weights
        with self._lanes.lock:
            return self._reweigher.weights(phase)

    def _reweigh(self, healthy: list[int], phase: str) -> tuple[tuple[int, ...], int]:
        """Judge re-weighting's window if it is over (a change is announced and cuts later reads);
        the weights `phase`'s reads are cut with now and their epoch, in the same turn of the lock."""
        with self._lanes.lock:
            change, owed = self._reweigher.step(healthy)
            if change is not None:
                self._adopt(change)
            self._owed += [s for s in owed if s not in self._owed]
            now = self._reweigher.weights(phase), self._reweigher.epoch
        if change is not None:
            self._announce(change)
        return now

    def _come_back(self, s: int, pace: float):
        """The hedger brings back source `s` after a relapse, at `pace` of its weight (the lanes' lock
        held): re-weighting cuts the next reads with that; what announces it, once the lock is free."""
        change = self._reweigher.came_back(s, pace, sorted({*self._health.healthy(), s}))
        if change is None:
            return None
        self._adopt(change)
        return lambda: self._announce(change)

    def _adopt(self, change: dict) -> None:
        """A change of weights (the lanes' lock held): the hedger judges by the weights reads are cut with."""
        if self._hedger is not None:
            self._hedger.weights = {ph: tuple(w) for ph, w in change["new"].items()}

    def _announce(self, change: dict) -> None:
        fmt = lambda d: ", ".join(f"{ph} {':'.join(map(str, w))}" for ph, w in d.items())  # noqa: E731
        self._health.event("reweighted", change["source"],
                           f"weights {fmt(change['old'])} -> {fmt(change['new'])}: {change['why']}",
                           detail={k: change[k] for k in ("old", "new", "rates_mbs", "why")})

    def _healthy_now(self, phase: str) -> tuple[list[int], tuple[int, ...], int]:
        """The sources reads may go to now, the weights `phase`'s reads are cut with, and the
        re-weighting epoch of those weights (0 without re-weighting): one turn of the lock per read
        for all three (on fast drives the reader's CPU is the engine's, docs/reader.md "Round 14")."""
        if phase not in PHASES:
            raise UsageError(f"split reader: phase {phase!r} is not one of {', '.join(PHASES)}")
        if self._closed:
            raise UsageError("split reader: read after close()")
        if self._health_interval is not None and time.monotonic() - self._last_health >= self._health_interval:
            self.check_sources()
        healthy = self._health.healthy()
        if not healthy:
            raise MissingError(f"split reader: every source is degraded ({', '.join(self.paths)}); "
                               "check the drives and re-run")
        if self._reweigher is None:
            return healthy, (self.decode_weights if phase == "decode" else self.weights), 0
        return (healthy, *self._reweigh(healthy, phase))

    def _start(self, offset: int, length: int, phase: str, buffer, file: str | None, pieces, healthy,
               epoch: int) -> ReadTicket:
        """Queue a read's pieces; `epoch`: the re-weighting epoch whose weights cut it (-1: others)."""
        fi = self._file_index(file)
        rel = self.files[fi]
        size = self.sizes[rel]
        if offset < 0 or length < 0 or offset + length > size:
            where = f"the file {rel}" if len(self.files) > 1 else "the file"
            raise UsageError(f"split reader: read ({offset}, {length}) is outside {where} (size {size})")
        if sum(pl for _, _, pl in pieces) != length:
            raise UsageError(f"split reader: pieces of {sum(pl for _, _, pl in pieces)} B for a {length}-byte read")
        parts = [self._lanes.parts(ps, po, pl) for ps, po, pl in pieces]       # chunks, when balancing
        queued = sum(map(len, parts))
        if buffer is None:
            buf = self._pool.get(span(offset, length))
            ticket = ReadTicket(offset, length, phase, buf, align_down(offset), queued, self._pool, file=rel, fi=fi)
        elif self._hedger is not None:
            # a late read cannot be stopped once in the kernel: it must never write into memory the
            # caller gets back, so the pieces land in a buffer of ours, copied over at the barrier
            buf = check_buffer(buffer, offset, length)
            ticket = ReadTicket(offset, length, phase, buf, align_down(offset), queued, None, own_buf=False,
                                work=self._pool.get(span(offset, length)), file=rel, fi=fi)
        else:
            ticket = ReadTicket(offset, length, phase, check_buffer(buffer, offset, length), align_down(offset),
                                queued, None, file=rel, fi=fi)
        ticket.epoch = epoch            # before it is queued: nobody else sees the ticket yet
        if self._hedger is not None:
            ticket.waiter = self._hedger.wait_for
        self._lanes.put(ticket, [(s, po, pl, pp) for (s, po, pl), pp in zip(pieces, parts)])
        if self._hedger is not None and len(healthy) < len(self.paths):
            self._probe(fi, pieces, phase, healthy)
        if self._owed and pieces:
            self._sample(fi, pieces)
        return ticket

    def _file_index(self, file: str | None) -> int:
        if file is None:
            if len(self.files) > 1:
                raise UsageError(f"split reader: the model has {len(self.files)} files; name the file a read is in "
                                 f"(file=..., one of {', '.join(self.files[:3])}{' …' if len(self.files) > 3 else ''})")
            return 0
        fi = self._index.get(file)
        if fi is None:
            raise UsageError(f"split reader: {file!r} is not one of the model's files "
                             f"({', '.join(self.files[:3])}{' …' if len(self.files) > 3 else ''})")
        return fi

    def _probe(self, fi: int, pieces, phase: str, healthy: list[int]) -> None:
        """Offer each source degraded for lateness a probe: a copy of (the first chunk of) this
        read's largest piece — a read of the size its lanes would make, timed in its own units."""
        if not pieces:
            return
        _, po, pl = max(pieces, key=lambda p: p[2])
        pl = min(pl, self.settings.balance_policy.chunk_bytes if self.balance else SAMPLE_BYTES)
        for s in range(len(self.paths)):
            if s not in healthy and self._health.slow(s) and self._sources[s].holds(fi):
                self._hedger.maybe_probe(s, po, pl, phase, fi)

    def _sample(self, fi: int, pieces) -> None:
        """Send each source owed a re-weighting sample a copy of (the first SAMPLE_BYTES of) this
        read's largest piece: enough to time a drive, never seconds of a crawling one's time."""
        with self._lanes.lock:
            owed, self._owed = self._owed, []
        _, po, pl = max(pieces, key=lambda p: p[2])
        pl = min(pl, SAMPLE_BYTES)
        for s in owed:
            if s in self._health.healthy() and self._sources[s].holds(fi):     # a partial replica: its own files only
                self._lanes.sample(s, po, pl, fi)

    def read(self, offset: int, length: int, phase: str = "prefill", buffer=None, *,
             file: str | None = None) -> memoryview:
        """Exactly the bytes [offset, offset+length) of `file`, read split across the sources."""
        return self.submit(offset, length, phase, buffer, file=file).result()

    def read_many(self, ranges: Sequence[tuple[int, int]], phase: str = "prefill",
                  buffers: Sequence | None = None, *, file: str | None = None) -> list[memoryview]:
        """Several reads of `file` in flight together; each completes at its own barrier."""
        if buffers is not None and len(buffers) < len(ranges):
            raise UsageError(f"split reader: {len(buffers)} buffers for {len(ranges)} reads")
        tickets = [self.submit(o, n, phase, None if buffers is None else buffers[i], file=file)
                   for i, (o, n) in enumerate(ranges)]
        return [t.result() for t in tickets]

    # -- health -----------------------------------------------------------------------------

    def check_sources(self) -> list[int]:
        """Re-stat every healthy source; degrade one whose file vanished, was replaced or shrank.
        Returns the indices degraded by this check. (submit() calls it every HEALTH_INTERVAL_S.)"""
        self._last_health = time.monotonic()
        return self._health.check()

    @property
    def degraded(self) -> tuple[bool, ...]:
        return self._health.degraded

    def wake_hedger(self) -> None:
        """Let the hedger look at its deadlines now (tests that inject a clock call this after moving it)."""
        if self._hedger is not None:
            self._hedger.wake()

    # -- results ----------------------------------------------------------------------------

    def stats(self) -> ReaderStats:
        c = self._lanes.counters()
        chunk = self._lanes.chunk_sizes() or (0,) * len(self.paths)
        degraded, src_events, events, slow = self._health.snapshot()
        srcs = tuple(SourceStats(
            index=i, path=self.paths[i], weight=self.weights[i], decode_weight=self.decode_weights[i],
            bytes=c.bytes[i], reads=c.reads[i], lands_last=c.lands_last[i], gap_ns=c.gap_ns[i], lat_ns=c.lat_ns[i],
            degraded=degraded[i], events=src_events[i], failover_bytes=c.failover_bytes[i], hedged=c.hedged[i],
            late=c.late[i], slow=slow[i], stolen_bytes=c.stolen[i] if c.stolen else 0, chunk_bytes=chunk[i])
            for i in range(len(self.paths)))
        now = {ph: list(self.weights_now(ph)) for ph in PHASES}
        changes = 0
        if self._reweigher is not None:
            with self._lanes.lock:
                changes = self._reweigher.changes
        return ReaderStats(sources=srcs, events=events, reads=c.reads_done, bytes=c.bytes_done,
                           phases=tuple(self._phase_stats(ph, c.phases.get(ph)) for ph in PHASES),
                           weights_now=now, reweighs=changes, build=build.HOW,
                           watchdog=self._hedger.watchdog_counts() if self._hedger is not None else None)

    def _phase_stats(self, phase: str, t) -> PhaseStats:
        n = len(self.paths)
        if t is None:           # the phase issued no read
            return PhaseStats(phase, 0, 0, 0, tuple(PhaseSourceStats(i, 0, 0, 0, 0) for i in range(n)))
        return PhaseStats(phase, t.reads_done, t.bytes_done, t.largest_read, tuple(
            PhaseSourceStats(i, t.given_bytes[i], t.given_pieces[i], t.bytes[i], t.reads[i]) for i in range(n)))

    def format_stats(self) -> str:
        return format_stats(self.stats())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        safe = self._lanes.close()      # a source whose late read still hangs is closed by its last lane
        close_sources([self._sources[i] for i in safe])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
