"""The run as a plan (pure): which trials, in what order, with which shapes and lanes, and how
their runs add up — fed made-up runs, no drive and no thread."""

import pytest

from core.errors import UsageError
from engines.ds4_argodrive.constants import PREFILL_CHUNK
from iobench import aggregate, schedule
from iobench.aggregate import group_result, lane_result, preset_result, suspect_cache
from iobench.constants import PLAUSIBLE_BW, TOGETHER_LANES
from iobench.schedule import (
    RunOptions,
    Target,
    check_options,
    count_trials,
    fitting_presets,
    measure,
    run_plan,
    run_settings,
)
from iobench.shapes import prefill_shape
from iobench.trials import StreamRun
from tests.helpers import impure_imports

MiB = 1 << 20
GiB = 1 << 30


def test_the_plan_and_its_arithmetic_are_pure():
    assert impure_imports(schedule) == [] and impure_imports(aggregate) == []


def targets(*names, size=GiB):
    return [Target(name=n, path=f"/{n}/model.gguf", size=size, drive=None) for n in names]


def made_up_run(name, lanes, piece_bytes, rate, windows=3, lat_ns=2_000_000, device_bytes=None):
    """A drive whose rate grows with lanes up to 4, then stays: the knee is at 4."""
    bw = rate * min(lanes, 4) / 4
    return StreamRun(name=name, lanes=lanes, piece_bytes=piece_bytes, windows=((bw, bw / piece_bytes),) * windows,
                     lat_ns=(lat_ns,) * 8, requests=8, app_bytes=bw, device_bytes=device_bytes, short_reads=0)


def runner(rates, log):
    def run(trial):
        log.append(trial)
        return [made_up_run(leg.name, leg.lanes, leg.shape.piece_bytes, rates[leg.name]) for leg in trial.legs]
    return run


def test_alone_then_groups_then_together_in_preset_order():
    ts = targets("internal", "green", "white")
    opts = RunOptions(presets=("decode", "seq"), lanes=(1, 4), groups=(("hub", ("green", "white")),), restarts=1)
    log = []
    m = run_plan(measure(ts, opts, {t.name: False for t in ts}), runner({"internal": 12e9, "green": 6e9, "white": 6e9}, log))
    assert [t.label for t in log] == [
        "internal seq x1", "internal seq x4", "green seq x1", "green seq x4", "white seq x1", "white seq x4",
        "internal decode x1", "internal decode x4", "green decode x1", "green decode x4", "white decode x1",
        "white decode x4", "hub seq", "hub decode", "together seq", "together decode"]
    assert len(log) == count_trials(ts, opts)
    assert m.order == ["seq", "decode"]
    # the seq ceilings of this run set the split: 12:6:6 -> 10:5:5
    assert m.weights == m.decode_weights == (10, 5, 5) and m.weights_from == "seq ceilings of this run"
    assert [leg.shape.piece_bytes for leg in log[6].legs + log[8].legs + log[10].legs] == [3_489_792, 1_572_864, 1_572_864]
    seq = m.presets["green"]["seq"]
    assert seq.best_lanes == 4 and seq.knee_lanes == 4 and seq.bw_bytes == 6e9
    # grouped and together runs keep the lanes each drive did best with alone
    assert [leg.lanes for leg in log[-1].legs] == [4, 4, 4]
    assert [g.name for g in m.groups] == ["hub", "hub"] and [g.drives for g in m.together] == [("internal", "green", "white")] * 2
    assert m.together[0].bw_bytes == 24e9                     # per-window totals of the drives read together


def test_given_weights_and_a_drive_they_leave_out():
    ts = targets("a", "b")
    opts = RunOptions(presets=("prefill",), lanes=(2,), weights=(10, 5), decode_weights=(3, 1))
    log = []
    m = run_plan(measure(ts, opts, {"a": False, "b": False}), runner({"a": 1e9, "b": 1e9}, log))
    assert m.weights == (10, 5) and m.decode_weights == (3, 1) and m.weights_from == "--weights"
    assert log[0].legs[0].shape == prefill_shape(GiB, (10, 5), 0, PREFILL_CHUNK)
    assert log[1].legs[0].shape == prefill_shape(GiB, (10, 5), 1, PREFILL_CHUNK)
    # decode 100:1 on a 25-block component gives the second drive no block: it is noted, not
    # measured, and a together run of one drive is no together run
    log = []
    opts = RunOptions(presets=("decode",), lanes=(2,), weights=(1, 1), decode_weights=(100, 1), restarts=1)
    m = run_plan(measure(ts, opts, {"a": False, "b": False}), runner({"a": 1e9, "b": 1e9}, log))
    assert [t.label for t in log] == ["a decode x2"] and log[0].legs[0].shape.piece_bytes == 6_635_520
    assert m.presets["b"] == {} and m.notes["b"] == ["decode: the weights give this drive no bytes; not measured"]
    assert m.together == [] and m.presets["a"]["decode"].best_lanes == 2


