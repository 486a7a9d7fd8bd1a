"""Re-weighting: weight moves off a source that falls behind and back when it recovers, bursts do
not move it, every change is an event, and the bytes are the same whatever the weights.

A source's speed is set by the test: each source's reads advance a clock of their own lane by a
number of nanoseconds per byte (`Drives`), and the reader's clock reads that lane's time on a
lane and the test's time elsewhere. Reads are made one at a time, each waited for, and the test's
time moves to the slowest lane's after each: which source is slow, and by how much, is decided by
the test, never by how fast this machine is. Nothing here sleeps or asserts on elapsed time.
"""

import threading

import pytest

from engine_bridge.harness.arms import ArmSpec, gate_plan, plan_changes
from engine_bridge.reader import reweighting
from engine_bridge.reader.reweighting import ReweighPolicy, Window, busy_rates, judge, weights_for
from engine_bridge.reader.split_reader import SplitReader
from engine_bridge.reader.settings import ReaderSettings
from engines.ds4_argodrive.constants import BLOCK_BYTES
from core.coldio import CachedReader
from tests.engine_bridge.helpers import primary_and_copies

SIZE = 64 * BLOCK_BYTES
MS = 1_000_000
POLICY = ReweighPolicy(window_ns=100 * MS, band=1.5, confirm=2, floor=0.05, snap=1.15, min_busy_ns=1 * MS)


class Drives:
    """Per source, nanoseconds per byte (the test changes them), and the clock the reader is given:
    on a lane, the time that lane's reads got to; elsewhere, the test's time."""

    def __init__(self, paths, ns_per_byte):
        self.speed = dict(zip(paths, ns_per_byte))
        self.t = 0                      # the test's time
        self.lane = threading.local()
        self.lock = threading.Lock()
        self.latest = 0                 # the latest any lane got to

    def __call__(self) -> int:
        return max(getattr(self.lane, "t", self.t), self.t)

    def reader(self, path):
        drives = self

        class Timed(CachedReader):
            def read_into(self, buffer, offset):
                n = super().read_into(buffer, offset)
                lane = drives.lane
                lane.t = int(max(getattr(lane, "t", 0), drives.t) + n * drives.speed[path])
                with drives.lock:
                    drives.latest = max(drives.latest, lane.t)
                return n

        return Timed(path)

    def settle(self) -> None:
        """After a read has landed: the test's time moves on to the slowest lane's."""
        with self.lock:
            self.t = max(self.t, self.latest)


def _reader(paths, drives, events, weights=(2, 1, 1), **kw):
    settings = ReaderSettings(lanes=1, reweigh=True, reweigh_policy=kw.pop("policy", POLICY))
    return SplitReader(paths, list(weights), list(weights), settings=settings, cold=False, clock=drives,
                       opener=drives.reader, report=events.append, **kw)


def _read_all(r, drives, data, reads):
    """`reads` whole-file reads, one at a time; each must return exactly the file's bytes."""
    for _ in range(reads):
        got = r.read(0, SIZE)
        assert bytes(got) == data
        drives.settle()


@pytest.fixture
def model(tmp_path):
    return primary_and_copies(tmp_path, SIZE, seed=11)


def test_weight_moves_off_a_slow_source_and_back_when_it_recovers(model):
    paths, data = model
    drives = Drives(paths, [1, 2, 2])           # 2:1:1 is right
    events = []
    with _reader(paths, drives, events) as r:
        _read_all(r, drives, data, 20)
        assert r.weights_now("prefill") == (2, 1, 1) and not events      # right weights: nothing moves
        drives.speed[paths[2]] = 40              # source 2 falls to 1/20 of its speed
        _read_all(r, drives, data, 40)
        moved = [e for e in events if e.kind == "reweighted"]
        assert moved and moved[0].source == 2
        w = r.weights_now("prefill")
        assert w[2] < w[1] and w[2] / sum(w) >= POLICY.floor - 1e-9      # off the slow one, never below the floor
        # sized on all the work of the windows that confirmed it (the first of them partly at the old
        # speed), a move never goes past what was measured: off the plan, then further, to the weights now
        assert moved[0].detail["old"]["prefill"] == [2, 1, 1] and moved[-1].detail["new"]["prefill"] == list(w)
        firsts = [e.detail["new"]["prefill"][2] / sum(e.detail["new"]["prefill"]) for e in moved]
        assert firsts == sorted(firsts, reverse=True) and firsts[0] < 1 / 4
        assert set(moved[0].detail) >= {"old", "new", "rates_mbs", "why"} and moved[0].t_ns > 0
        drives.speed[paths[2]] = 2               # it recovers
        _read_all(r, drives, data, 80)
        assert r.weights_now("prefill") == (2, 1, 1) and r.weights_now("decode") == (2, 1, 1)   # the plan's again
        assert r.stats().reweighs == len([e for e in events if e.kind == "reweighted"]) >= 2
        assert r.stats().to_dict()["weights_now"] == {"prefill": [2, 1, 1], "decode": [2, 1, 1]}


