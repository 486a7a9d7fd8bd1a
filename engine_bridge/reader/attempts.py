"""A read in flight and the attempts at its pieces: `ReadTicket` (what the caller waits on, and
whose buffers nobody may write into once handed back), `Cut` (one source's share of a read, as the
engine cut it), `PieceInFlight` (what the lanes queue of it: the whole cut, or one chunk of it when
balancing), `Attempt` (one read of a piece, or a probe, on one source) and `LaneQueue` (a source's
queue of attempts). The lanes, the hedger and the re-weighting move them."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Callable, Final

from core.errors import UsageError

# an attempt's kind (Final: the compiled modules use the value, not a lookup of the name)
MAIN: Final = "main"
HEDGE: Final = "hedge"
PROBE: Final = "probe"
SAMPLE: Final = "sample"       # a re-weighting measurement
_ORDER = itertools.count()          # reads in the order they were submitted (`ReadTicket.seq`)


class ReadTicket:
    """One read in flight: `result()` waits for its barrier and returns exactly its bytes.
    file: the model's file it reads (relative path), fi: that file's index in the model's files."""

    __slots__ = ("file", "fi", "offset", "length", "phase", "epoch", "_buf", "_base", "_remaining", "_landings", "_done",
                 "_error", "_pool", "_own_buf", "_work", "_writers", "_patches", "_orphan", "t_sub", "_mains", "seq",
                 "waiter")

    def __init__(self, offset: int, length: int, phase: str, buf, base: int, pieces: int, pool=None,
                 own_buf: bool | None = None, work=None, file: str = "", fi: int = 0):
        self.file, self.fi = file, fi
        self.offset, self.length, self.phase = offset, length, phase
        self.epoch = 0                     # re-weighting's weights it was cut with (-1: others than those in force)
        self._buf, self._base, self._pool = buf, base, pool
        self._own_buf = pool is not None if own_buf is None else own_buf   # _buf came from the pool
        self._work = buf if work is None else work    # where main attempts write (a pool buffer when not _buf)
        self._writers = 0                  # attempts started into _work (not `private`) and not yet over
        self._patches: list = []           # winning `private` attempts: their bytes go over _work's
        self._orphan = False               # _work goes back to the pool when its last writer returns
        self._remaining = pieces
        self._landings: list[tuple[int, int]] = []
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.t_sub = -1                    # hedger clock, ns, when its first piece was queued (-1: no hedger)
        self._mains: list[Attempt] = []    # its main attempts (with a hedger: a step's lateness looks at them)
        self.seq = next(_ORDER)            # submitted before every read of a higher seq (the engine waits in that order)
        # how a caller waits for the barrier (the hedger's `wait_for`: the wait keeps its time), or None
        self.waiter: Callable[[threading.Event], None] | None = None
        if pieces == 0:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def _wait(self) -> None:
        if not self._done.is_set():
            if self.waiter is None:
                self._done.wait()
            else:
                self.waiter(self._done)

    def result(self, timeout: float | None = None) -> memoryview:
        """The read's bytes once every piece is in (waiting for them: with a hedger and no `timeout`,
        this wait keeps the time of its deadlines, docs/reader.md "Hedged reads"); TimeoutError
        after `timeout` s."""
        if timeout is None:
            self._wait()
        elif not self._done.wait(timeout):
            raise TimeoutError(f"read ({self.offset}, {self.length}) still in flight after {timeout}s")
        if self._error is not None:
            raise self._error
        if self._buf is None:
            raise UsageError(f"read ({self.offset}, {self.length}): result() after release()")
        lo = self.offset - self._base
        return memoryview(self._buf)[lo:lo + self.length]

    def release(self) -> None:
        """Give the reader's buffer back for reuse by a later read (a fresh buffer's page faults
        cost more than a tmpfs read on a small VM). Views from `result()` must not be used after.
        A no-op for a caller's own buffer; waits for the read to finish first."""
        self._wait()
        buf, pool, own = self._buf, self._pool, self._own_buf
        self._buf, self._pool = None, None
        if own and pool is not None and buf is not None:
            pool.put(buf)


