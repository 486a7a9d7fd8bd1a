"""What the lanes delivered, counted (pure: no disk, no threads; the lanes' lock guards it).

Per source the engine's tuning signal (docs/engine-profiles.md): bytes and pieces delivered, how
often a source's piece landed last at a read's barrier and by how much, piece service times; the
bytes it re-read for a failed source or took from another's queue; and the same per phase, with
what the split *gave* each source (per engine cut, whoever delivered it).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from .attempts import MAIN, Attempt, ReadTicket
from .readstats import last_landing, latency_summary


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
    """One phase's counters: what the split gave each source, what each source delivered, and the
    phase's whole reads."""

    __slots__ = ("given_bytes", "given_pieces", "bytes", "reads", "reads_done", "bytes_done", "largest_read")

    def __init__(self, n: int):
        self.given_bytes, self.given_pieces = [0] * n, [0] * n
        self.bytes, self.reads = [0] * n, [0] * n
        self.reads_done = self.bytes_done = self.largest_read = 0

    def copy(self) -> PhaseTally:
        t = PhaseTally(0)
        t.given_bytes, t.given_pieces = list(self.given_bytes), list(self.given_pieces)
        t.bytes, t.reads = list(self.bytes), list(self.reads)
        t.reads_done, t.bytes_done, t.largest_read = self.reads_done, self.bytes_done, self.largest_read
        return t


class Tally:
    """The lanes' counters for `n` sources."""

    def __init__(self, n: int):
        self.n = n
        self.bytes = [0] * n
        self.reads = [0] * n
        self.failover_bytes = [0] * n
        self.lands_last = [0] * n
        self.gap_ns = [0] * n
        self.stolen = [0] * n
        self.lat = [array("q") for _ in range(n)]
        self.reads_done = 0
        self.bytes_done = 0
        self.phases: dict[str, PhaseTally] = {}

    def phase(self, phase: str) -> PhaseTally:
        """The phase's counters, made on its first read."""
        t = self.phases.get(phase)
        if t is None:
            t = self.phases[phase] = PhaseTally(self.n)
        return t

    def given(self, ticket: ReadTicket, src: int, nbytes: int) -> None:
        """The engine's cut gave `src` a piece of `nbytes` of this read."""
        t = self.phase(ticket.phase)
        t.given_bytes[src] += nbytes
        t.given_pieces[src] += 1
        t.largest_read = max(t.largest_read, ticket.length)

    def served(self, s: int, ns: int) -> None:
        """A read on `s` took `ns` from its first byte asked to its last byte in."""
        self.lat[s].append(ns)

    def delivered(self, att: Attempt, s: int) -> None:
        """`att`, read on `s`, won its piece: its bytes are the read's."""
        self.bytes[s] += att.ln
        self.reads[s] += 1
        t = self.phase(att.piece.ticket.phase)
        t.bytes[s] += att.ln
        t.reads[s] += 1
        if att.kind == MAIN and att.stolen and s == att.src:
            self.stolen[s] += att.ln
        elif att.kind == MAIN and s != att.piece.src:
            self.failover_bytes[s] += att.ln

    def barrier(self, ticket: ReadTicket) -> None:
        """A read's last piece landed (without an error): who landed last, and the read's bytes."""
        ll = last_landing(ticket._landings)
        if ll is not None:
            self.lands_last[ll[0]] += 1
            self.gap_ns[ll[0]] += ll[1]
        self.reads_done += 1
        self.bytes_done += ticket.length
        t = self.phase(ticket.phase)
        t.reads_done += 1
        t.bytes_done += ticket.length

    def counters(self, hedged: tuple[int, ...], late: tuple[int, ...]) -> LaneCounters:
        """A copy of everything, with the hedger's (hedged, late) per source."""
        return LaneCounters(tuple(self.bytes), tuple(self.reads), tuple(self.failover_bytes), tuple(self.lands_last),
                            tuple(self.gap_ns), tuple(latency_summary(array("q", a)) for a in self.lat),
                            self.reads_done, self.bytes_done, hedged, late,
                            {ph: t.copy() for ph, t in self.phases.items()}, tuple(self.stolen))