def test_a_source_cut_to_a_small_share_is_measured_over_several_windows_and_gets_its_weight_back(model):
    """A source busy less than `min_busy_ns` in a window (sources 0 and 1 while every read waits on
    source 2's crawl; source 2 once cut to a small share and recovered) carries its bytes and busy
    time into the next windows until they add up to that much: the crawler is moved off, and when
    it recovers it is measured, confirmed and given its plan weight back. Without the carry nothing
    here moves at all."""
    paths, data = model
    drives = Drives(paths, [1, 2, 2])
    policy = ReweighPolicy(window_ns=100 * MS, band=1.5, confirm=2, floor=0.05, snap=1.15, min_busy_ns=30 * MS)
    events = []
    with _reader(paths, drives, events, policy=policy) as r:
        drives.speed[paths[2]] = 40
        _read_all(r, drives, data, 40)
        w = r.weights_now("prefill")
        assert w[2] / sum(w) < 0.1                                   # cut to a small share
        drives.speed[paths[2]] = 2                                   # it recovers: busy ~2 ms a read now
        rw = r._reweigher
        _read_all(r, drives, data, 12)
        assert rw.window.busy[2] < policy.min_busy_ns                # too little in any one window
        _read_all(r, drives, data, 120)
        assert r.weights_now("prefill") == (2, 1, 1)                 # measured all the same: the plan's again


def test_a_drive_that_recovered_before_its_second_window_closed_is_not_moved(model):
    """Source 2 crawls through one window and part of the next, then reads at its weight's pace
    again: the second window, crawl and all, still rates it at 0.47 of its share (off the band),
    but its latest deliveries came in at its pace — no move (judged on the windows alone, it was
    cut to 0.47 of its weight after it had recovered)."""
    paths, data = model
    drives = Drives(paths, [1, 2, 2])
    policy = ReweighPolicy(window_ns=300 * MS, band=1.5, confirm=2, floor=0.05, snap=1.15, min_busy_ns=1 * MS)
    events = []
    with _reader(paths, drives, events, policy=policy) as r:
        rw = r._reweigher
        drives.speed[paths[2]] = 40                  # a twentieth of its speed: ~168 ms a read
        _read_all(r, drives, data, 3)                # the first window judges it slow, the second holds a read
        assert rw.streak[2] == -1
        drives.speed[paths[2]] = 2                   # back at its weight's pace
        second = rw.window
        _read_all(r, drives, data, 17)
        assert rw.window is not second               # the second window was judged ...
        assert not events and r.weights_now("prefill") == (2, 1, 1) and rw.streak[2] == 0   # ... and kept it
        _read_all(r, drives, data, 60)
        assert not events and r.weights_now("prefill") == (2, 1, 1)


