"""Hedged reads: a stalled drive never holds the barrier; the bytes are the same whoever wins.

The stalled source is a stand-in reader that blocks on an Event the test holds, and the hedger
runs on a clock the test moves (`Clock`), woken with `wake_hedger()`: which piece is late is
decided by the test, never by how fast this machine is. Nothing here asserts on elapsed time.
"""

import gc
import json
import random
import threading
import time

import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from engine_bridge.cli import app
from engine_bridge.reader import build, hedging
from engine_bridge.reader.attempts import Attempt, PieceInFlight, ReadTicket
from engine_bridge.reader.buffers import span
from engine_bridge.reader.hedging import HedgePolicy, RateEstimate
from engine_bridge.reader.reweighting import ReweighPolicy
from engine_bridge.reader.readstats import healthy_split
from engine_bridge.reader.split_reader import SplitReader
from engine_bridge.reader.settings import ReaderSettings
from engines.ds4_argodrive.constants import BLOCK_BYTES
from engines.split import split_read
from core.coldio import CachedReader, aligned_buffer, buffer_footprint
from models.modelset import discover
from tests.engine_bridge.helpers import primary_and_copies
from tests.helpers import impure_imports, write_split_gguf

SIZE = 16 * BLOCK_BYTES
FLOOR = 1_000_000_000          # 1 s of the test's clock: nothing is late until the test says so
SLEEP = 20_000_000             # a floor the watchdog's timer sleeps through in real time (its sleeps are the test
                               # clock's ns as real ones): 20 ms, for a test that lets the timer fire
HELD_S = 300                   # a held read lets itself through after this (the suite's timeout, pyproject.toml):
                               # a test that failed while holding one still closes its reader
POISON = 0xEE
runner = CliRunner()


class Clock:
    """The hedger's clock, ns: it moves only when the test moves it."""

    def __init__(self):
        self.t = 0

    def __call__(self) -> int:
        return self.t

    def advance(self, ns: int) -> None:
        self.t += ns


class Stall:
    """Holds reads of one source: the first `count` reads (None: every read while `active`) block
    until `gate` is set; with `poison`, a held read then writes 0xEE over its buffer (garbage a
    late read must never leave where a caller or a later read can see it)."""

    def __init__(self, path: str, count: int | None = None, poison: bool = False):
        self.path, self.count, self.poison = path, count, poison
        self.active = False                      # armed by the test (after its warm-up read)
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)    # released once per held read, when it blocks
        self.returned = threading.Semaphore(0)   # released once per held read, after it wrote
        self.closed = threading.Event()
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            if not self.active or self.count == 0:
                return False
            if self.count is not None:
                self.count -= 1
            return True


class StallingReader(CachedReader):
    """A source that reads normally unless its Stall holds it."""

    def __init__(self, path, stall: Stall | None):
        super().__init__(path)
        self.stall = stall if stall is not None and stall.path == path else None

    def read_into(self, buffer, offset):
        st = self.stall
        if st is not None and st.take():
            st.entered.release()
            st.gate.wait(HELD_S)
            if st.poison:
                mv = memoryview(buffer).cast("B")
                mv[:] = bytes([POISON]) * len(mv)
                st.returned.release()
                return len(mv)
            n = super().read_into(buffer, offset)
            st.returned.release()
            return n
        return super().read_into(buffer, offset)

    def close(self):
        super().close()
        if self.stall is not None:
            self.stall.closed.set()


@pytest.fixture
def model(tmp_path):
    return primary_and_copies(tmp_path, SIZE, seed=5)


def _reader(paths, stall, clock, events=None, lanes=2, pool_bytes=None, **policy):
    pol = HedgePolicy(**{"floor_ns": FLOOR, "min_busy_ns": 0, **policy})
    return SplitReader(paths, [2, 1, 1], [2, 1, 1], settings=ReaderSettings(lanes=lanes, hedge=True, hedge_policy=pol),
                       cold=False, clock=clock, opener=lambda p: StallingReader(p, stall),
                       report=events.append if events is not None else None, pool_bytes=pool_bytes)


def _warm(r, data, stall):
    """One read before the stall is armed, so every source has a delivery rate to be held to."""
    assert bytes(r.read(0, 4 * BLOCK_BYTES)) == data[:4 * BLOCK_BYTES]
    stall.active = True


def _until(cond) -> None:
    """Wait for something another thread does (an ordering wait, not a time limit)."""
    while not cond():
        time.sleep(0.001)


def _looked_again(r):
    """Wake the watchdog and wait until it has looked once more; when it wakes next (None: only a
    new piece or a wake-up wakes it)."""
    rounds, _ = r._hedger.watch()
    r.wake_hedger()
    _until(lambda: r._hedger.watch()[0] > rounds)
    return r._hedger.watch()[1]


def _hedged_read(r, stall, clock, off, ln, phase="prefill", buffer=None, file=None):
    """Submit a read (of `file`, for a multi-file model) whose piece on the stalled source blocks,
    wait until every other piece has landed, then make the held one late (only it); return the ticket."""
    held = next(i for i, m in enumerate(r.models) if stall.path in m.paths)
    before = [x.reads for x in r.stats().sources]
    healthy = [i for i, d in enumerate(r.degraded) if not d]
    weights = r.decode_weights if phase == "decode" else r.weights
    others = {s for s, _, _ in healthy_split(off, ln, weights, healthy)} - {held}
    t = r.submit(off, ln, phase, buffer, file=file)
    stall.entered.acquire()                 # the stalled source's lane is inside its read
    _until(lambda: all(r.stats().sources[s].reads > before[s] for s in others))
    clock.advance(FLOOR + 1)                # ... and now it, alone, is late
    r.wake_hedger()
    return t


def _settled(r, s: int) -> bool:
    """Whether every main attempt queued or reading on source `s` has ended (a late read that
    returned is over, so close() joins its lane rather than leave it to finish later)."""
    with r._lanes.lock:
        return not r._hedger.pending[s]


