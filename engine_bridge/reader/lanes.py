"""The split reader's lanes: persistent threads per source that read pieces into a read's buffer.

Each source has a queue and `lanes` threads serving it (`os.preadv` releases the GIL, so lanes
overlap on 2 cores); a piece is read from the source's copy of the read's file (`files.SourceFiles`
opens it when first needed; `piece_io.read_piece` reads exact bytes of any range). A piece that
fails or comes back short is re-read from the source `SourceHealth` names; a read completes at
its barrier, when its last piece lands, and the lanes count who landed last and by how much
(`tally.py`).

With a hedger (`hedger.py`) a piece may have two attempts at once: its own (the *main* attempt,
reading into the read's work buffer) and a *hedge* on another source, reading into a private
buffer of its own. The first to complete wins; a main attempt whose piece is already won is
skipped if it has not started. A late main attempt cannot be stopped once its read is in the
kernel, so the buffer it writes into never reaches the caller or the pool while it may still
write: at the barrier such a read's bytes are copied to a fresh buffer, the hedges' bytes laid
over theirs (without holding the GIL: `buffers.copy_bytes`), and the old buffer is kept until its
last writer returns (`ReadTicket._writers`: main attempts a lane started, not those still queued —
a queued one whose piece another attempt won is skipped, and never writes); when such buffers
would overfill the pool it holds meanwhile only what those writers write: its memory goes back to
the OS at the barrier (`coldio.drop_pages`, `_gives_back`; docs/reader.md "Rounds 29, 30"). A main attempt a lane
starts on a source already on a late streak (`Hedger.streak`) reads into a buffer of its own,
laid over the read's like a hedge's when it wins: when it loses it holds only its own piece's
bytes, not the whole read's buffer and a fresh one for the copy (docs/reader.md "Round 28").

With balancing (`balancer.py`, rules in `balancing.py`) pieces are queued as chunks, a lane starts
its queue's head only while its source has room in the kernel, a lane takes a chunk of an earlier
read than its own queue's head from another's queue when it would finish it first, and a lane with
nothing of its own takes any such chunk or, with hedging, reads a copy of a chunk overdue in
another's kernel (`Hedger.copy_for`).

Everything the lanes, the hedger, the balancer and the re-weighting share is guarded by one lock
(`lock`): work moves between queues and counters in one step.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Final, Sequence

from core.errors import MissingError
from core.coldio import ColdReader, align_down, aligned_buffer, buffer_footprint, drop_pages

from .attempts import MAIN, SAMPLE, Attempt, Cut, LaneQueue, PieceInFlight, ReadTicket
from .balancer import Balancer
from .balancing import BalancePolicy
from .files import SourceFiles
from .buffers import copy_bytes, span
from .piece_io import read_piece
from .sources import ShortRead, SourceHealth
from .tally import LaneCounters, Tally

if TYPE_CHECKING:
    from .hedger import Hedger
    from .reweigher import Reweigher

__all__ = ["Lanes", "LaneCounters", "ReadTicket", "read_piece"]

STEAL_LOOK_S: Final = 0.02       # an idle lane looks again at least this often while work waits on another source
COST_EVERY: Final = 8            # a lane measures its CPU besides the read on one attempt in this many (`_serve`)


class Lanes:
    """`lanes` threads per source serving the attempts put on its queue; counters of what they did.
    sources: each source's files. hedger: a `hedger.Hedger` (deadlines, hedges, probes, copies)
    sharing this object's lock, or None. reweigher: a `reweigher.Reweigher` fed under this object's
    lock, or None. balance: balancing's policy (None: each source reads exactly the pieces it was
    given). clock: the balancer's, ns."""

    def __init__(self, sources: Sequence[SourceFiles], health: SourceHealth, lanes: int, pool=None,
                 hedger: Hedger | None = None, reweigher: Reweigher | None = None,
                 balance: BalancePolicy | None = None, clock=time.monotonic_ns):
        n = len(sources)
        self.sources, self.health, self.lanes, self.pool = tuple(sources), health, lanes, pool
        self._lock = threading.Lock()
        self.tally = Tally(n)
        self._alive = [lanes] * n
        self._abandoned = [False] * n     # closed while a read on it hangs: its last lane closes its reader
        self._queues = [LaneQueue(threading.Condition(self._lock)) for _ in range(n)]
        self.balance = balance
        whole = all(f.whole for f in self.sources)
        self.balancer = (Balancer(n, lanes, balance, None if whole else lambda s, fi: self.sources[s].holds(fi),
                                  health, clock) if balance is not None else None)
        self._closing = False
        self.hedger = hedger
        self.reweigher = reweigher
        if hedger is not None:
            hedger.attach(self._lock, self.put_front)
        self._threads = []
        for s in range(n):
            for k in range(lanes):
                t = threading.Thread(target=self._lane, args=(s,), name=f"split-reader-s{s}-l{k}", daemon=True)
                t.start()
                self._threads.append(t)

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    # -- queueing ----------------------------------------------------------------------------

    def parts(self, src: int, off: int, ln: int) -> list[tuple[int, int]]:
        """How piece [off, off+ln) of source `src` is queued: whole, or in chunks of its drive's size
        now when balancing (`Balancer.parts`)."""
        return [(off, ln)] if self.balancer is None else self.balancer.parts(src, off, ln)

    def chunk_sizes(self) -> tuple[int, ...]:
        """Each source's chunk size now (empty when not balancing)."""
        return () if self.balancer is None else tuple(self.balancer.chunk)

    def put(self, ticket: ReadTicket, pieces: list[tuple[int, int, int, list[tuple[int, int]]]]) -> None:
        """Queue the pieces of `ticket`, each (source, off, ln, parts): piece [off, off+ln) on that
        source as `parts` (`self.parts(source, off, ln)`: its main attempt, or one per chunk when balancing;
        the ticket counts `len(parts)` pieces for it). One turn of the lock for the whole read."""
        atts = []
        for src, off, ln, parts in pieces:
            cut = Cut(src, off, ln)
            for co, cl in parts:
                piece = PieceInFlight(ticket, src, co, cl, cut)
                atts.append(Attempt(piece, src, MAIN, co, cl, ticket._work, ticket._base))
        with self._lock:
            for src, _off, ln, _parts in pieces:
                self.tally.given(ticket, src, ln)
            if self.hedger is not None:
                ticket._mains = atts
                self.hedger.enqueued(atts)
            bal = self.balancer
            for att in atts:
                att.piece.active = 1
                if bal is not None:
                    bal.cut(att.src, att.ln)
                self._queues[att.src].put(att)
            if self.balance is not None:
                for src in {p[0] for p in pieces}:
                    self._offer(src)

    def put_front(self, att: Attempt) -> None:
        """Queue a hedge or probe at the front of its source's queue (the hedger calls this, the lock held)."""
        self._queues[att.src].put(att, front=True)

    def sample(self, src: int, off: int, ln: int, fi: int) -> None:
        """Queue a re-weighting sample on `src`: bytes [off, off+ln) of file `fi` read into a private
        buffer at the back of its queue (nobody waits for it; it only measures the drive)."""
        att = Attempt(None, src, SAMPLE, off, ln, self.pool.get(span(off, ln)), align_down(off), fi)
        with self._lock:
            if self.reweigher is not None:
                att.epoch = self.reweigher.epoch
            if self.hedger is not None:
                self.hedger.sampled(att)
            self._queues[src].put(att)

    def counters(self) -> LaneCounters:
        with self._lock:
            hl = self.hedger.counters() if self.hedger is not None else ((0,) * len(self.sources),) * 2
            return self.tally.counters(*hl)

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

    # -- what a lane does next (the lock held) -------------------------------------------------

    def _offer(self, src: int) -> None:
        """Work was queued on `src`: unless an idle lane of `src` starts it now, wake one idle lane of
        every other source with nothing of its own to do (as paces change, the one lane of each that
        looks again every STEAL_LOOK_S sees it). Work a lane of its own starts at once waits for
        nobody: waking the others for it cost a wake-up and a scan per piece for nothing; and with no
        such lane there is nobody to wake (a read that gave every drive a piece)."""
        for q in self._queues:
            if q.idle and not q.items:
                break
        else:
            return
        own = self._queues[src]
        if own.idle >= len(own.items):
            big = 0               # room for each queued chunk is room for the largest (`Balancer.room` gets stricter with size)
            for a in own.items:
                if a is not None and a.kind == MAIN and a.ln > big:
                    big = a.ln
            if self.balancer.room(src, big):
                return
        for t, q in enumerate(self._queues):
            if t != src and q.idle and not q.items:
                q.cond.notify()

    def _take(self, src: int) -> Attempt | None:
        """The next attempt for a lane of `src` (the lock held; waits for one): the head of its
        queue (when balancing, once it has room in the kernel), else, when balancing, a chunk taken
        from another's queue or a copy of one overdue in another's kernel; None: close."""
        q = self._queues[src]
        bal = self.balancer
        while True:
            roomless = elsewhere = False
            if q.items:
                head = q.items[0]
                if bal is None or head is None or head.kind != MAIN or head.piece.done:
                    return q.items.popleft()
                if not self._closing and bal.may_offer_earlier(src, self._queues, head.piece.ticket.seq):
                    att = self._others_work(src, before=head.piece.ticket.seq)
                    if att is not None:
                        return att
                if bal.room(src, head.ln):
                    return q.items.popleft()
                roomless = True
            elif bal is not None and not self._closing:
                elsewhere = self._elsewhere(src)         # nothing anywhere: nothing to take or copy
                if elsewhere:
                    att = self._others_work(src)
                    if att is not None:
                        return att
            # while work waits on another queue or in another kernel, one lane looks again soon: taking it
            # or copying it may become worth it as the drives' paces change
            look = elsewhere and not q.looking
            q.idle += 1
            q.roomless += roomless
            q.looking = q.looking or look
            q.cond.wait(STEAL_LOOK_S if look else None)
            if look:
                q.looking = False
            q.roomless -= roomless
            q.idle -= 1

    def _elsewhere(self, src: int) -> bool:
        """Whether work waits on another source's queue, or (copies) in a late drive's kernel."""
        for t, o in enumerate(self._queues):
            if t != src and o.items:
                return True
        return self.hedger is not None and self.balance.copies and self.hedger.out_elsewhere(src)

    def _others_work(self, t: int, before: int | None = None) -> Attempt | None:
        """What source `t` does for the others: a chunk of another's queue it would finish first,
        moved to it — with `before` (the head of its own queue is a piece of read `before`) only a
        chunk of an earlier read: a drive that fell behind, or crawls, holds the reads the engine
        waits for now while the others read later ones; idle (no `before`), any such chunk, else a
        copy of a chunk overdue in another's kernel; else nothing."""
        if t not in self.health.in_split:
            return None
        pick = self.balancer.victim(t, self._queues, before)
        if pick is not None:
            return self._steal(t, *pick)
        if before is not None:
            return None
        if self.hedger is not None and self.balance.copies:
            return self.hedger.copy_for(t, lambda: self.balancer.rate(t), lambda n: self.balancer.room(t, n))
        return None

    def _steal(self, t: int, v: int, k: int) -> Attempt:
        """Move the attempt at index `k` of source `v`'s queue to source `t`."""
        att = self._queues[v].items[k]
        assert att is not None          # `Balancer.victim` offers attempts only, never a lane's close
        del self._queues[v].items[k]
        if self.hedger is not None:
            self.hedger.stolen(att, t)
        att.src = t
        att.stolen = True
        return att

    # -- the lane threads -----------------------------------------------------------------

    def _lane(self, src: int) -> None:
        scratch = memoryview(aligned_buffer(2 * ColdReader.alignment))
        cpu = [0, COST_EVERY - 1]   # its CPU clock (ns) when its last read returned (0: not measured), its attempts
                                    # (the second is measured: the balancer sizes chunks from it)
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
                        self._begin(att)
            if att is None:
                if last:
                    self.sources[src].close()
                return
            try:
                if skip:
                    self._end(att, att.src, ok=False)
                else:
                    self._serve(att, scratch, cpu)
            except BaseException as e:  # a bug must reach the caller, not kill the lane silently
                if att.piece is not None:
                    self._fail_piece(att, e)

    def _begin(self, att: Attempt) -> None:
        """A lane starts `att` on its source (the lock held): a main attempt writes into its read's
        buffer from here (`ReadTicket._writers`), or, on a source on a late streak, into a buffer of
        its own (`Attempt.private`)."""
        if att.kind == MAIN and att.piece is not None:
            if self.hedger is not None and self.hedger.streak[att.src] > 0 and self.pool is not None:
                att.buf, att.base, att.private = self.pool.get(span(att.off, att.ln)), align_down(att.off), True
            else:
                att.piece.ticket._writers += 1
        if self.balancer is not None:
            self.balancer.started(att)
        if self.reweigher is not None:
            self.reweigher.started(att)
        if self.hedger is not None:
            self.hedger.started(att, self.balancer.inflight(att.src) if self.balancer is not None else None)

    def _serve(self, att: Attempt, scratch, cpu: list[int]) -> None:
        """Read `att` (failing over as its source's health says) and end it. With balancing the lane's
        CPU besides the read itself is measured (`thread_time_ns`, `cpu[0]` its clock when its last
        read returned: what it spent from there to this read, the last attempt's end and this one's
        start, is this attempt's cost) and handed to the balancer, the unit its chunks are sized in
        (`balancing.chunk_for`) — on one attempt in COST_EVERY: a thread's CPU clock is a system
        call (~1 µs in a VM), and two an attempt were six a decode read (docs/reader.md "Round
        30"); the balancer's figure is a decayed mean either way."""
        health, piece = self.health, att.piece
        s = att.src
        while True:
            t0 = time.monotonic_ns()
            try:
                files = self.sources[s]
                reader = files.acquire(att.fi)
                try:
                    before = time.thread_time_ns() if cpu[0] else 0
                    read_piece(reader, att.buf, att.base, att.off, att.ln, scratch)
                finally:
                    files.release(att.fi)
            except (OSError, ShortRead) as e:
                health.piece_failed(s, att.off, att.ln, e, health.models[s].files[att.fi])
                if piece is None:            # a probe or sample: a probe's source is now degraded for good
                    self._end(att, s, ok=False)
                    return
                with self._lock:
                    if s not in piece.tried:
                        piece.tried.append(s)
                    nxt = None if piece.done else health.failover_source(piece.tried)
                    if nxt is not None:
                        if self.balancer is not None:
                            self.balancer.moved(att, s, nxt)
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
            t1 = time.monotonic_ns()
            cost = None
            if self.balancer is not None:
                cost = before - cpu[0] if cpu[0] else None
                cpu[1] += 1
                cpu[0] = time.thread_time_ns() if cpu[1] % COST_EVERY == 0 else 0
            self._end(att, s, ok=True, t1=t1, served_ns=t1 - t0, cost_ns=cost)
            return

    # -- an attempt is over ------------------------------------------------------------------

    def _end(self, att: Attempt, s: int, ok: bool, failed: bool = False, t1: int = 0, served_ns: int = -1,
             cost_ns: int | None = None) -> None:
        """An attempt is over (delivered, skipped, or out of sources): count it (`served_ns`: its
        service time, when it was read; `cost_ns`: the lane's CPU for it besides the read), land
        its piece if it won, and give back what nobody writes into any more. One turn of the lock
        for all of it."""
        piece = att.piece
        free: list = []
        finish = None
        no_source = None
        actions: list = []
        with self._lock:
            if served_ns >= 0:
                self.tally.served(s, served_ns)
            if self.hedger is not None:
                actions = self.hedger.ended(att, s, ok)
            if self.reweigher is not None:
                self.reweigher.ended(att, s, ok and att.started)
            if att.started and self.balancer is not None:
                self.balancer.ended(att, s, ok, cost_ns)
                if self._queues[s].roomless:        # room in the kernel for a lane waiting on it (any other lane
                    self._queues[s].cond.notify()   # was woken by what it waits for: a spurious wake-up each)
            if piece is None:
                free.append(att.buf)
            else:
                ticket = piece.ticket
                piece.active -= 1
                if att.started and not att.private:
                    ticket._writers -= 1
                    if ticket._orphan and ticket._writers == 0:
                        ticket._orphan = False
                        free.append(ticket._work)
                if ok and not piece.done:
                    piece.done = True
                    self.tally.delivered(att, s)
                    if att.private:
                        ticket._patches.append(att)
                    finish = self._landed(piece, s, t1)
                    if finish is None and self.hedger is not None:
                        self.hedger.landed(ticket)
                elif att.private:
                    free.append(att.buf)     # lost, or failed: its private buffer is nobody's now
                if failed and not piece.done and piece.active == 0:   # no other attempt may still deliver
                    piece.done = True
                    no_source = self._no_source(piece)
                    finish = self._landed(piece, s, time.monotonic_ns(), error=no_source)
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
        assert piece is not None            # only a piece's attempts fail this way
        with self._lock:
            if self.reweigher is not None:
                self.reweigher.ended(att, att.src, False)
            if att.started and self.balancer is not None:
                self.balancer.ended(att, att.src, False)
            piece.active -= 1
            if att.started and not att.private:
                piece.ticket._writers -= 1
            if piece.done:
                return
            piece.done = True
            finish = self._landed(piece, att.src, time.monotonic_ns(), error=e)
        if finish is not None:
            self._finish(*finish)

    def _landed(self, piece: PieceInFlight, src: int, t_ns: int, error: BaseException | None = None):
        """Count a piece in (lock held; `src` read it); when it was the read's last, what `_finish` needs."""
        ticket = piece.ticket
        if self.balancer is not None:
            self.balancer.landed(piece.src, piece.ln)
        if error is not None and ticket._error is None:
            ticket._error = error
        elif error is None:
            ticket._landings.append((src, t_ns))
        ticket._remaining -= 1
        if ticket._remaining:
            return None
        ticket._mains = []          # they point back at it: a cycle only the garbage collector would free
        if ticket._error is None:
            self.tally.barrier(ticket)
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
                copy_bytes(out, lo, work, lo, hi - lo)
            for a in patches:
                copy_bytes(out, a.off - ticket._base, a.buf, a.off - a.base, a.ln)
            if tainted:
                ticket._buf, ticket._own_buf = out, True
        elif ticket._work is ticket._buf and ticket._writers:
            ticket._buf = None                # never handed back while a late read writes into it
        if work is not ticket._buf and ticket._writers and self._gives_back(work):
            # kept until its late writers return (seconds, on a crawler): its memory goes now but for
            # the pages they have pinned (docs/reader.md "Round 29"); nobody else can have it before
            # the lock below makes it an orphan, and a writer that returned meanwhile costs a refault
            drop_pages(work)
        with self._lock:
            ticket._patches = []
            if work is not ticket._buf:
                if ticket._writers == 0:
                    free.append(work)
                else:
                    ticket._orphan = True
        self._give_back(free)
        ticket._done.set()

    def _gives_back(self, work) -> bool:
        """Whether an old buffer kept for its late writers gives its memory back at the barrier: when
        a source's lanes holding one each would hold more than the pool keeps idle (a prefill's 32
        MiB reads under a RAM budget: 8 of them beside a crawler were a quarter GB, *Round 29*), or
        with no pool. A decode read's buffer goes back to the pool when its writer returns and is
        used again: its pages given back, its reuse faulted them in afresh (a huge page zeroed),
        0.08-0.5 page faults a decode read with the features where the plain reader takes 0.01
        (docs/reader.md "Round 30")."""
        return self.pool is None or buffer_footprint(len(work)) * self.lanes > self.pool.limit

    def _give_back(self, bufs: list) -> None:
        if self.pool is not None:
            for b in bufs:
                self.pool.put(b)