def test_together_only_uses_the_engines_default_lanes():
    ts = targets("a", "b")
    log = []
    m = run_plan(measure(ts, RunOptions(presets=("seq", "decode"), alone=False, restarts=1), {"a": False, "b": False}),
                 runner({"a": 2e9, "b": 1e9}, log))
    assert [t.label for t in log] == ["together seq", "together decode"]
    assert [leg.lanes for leg in log[1].legs] == [TOGETHER_LANES["decode"]] * 2
    assert m.weights == (1, 1) and m.weights_from == "equal (no seq ceilings known)"
    assert m.presets == {"a": {}, "b": {}}


def test_a_drive_that_is_not_cold_is_flagged_wherever_it_reads():
    ts = targets("a", "b")
    m = run_plan(measure(ts, RunOptions(presets=("seq",), lanes=(1,)), {"a": True, "b": False}),
                 runner({"a": 1e9, "b": 1e9}, []))
    assert m.presets["a"]["seq"].suspect_cache and not m.presets["b"]["seq"].suspect_cache
    assert "not a ceiling" in m.presets["a"]["seq"].notes[0]
    assert m.together[0].suspect_cache


def test_a_plan_with_nothing_to_run_returns_at_once():
    m = run_plan(measure(targets("a"), RunOptions(presets=("seq",), alone=False), {"a": False}),
                 lambda trial: pytest.fail("no trial expected"))
    assert m.presets == {"a": {}} and m.together == []


def test_settings_say_what_was_asked_and_chosen():
    ts = targets("a", "b")
    opts = RunOptions(presets=("seq", "prefill"), lanes=(1,), seed=7, groups=(("g", ("a", "b")),))
    m = run_plan(measure(ts, opts, {"a": False, "b": False}), runner({"a": 2e9, "b": 1e9}, []))
    s = run_settings(opts, m)
    assert s["presets"] == ["seq", "prefill"] and s["lanes"] == {"seq": [1], "prefill": [1]}
    assert s["weights"] == [10, 5] and s["decode_weights"] == [10, 5] and s["weights_from"] == "seq ceilings of this run"
    assert s["groups"] == {"g": ["a", "b"]} and s["seed"] == 7 and s["prefill_chunk"] == PREFILL_CHUNK


def test_options_are_checked_before_any_read():
    ts = targets("a", "b")
    check_options(ts, RunOptions(presets=("seq",)))
    with pytest.raises(UsageError, match="the same file is given twice"):
        check_options(ts, RunOptions(presets=("seq",)), real_paths=["/x", "/x"])
    with pytest.raises(UsageError, match="one weight per drive"):
        check_options(ts, RunOptions(weights=(1, 2, 3)))
    with pytest.raises(UsageError, match="too small for the seq preset"):
        check_options(targets("a", size=MiB), RunOptions(presets=("seq",)))


def test_presets_not_named_that_a_file_is_too_small_for_are_skipped_with_a_note():
    """The default (every preset): a model smaller than the prefill preset's reads is measured
    with the presets it can hold, and each drive says which preset was skipped and why. A preset
    the user named is refused instead; nothing left to measure is refused too."""
    small = targets("a", "b", size=200 * MiB)          # holds seq, decode, rand4k; not 17 x 32 MiB apart
    opts, notes = fitting_presets(small, RunOptions(skip_small=True))
    assert opts.presets == ("seq", "decode", "rand4k") and [n for n, _ in notes] == ["a", "b"]
    assert all("prefill preset skipped" in note and "too small" in note and "--preset prefill" in note for _, note in notes)
    check_options(small, opts)
    named = RunOptions(presets=("seq", "prefill"))
    assert fitting_presets(small, named) == (named, [])
    with pytest.raises(UsageError, match="too small for the prefill preset"):
        check_options(small, named)
    with pytest.raises(UsageError, match="too small for the"):
        fitting_presets(targets("a", size=4096), RunOptions(skip_small=True))
    assert fitting_presets(targets("a"), RunOptions(skip_small=True)) == (RunOptions(skip_small=True), [])


def test_what_the_cache_may_have_answered():
    run = made_up_run("a", 4, MiB, 2e9)
    assert not suspect_cache(run, False)
    assert suspect_cache(run, True)
    assert suspect_cache(made_up_run("a", 4, MiB, 2 * PLAUSIBLE_BW), False)           # faster than any drive
    assert suspect_cache(made_up_run("a", 4, MiB, 2e9, lat_ns=1_000), False)          # 1 us: memory
    assert suspect_cache(made_up_run("a", 4, MiB, 2e9, device_bytes=0), False)        # the device moved nothing
    assert not suspect_cache(made_up_run("a", 4, MiB, 2e9, device_bytes=2e9), False)


