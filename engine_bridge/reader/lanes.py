"""The split reader's lanes: persistent threads per source that read pieces into a read's buffer.

Each source has a queue and `lanes` threads serving it (`os.preadv` releases the GIL, so lanes
overlap on 2 cores); a piece is read from the source's copy of the read's file (`files.SourceFiles`
opens it when first needed). A piece's aligned interior is read straight into the read's page-aligned
buffer; its unaligned edges through one covering page of the lane's scratch, so neighbouring
pieces never touch each other's bytes and O_DIRECT works on any range. A piece that fails or
comes back short is re-read from the source `SourceHealth` names; a read completes at its
barrier, when its last piece lands, and the lanes count who landed last and by how much.

With a hedger (`hedger.py`) a piece may have two attempts at once: its own (the *main* attempt,
reading into the read's work buffer) and a *hedge* on another source, reading into a private
buffer of its own. The first to complete wins; a main attempt whose piece is already won is
skipped if it has not started. A late main attempt cannot be stopped once its read is in the
kernel, so the buffer it writes into never reaches the caller or the pool while it may still
write: at the barrier such a read's bytes are copied to a fresh buffer, the hedges' bytes laid
over theirs, and the old buffer is kept until its last writer returns (`ReadTicket._writers`).
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from core.errors import MissingError
from core.coldio import ColdReader, align_down, align_up, aligned_buffer

from .attempts import HEDGE, MAIN, SAMPLE, Attempt, PieceInFlight, ReadTicket
from .balancing import BalancePolicy, chunks, depth_limit, pick_victim
from .hedging import RateEstimate
from .files import SourceFiles
from .buffers import span
from .readstats import last_landing, latency_summary
from .sources import ShortRead, SourceHealth

__all__ = ["Lanes", "LaneQueue", "LaneCounters", "ReadTicket", "read_piece"]

PACE_DECAY = 0.9          # weight of the past in a source's pace, per delivered attempt (balancing)
STEAL_SCAN = 64           # queued attempts looked at per source for one to take
STEAL_LOOK_S = 0.02       # an idle lane looks again this often while work waits on another source

class LaneQueue:
    """A source's queue: FIFO, with hedges and probes put at the front (a read is waiting on them).
    Its lanes wait on `cond`, a Condition of the lanes' one lock: every method is called with that
    lock held (work can then move between queues and counters in one step)."""

    def __init__(self, cond: threading.Condition):
        self.items: deque = deque()
        self.cond = cond
        self.idle = 0                 # lanes of this source waiting for work

    def put(self, item, front: bool = False) -> None:
        if front:
            self.items.appendleft(item)
        else:
            self.items.append(item)
        self.cond.notify()


@dataclass(frozen=True)
class LaneCounters:
    """What the lanes delivered, per source (primary first) and in all."""

    bytes: tuple[int, ...]           # exact piece bytes delivered
    reads: tuple[int, ...]           # pieces delivered
    failover_bytes: tuple[int, ...]  # bytes re-read for another, failed source
    lands_last: tuple[int, ...]      # reads whose last-landing piece was this source's
    gap_ns: tuple[int, ...]          # summed lag of those last pieces behind the second-to-last, ns
    lat_ns: tuple[dict, ...]         # piece service time percentiles, ns
    reads_done: int                  # whole reads (barriers) completed
    bytes_done: int                  # bytes returned to callers
    hedged: tuple[int, ...] = ()     # hedge reads served for another source's late piece
    late: tuple[int, ...] = ()       # pieces that missed their deadline
    phases: dict = field(default_factory=dict)   # phase -> PhaseTally (a copy): the same per phase
    stolen: tuple[int, ...] = ()     # bytes read of pieces given to another source (balancing)


class PhaseTally:
    """One phase's counters (the lanes' lock guards them): what the split gave each source, what
    each source delivered, and the phase's whole reads."""

    __slots__ = ("given_bytes", "given_pieces", "bytes", "reads", "reads_done", "bytes_done", "largest_read")

    def __init__(self, n: int):
        self.given_bytes, self.given_pieces = [0] * n, [0] * n
        self.bytes, self.reads = [0] * n, [0] * n
        self.reads_done = self.bytes_done = self.largest_read = 0

    def copy(self) -> PhaseTally:
        t = PhaseTally(0)
        for k in self.__slots__:
            v = getattr(self, k)
            setattr(t, k, list(v) if isinstance(v, list) else v)
        return t