def _held_and_queued(r, data, stall):
    """Two reads on a reader whose stalled source has one lane: the first's piece on it is in its
    kernel, the second's queued behind it, and every other piece of both has landed."""
    _warm(r, data, stall)
    before = [x.reads for x in r.stats().sources]
    a = r.submit(0, 4 * BLOCK_BYTES)
    b = r.submit(4 * BLOCK_BYTES, 4 * BLOCK_BYTES)
    stall.entered.acquire()
    _until(lambda: all(r.stats().sources[s].reads >= before[s] + 2 for s in (0, 1)))
    return a, b


def _copied_at_its_barrier(r, data, stall, clock):
    """A read of the first 4 blocks whose piece on the stalled source is late, hedged and won
    elsewhere: its ticket, back with the right bytes in a fresh buffer (the late main attempt is
    still in the stalled source's kernel, writing into the read's old one)."""
    _warm(r, data, stall)
    a = _hedged_read(r, stall, clock, 0, 4 * BLOCK_BYTES)
    assert bytes(a.result()) == data[:4 * BLOCK_BYTES] and a._buf is not a._work
    return a


def test_a_stalled_replica_is_hedged_and_the_read_completes_from_another(model):
    paths, data = model
    stall, clock = Stall(paths[2]), Clock()
    with _reader(paths, stall, clock) as r:
        _warm(r, data, stall)
        before = r.stats()
        t = _hedged_read(r, stall, clock, BLOCK_BYTES, 4 * BLOCK_BYTES)
        assert bytes(t.result()) == data[BLOCK_BYTES:5 * BLOCK_BYTES]        # while the replica still hangs
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late == 1 and s.sources[2].hedged == 0
    assert s.sources[0].hedged + s.sources[1].hedged == 1
    assert s.sources[2].bytes == before.sources[2].bytes       # its piece came from someone else
    assert sum(x.bytes for x in s.sources) == 4 * BLOCK_BYTES + 4 * BLOCK_BYTES
    assert not any(x.degraded for x in s.sources) and s.events == ()
    line = r.format_stats().splitlines()[2]
    assert "hedged=0 late=1" in line and line.startswith("source[2] ")
    assert {"hedged", "late", "slow"} <= set(s.to_dict()["sources"][2])


def test_the_watchdog_does_not_wake_for_the_deadlines_of_pieces_already_delivered(model):
    """Every piece delivered, the watchdog has nothing to wake for: a wake-up at each delivered
    piece's deadline took a few percent of a decode's compute on a 2-core machine."""
    paths, data = model
    with _reader(paths, None, Clock()) as r:
        for k in range(4):
            assert bytes(r.read(k * BLOCK_BYTES, 4 * BLOCK_BYTES)) == data[k * BLOCK_BYTES:(k + 4) * BLOCK_BYTES]
        assert _looked_again(r) is None


def test_untroubled_the_watchdog_sleeps_through_reads_nobody_waits_on(model):
    """No drive in trouble and nobody waiting: reads are queued and land without waking the watchdog
    once (each read used to wake it to set its timer, and the timer woke it again for a piece long
    in: docs/reader.md "Round 33")."""
    paths, data = model
    with _reader(paths, None, Clock()) as r:
        h = r._hedger
        _until(lambda: h.watch()[0] >= 1)           # its first round, when it started
        rounds = h.watchdog_counts()["rounds"]
        tickets = [r.submit(k * BLOCK_BYTES, 4 * BLOCK_BYTES) for k in range(4)]
        _until(lambda: all(t.done() for t in tickets))
        assert h.watchdog_counts()["rounds"] == rounds
        for k, t in enumerate(tickets):
            assert bytes(t.result()) == data[k * BLOCK_BYTES:(k + 4) * BLOCK_BYTES]
        assert h.watchdog_counts()["rounds"] == rounds      # done before the wait: nothing to time


def test_a_callers_wait_wakes_the_watchdog_when_its_read_is_late(model):
    """The watchdog keeps no timer while no drive is in trouble: a caller waiting on a read whose
    piece is past its deadline wakes it (nobody else does here), and the piece is judged late and
    hedged; the read completes while its drive still holds it."""
    paths, data = model
    stall, clock = Stall(paths[2]), Clock()
    with _reader(paths, stall, clock) as r:
        t = _held_out(r, data, stall)
        h = r._hedger
        assert h.watch()[1] is not None and not h._keeps_time()    # a deadline, and no timer of its own for it
        timer = h.watchdog_counts()["timer"]
        clock.advance(FLOOR + 1)                # the held piece is past its deadline
        assert bytes(t.result()) == data[:4 * BLOCK_BYTES]
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late == 1 and s.sources[0].hedged + s.sources[1].hedged == 1
    assert s.watchdog is not None and s.watchdog["timer"] >= timer + 1 and s.watchdog["judged"] >= 1


def test_a_piece_queued_behind_a_hung_one_is_judged_once_that_one_is(model):
    """Only the first piece in each drive's line has its deadline on the watchdog's heap (one
    behind it on the same drive is due later); once that one is judged, the next is, in the same
    round when its deadline has passed too: a drive that hangs has the piece in its kernel and the
    one queued behind it hedged, and both reads complete while it still hangs."""
    paths, data = model
    stall, clock = Stall(paths[2]), Clock()
    with _reader(paths, stall, clock, lanes=1) as r:
        a, b = _held_and_queued(r, data, stall)
        h = r._hedger
        with r._lanes.lock:
            out = sorted(h.pending[2], key=lambda x: x.piece.ticket.seq)
            watched = [e[2] for e in h._heap if e[2] in h.pending[2]]
        assert [x.piece.ticket for x in out] == [a, b] and watched == [out[0]]
        clock.advance(10 * FLOOR)           # both past their deadlines
        r.wake_hedger()
        assert bytes(a.result()) == data[:4 * BLOCK_BYTES]
        assert bytes(b.result()) == data[4 * BLOCK_BYTES:8 * BLOCK_BYTES]
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late == 2 and s.sources[0].hedged + s.sources[1].hedged == 2


