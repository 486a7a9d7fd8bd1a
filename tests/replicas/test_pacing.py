"""Gentle on drives that serve: --max-rate's token bucket (pure), the pacing of sync, verify and
repair by an injected clock (no test waits), and verify --full resumed where it stopped."""

import functools
import json
import os
import signal
import threading

import pytest

from core import rig as rigmod
from core.errors import Interrupted, UsageError
from core.events import Notice, Progress
from replicas import pacing, throttle, verify
from core.coldio import read_sequential
from replicas.constants import BURST_S
from replicas.manifests import load_manifest
from replicas.pacing import TokenBucket, parse_rate
from replicas.records import load_scrub, load_verdicts
from replicas.repair import repair_member
from replicas.sync import sync
from replicas.throttle import Pacer, Pacers
from replicas.verify import verify_members
from tests.helpers import impure_imports, model_and_drives
from tests.replicas.helpers import PIECE, FakeClock, MiB, flip_byte, invoke

RATE = 4e6          # bytes/s


def test_the_arithmetic_is_pure_and_the_sleep_is_not():
    assert impure_imports(pacing) == []
    assert any(x.endswith(": time") for x in impure_imports(throttle))


@pytest.mark.parametrize("text, rate", [("500M", 5e8), ("500MB/s", 5e8), ("1.5G", 1.5e9), ("2k", 2e3),
                                        ("100", 100.0), ("250m/s", 2.5e8), ("3T", 3e12)])
def test_rates_are_decimal(text, rate):
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["fast", "0", "-5M", "M", "", "nan", "inf", "5X"])
def test_bad_rates_say_how(text):
    with pytest.raises(UsageError, match="--max-rate"):
        parse_rate(text)


def test_token_bucket():
    b = TokenBucket.for_rate(1000.0)
    assert b.burst == 1000.0 * BURST_S
    assert b.take(0.0, 250) == 0.0                     # the burst moves at once
    assert b.take(0.0, 1000) == 1.0                    # then debt: a second for 1000 bytes at 1000 B/s
    assert b.take(1.0, 500) == 0.5                     # the debt was waited off; this one waits its own
    assert b.take(10.0, 100) == 0.0                    # idle: refilled, but never beyond the burst
    assert b.tokens == 250 - 100
    # Whatever the request sizes, the bytes moved over the time taken is the rate (after the burst).
    clock, b, moved = 0.0, TokenBucket.for_rate(RATE), 0
    for n in [1, 4096, 16 * MiB, 7, 3 * MiB, 1 << 20] * 5:
        clock += b.take(clock, n)
        moved += n
    assert clock == pytest.approx((moved - RATE * BURST_S) / RATE)


def test_pacers_are_per_drive():
    p = Pacers(RATE, FakeClock())
    assert p.for_drive("a") is p.for_drive("a") and p.for_drive("a") is not p.for_drive("b")
    assert Pacers(None).for_drive("a") is None


def test_a_cancelled_pacer_does_not_sleep():
    clock, cancel = FakeClock(), threading.Event()
    pace = Pacer(RATE, clock, cancel)
    cancel.set()
    pace(100 * MiB)
    assert clock.slept == 0


def test_verify_at_max_rate_takes_the_bytes_over_the_rate(synced):
    rig, data, paths = synced
    r = rigmod.load_rig(rig)
    clock = FakeClock()
    rep = verify_members(list(r.members), load_manifest(r), r, mode="full", max_rate=RATE, clock=clock)
    assert rep.exit_code == 0 and sum(m.bytes_read for m in rep.members) == 3 * len(data)
    # One drive here (tmp): the three members share its pacer, one after another.
    assert clock.t == pytest.approx((3 * len(data) - RATE * BURST_S) / RATE)
    unpaced = FakeClock()
    verify_members(list(r.members), load_manifest(r), r, mode="full", clock=unpaced)
    assert unpaced.t == 0