def read_piece(reader: ColdReader, buf, base: int, off: int, ln: int, scratch) -> None:
    """Exact bytes [off, off+ln) into `buf` (whose byte 0 is file offset `base`): the aligned
    interior directly, unaligned edges through a covering page of `scratch` (never touching a
    neighbour's bytes)."""
    a = reader.alignment
    buf = memoryview(buf)
    end = off + ln
    lo, hi = align_up(off, a), align_down(end, a)
    if lo >= hi:  # no whole aligned page inside the piece: one or two covering pages
        start = align_down(off, a)
        span = align_up(end, a) - start
        if reader.read_into(scratch[:span], start) < end - start:
            raise ShortRead()
        buf[off - base:end - base] = scratch[off - start:end - start]
        return
    if off < lo:
        if reader.read_into(scratch[:a], lo - a) < a:
            raise ShortRead()
        buf[off - base:lo - base] = scratch[off - (lo - a):a]
    if reader.read_into(buf[lo - base:hi - base], lo) < hi - lo:
        raise ShortRead()
    if hi < end:
        if reader.read_into(scratch[:a], hi) < end - hi:
            raise ShortRead()
        buf[hi - base:end - base] = scratch[:end - hi]


class Lanes:
    """`lanes` threads per source serving the attempts put on its queue; counters of what they did.
    sources: each source's files. hedger: a `hedger.Hedger` (deadlines, hedges, probes) sharing
    this object's lock, or None. reweigher: a `reweigher.Reweigher` fed under this object's lock, or None."""

    def __init__(self, sources: Sequence[SourceFiles], health: SourceHealth, lanes: int, pool=None, hedger=None,
                 reweigher=None, balance: BalancePolicy | None = None):
        n = len(sources)
        self.sources, self.health, self.lanes, self.pool = tuple(sources), health, lanes, pool
        self._lock = threading.Lock()
        self._bytes = [0] * n
        self._reads = [0] * n
        self._failover_bytes = [0] * n
        self._lands_last = [0] * n
        self._gap_ns = [0] * n
        self._lat = [array("q") for _ in range(n)]
        self._reads_done = 0
        self._bytes_done = 0
        self._phases: dict[str, PhaseTally] = {}
        self._alive = [lanes] * n
        self._abandoned = [False] * n     # closed while a read on it hangs: its last lane closes its reader
        self._queues = [LaneQueue(threading.Condition(self._lock)) for _ in range(n)]
        self.balance = balance          # None: each source reads exactly the pieces it was given
        self._inflight = [0] * n        # bytes of attempts a lane of the source has started, not yet ended
        self._pace = [RateEstimate(PACE_DECAY) for _ in range(n)]   # bytes over time with reads in the kernel
        self._pace_busy = [0] * n       # ns with reads in the kernel since the source's last delivery
        self._pace_tick = [0] * n
        self._stolen = [0] * n          # bytes a source read of pieces given to another (balancing)
        self._closing = False
        self.hedger = hedger
        self.reweigher = reweigher
        if hedger is not None:
            hedger.attach(self)
        self._threads = []
        for s in range(n):
            for k in range(lanes):
                t = threading.Thread(target=self._lane, args=(s,), name=f"split-reader-s{s}-l{k}", daemon=True)
                t.start()
                self._threads.append(t)

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def parts(self, off: int, ln: int) -> list[tuple[int, int]]:
        """How piece [off, off+ln) is queued: whole, or in chunks when balancing."""
        return [(off, ln)] if self.balance is None else chunks(off, ln, self.balance.chunk_bytes)

    def put(self, src: int, ticket: ReadTicket, off: int, ln: int) -> None:
        """Queue piece [off, off+ln) of `ticket` on source `src` (its main attempt; one per chunk
        when balancing: the ticket counts `len(self.parts(off, ln))` pieces for it)."""
        atts = []
        for co, cl in self.parts(off, ln):
            piece = PieceInFlight(ticket, src, co, cl)
            atts.append(Attempt(piece, src, MAIN, co, cl, ticket._work, ticket._base))
        with self._lock:
            tally = self._tally(ticket.phase)
            tally.given_bytes[src] += ln
            tally.given_pieces[src] += 1
            tally.largest_read = max(tally.largest_read, ticket.length)
            for att in atts:
                att.piece.active = 1
                ticket._writers += 1
                if self.hedger is not None:
                    self.hedger.enqueued(att)
                if self.reweigher is not None:
                    self.reweigher.queued(att)
                self._queues[src].put(att)
            if self.balance is not None:
                self._offer(src)

    def _tally(self, phase: str) -> PhaseTally:
        """The phase's counters (lock held), made on its first read."""
        t = self._phases.get(phase)
        if t is None:
            t = self._phases[phase] = PhaseTally(len(self.sources))
        return t

    def put_front(self, att: Attempt) -> None:
        """Queue a hedge or probe at the front of its source's queue (the hedger calls this, the lock held)."""
        if self.reweigher is not None:
            self.reweigher.queued(att)
        self._queues[att.src].put(att, front=True)

    def sample(self, src: int, off: int, ln: int, fi: int) -> None:
        """Queue a re-weighting sample on `src`: bytes [off, off+ln) of file `fi` read into a private
        buffer at the back of its queue (nobody waits for it; it only measures the drive)."""
        att = Attempt(None, src, SAMPLE, off, ln, self.pool.get(span(off, ln)), align_down(off), fi)
        with self._lock:
            if self.hedger is not None:
                self.hedger.sampled(att)
            if self.reweigher is not None:
                self.reweigher.queued(att)
            self._queues[src].put(att)

    def counters(self) -> LaneCounters:
        with self._lock:
            lat = [array("q", a) for a in self._lat]
            snap = (tuple(self._bytes), tuple(self._reads), tuple(self._failover_bytes), tuple(self._lands_last),
                    tuple(self._gap_ns), self._reads_done, self._bytes_done)
            hl = self.hedger.counters() if self.hedger is not None else ((0,) * len(self.sources),) * 2
            phases = {ph: t.copy() for ph, t in self._phases.items()}
            stolen = tuple(self._stolen)
        b, r, fb, ll, gap, rd, bd = snap
        return LaneCounters(b, r, fb, ll, gap, tuple(latency_summary(a) for a in lat), rd, bd, hl[0], hl[1], phases,
                            stolen)

    def close(self) -> list[int]:
        """Stop every lane after the attempts already queued and wait for them, except the lanes of a
        source with a late read still in the kernel (a hung drive must not hang close): those exit
        when it returns and the last one closes its reader. Returns the sources safe to close now."""
        if self.hedger is not None:
            self.hedger.stop()
        with self._lock:
            for s in range(len(self.sources)):
                self._abandoned[s] = self.hedger is not None and self.hedger.stuck(s)
            abandoned = list(self._abandoned)
            self._closing = True
            for q in self._queues:
                for _ in range(self.lanes):
                    q.put(None)
                q.cond.notify_all()
        for i, t in enumerate(self._threads):
            if not abandoned[i // self.lanes]:
                t.join()
        return [s for s in range(len(self.sources)) if not abandoned[s]]

    # -- balancing (the lock held) ---------------------------------------------------------

    def _tick_pace(self, s: int, now: int) -> None:
        if self._inflight[s] > 0:
            self._pace_busy[s] += now - self._pace_tick[s]
        self._pace_tick[s] = now

    def _inflight_add(self, s: int, nbytes: int) -> None:
        self._tick_pace(s, time.monotonic_ns())
        self._inflight[s] += nbytes

    def _pace_now(self, s: int) -> float | None:
        """Bytes per ns source `s` reads while it has reads in the kernel, the time since its last
        delivery included (a drive that stops delivering falls to 0); None until that rests on
        `depth_ns` of such time (a throttle's first burst is not its pace)."""
        self._tick_pace(s, time.monotonic_ns())
        e, busy = self._pace[s], self._pace_busy[s]
        if e.total_busy_ns + busy < max(1, self.balance.depth_ns):
            return None
        return e.bytes / (e.busy_ns + busy) if e.busy_ns + busy > 0 else math.inf

    def _room(self, s: int, nbytes: int) -> bool:
        """Whether source `s` may start `nbytes` more: it has nothing in the kernel, or what it has
        plus these stays within `depth_ns` of its pace."""
        return self._inflight[s] == 0 or self._inflight[s] + nbytes <= depth_limit(self._pace_now(s), self.balance)

    def _offers(self, thief: int) -> dict[int, tuple[int, Attempt]]:
        """Per other source, the first attempt of its queue `thief` could take: a main attempt of a
        piece nobody delivered or hedged, in a file `thief` holds."""
        out = {}
        for v, q in enumerate(self._queues):
            if v == thief:
                continue
            for k, att in enumerate(q.items):
                if k >= STEAL_SCAN:
                    break
                if att is not None and att.kind == MAIN and not att.piece.done and not att.piece.hedged \
                        and self.sources[thief].holds(att.fi):
                    out[v] = (k, att)
                    break
        return out

    def _steal(self, t: int) -> Attempt | None:
        """The attempt idle source `t` takes from another's queue, moved to `t`; None when taking
        any would not bring a read's barrier nearer."""
        if t not in self.health.healthy():
            return None
        offers = self._offers(t)
        if not offers:
            return None
        rates = {s: self._pace_now(s) for s in (t, *offers)}
        v = pick_victim(t, {s: att.ln for s, (_, att) in offers.items()}, self._inflight, rates)
        if v is None or not self._room(t, offers[v][1].ln):
            return None
        k, att = offers[v]
        del self._queues[v].items[k]
        if self.reweigher is not None:
            self.reweigher.moved(att, t)
        if self.hedger is not None:
            self.hedger.stolen(att, t)
        att.src = t
        att.stolen = True
        return att

    def _offer(self, src: int) -> None:
        """Work was queued on `src`: wake one idle lane of every source with nothing of its own to do."""
        for t, q in enumerate(self._queues):
            if t != src and q.idle and not q.items:
                q.cond.notify()

    def _take(self, src: int) -> Attempt | None:
        """The next attempt for a lane of `src` (the lock held; waits for one): the head of its
        queue (when balancing, once it has room in the kernel), else, when balancing, a chunk taken
        from another's queue; None: close."""
        q = self._queues[src]
        while True:
            if q.items:
                head = q.items[0]
                if (head is None or self.balance is None or head.kind != MAIN or head.piece.done
                        or self._room(src, head.ln)):
                    return q.items.popleft()
            elif self.balance is not None and not self._closing:
                att = self._steal(src)
                if att is not None:
                    return att
            # while work waits on another queue, one lane looks again soon: taking it may become worth it
            look = (self.balance is not None and not q.items and q.idle == 0
                    and any(o.items for o in self._queues if o is not q))
            q.idle += 1
            q.cond.wait(STEAL_LOOK_S if look else None)
            q.idle -= 1

    # -- the lane threads -----------------------------------------------------------------

    def _lane(self, src: int) -> None:
        scratch = memoryview(aligned_buffer(2 * ColdReader.alignment))
        while True:
            with self._lock:
                att = self._take(src)
                if att is None:
                    self._alive[src] -= 1
                    last = self._alive[src] == 0 and self._abandoned[src]
                else:
                    skip = att.piece is not None and att.piece.done
                    att.started = not skip
                    if not skip:
                        self._inflight_add(att.src, att.ln)
                        if self.reweigher is not None:
                            self.reweigher.started(att)
                        if self.hedger is not None and self.balance is not None:
                            self.hedger.started(att, self._inflight[att.src])
            if att is None:
                if last:
                    self.sources[src].close()
                return
            try:
                if skip:
                    self._end(att, att.src, ok=False)
                else:
                    self._serve(att, scratch)
            except BaseException as e:  # a bug must reach the caller, not kill the lane silently
                if att.piece is not None:
                    self._fail_piece(att, e)

    def _serve(self, att: Attempt, scratch) -> None:
        health, piece = self.health, att.piece
        s = att.src
        while True:
            t0 = time.monotonic_ns()
            try:
                files = self.sources[s]
                reader = files.acquire(att.fi)
                try:
                    read_piece(reader, att.buf, att.base, att.off, att.ln, scratch)
                finally:
                    files.release(att.fi)
            except (OSError, ShortRead) as e:
                health.piece_failed(s, att.off, att.ln, e, health.models[s].files[att.fi])
                if piece is None:            # a probe: the source is now degraded for good
                    self._end(att, s, ok=False)
                    return
                with self._lock:
                    if s not in piece.tried:
                        piece.tried.append(s)
                    nxt = None if piece.done else health.failover_source(piece.tried)
                    if nxt is not None:
                        self._inflight_add(s, -att.ln)
                        self._inflight_add(nxt, att.ln)
                        if self.hedger is not None:
                            self.hedger.moved(att, nxt)
                        if self.reweigher is not None:
                            self.reweigher.moved(att, nxt)
                        att.src = nxt
                if nxt is None:
                    self._end(att, s, ok=False, failed=not piece.done)
                    return
                health.event("failover", nxt, f"piece ({att.off}, {att.ln}) of source {s} re-read from source {nxt}",
                             att.off, att.ln, health.models[s].files[att.fi])
                s = nxt
                continue
            self._end(att, s, ok=True, t0=t0, t1=time.monotonic_ns())
            return

    def _end(self, att: Attempt, s: int, ok: bool, failed: bool = False, t0: int = 0, t1: int = 0) -> None:
        """An attempt is over (delivered, skipped, or out of sources): count it, land its piece if it
        won, and give back what nobody writes into any more."""
        piece = att.piece
        free: list = []
        finish = None
        no_source = None
        actions: list = []
        with self._lock:
            if self.hedger is not None:
                actions = self.hedger.ended(att, s, ok)
            if self.reweigher is not None:
                self.reweigher.ended(att, s, ok and att.started)
            if att.started:
                self._inflight_add(s, -att.ln)
                self._queues[s].cond.notify()       # room in the kernel for a lane waiting on it
                if ok:
                    self._pace[s].observe(att.ln, self._pace_busy[s])
                    self._pace_busy[s] = 0
            if ok:
                self._lat[s].append(t1 - t0)
            if piece is None:
                free.append(att.buf)
            else:
                ticket = piece.ticket
                piece.active -= 1
                if att.kind == MAIN:
                    ticket._writers -= 1
                    if ticket._orphan and ticket._writers == 0:
                        ticket._orphan = False
                        free.append(ticket._work)
                if ok and not piece.done:
                    piece.done = True
                    self._bytes[s] += att.ln
                    self._reads[s] += 1
                    tally = self._tally(ticket.phase)
                    tally.bytes[s] += att.ln
                    tally.reads[s] += 1
                    if att.kind == MAIN and att.stolen and s == att.src:
                        self._stolen[s] += att.ln
                    elif att.kind == MAIN and s != piece.src:
                        self._failover_bytes[s] += att.ln
                    if att.kind == HEDGE:
                        ticket._patches.append(att)
                    finish = self._landed(ticket, s, t1)
                elif att.kind == HEDGE:
                    free.append(att.buf)     # lost, or failed: its private buffer is nobody's now
                if failed and not piece.done and piece.active == 0:   # no other attempt may still deliver
                    piece.done = True
                    no_source = self._no_source(piece)
                    finish = self._landed(ticket, s, time.monotonic_ns(), error=no_source)
        if no_source is not None:
            self.health.event("all_failed", s, str(no_source), att.off, att.ln, piece.ticket.file)
        self._give_back(free)
        for act in actions:
            act()
        if finish is not None:
            self._finish(*finish)

    def _no_source(self, piece: PieceInFlight) -> MissingError:
        t = piece.ticket
        where = f" of {t.file}" if len(self.health.models[0].files) > 1 else ""
        return MissingError(f"split reader: no source could read ({piece.off}, {piece.ln}){where} of read "
                            f"({t.offset}, {t.length}); tried " + ", ".join(self.health.paths[i] for i in piece.tried)
                            + "; check the drives")

    def _fail_piece(self, att: Attempt, e: BaseException) -> None:
        piece = att.piece
        with self._lock:
            if self.reweigher is not None:
                self.reweigher.ended(att, att.src, False)
            if att.started:
                self._inflight_add(att.src, -att.ln)
            piece.active -= 1
            if att.kind == MAIN:
                piece.ticket._writers -= 1
            if piece.done:
                return
            piece.done = True
            finish = self._landed(piece.ticket, att.src, time.monotonic_ns(), error=e)
        if finish is not None:
            self._finish(*finish)

    def _landed(self, ticket: ReadTicket, src: int, t_ns: int, error: BaseException | None = None):
        """Count a piece in (lock held); when it was the read's last, what `_finish` needs."""
        if error is not None and ticket._error is None:
            ticket._error = error
        elif error is None:
            ticket._landings.append((src, t_ns))
        ticket._remaining -= 1
        if ticket._remaining:
            return None
        if ticket._error is None:
            ll = last_landing(ticket._landings)
            if ll is not None:
                self._lands_last[ll[0]] += 1
                self._gap_ns[ll[0]] += ll[1]
            self._reads_done += 1
            self._bytes_done += ticket.length
            tally = self._tally(ticket.phase)
            tally.reads_done += 1
            tally.bytes_done += ticket.length
        tainted = ticket._writers > 0 and ticket._work is ticket._buf
        return ticket, tainted, list(ticket._patches)

    def _finish(self, ticket: ReadTicket, tainted: bool, patches: list) -> None:
        """The barrier: hand the caller a buffer no late attempt writes into, then wake it."""
        free = [a.buf for a in patches]
        work = ticket._work
        if ticket._error is None:
            out = ticket._buf
            lo, hi = ticket.offset - ticket._base, ticket.offset - ticket._base + ticket.length
            if tainted:
                out = self.pool.get(len(work)) if self.pool is not None else aligned_buffer(len(work))
            if out is not work:
                memoryview(out)[lo:hi] = memoryview(work)[lo:hi]
            for a in patches:
                r0, r1 = a.off - a.base, a.off + a.ln - a.base
                memoryview(out)[a.off - ticket._base:a.off + a.ln - ticket._base] = memoryview(a.buf)[r0:r1]
            if tainted:
                ticket._buf, ticket._own_buf = out, True
        elif ticket._work is ticket._buf and ticket._writers:
            ticket._buf = None                # never handed back while a late read writes into it
        with self._lock:
            ticket._patches = []
            if work is not ticket._buf:
                if ticket._writers == 0:
                    free.append(work)
                else:
                    ticket._orphan = True
        self._give_back(free)
        ticket._done.set()

    def _give_back(self, bufs: list) -> None:
        if self.pool is not None:
            for b in bufs:
                self.pool.put(b)
