"""Balancing: pieces are queued as chunks, a drive keeps a short kernel queue, and an idle drive
takes queued chunks of a slower one; the bytes are the same whoever reads them.

The slow source is a stand-in reader that blocks on an Event the test holds (`Stall`, shared with
the hedging tests): which drive is slow is decided by the test. The test waits for what the lanes
do (ordering waits, never a time limit) and asserts only on what was read where.
"""

import math
import random
import threading
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from core.constants import MiB
from core.errors import UsageError
from engine_bridge.cli import app
from engine_bridge.harness.arms import ArmSpec, plan_changes
from engine_bridge.harness.runner import engine_command
from engine_bridge.reader.attempts import MAIN, Attempt, LaneQueue, PieceInFlight, ReadTicket
from engine_bridge.reader.balancer import Balancer
from engine_bridge.reader.balancing import (COST_SHARE, MIN_REQUESTS, OVERGIVEN, BalancePolicy, Pace, batch_depth,
                                            check_balance, chunk_for, chunks, depth_limit, pick_victim, piece_chunk)
from engine_bridge.reader.split_reader import SplitReader
from engine_bridge.reader.settings import ReaderSettings
from engines.ds4_argodrive.constants import BLOCK_BYTES
from engines.base import Piece
from engines.pattern import Read
from models.modelset import discover
from tests.engine_bridge.helpers import primary_and_copies
from tests.helpers import write_split_gguf
from engine_bridge.reader.hedging import HedgePolicy
from tests.engine_bridge.test_reader_hedge import FLOOR, Clock, Stall, StallingReader, _until

SIZE = 16 * BLOCK_BYTES
CHUNK = BLOCK_BYTES // 4
runner = CliRunner()


@pytest.fixture
def model(tmp_path):
    return primary_and_copies(tmp_path, SIZE, seed=23)


def _reader(paths, stall, **kw):
    knobs = {k: kw.pop(k) for k in ("lanes", "hedge", "hedge_policy") if k in kw}
    settings = ReaderSettings(**{"lanes": 1, **knobs}, balance=True,
                              balance_policy=BalancePolicy(chunk_bytes=CHUNK, chunk_max=CHUNK, depth_ns=0))
    return SplitReader(paths, [2, 1, 1], [2, 1, 1], cold=False, settings=settings,
                       opener=lambda p: StallingReader(p, stall), **kw)


