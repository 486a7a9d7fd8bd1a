"""Never stalled at any speed: the rules that find a crawling drive are judged in units of the work
(the drives' own pace, what the other drives deliver, the engine's cuts), so the same scenario on
drives of 10 MB/s and of 5 GB/s gives the same decisions; bursts of a throttled drive do not take
it out of the split; and the lanes apply the rules in the order the test decides.

The pure rules are checked on tables and on one scenario replayed at two speeds 500x apart. The
lanes are checked with a source that blocks on an Event the test holds (`Stall`) and the hedger's
clock moved by the test (`Clock`): which piece is late, when, is the test's choice, never this
machine's speed. Nothing here sleeps to order threads or asserts on elapsed time.
"""

import math
import threading

import pytest

from engine_bridge.reader import hedging
from engine_bridge.reader.attempts import MAIN, Attempt, PieceInFlight, ReadTicket
from engine_bridge.reader.balancing import MIN_REQUESTS, BalancePolicy, Pace, depth_bytes, pick_victim
from engine_bridge.reader.hedging import (HedgePolicy, behind, busy_rate, copy_due, counts_late, deadline_ns, expected_ns,
                                          owed, too_slow)
from engine_bridge.reader.reweigher import Reweigher
from engine_bridge.reader.reweighting import ReweighPolicy
from engine_bridge.reader.settings import EMBEDDED, ReaderSettings, check_settings
from engine_bridge.reader.split_reader import SplitReader
from engines.ds4_argodrive import BLOCK_BYTES
from core.coldio import CachedReader
from tests.engine_bridge.helpers import primary_and_copies
from tests.engine_bridge.test_reader_hedge import FLOOR, HELD_S, Clock, Stall, StallingReader, _looked_again, _until
from tests.helpers import impure_imports

MIB = 1 << 20
SIZE = 16 * BLOCK_BYTES
CHUNK = BLOCK_BYTES // 4


# -- the pure rules ----------------------------------------------------------------------------

def test_the_rules_are_pure():
    from engine_bridge.reader import balancing, settings, tally

    assert impure_imports(hedging) == [] and impure_imports(balancing) == []
    assert impure_imports(settings) == [] and impure_imports(tally) == []


@pytest.mark.parametrize("begun, last, cut, counts", [
    (0, None, False, True),          # the first lateness of a source always counts
    (10, 10, False, True),           # started as the previous was judged: a new, serial lateness
    (11, 10, False, True),
    (9, 10, False, False),           # it was in the kernel when the previous was judged: the same stall
    (11, 10, True, False),           # another chunk of a cut already counted
    (-1, None, False, False),        # never started: late for what was queued ahead of it, not itself
])
def test_a_lateness_counts_once_per_cut_and_stall(begun, last, cut, counts):
    assert counts_late(begun, last, cut) is counts


def test_too_slow_over_a_span_is_a_share_of_what_the_others_delivered():
    w = (1, 1, 1)
    assert owed(2, [30, 30, 1], w, [0, 1, 2]) == 30                  # the others read 30 each: its share is 30
    assert too_slow(1, owed(2, [30, 30, 1], w, [0, 1, 2]), 3.0)      # a crawl: 1 of 30
    assert not too_slow(15, owed(2, [30, 30, 15], w, [0, 1, 2]), 3.0)   # half speed is slower, not too slow
    assert not too_slow(12, owed(2, [30, 30, 12], w, [0, 1, 2]), 3.0)
    assert too_slow(0, owed(1, [20, 0, 10], (2, 1, 1), [0, 1, 2]), 3.0)  # a hung drive, held to its weight
    assert owed(1, [20, 0, 10], (2, 1, 1), [0, 1, 2]) == 10
    assert owed(2, [0, 0, 5], w, [0, 1, 2]) is None                  # the others read nothing: no verdict
    assert not too_slow(0, None, 3.0)
    assert owed(0, [5, 5, 5], w, [0]) is None                        # nobody to compare with


def test_too_slow_to_keep_is_short_of_both_its_share_of_the_bytes_and_of_the_pace():
    """Balancing takes a slower drive's queued chunks: a drive at half speed delivers under a third
    of its share of the bytes, yet reads at half its share of the pace, and stays; a crawler is
    short of both and goes (`behind`: its share of the bytes, its pace, its share of the pace)."""
    w, everyone = (1, 1, 1), [0, 1, 2]
    assert busy_rate(30, 10) == 3 and busy_rate(5, 0) == math.inf and busy_rate(0, 0) is None
    # half speed, balanced: 8 bytes of a share of 30, but read at 1 a ns while it had work beside 2
    assert behind(2, [30, 30, 8], [15, 15, 8], w, everyone, 3.0) is None
    # a crawler: 2 bytes over all 15 ns beside peers at 2 a ns
    assert behind(2, [30, 30, 2], [15, 15, 15], w, everyone, 3.0) == (30, 2 / 15, 2)
    # short of the bytes only because it had little work (its chunks were taken): kept
    assert behind(2, [30, 30, 2], [15, 15, 2], w, everyone, 3.0) is None
    # its share of the bytes delivered, whatever its pace: kept (a throttle's stalls and bursts)
    assert behind(2, [30, 30, 12], [15, 15, 15], w, everyone, 3.0) is None
    # hung: nothing delivered while it had work; the others read in no time (their pace unbounded)
    assert behind(2, [30, 30, 0], [0, 0, 15], w, everyone, 3.0) == (30, 0, math.inf)
    assert behind(1, [20, 0, 10], [10, 10, 10], (2, 1, 1), everyone, 3.0) == (10, 0, 1)  # held to its weight
    assert behind(2, [0, 0, 5], [5, 5, 5], w, everyone, 3.0) is None                       # nothing to compare
    assert behind(2, [30, 30, 2], [0, 0, 0], w, everyone, 3.0) == (30, None, None)          # no time: the bytes decide