def test_best_lanes_knee_and_group_totals():
    lanes = [lane_result([made_up_run("a", n, MiB, 4e9)], False) for n in (1, 2, 4, 8)]
    pr = preset_result("seq", MiB, lanes)
    assert (pr.best_lanes, pr.knee_lanes, pr.bw_bytes) == (4, 4, 4e9)     # a tie goes to fewer lanes
    assert [x.lanes for x in pr.lanes] == [1, 2, 4, 8] and pr.spread_pct == 0
    a = StreamRun("a", 2, MiB, ((1e9, 1.0), (3e9, 1.0), (2e9, 1.0)), (10_000,), 3, 0.0, None, 0)
    b = StreamRun("b", 2, MiB, ((3e9, 1.0), (1e9, 1.0), (1e9, 1.0)), (10_000,), 3, 0.0, None, 0)
    g = group_result("hub", "seq", [[a, b]], [False, False])
    assert g.runs_bw == (4e9, 4e9, 3e9) and g.bw_bytes == 4e9      # the median of the totals, not 2e9 + 1e9
    assert [x.bw_bytes for x in g.members] == [2e9, 1e9]


def restart_runner(log, slow=(1, 3, 2)):
    """Each restarted trial of a lane count runs at its own pace (`slow[restart]` times the base
    rate), with windows at 0.9, 1.0 and 1.1 of it and latencies of (restart + 1) ms."""
    def run(trial):
        log.append(trial)
        out = []
        for leg in trial.legs:
            rate = {"a": 1e8, "b": 5e7}[leg.name] * slow[trial.restart] * leg.lanes
            windows = tuple((rate * k, rate * k / leg.shape.piece_bytes) for k in (0.9, 1.0, 1.1))
            out.append(StreamRun(leg.name, leg.lanes, leg.shape.piece_bytes, windows, ((trial.restart + 1) * 1_000_000,) * 8,
                                 8, rate, None, 0))
        return out
    return run


def test_restarted_trials_go_round_robin_over_the_lane_counts_and_the_median_trial_counts():
    ts = targets("a", "b")
    opts = RunOptions(presets=("decode",), lanes=(1, 2), restarts=3, weights=(1, 1))
    log = []
    m = run_plan(measure(ts, opts, {"a": False, "b": False}), restart_runner(log))
    assert [t.label for t in log] == [
        "a decode x1 (1/3)", "a decode x2 (1/3)", "a decode x1 (2/3)", "a decode x2 (2/3)",
        "a decode x1 (3/3)", "a decode x2 (3/3)",
        "b decode x1 (1/3)", "b decode x2 (1/3)", "b decode x1 (2/3)", "b decode x2 (2/3)",
        "b decode x1 (3/3)", "b decode x2 (3/3)",
        "together decode (1/3)", "together decode (2/3)", "together decode (3/3)"]
    assert [t.restart for t in log[:6]] == [0, 0, 1, 1, 2, 2]
    assert len(log) == count_trials(ts, opts)
    dec = m.presets["a"]["decode"]
    x1, x2 = dec.lane(1), dec.lane(2)
    # trials at 1, 3 and 2 times the base: the median trial (2x) counts, not the mean nor the last
    assert x1.trials_bw == pytest.approx((1e8, 3e8, 2e8)) and x1.bw_bytes == pytest.approx(2e8)
    assert x2.trials_bw == pytest.approx((2e8, 6e8, 4e8)) and x2.bw_bytes == pytest.approx(4e8)
    assert x2.trials_spread_pct == pytest.approx(100.0)                 # (6 - 2) / 4
    # every window of every trial is kept; their spread: (6.6 - 1.8) / 4 (the median of nine)
    assert len(x2.runs_bw) == 9 and x2.spread_pct == pytest.approx(120.0)
    assert x2.iops == pytest.approx(4e8 / dec.piece_bytes)
    assert x2.requests == 24 and x2.lat_ns.p50 == 2_000_000            # latencies pooled over the trials
    assert (dec.best_lanes, dec.bw_bytes, dec.trials_bw, dec.trials_spread_pct) == (2, x2.bw_bytes, x2.trials_bw, 100.0)
    # together: each trial's total is the median of its shared windows, the group's the median trial's
    g, = m.together
    assert [leg.lanes for leg in log[-1].legs] == [2, 2]
    assert g.trials_bw == pytest.approx((3e8, 9e8, 6e8)) and g.bw_bytes == pytest.approx(6e8)
    assert [x.bw_bytes for x in g.members] == pytest.approx([4e8, 2e8])
    assert len(g.runs_bw) == 9 and g.members[0].lat_ns.p50 == 2_000_000