def test_chunks_are_cut_at_multiples_of_the_chunk_and_cover_the_piece():
    assert chunks(0, 10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert chunks(3, 10, 4) == [(3, 5), (8, 5)]                  # edges under half a chunk stay with their neighbour
    assert chunks(1, 13, 4) == [(1, 3), (4, 4), (8, 4), (12, 2)]
    assert chunks(8, 4, 4) == [(8, 4)]
    assert chunks(3, 4, 4) == [(3, 4)]                           # no longer than a chunk: one read, across a multiple
    assert chunks(5, 0, 4) == []
    rng = random.Random(3)
    for _ in range(200):
        off, ln, c = rng.randrange(1 << 20), rng.randrange(1, 1 << 20), 4096 * rng.randrange(1, 64)
        got = chunks(off, ln, c)
        assert got[0][0] == off and sum(n for _, n in got) == ln
        assert all(a + n == b for (a, n), (b, _) in zip(got, got[1:]))
        assert all(o % c == 0 for o, _ in got[1:]) and all(0 < n <= c + c // 2 for _, n in got)
        assert len(got) == 1 if ln <= c else sum(n < c // 2 for _, n in got) <= 1     # a short edge when it could not ride


def test_the_kernel_queue_is_a_share_of_the_drives_pace_and_at_least_two_requests():
    p = BalancePolicy(chunk_bytes=1 << 20, depth_ns=250_000_000)
    depth = p.depth_ns
    assert depth_limit(None, depth) == math.inf                  # pace unknown: the lanes bound it
    assert depth_limit(0.03, depth) == pytest.approx(7.5e6)      # 30 MB/s: a quarter second of it
    assert depth_limit(0.001, depth) == pytest.approx(2.5e5)     # a crawl: a quarter second of its pace,
    assert depth_limit(0.0, depth) == 0                          # or nothing; but two requests are always let in
    pace = Pace(0.9)                                             # (one queued behind the one being read)
    pace.started(1 << 20, 0)
    assert pace.slow_start(1 << 20) is True
    pace.started(1 << 20, 0)
    assert pace.slow_start(4096) is False


def test_a_drive_cut_more_than_its_pace_says_keeps_only_its_paces_share_of_what_is_outstanding_in_its_kernel():
    """`batch_depth`: three drives, 150, 75 and 150 MB/s, a decode group of 16.7 MB cut 1:1:1 (the
    half-speed drive's weight says twice its speed): that drive may hold its pace's share, 3.3 MB,
    where the depth in the fastest drive's chunks lets in 4 MiB; drives cut what their pace says,
    or within OVERGIVEN of it (equal drives' paces differ), keep the depth's; in units of the drives."""
    fast, half, group = 0.15, 0.075, 16_700_000
    together = fast + half + fast
    assert batch_depth(half, together, group // 3, group) == pytest.approx(half / together * group)   # 3.34 MB
    assert batch_depth(fast, together, group // 3, group) == math.inf            # a fast drive given its share or less
    assert batch_depth(fast, 3 * fast, group // 3, group) == math.inf            # equal drives, cut equally
    assert batch_depth(fast, 3.4 * fast, group // 3, group) == math.inf          # the others 1.2 times its pace
    share = 0.1 * group                                                           # given just past OVERGIVEN times
    assert batch_depth(0.1, 1.0, int(OVERGIVEN * share) + 1, group) == pytest.approx(share)
    assert batch_depth(0.1, 1.0, int(OVERGIVEN * share), group) == math.inf
    assert batch_depth(half * 100, together * 100, group // 3, group) == pytest.approx(half / together * group)   # x100
    assert batch_depth(None, together, group, group) == math.inf                 # pace unknown
    assert batch_depth(half, together, 0, 0) == math.inf                         # nothing outstanding
    assert batch_depth(math.inf, math.inf, group, group) == math.inf


def test_the_balancer_bounds_an_overgiven_drive_by_what_is_outstanding_and_counts_it_back_to_nothing():
    """`Balancer._depth`: the depth in the fastest drive's chunks, or less for a drive cut more than
    its pace says (`cut`, `landed`); not with the policy's own `depth_ns`."""
    now = [0]
    for depth_ns in (0, 50_000_000):
        bal = Balancer(3, 8, BalancePolicy(chunk_bytes=MiB, depth_ns=depth_ns), None,
                       SimpleNamespace(in_split=[0, 1, 2]), lambda: now[0])
        att = Attempt(None, 0, MAIN, 0, MiB, None, 0)
        for s, ns in ((0, 7_000_000), (1, 14_000_000), (2, 7_000_000)):     # 150, 75, 150 MB/s
            bal.pace[s].started(MiB, now[0])
            now[0] += ns
            bal.ended(att, s, True, None)
        base = bal._depth(1)
        group = [1_114_112] * 15                                          # five 3.3 MB reads cut 1:1:1
        for k, ln in enumerate(group):
            bal.cut(k % 3, ln)
        assert bal.outstanding == sum(group) and [p.given for p in bal.pace] == [5 * 1_114_112] * 3
        rates = [bal.rate(s) for s in range(3)]
        if depth_ns:
            assert bal._depth(1) == base == pytest.approx(rates[1] * depth_ns)
        else:
            assert base == pytest.approx(rates[1] / max(rates) * 8 * MiB)             # 4 MiB at half the fastest
            assert bal._depth(1) == pytest.approx(rates[1] / sum(rates) * sum(group)) and bal._depth(1) < base
            assert bal._depth(0) == base * 2 and bal._depth(2) == base * 2            # cut what their pace says
        for k, ln in enumerate(group):
            bal.landed(k % 3, ln)
        assert bal.outstanding == 0 and [p.given for p in bal.pace] == [0, 0, 0]
        assert bal._depth(1) == pytest.approx(base)


def test_an_idle_drive_takes_work_only_when_it_would_finish_it_first():
    n = 1 << 20
    fast, slow = 0.03, 0.0075            # bytes per ns: 30 and 7.5 MB/s
    # the slow drive has a chunk in the kernel: the idle fast one takes its next
    assert pick_victim(0, {1: n}, [0, n, 0], {0: fast, 1: slow}) == 1
    # a crawling drive never takes the fast one's work (it would be the barrier)
    assert pick_victim(1, {0: n}, [n, 0, 0], {0: fast, 1: 1e-6}) is None
    # equal pace: take from the one with more in the kernel; never from one with less
    assert pick_victim(0, {1: n}, [0, 2 * n, 0], {0: fast, 1: fast}) == 1
    assert pick_victim(0, {1: n}, [3 * n, 0, 0], {0: fast, 1: fast}) is None
    # a drive that delivered nothing while busy (pace 0) is always worth taking from
    assert pick_victim(2, {1: n}, [0, n, 0], {1: 0.0, 2: 1e-3}) == 1
    # a thief whose pace is not known yet still takes from a drive that delivers nothing
    assert pick_victim(2, {0: n}, [n, 0, 0], {0: 0.0, 2: None}) == 0
    # pace unknown on either side: compared on the bytes ahead
    assert pick_victim(0, {1: n}, [0, n, 0], {0: None, 1: None}) == 1
    assert pick_victim(0, {1: n}, [0, n, 0], {0: fast, 1: None}) == 1
    # the victim it gains most on
    assert pick_victim(0, {1: n, 2: n}, [0, n, n], {0: fast, 1: slow, 2: fast / 2}) == 1


def _queued_chunk(seq: int, done: bool = False) -> Attempt:
    """A main attempt of one MiB queued on source 1, of a read submitted `seq`-th."""
    ticket = ReadTicket(0, MiB, "prefill", None, 0, 1)
    ticket.seq = seq
    piece = PieceInFlight(ticket, 1, 0, MiB)
    piece.done = done
    return Attempt(piece, 1, MAIN, 0, MiB, None, 0)


def _queues(idle: tuple[int, int], *queued: Attempt) -> list[LaneQueue]:
    """Two sources' queues (the lanes' lock's Condition), `idle` lanes waiting on each; `queued` on source 1."""
    qs = [LaneQueue(threading.Condition()) for _ in range(2)]
    for q, n in zip(qs, idle):
        q.idle = n
    qs[1].items.extend(queued)
    return qs


def test_a_chunk_its_own_drive_starts_at_once_is_not_offered_to_another():
    """Another drive may take a queued chunk only when its own drive will not start it at once: with
    a lane of its own waiting for work and room in its kernel, taking it gains nothing (on drives
    faster than the reader it only added to every read's latency)."""
    bal = Balancer(2, 2, BalancePolicy(chunk_bytes=MiB), None, SimpleNamespace(in_split=[0, 1]), lambda: 0)
    att = _queued_chunk(1)
    queues = _queues((1, 1), att)
    assert bal.offers(0, queues) == {}                     # drive 1's idle lane starts it now
    queues[1].idle = 0                                     # every lane of drive 1 busy: worth taking
    assert bal.offers(0, queues) == {1: (0, att)}
    queues[1].idle = 1
    for _ in range(2):                                     # drive 1 holds two requests and delivered nothing:
        bal.pace[1].started(MiB, 0)                        # no room in its kernel (slow start), so its idle
    assert bal.offers(0, queues) == {1: (0, att)}          # lane cannot start it: worth taking
    for _ in range(2):
        bal.pace[1].ended(MiB, 0, True)                    # delivered: room again
    assert bal.offers(0, queues) == {}
    queues[1].items.appendleft(_queued_chunk(1, done=True))   # a done chunk ahead of it: one idle lane is not
    assert bal.offers(0, queues) == {1: (1, att)}          # enough for both, two are
    queues[1].idle = 2
    assert bal.offers(0, queues) == {}


def test_the_look_at_the_heads_answers_as_the_full_look_for_heads_that_may_be_taken():
    """A lane starting its own head first looks at the other queues' heads (`may_offer_earlier`):
    for a head it could take, that look is `offers`' whole answer — nothing of a later read, nor
    of one its own drive's idle lane starts at once (on healthy drives the full look behind it
    found nothing to take in any of ~4,300); a head it cannot take sends it to the full look."""
    bal = Balancer(2, 2, BalancePolicy(chunk_bytes=MiB), None, SimpleNamespace(in_split=[0, 1]), lambda: 0)
    att = _queued_chunk(1)
    queues = _queues((0, 1), att)

    def same(before):
        look = bal.may_offer_earlier(0, queues, before)
        assert look == bool(bal.offers(0, queues, before))
        return look

    assert not same(2)                      # of an earlier read, but drive 1's idle lane starts it now
    assert not same(1)                      # of the thief's own read: never taken
    queues[1].idle = 0
    assert same(2)                          # every lane of drive 1 busy: the full look takes it
    assert not same(1)
    queues[1].idle = 1
    for _ in range(2):                      # drive 1 has no room in its kernel (slow start):
        bal.pace[1].started(MiB, 0)         # its idle lane cannot start it
    assert same(2)
    for _ in range(2):
        bal.pace[1].ended(MiB, 0, True)
    queues[1].items.appendleft(_queued_chunk(0, done=True))
    assert bal.may_offer_earlier(0, queues, 2)        # a head it cannot take: the full look goes past it
    assert bal.offers(0, queues, 2) == {1: (1, att)}


def test_a_drive_that_has_delivered_nothing_is_known_no_faster_than_what_waits_in_its_kernel():
    pace = Pace(0.9)
    assert pace.bound(0) is None                                      # nothing asked of it: nothing known
    pace.started(2 * MiB, 0)
    assert pace.bound(0) is None                                      # asked, no time passed
    assert pace.bound(100_000_000) == pytest.approx(2 * MiB / 100_000_000)   # 2 MiB not read in 100 ms
    assert pace.bound(400_000_000) == pytest.approx(2 * MiB / 400_000_000)   # and it falls while it reads nothing
    pace.ended(MiB, 500_000_000, True)
    assert pace.bound(500_000_000) == pace.rate(500_000_000)          # from its first delivery: its pace


def test_a_drives_chunk_doubles_while_the_readers_cost_per_request_is_over_its_share_of_the_chunks_time():
    """`chunk_for`: the smallest chunk whose time at the drive's pace is at least 1/COST_SHARE times
    the reader's CPU per request, in doublings of `chunk_bytes` up to `chunk_max`; the floor while
    either is not known. The unit is the reader's own cost: the same drive gets the same chunk
    when pace and cost scale together."""
    p = BalancePolicy(chunk_bytes=MiB, chunk_max=16 * MiB)
    knobs = (p.chunk_bytes, p.chunk_max)
    cost = 100_000                                                # 100 µs of CPU per request
    assert chunk_for(None, cost, *knobs) == MiB and chunk_for(0.5, None, *knobs) == MiB
    assert chunk_for(0.0, cost, *knobs) == MiB
    assert chunk_for(0.15, cost, *knobs) == MiB                  # 150 MB/s: 1 MiB takes 7 ms, > 32 x 100 µs
    assert chunk_for(0.5, cost, *knobs) == 2 * MiB               # 500 MB/s: 1.6 MB needed, 2 MiB
    assert chunk_for(0.5, 3 * cost, *knobs) == 8 * MiB           # a reader three times as costly: 4.8 MB, 8 MiB
    assert chunk_for(7.0, cost, *knobs) == 16 * MiB              # NVMe: 22 MB needed, the largest allowed
    assert chunk_for(math.inf, cost, *knobs) == 16 * MiB
    for rate in (0.01, 0.15, 0.5, 2.0, 7.0):
        c = chunk_for(rate, cost, *knobs)
        assert c / rate >= cost / COST_SHARE or c == p.chunk_max          # long enough, or the largest
        assert c == p.chunk_bytes or (c / 2) / rate < cost / COST_SHARE   # and no longer than it needs
        assert chunk_for(rate * 3, cost / 3, *knobs) == c                 # in units of the reader's cost
    assert chunk_for(7.0, cost, MiB, MiB) == MiB                 # chunk_max = chunk_bytes: every chunk that size


def test_a_piece_is_never_fewer_than_two_chunks_of_a_grown_size():
    """`piece_chunk`: a drive's grown chunk is halved, down to the smallest, until the piece is at
    least MIN_REQUESTS chunks; a piece no longer than the smallest chunk stays one read."""
    p = BalancePolicy(chunk_bytes=MiB, chunk_max=16 * MiB)
    smallest = p.chunk_bytes
    assert piece_chunk(11_184_811, 16 * MiB, smallest) == 4 * MiB    # a third of a 32 MiB read: three chunks
    assert piece_chunk(64 * MiB, 16 * MiB, smallest) == 16 * MiB     # long enough for the drive's own
    assert piece_chunk(3 * MiB, 16 * MiB, smallest) == MiB           # down to the smallest
    assert piece_chunk(600_000, 16 * MiB, smallest) == MiB and chunks(0, 600_000, MiB) == [(0, 600_000)]
    assert piece_chunk(8 * MiB, MiB, smallest) == MiB                # the smallest is never halved
    for ln in (MiB + 1, 5 * MiB, 11_184_811, 40 * MiB):
        c = piece_chunk(ln, 16 * MiB, smallest)
        assert c == p.chunk_bytes or len(chunks(0, ln, c)) >= MIN_REQUESTS


def test_the_balancer_sizes_each_drives_chunk_from_its_pace_and_the_depth_in_the_fastest_drives_chunks():
    """A drive delivering 8 MiB per ms grows its chunk, one at 1 MiB per 10 ms keeps the smallest;
    a drive's kernel depth counts `lanes` chunks of the fastest drive."""
    now = [0]
    bal = Balancer(2, 4, BalancePolicy(chunk_bytes=MiB, chunk_max=8 * MiB), None, SimpleNamespace(in_split=[0, 1]),
                   lambda: now[0])
    att = Attempt(None, 0, MAIN, 0, MiB, None, 0)
    for k in range(3):
        for s, ns in ((0, 125_000), (1, 10_000_000)):            # 8.4 GB/s and 105 MB/s
            bal.pace[s].started(MiB, now[0])
            now[0] += ns
            bal.ended(att, s, True, 20_000)                       # 20 µs of the reader's CPU per request
    assert bal.cost_ns == pytest.approx(20_000)
    assert bal.chunk == [8 * MiB, MiB]                           # 8.4 GB/s x 640 µs = 5.4 MB: 8 MiB
    assert bal._depth(1) == pytest.approx(bal.rate(1) / bal.rate(0) * 4 * 8 * MiB)
    bal.ended(att, 0, False, None)                                # a failed attempt: nothing learnt
    assert bal.chunk == [8 * MiB, MiB] and bal.cost_ns == pytest.approx(20_000)


def test_a_run_reports_each_drives_chunk_within_the_policys_bounds(model):
    """Real reads (page cache) with balancing: the lanes measure their CPU per request, each source's
    chunk at the end is a doubling of the smallest within the largest, and with the two equal
    every chunk is that size."""
    paths, data = model
    for most in (64 * CHUNK, CHUNK):
        settings = ReaderSettings(lanes=2, balance=True, balance_policy=BalancePolicy(chunk_bytes=CHUNK, chunk_max=most))
        with SplitReader(paths, [1, 1, 1], cold=False, settings=settings) as r:
            for _ in range(4):
                assert bytes(r.read(0, SIZE)) == data
            stats = r.stats()
            assert r._lanes.balancer.cost_ns > 0           # the lanes measured their CPU per request
        got = [s.chunk_bytes for s in stats.sources]
        assert all(CHUNK <= c <= most and (c // CHUNK) & (c // CHUNK - 1) == 0 for c in got), got
        assert [s.to_dict()["chunk_bytes"] for s in stats.sources] == got
    assert got == [CHUNK] * 3
    with SplitReader(paths, [1, 1, 1], cold=False) as r:
        r.read(0, SIZE)
        assert [s.chunk_bytes for s in r.stats().sources] == [0, 0, 0]     # not balancing: no chunks


@pytest.mark.parametrize("bad", [BalancePolicy(chunk_bytes=1000), BalancePolicy(chunk_bytes=0),
                                 BalancePolicy(depth_ns=-1), BalancePolicy(chunk_bytes=True),
                                 BalancePolicy(chunk_bytes=2 * MiB, chunk_max=MiB), BalancePolicy(chunk_max=1.5)])
def test_policy_checks(bad):
    with pytest.raises(ValueError):
        check_balance(bad)


def test_bad_balance_policy_is_one_usage_error(model):
    paths, _ = model
    with pytest.raises(UsageError, match="chunk_bytes"):
        SplitReader(paths, [2, 1, 1], settings=ReaderSettings(balance=True, balance_policy=BalancePolicy(chunk_bytes=5000)))


def test_a_stalled_drives_queued_chunks_are_taken_by_the_others(model):
    """Source 2 hangs on the first chunk it starts; the chunks still queued behind it are read by the
    idle sources, so at most the one in its kernel is left for it once it returns."""
    paths, data = model
    stall = Stall(paths[2])
    with _reader(paths, stall) as r:
        assert bytes(r.read(0, SIZE)) == data               # warm-up: every drive has a pace
        before = r.stats()
        stall.active = True
        t = r.submit(0, SIZE)                                # 2:1:1 of 16 blocks: source 2 is given 4 blocks, 16 chunks
        held = []
        _until(lambda: t.done() or held or (stall.entered.acquire(blocking=False) and not held.append(1)))
        if held:                                             # its lane is inside a chunk: the rest is taken from it
            _until(lambda: sum(r.stats().sources[i].bytes - before.sources[i].bytes for i in (0, 1)) == SIZE - CHUNK)
            assert not t.done()                              # the chunk in its kernel still holds the barrier
        stall.gate.set()                                     # (else the others took every chunk before its lane woke)
        assert bytes(t.result()) == data
        s = r.stats()
    assert s.sources[2].bytes - before.sources[2].bytes == (CHUNK if held else 0)
    took = sum(s.sources[i].stolen_bytes - before.sources[i].stolen_bytes for i in (0, 1))
    assert took >= 4 * BLOCK_BYTES - (CHUNK if held else 0)   # all of source 2's share but a chunk it held
    assert s.sources[2].stolen_bytes - before.sources[2].stolen_bytes <= CHUNK  # the one it may hold is all it takes
    assert sum(x.bytes for x in s.sources) - sum(x.bytes for x in before.sources) == SIZE
    given = s.phases[0].sources                                       # the engine's cut is still what was given
    assert [g.given_bytes for g in given] == [2 * 8 * BLOCK_BYTES, 2 * 4 * BLOCK_BYTES, 2 * 4 * BLOCK_BYTES]
    assert "stolen_bytes=" in r.format_stats()
    assert s.to_dict()["sources"][0]["stolen_bytes"] == s.sources[0].stolen_bytes


@pytest.mark.parametrize("lanes", [1, 4])
def test_balanced_reads_return_exactly_the_bytes_and_count_each_once(model, lanes):
    paths, data = model
    rng = random.Random(lanes)
    ranges = [(o, rng.randrange(1, SIZE - o)) for o in (rng.randrange(SIZE - 1) for _ in range(40))]
    with _reader(paths, None, lanes=lanes) as r:
        got = r.read_many(ranges)
        assert [bytes(g) for g in got] == [data[o:o + n] for o, n in ranges]
        s = r.stats()
    assert sum(x.bytes for x in s.sources) == sum(n for _, n in ranges)
    assert s.reads == len(ranges) and s.bytes == sum(n for _, n in ranges)
    assert sum(x.failover_bytes for x in s.sources) == 0 and not any(x.degraded for x in s.sources)
    bal = r._lanes.balancer                   # every piece cut was counted in once it landed
    assert bal.outstanding == 0 and [p.given for p in bal.pace] == [0] * len(paths)


def test_balancing_is_off_unless_asked_and_with_one_source(model):
    paths, _ = model
    with SplitReader(paths, [2, 1, 1]) as r:
        assert not r.balance
    with SplitReader(paths[:1], [1], settings=ReaderSettings(balance=True)) as r:
        assert not r.balance                               # nobody to take work from


def test_the_harness_measures_a_plan_as_cut_and_the_gate_says_when_a_drive_took_others_pieces():
    spec = ArmSpec("p", ("/m/a.gguf", "/m/b.gguf"), (2, 1), (2, 1))
    cmd = engine_command(spec, {}, "/tmp/plan.json")
    assert "--no-balance" in cmd
    assert engine_command(spec, {"run_args": ["--balance"]}, "/tmp/plan.json")[-1] == "--balance"   # later wins
    result = {"events": [], "sources": [{"index": 0, "stolen_bytes": 0}, {"index": 1, "stolen_bytes": 3_000_000}]}
    assert plan_changes(result) == ["balanced: source 1 read 3.0 MB of others' pieces"]
    assert plan_changes({"events": [], "sources": [{"index": 0, "stolen_bytes": 0}]}) == []


def test_run_rejects_a_bad_balance_knob_in_one_line(tmp_path):
    for args, what in ((["--balance-chunk", "5000"], "--balance-chunk"), (["--balance-depth", "-1"], "--balance-depth"),
                       (["--balance-chunk", "4M", "--balance-chunk-max", "1M"], "--balance-chunk-max 1M")):
        r = runner.invoke(app, ["run", "--model", str(tmp_path / "m.gguf"), *args])
        assert r.exit_code == 2, r.output
        assert what in r.output


def test_a_drive_never_takes_a_chunk_of_a_file_its_partial_replica_does_not_hold(tmp_path):
    """green holds only the first part of a split set: while the primary hangs on the second part,
    white (which holds it) takes the queued chunks, green never does."""
    parts = write_split_gguf(tmp_path / "internal", "moe", 2, tensors_per_part=1, tensor_bytes=SIZE, seed=8)
    model = discover(str(parts[0]))
    first, second = model.files
    models = [model]
    for name, rels in (("green", (first,)), ("white", model.files)):
        (tmp_path / name).mkdir()
        for rel in rels:
            (tmp_path / name / rel).write_bytes((tmp_path / "internal" / rel).read_bytes())
        models.append(model.in_dir(str(tmp_path / name)))
    data = (tmp_path / "internal" / second).read_bytes()
    stall = Stall(models[0].abs(second))
    n = 4 * BLOCK_BYTES
    read = Read(second, 0, n, (Piece(0, 0, n, 4),))           # the pattern gives the primary the whole read
    with _reader(models, stall, holds=(None, frozenset({first}), None)) as r:
        stall.active = True
        t = r.submit_read(read)
        held = []
        _until(lambda: t.done() or held or (stall.entered.acquire(blocking=False) and not held.append(1)))
        if held:
            _until(lambda: r.stats().sources[2].bytes == n - CHUNK)
        stall.gate.set()
        assert bytes(t.result()) == data[:n]
        s = r.stats()
    assert s.sources[1].bytes == 0 and s.sources[1].stolen_bytes == 0
    assert s.sources[2].stolen_bytes == n - (CHUNK if held else 0)


def test_with_hedging_the_chunk_a_hung_drive_holds_is_hedged_and_the_read_never_waits_for_it(model):
    """Balancing takes the queued chunks, hedging the one in the hung drive's kernel: its deadline
    runs from when its lane started it (over the bytes then in that kernel), so the read completes
    while the drive still hangs."""
    paths, data = model
    stall, clock = Stall(paths[2]), Clock()
    pol = HedgePolicy(floor_ns=FLOOR, min_busy_ns=0)
    with _reader(paths, stall, hedge=True, hedge_policy=pol, clock=clock) as r:
        assert bytes(r.read(0, SIZE)) == data               # warm-up: every drive has a rate
        before = r.stats()
        stall.active = True
        t = r.submit(0, SIZE)
        held = []
        _until(lambda: t.done() or held or (stall.entered.acquire(blocking=False) and not held.append(1)))
        if held:
            _until(lambda: sum(r.stats().sources[i].bytes - before.sources[i].bytes for i in (0, 1)) == SIZE - CHUNK)
            assert not t.done()
            clock.advance(FLOOR + 1)                         # the held chunk, started at 0, is now late
            r.wake_hedger()
        assert bytes(t.result()) == data                    # while source 2 still hangs (when it held one)
        s = r.stats()
        stall.gate.set()
    assert s.sources[2].late - before.sources[2].late == (1 if held else 0)
    assert sum(s.sources[i].hedged - before.sources[i].hedged for i in (0, 1)) == (1 if held else 0)
    assert s.sources[2].bytes == before.sources[2].bytes


class _Logged(StallingReader):
    """A StallingReader that logs (path, offset) of every read it makes, in order."""

    def __init__(self, path, stall, log):
        super().__init__(path, stall)
        self.log = log

    def read_into(self, buffer, offset):
        self.log.append((self.path, offset))
        return super().read_into(buffer, offset)


def test_a_drive_with_work_of_its_own_first_takes_an_earlier_reads_chunks_from_a_drive_that_holds_them(model):
    """The engine waits for reads in the order it submitted them. Read a then read b, each cut 1:1;
    source 1 holds its first chunk of a and has delivered nothing (its pace is bounded by that chunk
    over the time it has waited: at most half what source 0 needs, whatever the machine's speed),
    source 0 goes on: after its own chunks of a it takes source 1's queued chunks of a before its own
    chunks of b (not only once it is idle, when the engine has waited for a all along), then b's."""
    paths, data = model
    half = SIZE // 2
    log = []
    stalls = {p: Stall(p, count=1) for p in paths[:2]}
    settings = ReaderSettings(lanes=1, balance=True, balance_policy=BalancePolicy(chunk_bytes=CHUNK, chunk_max=CHUNK, depth_ns=0))
    with SplitReader(paths[:2], [1, 1], [1, 1], cold=False, settings=settings,
                     opener=lambda p: _Logged(p, stalls.get(p), log)) as r:
        for st in stalls.values():
            st.active = True
        a, b = r.submit(0, half), r.submit(half, half)
        for st in stalls.values():
            st.entered.acquire()                        # each lane holds its first chunk of a
        stalls[paths[0]].gate.set()                     # source 0 goes on, source 1 still holds its chunk
        _until(b.done)                                  # b is read whole without source 1
        stalls[paths[1]].gate.set()
        assert bytes(a.result()) == data[:half] and bytes(b.result()) == data[half:]
        s = r.stats()
    zero = [off for p, off in log if p == paths[0]]
    first_b = next(i for i, off in enumerate(zero) if off >= half)
    assert all(off >= half for off in zero[first_b:])          # every chunk of a it read came before any of b
    assert s.sources[1].bytes == CHUNK                          # source 1 read only the chunk it held
    assert s.sources[0].bytes == SIZE - CHUNK
    assert sum(1 for off in zero if off < half) == half // CHUNK - 1