def test_repair_at_max_rate_paces_reads_and_writes(synced):
    rig, data, paths = synced
    flip_byte(paths[2], 2 * MiB + 1)
    r = rigmod.load_rig(rig)
    clock = FakeClock()
    res = repair_member(r.members[2], [r.members[1]], load_manifest(r), r, max_rate=RATE, clock=clock)
    assert res.after.state == "identical" and res.bytes_copied == PIECE
    # Read all before, the donor's piece, write it, read all after: one drive, one thread.
    assert clock.t == pytest.approx((2 * len(data) + 2 * PIECE - RATE * BURST_S) / RATE)


def test_sync_at_max_rate_paces_every_byte_it_moves(tmp_path, monkeypatch):
    src, data, dests = model_and_drives(tmp_path, 5 * MiB + 99, seed=4)
    paced = []
    lock = threading.Lock()
    take = TokenBucket.take

    def counting(self, now, nbytes):
        with lock:
            paced.append(nbytes)
        return take(self, now, nbytes)

    monkeypatch.setattr(TokenBucket, "take", counting)
    clock = FakeClock()
    res = sync(str(src), [str(d) for d in dests], str(tmp_path / "rig"), piece_size=PIECE, allow_same_device=True,
               max_rate=RATE, clock=clock)
    assert res.exit_code == 0
    # The source read once, each destination written once and read back once.
    assert sum(paced) == len(data) * (1 + 2 * len(dests))
    assert clock.slept > 0
    assert all(open(d / "model.gguf", "rb").read() == data for d in dests)


def test_max_rate_on_the_command_line(synced):
    rig, data, paths = synced
    r = invoke("verify", "--rig", rig, "--full", "--max-rate", "fast")
    assert r.exit_code == 2 and "--max-rate 'fast' is not a rate" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = invoke("verify", "--rig", rig, "--full", "--max-rate", "10G", "--quiet")
    assert r.exit_code == 0
    for cmd in ("sync", "verify", "repair"):
        assert "decimal units" in " ".join(invoke(cmd, "--help").stdout.split())


# --- verify --full, interrupted and resumed -----------------------------------------------------

@pytest.fixture
def small_reads(monkeypatch):
    """256 KiB reads instead of 16 MiB, so a few-MiB member is read in many steps."""
    monkeypatch.setattr(verify, "read_sequential", functools.partial(read_sequential, block=256 << 10))


def stop_at(cancel, path, nbytes):
    """A reporter that presses Ctrl-C once `path` has been read up to `nbytes` (on the reading
    thread, so where it stops does not depend on timing)."""
    seen = []

    def report(ev):
        seen.append(ev)
        if isinstance(ev, Progress) and ev.task == path and ev.done >= nbytes:
            cancel.set()
    return report, seen


def test_interrupted_full_verify_resumes_where_it_stopped(synced, small_reads):
    rig, data, paths = synced
    flip_byte(paths[1], MiB + 5)                       # piece 1: found before the interruption
    r = rigmod.load_rig(rig)
    manifest = load_manifest(r)
    cancel = threading.Event()
    report, _ = stop_at(cancel, paths[1], 4 * MiB)
    with pytest.raises(Interrupted):
        verify_members(list(r.members), manifest, r, mode="full", report=report, cancel=cancel)
    marks = load_scrub(r)
    assert marks[paths[0]].done == manifest.count      # finished before the stop
    assert marks[paths[1]].done == 4 and marks[paths[1]].bad == (1,)
    assert paths[2] not in marks                       # not reached
    assert load_verdicts(r)[paths[1]].how == "sync"   # an unfinished member leaves its verdict as it was
    events = []
    rep = verify_members(list(r.members), manifest, r, mode="full", resume=True, report=events.append)
    assert [m.bytes_read for m in rep.members] == [0, len(data) - 4 * MiB, len(data)]
    assert [m.state for m in rep.members] == ["identical", "mismatch", "identical"]
    assert [b.index for b in rep.members[1].bad] == [1]          # remembered from before the stop
    notes = [e.message for e in events if isinstance(e, Notice)]
    assert any("resuming at piece 5 of 7" in n for n in notes)       # pieces 1..4 done, counted from 1
    assert any("all 7 pieces were read before the interruption" in n for n in notes)   # the finished member
    assert load_scrub(r) == {} and not os.path.exists(r.scrub_file)
    assert load_verdicts(r)[paths[1]].state == "mismatch"


