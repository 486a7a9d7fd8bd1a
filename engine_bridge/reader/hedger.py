"""The split reader's hedger: a watchdog that re-issues late pieces on the healthiest other replica.

Every main attempt gets a deadline when it is queued (`hedging.deadline_ns`: the bytes queued on
its source ahead of it over the rate the source is held to, times a margin, plus a floor). The
watchdog thread sleeps until the earliest deadline; a piece still outstanding then is *late*: it
is counted (`late` on its source) and a hedge of it is put at the front of the healthiest other
source's queue (`hedged` on that source), reading into a private buffer. Whichever attempt
completes first wins (lanes.py); the loser is discarded.

A source with `late_limit` late pieces in a row (no on-time piece between) whose delivered rate,
late pieces included, is also below the rate it is held to over the margin (`hedging.too_slow`:
a throttled drive that stalls now and then still delivers its rate) is degraded like a failing
one (the split runs over the others, its queued pieces are hedged at once), except that it is
*probed*: at most once
per `probe_interval`, a read's submit also sends it a copy of the read's largest piece,
into a private buffer, judged against the same kind of deadline; `recover_probes` on-time probes
in a row restore it. Never the last healthy source is degraded for lateness.

If the watchdog itself wakes more than a floor late (the whole process was starved, not a drive)
it judges nothing that round and gives every due piece another floor. Its state lives under the
lanes' lock (one lock; the watchdog waits on a Condition of it). `clock` is injectable (ns) and
`wake()` re-runs the watchdog now, so tests order events without sleeping.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from typing import Callable, Sequence

from core.coldio import align_down
from core.units import plural

from .attempts import HEDGE, MAIN, PROBE, Attempt
from .buffers import span
from .hedging import HedgePolicy, RateEstimate, deadline_ns, expected_rate, pick_hedge_source, plan_rate, too_slow
from .sources import SourceHealth

RECHECK_NS = 1_000_000     # at least this long before a piece nothing can judge yet is looked at again


class Hedger:
    """Deadlines, hedges, lateness and probes for one SplitReader (see the module docstring)."""

    def __init__(self, health: SourceHealth, weights: Sequence[int], decode_weights: Sequence[int], pool,
                 policy: HedgePolicy, clock: Callable[[], int] = time.monotonic_ns):
        # `weights` are the ones reads are cut with: the reader sets new ones when it re-weights (lock held)
        n = len(weights)
        self.health, self.pool, self.policy, self.clock = health, pool, policy, clock
        self.weights = {"prefill": tuple(weights), "decode": tuple(decode_weights)}
        self.est = [RateEstimate(policy.decay) for _ in range(n)]
        self.outstanding = [0] * n      # bytes queued or being read on each source
        self.jumped = [0] * n           # bytes ever put at the front of each source's queue (hedges, probes)
        self.busy = [0] * n             # busy ns since the source's last observed delivery
        self.tick_at = [0] * n
        self.late = [0] * n
        self.hedged = [0] * n
        self.streak = [0] * n           # late pieces in a row
        self.seen = [RateEstimate(policy.decay) for _ in range(n)]   # every delivery, late ones too
        self.busy_all = [0] * n         # busy ns since the source's last delivery of any kind
        self.pending: list[set] = [set() for _ in range(n)]   # main attempts queued or reading
        self.probing = [False] * n
        self.next_probe = [0] * n
        self.probe_ok = [0] * n
        self._heap: list = []
        self._seq = itertools.count()
        self._stopping = False
        self._wake_at: int | None = None
        self._skew = 0
        self.lanes = None
        self.cond: threading.Condition | None = None
        self._thread: threading.Thread | None = None
        # (source, file index) -> whether the source holds that file (a partial replica does not
        # hold every file); the reader sets it
        self.can_serve: Callable[[int, int], bool] = lambda src, fi: True

    def attach(self, lanes) -> None:
        """Share the lanes' lock and start the watchdog (Lanes calls this)."""
        self.lanes = lanes
        self.cond = threading.Condition(lanes.lock)
        self._thread = threading.Thread(target=self._run, name="split-reader-hedger", daemon=True)
        self._thread.start()

    # -- called by the lanes, lock held ---------------------------------------------------

    def enqueued(self, att: Attempt) -> None:
        now = self.clock()
        self._queue(att, now)
        if att.kind == MAIN and len(self.est) > 1:
            self.pending[att.src].add(att)
            due = self._deadline(att)
            heapq.heappush(self._heap, (now + self._recheck() if due is None else due, next(self._seq), att))
            if self._heap[0][2] is att:
                self.cond.notify()

    def moved(self, att: Attempt, new: int) -> None:
        """A failing attempt goes on to source `new` (failover: no deadline of its own)."""
        now = self.clock()
        self._tick(att.src, now)
        self.outstanding[att.src] -= att.ln
        self.pending[att.src].discard(att)
        self._tick(new, now)
        self.outstanding[new] += att.ln

    def stolen(self, att: Attempt, new: int) -> None:
        """A queued main attempt is taken by idle source `new` (balancing): queued there now, with a
        deadline of its own."""
        now = self.clock()
        self._tick(att.src, now)
        self.outstanding[att.src] -= att.ln
        self.pending[att.src].discard(att)
        att.src = new
        self.enqueued(att)

    def started(self, att: Attempt, inflight: int) -> None:
        """A lane took `att` with `inflight` bytes (itself included) in the kernel on its source: when
        balancing keeps most of a share queued, a piece's deadline runs from here, over what is
        really ahead of it."""
        if att.kind != MAIN or att not in self.pending[att.src]:
            return
        att.t_enq, att.ahead, att.jumped = self.clock(), inflight, self.jumped[att.src]
        due = self._deadline(att)
        if due is not None:
            heapq.heappush(self._heap, (due, next(self._seq), att))
            if self._heap[0][2] is att:
                self.cond.notify()

    def ended(self, att: Attempt, s: int, ok: bool) -> list:
        """An attempt on source `s` is over; returns what to do once the lock is released."""
        now = self.clock()
        self._tick(s, now)
        self.outstanding[s] -= att.ln
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
            self.seen[s].observe(att.ln, self.busy_all[s])
            self.busy_all[s] = 0
            if att.late:
                self.busy[s] = 0            # a late delivery teaches nothing about the drive's normal pace
            else:
                self.est[s].observe(att.ln, self.busy[s])
                self.busy[s] = 0
                if att.kind == MAIN:
                    self.streak[s] = 0
        return []

    def counters(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(hedged, late) per source."""
        return tuple(self.hedged), tuple(self.late)

    def stuck(self, s: int) -> bool:
        """A read on `s` may hang in the kernel: it is degraded for lateness with work out, or a
        late attempt on it has started."""
        return (self.health.slow(s) and self.outstanding[s] > 0) or any(a.late and a.started for a in self.pending[s])

    # -- called by the reader -------------------------------------------------------------

    def maybe_probe(self, s: int, off: int, ln: int, phase: str, fi: int = 0) -> None:
        """Send degraded-for-lateness source `s` a probe of (off, ln) of file `fi` if one is due."""
        with self.cond:
            now = self.clock()
            if self._stopping or self.probing[s] or now < self.next_probe[s] or not self.health.slow(s):
                return
            self.probing[s] = True
            att = Attempt(None, s, PROBE, off, ln, self.pool.get(span(off, ln)), align_down(off), fi)
            att.phase = phase
            self._queue(att, now, front=True)
            self.lanes.put_front(att)

    def sampled(self, att: Attempt) -> None:
        """A re-weighting sample is queued on its source (lock held): counted as work outstanding there."""
        self._queue(att, self.clock())

    def wake(self) -> None:
        """Run the watchdog now (tests advance their clock, then call this)."""
        with self.cond:
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # -- inside -----------------------------------------------------------------------------

    def _recheck(self) -> int:
        return max(self.policy.floor_ns, RECHECK_NS)

    def _tick(self, s: int, now: int) -> None:
        if self.outstanding[s] > 0:
            self.busy[s] += now - self.tick_at[s]
            self.busy_all[s] += now - self.tick_at[s]
        self.tick_at[s] = now

    def _too_slow(self, s: int, att: Attempt) -> str | None:
        """What `s` delivered lately, late pieces and the busy time since its last delivery included,
        is below what it is held to over the margin: why, in words (the figures the degrade event
        carries), else None."""
        seen = self.seen[s]
        busy = seen.busy_ns + self.busy_all[s]
        delivered = None if seen.n == 0 and busy > 0 else (math.inf if busy <= 0 else seen.bytes / busy)
        own, plan = self._rates(s, att.piece.ticket.phase, self.health.healthy())
        held = expected_rate(own, plan)
        if not too_slow(delivered, held, self.policy.margin):
            return None
        return (f"delivered {_mbs(delivered)} in {busy / 1e9:.2f} s busy, held to {_mbs(held)} "
                f"(own {_mbs(own)}, by the weights {_mbs(plan)})")

    def _queue(self, att: Attempt, now: int, front: bool = False) -> None:
        s = att.src
        self._tick(s, now)
        att.t_enq = now
        att.ahead = self.outstanding[s] + att.ln
        att.jumped = self.jumped[s]
        self.outstanding[s] += att.ln
        if front:
            self.jumped[s] += att.ln

    def _rate(self, s: int, phase: str, healthy: Sequence[int]) -> float | None:
        return expected_rate(*self._rates(s, phase, healthy))

    def _rates(self, s: int, phase: str, healthy: Sequence[int]) -> tuple[float | None, float | None]:
        """(own, plan): the rate `s` delivered itself and what the weights promise from its peers',
        each only once it rests on `min_busy_ns` of busy time."""
        least = self.policy.min_busy_ns
        peers = {i: self.est[i].rate(least) for i in healthy if i != s}
        return self.est[s].rate(least), plan_rate(s, self.weights[phase], peers)

    def _deadline(self, att: Attempt) -> int | None:
        """When `att` is late: what was queued ahead of it, plus what jumped the queue since (a hedge
        put in front of it delays it; that is not its drive's fault)."""
        phase = att.piece.ticket.phase if att.piece is not None else att.phase
        ahead = att.ahead + (self.jumped[att.src] - att.jumped if att.kind == MAIN else 0)
        return deadline_ns(att.t_enq, ahead, self._rate(att.src, phase, self.health.healthy()), self.policy)

    def _run(self) -> None:
        floor = self.policy.floor_ns
        while True:
            actions: list = []
            with self.cond:
                if self._stopping:
                    return
                now = self.clock()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
                if due and self._skew > floor:      # we were starved, not the drives: look again later
                    for att in due:
                        heapq.heappush(self._heap, (now + max(floor, RECHECK_NS), next(self._seq), att))
                else:
                    for att in due:
                        self._judge(att, now, actions)
                self._skew = 0
                if not actions:
                    self._wake_at = self._heap[0][0] if self._heap else None
                    timeout = None if self._wake_at is None else max(0, self._wake_at - now) / 1e9
                    notified = self.cond.wait(timeout)
                    if not notified and self._wake_at is not None:
                        self._skew = self.clock() - self._wake_at
            for act in actions:
                act()

    def _judge(self, att: Attempt, now: int, actions: list) -> None:
        piece, s = att.piece, att.src
        if piece.done or piece.hedged or att.late or att not in self.pending[s]:
            return
        due = self._deadline(att)
        if due is None or due > now:
            heapq.heappush(self._heap, (now + self._recheck() if due is None else due, next(self._seq), att))
            return
        att.late = True
        self.late[s] += 1
        self.streak[s] += 1
        self._hedge(att, now)
        if self.streak[s] >= self.policy.late_limit and not self.health.slow(s):
            why = self._too_slow(s, att)
            if why is not None:
                n = self.streak[s]
                self.streak[s] = 0
                actions.append(lambda: self._degrade(s, n, why))

    def _hedge(self, att: Attempt, now: int) -> bool:
        """Put a hedge of `att`'s piece at the front of the healthiest other source (lock held)."""
        piece = att.piece
        if att.src not in piece.tried:
            piece.tried.append(att.src)
        healthy = self.health.healthy()
        cands = [i for i in healthy if i not in piece.tried and self.can_serve(i, att.fi)]
        phase = piece.ticket.phase
        rates = {i: self._rate(i, phase, healthy) for i in cands}
        h = pick_hedge_source(att.src, cands, self.outstanding, piece.ln, rates, self.weights[phase])
        if h is None:
            return False
        piece.tried.append(h)
        hatt = Attempt(piece, h, HEDGE, piece.off, piece.ln, self.pool.get(span(piece.off, piece.ln)),
                       align_down(piece.off))
        piece.hedged = True
        piece.active += 1
        self.hedged[h] += 1
        self._queue(hatt, now, front=True)
        self.lanes.put_front(hatt)
        return True

    def _degrade(self, s: int, n: int, why: str = "") -> None:
        if len(self.health.healthy()) < 2 or not self.health.degrade(s, f"{plural(n, 'piece')} late in a row"
                                                                      + (f"; {why}" if why else ""), slow=True):
            return
        with self.cond:
            now = self.clock()
            self.next_probe[s] = now + self.policy.probe_interval_ns
            self.probe_ok[s] = 0
            for att in list(self.pending[s]):      # what is queued on it would be late too
                if not att.piece.done and not att.piece.hedged:
                    self._hedge(att, now)

    def _restore(self, s: int) -> None:
        if self.health.restore(s, f"{self.policy.recover_probes} probe(s) on time"):
            with self.cond:
                self.streak[s] = 0
                self.busy[s] = self.busy_all[s] = 0
                self.seen[s] = RateEstimate(self.policy.decay)     # judged afresh from here on
                self.tick_at[s] = self.clock()


def _mbs(rate: float | None) -> str:
    """A rate in bytes per ns as MB/s for an event's message."""
    if rate is None:
        return "unknown"
    return "unbounded" if math.isinf(rate) else f"{rate * 1e3:.1f} MB/s"
