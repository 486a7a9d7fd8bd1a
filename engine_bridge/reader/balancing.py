"""Balancing: the work of reads already cut follows the drives' real pace (pure: no disk, no
threads, no clock).

Re-weighting changes how the *next* reads are cut; a step of the engine submits up to 256 MiB of
reads at once, all cut with the weights in force, so a drive that turns slow holds every one of
them. Balancing acts on reads already queued (docs/reader.md "Balancing"):

- a piece of the engine's cut is queued as *chunks* (`chunks`): whole when it is no longer than
  its drive's chunk, else cut at multiples of it in the file (so every chunk but a piece's edges is
  aligned for O_DIRECT). A drive's chunk is `chunk_bytes` doubled while the reader's own cost per
  request would be more than a COST_SHARE of the time the drive takes to read it (`chunk_for`, up
  to `chunk_max`): 1 MiB at 150 MB/s, several MiB at the speed of memory, where a 1 MiB request
  takes the drive less time than the reader's bookkeeping around it; but never so large that a
  piece is fewer than MIN_REQUESTS chunks (`piece_chunk`);
- a drive keeps in the kernel at most what it reads while the fastest drive reads a chunk per lane
  (`depth_bytes`: drives of one speed keep every lane busy, one at a twentieth of the others keeps
  a twentieth of that; or `depth_ns` of its own pace, when set), but never fewer than two requests
  of whatever size (so it never waits on us between two requests); a drive cut more than its pace
  says keeps at most its pace's share of the engine's pieces not yet landed (`batch_depth`): the
  rest of its share waits in its queue, where another drive can still take it. Its pace (`Pace`)
  is known from its first delivery on; beyond those two requests it may have in the kernel only
  what it has delivered (a slow start, in the units of its own deliveries: a drive that crawls from
  its first request holds two requests, not a request per lane nor two chunks' worth of an
  engine's small pieces, and a fast one reaches its lanes within a few deliveries);
- a drive with nothing queued of its own *takes* the first chunk of another's queue when it would
  finish it sooner than the drive it was given to (`pick_victim`); a drive with work of its own
  does the same for a chunk of an earlier read than its own queue's head (the engine waits for
  reads in the order it submitted them); a drive that has delivered nothing yet is known no
  faster than what waits in its kernel (`Pace.bound`);
- with hedging, a drive with nothing to take either reads a *copy* of a chunk in another drive's
  kernel that is past its expected time and that it would finish before that chunk's deadline
  (`hedging.copy_due`): the barrier waits on nothing but chunks in kernels then, and the copy costs
  only time the drive had idle.

The bytes are the same whoever reads them (replicas are byte-identical); which drive read what is
counted (`stolen` bytes per source, copies as `hedged`). Every rule compares drives with each
other, with their own deliveries or with the reader's own measured cost: none holds a fixed number
of seconds or bytes, so they act the same on drives of 10 MB/s and of 10 GB/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Mapping, Sequence

from mypy_extensions import mypyc_attr


@mypyc_attr(native_class=False)     # a policy stays a Python object: checked with clear errors (`check_*`)
@dataclass(frozen=True)
class BalancePolicy:
    """The knobs of balancing (SplitReader's `balance_policy`; `run --balance-*`)."""

    chunk_bytes: int = 1 << 20        # the smallest chunk a queued piece is cut into (`chunk_for`)
    chunk_max: int = 16 << 20         # the largest: a drive's chunk grows up to this with its pace
    depth_ns: int = 0                 # a drive keeps at most this much of its own pace in the kernel (0: what it
                                      # reads while the fastest drive reads a chunk per lane, `depth_bytes`, and
                                      # no more than its pace's share of what is outstanding, `batch_depth`)
    copies: bool = True               # with hedging: a drive with nothing to do reads a copy of a chunk past its
                                      # expected time in another's kernel, before its deadline

    def to_dict(self) -> dict:
        return {"chunk_bytes": self.chunk_bytes, "chunk_max": self.chunk_max, "depth_ms": self.depth_ns / 1e6,
                "copies": self.copies}


ALIGN: Final = 4096


def check_balance(p: Any) -> BalancePolicy:
    """The policy, or ValueError naming the knob that makes no sense (`p` as it came: any of its
    fields may hold any type, which the checks name)."""
    if isinstance(p.chunk_bytes, bool) or not isinstance(p.chunk_bytes, int) or p.chunk_bytes < ALIGN \
            or p.chunk_bytes % ALIGN:
        raise ValueError(f"balance chunk_bytes {p.chunk_bytes!r}: must be a multiple of {ALIGN} bytes, at least {ALIGN}")
    if isinstance(p.chunk_max, bool) or not isinstance(p.chunk_max, int) or p.chunk_max < p.chunk_bytes:
        raise ValueError(f"balance chunk_max {p.chunk_max!r}: must be an integer >= chunk_bytes ({p.chunk_bytes})")
    if isinstance(p.depth_ns, bool) or not isinstance(p.depth_ns, int) or p.depth_ns < 0:
        raise ValueError(f"balance depth_ns {p.depth_ns!r}: must be an integer >= 0")
    return p


def chunks(off: int, ln: int, chunk: int) -> list[tuple[int, int]]:
    """[off, off+ln) as the reads that queue it: (offset, length) each, in order. A piece of at most
    `chunk` bytes is one read, wherever it lies; a longer one is cut at the multiples of `chunk`
    inside it, and an edge shorter than half a chunk stays with its neighbour (chunks of up to 1.5
    `chunk`). Cutting every piece at the multiples, small ones included, made a third more reads
    of a run whose pieces were a third of a chunk (docs/reader.md "Balancing"), each a request's
    latency and the reader's CPU for no balancing gained."""
    if ln <= chunk:
        return [(off, ln)] if ln > 0 else []
    end = off + ln
    edges = [off, *range((off // chunk + 1) * chunk, end, chunk), end]
    half = chunk // 2
    if len(edges) > 2 and edges[1] - off < half and edges[2] - off <= chunk + half:
        del edges[1]                       # a short first edge is read with the chunk after it
    if len(edges) > 2 and end - edges[-2] < half and end - edges[-3] <= chunk + half:
        del edges[-2]                      # and a short last edge with the chunk before it
    return [(a, b - a) for a, b in zip(edges, edges[1:])]


COST_SHARE: Final = 1 / 32    # the reader's own CPU per request at most this share of the request's time at its drive's
                       # pace (`chunk_for`; docs/reader.md "Balancing", "Round 15")


def chunk_for(rate: float | None, cost_ns: float | None, smallest: int, largest: int) -> int:
    """The chunk a drive at `rate` (bytes/ns; None: not known yet) has its pieces cut into, when a
    request costs the reader `cost_ns` of CPU (None: not measured yet): `smallest` (the policy's
    `chunk_bytes`), doubled while reading it takes the drive less than 1/COST_SHARE times that cost,
    up to `largest` (`chunk_max`). Drives reading slower than the reader's bookkeeping keep the
    smallest chunk (the finest balancing); one faster than it gets chunks whose bookkeeping it no
    longer waits on. (The knobs come as ints, not the policy: this runs at every delivery, and a
    field of the policy — a Python object — is a dictionary look-up from compiled code.)"""
    c = smallest
    if rate is None or cost_ns is None or rate <= 0:
        return c
    need = rate * cost_ns / COST_SHARE
    while c < need and c * 2 <= largest:
        c *= 2
    return c


MIN_REQUESTS: Final = 2    # a drive always has the next request queued behind the one it reads: one at a time,
                    # each request's own latency adds up (measured on throttled loop devices: 5 % of prefill)


def piece_chunk(ln: int, chunk: int, smallest: int) -> int:
    """The chunk a piece of `ln` bytes is cut into on a drive whose chunk is `chunk` (`chunk_for`):
    halved, down to `smallest` (the policy's `chunk_bytes`), while it would leave the piece fewer
    than MIN_REQUESTS chunks — a drive reads a piece's next chunk while the reader handles the
    last, and lanes share a piece's copy (page-cache reads of 11 MB pieces: 4 MiB chunks moved
    5.95 GB/s, one 16 MiB chunk per piece 3.55, 1 MiB chunks 3.85; docs/reader.md "Round 15"). A
    piece under MIN_REQUESTS smallest chunks (every decode piece) gets the smallest at once: the
    halving would end there."""
    if ln < MIN_REQUESTS * smallest:
        return smallest
    while chunk > smallest and chunk * MIN_REQUESTS > ln:
        chunk //= 2
    return chunk


def depth_bytes(rate: float | None, top: float | None, lanes: int, depth_ns: int, chunk: int) -> float:
    """Bytes a source at `rate` may have in the kernel when the fastest healthy source reads at `top`
    (bytes/ns; None: not known yet) in chunks of `chunk` bytes: with `depth_ns` (the policy's) set,
    that much of its own pace (`depth_limit`); else what it reads while the fastest reads `lanes`
    chunks — in units of the drives themselves, whatever their speed (`Balancer.room` lets
    MIN_REQUESTS requests in whatever it says); unbounded while either pace is unknown."""
    if depth_ns > 0:
        return depth_limit(rate, depth_ns)
    if rate is None or top is None or math.isinf(rate):
        return math.inf
    if top <= 0 or math.isinf(top):
        return 0.0 if math.isinf(top) else math.inf
    return rate / top * lanes * chunk


OVERGIVEN: Final = 1.5   # a drive given this many times its pace's share of what is outstanding is slower than
                         # its weight says (`batch_depth`): equal drives' paces differ by less, a drive at half
                         # its weight's speed holds 1.67 times its share (docs/reader.md "Round 38")


def batch_depth(rate: float | None, together: float, given: int, outstanding: int) -> float:
    """Bytes a source at `rate` (bytes/ns) may have in the kernel when the healthy sources read
    `together` bytes/ns and `outstanding` bytes of the engine's pieces have not landed, `given` of
    them cut to it: its pace's share of what is outstanding (what it reads while all of them read
    the rest), when it was given more than OVERGIVEN times that share (its weight says it is
    faster than it is: what it holds in its kernel beyond that share, no other drive can take, and
    the reads wait for it); else unbounded (a drive cut what its pace says keeps the depth of
    `depth_bytes`: bounding drives of one speed each to its share had their lanes wait for room by
    a rounding's worth, a wake-up each, docs/reader.md "Round 37")."""
    if rate is None or math.isinf(rate) or together <= 0 or math.isinf(together) or outstanding <= 0:
        return math.inf
    share = rate / together * outstanding
    return share if given > OVERGIVEN * share else math.inf


def depth_limit(rate: float | None, depth_ns: int) -> float:
    """Bytes a source at `rate` (bytes/ns; None: not known yet) may have in the kernel: `depth_ns`
    of its pace; unbounded while its pace is unknown."""
    if rate is None or math.isinf(rate):
        return math.inf
    return rate * depth_ns


def finish_ns(inflight: int, nbytes: int, rate: float | None, other: float | None) -> float:
    """When a source with `inflight` bytes in the kernel would have read `nbytes` more, ns from now;
    a source whose pace is unknown is taken to have `other`'s (the two compare on the bytes ahead);
    neither known, or the other's 0 (it delivers nothing: any pace beats it): the bytes themselves."""
    r = rate if rate is not None else (other or None)
    if r is None:
        return float(inflight + nbytes)
    if r <= 0:
        return math.inf
    return 0.0 if math.isinf(r) else (inflight + nbytes) / r


def pick_victim(thief: int, offers: Mapping[int, int], inflight: Sequence[int],
                rates: Mapping[int, float | None]) -> int | None:
    """The source whose first stealable chunk (`offers`: source -> its length) the idle `thief`
    should take: the one it would finish soonest relative to that source, among those it would
    finish before them at all. None: taking any would make a read wait longer."""
    best, gain = None, 0.0
    rt = rates.get(thief)
    for v, nbytes in offers.items():
        if v == thief:
            continue
        rv = rates.get(v)
        if rt is None and rv is None:
            mine, theirs = finish_ns(inflight[thief], nbytes, None, None), finish_ns(inflight[v], nbytes, None, None)
        else:
            mine, theirs = finish_ns(inflight[thief], nbytes, rt, rv), finish_ns(inflight[v], nbytes, rv, rt)
        if mine < theirs and (best is None or theirs - mine > gain):
            best, gain = v, theirs - mine
    return best


class Pace:
    """A drive's pace, fed with a clock of the caller's (ns): bytes delivered over the time it had
    reads in the kernel, decayed per delivery, with the time since its last delivery included (a
    drive that stops delivering falls towards 0 at once); and `window`, the bytes it may have in
    the kernel beyond MIN_REQUESTS requests by the slow start (what it has delivered)."""

    __slots__ = ("decay", "bytes", "busy_ns", "open_ns", "tick", "inflight", "reqs", "n", "window", "given")

    def __init__(self, decay: float):
        self.decay = decay
        self.bytes = 0.0              # decayed bytes delivered
        self.busy_ns = 0.0            # decayed ns with reads in the kernel, up to the last delivery
        self.open_ns = 0              # ns with reads in the kernel since the last delivery
        self.tick = 0
        self.inflight = 0             # bytes in the kernel now
        self.reqs = 0                 # requests in the kernel now
        self.n = 0                    # deliveries
        self.window = 0
        self.given = 0                # bytes of the engine's pieces cut to it that have not landed (`Balancer.cut`)

    def advance(self, now: int) -> None:
        if self.inflight > 0 and now > self.tick:
            self.open_ns += now - self.tick
        self.tick = now

    def started(self, nbytes: int, now: int) -> None:
        self.advance(now)
        self.inflight += nbytes
        self.reqs += 1

    def ended(self, nbytes: int, now: int, delivered: bool) -> None:
        """An attempt of `nbytes` left the kernel; `delivered`: its bytes came in."""
        self.advance(now)
        self.inflight -= nbytes
        self.reqs -= 1
        if delivered:
            self.bytes = self.bytes * self.decay + nbytes
            self.busy_ns = self.busy_ns * self.decay + self.open_ns
            self.open_ns = 0
            self.n += 1
            self.window += nbytes

    def rate(self, now: int) -> float | None:
        """Bytes per ns; None before its first delivery; math.inf when it delivered in no time. Asked
        several times an attempt (`depth_bytes` looks at every drive's): it counts the time since its
        last tick without moving it (the same figure as `advance` then the sums, with no state changed)."""
        if self.n == 0:
            return None
        open_ns = self.open_ns
        if self.inflight > 0 and now > self.tick:
            open_ns += now - self.tick
        busy = self.busy_ns + open_ns
        return self.bytes / busy if busy > 0 else math.inf

    def bound(self, now: int) -> float | None:
        """What the drive is known to deliver at most, bytes per ns: its pace (`rate`), or before
        its first delivery, while reads wait in its kernel, the bytes there over the time they have
        waited (it has not read them in that time: a drive that crawls from its first request is
        known slow before anything lands); None when nothing is known."""
        self.advance(now)
        r = self.rate(now)
        if r is not None or self.inflight <= 0 or self.open_ns <= 0:
            return r
        return self.inflight / self.open_ns

    def slow_start(self, nbytes: int) -> bool | None:
        """What the slow start says of starting `nbytes` more, before any depth: True with fewer than
        MIN_REQUESTS requests in its kernel (whatever their size), False past what it has delivered
        (`window`), None when the depth decides."""
        if self.reqs < MIN_REQUESTS:
            return True
        return False if self.inflight + nbytes > self.window else None