def _held_out(r, data, stall):
    """After a warm-up read, a read whose piece on the stalled source is in its kernel, held, and
    every other piece of it landed: its ticket."""
    _warm(r, data, stall)
    before = [x.reads for x in r.stats().sources]
    t = r.submit(0, 4 * BLOCK_BYTES)
    stall.entered.acquire()
    _until(lambda: all(r.stats().sources[s].reads > before[s] for s in (0, 1)))
    return t


def _starved(r, data, stall, clock):
    """A read whose piece on the stalled source is out when the watchdog's timer, set for that
    piece's deadline, fires far later than meant (the test moves its clock past it and never wakes
    the watchdog): the watchdog put the piece off and judged nothing. Returns the read's ticket."""
    t = _held_out(r, data, stall)
    h = r._hedger
    threading.Thread(target=t.result, daemon=True).start()     # a caller waits on it: the watchdog keeps time
    _until(lambda: len(h._waiting) == 1)
    meant = _looked_again(r)                    # it sleeps until the held piece's deadline, on its timer
    assert meant is not None and meant > clock.t
    clock.advance(meant - clock.t + 10 * FLOOR)     # ... and that timer fires far later than meant
    _until(lambda: h._deferred or r.stats().sources[2].late)
    assert h._deferred and r.stats().sources[2].late == 0 and not t.done()
    return t


def test_a_watchdog_woken_late_by_a_starved_machine_puts_its_due_pieces_off_once(model):
    """The watchdog's timed sleep came back long after the deadline it meant to wake at: the
    machine starved it, not only the drives (the lanes that would have delivered the piece were
    starved as well). It judges nothing in that round and looks again a deadline's least slack
    later (`_recheck`); then, on time, it judges: the piece still out is late and hedged. Each
    round here is its own timer's."""
    paths, data = model
    stall, clock = Stall(paths[2]), Clock()
    with _reader(paths, stall, clock, floor_ns=SLEEP) as r:
        t = _starved(r, data, stall, clock)
        h = r._hedger
        put_off = h.watch()[1]
        assert put_off == clock.t + h._recheck()
        counts = h.watchdog_counts()            # the starved round was its timer's and judged nothing
        assert counts["timer"] >= 1 and counts["judged"] == 0
        clock.advance(put_off - clock.t)        # on time at the put-off deadline: judged
        assert bytes(t.result()) == data[:4 * BLOCK_BYTES]
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late == 1 and s.sources[0].hedged + s.sources[1].hedged == 1
    assert s.watchdog is not None and s.watchdog["judged"] >= 1 and s.watchdog["timer"] > counts["timer"]


def test_a_watchdog_starved_again_judges_the_pieces_it_put_off(model):
    """Put off once is all: woken late again by its timer (and whatever rounds it made meanwhile,
    with nothing due), the watchdog judges the pieces it put off — a machine always that loaded
    would otherwise never judge them."""
    paths, data = model
    stall, clock = Stall(paths[2]), Clock()
    with _reader(paths, stall, clock, floor_ns=SLEEP) as r:
        t = _starved(r, data, stall, clock)
        h = r._hedger
        rounds = h.watch()[0]
        r.wake_hedger()                                 # a round rung meanwhile, nothing due: still put off
        _until(lambda: h.watch()[0] > rounds)
        assert h._deferred and r.stats().sources[2].late == 0
        clock.advance(10 * FLOOR)                       # starved again: judged this time (not put off again)
        _until(lambda: r.stats().sources[2].late or h.watch()[1] > clock.t)
        assert r.stats().sources[2].late == 1
        assert bytes(t.result()) == data[:4 * BLOCK_BYTES]
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late == 1 and s.sources[0].hedged + s.sources[1].hedged == 1


def test_a_queued_attempt_whose_piece_was_won_elsewhere_does_not_make_its_read_copied(model):
    """At a read's barrier only the main attempts a lane started may still write into its buffer: a
    hung drive's piece in its kernel makes its read copied to a fresh buffer (the old one kept until
    it returns), but the piece queued behind it, won by its hedge, is skipped and never writes — its
    read keeps its buffer (it used to be copied too, and its buffer held until a lane of the hung
    drive got to the queued attempt)."""
    paths, data = model
    stall, clock = Stall(paths[2], poison=True), Clock()
    with _reader(paths, stall, clock, lanes=1) as r:
        a, b = _held_and_queued(r, data, stall)
        clock.advance(10 * FLOOR)
        r.wake_hedger()
        assert bytes(a.result()) == data[:4 * BLOCK_BYTES]
        assert bytes(b.result()) == data[4 * BLOCK_BYTES:8 * BLOCK_BYTES]
        assert a._buf is not a._work and b._buf is b._work
        stall.gate.set()                    # a's late piece writes its garbage into a's old buffer ...
        stall.returned.acquire()
        _until(lambda: _settled(r, 2))
        assert bytes(a.result()) == data[:4 * BLOCK_BYTES]                # ... never into what a returned
        assert bytes(b.result()) == data[4 * BLOCK_BYTES:8 * BLOCK_BYTES]
        s = r.stats()
    assert s.sources[2].late == 2 and s.sources[0].hedged + s.sources[1].hedged == 2


