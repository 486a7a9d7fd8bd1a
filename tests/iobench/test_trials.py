"""The trial engine: lanes on one gate, one shared window, device meters, failures."""

import threading
import time

import pytest

from core.errors import Interrupted, MissingError
from iobench.shapes import decode_shape, seq_shape
from iobench.trials import Stream, run_trial
from replicas.coldio import ColdReader
from tests.helpers import write_random

MiB = 1 << 20


class FakeReader:
    """A drive that takes `service` seconds per request and records what it was asked."""

    how = "o_direct"
    alignment = 4096

    def __init__(self, path="fake", service=0.002, fail_after=None):
        self.path, self.service, self.fail_after = path, service, fail_after
        self.lock = threading.Lock()
        self.calls = []          # (start, offset, length)
        self.active = 0
        self.max_active = 0

    def read_into(self, buf, offset):
        with self.lock:
            self.calls.append((time.perf_counter(), offset, len(buf)))
            if self.fail_after is not None and len(self.calls) > self.fail_after:
                raise OSError(5, "Input/output error")
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.service)
        with self.lock:
            self.active -= 1
        return len(buf)


class FakeMeter:
    """A device counter that rises at a fixed rate (bytes/s) from its creation."""

    def __init__(self, key, rate):
        self.key, self.rate, self.t0 = key, rate, time.perf_counter()

    def read_bytes(self):
        return int((time.perf_counter() - self.t0) * self.rate)


def test_lanes_keep_requests_in_flight_and_rates_follow(tmp_path):
    r = FakeReader(service=0.004)
    shape = seq_shape(64 * MiB)
    run, = run_trial([Stream("d", r, shape, 4)], seconds=0.2, windows=2, min_warmup=0.02)
    assert r.max_active == 4
    assert len(run.windows) == 2
    # 4 lanes x 1 MiB / 4 ms = ~1 GB/s (sleep overshoots, so only an upper bound is tight)
    for bw, iops in run.windows:
        assert 0.1e9 < bw <= 1.1 * 4 * MiB / 0.004
        assert bw == pytest.approx(iops * MiB, rel=1e-6)
    assert run.requests > 20 and len(run.lat_ns) == run.requests
    assert min(run.lat_ns) >= 0.004e9 * 0.9
    # sequential: lanes share one walk, so no offset is read twice before the file wraps (64 slots)
    offs = [c[1] for c in r.calls]
    assert len(set(offs[:64])) == 64 and all(o % MiB == 0 for o in offs)
    assert run.device_bytes is None


def test_streams_share_one_gate_and_one_window():
    a, b = FakeReader("a", 0.003), FakeReader("b", 0.006)
    shape = seq_shape(64 * MiB)
    ra, rb = run_trial([Stream("a", a, shape, 2), Stream("b", b, shape, 3)], seconds=0.15, windows=2, min_warmup=0.02)
    first_a, first_b = a.calls[0][0], b.calls[0][0]
    assert abs(first_a - first_b) < 0.02              # released together by the barrier
    assert ra.windows[0][0] == pytest.approx(2 * MiB / 0.003, rel=0.5)
    assert rb.windows[0][0] == pytest.approx(3 * MiB / 0.006, rel=0.5)


def test_device_meter_gives_the_rate_and_is_shared_out_by_requests():
    a, b = FakeReader("a", 0.002), FakeReader("b", 0.002)
    meter = FakeMeter("7:0", 500e6)           # one device under both files
    shape = seq_shape(64 * MiB)
    ra, rb = run_trial([Stream("a", a, shape, 1, meter), Stream("b", b, shape, 1, meter)],
                       seconds=0.1, windows=2, min_warmup=0.01)
    for w in range(2):
        assert ra.windows[w][0] + rb.windows[w][0] == pytest.approx(500e6, rel=0.05)
    assert ra.device_bytes is not None and ra.app_bytes > 0


def test_random_shape_reads_component_pieces():
    r = FakeReader(service=0.001)
    comp = 6_635_520
    shape = decode_shape(200 * comp, (10, 5, 5), 1, comp)
    run_trial([Stream("d", r, shape, 2, seed=3)], seconds=0.05, windows=1, min_warmup=0.01)
    for _, off, length in r.calls:
        assert length == 1_572_864
        assert (off - 3_489_792) % comp == 0          # source 1's piece of some component
        assert off + length <= 200 * comp


def test_a_failing_read_is_a_missing_error():
    r = FakeReader("/drive/gone", 0.001, fail_after=5)
    with pytest.raises(MissingError, match="/drive/gone"):
        run_trial([Stream("d", r, seq_shape(64 * MiB), 2)], seconds=0.2, windows=1, min_warmup=0.01)


def test_cancel_is_interrupted():
    r = FakeReader(service=0.002)
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    with pytest.raises(Interrupted):
        run_trial([Stream("d", r, seq_shape(64 * MiB), 2)], seconds=5, windows=1, cancel=cancel)


def test_real_cold_reads_on_a_file(tmp_path):
    p = tmp_path / "f"
    write_random(p, 16 * MiB, seed=1)
    with ColdReader(str(p)) as r:
        run, = run_trial([Stream("f", r, seq_shape(16 * MiB), 2)], seconds=0.05, windows=2, min_warmup=0.01)
    assert run.requests > 0 and all(bw > 0 for bw, _ in run.windows)
    assert run.short_reads == 0


def test_bad_arguments():
    with pytest.raises(ValueError):
        run_trial([Stream("d", FakeReader(), seq_shape(64 * MiB), 1)], seconds=0, windows=1)
    with pytest.raises(ValueError):
        run_trial([Stream("d", FakeReader(), seq_shape(MiB // 2), 1)], seconds=0.1, windows=1)
