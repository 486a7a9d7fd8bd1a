"""The split reader's hedger: a watchdog that re-issues late pieces on the healthiest other replica.

Every main attempt has a deadline from when it is queued (`hedging.deadline_ns`: the bytes queued
on its source ahead of it over the rate the source is held to, times a margin, plus a request's
typical own time on these drives, `hedging.ServiceTime`; with balancing, from when a lane starts
it, over the bytes then in its drive's kernel). A drive already on a late streak is also judged
by the step: when the rest of a read has landed, its pieces still out are late at margin x the
time the others took (`landed`, `hedging.step_deadline_ns`) and hedged, and judged again at their
own deadline, where a lateness counts. Each source's pieces wait in a *line*, in the order they
were queued, and only the first piece still out in each line is on the watchdog's heap
(`_watch_head`: the one behind it is due later, and is watched when the first one's time comes).
While a drive is in trouble, pieces were put off or a caller waits on a read, the watchdog thread
sleeps until the earliest of those deadlines (before it sleeps it drops the deadlines of pieces
delivered since: a wake-up per delivered piece's deadline cost a 2-core machine's compute a few
percent of its decode, docs/reader.md "Round 7"); otherwise until woken, and a caller's wait for a
read keeps the time (`wait_for`: it wakes the watchdog once the earliest deadline passes with its
read still out; docs/reader.md "Round 33"). A piece still outstanding at its deadline is *late*: it is counted
(`late` on its source) and a hedge of it is put at the front of the healthiest other source's
queue (`hedged` on that source), reading into a private buffer. Whichever attempt completes first
wins (lanes.py); the loser is discarded. With balancing, a drive with nothing else to do reads a
copy of a chunk overdue in another's kernel before its deadline (`copy_for`); the chunk is still
judged at its deadline.

A source with `late_limit` late pieces in a row (one per engine cut, each started after the
previous one was judged late: `hedging.counts_late`; a piece on time between ends the run only
once the drive keeps up again: `_caught_up`) that also, since the first of them began, delivered
less than its weight's share of what the other healthy sources delivered and read, while it had
work, at less than its weight's share of their pace, over the margin (`hedging.behind`: a
throttled drive that stalls now and then still delivers its share; a slower drive whose queued
chunks balancing takes still reads at its pace) is degraded like a failing one (the split runs
over the others, its queued pieces are hedged at once), except that it is *probed*: a read's
submit also sends it a copy of (the first chunk of) the read's largest piece, into a private
buffer, judged against the same kind of deadline, one at a time (and at most one per
`probe_interval`); `recover_probes` on-time probes in a row restore it. Never the last healthy
source is degraded for lateness.

If the watchdog itself wakes later than a deadline's slack (the whole process was starved, not a
drive) it judges nothing that round and gives every due piece that much again, once. Its state lives under the
lanes' lock (one lock). Between rounds the watchdog sleeps on a bell of its own, a lock it acquires
with a timeout and others release to wake it (`_ring`): a Condition of the lanes' lock made each
round's wait a few thousand instructions of Python and a lock of its own (docs/reader.md "Round
31"). `clock` is injectable (ns) and `wake()` re-runs the watchdog now, so tests order events
without sleeping.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from heapq import heappop, heappush     # names of this module's own: a look-up of `heapq.` was a module's
                                        # attribute from compiled code at every push (docs/reader.md "Round 36")
from typing import Callable, Final, Sequence

from core.coldio import align_down
from core.units import plural

from .attempts import HEDGE, MAIN, PROBE, Attempt, ReadTicket
from .buffers import span
from .hedging import (
    HedgePolicy,
    RateEstimate,
    behind,
    copy_due,
    counts_late,
    ServiceTime,
    deadline_ns,
    expected_ns,
    held_rate,
    pick_hedge_source,
    rate_moved,
    step_deadline_ns,
)
from .sources import SourceHealth

RECHECK_NS: Final = 1_000_000     # at least this long before a piece nothing can judge yet is looked at again


def _unattached(att: Attempt) -> None:
    raise RuntimeError("hedger: a hedge or probe before the lanes attached it (Hedger.attach)")


class Drive:
    """One source's running counts, updated for every piece (the lanes' lock held). Fields of a
    native object, not lists by source: a list holds its ints as Python objects, and each update of
    an ns or byte count made a new one (docs/reader.md "Round 31")."""

    __slots__ = ("outstanding", "jumped", "busy", "tick_at", "observed_at", "delivered")

    def __init__(self) -> None:
        self.outstanding = 0            # bytes queued or being read on it
        self.jumped = 0                 # bytes ever put at the front of its queue (hedges, probes)
        self.busy = 0                   # ns it had work (queued or being read), in all
        self.tick_at = 0                # when `busy` was last brought up to date
        self.observed_at = 0            # `busy` when its rate estimate last learnt (or was told to forget)
        self.delivered = 0              # bytes it delivered, of every kind

    def tick(self, now: int) -> None:
        if self.outstanding > 0:
            self.busy += now - self.tick_at
        self.tick_at = now


class Hedger:
    """Deadlines, hedges, lateness and probes for one SplitReader (see the module docstring)."""

    def __init__(self, health: SourceHealth, weights: Sequence[int], decode_weights: Sequence[int], pool,
                 policy: HedgePolicy, clock: Callable[[], int] = time.monotonic_ns):
        # `weights` are the ones reads are cut with: the reader sets new ones when it re-weights (lock held)
        n = len(weights)
        self.health, self.pool, self.policy, self.clock = health, pool, policy, clock
        self.weights = {"prefill": tuple(weights), "decode": tuple(decode_weights)}
        self.given = {"prefill": [0] * n, "decode": [0] * n}   # bytes the cut gave each source (`_shares`)
        # (healthy sources, weights) `given` and `_memo` were kept for (`_sync`)
        self._split: tuple[Sequence[int], dict[str, tuple[int, ...]]] | None = None
        self._given_all = {"prefill": False, "decode": False}   # every healthy source was given some (`_shares`)
        self.est = [RateEstimate(policy.decay) for _ in range(n)]
        # each estimate's rate as the deadlines use it (`RateEstimate.rate(min_busy_ns)`, taken up once it
        # moved by more than `hedging.RATE_TOLERANCE`: `_learnt`)
        self.own: list[float | None] = [None] * n
        self.svc = ServiceTime(policy.decay)    # a request's typical service time: every deadline's floor
        self.drives = [Drive() for _ in range(n)]
        self.late = [0] * n
        self.hedged = [0] * n
        self.streak = [0] * n           # late pieces in a row (hedging.counts_late)
        self.counted_at: list[int | None] = [None] * n   # when the source's last counted lateness was judged
        # a streak's start: (ns, `delivered` then, `busy` then)
        self.span_from: list[tuple[int, list[int], list[int]] | None] = [None] * n
        self.pending: list[set[Attempt]] = [set() for _ in range(n)]   # main attempts queued or reading
        # each source's main attempts in the order they were queued (its *line*: `_watch_head`); the
        # ones over or moot leave it when they reach its head
        self.line: list[deque[Attempt]] = [deque() for _ in range(n)]
        self.probing = [False] * n
        self.next_probe = [0] * n
        self.probe_ok = [0] * n
        self.back = [False] * n         # restored since it was last taken out (`_restore`)
        self.relapse: list[float | None] = [None] * n   # taken out again while `back`: its pace then (`_degrade`)
        self.memory = math.ceil(1 / (1 - policy.decay))  # on-time pieces a rate estimate remembers
        # a source that rejoins after a relapse, and its pace then, over its weight's share of the
        # others' (the lanes' lock held) -> what to run once it is released, or None; the reader sets
        # it when it re-weights (`_restore`)
        self.comeback: Callable[[int, float], Callable[[], None] | None] | None = None
        self._heap: list[tuple[int, int, Attempt, int]] = []   # (due, order, attempt, source)
        # the rate each source is held to in each phase (`_rate`), and whether it is known: lists by
        # source, not a mapping (asked for every deadline: a tuple key and a lookup cost more than the rule)
        self._memo: dict[str, list[float | None]] = {"prefill": [None] * n, "decode": [None] * n}
        self._memo_ok: dict[str, list[bool]] = {"prefill": [False] * n, "decode": [False] * n}
        self._min_busy_ns = policy.min_busy_ns      # the policy's fields read for every deadline, kept natively
        self._floor_ns = policy.floor_ns
        self._margin = float(policy.margin)
        self._pushes = 0                   # the heap's entries so far: each entry's tie-break (an int of its own,
                                           # not `next()` of a counter: a builtin's call per push)
        self._stopping = False
        self._wake_at: int | None = None   # when the watchdog's timer wakes it (None: only a ring does)
        # the reads callers wait on (`wait_for`; one whose event is set is waited on no more: taken off
        # when looked at, so a caller leaves without the lanes' lock) ...
        self._waiting: list[threading.Event] = []
        self._wait_until: int | None = None     # ... the one's timed wait ends then (None: untimed, or several)
        self._caller_meant: int | None = None   # a caller's timed wait rang the watchdog: when it meant to
        self._deferred = False          # the last round put its due pieces off (starved): the next judges them
        self.rounds = 0                 # how many times the watchdog has looked ...
        self.timer_rounds = 0           # ... woken by a timer (its own, or a waiting caller's: not rung) ...
        self.judged_rounds = 0          # ... and found a piece still out to judge (the rest judged only landed ones)
        self._put_front: Callable[[Attempt], None] = _unattached   # the lanes': a hedge or probe ahead of a queue
        self._lock: threading.Lock | None = None
        # the watchdog's bell: a lock it sleeps on, acquiring it with a timeout; released (`_ring`, the
        # lanes' lock held) at most once before the watchdog hears it (`_rung`)
        self._bell = threading.Lock()
        self._bell.acquire()
        self._rung = False
        self._watchdog: threading.Thread | None = None
        # (source, file index) -> whether the source holds that file (a partial replica does not
        # hold every file); the reader sets it
        self.can_serve: Callable[[int, int], bool] = lambda src, fi: True

    def attach(self, lock: threading.Lock, put_front: Callable[[Attempt], None]) -> None:
        """Share the lanes' lock, queue hedges and probes with their `put_front`, and start the
        watchdog (Lanes calls this)."""
        self._put_front = put_front
        self._lock = lock
        self._watchdog = threading.Thread(target=self._run, name="split-reader-hedger", daemon=True)
        self._watchdog.start()

    # -- called by the lanes, lock held ---------------------------------------------------

    def enqueued(self, atts: list[Attempt]) -> None:
        """The main attempts of one read of the engine's cut are queued, in this order (counted in
        `_shares`): one call a read, one look at the clock and at the healthy sources for all of them."""
        if not atts:
            return
        self._sync(self.health.in_split)
        given = self.given[atts[0].piece.ticket.phase]
        for att in atts:
            given[att.src] += att.ln
        self._line_up(atts, self.clock())

    def _line_up(self, atts: list[Attempt], now: int) -> None:
        """Main attempts of one read are queued at `now`: each in its source's line, and each of those
        lines' head watched once they are all in it."""
        ticket = atts[0].piece.ticket
        if ticket.t_sub < 0:
            ticket.t_sub = now
        watch = len(self.est) > 1
        for att in atts:
            self._queue(att, now)
            if watch:
                self.pending[att.src].add(att)
                self.line[att.src].append(att)
        if watch:
            self._drop_moot(now)        # nobody may have looked since (the watchdog sleeps untroubled)
            last = -1
            for att in atts:            # a source's pieces come together: its line is looked at once (again
                if att.src != last:     # would be harmless: a head is watched once)
                    last = att.src
                    self._watch_head(last, now)

    def moved(self, att: Attempt, new: int) -> None:
        """A failing attempt goes on to source `new` (failover: no deadline of its own)."""
        now = self.clock()
        d = self.drives[att.src]
        d.tick(now)
        d.outstanding -= att.ln
        self.pending[att.src].discard(att)
        d = self.drives[new]
        d.tick(now)
        d.outstanding += att.ln
        att.step_due = None             # its step was its old drive's

    def stolen(self, att: Attempt, new: int) -> None:
        """A queued main attempt is taken by idle source `new` (balancing): queued there now, with a
        deadline of its own."""
        now = self.clock()
        d = self.drives[att.src]
        d.tick(now)
        d.outstanding -= att.ln
        self.pending[att.src].discard(att)
        att.src = new
        att.step_due = None             # judged on its new drive by that drive's pace
        self._line_up([att], now)

    def started(self, att: Attempt, inflight: int | None) -> None:
        """A lane took `att`; with balancing, with `inflight` bytes (itself included) in the kernel on
        its source: when balancing keeps most of a share queued, a piece's deadline runs from here,
        over what is really ahead of it — put on the heap now for the head of its line and for a
        chunk taken from another drive (it starts ahead of its new drive's queue); any other was
        started behind the head, over bytes that include the head's, and is watched after it."""
        att.t_begin = self.clock()
        if inflight is None or att.kind != MAIN or att not in self.pending[att.src]:
            return
        att.t_enq, att.ahead, att.jumped = att.t_begin, inflight, self.drives[att.src].jumped
        if att.stolen or self._head(att.src) is att:
            due = self._deadline(att)
            if due is not None:
                self._push(due, att, att.src)

    def ended(self, att: Attempt, s: int, ok: bool) -> list:
        """An attempt on source `s` is over; returns what to do once the lock is released."""
        now = self.clock()
        d = self.drives[s]
        d.tick(now)
        d.outstanding -= att.ln
        self.pending[s].discard(att)
        if att.kind == PROBE:
            self.probing[s] = False
            self.next_probe[s] = now + self.policy.probe_interval_ns
            due = self._deadline(att)
            if ok and (due is None or now <= due):
                self.probe_ok[s] += 1
                if self.probe_ok[s] >= self.policy.recover_probes:
                    self.probe_ok[s] = 0
                    return [lambda: self._restore(s)]
            else:
                self.probe_ok[s] = 0
            return []
        if ok and att.started:
            d.delivered += att.ln
            learnt = d.busy - d.observed_at
            d.observed_at = d.busy
            if not att.late:                # a late delivery teaches nothing about the drive's normal pace
                self.est[s].observe(att.ln, learnt)
                self._learnt(s)
                if att.kind == MAIN:
                    # a request's own time: its service over the requests in the kernel with it
                    self.svc.observe((now - att.t_begin) * att.ln // max(att.ln, att.ahead))
                    if self.streak[s] and self._caught_up(s, att.piece.ticket.phase, now):
                        self._on_time(s)
        return []

    def landed(self, ticket: ReadTicket) -> None:
        """A piece of `ticket` won and others are still out (lock held): when every piece still out
        is on a drive already on a late streak, each gets a deadline in units of the step
        (`hedging.step_deadline_ns`: margin x what the others needed for their share of this read),
        so a crawler's pieces are hedged at the engine's pace before the verdict that takes it out."""
        if not self._any_streak() or ticket.t_sub < 0:
            return
        out = [a for a in ticket._mains if not a.piece.done]
        if not out or not all(self.streak[a.src] for a in out):
            return
        now = self.clock()
        due = step_deadline_ns(ticket.t_sub, now, self.policy, self.svc.typical_ns())
        for a in out:
            if a.late or a.piece.hedged or a.step_due is not None or a not in self.pending[a.src]:
                continue
            a.step_due = due
            self._push(due, a, a.src)

    def counters(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(hedged, late) per source."""
        return tuple(self.hedged), tuple(self.late)

    def copy_for(self, t: int, pace: Callable[[], float | None], room) -> Attempt | None:
        """Idle source `t` (nothing of its own queued, nothing to take), reading at `pace()` (bytes per
        ns, its pace; asked only when some drive is on a late streak): a hedge attempt on `t` of the
        chunk most past its expected time in the kernel of a source on a late streak (a piece late,
        and it has not kept up since: `_caught_up`) that `t` would read before that chunk's deadline
        (`hedging.copy_due`), if `room(bytes)` lets `t` start it; None. The copy is counted `hedged`
        on `t`; the chunk is still judged at its deadline (a drive that keeps needing copies is late
        all the same)."""
        if not self._any_streak():
            return None
        rate = pace()
        if rate is None or rate <= 0:
            return None
        now = self.clock()
        healthy = self.health.in_split
        best = None
        for s, atts in enumerate(self.pending):
            if s == t or not self.streak[s]:        # only a drive already late that has not kept up since:
                continue                            # a healthy one merely past its mean is left alone
            for att in atts:
                piece = att.piece
                if not att.started or att.late or piece.done or piece.hedged or not self.can_serve(t, att.fi):
                    continue
                exp = expected_ns(self._ahead(att), self._rate(s, piece.ticket.phase, healthy))
                mine = 0.0 if math.isinf(rate) else att.ln / rate
                over = copy_due(now, att.t_enq, exp, self._deadline(att), mine)
                if over is not None and (best is None or over > best[0]):
                    best = (over, att)
        if best is None or not room(best[1].ln):
            return None
        att = best[1]
        piece = att.piece
        if att.src not in piece.tried:
            piece.tried.append(att.src)
        piece.tried.append(t)
        hatt = Attempt(piece, t, HEDGE, piece.off, piece.ln, self.pool.get(span(piece.off, piece.ln)),
                       align_down(piece.off))
        piece.hedged = piece.copied = True
        piece.active += 1
        self.hedged[t] += 1
        self._queue(hatt, now)
        return hatt

    def out_elsewhere(self, t: int) -> bool:
        """Whether a source other than `t`, on a late streak, has a main chunk in its kernel (one a
        copy might help)."""
        return self._any_streak() and any(a.started and not a.piece.done for s, atts in enumerate(self.pending)
                                        if s != t and self.streak[s] for a in atts)

    def stuck(self, s: int) -> bool:
        """A read on `s` may hang in the kernel: it is degraded for lateness with work out, or a
        late attempt on it has started."""
        return (self.health.slow(s) and self.drives[s].outstanding > 0) or any(a.late and a.started for a in self.pending[s])

    # -- called by the reader -------------------------------------------------------------

    def maybe_probe(self, s: int, off: int, ln: int, phase: str, fi: int = 0) -> None:
        """Send degraded-for-lateness source `s` a probe of (off, ln) of file `fi` if one is due."""
        with self._lock:
            now = self.clock()
            if self._stopping or self.probing[s] or now < self.next_probe[s] or not self.health.slow(s):
                return
            self.probing[s] = True
            att = Attempt(None, s, PROBE, off, ln, self.pool.get(span(off, ln)), align_down(off), fi)
            att.phase = phase
            self._queue(att, now, front=True)
            self._put_front(att)

    def sampled(self, att: Attempt) -> None:
        """A re-weighting sample is queued on its source (lock held): counted as work outstanding there."""
        self._queue(att, self.clock())

    def wait_for(self, done: threading.Event) -> None:
        """A caller waits for a read (`ReadTicket.result`): until `done`, keeping the watchdog's time
        while it sleeps untimed. Untroubled, the watchdog keeps no timer of its own (`_keeps_time`):
        every deadline it set woke it, nearly always for a piece already in, and each wake-up cost
        the cores the engine computes on (docs/reader.md "Round 33"). So the caller's own wait ends
        at the earliest deadline; if that passes with the read still out, it rings the watchdog,
        which keeps time from then on for as long as anyone waits, and waits on untimed."""
        if done.is_set():
            return
        with self._lock:
            until: int | None = None
            now = self.clock()
            timed = self._wake_at is None and not self._stopping
            if timed:                   # (before it is counted: a piece watched in a landed one's place is
                self._drop_moot(now)    # no reason to wake the watchdog)
            alone = self._waiters() == 0
            self._waiting.append(done)
            self._wait_until = None
            if timed and self._heap:
                until = self._heap[0][0]
                if alone:
                    self._wait_until = until
        # it leaves without the lock: taking it again once the read is in would put the lanes'
        # busiest lock on the engine's way back from every barrier
        if until is not None and not done.wait(max(0, until - now) / 1e9):
            with self._lock:
                self._wait_until = None
                if self._wake_at is None and not done.is_set():   # not rung meanwhile (it keeps time then)
                    self._caller_meant = max(until, now)    # (a deadline passed before the wait began is no starving)
                    self._ring()
        done.wait()

    def _waiters(self) -> int:
        """How many callers wait on a read now (lock held): the reads they wait on that are not in yet."""
        w = self._waiting
        n = 0
        for e in w:
            if not e.is_set():
                n += 1
        if n < len(w):
            w[:] = [e for e in w if not e.is_set()]
        return n

    def wake(self) -> None:
        """Run the watchdog now (tests advance their clock, then call this)."""
        with self._lock:
            self._ring()

    def watchdog_counts(self) -> dict[str, int]:
        """How often the watchdog looked, how often a timer woke it (its own or a waiting caller's),
        and how often it found a piece still out to judge (docs/reader.md "Round 32", "Round 33")."""
        with self._lock:
            return {"rounds": self.rounds, "timer": self.timer_rounds, "judged": self.judged_rounds}

    def watch(self) -> tuple[int, int | None]:
        """(how many times the watchdog has looked, the next deadline it looks at — its timer's, or,
        when it keeps none, the earliest a waiting caller would wake it for: ns, None when no piece
        is out); tests order on the first."""
        with self._lock:
            if self._wake_at is None:
                self._drop_moot(self.clock())
                return self.rounds, self._heap[0][0] if self._heap else None
            return self.rounds, self._wake_at

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._ring()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()

    # -- inside -----------------------------------------------------------------------------

    def _recheck(self) -> int:
        return max(self._slack(), RECHECK_NS)

    def _slack(self) -> int:
        """The least time a deadline gives beyond a drive's expected time: the floor and a request's
        typical service time (the watchdog waking later than that was starved itself)."""
        return self.policy.floor_ns + int(self.svc.typical_ns())

    def _busy_now(self, now: int) -> list[int]:
        """Every source's busy ns in all, up to `now`."""
        for d in self.drives:
            d.tick(now)
        return [d.busy for d in self.drives]

    def _delivered(self) -> list[int]:
        """Every source's bytes delivered, in all."""
        return [d.delivered for d in self.drives]

    def _any_streak(self) -> bool:
        """Whether any drive is on a late streak: asked at every piece that lands and at every look
        for work elsewhere (a loop here; `any(self.streak)` was a call of the builtin from compiled
        code, ~500 instructions each, docs/reader.md "Round 36")."""
        for k in self.streak:
            if k:
                return True
        return False

    def _on_time(self, s: int) -> None:
        """A piece of `s` landed on time: its late streak is over."""
        self.streak[s] = 0
        self.span_from[s] = None

    def _caught_up(self, s: int, phase: str, now: int) -> bool:
        """Whether an on-time piece of `s`, on a late streak, ends it: it does once the degrade verdict
        (`_behind`) would keep `s`. A drive throttled to a crawl still lands a piece on time now and
        then (a token bucket lets a few through after each stall): had each such piece ended its
        streak, a drive at a tenth of its peers' speed would never reach `late_limit` in a row, and
        stayed in the split for good in 4 of 6 fast runs (docs/reader.md "Round 12"). A drive that
        only stalled, or only reads slower, keeps up with its pace and ends its streak as before."""
        return self._behind(s, phase, now) is None

    def _count_late(self, att: Attempt, now: int) -> None:
        """`att` missed its deadline: counted on its source, and in its streak when
        `hedging.counts_late` says so (the first of a streak opens its span)."""
        s = att.src
        self.late[s] += 1
        cut = att.piece.cut
        if not counts_late(att.t_begin, self.counted_at[s], cut.late):
            return
        cut.late = True
        if self.streak[s] == 0:
            self.span_from[s] = (att.t_begin, self._delivered(), self._busy_now(now))
        self.streak[s] += 1
        self.counted_at[s] = now

    def _behind(self, s: int, phase: str, now: int) -> tuple[str, float] | None:
        """Why `s` is too slow to keep, in words (the figures the degrade event carries), and its pace
        over its weight's share of theirs (its bytes over its share of theirs when its pace is not
        known), or None:
        since its streak began it delivered less than its weight's share of what the other healthy
        sources delivered, over the margin, *and* read, while it had work, at less than its weight's
        share of their pace over the margin (`hedging.behind`).
        The weights, not the cut's shares (`_shares`): while a crawler holds every read, the others
        deliver only what the engine asks between its stalls, so a drive at a twentieth of their
        speed delivers a third of their bytes, at the margin's edge; a cut that gives it a block
        less than its weight (ds4's leftovers go to the lower indices) kept a 1 MB/s drive beside two
        of 20 MB/s in the split for 26 s or for good, with hedging only (docs/reader.md "Round 11").
        The pace as well as the bytes: balancing takes a slower drive's queued chunks, so a drive at
        half its weight's speed delivers under a third of its share of the bytes, yet reads at half
        its share of the pace; a crawler is short of both (docs/reader.md "Round 13")."""
        began = self.span_from[s]
        if began is None:
            return None
        t0, base, busy0 = began
        got = [d - b for d, b in zip(self._delivered(), base)]
        spent = [b - b0 for b, b0 in zip(self._busy_now(now), busy0)]
        verdict = behind(s, got, spent, self.weights[phase], self.health.in_split, self.policy.margin)
        if verdict is None:
            return None
        share, rate, held = verdict
        why = (f"in the last {max(0, now - t0) / 1e9:.2f} s it delivered {got[s] / 1e6:.1f} MB, its weight's share "
               f"of what the others delivered is {share / 1e6:.1f} MB")
        if rate is None or held is None:
            return why, (got[s] / share if share > 0 else 0.0)
        return (f"{why}; it read at {_mbs(rate)} while it had work, its weight's share of their pace is {_mbs(held)}",
                0.0 if math.isinf(held) else (1.0 if math.isinf(rate) else rate / held))

    def _sync(self, healthy: Sequence[int]) -> None:
        """When the healthy sources or the weights changed (each a new object then): the cut's bytes
        are counted afresh and no rate held to is kept."""
        if self._split is None or healthy is not self._split[0] or self.weights is not self._split[1]:
            self._split = (healthy, self.weights)
            self.given = {ph: [0] * len(g) for ph, g in self.given.items()}
            self._given_all = {ph: False for ph in self.given}
            self._forget()

    def _shares(self, s: int, phase: str, healthy: Sequence[int]) -> Sequence[float]:
        """What each source is promised beside the others in `phase`, to judge `s`: the bytes the
        engine's cut gave each since the healthy sources or the weights last changed — a cut in
        blocks need not follow the weights (two drives at 1:1 given 573,440 and 262,144 B of each
        835,584-byte read: the smaller requests of the second, bound by a request's latency, came
        in at half the first's rate, and held to the first's it was judged late ~40 times a run;
        docs/reader.md "Round 11") — or the weights, until every healthy source was given some, and
        for a source out of the split (probed: the cut gives it nothing, its weight says what it
        should deliver). The caller has `_sync`ed."""
        if s not in healthy:
            return self.weights[phase]
        g = self.given[phase]
        if not self._given_all[phase]:      # `given` only grows until the next `_sync`: once is enough
            for i in healthy:
                if g[i] <= 0:
                    return self.weights[phase]
            self._given_all[phase] = True
        return g

    def _queue(self, att: Attempt, now: int, front: bool = False) -> None:
        d = self.drives[att.src]
        d.tick(now)
        att.t_enq = now
        att.ahead = d.outstanding + att.ln
        att.jumped = d.jumped
        d.outstanding += att.ln
        if front:
            d.jumped += att.ln

    def _rate(self, s: int, phase: str, healthy: Sequence[int]) -> float | None:
        """The rate `s` is held to: the faster of what it delivered itself and what its share of the
        cut (`_shares`) promises from its healthy peers' rates (`hedging.held_rate`; a rate counts
        once it rests on `min_busy_ns` of busy time), kept until a source's own rate moves
        (`_learnt`) or the weights or the healthy sources change (asked for every deadline: a line's
        head's, and a late streak's pieces')."""
        self._sync(healthy)
        ok, memo = self._memo_ok[phase], self._memo[phase]
        if not ok[s]:
            memo[s] = held_rate(s, self.own, self._shares(s, phase, healthy), healthy)
            ok[s] = True
        return memo[s]

    def _learnt(self, s: int) -> None:
        """Source `s`'s estimate learnt (or was begun afresh): its own rate is taken up, and no rate
        held to is kept, once it moved by more than `hedging.RATE_TOLERANCE` of the one in use
        (`hedging.rate_moved`); within it, the deadlines keep the rates they had."""
        rate = self.est[s].rate(self._min_busy_ns)
        if rate_moved(self.own[s], rate):
            self.own[s] = rate
            self._forget()

    def _forget(self) -> None:
        """No rate held to is kept (`_rate` works them out again when asked)."""
        for ok in self._memo_ok.values():
            for i in range(len(ok)):
                ok[i] = False

    def _ahead(self, att: Attempt) -> int:
        """The bytes ahead of `att` on its source, itself included: what was queued ahead of it when
        it was queued (or, balancing, in the kernel when it started), plus what jumped the queue
        since (a hedge put in front of it delays it; that is not its drive's fault)."""
        return att.ahead + (self.drives[att.src].jumped - att.jumped if att.kind == MAIN else 0)

    def _deadline(self, att: Attempt) -> int | None:
        """When `att` is late."""
        due = self._own_due(att)
        if att.step_due is not None and (due is None or att.step_due < due):
            return att.step_due
        return due

    def _own_due(self, att: Attempt) -> int | None:
        """When `att` is late by its drive's own pace (its step's aside)."""
        phase = att.piece.ticket.phase if att.piece is not None else att.phase
        return deadline_ns(att.t_enq, self._ahead(att), self._rate(att.src, phase, self.health.in_split),
                           self._floor_ns, self._margin, self.svc.typical_ns())

    def _run(self) -> None:
        meant: int | None = None        # its last sleep timed out: when it meant to wake (how much later it
        while True:                     # holds the lanes' lock again is how long it was starved)
            actions: list = []
            timeout = -1.0              # the bell's wait: seconds, or -1 until rung
            with self._lock:
                self.rounds += 1
                if self._stopping:
                    return
                floor = max(self._slack(), RECHECK_NS)
                now = self.clock()
                if meant is None and self._caller_meant is not None:    # a waiting caller's timer rang it
                    meant = self._caller_meant
                self._caller_meant = None
                skew = 0 if meant is None else now - meant
                due = self._due(now)
                if meant is not None:
                    self.timer_rounds += 1
                if due and skew > floor and not self._deferred:     # we were starved, not the drives:
                    self._deferred = True                           # look again later, once (a machine
                    for att, s in due:                              # always this loaded would defer forever)
                        self._push(now + floor, att, s)
                else:
                    if due:                     # put off once: judged now, however late this round is (a
                        self._deferred = False  # round rung in between, with nothing due, changes nothing)
                    judged = False
                    while due:
                        for att, s in due:
                            judged = self._judge(att, now, actions) or judged
                            self._watch_head(s, now)
                        due = self._due(now)    # the next in a line may be past its deadline already
                    if judged:
                        self.judged_rounds += 1
                if not actions:
                    self._drop_moot(now)
                    self._wake_at = self._heap[0][0] if self._heap and self._keeps_time() else None
                    if self._wake_at is not None:
                        timeout = max(0, self._wake_at - now) / 1e9
                if self._rung:                  # rung while it looked, or heard already: heard now
                    self._bell.acquire(False)
                    self._rung = False
                wake_at = self._wake_at
            meant = None
            for act in actions:
                act()
            if not actions and not self._bell.acquire(True, timeout) and wake_at is not None:
                meant = max(wake_at, now)

    def _keeps_time(self) -> bool:
        """Whether the watchdog sleeps on a timer of its own: while a caller waits on a read (it took
        the time over from the caller's wait, `wait_for`), or a drive is in trouble — on a late streak,
        probed, or out of the split — or pieces were put off (starved). Otherwise nobody needs a
        piece judged before someone waits for it, and a waiting caller's wait keeps the time."""
        return (self._waiters() > 0 or self._deferred or self._any_streak() or any(self.probing)
                or len(self.health.in_split) < len(self.streak))

    def _drop_moot(self, now: int) -> None:
        """Take the heap's earliest entries off while judging them would do nothing (`_moot`), each
        source's next piece watched in their place: the earliest left is a deadline that matters."""
        while self._heap and self._moot(self._heap[0][2]):
            self._watch_head(self._pop()[1], now)

    def _push(self, due: int, att: Attempt, s: int) -> None:
        """Put `att`, in source `s`'s line, on the watchdog's heap at `due`. When that is now its
        earliest, wake the watchdog if it keeps time (it sleeps to an earlier deadline no more), or
        if it does not and a caller waits untimed or to a later one (`wait_for`); nobody waiting, it
        is judged once someone waits (or the watchdog wakes for another)."""
        self._pushes += 1
        heappush(self._heap, (due, self._pushes, att, s))
        att.watched += 1
        if self._heap[0][2] is att and (self._wake_at is not None or (
                (self._wait_until is None or due < self._wait_until) and self._waiters() > 0)):
            self._ring()

    def _ring(self) -> None:
        """Wake the watchdog (lanes' lock held), once however often it is rung before it hears it."""
        if not self._rung:
            self._rung = True
            self._bell.release()

    def _due(self, now: int) -> list[tuple[Attempt, int]]:
        """Every heap entry due by `now`, taken off the heap (`_pop`)."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(self._pop())
        return due

    def _pop(self) -> tuple[Attempt, int]:
        """The heap's earliest: (attempt, the source whose line it was put on the heap for)."""
        _, _, att, s = heappop(self._heap)
        att.watched -= 1
        return att, s

    def _head(self, s: int) -> Attempt | None:
        """The first attempt in source `s`'s line that judging would not skip (`_moot`), or None; the
        ones before it leave the line."""
        line = self.line[s]
        while line:
            att = line[0]
            if att.src == s and not self._moot(att):
                return att
            line.popleft()
        return None

    def _watch_head(self, s: int, now: int) -> None:
        """Put the head of source `s`'s line on the heap at its deadline, unless it is there already.
        Only a line's head is watched: a drive serves its queue in order, so a piece behind another
        on the same drive has the later deadline (queued later, behind more bytes, or started
        later over bytes that include the head's) — when the head's entry comes due, the one behind
        it is watched in turn (stolen pieces, which start before their new drive's queue, are
        watched from when they start: `started`). Two deadlines worked out a piece and a heap entry
        each, when most pieces land long before either, cost fast drives a measurable part of the
        reader's CPU (docs/reader.md "Round 20")."""
        att = self._head(s)
        if att is not None and not att.watched:
            due = self._deadline(att)
            self._push(now + self._recheck() if due is None else due, att, s)

    def _moot(self, att: Attempt) -> bool:
        """Whether judging `att` would do nothing, now and later: it was judged late already, it is over
        (or moved: a stolen one has a deadline of its own), or its piece was delivered or hedged (a
        copy's chunk that started is still judged)."""
        piece = att.piece
        return (att.late or att not in self.pending[att.src]
                or ((piece.done or piece.hedged) and not (piece.copied and att.started)))

    def _judge(self, att: Attempt, now: int, actions: list) -> bool:
        """Judge `att` at its deadline (or put it back on the heap when its deadline moved on);
        False when there was nothing to judge (`_moot`)."""
        piece, s = att.piece, att.src
        if self._moot(att):
            return False
        due = self._deadline(att)
        if due is None or due > now:
            self._push(now + self._recheck() if due is None else due, att, s)
            return True
        if att.step_due is not None and att.step_due <= now and not self._own_late(att, now):
            # late by its step only: hedged now, like an idle drive's copy, and still judged at its own
            # deadline (where a lateness counts in its streak); the step's lateness is not counted
            att.step_due = None
            if not piece.hedged and not piece.done and att.started and self._hedge(att, now):
                piece.copied = True
            own = self._deadline(att)
            if own is not None:
                self._push(own, att, s)
            return True
        att.late = True
        self._count_late(att, now)
        if not piece.hedged and not piece.done:
            self._hedge(att, now)
        if self.streak[s] >= self.policy.late_limit and not self.health.slow(s):
            verdict = self._behind(s, piece.ticket.phase, now)
            if verdict is not None:
                n = self.streak[s]
                why, pace = verdict
                # taken out again before `memory` pieces on time since it came back (its estimate
                # was begun afresh then): a relapse
                relapse = pace if self.back[s] and self.est[s].n < self.memory else None
                self._on_time(s)
                actions.append(lambda: self._degrade(s, n, why, relapse))
        return True

    def _own_late(self, att: Attempt, now: int) -> bool:
        """Whether `att` is past the deadline of its drive's own pace (not only its step's)."""
        due = self._own_due(att)
        return due is not None and due <= now

    def _hedge(self, att: Attempt, now: int) -> bool:
        """Put a hedge of `att`'s piece at the front of the healthiest other source (lock held)."""
        piece = att.piece
        if att.src not in piece.tried:
            piece.tried.append(att.src)
        healthy = self.health.in_split
        cands = [i for i in healthy if i not in piece.tried and self.can_serve(i, att.fi)]
        phase = piece.ticket.phase
        rates = {i: self._rate(i, phase, healthy) for i in cands}
        h = pick_hedge_source(att.src, cands, [d.outstanding for d in self.drives], piece.ln, rates, self.weights[phase])
        if h is None:
            return False
        piece.tried.append(h)
        hatt = Attempt(piece, h, HEDGE, piece.off, piece.ln, self.pool.get(span(piece.off, piece.ln)),
                       align_down(piece.off))
        piece.hedged = True
        piece.active += 1
        self.hedged[h] += 1
        self._queue(hatt, now, front=True)
        self._put_front(hatt)
        return True

    def _degrade(self, s: int, n: int, why: str = "", relapse: float | None = None) -> None:
        """Take `s` out of the split for lateness; `relapse`: it had come back and not yet kept up for
        `memory` pieces (its pace when taken out, over its weight's share of the others')."""
        if len(self.health.in_split) < 2 or not self.health.degrade(s, f"{plural(n, 'piece')} late in a row"
                                                                      + (f"; {why}" if why else ""), slow=True):
            return
        with self._lock:
            now = self.clock()
            self.back[s] = False
            self.relapse[s] = relapse
            self.next_probe[s] = now + self.policy.probe_interval_ns
            self.probe_ok[s] = 0
            # what is queued on it would be late too: hedged at the front of the others' queues, the
            # earliest read first (the engine waits for reads in the order it submitted them)
            for att in sorted(self.pending[s], key=lambda a: (a.piece.ticket.seq, a.off), reverse=True):
                if not att.piece.done and not att.piece.hedged:
                    self._hedge(att, now)

    def _restore(self, s: int) -> None:
        """Bring `s` back into the split (its probes were on time). After a relapse, with a reader that
        re-weights (`comeback`), at its pace then rather than its whole weight: probes, one request
        at a time on an idle drive, pass a drive whose throttle banks credit while it idles, and
        under its whole share it was late again within a fraction of a second, in and out several
        times a second for as long as it stayed slow (docs/reader.md "Round 18"). Its state is made
        afresh before it is back: a read cut with it the moment it is back is judged from there (made
        after, it wiped the streak of a piece already late, and the drive was never taken out again)."""
        then = None
        with self._lock:
            if not self.health.slow(s):
                return                                         # failed for good meanwhile: not coming back
            self._on_time(s)                                   # judged afresh from here on
            self.counted_at[s] = None
            d = self.drives[s]
            d.observed_at = d.busy
            self.est[s] = RateEstimate(self.policy.decay)
            self._learnt(s)
            d.tick_at = self.clock()
            self.back[s] = True
            pace = self.relapse[s]
            if pace is not None and self.comeback is not None:
                then = self.comeback(s, pace)
            self.relapse[s] = None
        self.health.restore(s, f"{self.policy.recover_probes} probe(s) on time")
        if then is not None:
            then()


def _mbs(rate: float | None) -> str:
    """A rate in bytes per ns as MB/s for an event's message."""
    if rate is None:
        return "unknown"
    return "unbounded" if math.isinf(rate) else f"{rate * 1e3:.1f} MB/s"
