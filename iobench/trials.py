"""The trial engine: lanes of cold reads on one or more drives, started on one gate, timed over
one shared set of windows.

Every lane is a thread that keeps one request in flight (`os.preadv` releases the GIL, so
threads overlap their reads). All lanes of a trial, on every drive in it, wait on one
`threading.Barrier`. The calling thread keeps the clock: the windows begin once every lane has
completed a request and at least `min_warmup` s after the gate (a throttle or a drive settles
for a moment after going busy), run back to back, and are the same instants for every drive.
At each window edge it samples every drive's device counter (`meter`); lanes keep issuing until
the last edge is sampled, so every drive is busy for the whole of every window. A window is
stretched when a drive would complete only a few (large) requests in it, and closes only once
every drive has completed a request in it (a host too busy to schedule the lanes for a short
window would otherwise measure a drive at 0 B/s).

Every instant comes from one `TrialClock`: the host's monotonic clock unless told otherwise. Tests pass
a virtual one, so what they check follows from the trial's arguments, not from the host's load.

A drive's bytes in a window are what its device delivered (the meter's difference); without a
meter, requests are credited by the part of their life inside the window (`stats`). Requests
give IOPS and latency either way.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from threading import Barrier  # by name, so a test can wrap the trial's gate

import numpy as np

from core.errors import Interrupted, MissingError
from core.coldio import ColdReader, aligned_buffer

from . import stats
from .meter import DeviceMeter
from .shapes import Shape, SlotTable

MIN_WARMUP_S = 0.25     # s after the gate before the first window
MAX_WARMUP_S = 5.0      # s: windows start by then even if a lane has not completed a request
POLL_S = 0.002
SAMPLE_S = 0.01         # s between device counter samples inside a window
MIN_REQUESTS = 8        # requests per drive per window, at least, by stretching the window
MAX_STRETCH = 3.0       # ... to at most this many times the requested window


class TrialClock:
    """Where a trial's time comes from: `now_ns()` (monotonic, ns) stamps the gate, every request
    and every meter sample; `sleep(s)` paces the trial's own thread between samples; `stop()` is
    called once the lanes have been told to stop, before they are joined.

    This is the host's clock (the same functions the engine always called; `stop` has nothing to
    do). A virtual clock, whose time moves only when every thread of the trial waits on it, needs
    `stop` to let the lanes still waiting inside a fake drive's read finish (tests/iobench/
    test_trials.py has one).
    """

    now_ns = staticmethod(time.perf_counter_ns)
    sleep = staticmethod(time.sleep)

    def stop(self) -> None:
        pass


SYSTEM_CLOCK = TrialClock()


@dataclass
class Stream:
    """What one drive does in a trial."""

    name: str
    reader: ColdReader
    shape: Shape
    lanes: int
    meter: DeviceMeter | None = None
    seed: int = 0


@dataclass(frozen=True)
class StreamRun:
    name: str
    lanes: int
    piece_bytes: int
    windows: tuple[tuple[float, float], ...]   # (bytes/s, requests/s) per window
    lat_ns: tuple[int, ...]                    # latency of each request started inside the windows
    requests: int                              # requests started inside the windows
    app_bytes: float                           # bytes the reads returned over all windows (by overlap)
    device_bytes: float | None                 # bytes the device delivered over all windows (None: no meter)
    short_reads: int                           # requests that returned fewer bytes than asked


class _Shared:
    def __init__(self, lanes: int, clock: TrialClock):
        self.lock = threading.Lock()
        self.pending = lanes        # lanes yet to complete their first request
        self.gate_ns = 0
        self.closed = threading.Event()
        self.clock = clock

    def open_gate(self):            # runs once, as the barrier releases every lane
        self.gate_ns = self.clock.now_ns()

    def lane_ready(self):
        with self.lock:
            self.pending -= 1


def run_trial(streams: list[Stream], seconds: float, windows: int = 1, *, min_warmup: float = MIN_WARMUP_S,
              max_warmup: float = MAX_WARMUP_S, cancel: threading.Event | None = None,
              clock: TrialClock = SYSTEM_CLOCK) -> list[StreamRun]:
    """Run all streams at once over `windows` windows of `seconds` each; one StreamRun per stream.

    Raises MissingError when a read fails (the drive or file went away) and Interrupted when
    `cancel` is set.
    """
    if seconds <= 0 or windows < 1:
        raise ValueError("seconds must be > 0 and windows >= 1")
    total_lanes = sum(s.lanes for s in streams)
    shared = _Shared(total_lanes, clock)
    barrier = Barrier(total_lanes + 1, action=shared.open_gate)
    failures: list[tuple[str, BaseException]] = []
    records: list[list[list[tuple[int, int, int]]]] = []
    threads = []
    for si, s in enumerate(streams):
        table = SlotTable(s.shape)
        if table.n <= 0:
            raise ValueError(f"{s.name}: the file holds no {s.shape.preset} request")
        per_lane: list[list[tuple[int, int, int]]] = [[] for _ in range(s.lanes)]
        records.append(per_lane)
        if s.shape.pattern == "seq":
            counter = itertools.count(int(np.random.default_rng([s.seed, si]).integers(table.n)))

            def next_slot(_rng, counter=counter):
                return next(counter)          # atomic under the GIL: lanes share one walk
        else:
            def next_slot(rng, n=table.n):
                return int(rng.integers(n))
        for lane in range(s.lanes):
            threads.append(threading.Thread(
                target=_lane, name=f"iobench-{s.name}-{lane}", daemon=True,
                args=(s, table, next_slot, np.random.default_rng([s.seed, si, lane]), per_lane[lane],
                      shared, barrier, failures)))

    meters = {s.meter.key: s.meter for s in streams if s.meter is not None}

    now_ns = clock.now_ns

    def sample() -> tuple[int, dict[str, int]]:
        t0 = now_ns()
        counts = {k: m.read_bytes() for k, m in meters.items()}
        return (t0 + now_ns()) // 2, counts

    def stopping() -> bool:
        return bool(failures) or (cancel is not None and cancel.is_set())

    edges: list[tuple[int, dict[str, int]]] = []       # the window boundaries
    trace: list[tuple[int, dict[str, int]]] = []       # every meter sample, boundaries included
    try:
        for t in threads:
            t.start()
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass                                # a lane failed before the gate: reported below
        while not stopping():
            waited = now_ns() - shared.gate_ns
            if (shared.pending == 0 and waited >= min_warmup * 1e9) or waited >= max_warmup * 1e9:
                break
            clock.sleep(POLL_S)
        if not stopping():
            step = int(_window_s(streams, records, seconds, now_ns() - shared.gate_ns) * 1e9)
            edges.append(sample())
            trace.append(edges[-1])
            for i in range(1, windows + 1):
                start = edges[-1][0]
                target = start + step
                while not stopping():
                    left = target - now_ns()
                    if left <= 0:
                        break
                    clock.sleep(min(left / 1e9, SAMPLE_S))
                    if meters and target - now_ns() > SAMPLE_S * 1e9 / 2:
                        trace.append(sample())
                # A window closes only once every stream has completed a request in it: on a
                # starved host (threads not scheduled for a short window's length) a window could
                # otherwise hold no completion at all and report a drive at 0 B/s that was never
                # given the CPU to read. A drive that truly delivers nothing is cut off at the cap.
                while not stopping() and not _completed_since(records, start) \
                        and now_ns() - target < MAX_WARMUP_S * 1e9:
                    clock.sleep(SAMPLE_S)
                    if meters:
                        trace.append(sample())
                if stopping():
                    break
                edges.append(sample())
                trace.append(edges[-1])
    except BaseException:
        shared.closed.set()
        barrier.abort()
        clock.stop()
        for t in threads:
            t.join()
        raise
    shared.closed.set()
    clock.stop()
    for t in threads:
        t.join()
    if failures:
        path, e = failures[0]
        if isinstance(e, OSError):
            raise MissingError(f"{path}: read failed during the trial ({e.strerror or e}); is the drive still attached?") from e
        raise e
    if cancel is not None and cancel.is_set():
        raise Interrupted("trial cancelled")
    return _summarise(streams, records, edges, trace)


def _summarise(streams, records, edges, trace) -> list[StreamRun]:
    wins = [(edges[i][0], edges[i + 1][0]) for i in range(len(edges) - 1)]
    a0, end = wins[0][0], wins[-1][1]
    req = []
    for s, per_lane in zip(streams, records):
        flat = [r for lane in per_lane for r in lane]
        st = np.array([r[0] for r in flat], dtype=np.int64)
        en = np.array([r[1] for r in flat], dtype=np.int64)
        nb = np.array([r[2] for r in flat], dtype=np.int64)
        req.append((st, en, nb, stats.window_rates(st, en, nb, wins)))

    # Device bytes per window, shared out among the streams on one device by their request bytes.
    out = []
    for i, (s, (st, en, nb, by_req)) in enumerate(zip(streams, req)):
        rates = []
        dev_total = None
        if s.meter is not None:
            dev_total = 0.0
            peers = [j for j, p in enumerate(streams) if p.meter is not None and p.meter.key == s.meter.key]
            for w, (a, b) in enumerate(wins):
                mine, together = by_req[w][0], sum(req[j][3][w][0] for j in peers)
                share = mine / together if together > 0 else 1.0 / len(peers)
                rate = meter_rate(trace, s.meter.key, a, b) * share
                dev_total += rate * (b - a) / 1e9
                rates.append((rate, by_req[w][1]))
        else:
            rates = list(by_req)
        app = sum(r * (b - a) / 1e9 for (r, _), (a, b) in zip(by_req, wins))
        inside = (st >= a0) & (st < end)
        out.append(StreamRun(name=s.name, lanes=s.lanes, piece_bytes=s.shape.piece_bytes, windows=tuple(rates),
                             lat_ns=tuple(int(x) for x in (en - st)[inside]), requests=int(inside.sum()),
                             app_bytes=app, device_bytes=dev_total,
                             short_reads=int((nb < s.shape.piece_bytes).sum())))
    return out


def _completed_since(records, t0_ns: int) -> bool:
    """Whether every stream has a request that completed after `t0_ns`."""
    return all(any(r[1] > t0_ns for lane in per_lane for r in list(lane)[-1:]) for per_lane in records)


def _window_s(streams, records, seconds: float, elapsed_ns: int) -> float:
    """`seconds`, stretched (up to MAX_STRETCH times) so that each drive completes about
    MIN_REQUESTS requests per window at the rate it showed in the `elapsed_ns` of warm-up: a slow
    drive reading large pieces delivers in steps of a piece, and a window of a few steps is mostly
    edge."""
    elapsed = elapsed_ns / 1e9
    want = seconds
    for s, per_lane in zip(streams, records):
        done = sum(r[2] for lane in per_lane for r in list(lane))
        if done > 0 and elapsed > 0:
            want = max(want, MIN_REQUESTS * s.shape.piece_bytes / (done / elapsed))
    return min(want, MAX_STRETCH * seconds)


def meter_rate(trace: list[tuple[int, dict[str, int]]], key: str, a: int, b: int) -> float:
    """Bytes/s of one device over [a, b]: the least-squares slope of its counter samples.

    A throttle or a drive may deliver in steps (a whole large request at once, then a pause);
    the difference of the two end samples then depends on where the steps fall, while the slope
    through every sample in between does not, nearly. Two samples give the plain difference.
    """
    pts = [(t, c[key]) for t, c in trace if a <= t <= b]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return 0.0
    t = np.array([p[0] for p in pts], dtype=float) / 1e9
    y = np.array([p[1] for p in pts], dtype=float)
    if len(pts) == 2:
        return float((y[1] - y[0]) / (t[1] - t[0]))
    t -= t.mean()
    return float(max(0.0, (t * (y - y.mean())).sum() / (t * t).sum()))


def _lane(s: Stream, table: SlotTable, next_slot, rng, rec, shared: _Shared, barrier: Barrier, failures):
    buf = aligned_buffer(s.shape.piece_bytes)
    view = memoryview(buf)[:s.shape.piece_bytes]
    now_ns = shared.clock.now_ns
    ready = False
    try:
        barrier.wait()
        while not shared.closed.is_set():
            off = table.offset(next_slot(rng))
            start = now_ns()
            n = s.reader.read_into(view, off)
            rec.append((start, now_ns(), n))
            if not ready:
                ready = True
                shared.lane_ready()
    except threading.BrokenBarrierError:
        pass
    except BaseException as e:   # noqa: BLE001 - handed to the caller, which raises it
        failures.append((s.reader.path, e))
        shared.closed.set()
        barrier.abort()
    finally:
        view.release()
        buf.release()