def test_a_drives_recent_pace_is_its_latest_deliveries_over_its_busy_time_since():
    w = Window(1, now=0)
    assert w.recent_rate(0) is None
    for k in range(12):                              # 100 B in 100 ns, one request at a time, then 10 B
        w.queued(0, 100, 100 * k, "prefill")
        w.ended(0, 100 if k < 4 else 10, 100 * k + 100)
    assert w.recent_rate(0) == pytest.approx(10 / 100)           # the latest 8 only
    nxt = w.close(1200)
    assert nxt.recent_rate(0) == pytest.approx(10 / 100)         # carried into the next window
    nxt.queued(0, 100, 1200, "prefill")
    nxt.ready(2000, [0], 1)                                      # busy 800 ns since, nothing delivered
    assert nxt.recent_rate(0) == pytest.approx(80 / 1600)        # a drive that stops delivering falls
    p = ReweighPolicy(band=1.5, confirm=2)
    slow = {0: 1.0, 1: 1.0, 2: 0.2}
    assert w.recent_rate(0, 4) == pytest.approx(10 / 100) and w.recent_rate(0, 11) == pytest.approx(10 / 100)
    fine = judge((1.0,) * 3, (1, 1, 1), slow, (0, 0, -1), p, recent={2: (0.9, 0.9)})
    assert fine.mult is None and fine.streak[2] == 0                    # at its pace now: it starts over
    waits = judge((1.0,) * 3, (1, 1, 1), slow, (0, 0, -1), p, recent={2: (0.3, 0.9)})
    assert waits.mult is None and waits.streak[2] == -1                 # only its latest few: it waits
    assert judge((1.0,) * 3, (1, 1, 1), slow, (0, 0, -1), p, recent={2: (0.3, 0.3)}).mult == (1.0, 1.0, 0.2)
    assert judge((1.0,) * 3, (1, 1, 1), slow, (0, 0, -1), p, recent={2: (None, None)}).mult == (1.0, 1.0, 0.2)


def test_a_window_carries_the_work_of_a_source_busy_too_little_and_keeps_its_streak():
    w = Window(2, now=0)
    w.queued(0, 100, 0, "prefill")
    w.ended(0, 100, 100)
    w.queued(1, 10, 100, "prefill")
    w.ended(1, 10, 110)
    assert busy_rates(w.bytes, w.busy, [0, 1], 20) == {0: 1.0}       # source 1 busy 10 ns: no rate
    assert w.carried([(0, 0), (30, 15)]) == ([100, 40], [100, 25])
    assert busy_rates(*w.carried([(0, 0), (30, 15)]), [0, 1], 20) == {0: 1.0, 1: 40 / 25}   # 15 ns carried: 25 ns
    p = ReweighPolicy(confirm=2)
    assert judge((1.0, 1.0, 1.0), (1, 1, 1), {0: 1.0, 1: 1.0}, (0, 0, -1), p, pending=[2]).streak == (0, 0, -1)
    assert judge((1.0, 1.0, 1.0), (1, 1, 1), {0: 1.0, 1: 1.0}, (0, 0, -1), p).streak == (0, 0, 0)


def test_the_engines_pattern_is_cut_with_the_weights_of_now(model):
    """The embedded engine's StepReads asks the reader at every step: after a change, the next
    step's Setup carries the new weights."""
    from engine_bridge.moe.staging import StepReads
    from engines.registry import get_engine

    paths, data = model
    drives = Drives(paths, [1, 2, 40])
    events = []
    with _reader(paths, drives, events) as r:
        steps = StepReads(get_engine("ds4-argodrive"), None, {"prefill": (2, 1, 1), "decode": (2, 1, 1)},
                          healthy=r.healthy, weights_now=r.weights_now)
        assert steps.setup("prefill").weights == (2, 1, 1)
        _read_all(r, drives, data, 30)
        assert events and steps.setup("prefill").weights == r.weights_now("prefill") != (2, 1, 1)
        assert steps.setup("decode").weights == r.weights_now("decode")


def test_bursts_averaged_over_a_window_move_nothing(model):
    """A source whose reads come 4x faster, then 2.5x slower than its weight says, turn about (a
    throttle's bursts and stalls), is judged on its mean over a window and never moves."""
    paths, data = model
    drives = Drives(paths, [1, 2, 2])
    events = []
    with _reader(paths, drives, events, policy=ReweighPolicy(window_ns=100 * MS, band=1.5, confirm=2, floor=0.05,
                                                              min_busy_ns=1 * MS)) as r:
        for k in range(30):
            drives.speed[paths[1]] = 5.0 if k % 2 else 0.5
            _read_all(r, drives, data, 2)
    assert not [e for e in events if e.kind == "reweighted"]


def test_never_off_the_last_healthy_source_and_off_when_asked(model):
    paths, data = model
    drives = Drives(paths[:1], [1])
    with SplitReader(paths[:1], [1], clock=drives, opener=drives.reader,
                     cold=False, settings=ReaderSettings(reweigh=True, reweigh_policy=POLICY, lanes=1)) as r:
        assert bytes(r.read(0, SIZE)) == data and r.weights_now("prefill") == (1,)
    drives = Drives(paths, [1, 2, 40])
    events = []
    with SplitReader(paths, [2, 1, 1], clock=drives, opener=drives.reader, cold=False,
                     report=events.append, settings=ReaderSettings(reweigh=False, lanes=1)) as r:
        _read_all(r, drives, data, 30)
        assert r.weights_now("prefill") == (2, 1, 1) and not events and r.stats().reweighs == 0


