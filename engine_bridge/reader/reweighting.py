"""When the reader moves weight between its sources, and to which weights (pure: no disk, no threads,
no clock of its own).

The plan's weights say how fast it believed each drive to be. While reads run, the reader counts
per source, over a window of its own clock, the bytes the drive delivered (its pieces, hedges and
samples: everything it read of reads cut with the weights in force) and the time it was busy
(such reads in its kernel). Bytes over busy time is the rate the drive gives when it has work,
whatever share it was given. A source busy less than `min_busy_ns` in a window has no rate in it;
its bytes and busy time carry into the next windows until they add up to that much (a drive cut
down to a small share, busy a few ms a step, is measured over several windows: without the carry
it was never measured again, and never got its weight back when it recovered). A window
lasts `window_ns` at least, and longer until every source that had work delivered something in it
(a prefill piece can take seconds) or has been busy twice that long without delivering (a hung or
crawling drive: rate 0). A window in which no drive was busy `loaded` of the time is not judged:
the reads did not wait on the drives. At its end every source with a rate is compared with what its weight
claims: its rate per unit of weight over the median of the measured sources' (a median: a drive
that idles between barriers serves a burst from its throttle's unused budget and looks faster
than it is). A source off by more than `band` (either way) in `confirm` windows in a row moves by
what it measured: a multiplier on its plan weights (of each phase, so a plan with other decode
weights keeps their ratios) that only goes down from 1 (off a drive that falls behind) and back
up to 1 (when it recovers), never below `floor` of a read; the plan's exact weights come back once
every multiplier is within `snap` of 1. Bursts of a throttled drive do not move it: a window holds
seconds of busy time, and one window off the band is not enough (docs/reader.md "Re-weighting").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Final, Mapping, Sequence

from mypy_extensions import mypyc_attr


RECENT_REQUESTS: Final = 8   # a drive's latest deliveries that say its pace now (`Window.recent_rate`): a move off
                      # its weight needs them slow too, and the latest half of them (`judge`)
MIN_MULT: Final = 1e-4       # the least multiplier: a drive measured at 0 is far below any floor, and can be measured up again


@mypyc_attr(native_class=False)     # a policy stays a Python object: checked with clear errors (`check_*`)
@dataclass(frozen=True)
class ReweighPolicy:
    """The knobs of re-weighting (SplitReader's `reweigh_policy`; `run --reweigh-*`)."""

    window_ns: int = 2_000_000_000   # a decision looks at this much of the reader's clock at least
    band: float = 1.5                # a source moves only when its rate per weight is off by more than this factor
    confirm: int = 2                 # ... in this many windows in a row, the same way
    floor: float = 0.02              # least share of a read a healthy source keeps (it keeps being measured)
    snap: float = 1.15               # multipliers all within this factor of each other: back to the plan's weights
    min_busy_ns: int = 200_000_000   # a source busy less than this in a window has no rate in it
    loaded: float = 0.5              # judge a window only if some source was busy this share of it (reads wait on I/O)

    def to_dict(self) -> dict:
        return {"window_ms": self.window_ns / 1e6, "band": self.band, "confirm": self.confirm, "floor": self.floor,
                "snap": self.snap, "min_busy_ms": self.min_busy_ns / 1e6, "loaded": self.loaded}


def check_reweigh(p: Any) -> ReweighPolicy:
    """The policy, or ValueError naming the knob that makes no sense (`p` as it came: any of its
    fields may hold any type, which the checks name)."""
    for name in ("window_ns", "min_busy_ns"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"reweigh {name} {v!r}: must be an integer >= 0")
    if not (math.isfinite(p.band) and p.band > 1.0):
        raise ValueError(f"reweigh band {p.band!r}: must be a finite number > 1")
    if not (math.isfinite(p.snap) and 1.0 <= p.snap < p.band):
        raise ValueError(f"reweigh snap {p.snap!r}: must be >= 1 and below the band ({p.band})")
    if isinstance(p.confirm, bool) or not isinstance(p.confirm, int) or p.confirm < 1:
        raise ValueError(f"reweigh confirm {p.confirm!r}: must be an integer >= 1")
    if not 0.0 < p.loaded <= 1.0:
        raise ValueError(f"reweigh loaded {p.loaded!r}: must be a share above 0, at most 1")
    if not 0.0 < p.floor < 0.5:
        raise ValueError(f"reweigh floor {p.floor!r}: must be a share above 0 and below 0.5")
    return p


class SourceCount:
    """What one source delivered and how long it was busy in a window (`Window`): fields of a native
    object, updated for every attempt; in lists by source each update of an ns or byte count made a
    new Python object (docs/reader.md "Round 31")."""

    __slots__ = ("bytes", "busy", "done", "outstanding", "tick", "busy_before", "marks")

    def __init__(self, now: int, outstanding: int, busy_before: int, marks: deque[tuple[int, int]]):
        self.bytes = 0.0
        self.busy = 0
        self.done = 0                   # attempts that delivered bytes
        self.outstanding = outstanding
        self.tick = now
        # busy ns of the earlier windows of this epoch, and (busy ns, bytes) in all at each of its
        # latest deliveries (`Window.recent_rate`), carried from window to window
        self.busy_before = busy_before
        self.marks = marks

    def advance(self, now: int) -> None:
        if self.outstanding > 0 and now > self.tick:
            self.busy += now - self.tick
        self.tick = now


class Window:
    """What each source delivered and how long it was busy since the window opened (fed by the
    lanes with the reader's clock, under their lock): a `SourceCount` per source."""

    __slots__ = ("start", "given", "src")

    def __init__(self, n: int, now: int, outstanding: Sequence[int] | None = None, before: Window | None = None):
        self.start = now
        self.given: dict[str, int] = {}     # phase -> bytes the split gave in the window
        self.src: list[SourceCount] = []
        for s in range(n):
            last = None if before is None else before.src[s]
            self.src.append(SourceCount(now, 0 if outstanding is None else outstanding[s],
                                        0 if last is None else last.busy_before + last.busy,
                                        deque(maxlen=RECENT_REQUESTS + 1) if last is None else last.marks))

    @property
    def bytes(self) -> list[float]:
        return [c.bytes for c in self.src]

    @property
    def busy(self) -> list[int]:
        return [c.busy for c in self.src]

    @property
    def done(self) -> list[int]:
        return [c.done for c in self.src]

    @property
    def outstanding(self) -> list[int]:
        return [c.outstanding for c in self.src]

    def queued(self, s: int, nbytes: int, now: int, phase: str = "") -> None:
        """An attempt of the window's work is out on `s` (in its kernel) from `now`; `phase`: the
        phase of the read it belongs to ('' for a sample or probe)."""
        c = self.src[s]
        c.advance(now)
        c.outstanding += 1
        if phase:
            self.given[phase] = self.given.get(phase, 0) + nbytes

    def ended(self, s: int, nbytes: int, now: int, started: int | None = None) -> None:
        """An attempt on `s` is over; `nbytes` it read (0: skipped or failed). An attempt read since
        `started`, before this window opened, counts only the part of its bytes read in the window
        (pro rata of its time): a piece of seconds is not credited to the window it ends in; its
        whole bytes mark the drive's latest deliveries (`recent_rate`)."""
        c = self.src[s]
        c.advance(now)
        if c.outstanding > 0:
            c.outstanding -= 1
        got = float(nbytes)
        if nbytes and started is not None and started < self.start < now:
            got = nbytes * (now - self.start) / (now - started)
        if got:
            c.done += 1
            m = c.marks
            m.append((c.busy_before + c.busy, (m[-1][1] if m else 0) + nbytes))
        c.bytes += got

    def close(self, now: int) -> Window:
        """Count busy time up to `now`; returns the next window (work still out carries over)."""
        for c in self.src:
            c.advance(now)
        return Window(len(self.src), now, self.outstanding, self)

    def recent_rate(self, s: int, k: int = RECENT_REQUESTS) -> float | None:
        """Bytes per ns of source `s`'s latest `k` deliveries (at most RECENT_REQUESTS, of this
        epoch; fewer when it has delivered fewer) over its busy time since the one before them, up to
        the window's last count (a drive that stopped delivering falls towards 0): its pace now, in
        units of its own requests; None before two deliveries or without busy time since."""
        c = self.src[s]
        m = c.marks
        if len(m) < 2:
            return None
        first = m[max(0, len(m) - 1 - k)]
        busy = c.busy_before + c.busy - first[0]
        return (m[-1][1] - first[1]) / busy if busy > 0 else None

    def ready(self, now: int, healthy: Sequence[int], window_ns: int) -> bool:
        """The window can be judged: `window_ns` have passed, and every healthy source that had work
        delivered something or has been busy 2 x `window_ns` (stuck: its rate is 0)."""
        if now - self.start < window_ns:
            return False
        for s in healthy:
            self.src[s].advance(now)
        return all(self.src[s].busy == 0 or self.src[s].done or self.src[s].busy >= 2 * window_ns for s in healthy)

    def loaded(self, healthy: Sequence[int], now: int) -> float:
        """The largest share of the window any healthy source was busy: near 1 when reads wait on a
        drive; low when the drives idle between reads (compute sets the pace: weights cannot help,
        and an idle throttled drive's bursts make its rate meaningless)."""
        span = now - self.start
        return max((self.src[s].busy / span for s in healthy), default=0.0) if span > 0 else 0.0

    def carried(self, carry: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
        """(bytes, busy ns) per source of this window with `carry` added: per source, (bytes, busy
        ns) of earlier windows it was busy too little in."""
        return [x + c[0] for x, c in zip(self.bytes, carry)], [x + c[1] for x, c in zip(self.busy, carry)]

    def phase(self) -> str:
        """The phase that gave the most bytes in the window ('prefill' when none)."""
        return max(self.given, key=lambda p: self.given[p]) if self.given else "prefill"


def busy_rates(nbytes: Sequence[float], busy_ns: Sequence[float], healthy: Sequence[int],
               min_busy_ns: int) -> dict[int, float]:
    """Bytes per ns of each healthy source busy at least `min_busy_ns` (0 for one that delivered
    nothing in all that time)."""
    return {s: nbytes[s] / busy_ns[s] for s in healthy if busy_ns[s] >= max(1, min_busy_ns)}


@dataclass(frozen=True)
class Decision:
    """A window's verdict: the multipliers to use from now on (None: keep them) and why."""

    mult: tuple[float, ...] | None
    streak: tuple[int, ...]          # per source: windows in a row off the band (+ slower, - faster)
    why: str = ""
    source: int = -1                 # the source most off its weight (the event's source)


def _ref(mult: Sequence[float], base: Sequence[int], rates: Mapping[int, float]) -> float:
    """The median of the measured sources' rates per unit of belief."""
    k = sorted(rates[s] / (mult[s] * base[s]) for s in rates)          # rate per unit of belief
    return k[len(k) // 2] if len(k) % 2 else (k[len(k) // 2 - 1] + k[len(k) // 2]) / 2


def _off(mult: Sequence[float], base: Sequence[int], rates: Mapping[int, float],
         ref: float | None = None) -> dict[int, float] | None:
    """Per source measured: its rate per unit of belief over the median source's, `ref` when the
    caller has it (`_ref`; None: no median)."""
    if ref is None:
        ref = _ref(mult, base, rates)
    if ref <= 0:
        return None
    return {s: rates[s] / (mult[s] * base[s]) / ref for s in rates}


def pooled_rates(windows: Sequence[tuple[Sequence[float], Sequence[float]]], sources) -> dict[int, float]:
    """Bytes per ns of each source over several windows' (bytes, busy ns) together: a move sized on
    all the work of the windows that confirmed it, not on the last one's bursts."""
    out = {}
    for s in sources:
        b = sum(w[0][s] for w in windows)
        t = sum(w[1][s] for w in windows)
        if t > 0:
            out[s] = b / t
    return out


def judge(mult: Sequence[float], base: Sequence[int], rates: Mapping[int, float], streak: Sequence[int],
          policy: ReweighPolicy, size: Mapping[int, float] | None = None, pending: Sequence[int] = (),
          recent: Mapping[int, tuple[float | None, float | None]] | None = None) -> Decision:
    """One window's verdict. mult: the multipliers in use (1.0: the plan's weights); base: the
    plan's weights of the phase the window read; rates: bytes/ns of the sources measured (healthy
    ones only); streak: the previous verdict's. size: the rates a move is sized on (`pooled_rates`
    over the windows that confirmed it; default `rates`): whether to move is this window's
    verdict, how far is all the work since the streak began. pending: sources whose work carries
    into the next window (busy too little for a rate): they keep their streak, as every source does
    in a window with fewer than two rates (no evidence either way), so a source measured every few
    windows can still be confirmed. recent: per source, its pace over its latest RECENT_REQUESTS
    deliveries and over the latest half of them (`Window.recent_rate`): a source slow in the window
    whose latest deliveries came in within the band of its weight's share (of the same median) is
    not slow now and starts its count over; when only the latest half did, its count waits for the
    next window — windows of seconds that held a crawl judged a drive slow for up to two windows
    after it recovered (docs/reader.md "Re-weighting")."""
    n = len(mult)
    if len(rates) < 2:          # nothing to compare with: no evidence either way
        return Decision(None, tuple(streak[s] if s < len(streak) else 0 for s in range(n)))
    ref = _ref(mult, base, rates)
    rho = _off(mult, base, rates, ref)
    if rho is None:
        return Decision(None, (0,) * n)
    new_streak = [streak[s] if s in pending and s < len(streak) else 0 for s in range(n)]
    for s, r in rho.items():
        way = -1 if r < 1 / policy.band else 1 if r > policy.band and mult[s] < 1.0 else 0
        old = streak[s] if s < len(streak) else 0
        if way < 0 and recent is not None:
            paced = [x is not None and x / (mult[s] * base[s]) / ref >= 1 / policy.band for x in recent.get(s, ())]
            if paced and paced[0]:
                way = 0             # back at its weight's pace: the window's slowness is over
            elif any(paced):
                new_streak[s] = old     # its latest few are: the next window says which
                continue
        new_streak[s] = 0 if way == 0 else (old + way if old * way > 0 else way)
    worst = max(rho, key=lambda s: math.inf if rho[s] <= 0 else max(rho[s], 1 / rho[s]))
    due = [s for s in rho if abs(new_streak[s]) >= policy.confirm]
    if not due:
        return Decision(None, tuple(new_streak), source=worst)
    by = rho
    if size is not None and len(size) >= 2 and all(s in size for s in rho):
        by = _off(mult, base, size) or rho
    moved = list(mult)
    for s in due:       # off its plan by what it measured, back up to its plan at most; a stuck drive (rate 0)
        moved[s] = max(MIN_MULT, min(1.0, mult[s] * by[s]))      # keeps a multiplier: the floor decides
    if all(m >= 1 / policy.snap for m in moved):
        moved = [1.0] * n
    why = ", ".join(f"source {s} {rates[s] * 1e3:.1f} MB/s ({rho[s]:.2f}x its weight's share)" for s in sorted(rates))
    return Decision(tuple(moved), tuple(0 if s in due else new_streak[s] for s in range(n)), why,
                    min(due, key=lambda s: (-abs(math.log(max(rho[s], 1e-12))), s)))


def weights_for(base: Sequence[int], mult: Sequence[float], healthy: Sequence[int], floor: float,
                wmin: int = 1, wmax: int = 100) -> tuple[int, ...]:
    """The engine's integer weights for multipliers `mult` on `base` (the plan's weights of a
    phase): exactly `base` when every multiplier is 1; else scaled so the largest is `wmax`, each
    within [wmin, wmax], and each healthy source at least `floor` of the healthy sources' sum."""
    if all(m == 1.0 for m in mult):
        return tuple(base)
    raw = [b * m for b, m in zip(base, mult)]
    top = max(raw[s] for s in healthy) if healthy else max(raw)
    w = [min(wmax, max(wmin, round(wmax * r / top))) for r in raw]
    for _ in range(len(w)):
        total = sum(w[s] for s in healthy)
        low = [s for s in healthy if w[s] < floor * total]
        if not low:
            break
        rest = sum(w[s] for s in healthy if s not in low)
        for s in low:
            w[s] = min(wmax, max(wmin, math.ceil(floor * rest / (1 - floor * len(low)))))
    return tuple(w)