def test_a_read_copied_at_its_barrier_gives_back_its_old_buffer_but_what_the_late_read_writes(model):
    """A read whose late main attempt may still write into its buffer is copied to a fresh one at
    its barrier, and the old one kept until that attempt returns — seconds, on a crawler. When a
    source's lanes holding such buffers would hold more than the pool keeps idle, what the old one
    held goes back to the OS at once (`coldio.drop_pages`): all it holds after is what the late read
    writes, its own piece (hedging only held ~0.3 GB beyond the drives alone beside a crawler, a 32
    MiB buffer per read the crawler had a piece of; docs/reader.md "Round 29")."""
    paths, data = model
    stall, clock = Stall(paths[2], poison=True), Clock()
    small = 2 * buffer_footprint(span(0, 4 * BLOCK_BYTES)) - 1      # two lanes' old buffers would not fit
    with _reader(paths, stall, clock, pool_bytes=small) as r:
        a = _copied_at_its_barrier(r, data, stall, clock)
        old = a._work
        assert not any(bytes(old))                              # its bytes are gone, its mapping kept
        stall.gate.set()                                        # the late read writes its garbage ...
        stall.returned.acquire()
        _until(lambda: _settled(r, 2))
        (lo, ln), = [(o, n) for s, o, n in healthy_split(0, 4 * BLOCK_BYTES, r.weights, [0, 1, 2]) if s == 2]
        got = bytes(old)                                        # ... into its own piece's pages only
        assert got[lo:lo + ln] == bytes([POISON]) * ln and not any(got[:lo]) and not any(got[lo + ln:])
        assert bytes(a.result()) == data[:4 * BLOCK_BYTES]


def test_a_read_copied_at_its_barrier_keeps_its_old_buffers_memory_when_the_pool_has_room_for_such(model):
    """An old buffer the pool has room for, one per lane, keeps its memory until its late writer
    returns and the pool takes it back: given back at the barrier, its next reuse faulted its
    pages in afresh — on healthy fast drives a huge page zeroed per hedge that won (docs/reader.md
    "Round 30")."""
    paths, data = model
    stall, clock = Stall(paths[2], poison=True), Clock()
    roomy = 2 * buffer_footprint(span(0, 4 * BLOCK_BYTES))
    with _reader(paths, stall, clock, pool_bytes=roomy) as r:
        a = _copied_at_its_barrier(r, data, stall, clock)
        (lo, ln), = [(o, n) for s, o, n in healthy_split(0, 4 * BLOCK_BYTES, r.weights, [0, 1, 2]) if s == 2]
        old = bytes(a._work)
        assert old[:lo] == data[:lo] and old[lo + ln:4 * BLOCK_BYTES] == data[lo + ln:4 * BLOCK_BYTES]
        stall.gate.set()
        stall.returned.acquire()
        _until(lambda: _settled(r, 2))
        assert bytes(a.result()) == data[:4 * BLOCK_BYTES]


def test_a_main_attempt_started_on_a_late_streak_reads_into_a_buffer_of_its_own(model):
    """Once a drive is on a late streak, a main attempt a lane starts on it reads into a buffer of
    its own: when its hedge wins, its read keeps its buffer (no fresh one, no copy of the whole
    read); its bytes go over the read's like a hedge's when it wins itself."""
    paths, data = model
    stall, clock = Stall(paths[2], poison=True), Clock()
    with _reader(paths, stall, clock) as r:
        a = _copied_at_its_barrier(r, data, stall, clock)     # its late main attempt wrote into a's buffer
        assert r._hedger.streak[2] == 1
        c = _hedged_read(r, stall, clock, 8 * BLOCK_BYTES, 4 * BLOCK_BYTES)
        assert bytes(c.result()) == data[8 * BLOCK_BYTES:12 * BLOCK_BYTES]
        assert c._buf is c._work                         # its late main attempt reads into its own
        stall.gate.set()                                 # both late reads write their garbage ...
        stall.returned.acquire()
        stall.returned.acquire()
        _until(lambda: _settled(r, 2))
        assert bytes(c.result()) == data[8 * BLOCK_BYTES:12 * BLOCK_BYTES]      # ... never into c's
        c.release()
        a.release()
        stall.active = False
        with r._lanes.lock:
            r._hedger.streak[2] = 1                      # on a streak still, its next piece on time:
        asked, get = [], r._pool.get
        r._pool.get = lambda n: (asked.append(n), get(n))[1]
        before = r.stats().sources[2].bytes
        d = r.read(4 * BLOCK_BYTES, 4 * BLOCK_BYTES)     # read into its own buffer, laid over d's
        assert bytes(d) == data[4 * BLOCK_BYTES:8 * BLOCK_BYTES]
        s = r.stats()
    mine = [p for p in healthy_split(4 * BLOCK_BYTES, 4 * BLOCK_BYTES, r.weights, [0, 1, 2]) if p[0] == 2]
    assert s.sources[2].bytes - before == mine[0][2]     # it won its piece ...
    assert asked == [span(4 * BLOCK_BYTES, 4 * BLOCK_BYTES), span(mine[0][1], mine[0][2])]   # ... in its own buffer
    assert s.sources[2].late == 2


def _read_of(o) -> int | None:
    """The `seq` of the read a ticket, piece or attempt belongs to (None: anything else)."""
    if isinstance(o, Attempt):
        o = o.piece
    if isinstance(o, PieceInFlight):
        o = o.ticket
    return o.seq if isinstance(o, ReadTicket) else None


def test_a_finished_read_is_freed_with_its_last_reference_not_left_to_the_garbage_collector(model):
    """With hedging a read keeps its main attempts (a step's lateness looks at them) and they point
    back at it; past its barrier it lets them go, so a finished read is no reference cycle the
    collector has to find (a full collection mid-decode walked all of the engine's objects:
    docs/reader.md "Round 8")."""
    paths, data = model
    with _reader(paths, None, Clock()) as r:
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        mine = set()                                # its reads (another test's reader may be collected meanwhile)
        try:
            for k in range(4):
                t = r.submit(k * BLOCK_BYTES, 4 * BLOCK_BYTES)
                mine.add(t.seq)
                assert bytes(t.result()) == data[k * BLOCK_BYTES:(k + 4) * BLOCK_BYTES]
                t.release()
            del t
            assert _looked_again(r) is None         # the watchdog let go of the delivered pieces' deadlines
            gc.collect()
            cyclic = [type(o).__name__ for o in gc.garbage if _read_of(o) in mine]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert cyclic == []


