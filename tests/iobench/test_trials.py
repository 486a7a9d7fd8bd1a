"""The trial engine: lanes on one gate, one shared window, device meters, stretching, failures.

Every trial here but the last runs on a VirtualClock with fake drives that take a fixed virtual
service time per request, so each rate, request count and latency is the exact number the
trial's arguments give, whatever the host's load and whichever thread it runs first.
"""

import errno
import threading
from dataclasses import dataclass

import pytest

from core.errors import Interrupted, MissingError
from iobench import trials
from iobench.shapes import decode_shape, seq_shape
from iobench.trials import POLL_S, Stream, run_trial
from core.coldio import ColdReader
from tests.helpers import write_random

MiB = 1 << 20
MS = 1_000_000   # ns


class VirtualClock:
    """A trial's clock in virtual ns from 0, for iobench.trials.run_trial(clock=...).

    Time moves only when every thread of the trial waits on it (the trial's own thread in
    `sleep` between samples, each lane inside a FakeDrive's read), and then jumps to the earliest
    wake-up. Lanes due at that instant go before the trial's thread, so whatever the trial looks
    at (pending lanes, the warm-up's bytes, a sample) already holds every request that ended by
    then. `stop()` lets the lanes still inside a read finish at once, each at its own wake-up.
    A lane that ends without a word (a failed read, the trial closing) is seen by polling
    `is_alive`, which only decides how soon the others go on, never an instant.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._t = 0
        self._lanes = 0
        self._trial = None          # the thread that runs the trial
        self._known = set()         # threads that have asked the clock anything
        self._wake = {}             # thread waiting -> ns it wakes at
        self._local = {}            # thread -> the instant it was last let go (its now)
        self._stopped = False

    def expect(self, lanes):
        """Before a trial of `lanes` lanes run on the calling thread."""
        with self._cond:
            self._lanes, self._trial = lanes, threading.current_thread()

    def now_ns(self):
        me = threading.current_thread()
        with self._cond:
            self._known.add(me)
            return self._local.get(me, self._t)

    def sleep(self, seconds):
        me = threading.current_thread()
        with self._cond:
            self._known.add(me)
            wake = self._local.get(me, self._t) + round(seconds * 1e9)
            if self._stopped:
                self._local[me] = wake
                return
            self._wake[me] = wake
            self._advance()
            while me in self._wake:
                self._cond.wait(0.002)
                self._advance()

    def stop(self):
        with self._cond:
            self._stopped = True
            self._local.update(self._wake)
            self._wake.clear()
            self._cond.notify_all()

    def _advance(self):
        if self._stopped or not self._wake or len(self._known) < self._lanes + 1:
            return                  # a lane that has not started yet runs at the current instant
        if any(t.is_alive() and t not in self._wake for t in self._known):
            return
        t_next = min(self._wake.values())
        due = [t for t, w in self._wake.items() if w == t_next]
        for t in [t for t in due if t is not self._trial] or due:
            del self._wake[t]
            self._local[t] = t_next
        self._t = t_next
        self._cond.notify_all()


@dataclass(frozen=True)
class Request:
    start_ns: int        # virtual
    offset: int
    length: int
    lane: str            # the lane thread's name


class Log:
    """Events from several threads in the order they happened."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events = []

    def add(self, event):
        with self.lock:
            self.events.append(event)


class FakeDrive:
    """A drive that serves any number of requests at once, each in `service` s of virtual time.
    It records every request and the most it had in flight; the request after `fail_after`
    fails with EIO; the `cancel_after`-th sets `cancel`. A lane of the trial must make its first
    request before any fails (the clock waits for every lane to start)."""

    def __init__(self, clock, path="fake", service=0.002, *, fail_after=None, cancel=None, cancel_after=None,
                 log=None):
        self.clock, self.path, self.service = clock, path, service
        self.fail_after, self.cancel, self.cancel_after, self.log = fail_after, cancel, cancel_after, log
        self.lock = threading.Lock()
        self.calls: list[Request] = []
        self.active = 0
        self.max_active = 0

    def read_into(self, buf, offset):
        with self.lock:
            self.calls.append(Request(self.clock.now_ns(), offset, len(buf), threading.current_thread().name))
            if self.log is not None:
                self.log.add(("read", self.path))
            if self.fail_after is not None and len(self.calls) > self.fail_after:
                raise OSError(errno.EIO, "Input/output error")
            if self.cancel is not None and len(self.calls) == self.cancel_after:
                self.cancel.set()
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        n = self.serve(buf, offset)
        self.clock.sleep(self.service)
        with self.lock:
            self.active -= 1
        return n

    def serve(self, buf, offset):
        return len(buf)