class Cut:
    """One source's share of a read as the engine cut it (its pieces in flight may be chunks of it):
    lateness is counted once per cut, however many chunks of it are late."""

    __slots__ = ("src", "off", "ln", "late")

    def __init__(self, src: int, off: int, ln: int):
        self.src, self.off, self.ln = src, off, ln
        self.late = False          # a chunk of it was late (counted in its source's streak)


class PieceInFlight:
    """One piece of a read: where it is planned, the engine's cut it belongs to, and the attempts at it."""

    __slots__ = ("ticket", "src", "off", "ln", "done", "active", "tried", "hedged", "cut", "copied")

    def __init__(self, ticket: ReadTicket, src: int, off: int, ln: int, cut: Cut | None = None):
        self.ticket, self.src, self.off, self.ln = ticket, src, off, ln
        self.cut = cut if cut is not None else Cut(src, off, ln)
        self.done = False          # won (its bytes are in) or failed on every source
        self.active = 0            # attempts not yet ended
        self.tried: list[int] = []
        self.hedged = False
        self.copied = False        # its hedge is an idle drive's copy, made before its deadline


class Attempt:
    """One read of a piece (or a probe) on one source, into `buf` whose byte 0 is offset `base` of
    the model's file `fi` (a piece's is its read's)."""

    __slots__ = ("piece", "src", "kind", "fi", "off", "ln", "buf", "base", "t_enq", "ahead", "late", "started",
                 "phase", "jumped", "t_start", "stolen", "t_begin", "epoch", "counted", "step_due", "watched", "private")

    def __init__(self, piece: PieceInFlight | None, src: int, kind: str, off: int, ln: int, buf, base: int, fi: int = 0):
        self.piece, self.src, self.kind, self.off, self.ln, self.buf, self.base = piece, src, kind, off, ln, buf, base
        self.fi = piece.ticket.fi if piece is not None else fi
        self.t_enq = 0             # hedger clock, ns, when queued on `src`
        self.ahead = 0             # bytes queued on `src` ahead of it when queued, itself included
        self.late = False          # missed its deadline
        self.started = False       # a lane took it
        self.phase = ""            # a probe's phase (a piece's is its ticket's)
        self.jumped = 0            # the source's front-of-queue bytes counter when queued
        self.t_start = 0           # re-weighting's clock, ns, when a lane took it
        self.stolen = False        # taken from another source's queue (balancing)
        self.t_begin = -1          # hedger clock, ns, when a lane took it (-1: not yet)
        self.epoch = piece.ticket.epoch if piece is not None else 0   # the weights its read was cut with
        self.counted = False       # its source's re-weighting window counts it (it is in the window's work)
        self.step_due: int | None = None   # hedger clock, ns: late by its step (`hedging.step_deadline_ns`)
        self.watched = 0           # its deadlines on the hedger's heap (the watchdog looks at it then)
        # reads into a buffer of its own, not its read's: a hedge always, a main attempt started on a
        # drive on a late streak (lanes.py `_begin`); its bytes are laid over the read's when it wins
        self.private = kind == HEDGE


class LaneQueue:
    """A source's queue: FIFO, with hedges and probes put at the front (a read is waiting on them).
    Its lanes wait on `cond`, a Condition of the lanes' one lock: every method is called with that
    lock held (work can then move between queues and counters in one step)."""

    def __init__(self, cond: threading.Condition):
        self.items: deque[Attempt | None] = deque()
        self.cond = cond
        self.idle = 0                 # lanes of this source waiting for work
        self.roomless = 0             # of them, those whose queue's head waits for room in the kernel (balancing)
        self.looking = False          # one of them waits with a timeout, to look again at the others' work

    def put(self, item: Attempt | None, front: bool = False) -> None:
        if front:
            self.items.appendleft(item)
        else:
            self.items.append(item)
        self.cond.notify()