def test_a_copy_is_due_between_twice_its_expected_time_and_its_deadline():
    # expected 10, deadline 100 (from begun 0); the idle drive would take 5
    assert copy_due(15, 0, 10, 100, 5) is None         # on schedule, or merely slower than its mean
    assert copy_due(20, 0, 10, 100, 5) is None         # overdue by exactly its expected time: not yet
    assert copy_due(21, 0, 10, 100, 5) == 11
    assert copy_due(21, 0, 10, 100, 15) is None        # overdue by less than the copy would take
    assert copy_due(96, 0, 10, 100, 5) is None         # the copy would land after the deadline
    assert copy_due(100, 0, 10, 100, 0) is None        # at the deadline hedging acts
    assert copy_due(50, 0, None, 100, 1) is None and copy_due(50, 0, 10, None, 1) is None
    assert copy_due(50, -1, 10, 100, 1) is None        # never started
    assert copy_due(1, 0, 0, 100, 0) == 1              # a drive held to no time at all: strictly after its start


def test_pace_starts_slow_grows_with_deliveries_and_falls_while_it_delivers_nothing():
    pace = Pace(0.9)
    assert pace.rate(0) is None and pace.slow_start(MIB) is True                     # nothing in the kernel: may start
    pace.started(MIB, 0)
    assert pace.slow_start(4 * MIB) is True                                          # two requests at first, whatever their size
    pace.started(MIB, 0)
    assert pace.reqs == MIN_REQUESTS and pace.slow_start(MIB // 16) is False    # no third before a delivery: not
                                                                                    # one per lane, nor two chunks of small ones
    pace.ended(MIB, 10_000_000, True)                                               # 1 MiB in 10 ms: ~100 MB/s
    assert pace.rate(10_000_000) == pytest.approx(MIB / 10_000_000)
    assert pace.window == MIB                                                       # beyond two: what it has delivered
    assert pace.slow_start(8 * MIB) is True                                         # one request in: a second always
    pace.ended(MIB, 20_000_000, True)
    assert pace.window == 2 * MIB                                                   # it grows by every delivery
    pace.started(MIB, 20_000_000)
    pace.started(MIB // 2, 20_000_000)
    assert pace.slow_start(MIB // 2) is None and pace.slow_start(MIB // 2 + 1) is False   # within it, the depth decides
    pace.ended(MIB, 20_000_000, False)
    pace.ended(MIB // 2, 20_000_000, False)
    assert pace.rate(20_000_000) == pytest.approx(MIB / 10_000_000)                 # a failed read teaches nothing of its pace
    pace.started(MIB, 20_000_000)
    before = pace.rate(20_000_000)
    assert pace.rate(120_000_000) < before / 5                                      # 100 ms more with nothing: it falls
    pace.ended(MIB, 120_000_000, False)
    assert pace.inflight == 0 and pace.reqs == 0 and pace.n == 2


def test_the_same_scenario_at_10_mb_s_and_at_5_gb_s_gives_the_same_decisions():
    """Three drives of one speed, the third crawling at a twentieth of it; 1 MiB chunks; every time
    in units of the time a healthy drive takes for a chunk. The rules are replayed with the speeds
    and times of 10 MB/s drives and of 5 GB/s drives: every decision is the same. (The floor, a
    request's typical own time, is 0 here: no request has been timed.)"""

    def decisions(rate: float) -> list:
        unit = MIB / rate                                   # ns a healthy drive takes for a chunk
        at = lambda t: round(t * unit)                      # noqa: E731  (a time in units, in ns)
        units = lambda ns: None if ns is None else round(ns / unit, 3)   # noqa: E731
        pol = HedgePolicy(floor_ns=0)
        rates = {0: rate, 1: rate, 2: rate / 20}
        out = []
        # deadlines: a chunk on the crawler, 2 chunks in its kernel, held to its weight's promise
        held = hedging.held_rate(2, (rates[0], rates[1], rates[2]), (1, 1, 1), (0, 1, 2))
        due = deadline_ns(0, 2 * MIB, held, pol.floor_ns, pol.margin)
        out.append(units(due))
        out += [at(t) >= due for t in (1, 5, 5.99, 6.01, 40)]                   # late at 6 units, not before
        # an idle healthy drive copies it once twice its expected time has passed, before its deadline
        exp = expected_ns(2 * MIB, held)
        out += [units(copy_due(at(t), 0, exp, due, MIB / rate)) for t in (1, 3.5, 4.5, 5.5)]
        # the verdict over a span of 8 units: the others read 8 chunks each, the crawler 0.4
        got = [8 * MIB, 8 * MIB, 0.4 * MIB]
        out.append(too_slow(got[2], owed(2, got, (1, 1, 1), [0, 1, 2]), pol.margin))
        out.append(too_slow(4 * MIB, owed(2, [8 * MIB, 8 * MIB, 4 * MIB], (1, 1, 1), [0, 1, 2]), pol.margin))
        # an idle drive takes the crawler's next chunk, never the other way round
        out.append(pick_victim(0, {2: MIB}, [0, 0, 2 * MIB], rates))
        out.append(pick_victim(2, {0: MIB}, [MIB, 0, 0], rates))
        # the kernel depth is in units of the drives: every lane of a healthy drive, 8/20 of a chunk of the
        # crawler (it still keeps two requests in its kernel: `Pace.room`)
        out.append([depth_bytes(rates[i], rate, 8, BalancePolicy().depth_ns, MIB) / MIB for i in range(3)])
        # a pace learnt in units of its own deliveries, falling while it delivers nothing
        pace = Pace(0.9)
        for k in range(4):
            pace.started(MIB, at(k))
            pace.ended(MIB, at(k + 1), True)
        pace.started(MIB, at(4))
        out.append(round(pace.rate(at(4)) / rate, 3))
        out.append(round(pace.rate(at(6)) / rate, 3))
        return out

    slow, fast = decisions(10e6 / 1e9), decisions(5e9 / 1e9)
    assert slow == fast
    assert slow[0] == 6 and slow[1:6] == [False, False, False, True, True]    # its chunk is late at 6 units
    assert slow[6:10] == [None, None, 2.5, None]      # a copy between 4 units (twice 2) and 5 (its deadline less 1)
    assert slow[10:14] == [True, False, 2, None] and slow[14] == [8, 8, 0.4]
    assert slow[15] == 1.0 and slow[16] < 0.7                                 # its pace, and its fall
    # the old rule, a rate held only once it rests on 0.5 s of busy time, knew nothing in the fast
    # run's whole scenario (8 units of 0.2 ms) and everything in the slow one's (8 units of 0.1 s)
    est = hedging.RateEstimate(0.97)
    for k in range(8):
        est.observe(MIB, int(MIB / (5e9 / 1e9)))
    assert est.rate(500_000_000) is None and est.rate(0) is not None


def test_settings_are_one_value_checked_in_one_place():
    assert EMBEDDED.hedge and EMBEDDED.reweigh and EMBEDDED.balance and EMBEDDED.lanes == 8
    plain = ReaderSettings()
    assert not (plain.hedge or plain.reweigh or plain.balance)
    assert EMBEDDED.but(lanes=2).lanes == 2 and EMBEDDED.but(lanes=2).hedge
    for bad in (dict(lanes=0), dict(lanes=True), dict(hedge_policy=HedgePolicy(margin=0.5)),
                dict(balance_policy=BalancePolicy(chunk_bytes=1000)), dict(reweigh_policy=ReweighPolicy(band=1.0))):
        with pytest.raises(ValueError):
            check_settings(ReaderSettings(**bad))
    d = EMBEDDED.to_dict()
    assert set(d) == {"hedge", "hedge_policy", "reweigh", "reweigh_policy", "balance", "balance_policy"}
    assert d["balance_policy"]["copies"] is True and ReaderSettings().to_dict()["hedge_policy"] is None


def test_reweighting_judges_only_reads_cut_with_the_weights_in_force():
    """After a change, what was cut with the old weights and is still out (queued, or in a kernel)
    counts in no window: its busy time and bytes would judge the new weights by the old shares."""
    t = [0]
    rw = Reweigher({"prefill": (1, 1), "decode": (1, 1)}, ReweighPolicy(window_ns=100, confirm=1, min_busy_ns=1),
                   lambda: t[0])

    def attempt(src, ln, epoch):
        ticket = ReadTicket(0, ln, "prefill", None, 0, 1)
        ticket.epoch = epoch
        return Attempt(PieceInFlight(ticket, src, 0, ln), src, MAIN, 0, ln, None, 0)

    for _ in range(2):                         # source 1 at a quarter of source 0's rate
        a, b = attempt(0, 400, 0), attempt(1, 100, 0)
        rw.started(a)
        rw.started(b)
        t[0] += 100
        rw.ended(a, 0, True)
        rw.ended(b, 1, True)
    change, _ = rw.step([0, 1])
    assert change is not None and rw.epoch == 1 and rw.weights("prefill")[1] < rw.weights("prefill")[0]
    old = attempt(1, 100, 0)                   # cut before the change, started after it
    rw.started(old)
    assert not old.counted and rw.window.outstanding == [0, 0]
    t[0] += 1000
    rw.ended(old, 1, True)
    assert rw.window.bytes == [0, 0] and rw.window.busy == [0, 0]
    new = attempt(1, 100, 1)
    rw.started(new)
    t[0] += 100
    rw.ended(new, 1, True)
    assert rw.window.bytes[1] == 100 and rw.window.busy[1] == 100


# -- the lanes, ordered by the test ------------------------------------------------------------

@pytest.fixture
def model(tmp_path):
    return primary_and_copies(tmp_path, SIZE, seed=31)


def _balanced(paths, stall, clock=None, hedge=False, events=None, lanes=2, **pol):
    settings = ReaderSettings(lanes=lanes, hedge=hedge, hedge_policy=HedgePolicy(floor_ns=FLOOR, **pol), balance=True,
                              balance_policy=BalancePolicy(chunk_bytes=CHUNK, chunk_max=CHUNK, depth_ns=0))
    return SplitReader(paths, [1, 1, 1], [1, 1, 1], settings=settings, cold=False, clock=clock,
                       opener=lambda p: StallingReader(p, stall), report=events.append if events is not None else None)


@pytest.mark.parametrize("piece", [CHUNK, CHUNK // 4])
def test_a_drive_that_crawls_from_its_first_read_holds_two_requests_not_one_per_lane(model, piece):
    """No pace is known yet: the slow start keeps a drive to MIN_REQUESTS requests in its kernel
    until it delivers, whatever their size, so a drive that hangs from the start holds two while
    the others take the rest of its share (not one per lane, nor two chunks' worth of an engine's
    small pieces, for seconds). One read cut in chunks, and reads of a small piece per drive."""
    from engines.base import Piece
    from engines.pattern import Read

    paths, data = model
    stall = Stall(paths[2])
    stall.active = True
    with _balanced(paths, stall, lanes=8) as r:
        try:
            if piece == CHUNK:
                tickets = [r.submit(0, SIZE)]
                total = SIZE
            else:
                n = 3 * piece
                tickets = [r.submit_read(Read(r.files[0], k * n, n, tuple(Piece(i, k * n + i * piece, piece, 0)
                                                                          for i in range(3))))
                           for k in range(16)]
                total = 16 * n
            held = []

            def settled():          # every piece is either in its kernel (held) or read by the others
                while stall.entered.acquire(blocking=False):
                    held.append(1)
                return sum(r.stats().sources[i].bytes for i in (0, 1)) + len(held) * piece == total

            _until(settled)
            assert 0 < len(held) <= MIN_REQUESTS                  # whichever lanes won: at most two
            _until(lambda: sum(not t.done() for t in tickets) == (1 if piece == CHUNK else len(held)))   # they hold it
        finally:
            stall.gate.set()
        got = b"".join(bytes(t.result()) for t in tickets)
        s = r.stats()
    assert got == data[:total]
    assert s.sources[2].bytes == len(held) * piece
    assert sum(x.bytes for x in s.sources) == total


class Hang:
    """The drive that first reads file offset `at` hangs from then on: that read and every later
    read of its copy block until `gate` is set (balancing decides which drive it is)."""

    def __init__(self, at: int):
        self.at, self.path = at, None
        self.gate, self.entered, self.lock = threading.Event(), threading.Semaphore(0), threading.Lock()

    def reader(self, path):
        hang = self

        class Hanging(CachedReader):
            def read_into(self, buffer, offset):
                with hang.lock:
                    if hang.path is None and offset == hang.at:
                        hang.path = path
                    held = hang.path == path
                if held:
                    hang.entered.release()
                    hang.gate.wait(HELD_S)
                return super().read_into(buffer, offset)

        return Hanging(path)


def test_an_idle_drive_copies_a_chunk_overdue_in_a_late_drives_kernel_before_its_deadline(model):
    """A drive hangs: its first chunk is judged late at its deadline (the test's clock) and hedged.
    A chunk it starts after that is past twice its expected time, short of its deadline: an idle
    drive reads a copy of it, and the read completes while the drive still hangs; at its deadline
    the chunk is still judged late (counted) but not hedged again."""
    paths, data = model
    clock, hang = Clock(), Hang(5 * CHUNK)
    settings = ReaderSettings(lanes=3, hedge=True, hedge_policy=HedgePolicy(floor_ns=FLOOR, margin=1000.0),
                              balance=True, balance_policy=BalancePolicy(chunk_bytes=CHUNK, chunk_max=CHUNK, depth_ns=0))
    with SplitReader(paths, [1, 1, 1], settings=settings, cold=False, clock=clock, opener=hang.reader) as r:
        assert bytes(r.read(SIZE // 2, SIZE // 2)) == data[SIZE // 2:]          # warm-up: paces known
        before = r.stats()
        first = r.submit(5 * CHUNK, CHUNK)       # one chunk: the drive that reads it hangs on it, and from now on
        hang.entered.acquire()
        h = paths.index(hang.path)
        clock.advance(FLOOR + 1)
        r.wake_hedger()
        assert bytes(first.result()) == data[5 * CHUNK:6 * CHUNK]    # hedged at its deadline
        s = r.stats()
        assert s.sources[h].late == 1 and sum(x.hedged - y.hedged for x, y in zip(s.sources, before.sources)) == 1
        second, held = r.submit(SIZE // 2, SIZE // 2), []

        def settled():          # every chunk of it is read by the others, or in the hung drive's kernel
            while hang.entered.acquire(blocking=False):
                held.append(1)
            return sum(x.bytes - y.bytes for x, y in zip(r.stats().sources, s.sources)) + len(held) * CHUNK == SIZE // 2

        _until(settled)
        clock.advance(FLOOR // 2)        # past twice its expected time (a page-cache pace: ~0), half its floor
        assert bytes(second.result()) == data[SIZE // 2:]           # while the drive still hangs
        mid = r.stats()
        assert sum(x.hedged - y.hedged for x, y in zip(mid.sources, s.sources)) == len(held)   # copied ...
        assert mid.sources[h].late == 1                                                      # ... not yet late
        clock.advance(FLOOR * 2000)
        r.wake_hedger()
        _until(lambda: r.stats().sources[h].late == 1 + len(held))
        end = r.stats()
        hang.gate.set()
    assert sum(x.hedged - y.hedged for x, y in zip(end.sources, mid.sources)) == 0      # judged, never hedged twice
    assert end.sources[h].hedged == before.sources[h].hedged


def test_a_stall_that_holds_every_piece_at_once_is_one_lateness_and_degrades_nothing(model):
    """A throttled drive stalls with all its kernel's pieces in it: every one of them is late (and
    hedged) together, but they are one lateness, not late_limit: the drive stays in the split."""
    paths, data = model
    stall, clock, events = Stall(paths[2], count=4), Clock(), []
    pol = HedgePolicy(floor_ns=FLOOR, late_limit=2, min_busy_ns=0)
    with SplitReader(paths, [1, 1, 1], settings=ReaderSettings(lanes=4, hedge=True, hedge_policy=pol), cold=False,
                     clock=clock, opener=lambda p: StallingReader(p, stall), report=events.append) as r:
        assert bytes(r.read(0, 4 * BLOCK_BYTES)) == data[:4 * BLOCK_BYTES]
        stall.active = True
        before = r.stats()
        tickets = [r.submit(k * 4 * BLOCK_BYTES, 4 * BLOCK_BYTES) for k in range(4)]
        for _ in range(4):
            stall.entered.acquire()                                  # four pieces in its kernel at once
        _until(lambda: all(r.stats().sources[i].reads == before.sources[i].reads + 4 for i in (0, 1)))
        clock.advance(FLOOR + 1)                                     # ... and only they are late
        r.wake_hedger()
        for k, t in enumerate(tickets):
            assert bytes(t.result()) == data[k * 4 * BLOCK_BYTES:(k + 1) * 4 * BLOCK_BYTES]
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late == 4 and sum(x.hedged for x in s.sources) == 4
    assert not s.sources[2].degraded and [e.kind for e in events] == []


def test_late_pieces_one_after_another_take_a_crawling_drive_out_and_say_by_how_much(model):
    """Each late piece started after the previous was judged: serial, they count; the drive delivered
    nothing of its share of what the others read meanwhile, so it is degraded, and the event says
    what it delivered and what its weight's share was."""
    paths, data = model
    stall, clock, events = Stall(paths[2]), Clock(), []
    gone = threading.Event()

    def report(ev):
        events.append(ev)
        if ev.kind == "degraded":
            gone.set()

    pol = HedgePolicy(floor_ns=FLOOR, late_limit=3, min_busy_ns=0)
    with SplitReader(paths, [1, 1, 1], settings=ReaderSettings(lanes=3, hedge=True, hedge_policy=pol), cold=False,
                     clock=clock, opener=lambda p: StallingReader(p, stall), report=report) as r:
        assert bytes(r.read(0, 4 * BLOCK_BYTES)) == data[:4 * BLOCK_BYTES]
        stall.active = True
        for k in range(3):
            before = [x.reads for x in r.stats().sources]
            t = r.submit(k * 4 * BLOCK_BYTES, 4 * BLOCK_BYTES)
            stall.entered.acquire()                                  # this read's piece is in its kernel
            # ... and the others' have landed before the clock moves: a read in flight across the
            # move would teach the hedger a request's typical time of a whole floor (its deadlines' floor)
            _until(lambda: all(r.stats().sources[i].reads > before[i] for i in (0, 1)))
            clock.advance(FLOOR + 1)
            r.wake_hedger()
            assert bytes(t.result()) == data[k * 4 * BLOCK_BYTES:(k + 1) * 4 * BLOCK_BYTES]
        gone.wait()
        assert r.degraded == (False, False, True)
        stall.gate.set()
    degraded = [e for e in events if e.kind == "degraded"]
    assert len(degraded) == 1 and "3 pieces late in a row" in degraded[0].message
    assert "it delivered 0.0 MB" in degraded[0].message and "its weight's share" in degraded[0].message
    assert "it read at 0.0 MB/s while it had work, its weight's share of their pace is unbounded" in degraded[0].message


@pytest.mark.parametrize("small_reads, degraded", [(3, True), (0, False)])
def test_a_piece_on_time_ends_a_streak_only_once_the_drive_caught_up_with_its_share(model, small_reads, degraded):
    """A drive late, then on time once, then late twice (late_limit 3). Before its piece on time the
    others read `small_reads` reads of two blocks (the engine's cut gives the third drive none of a
    read under three blocks): with three, the drive has delivered, since its streak began, one block
    against its weight's share of the others' nine — a crawler that a throttle lets land a piece
    now and then — and the streak goes on to the verdict; with none, one block against one and a
    half: it caught up, the piece on time ends the streak, and two more latenesses are not three."""
    paths, data = model
    stall, clock, events = Stall(paths[2]), Clock(), []
    pol = HedgePolicy(floor_ns=FLOOR, late_limit=3, min_busy_ns=0)
    four = 4 * BLOCK_BYTES

    def late_read(off):
        before = [x.reads for x in r.stats().sources]
        t = r.submit(off, four)
        stall.entered.acquire()                                      # its piece is in the drive's kernel
        _until(lambda: all(r.stats().sources[i].reads > before[i] for i in (0, 1)))
        clock.advance(FLOOR + 1)
        r.wake_hedger()
        assert bytes(t.result()) == data[off:off + four]

    with SplitReader(paths, [1, 1, 1], settings=ReaderSettings(lanes=4, hedge=True, hedge_policy=pol), cold=False,
                     clock=clock, opener=lambda p: StallingReader(p, stall), report=events.append) as r:
        assert bytes(r.read(0, four)) == data[:four]
        stall.active = True
        late_read(0)
        assert r.stats().sources[2].late == 1
        third = r.stats().sources[2].reads
        for k in range(small_reads):
            off = (4 + 2 * k) * BLOCK_BYTES
            assert bytes(r.read(off, 2 * BLOCK_BYTES)) == data[off:off + 2 * BLOCK_BYTES]
        assert r.stats().sources[2].reads == third                   # the third drive was given none of them
        stall.active = False
        assert bytes(r.read(four, four)) == data[four:2 * four]     # its piece lands on time
        assert r.stats().sources[2].late == 1
        stall.active = True
        late_read(2 * four)
        late_read(3 * four)
        _looked_again(r)                                             # a verdict of its last round is acted on
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late == 3
    assert s.sources[2].degraded is degraded and [e.kind for e in events] == (["degraded"] if degraded else [])


def test_the_embedded_engines_reads_count_as_cut_with_the_weights_in_force(model):
    """Re-weighting judges only reads cut with the weights in force: the engine's read pattern, made
    at every step with `weights_now`, must be recognised as such (else nothing would be judged)."""
    from engine_bridge.moe.staging import StepReads
    from engines.registry import get_engine
    from engines.pattern import Read
    from engines.base import Piece

    paths, data = model
    with SplitReader(paths, [2, 1, 1], settings=ReaderSettings(lanes=1, reweigh=True), cold=False) as r:
        steps = StepReads(get_engine("ds4-argodrive"), None, {"prefill": (2, 1, 1), "decode": (2, 1, 1)},
                          healthy=r.healthy, weights_now=r.weights_now)
        w = steps.setup("prefill").weights
        from engines.split import split_read
        pieces = tuple(Piece(p.source, p.offset, p.length, 0) for p in split_read(0, 4 * BLOCK_BYTES, w))
        now = r.submit_read(Read(r.files[0], 0, 4 * BLOCK_BYTES, pieces))
        odd = r.submit_read(Read(r.files[0], 0, 4 * BLOCK_BYTES, (Piece(0, 0, 4 * BLOCK_BYTES, 0),)))
        assert bytes(now.result()) == bytes(odd.result()) == data[:4 * BLOCK_BYTES]
    assert now.epoch == 0 and odd.epoch == -1


def test_no_copy_is_promised_on_a_pace_nobody_knows():
    assert copy_due(10, 0, expected_ns(MIB, None), 100, 1) is None
    assert expected_ns(MIB, math.inf) == 0.0 and expected_ns(MIB, 0.0) is None


# -- the floor and the step, in units of the work ----------------------------------------------

def test_the_floor_is_a_requests_typical_time_at_every_speed():
    """A burst promises no time at all (an infinite rate); what holds a deadline off then is a
    request's typical service time on these drives, not 50 ms: the same in units of a request at
    10 MB/s and at 5 GB/s. A throttle's stall weighs by its length: 15 requests of 1 unit and one
    of 100 make a typical time of 87 units, not the mean of 7."""
    pol = HedgePolicy()
    assert pol.floor_ns == 0
    for rate in (10e6 / 1e9, 5e9 / 1e9):
        unit = MIB / rate                               # ns a drive at `rate` takes for a chunk
        svc = hedging.ServiceTime(0.97)
        assert svc.typical_ns() == 0.0
        for _ in range(10):
            svc.observe(round(unit))
        assert svc.typical_ns() == pytest.approx(unit)
        due = deadline_ns(0, MIB, math.inf, pol.floor_ns, pol.margin, svc.typical_ns())
        assert due / unit == pytest.approx(1)                               # a request's time, not 0
        due = deadline_ns(0, 4 * MIB, rate, pol.floor_ns, pol.margin, svc.typical_ns())
        assert due / unit == pytest.approx(4 * pol.margin + 1)
        burst = hedging.ServiceTime(1.0 - 1e-12)
        for ns in [round(unit)] * 15 + [round(100 * unit)]:
            burst.observe(ns)
        assert burst.typical_ns() / unit == pytest.approx(10015 / 115, rel=1e-6)
    assert deadline_ns(0, MIB, math.inf, 7, HedgePolicy().margin, 0.0) == 7  # a floor set on top still holds


@pytest.mark.parametrize("sub, landed, typical, due", [
    (0, 100, 0.0, 300),             # the others needed 100 for their share: late at 3 x the step
    (50, 150, 0.0, 350),            # from the read's submit
    (0, 10, 40.0, 70),              # plus a request's typical time
    (0, 0, 0.0, 0),
])
def test_a_streaking_drives_piece_is_late_in_units_of_its_step(sub, landed, typical, due):
    assert hedging.step_deadline_ns(sub, landed, HedgePolicy(), typical) == due


class Gates:
    """Holds reads by source: `arm(path, k)` makes that source's next k reads block (each signals
    `entered[path]`) until `go(path)` lets one through; reads of an unarmed source run freely."""

    def __init__(self, paths):
        self.lock = threading.Lock()
        self.armed = {p: 0 for p in paths}
        self.entered = {p: threading.Semaphore(0) for p in paths}
        self.gate = {p: threading.Semaphore(0) for p in paths}

    def arm(self, path, k=1):
        with self.lock:
            self.armed[path] += k

    def go(self, path, k=1):
        for _ in range(k):
            self.gate[path].release()

    def reader(self, path):
        gates = self

        class Gated(CachedReader):
            def read_into(self, buffer, offset):
                with gates.lock:
                    held = gates.armed[path] > 0
                    if held:
                        gates.armed[path] -= 1
                if held:
                    gates.entered[path].release()
                    gates.gate[path].acquire(timeout=HELD_S)
                return super().read_into(buffer, offset)

        return Gated(path)


def test_a_drive_already_late_is_hedged_at_its_steps_pace_not_its_own_deadline(model):
    """A drive late once (a streak of 1, far from the verdict) gets a piece of the next read: the
    other drives read their share in U, so it is late by its step at 3 U (+ a request's typical
    time, U) after the submit and hedged, though its own deadline (two pieces in its kernel at its
    pace) is 6 U (+ U) away. The step's lateness is not counted in its streak: at its own deadline
    it is. Times are the test's clock."""
    paths, data = model
    g, clock, U = Gates(paths), Clock(), 1000
    ln = 12 * BLOCK_BYTES
    pol = HedgePolicy(floor_ns=0, late_limit=100, min_busy_ns=0)
    with SplitReader(paths, [1, 1, 1], settings=ReaderSettings(lanes=2, hedge=True, hedge_policy=pol), cold=False,
                     clock=clock, opener=g.reader) as r:
        for p in paths:                              # warm-up: every drive reads its piece in U
            g.arm(p)
        t0 = r.submit(0, ln)
        for p in paths:
            g.entered[p].acquire()
        clock.advance(U)
        for p in paths:
            g.go(p)
        assert bytes(t0.result()) == data[:ln]
        g.arm(paths[2], 100)                         # the third drive hangs from now on
        for p in paths[:2]:
            g.arm(p)
        t1 = r.submit(0, ln)                         # at U: its piece is late at U + 3 U (its own pace)
        for p in paths:
            g.entered[p].acquire()
        clock.advance(U)
        for p in paths[:2]:
            g.go(p)
        _until(lambda: all(r.stats().sources[i].reads == 2 for i in (0, 1)))
        clock.advance(3 * U + 1)
        r.wake_hedger()
        assert bytes(t1.result()) == data[:ln]       # hedged: the drive's streak is 1
        assert r.stats().sources[2].late == 1
        for p in paths[:2]:
            g.arm(p)
        before = [r.stats().sources[i].reads for i in (0, 1)]    # one of them also read t1's hedge
        t2 = r.submit(0, ln)                         # at 5 U + 1; its own deadline: 2 pieces ahead, 7 U
        for p in paths:
            g.entered[p].acquire()
        clock.advance(U)
        for p in paths[:2]:
            g.go(p)
        # both of their pieces landed (at 6 U + 1) before the clock moves on: the step is U
        _until(lambda: all(r.stats().sources[i].reads == before[k] + 1 for k, i in enumerate((0, 1))))
        clock.advance(3 * U + 1)                     # 4 U + 1 after its submit: late by its step
        r.wake_hedger()
        assert bytes(t2.result()) == data[:ln]
        s = r.stats()
        assert s.sources[2].late == 1 and sum(x.hedged for x in s.sources) == 2     # hedged, not counted
        clock.advance(3 * U)                         # 7 U + 1: its own deadline
        r.wake_hedger()
        _until(lambda: r.stats().sources[2].late == 2)
        end = r.stats()
        g.go(paths[2], 100)
    assert sum(x.hedged for x in end.sources) == 2 and not end.sources[2].degraded      # judged, never hedged twice


@pytest.mark.parametrize("delivers", [True, False])
def test_a_drive_short_of_its_share_of_the_bytes_is_kept_while_it_reads_at_its_share_of_the_pace(model, delivers):
    """Every drive reads a block in U (the test's clock), then the third is late twice (late_limit
    2) while the others read six reads it is given none of, a block each in U. Short of its share
    of the bytes either way; with `delivers`, its first late piece (two blocks) comes in as soon as
    it is judged: two blocks over the 4 U its second late piece kept it busy is half a block per U,
    its share of the others' pace is about one, within the margin (3): kept. Without, it read
    nothing while it had work: taken out, the event giving the others' pace (finite: their busy
    time is counted, not only their bytes)."""
    paths, data = model
    g, clock, U, events = Gates(paths), Clock(), 1000, []
    pol = HedgePolicy(floor_ns=0, late_limit=2, min_busy_ns=0)
    three, six = 3 * BLOCK_BYTES, 6 * BLOCK_BYTES

    def read(off, ln, wait_ns):
        """A read whose pieces block in their drives' kernels: the first two drives' land once the
        clock moved U, then the clock moves on to `wait_ns` and the watchdog looks (the third
        drive's piece stays until the test lets it go)."""
        readers = paths if ln >= three else paths[:2]    # the cut gives the third none of a read under 3 blocks
        for p in readers:
            g.arm(p)
        t = r.submit(off, ln)
        for p in readers:
            g.entered[p].acquire()
        before = [r.stats().sources[i].reads for i in (0, 1)]
        clock.advance(U)
        for p in paths[:2]:
            g.go(p)
        _until(lambda: all(r.stats().sources[i].reads > before[k] for k, i in enumerate((0, 1))))
        clock.advance(wait_ns - U)
        r.wake_hedger()
        return t

    with SplitReader(paths, [1, 1, 1], settings=ReaderSettings(lanes=2, hedge=True, hedge_policy=pol), cold=False,
                     clock=clock, opener=g.reader, report=events.append) as r:
        t = read(0, three, U)                        # warm-up: a block each in U
        g.go(paths[2])
        assert bytes(t.result()) == data[:three]
        # two blocks ahead at a block per U: due at 3 x 2 U + U (a request's typical time)
        t = read(0, six, 7 * U + 1)
        assert bytes(t.result()) == data[:six]       # hedged
        assert r.stats().sources[2].late == 1
        got = r._hedger.drives[2].delivered
        if delivers:
            g.go(paths[2])                           # the late piece comes in (the hedge won)
            _until(lambda: r._hedger.drives[2].delivered == got + 2 * BLOCK_BYTES)
        for k in range(6):                           # the third drive is given none of these
            off = 2 * k * BLOCK_BYTES
            t = read(off, 2 * BLOCK_BYTES, U)
            assert bytes(t.result()) == data[off:off + 2 * BLOCK_BYTES]
        # one block ahead: due at 4 U; with the first still in its kernel, three ahead: 10 U
        t = read(3 * BLOCK_BYTES, three, (4 * U if delivers else 10 * U) + 1)
        assert bytes(t.result()) == data[3 * BLOCK_BYTES:6 * BLOCK_BYTES]
        _looked_again(r)
        s = r.stats()
        g.go(paths[2], 10)
    assert s.sources[2].late == 2 and s.sources[2].degraded is not delivers
    degraded = [e.message for e in events if e.kind == "degraded"]
    if delivers:
        assert degraded == []
    else:
        assert len(degraded) == 1 and "it read at 0.0 MB/s while it had work" in degraded[0]
        pace = degraded[0].split("its weight's share of their pace is ")[1].split(" MB/s")[0]
        assert 0 < float(pace) < math.inf


@pytest.mark.parametrize("cut", [(2, 1), (1, 1), (3, 1)])
def test_a_drive_is_held_to_its_share_of_the_engines_cut_not_to_its_weight(model, cut):
    """Two drives at 1:1 whose engine cuts each read into `cut` blocks (a cut in blocks need not
    follow the weights): each reads its piece in U, so the second delivers at `cut[1] / cut[0]` of
    the first's rate — its share of the cut, not slow. Held to that share, its next piece is late at
    3 x U (its piece at its share's rate) + U (a request's typical time) after it was queued,
    whatever the cut; held to its weight (the first's rate) it was late at 3 U x cut[1] / cut[0] + U:
    2.5 U for (2, 1), 2 U for (3, 1). Times are the test's clock."""
    from engines.base import Piece
    from engines.pattern import Read

    paths, data = model
    paths = paths[:2]
    g, clock, U = Gates(paths), Clock(), 1000
    due = 4                                          # 3 U at its share's rate + U typical, whatever the cut
    a, b = (k * BLOCK_BYTES for k in cut)
    pol = HedgePolicy(floor_ns=0, late_limit=100, min_busy_ns=0)
    with SplitReader(paths, [1, 1], settings=ReaderSettings(lanes=1, hedge=True, hedge_policy=pol), cold=False,
                     clock=clock, opener=g.reader) as r:
        read = Read(r.files[0], 0, a + b, (Piece(0, 0, a, 0), Piece(1, a, b, 0)))
        for _ in range(2):                           # warm-up: each drive reads its piece in U, twice
            for p in paths:
                g.arm(p)
            t = r.submit_read(read)
            for p in paths:
                g.entered[p].acquire()
            clock.advance(U)
            for p in paths:
                g.go(p)
            assert bytes(t.result()) == data[:a + b]
        for p in paths:
            g.arm(p)
        queued = clock()
        t = r.submit_read(read)
        for p in paths:
            g.entered[p].acquire()
        clock.advance(U)
        g.go(paths[0])
        _until(lambda: r.stats().sources[0].reads == 3)
        assert _looked_again(r) == queued + due * U      # the second drive's piece, the only one out
        assert r.stats().sources[1].late == 0
        clock.advance(due * U - U + 1)
        r.wake_hedger()
        _until(lambda: r.stats().sources[1].late == 1)
        g.go(paths[1])
        assert bytes(t.result()) == data[:a + b]


def test_a_move_is_sized_on_all_the_work_of_the_windows_that_confirmed_it():
    """A drive at half speed, two windows off the band: in the second its peers served a burst
    (10x its rate, it looks at a tenth). The move is sized on both windows' bytes over both windows'
    busy time, not on the last window's burst alone: 0.19, nearer its half than a tenth."""
    from engine_bridge.reader.reweighting import judge, pooled_rates

    pol = ReweighPolicy(confirm=2)
    w1 = ([300.0, 300.0, 150.0], [100.0, 100.0, 100.0])        # half speed: 3 / 3 / 1.5 per ns
    w2 = ([1000.0, 1000.0, 100.0], [100.0, 100.0, 100.0])      # the peers' burst: 10 / 10 / 1
    last = {0: 10.0, 1: 10.0, 2: 1.0}
    assert pooled_rates([w1, w2], last) == {0: 6.5, 1: 6.5, 2: 1.25}
    alone = judge((1.0, 1.0, 1.0), (1, 1, 1), last, (0, 0, -1), pol)
    pooled = judge((1.0, 1.0, 1.0), (1, 1, 1), last, (0, 0, -1), pol, size=pooled_rates([w1, w2], last))
    assert alone.mult[2] == pytest.approx(0.1) and pooled.mult[2] == pytest.approx(1.25 / 6.5)
    assert pooled.mult[:2] == (1.0, 1.0) and alone.streak == pooled.streak
    # a window in the band moves nothing, whatever the pooled rates say
    calm = judge((1.0, 1.0, 1.0), (1, 1, 1), {0: 3.0, 1: 3.0, 2: 2.9}, (0, 0, -1), pol, size={0: 9.0, 1: 9.0, 2: 1.0})
    assert calm.mult is None


def test_a_drive_that_relapsed_comes_back_at_its_pace_and_the_windows_start_afresh():
    """`Reweigher.came_back`: the drive's multiplier becomes its pace when taken out (of its weight's
    share of the others' pace) times the one it had, the others keep theirs, the next reads are cut
    with those (a new epoch and window); a pace at or above its share moves nothing."""
    t = [5]
    rw = Reweigher({"prefill": (1, 1, 1), "decode": (2, 1, 1)}, ReweighPolicy(), lambda: t[0])
    assert rw.came_back(1, 1.0, [0, 1, 2]) is None and rw.came_back(1, 1.7, [0, 1, 2]) is None and rw.epoch == 0
    change = rw.came_back(1, 0.1, [0, 1, 2])
    assert change["source"] == 1 and change["new"] == {"prefill": [100, 10, 100], "decode": [100, 5, 50]}
    assert change["old"] == {"prefill": [1, 1, 1], "decode": [2, 1, 1]} and "came back" in change["why"]
    assert rw.epoch == 1 and rw.window.start == 5 and rw.weights("prefill") == (100, 10, 100)
    t[0] = 9
    change = rw.came_back(1, 0.0, [0, 1, 2])          # nothing delivered while it was late: the floor
    w = change["new"]["prefill"]
    assert w[0] == w[2] == 100 and 0.02 * sum(w) <= w[1] < 0.03 * sum(w) and rw.epoch == 2 and rw.window.start == 9