class FileDrive(FakeDrive):
    """A FakeDrive whose bytes come from a real ColdReader, checked against the file's content."""

    def __init__(self, clock, reader, data, service):
        super().__init__(clock, reader.path, service)
        self.reader, self.data, self.wrong = reader, data, 0

    def serve(self, buf, offset):
        n = self.reader.read_into(buf, offset)
        if bytes(buf[:n]) != self.data[offset:offset + n]:
            with self.lock:
                self.wrong += 1
        return n


class FakeMeter:
    """A device counter that rises by `rate` bytes per s of virtual time."""

    def __init__(self, clock, key, rate):
        self.clock, self.key, self.rate = clock, key, rate

    def read_bytes(self):
        return self.clock.now_ns() * self.rate // 10**9


def run(clock, streams, seconds, windows, **kw):
    clock.expect(sum(s.lanes for s in streams))
    return run_trial(streams, seconds, windows, clock=clock, **kw)


def test_lanes_keep_requests_in_flight_and_rates_follow():
    clock = VirtualClock()
    r = FakeDrive(clock, service=0.004)
    run_, = run(clock, [Stream("d", r, seq_shape(64 * MiB), 4)], seconds=0.2, windows=2, min_warmup=0.02)
    assert r.max_active == 4
    # 4 lanes x 1 MiB / 4 ms, every window; the windows are not stretched (8 requests take 8 ms)
    assert len(run_.windows) == 2
    for bw, iops in run_.windows:
        assert bw == pytest.approx(4 * MiB / 0.004, rel=1e-9)
        assert iops == pytest.approx(4 / 0.004, rel=1e-9)
    assert run_.requests == 4 * 2 * 50                  # 4 lanes x 0.4 s / 4 ms, started inside the windows
    assert run_.lat_ns == (4 * MS,) * run_.requests
    assert run_.app_bytes == pytest.approx(run_.requests * MiB, rel=1e-9)
    assert run_.short_reads == 0 and run_.device_bytes is None
    # sequential: lanes share one walk, so no offset is read twice before the file wraps (64 slots)
    offs = [c.offset for c in r.calls]
    assert len(set(offs[:64])) == 64 and all(o % MiB == 0 for o in offs)


def test_every_lane_of_every_stream_waits_on_one_gate_and_the_streams_share_the_windows(monkeypatch):
    log = Log()
    arrived = set()

    class RecordingBarrier(threading.Barrier):
        """The trial's barrier, noting who waits on it and when its action (the gate) runs."""

        def __init__(self, parties, action=None, timeout=None):
            def gate():
                log.add(("gate", parties, frozenset(arrived)))
                action()
            super().__init__(parties, gate, timeout)

        def wait(self, timeout=None):
            with log.lock:
                arrived.add(threading.current_thread().name)
            return super().wait(timeout)

    monkeypatch.setattr(trials, "Barrier", RecordingBarrier)
    clock = VirtualClock()
    a = FakeDrive(clock, "a", 0.003, log=log)
    b = FakeDrive(clock, "b", 0.006, log=log)
    shape = seq_shape(64 * MiB)
    ra, rb = run(clock, [Stream("a", a, shape, 2), Stream("b", b, shape, 3)], seconds=0.15, windows=2,
                 min_warmup=0.02)

    lanes = {"iobench-a-0", "iobench-a-1", "iobench-b-0", "iobench-b-1", "iobench-b-2"}
    assert log.events[0] == ("gate", 2 + 3 + 1, frozenset(lanes | {threading.current_thread().name}))
    assert {e[0] for e in log.events[1:]} == {"read"}                # no read before the gate, one gate
    assert {e[1] for e in log.events[1:]} == {"a", "b"}
    first = {c.lane: c.start_ns for c in reversed(a.calls + b.calls)}
    assert first == dict.fromkeys(lanes, 0)                           # every lane's first read at the gate
    # one set of windows for both: each stream's own rate in each
    for w in range(2):
        assert ra.windows[w] == pytest.approx((2 * MiB / 0.003, 2 / 0.003), rel=1e-9)
        assert rb.windows[w] == pytest.approx((3 * MiB / 0.006, 3 / 0.006), rel=1e-9)
    assert (ra.requests, rb.requests) == (2 * 100, 3 * 50)            # lanes x 0.3 s / service