def test_a_member_that_changed_since_the_stop_starts_over(synced, small_reads):
    rig, data, paths = synced
    r = rigmod.load_rig(rig)
    manifest = load_manifest(r)
    cancel = threading.Event()
    report, _ = stop_at(cancel, paths[0], 3 * MiB)
    with pytest.raises(Interrupted):
        verify_members(list(r.members), manifest, r, mode="full", report=report, cancel=cancel)
    assert load_scrub(r)[paths[0]].done == 3
    os.utime(paths[0], ns=(1, 1))                       # touched: another file as far as the mark knows
    events = []
    rep = verify_members(list(r.members), manifest, r, mode="full", resume=True, report=events.append)
    assert rep.members[0].bytes_read == len(data) and rep.exit_code == 0
    assert any(isinstance(e, Notice) and "starting from the first piece" in e.message for e in events)


def test_full_without_resume_starts_over_and_resume_implies_full(synced, small_reads):
    rig, data, paths = synced
    r = rigmod.load_rig(rig)
    manifest = load_manifest(r)
    cancel = threading.Event()
    report, _ = stop_at(cancel, paths[0], 2 * MiB)
    with pytest.raises(Interrupted):
        verify_members(list(r.members), manifest, r, mode="full", report=report, cancel=cancel)
    rep = verify_members(list(r.members), manifest, r, mode="full")
    assert [m.bytes_read for m in rep.members] == [len(data)] * 3
    res = invoke("verify", "--rig", rig, "--resume", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["mode"] == "full"
    assert invoke("verify", "--rig", rig, "--resume", "--sample", "5").exit_code == 2


def test_ctrl_c_on_the_command_line_keeps_progress_for_resume(synced, monkeypatch):
    """A real SIGINT to the command: its handler (on the main thread) sets the cancel flag; the
    reading thread waits for that before reading on, so where it stops is fixed."""
    rig, data, paths = synced

    def interrupting(reader, start=0, end=None, block=None, cancel=None, pace=None, **kw):
        for off, view in read_sequential(reader, start, end, block=256 << 10, cancel=cancel, pace=pace):
            yield off, view
            if reader.path == paths[1] and off + len(view) == 3 * MiB:
                os.kill(os.getpid(), signal.SIGINT)
                assert cancel.wait(60), "the SIGINT handler never set the cancel flag"

    monkeypatch.setattr(verify, "read_sequential", interrupting)
    r = invoke("verify", "--rig", rig, "--full")
    assert r.exit_code == 130, r.output
    assert "replicas verify --full --resume" in r.output and len(r.stderr.strip().splitlines()) <= 2
    assert load_scrub(rigmod.load_rig(rig))[paths[1]].done == 3
    monkeypatch.setattr(verify, "read_sequential", read_sequential)
    r = invoke("verify", "--rig", rig, "--resume", "--json")
    assert r.exit_code == 0
    assert [m["bytes_read"] for m in json.loads(r.stdout)["members"]] == [0, len(data) - 3 * MiB, len(data)]


@pytest.mark.parametrize("when", ["in a read", "after the last piece", "second ctrl-c"])
def test_a_ctrl_c_wherever_it_lands_in_a_full_verify_says_how_to_resume(synced, small_reads, monkeypatch, when):
    """Whether the cancel flag stops a read, comes after the last piece was checked, or a second
    Ctrl-C aborts at once (KeyboardInterrupt), `verify --full` ends with exit 130 and the resume
    hint; one of them used to end with a bare 'interrupted' or without the hint."""
    rig, data, paths = synced
    real = verify.verify_members

    def interrupted(members, manifest, r, **kw):
        cancel = kw["cancel"]
        if when == "second ctrl-c":
            raise KeyboardInterrupt
        if when == "in a read":
            cancel.set()
            return real(members, manifest, r, **kw)
        rep = real(members, manifest, r, **kw)
        cancel.set()
        return rep

    monkeypatch.setattr(verify, "verify_members", interrupted)     # the command imports it when it runs
    r = invoke("verify", "--rig", rig, "--full", "-q")
    assert r.exit_code == 130, r.output
    assert "continue with `replicas verify --full --resume`" in r.stderr