def test_a_stalled_part_of_a_split_set_is_hedged_and_read_from_another_replica(tmp_path):
    """A source is the whole model: the stalled drive holds one part of a split GGUF set, and the
    hedge re-reads that part's piece from the same part on another replica."""
    parts = write_split_gguf(tmp_path / "internal", "moe", 2, tensors_per_part=1, tensor_bytes=SIZE, seed=6)
    model = discover(str(parts[0]))
    models = [model]
    for name in ("green", "white"):
        (tmp_path / name).mkdir()
        for rel in model.files:
            (tmp_path / name / rel).write_bytes((tmp_path / "internal" / rel).read_bytes())
        models.append(model.in_dir(str(tmp_path / name)))
    first, second = model.files
    data = {rel: (tmp_path / "internal" / rel).read_bytes() for rel in model.files}
    stall, clock = Stall(models[2].abs(second)), Clock()
    with _reader(models, stall, clock) as r:
        assert bytes(r.read(0, 4 * BLOCK_BYTES, file=second)) == data[second][:4 * BLOCK_BYTES]     # every source has a rate
        stall.active = True
        before = r.stats()
        t = _hedged_read(r, stall, clock, BLOCK_BYTES, 4 * BLOCK_BYTES, file=second)
        assert bytes(t.result()) == data[second][BLOCK_BYTES:5 * BLOCK_BYTES]          # while white's part 2 still hangs
        s = r.stats()
        stall.gate.set()
        assert bytes(r.read(100, 4 * BLOCK_BYTES, file=first)) == data[first][100:100 + 4 * BLOCK_BYTES]
    assert s.sources[2].late == 1 and s.sources[0].hedged + s.sources[1].hedged == 1
    assert s.sources[2].bytes == before.sources[2].bytes
    assert not any(x.degraded for x in s.sources) and s.events == ()


def test_a_late_read_never_writes_into_a_buffer_the_caller_or_a_later_read_holds(model):
    paths, data = model
    stall, clock = Stall(paths[2], count=1, poison=True), Clock()
    with _reader(paths, stall, clock) as r:
        _warm(r, data, stall)
        # a pool buffer: the hedge wins, the buffer is released and reused by the next read
        a = _hedged_read(r, stall, clock, 0, 4 * BLOCK_BYTES)
        view_a = bytes(a.result())
        a.release()
        b = r.submit(8 * BLOCK_BYTES, 4 * BLOCK_BYTES)              # same size class as a's buffer
        assert bytes(b.result()) == data[8 * BLOCK_BYTES:12 * BLOCK_BYTES]
        # a caller's buffer: once the read is done the caller reuses it for something else
        mine = aligned_buffer(span(4 * BLOCK_BYTES + 100, 4 * BLOCK_BYTES))
        with stall.lock:
            stall.count = 1                             # hold the next read on that source too
        c = _hedged_read(r, stall, clock, 4 * BLOCK_BYTES + 100, 4 * BLOCK_BYTES, buffer=mine)
        assert bytes(c.result()) == data[4 * BLOCK_BYTES + 100:8 * BLOCK_BYTES + 100]
        memoryview(mine)[:] = b"\x11" * len(mine)
        stall.gate.set()                                # both late reads now write their garbage ...
        stall.returned.acquire()
        stall.returned.acquire()
        assert bytes(b.result()) == data[8 * BLOCK_BYTES:12 * BLOCK_BYTES]      # ... never into b's buffer
        assert bytes(mine) == b"\x11" * len(mine)                   # nor into the caller's
        assert view_a == data[:4 * BLOCK_BYTES]
        d = r.read(0, 4 * BLOCK_BYTES)                        # the late buffer is back in use only now
        assert bytes(d) == data[:4 * BLOCK_BYTES]
        assert r.stats().sources[2].late == 2


def test_repeated_lateness_degrades_and_probes_bring_it_back(model):
    paths, data = model
    stall, clock, events = Stall(paths[2]), Clock(), []
    gone, back = threading.Event(), threading.Event()

    def report(ev):
        events.append(ev)
        if ev.kind == "degraded":
            gone.set()
        elif ev.kind == "recovered":
            back.set()

    pol = HedgePolicy(floor_ns=FLOOR, late_limit=2, probe_interval_ns=0, recover_probes=1, min_busy_ns=0)
    with SplitReader(paths, [2, 1, 1], settings=ReaderSettings(lanes=2, hedge=True, hedge_policy=pol), cold=False,
                     clock=clock, opener=lambda p: StallingReader(p, stall), report=report) as r:
        _warm(r, data, stall)
        for off in (0, 4 * BLOCK_BYTES):
            t = _hedged_read(r, stall, clock, off, 4 * BLOCK_BYTES)
            assert bytes(t.result()) == data[off:off + 4 * BLOCK_BYTES]
        gone.wait()
        assert r.degraded == (False, False, True)
        before = r.stats()
        held = before.sources[2].bytes
        # degraded: the split runs over the healthy two (2:1), and the slow one gets a probe
        v = r.read(8 * BLOCK_BYTES, 4 * BLOCK_BYTES)
        assert bytes(v) == data[8 * BLOCK_BYTES:12 * BLOCK_BYTES]
        s = r.stats()
        assert s.sources[2].bytes == held and s.sources[2].slow
        assert [x.bytes - y.bytes for x, y in zip(s.sources[:2], before.sources)] == [
            p.length for p in split_read(8 * BLOCK_BYTES, 4 * BLOCK_BYTES, (2, 1))]
        assert "DEGRADED(late)" in r.format_stats().splitlines()[2]
        # the drive recovers: its held reads and the probe come back, the probe on time
        stall.active = False
        stall.gate.set()
        back.wait()
        assert r.degraded == (False, False, False)
        assert bytes(r.read(0, 4 * BLOCK_BYTES)) == data[:4 * BLOCK_BYTES]
        s = r.stats()
    assert s.sources[2].bytes > held and not s.sources[2].slow
    kinds = [e.kind for e in events]
    assert kinds == ["degraded", "recovered"]
    assert "2 pieces late in a row" in events[0].message and "probing" in events[0].message
    assert s.sources[2].late == 2