def test_device_meter_gives_the_rate_and_is_shared_out_by_requests():
    clock = VirtualClock()
    a, b = FakeDrive(clock, "a", 0.002), FakeDrive(clock, "b", 0.004)
    meter = FakeMeter(clock, "7:0", 500_000_000)       # one device under both files
    shape = seq_shape(64 * MiB)
    ra, rb = run(clock, [Stream("a", a, shape, 1, meter), Stream("b", b, shape, 1, meter)],
                 seconds=0.1, windows=2, min_warmup=0.01)
    # a asks for twice b's bytes, so it gets 2/3 of what the device delivered; requests stay its own
    for w in range(2):
        assert ra.windows[w] == pytest.approx((500e6 * 2 / 3, 1 / 0.002), rel=1e-9)
        assert rb.windows[w] == pytest.approx((500e6 * 1 / 3, 1 / 0.004), rel=1e-9)
    assert ra.device_bytes == pytest.approx(500e6 * 2 / 3 * 0.2, rel=1e-9)
    assert rb.device_bytes == pytest.approx(500e6 * 1 / 3 * 0.2, rel=1e-9)
    assert (ra.app_bytes, rb.app_bytes) == pytest.approx((0.2 / 0.002 * MiB, 0.2 / 0.004 * MiB), rel=1e-9)


@pytest.mark.parametrize("service, window_s", [
    (0.010, 0.1),    # 8 requests take 80 ms: the window stays 0.1 s
    (0.020, 0.2),    # 2 requests in the 50 ms warm-up: 8 take 0.2 s
    (0.040, 0.3),    # 1 request in the warm-up: 8 would take 0.4 s, capped at 3 x 0.1 s
    (0.060, 0.3),    # the warm-up waits past 50 ms for the first request to land (60 ms); capped
])
def test_windows_start_once_every_lane_completed_a_request_and_stretch_for_a_slow_drive(service, window_s):
    clock = VirtualClock()
    r = FakeDrive(clock, service=service)
    run_, = run(clock, [Stream("d", r, seq_shape(64 * MiB), 1)], seconds=0.1, windows=2, min_warmup=0.05)
    assert run_.requests == round(2 * window_s / service)
    for bw, iops in run_.windows:
        assert (bw, iops) == pytest.approx((MiB / service, 1 / service), rel=1e-9)


class StallingDrive(FakeDrive):
    """A FakeDrive whose requests after the first `fast` take `slow` s: a lane the host stopped
    scheduling, or a drive gone slow, for longer than a whole window."""

    def __init__(self, clock, fast, slow):
        super().__init__(clock, "stall", 0.005)
        self.fast, self.slow, self.delivered = fast, slow, 0

    @property
    def service(self):
        return 0.005 if len(self.calls) <= self.fast else self.slow

    @service.setter
    def service(self, value):
        pass

    def serve(self, buf, offset):
        return len(buf)

    def read_into(self, buf, offset):
        n = super().read_into(buf, offset)
        with self.lock:
            self.delivered += n           # a device counts a read once it has delivered it
        return n


class DeliveredMeter:
    def __init__(self, drive):
        self.drive, self.key = drive, "7:9"

    def read_bytes(self):
        with self.drive.lock:
            return self.drive.delivered


