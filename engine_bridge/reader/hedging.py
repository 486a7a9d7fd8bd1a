"""When a piece is late, when a drive is too slow to keep, and where a hedge goes (pure: no disk,
no threads, no clock).

Every piece gets a deadline from what its drive is expected to deliver: the bytes queued on that
source ahead of it (itself included) over the source's expected rate, times a margin, plus a
request's typical own time on these drives (`ServiceTime`; no floor in seconds). The expected
rate is the larger of what the source itself delivered lately (bytes over busy time, learnt only
from pieces that were on time) and what its share promises for it (the healthy peers' rate per
unit of their shares times its share; a share is what the engine's cut gives a source, which need
not follow the weights: the hedger's): a drive that crawls while its share says it is fast is late
against its share, and one that slows suddenly is late against itself.
Both are known from the first deliveries: a deadline scales with the drives' own pace.

A late piece is hedged whatever caused it; a drive is taken out of the split only on evidence that
holds against a throttle's bursts and stalls (docs/reader.md "Bursts"): `late_limit` of its pieces
late in a row, counted once per engine cut and only when each was started after the previous was
judged late (`counts_late`: a stall that holds every piece in a kernel at once is one lateness, and
a throttled drive serves on time after each stall), and over the same span it delivered less than
its weight's share of what the other drives delivered and read, while it had work, at less than its
weight's share of their pace, each over the margin (`behind` on the bytes and busy time each had
since the first of those pieces began: bursts of every drive fall in the span).
Times are integer nanoseconds; rates are bytes per nanosecond.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Mapping, Sequence

from mypy_extensions import mypyc_attr

# how far a source's own rate may move, as a share of the one in use, before the deadlines take it up (`rate_moved`)
RATE_TOLERANCE: Final = 0.1


@mypyc_attr(native_class=False)     # a policy stays a Python object: checked with clear errors (`check_*`)
@dataclass(frozen=True)
class HedgePolicy:
    """The knobs of hedging (SplitReader's `hedge_policy`)."""

    margin: float = 3.0             # a piece is late after margin x its expected time, plus a request's
                                    # typical service time on these drives (`ServiceTime`)
    floor_ns: int = 0               # never late before this, ns, on top (0: the floor is in units of the work,
                                    # a request's typical service time; tests set one to order events)
    late_limit: int = 3             # late pieces in a row (one per engine cut, each started after the previous
                                    # was judged; an on-time piece between ends the row once the drive keeps up)
                                    # that, with the drive behind its share of the others' bytes and of their
                                    # pace over the margin (`behind`), degrade a source
    probe_interval_ns: int = 0      # least time between two probes of a degraded-for-lateness source, ns (it has
                                    # at most one probe out at a time: they follow its own pace)
    recover_probes: int = 2         # on-time probes in a row that bring it back
    decay: float = 0.97             # weight of the past in the rate estimate, per delivered piece (~30 pieces:
                                    # throttled drives deliver in bursts and stalls, the mean is what counts)
    min_busy_ns: int = 0            # a rate estimate holds a drive only once it rests on this much busy time (0:
                                    # from its first delivery; the degrade verdict does not rest on it)

    def to_dict(self) -> dict:
        return {"margin": self.margin, "floor_ms": self.floor_ns / 1e6, "late_limit": self.late_limit,
                "probe_interval_ms": self.probe_interval_ns / 1e6, "recover_probes": self.recover_probes,
                "min_busy_ms": self.min_busy_ns / 1e6}


def check_policy(p: Any) -> HedgePolicy:
    """The policy, or ValueError naming the knob that makes no sense (`p` as it came: any of its
    fields may hold any type, which the checks name)."""
    if not (p.margin >= 1.0 and math.isfinite(p.margin)):
        raise ValueError(f"hedge margin {p.margin!r}: must be a finite number >= 1")
    for name in ("floor_ns", "probe_interval_ns", "min_busy_ns"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"hedge {name} {v!r}: must be an integer >= 0")
    for name in ("late_limit", "recover_probes"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"hedge {name} {v!r}: must be an integer >= 1")
    if not 0.0 <= p.decay < 1.0:
        raise ValueError(f"hedge decay {p.decay!r}: must be in [0, 1)")
    return p


class RateEstimate:
    """A source's recent delivery rate: decayed sums of bytes delivered and busy time spent.

    `observe(nbytes, busy_ns)`: a piece of `nbytes` landed on time, `busy_ns` of busy time (time
    with work outstanding on the source) since the previous observation. `rate(min_busy_ns)`: bytes
    per ns, math.inf when it delivered in no measurable time, None before any observation or while
    the observations rest on less than `min_busy_ns` of busy time in all (`total_busy_ns`, not
    decayed): a burst of pieces served at once says nothing yet of the drive's pace.
    """

    __slots__ = ("decay", "bytes", "busy_ns", "n", "total_busy_ns")

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.bytes = 0.0
        self.busy_ns = 0.0
        self.n = 0
        self.total_busy_ns = 0

    def observe(self, nbytes: int, busy_ns: int) -> None:
        if busy_ns < 0:
            busy_ns = 0
        self.bytes = self.bytes * self.decay + nbytes
        self.busy_ns = self.busy_ns * self.decay + busy_ns
        self.total_busy_ns += busy_ns
        self.n += 1

    def rate(self, min_busy_ns: int = 0) -> float | None:
        if self.n == 0 or self.total_busy_ns < min_busy_ns:
            return None
        if self.busy_ns <= 0:
            return math.inf
        return self.bytes / self.busy_ns


def rate_moved(used: float | None, rate: float | None, tolerance: float = RATE_TOLERANCE) -> bool:
    """Whether a source's own rate `rate` (`RateEstimate.rate`) has moved from the one the deadlines
    use (`used`) by more than `tolerance` of it, or become known, unknown or unbounded. Every
    on-time delivery moves the estimate by a few percent; working every held rate out again after
    each (`held_rate` for every source and phase) cost 7 % of the Python the features add to a fast
    decode read (docs/reader.md "Round 35"), while a deadline gives margin x the expected time: a
    rate a tenth off moves a deadline by a tenth of its expected time, well inside the margin."""
    if used is None or rate is None:
        return used is not rate
    if math.isinf(used) or math.isinf(rate):
        return used != rate
    return abs(rate - used) > tolerance * used


def plan_rate(src: int, shares: Sequence[float], rates: Sequence[float | None], peers: Sequence[int]) -> float | None:
    """What the shares promise for `src` (the weights, or the bytes the engine's cut gave each
    source): its share times the `peers`' summed rate per unit of their shares (`rates`: every
    source's, None where unknown; a peer counts when it is not `src` and its rate is known). None
    without such a peer. One pass, no mapping built: it is asked for every deadline, and on fast
    drives the reader's CPU is the engine's (docs/reader.md "Round 14")."""
    total = units = 0.0
    known = False
    for i in peers:
        r = rates[i]
        if i != src and r is not None:
            total += r
            units += shares[i]
            known = True
    if not known:
        return None
    return math.inf if math.isinf(total) else shares[src] * total / units


def held_rate(src: int, own: Sequence[float | None], shares: Sequence[float], peers: Sequence[int]) -> float | None:
    """The rate `src` is held to: the faster of its own recent rate (`own[src]`) and what its share
    promises from the `peers`' own rates (`plan_rate`); None when neither is known. `own`: every
    source's rate (`RateEstimate.rate`), None where unknown."""
    planned, mine = plan_rate(src, shares, own, peers), own[src]
    if planned is None:
        return mine
    return planned if mine is None or planned > mine else mine


class ServiceTime:
    """A request's typical own time on the reader's drives: its service (first byte asked to last
    byte in, as the lanes see it: the drive's latency, a throttle's stalls, the machine's
    scheduling) over the bytes in the kernel with it (the queue ahead is the deadline's expected
    time already), decayed per on-time delivery and weighted by its own length (sum of squares over
    sum: what a request in flight at a random instant sees, so a throttle's stalls weigh by their
    length, not by their count). It is the floor of every deadline, in units of the work: a
    chunk's time, ~0.1 s on drives of 10 MB/s, ~0.2 ms on NVMe, longer on a machine short of CPU.
    0 before any delivery."""

    __slots__ = ("decay", "sum_ns", "sq_ns")

    def __init__(self, decay: float = 0.97):
        self.decay, self.sum_ns, self.sq_ns = decay, 0.0, 0.0

    def observe(self, ns: int) -> None:
        if ns < 0:
            ns = 0
        self.sum_ns = self.sum_ns * self.decay + ns
        self.sq_ns = self.sq_ns * self.decay + float(ns) * ns

    def typical_ns(self) -> float:
        return self.sq_ns / self.sum_ns if self.sum_ns > 0 else 0.0


def deadline_ns(enqueued_ns: int, ahead_bytes: int, rate: float | None, floor_ns: int, margin: float,
                typical_ns: float = 0.0) -> int | None:
    """When a piece queued at `enqueued_ns` behind (and including) `ahead_bytes` on a source held to
    `rate` is late: `margin` x its expected time, plus a request's typical service time on these
    drives (`ServiceTime`: a throttle's stall, the machine's scheduling; a burst's rate promises no
    time at all, a request still takes its time), plus `floor_ns` (the policy's `margin` and
    `floor_ns`, which the hedger keeps natively: a policy's fields are a Python object's, read by
    name, and a deadline is worked out per piece); None while nothing is known of any rate."""
    if rate is None or rate <= 0:
        return None
    expected = 0.0 if math.isinf(rate) else ahead_bytes / rate
    return enqueued_ns + floor_ns + int(margin * expected + typical_ns)


def step_deadline_ns(submitted_ns: int, landed_ns: int, policy: HedgePolicy, typical_ns: float = 0.0) -> int:
    """When a piece of a drive already on a late streak is late by its step: its read was submitted
    at `submitted_ns` and every other piece of it had landed by `landed_ns` (the healthy drives read
    their share in that step); at its share it should take about as long, so it is late at
    margin x the step after the submit, plus a request's typical service time and `floor_ns`. A
    crawler's next pieces are so hedged in units of the engine's step, before the verdict that
    takes it out is reached (docs/reader.md "Hedged reads"); such a lateness is not counted in the
    streak (the verdict stays on the drive's own pace, where a throttle's bursts cancel)."""
    step = max(0, landed_ns - submitted_ns)
    return submitted_ns + policy.floor_ns + int(policy.margin * step + typical_ns)


def expected_ns(ahead_bytes: int, rate: float | None) -> float | None:
    """How long `ahead_bytes` take at `rate` (None: unknown)."""
    if rate is None or rate <= 0:
        return None
    return 0.0 if math.isinf(rate) else ahead_bytes / rate


def too_slow(delivered: float | None, held: float | None, margin: float) -> bool:
    """Whether a source that keeps being late is really slow, not just bursty: what it delivered,
    late pieces included, is below what it is held to over the margin — rates, or bytes over the
    same span (`owed`). A throttled drive that stalls now and then still delivers its share; one
    that crawls or hangs does not. Unknown held: never; nothing delivered while busy: yes."""
    if held is None:
        return False
    if delivered is None:
        return True
    return delivered * margin < held


def owed(src: int, delivered: Sequence[float], shares: Sequence[float], peers: Sequence[int]) -> float | None:
    """What `src` would have delivered over a span at its share of what the `peers` delivered in it
    (bytes per unit of their shares, times its share; the hedger gives the weights); None when the
    peers delivered nothing (nothing to judge it by)."""
    others = [i for i in peers if i != src]
    got = sum(delivered[i] for i in others)
    if not others or got <= 0:
        return None
    return shares[src] * got / sum(shares[i] for i in others)


def busy_rate(delivered: float, busy_ns: float) -> float | None:
    """A drive's pace over a span: the bytes it delivered over the time it had work (queued or in its
    kernel), bytes per ns; math.inf when it delivered in no time, None when it delivered nothing in
    no time (nothing to judge)."""
    if busy_ns > 0:
        return delivered / busy_ns
    return math.inf if delivered > 0 else None


def behind(src: int, delivered: Sequence[float], busy_ns: Sequence[float], shares: Sequence[float],
           peers: Sequence[int], margin: float) -> tuple[float, float | None, float | None] | None:
    """Whether `src`, over a span in which each source delivered `delivered` bytes and had work for
    `busy_ns`, is too slow to keep: it delivered less than its share of what the `peers` delivered
    (`owed`) *and* read, while it had work, at less than its share of their pace (`busy_rate`,
    `plan_rate`), each over the margin. Balancing takes a slower drive's queued chunks, so a drive
    at half its share's speed delivers under a third of its share of the bytes, yet reads at half
    its share of the pace; a crawler is short of both. No time with work in the span: nothing to
    judge its pace by, the bytes decide. (its share of the bytes, its pace, its share of the pace;
    both None when the bytes decided) when too slow, else None."""
    share = owed(src, delivered, shares, peers)
    if share is None or not too_slow(delivered[src], share, margin):
        return None
    if busy_ns[src] <= 0:
        return share, None, None
    rates = [busy_rate(d, b) for d, b in zip(delivered, busy_ns)]
    held = plan_rate(src, shares, rates, peers)
    if not too_slow(rates[src], held, margin):
        return None
    return share, rates[src], held


def counts_late(begun_ns: int, last_counted_ns: int | None, cut_counted: bool) -> bool:
    """Whether a late piece adds to its source's streak: its engine cut has not counted yet, and it
    was started after the source's previous counted lateness was judged (one stall that holds
    everything in a drive's kernel at once is one lateness, however many pieces it holds)."""
    if cut_counted or begun_ns < 0:
        return False
    return last_counted_ns is None or begun_ns >= last_counted_ns


def copy_due(now: int, begun_ns: int, expected: float | None, deadline: int | None, mine_ns: float) -> float | None:
    """How far past its expected time a chunk in a drive's kernel is, when an idle drive that would
    read it in `mine_ns` should read a copy: overdue by more than its expected time (it has taken
    twice what it should: a drive on schedule, or merely slower than its mean, is left alone) and by
    more than the copy takes, not yet at its deadline (from there hedging acts), and the copy done
    before the deadline. None: no copy."""
    if expected is None or deadline is None or begun_ns < 0:
        return None
    over = now - (begun_ns + expected)
    if over <= max(expected, mine_ns) or now >= deadline or now + mine_ns >= deadline:
        return None
    return over


def pick_hedge_source(late_src: int, candidates: Sequence[int], outstanding: Sequence[int], nbytes: int,
                      rates: Mapping[int, float | None], weights: Sequence[int]) -> int | None:
    """The healthiest other source for a late piece of `nbytes`: the one expected to finish it
    first (its queued bytes plus the piece over its rate); sources without an estimate come after
    those with one, by largest weight then lower index. None when there is no candidate."""
    cands = [i for i in candidates if i != late_src]
    if not cands:
        return None

    def finish(i: int):
        r = rates.get(i)
        if r is None:
            return (1, 0.0, -weights[i], i)
        t = 0.0 if math.isinf(r) else (outstanding[i] + nbytes) / r if r > 0 else math.inf
        return (0, t, -weights[i], i)

    return min(cands, key=finish)