def test_window_rates_are_bytes_over_busy_time():
    w = Window(2, now=0)
    w.queued(0, 100, 0, "prefill")
    w.queued(0, 100, 10, "prefill")
    w.ended(0, 100, 50)
    w.ended(0, 100, 100)            # busy 0..100 with work out: 200 B in 100 ns
    w.queued(1, 50, 200, "decode")
    w.ended(1, 50, 250)
    assert busy_rates(w.bytes, w.busy, [0, 1], 1) == {0: 2.0, 1: 1.0}
    assert busy_rates(w.bytes, w.busy, [0, 1], 60) == {0: 2.0}       # source 1 was busy only 50 ns
    assert w.phase() == "prefill"
    w.queued(1, 10, 300, "decode")
    nxt = w.close(400)
    assert nxt.outstanding == [0, 1] and nxt.start == 400


def test_a_window_waits_for_a_long_piece_and_a_stuck_source_rates_zero():
    w = Window(2, now=0)
    w.queued(0, 100, 0, "prefill")
    w.queued(1, 100, 0, "prefill")
    w.ended(0, 100, 50)
    assert not w.ready(50, [0, 1], 100)              # the window's time has not passed
    assert not w.ready(150, [0, 1], 100)             # source 1 is still reading its piece
    w.ended(1, 100, 180)
    assert w.ready(180, [0, 1], 100)
    stuck = Window(2, now=0)
    stuck.queued(0, 100, 0, "prefill")
    stuck.queued(1, 100, 0, "prefill")
    stuck.ended(0, 100, 10)
    assert not stuck.ready(150, [0, 1], 100) and stuck.ready(200, [0, 1], 100)   # busy 2 windows, nothing
    assert busy_rates(stuck.bytes, stuck.busy, [0, 1], 1)[1] == 0.0
    d = judge((1.0, 1.0), (1, 1), busy_rates(stuck.bytes, stuck.busy, [0, 1], 1), (0, -1), ReweighPolicy(confirm=2))
    assert d.mult[1] == reweighting.MIN_MULT and weights_for((1, 1), d.mult, [0, 1], 0.02) == (100, 3)


def test_a_window_in_which_the_drives_idled_is_not_judged(model):
    """Reads that do not wait on the drives (compute sets the pace; a throttled drive idle between
    them serves bursts) say nothing of their pace: a source slow in that window moves nothing."""
    paths, data = model
    drives = Drives(paths, [1, 2, 40])
    events = []
    with _reader(paths, drives, events) as r:
        for _ in range(40):
            _read_all(r, drives, data, 1)
            drives.t += 20 * (drives.t - r._reweigher.window.start) + 10 * MS      # the "compute" between reads
        assert not events and r.weights_now("prefill") == (2, 1, 1)
    w = Window(2, now=0)
    w.queued(0, 100, 0, "prefill")
    w.ended(0, 100, 30)
    assert w.loaded([0, 1], 100) == pytest.approx(0.3) and w.loaded([0, 1], 0) == 0.0


def test_a_piece_read_across_windows_counts_in_each_for_its_time_there():
    w = Window(1, now=1000)
    w.queued(0, 800, 1000, "prefill")
    w.ended(0, 800, 1400, started=200)       # read from 200 to 1400: a third of its time in this window
    assert w.bytes[0] == pytest.approx(800 / 3) and w.done[0] == 1
    w.queued(0, 100, 1400, "prefill")
    w.ended(0, 100, 1500, started=1400)      # all of it in the window
    assert w.bytes[0] == pytest.approx(800 / 3 + 100)