@pytest.mark.parametrize("kept_up", [False, True])
def test_a_drive_taken_out_again_soon_after_it_came_back_comes_back_at_its_pace(model, kept_up):
    """A drive degraded, restored by its probes, and degraded again before it kept up for long
    (a throttle that banks credit while the drive idles passes its probes) comes back the second
    time at the pace it showed when taken out, through re-weighting, not at its whole weight; the
    first time it comes back whole, and so does a drive that kept up for as many pieces as its
    rate estimate remembers before it was taken out again."""
    paths, data = model
    stall, clock, events = Stall(paths[2]), Clock(), []
    gone, back = threading.Semaphore(0), threading.Semaphore(0)

    def report(ev):
        events.append(ev)
        {"degraded": gone.release, "recovered": back.release}.get(ev.kind, lambda: None)()

    pol = HedgePolicy(floor_ns=FLOOR, late_limit=2, probe_interval_ns=0, recover_probes=1, min_busy_ns=0)
    st = ReaderSettings(lanes=2, hedge=True, hedge_policy=pol, reweigh=True,
                        reweigh_policy=ReweighPolicy(window_ns=10 ** 15))    # no window is ever judged here
    with SplitReader(paths, [2, 1, 1], settings=st, cold=False, clock=clock,
                     opener=lambda p: StallingReader(p, stall), report=report) as r:
        _warm(r, data, stall)
        for time_out in (1, 2):     # out, and back; then out again, and back
            for off in (0, 4 * BLOCK_BYTES):
                t = _hedged_read(r, stall, clock, off, 4 * BLOCK_BYTES)
                assert bytes(t.result()) == data[off:off + 4 * BLOCK_BYTES]
            gone.acquire()
            assert r.degraded == (False, False, True)
            v = r.read(8 * BLOCK_BYTES, 4 * BLOCK_BYTES)         # its probe is held with it ...
            assert bytes(v) == data[8 * BLOCK_BYTES:12 * BLOCK_BYTES]
            stall.active = False                                 # ... until the drive is let go: on time
            stall.gate.set()
            back.acquire()
            assert r.degraded == (False, False, False)
            if time_out == 1:
                assert r.weights_now("prefill") == (2, 1, 1)     # the first time, back whole
                for _ in range(r._hedger.memory if kept_up else 0):
                    assert bytes(r.read(0, 4 * BLOCK_BYTES)) == data[:4 * BLOCK_BYTES]
                # the probe may pass on one lane while the other still returns a held read of the
                # first time out: let it end before the stall is armed again, or its bytes land in
                # the second streak's span (the drive then delivered its share: never taken out)
                _until(lambda: r._hedger.drives[2].outstanding == 0)
                stall.gate = threading.Event()
                stall.active = True
        assert bytes(r.read(0, 4 * BLOCK_BYTES)) == data[:4 * BLOCK_BYTES]
    w = r.weights_now("prefill")
    kinds = [e.kind for e in events]
    if kept_up:
        assert kinds == ["degraded", "recovered", "degraded", "recovered"] and w == (2, 1, 1)
    else:
        assert kinds == ["degraded", "recovered", "degraded", "recovered", "reweighted"]
        assert w[0] == 2 * w[1] and w[2] < 0.05 * sum(w)         # it read nothing while held: the floor
        assert "came back after it was taken out again" in events[-1].message


def test_no_hedge_keeps_waiting_for_the_slow_drive(model):
    paths, data = model
    stall, clock = Stall(paths[2], count=1), Clock()
    with SplitReader(paths, [2, 1, 1], cold=False, clock=clock,
                     opener=lambda p: StallingReader(p, stall), settings=ReaderSettings(lanes=2, hedge=False)) as r:
        stall.active = True
        t = r.submit(0, 4 * BLOCK_BYTES)
        stall.entered.acquire()
        clock.advance(100 * FLOOR)
        r.wake_hedger()
        assert not t.done()             # the barrier waits for the held piece, as the engine does
        stall.gate.set()
        assert bytes(t.result()) == data[:4 * BLOCK_BYTES]
        s = r.stats()
    assert [x.bytes for x in s.sources] == [p.length for p in split_read(0, 4 * BLOCK_BYTES, (2, 1, 1))]
    assert all(x.late == 0 and x.hedged == 0 for x in s.sources)
    assert "hedged=0 late=0" in r.format_stats()


def test_close_does_not_wait_for_a_hung_drive(model):
    paths, data = model
    stall, clock = Stall(paths[2], count=1), Clock()
    r = _reader(paths, stall, clock)
    _warm(r, data, stall)
    t = _hedged_read(r, stall, clock, 0, 4 * BLOCK_BYTES)
    assert bytes(t.result()) == data[:4 * BLOCK_BYTES]
    r.close()                           # the hung read is still in the kernel: close returns anyway
    assert not stall.closed.is_set()    # ... leaving that source's reader open under its lane
    stall.gate.set()
    stall.closed.wait()                 # its last lane closes it once the read returns