def test_a_window_closes_only_once_every_drive_completed_a_request_in_it():
    # Requests take 0.5 s after the warm-up, five times the 0.1 s window (and past its 3x stretch):
    # a window closed on time would hold no completion and report the drive at 0 B/s.
    clock = VirtualClock()
    r = StallingDrive(clock, fast=20, slow=0.5)
    run_, = run(clock, [Stream("d", r, seq_shape(64 * MiB), 1, DeliveredMeter(r))],
                seconds=0.1, windows=2, min_warmup=0.02)
    assert all(bw > 0 for bw, _ in run_.windows)
    assert run_.device_bytes > 0


def test_random_shape_reads_component_pieces():
    clock = VirtualClock()
    r = FakeDrive(clock, service=0.001)
    comp = 6_635_520
    shape = decode_shape(200 * comp, (10, 5, 5), 1, comp)
    run(clock, [Stream("d", r, shape, 2, seed=3)], seconds=0.05, windows=1, min_warmup=0.01)
    assert len(r.calls) > 2
    for c in r.calls:
        assert c.length == 1_572_864
        assert (c.offset - 3_489_792) % comp == 0          # source 1's piece of some component
        assert c.offset + c.length <= 200 * comp


def test_a_failing_read_is_a_missing_error():
    clock = VirtualClock()
    r = FakeDrive(clock, "/drive/gone", 0.001, fail_after=5)
    with pytest.raises(MissingError, match="/drive/gone"):
        run(clock, [Stream("d", r, seq_shape(64 * MiB), 2)], seconds=0.2, windows=1, min_warmup=0.01)


def test_cancel_is_interrupted_within_one_poll():
    clock = VirtualClock()
    cancel = threading.Event()
    r = FakeDrive(clock, service=0.002, cancel=cancel, cancel_after=10)
    with pytest.raises(Interrupted):
        run(clock, [Stream("d", r, seq_shape(64 * MiB), 2)], seconds=5, windows=1, cancel=cancel)
    cancelled_at = r.calls[9].start_ns
    assert max(c.start_ns for c in r.calls) <= cancelled_at + POLL_S * 1e9


def test_real_cold_reads_on_a_file(tmp_path):
    p = tmp_path / "f"
    data = write_random(p, 16 * MiB, seed=1)
    clock = VirtualClock()
    with ColdReader(str(p)) as reader:
        drive = FileDrive(clock, reader, data, service=0.005)
        run_, = run(clock, [Stream("f", drive, seq_shape(16 * MiB), 2)], seconds=0.05, windows=2, min_warmup=0.01)
    assert drive.wrong == 0 and run_.short_reads == 0
    assert {c.offset for c in drive.calls} == {i * MiB for i in range(16)}
    assert run_.requests == 2 * 20                      # 2 lanes x 0.1 s / 5 ms
    for w in run_.windows:
        assert w == pytest.approx((2 * MiB / 0.005, 2 / 0.005), rel=1e-9)


def test_the_host_clock_by_default(tmp_path):
    """The engine as iobench runs it: the host's clock, real reads. Only what holds whatever the
    host's load is checked."""
    import time

    p = tmp_path / "f"
    write_random(p, 16 * MiB, seed=2)
    before = time.perf_counter_ns()
    with ColdReader(str(p)) as r:
        run_, = run_trial([Stream("f", r, seq_shape(16 * MiB), 2)], seconds=0.05, windows=2, min_warmup=0.01)
    took = time.perf_counter_ns() - before
    assert took >= (0.01 + 2 * 0.05) * 1e9            # the warm-up and both windows passed on the host's clock
    assert len(run_.windows) == 2 and run_.short_reads == 0
    assert len(run_.lat_ns) == run_.requests and all(0 < lat < took for lat in run_.lat_ns)
    for bw, iops in run_.windows:
        assert bw == pytest.approx(iops * MiB, rel=1e-9)   # every request a whole piece


def test_bad_arguments():
    clock = VirtualClock()
    with pytest.raises(ValueError):
        run_trial([Stream("d", FakeDrive(clock), seq_shape(64 * MiB), 1)], seconds=0, windows=1, clock=clock)
    with pytest.raises(ValueError):
        run_trial([Stream("d", FakeDrive(clock), seq_shape(MiB // 2), 1)], seconds=0.1, windows=1, clock=clock)