def test_judge_needs_confirm_windows_the_same_way():
    p = ReweighPolicy(band=1.5, confirm=2, snap=1.15)
    base = (2, 1, 1)
    slow = {0: 2.0, 1: 1.0, 2: 0.25}
    d1 = judge((1.0, 1.0, 1.0), base, slow, (0, 0, 0), p)
    assert d1.mult is None and d1.streak[2] == -1 and d1.source == 2
    d2 = judge((1.0, 1.0, 1.0), base, {0: 2.0, 1: 1.0, 2: 2.0}, d1.streak, p)    # faster than its plan: the
    assert d2.mult is None and d2.streak[2] == 0              # count starts over (weight only moves off a plan and back)
    up = judge((1.0, 1.0, 0.25), base, {0: 2.0, 1: 1.0, 2: 1.0}, (0, 0, 1), p)   # below its plan, measured faster
    assert up.mult == (1.0, 1.0, 1.0)                                              # back up, to the plan at most
    d3 = judge((1.0, 1.0, 1.0), base, slow, d1.streak, p)
    assert d3.mult == (1.0, 1.0, 0.25) and "source 2" in d3.why and d3.source == 2
    inflated = judge((1.0, 1.0, 1.0), base, {0: 5.0, 1: 0.5, 2: 1.0}, (0, -1, 0), p)   # an idle drive's burst (0)
    assert inflated.mult == (1.0, 0.5, 1.0)          # does not make the slow one look slower: a median, not a mean
    assert judge((1.0,) * 3, base, {0: 2.0}, (0, 0, -1), p).mult is None          # one measured source: nothing to compare
    back = judge(d3.mult, base, {0: 2.0, 1: 1.0, 2: 1.0}, (0, 0, 1), p)          # recovered: the plan's weights exactly
    assert back.mult == (1.0, 1.0, 1.0)


def test_weights_for_the_floor_the_range_and_the_plan():
    assert weights_for((2, 1, 1), (1.0, 1.0, 1.0), [0, 1, 2], 0.05) == (2, 1, 1)
    w = weights_for((2, 1, 1), (1.0, 1.0, 0.001), [0, 1, 2], 0.05)
    assert w[0] == 100 and w[1] == 50 and w[2] / sum(w) >= 0.05
    w = weights_for((2, 1, 1), (1.0, 1.0, 0.001), [0, 1], 0.05)       # source 2 degraded: no floor for it
    assert w[2] == 1
    assert all(1 <= x <= 100 for x in weights_for((1, 100, 1), (50.0, 1.0, 0.01), [0, 1, 2], 0.02))


@pytest.mark.parametrize("bad", [dict(band=1.0), dict(confirm=0), dict(floor=0.0), dict(floor=0.5), dict(snap=2.0),
                                 dict(window_ns=-1), dict(loaded=0.0)])
def test_policy_checks(bad):
    with pytest.raises(ValueError):
        reweighting.check_reweigh(ReweighPolicy(**bad))


def test_the_gate_says_when_the_plan_changed():
    spec = ArmSpec("a", ("p", "q"), (2, 1), (2, 1))
    srcs = [{"index": 0, "degraded": False}, {"index": 1, "degraded": False}]
    clean = {"sources": srcs, "events": []}
    assert gate_plan(clean, spec).ok and plan_changes(clean) == []
    came_back = {"sources": srcs, "events": [
        {"kind": "degraded", "source": 0, "t_ns": 1_000_000_000}, {"kind": "recovered", "source": 0, "t_ns": 6_000_000_000}]}
    g = gate_plan(came_back, spec)
    assert not g.ok and "plan changed" in g.detail and "source 0 degraded at 0.0 s, recovered at 5.0 s" in g.detail
    # a run that recorded its phases' starts says each event's time from its prefill, and its phase
    phased = {**came_back, "prefill": {"started_ns": 800_000_000}, "decode": {"started_ns": 3_000_000_000}}
    assert plan_changes(phased) == ["source 0 degraded at 0.20 s (prefill), recovered at 5.20 s (decode)"]
    early = {**came_back, "prefill": {"started_ns": 2_000_000_000}, "decode": {"started_ns": 3_000_000_000}}
    assert plan_changes(early) == ["source 0 degraded at -1.00 s (before the prefill), recovered at 4.00 s (decode)"]
    moved = {"sources": srcs, "events": [{"kind": "reweighted", "source": 1, "t_ns": 5,
                                          "detail": {"new": {"prefill": [100, 20], "decode": [100, 20]}}}]}
    g = gate_plan(moved, spec)
    assert not g.ok and "re-weighted 1 time(s)" in g.detail and "prefill 100:20" in g.detail
    failover_only = {"sources": srcs, "events": [{"kind": "failover", "source": 1, "t_ns": 5}]}
    assert gate_plan(failover_only, spec).ok