@pytest.mark.parametrize("caller_buffers", [False, True])
def test_many_hedges_whoever_wins_the_bytes_are_the_same(model, caller_buffers):
    """Floor 0 and margin 1 on the real clock: pieces are hedged all the time, at random. Whatever
    wins, every read returns exactly the file's bytes, and each piece is counted once."""
    paths, data = model
    rng = random.Random(11 + caller_buffers)
    pol = HedgePolicy(margin=1.0, floor_ns=0, late_limit=3, probe_interval_ns=0, recover_probes=1, min_busy_ns=0)
    total = reads = 0
    with SplitReader(paths, [2, 1, 1], [10, 6, 6], cold=False,
                     settings=ReaderSettings(lanes=2, hedge=True, hedge_policy=pol)) as r:
        for _ in range(30):
            ranges = [(o, rng.randrange(0, SIZE - o + 1)) for o in (rng.randrange(SIZE) for _ in range(6))]
            bufs = [aligned_buffer(span(o, n)) if caller_buffers else None for o, n in ranges]
            tickets = [r.submit(o, n, rng.choice(("prefill", "decode")), b) for (o, n), b in zip(ranges, bufs)]
            for (o, n), t in zip(ranges, tickets):
                assert bytes(t.result()) == data[o:o + n]
                t.release()
            total += sum(n for _, n in ranges)
            reads += sum(1 for _, n in ranges if n)
        s = r.stats()
    assert sum(x.bytes for x in s.sources) == total == s.bytes
    assert s.reads == reads


def test_bad_hedge_policy_is_one_usage_error(model):
    paths, _ = model
    with pytest.raises(UsageError, match="split reader: hedge margin 0.5: must be a finite number >= 1"):
        SplitReader(paths, [1, 1, 1], settings=ReaderSettings(hedge=True, hedge_policy=HedgePolicy(margin=0.5)))
    with pytest.raises(UsageError, match="late_limit"):
        SplitReader(paths, [1, 1, 1], settings=ReaderSettings(hedge=True, hedge_policy=HedgePolicy(late_limit=0)))


def test_a_burst_is_not_a_pace_until_it_rests_on_enough_busy_time():
    """A throttled drive serves its first pieces at once: those deliveries, in no busy time, hold no
    drive to a rate (the cause of the false degrades of healthy drives), until the estimate rests on
    `min_busy_ns` of busy time."""
    est = RateEstimate(decay=0.97)
    est.observe(4 * BLOCK_BYTES, 0)                      # a burst: delivered in no measurable time
    assert est.rate() == float("inf") and est.rate(min_busy_ns=500) is None
    est.observe(BLOCK_BYTES, 400)
    assert est.rate(min_busy_ns=500) is None and est.total_busy_ns == 400
    est.observe(BLOCK_BYTES, 200)
    assert est.rate(min_busy_ns=500) == pytest.approx(est.bytes / est.busy_ns)


@pytest.mark.parametrize("min_busy_ns, held", [(0, float("inf")), (FLOOR, None)])
def test_peers_burst_holds_the_primary_only_without_the_busy_time_rule(model, min_busy_ns, held):
    """Every piece of the first read lands while the test's clock stands still (a burst). With the
    rule off the primary is held to an unbounded rate through the weights: any piece on it would be
    late after the floor; with it, nothing is known yet and nothing is judged."""
    paths, data = model
    with _reader(paths, None, Clock(), min_busy_ns=min_busy_ns) as r:
        assert bytes(r.read(0, 8 * BLOCK_BYTES)) == data[:8 * BLOCK_BYTES]
        with r._lanes.lock:
            rate, own = r._hedger._rate(0, "prefill", [0, 1, 2]), list(r._hedger.own)
    assert own == [held] * 3 and rate == held


def test_a_deadline_takes_up_a_rate_once_it_moved_beyond_the_tolerance(model):
    """Every on-time delivery moves a drive's estimate a little: the held rates are worked out again
    only once a source's own rate moved by more than `RATE_TOLERANCE` of the one in use (or became
    known, unknown or unbounded); within it, deadlines keep the rates they had."""
    tol = hedging.RATE_TOLERANCE
    assert hedging.rate_moved(None, 5.0) and hedging.rate_moved(5.0, None) and not hedging.rate_moved(None, None)
    assert hedging.rate_moved(5.0, float("inf")) and hedging.rate_moved(float("inf"), 5.0)
    assert not hedging.rate_moved(float("inf"), float("inf"))
    assert not hedging.rate_moved(100.0, 100.0 * (1 + tol * 0.99)) and not hedging.rate_moved(100.0, 100.0 * (1 - tol * 0.99))
    assert hedging.rate_moved(100.0, 100.0 * (1 + tol * 1.01)) and hedging.rate_moved(100.0, 100.0 * (1 - tol * 1.01))
    assert hedging.rate_moved(0.0, 1e-9) and not hedging.rate_moved(0.0, 0.0)
    paths, _ = model
    with _reader(paths, None, Clock()) as r:
        h = r._hedger
        with r._lanes.lock:
            for s in range(3):
                h.est[s] = RateEstimate(0.97)
                h.est[s].observe(1000, 10)          # 100 B/ns each
                h._learnt(s)
            held = h._rate(2, "decode", [0, 1, 2])
            assert h.own == [100.0] * 3 and held == 100.0    # a weight of 1 beside peers of 2 and 1: its own
            h.est[0].observe(115, 1)                # source 0 faster by under the tolerance: nothing moves
            h._learnt(0)
            assert 100.0 < h.est[0].rate() < 100.0 * (1 + tol) and h.own[0] == 100.0
            assert h._rate(2, "decode", [0, 1, 2]) == held
            h.est[0].observe(2000, 0)               # beyond it: taken up, and the rates held to worked out again
            h._learnt(0)
            assert h.own[0] == h.est[0].rate() > 100.0 * (1 + tol)
            assert h._rate(2, "decode", [0, 1, 2]) == hedging.held_rate(2, h.own, h._shares(2, "decode", [0, 1, 2]),
                                                                       [0, 1, 2]) > held
            h.est[1] = RateEstimate(0.97)           # begun afresh (a drive restored): unknown at once
            h._learnt(1)
            assert h.own[1] is None


