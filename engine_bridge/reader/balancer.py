"""Balancing's state for one reader (the rules are pure, in `balancing.py`; docs/reader.md
"Balancing"): each source's pace and bytes in the kernel, whether a lane may start its queue's
head, and what a lane with nothing of its own takes from another source's queue.

The lanes call it with their lock held and own the queues; the balancer only looks at them.
"""

from __future__ import annotations

from typing import Callable, Final, Protocol, Sequence

from .attempts import MAIN, Attempt, LaneQueue
from .balancing import BalancePolicy, Pace, batch_depth, chunk_for, chunks, depth_bytes, pick_victim, piece_chunk

PACE_DECAY: Final = 0.9          # weight of the past in a source's pace, per delivered attempt
COST_DECAY: Final = 0.9          # weight of the past in the reader's CPU per request, per request
STEAL_SCAN: Final = 64           # queued attempts looked at per source for one to take


class Split(Protocol):
    """Whatever says which sources are in the split (the reader's `SourceHealth`)."""

    in_split: list[int]     # replaced whole when a source leaves or rejoins: read without the lock


class Balancer:
    """Paces, chunk sizes and the choice of work to take, for `n` sources of `lanes` lanes each.
    holds(src, fi): whether a source holds the model's file `fi` (a partial replica does not hold
    every file; None: every source holds every file). health.in_split: the sources in the split (an
    attribute, not the `healthy()` call: asked ~3 times a read, that call was a Python method's
    frame from compiled code each time, docs/reader.md "Round 36"). clock: ns.

    `chunk[s]`: the size source `s`'s pieces are cut into now (`balancing.chunk_for` of its pace
    and the reader's CPU per request, `cost_ns`, which the lanes measure); read without the lock
    when a read is cut (an int, replaced whole)."""

    def __init__(self, n: int, lanes: int, policy: BalancePolicy, holds: Callable[[int, int], bool] | None,
                 health: Split, clock: Callable[[], int]):
        self.lanes, self.holds, self.health, self.clock = lanes, holds, health, clock
        # the policy's knobs as the balancer's own ints: the policy is a Python object, and each field
        # of it a dictionary look-up from here, several times a read (docs/reader.md "Round 36")
        self.smallest, self.largest, self.depth_ns = policy.chunk_bytes, policy.chunk_max, policy.depth_ns
        self.pace = [Pace(PACE_DECAY) for _ in range(n)]
        self.chunk = [self.smallest] * n
        self.cost_ns: float | None = None

    def cut(self, s: int, nbytes: int) -> None:
        """A piece of `nbytes` of the engine's cut is queued on source `s`."""
        self.pace[s].given += nbytes

    def landed(self, s: int, nbytes: int) -> None:
        """A piece of `nbytes` cut to source `s` is in (whoever read it), or failed on every source."""
        self.pace[s].given -= nbytes

    @property
    def outstanding(self) -> int:
        """Bytes of the engine's pieces queued or in kernels that have not landed, on every source."""
        total = 0
        for p in self.pace:
            total += p.given
        return total

    def parts(self, s: int, off: int, ln: int) -> list[tuple[int, int]]:
        """How piece [off, off+ln) of source `s` is queued: chunks of its drive's size now, no larger
        than leaves the piece MIN_REQUESTS of them (`balancing.piece_chunk`). Called without the
        lock (it reads `chunk[s]` once)."""
        return chunks(off, ln, piece_chunk(ln, self.chunk[s], self.smallest))

    def inflight(self, s: int) -> int:
        """Bytes source `s` has in the kernel."""
        return self.pace[s].inflight

    def rate(self, s: int) -> float | None:
        """Source `s`'s pace, bytes per ns (None before its first delivery)."""
        return self.pace[s].rate(self.clock())

    def started(self, att: Attempt) -> None:
        self.pace[att.src].started(att.ln, self.clock())

    def ended(self, att: Attempt, s: int, delivered: bool, cost_ns: int | None = None) -> None:
        """`att` left source `s`'s kernel; `delivered`: its bytes came in; `cost_ns`: the CPU the
        lane spent on it besides the read itself (None: not measured)."""
        now = self.clock()
        pace = self.pace[s]
        pace.ended(att.ln, now, delivered)
        if cost_ns is not None:
            self.cost_ns = cost_ns if self.cost_ns is None else self.cost_ns * COST_DECAY + cost_ns * (1 - COST_DECAY)
        if delivered:
            self.chunk[s] = chunk_for(pace.rate(now), self.cost_ns, self.smallest, self.largest)

    def moved(self, att: Attempt, old: int, new: int) -> None:
        """A started attempt fails over from `old` to `new`."""
        now = self.clock()
        self.pace[old].ended(att.ln, now, False)
        self.pace[new].started(att.ln, now)

    def room(self, s: int, nbytes: int) -> bool:
        """Whether source `s` may start `nbytes` more now: what its slow start says (`Pace.slow_start`),
        else whether what it has in the kernel plus these stay within its depth (`_depth`; asked only
        then: it looks at every drive's pace)."""
        pace = self.pace[s]
        says = pace.slow_start(nbytes)
        return says if says is not None else pace.inflight + nbytes <= self._depth(s)

    def _depth(self, s: int) -> float:
        """Bytes source `s` may have in the kernel at its pace and the fastest healthy source's
        (`depth_bytes`), and no more than its pace's share of what is outstanding when it was cut
        more than its pace says (`batch_depth`; not with the policy's `depth_ns`)."""
        now = self.clock()
        pace = self.pace
        top, fastest, mine, seen, together = None, s, None, False, 0.0
        for i in self.health.in_split:
            r = pace[i].rate(now)
            if i == s:
                mine, seen = r, True
            if r is not None:
                together += r
                if top is None or r > top:
                    top, fastest = r, i
        if not seen:
            mine = pace[s].rate(now)
        depth = depth_bytes(mine, top, self.lanes, self.depth_ns, self.chunk[fastest])
        if self.depth_ns > 0 or not seen:
            return depth
        return min(depth, batch_depth(mine, together, pace[s].given, self.outstanding))

    def offers(self, thief: int, queues: Sequence[LaneQueue], before: int | None = None) -> dict[int, tuple[int, Attempt]]:
        """Per other source, the first attempt of its queue `thief` could take: a main attempt of a
        piece nobody delivered or hedged, in a file `thief` holds (and, with `before`, of a read
        submitted before read `before`: `ReadTicket.seq`) that its own drive will not start at
        once (a lane of its own waits for work and the drive has room for it: taking it gains
        nothing, and on drives faster than the reader it cost every read a tenth of its latency,
        docs/reader.md "Round 14")."""
        out = {}
        for v, q in enumerate(queues):
            if v == thief:
                continue
            for k, att in enumerate(q.items):
                if k >= STEAL_SCAN:
                    break
                if att is not None and self._takeable(thief, att):
                    if (before is None or att.piece.ticket.seq < before) and not (q.idle > k and self.room(v, att.ln)):
                        out[v] = (k, att)
                    break
        return out

    def may_offer_earlier(self, thief: int, queues: Sequence[LaneQueue], before: int) -> bool:
        """Whether `offers(thief, queues, before)` may find anything, by a look at each other queue's
        head: False when every head is a chunk `thief` could take (`_takeable`) that `offers`
        would not offer — of read `before` or a later one, or one a lane of its own waits to start
        with room for it in its kernel (`offers` looks no further than such a head: for those heads
        this is its answer). A lane starting its own head asks this first: the full look, twice a
        piece, took ~6 % of the reader's CPU with all three features in a profile (docs/reader.md
        "Round 20"); on healthy drives the other queues' heads are mostly of earlier reads, each
        about to be started by a lane of its own, and the full look found nothing to take in any
        of the ~4,300 it made in 3,000 reads (docs/reader.md "Round 21")."""
        for v, q in enumerate(queues):
            if v != thief and q.items:
                att = q.items[0]
                if att is None or not self._takeable(thief, att):
                    return True             # `offers` looks further down that queue
                if att.piece.ticket.seq < before and not (q.idle and self.room(v, att.ln)):
                    return True
        return False

    def _takeable(self, thief: int, att: Attempt) -> bool:
        """Whether `thief` may take queued `att`: a main attempt of a piece nobody delivered or
        hedged, in a file `thief` holds."""
        return (att.kind == MAIN and not att.piece.done and not att.piece.hedged
                and (self.holds is None or self.holds(thief, att.fi)))

    def victim(self, thief: int, queues: Sequence[LaneQueue], before: int | None = None) -> tuple[int, int] | None:
        """(source, index in its queue) of the attempt source `thief` should take, or None when
        taking any would not bring a read's barrier nearer (or it has no room for it). `before`:
        `thief` has work of its own, the head of its queue a piece of read `before`; it takes only a
        piece of an earlier read (the engine waits for reads in the order it submitted them)."""
        offers = self.offers(thief, queues, before)
        if not offers:
            return None
        now = self.clock()
        rates = {s: self.pace[s].bound(now) for s in (thief, *offers)}
        inflight = [p.inflight for p in self.pace]
        v = pick_victim(thief, {s: att.ln for s, (_, att) in offers.items()}, inflight, rates)
        if v is None or not self.room(thief, offers[v][1].ln):
            return None
        return v, offers[v][0]