def test_trials_that_agree_are_not_restarted_a_third_time():
    # the first two trials 0.5 % apart: no third, for each lane count and for the together run;
    # 5 % apart: the third runs
    ts = targets("a", "b")
    opts = RunOptions(presets=("decode",), lanes=(1, 2), restarts=3, weights=(1, 1))
    log = []
    m = run_plan(measure(ts, opts, {"a": False, "b": False}), restart_runner(log, slow=(1, 1.005, 3)))
    assert [t.label for t in log] == [
        "a decode x1 (1/3)", "a decode x2 (1/3)", "a decode x1 (2/3)", "a decode x2 (2/3)",
        "b decode x1 (1/3)", "b decode x2 (1/3)", "b decode x1 (2/3)", "b decode x2 (2/3)",
        "together decode (1/3)", "together decode (2/3)"]
    assert len(log) < count_trials(ts, opts)                          # count_trials: the most it takes
    x1 = m.presets["a"]["decode"].lane(1)
    assert x1.trials_bw == pytest.approx((1e8, 1.005e8)) and x1.bw_bytes == pytest.approx(1.0025e8)
    log = []
    run_plan(measure(ts, opts, {"a": False, "b": False}), restart_runner(log, slow=(1, 1.05, 3)))
    assert len(log) == count_trials(ts, opts) == 15


def test_one_stalled_trial_moves_nothing():
    def trial(rate):
        return StreamRun("a", 2, MiB, ((rate, rate / MiB),) * 3, (1_000_000,) * 4, 4, rate, None, 0)
    steady = lane_result([trial(2.00e8), trial(0.50e8), trial(2.02e8)], False)
    assert steady.bw_bytes == 2.00e8 and steady.trials_spread_pct == pytest.approx(100 * 1.52 / 2.00)
    one = lane_result([trial(2.00e8)], False)
    assert one.trials_bw == () and one.trials_spread_pct == 0.0 and one.runs_bw == (2.00e8,) * 3


def test_restarts_by_default_for_decode_only_and_checked():
    opts = RunOptions()
    assert [opts.restarts_for(p) for p in ("seq", "prefill", "decode", "rand4k")] == [1, 1, 3, 1]
    # one drive, every preset: seq x8, prefill x1..x16, decode x1..x4 three times, rand4k x1 and x16
    assert count_trials(targets("a"), opts) == 1 + 5 + 4 * 3 + 2
    assert RunOptions(restarts=2).restarts_for("seq") == 2
    for bad in (0, 21):
        with pytest.raises(UsageError, match="--restarts"):
            check_options(targets("a"), RunOptions(presets=("seq",), restarts=bad))
    m = run_plan(measure(targets("a"), RunOptions(presets=("seq", "decode"), lanes=(1,), weights=(1,)), {"a": False}),
                 restart_runner([]))
    assert run_settings(RunOptions(presets=("seq", "decode")), m)["restarts"] == {"seq": 1, "decode": 3}


def test_topology_groups_are_added_unless_measured_already():
    from core.topology import DISK, USB_HUB, DriveTopology, Link, Topology, group_drives
    drives = (DriveTopology("internal", "a", (Link(DISK, "d0", "nvme0n1"),)),
              DriveTopology("green", "b", (Link(DISK, "d1", "sdc"), Link(USB_HUB, "h", "2-1"))),
              DriveTopology("white", "c", (Link(DISK, "d2", "sdd"), Link(USB_HUB, "h", "2-1"))))
    topo = Topology("sysfs", drives, group_drives(drives))
    names = ["internal", "green", "white"]
    opts = schedule.with_topology(RunOptions(presets=("seq",), restarts=1), topo, names)
    assert opts.groups == (("hub-2-1", ("green", "white")),) and opts.topology_groups == ("hub-2-1",)
    assert count_trials(targets(*names), opts) == count_trials(targets(*names), RunOptions(presets=("seq",), restarts=1)) + 1
    given = RunOptions(groups=(("hub", ("white", "green")),))
    assert schedule.with_topology(given, topo, names) == given                 # a --group measures that set
    taken = schedule.with_topology(RunOptions(groups=(("hub-2-1", ("internal", "green")),)), topo, names)
    assert taken.groups[-1] == ("hub-2-1-2", ("green", "white"))
    everyone = (drives[0], DriveTopology("green", "b", (Link(DISK, "d0", "nvme0n1"),)))
    assert schedule.with_topology(RunOptions(), Topology("sysfs", everyone, group_drives(everyone)),
                                  ["internal", "green"]).groups == ()       # the together run measures all