def test_hedging_arithmetic_is_pure_and_right():
    assert impure_imports(hedging) == []
    est = RateEstimate(decay=0.5)
    assert est.rate() is None
    est.observe(1000, 10)
    assert est.rate() == 100.0
    est.observe(1000, 0)
    assert est.rate() == (500 + 1000) / 5
    free = RateEstimate()
    free.observe(10, 0)
    assert free.rate() == float("inf")
    # the weights promise: 2:1:1, peers 0 and 1 deliver 30 and 15 -> source 2 is held to 15
    assert hedging.plan_rate(2, (2, 1, 1), (30.0, 15.0, 1.0), (0, 1, 2)) == 15.0     # its own rate is not a peer's
    assert hedging.plan_rate(2, (2, 1, 1), (30.0, None, 1.0), (0, 1, 2)) == 15.0     # nor is an unknown one
    assert hedging.plan_rate(2, (2, 1, 1), (None, None, 1.0), (0, 1, 2)) is None     # no peer known
    assert hedging.plan_rate(2, (2, 1, 1), (30.0, 15.0, 1.0), (2,)) is None          # no peer healthy
    # held to the faster of its own rate and its share's promise (unknown rates left out)
    assert hedging.held_rate(2, (30.0, 15.0, 1.0), (2, 1, 1), (0, 1, 2)) == 15.0
    assert hedging.held_rate(2, (30.0, 15.0, 40.0), (2, 1, 1), (0, 1, 2)) == 40.0
    assert hedging.held_rate(2, (30.0, None, 1.0), (2, 1, 1), (0, 1, 2)) == 15.0
    assert hedging.held_rate(2, (30.0, 15.0, None), (2, 1, 1), (0, 2)) == 15.0      # only healthy peers count
    assert hedging.held_rate(2, (None, None, 1.0), (2, 1, 1), (0, 1, 2)) == 1.0
    assert hedging.held_rate(2, (None, None, None), (2, 1, 1), (0, 1, 2)) is None
    assert hedging.held_rate(2, (float("inf"), 15.0, 1.0), (2, 1, 1), (0, 1, 2)) == float("inf")
    p = HedgePolicy(margin=3.0, floor_ns=50)
    assert hedging.deadline_ns(1000, 300, 15.0, p.floor_ns, p.margin) == 1000 + 50 + 60
    assert hedging.deadline_ns(1000, 300, None, p.floor_ns, p.margin) is None
    assert hedging.deadline_ns(1000, 300, float("inf"), p.floor_ns, p.margin) == 1050
    # the healthiest other: the one to finish first (queued bytes plus the piece over its rate)
    assert hedging.pick_hedge_source(2, [0, 1], [50, 0], 10, {0: 10.0, 1: 1.0}, (2, 1, 1)) == 0
    assert hedging.pick_hedge_source(2, [0, 1], [1000, 0], 10, {0: 10.0, 1: 1.0}, (2, 1, 1)) == 1
    assert hedging.pick_hedge_source(2, [0, 1], [0, 0], 10, {0: None, 1: None}, (1, 2, 1)) == 1
    assert hedging.pick_hedge_source(2, [2], [0, 0, 0], 10, {}, (1, 1, 1)) is None
    # late again and again is degraded only when it also delivers too little: bursty is not slow
    assert hedging.too_slow(1.0, 15.0, 3.0) and not hedging.too_slow(10.0, 15.0, 3.0)
    assert hedging.too_slow(None, 15.0, 3.0) and not hedging.too_slow(1.0, None, 3.0)
    assert hedging.too_slow(5.0, float("inf"), 3.0)
    for bad in (dict(margin=0.5), dict(floor_ns=-1), dict(late_limit=0), dict(recover_probes=0), dict(decay=1.0)):
        with pytest.raises(ValueError):
            hedging.check_policy(HedgePolicy(**bad))
    assert set(HedgePolicy().to_dict()) == {"margin", "floor_ms", "late_limit", "probe_interval_ms", "recover_probes",
                                            "min_busy_ms"}


def test_run_output_is_the_same_with_hedging_on_and_off(model_dir):
    d = model_dir
    base = ["run", "--model", str(d / "model.gguf"), "--replica", f"{d / 'r1.gguf'}*5", "--replica",
            f"{d / 'r2.gguf'}*5", "--prompt-tokens", "12", "--gen-tokens", "3", "--cache-experts", "4", "--lanes", "2",
            "--json"]
    on = runner.invoke(app, base + ["--hedge"])
    off = runner.invoke(app, base + ["--no-hedge"])
    default = runner.invoke(app, base)
    assert on.exit_code == 0 and off.exit_code == 0 and default.exit_code == 0, on.output + off.output
    j_on, j_off, j_def = (json.loads(x.stdout) for x in (on, off, default))
    assert j_on["output_sha256"] == j_off["output_sha256"] == j_def["output_sha256"]
    assert j_on["hedge"] is True and j_def["hedge"] is True and j_off["hedge"] is False
    assert j_on["hedge_policy"]["late_limit"] == HedgePolicy().late_limit and j_off["hedge_policy"] is None
    for s in j_on["sources"] + j_off["sources"]:
        assert {"hedged", "late"} <= set(s)
    assert all(s["hedged"] == 0 and s["late"] == 0 for s in j_off["sources"])
    assert "hedged=" in j_on["reader"]["text"] and " late=" in j_on["reader"]["text"]
    wd = j_on["reader"]["watchdog"]
    assert j_off["reader"]["watchdog"] is None and wd["rounds"] >= 1 and wd["rounds"] >= wd["timer"] >= 0
    assert wd["rounds"] >= wd["judged"] >= 0
    # which copy of the reader ran, as the reader says it: two installs' runs can be told apart
    assert j_on["reader"]["build"] == j_off["reader"]["build"] == build.HOW
