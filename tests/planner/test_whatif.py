"""planner whatif: a drive added (full or partial, measured or given) or removed, priced before a
byte is copied; the end-to-end gain from a run's read-wait share; the compute-bound verdict."""

import json
import os

import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from planner.barrier import SharedLink
from planner.cli import app
from planner.drivecurves import Background, Drive
from planner.rigmodel import RigProblem, problem_for_rig
from planner.solve import Problem
from planner.whatif import (
    COMPUTE_BOUND_SHARE,
    CandidateDrive,
    Timing,
    ceiling_curve,
    hottest_files,
    phase_changes,
    with_drive,
    without_drive,
)
from planner.whatifs import parse_ceiling, read_timing, whatif
from tests.helpers import impure_imports
from tests.planner.helpers import FAST, SLOW, make_dir_rig, make_rig, write_dir_model, write_small_gguf

runner = CliRunner()


def load_problem(root, bench, engine, **kw):
    return RigProblem(*problem_for_rig(root, bench, engine, **kw))


def _gguf_rig(tmp_path, names=("fast", "slow"), models=(FAST, SLOW)):
    rig, bench = make_rig(tmp_path / "rig", names=names, models=models)
    write_small_gguf(rig.model.path)
    return rig


def _run_result(path, prefill, decode):
    """A run result as the embedded engine writes it: (seconds, read_wait_seconds) per phase."""
    doc = {"schema": 1, "kind": "run", "engine": "ds4-argodrive",
           "prefill": {"seconds": prefill[0], "read_wait_seconds": prefill[1]},
           "decode": {"seconds": decode[0], "read_wait_seconds": decode[1]}}
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_pure_module_imports_no_io():
    import planner.whatif as m

    assert impure_imports(m) == []


def test_hottest_files_take_the_most_read_bytes_per_byte_first_up_to_the_fraction():
    sizes = {"a": 100, "b": 100, "c": 200, "d": 100}
    heat = {"a": 10.0, "b": 50.0, "c": 60.0, "d": 0.0}      # per byte: b 0.5, c 0.3, a 0.1; d never read
    assert hottest_files(heat, sizes, 0.2) == frozenset({"b"})
    assert hottest_files(heat, sizes, 0.6) == frozenset({"b", "c"})
    assert hottest_files(heat, sizes, 1.0) == frozenset({"a", "b", "c"})
    assert hottest_files(heat, sizes, 0.01) == frozenset({"b"})      # at least one file


def test_with_and_without_a_drive_keep_links_holds_and_background_work_in_step():
    from engines.registry import get_engine

    drives = (Drive("a", FAST), Drive("b", SLOW), Drive("c", SLOW))
    p = Problem(get_engine("colibri"), None, drives, {}, (Background(2, "busy", 0.5),), (SharedLink("hub", (1, 2), 1e8),),
                (None, frozenset({"x"}), None))
    q = without_drive(p, 1)
    assert [d.name for d in q.drives] == ["a", "c"]
    assert q.links == ()                                  # a link left with one drive is no constraint
    assert q.backgrounds == (Background(1, "busy", 0.5),)
    assert q.holds == (None, None)
    r = with_drive(p, CandidateDrive("d", SLOW, holds=frozenset({"y"})))
    assert [d.name for d in r.drives] == ["a", "b", "c", "d"] and r.holds[-1] == frozenset({"y"})
    with pytest.raises(UsageError, match="1..3 sources"):   # ds4 reads at most 3: a fourth is refused
        with_drive(Problem(get_engine("ds4-argodrive"), None, drives, {}), CandidateDrive("d", SLOW))


def test_the_end_to_end_gain_counts_only_the_reads_share_of_the_phase():
    before = {ph: {"weights": [1], "seconds": 2.0, "tok_s": 1.0} for ph in ("prefill", "decode")}
    after = {ph: {"weights": [1, 1], "seconds": 1.0, "tok_s": 2.0} for ph in ("prefill", "decode")}
    io_bound = phase_changes(before, after, Timing({"prefill": (10.0, 9.0), "decode": (10.0, 9.0)}, "x"))
    assert io_bound[0].gain == pytest.approx(1.0)
    assert io_bound[0].end_to_end == pytest.approx(1 / (0.1 + 0.9 * 0.5) - 1)          # +81.8 %
    assert not io_bound[0].compute_bound
    cpu_bound = phase_changes(before, after, Timing({"prefill": (10.0, 0.5), "decode": (10.0, 0.5)}, "x"))
    assert cpu_bound[1].end_to_end == pytest.approx(1 / (0.95 + 0.05 * 0.5) - 1)        # +2.6 %
    assert cpu_bound[1].compute_bound and 0.05 < COMPUTE_BOUND_SHARE
    assert phase_changes(before, after, None)[0].end_to_end is None


def test_ceilings_given_by_hand_make_a_drive_that_reads_up_to_them():
    c = parse_ceiling("usb=0.9@0.2/0.8", 1e-4)
    assert c.name == "usb" and c.write_Bps == pytest.approx(0.8e9)
    assert c.curve.throughput(32 << 20, 16) == pytest.approx(0.9e9)
    assert c.curve.request_time(4096, 1) == pytest.approx(0.2e-3 + 4096 / 0.9e9)
    assert parse_ceiling("x=2", 3e-4).curve.lat_s == pytest.approx(3e-4)   # the rig's latency by default
    for bad in ("usb", "usb=fast", "usb=-1", "usb=1/0"):
        with pytest.raises(UsageError):
            parse_ceiling(bad, 1e-4)


def test_adding_a_drive_is_priced_against_the_rigs_best_plan_and_a_removal_loses(tmp_path):
    rig = _gguf_rig(tmp_path)
    rp = load_problem(rig.root, None, "ds4-argodrive")
    add = whatif(rp, rig, add=CandidateDrive("usb", ceiling_curve(150e6, 2e-4), write_Bps=100e6))
    assert add.after == ("fast", "slow", "usb")
    assert all(len(p.weights_after) == 3 and p.gain > 0.1 for p in add.phases)    # a third drive of 150 MB/s on 200 + 100
    assert add.copy_bytes == os.path.getsize(rig.model.path)
    assert add.copy_s == pytest.approx(add.copy_bytes / add.write_Bps)
    assert add.pays and add.gain_per_GB(add.phases[1]) == pytest.approx(add.phases[1].gain / (add.copy_bytes / 1e9))
    gone = whatif(rp, rig, remove="slow")
    assert gone.after == ("fast",) and all(p.gain < 0 for p in gone.phases)
    assert gone.copy_bytes == 0 and gone.pays is None
    with pytest.raises(UsageError, match="not a drive"):
        whatif(rp, rig, remove="nope")


def test_a_compute_bound_machine_is_told_the_copy_would_not_pay(tmp_path):
    rig = _gguf_rig(tmp_path)
    rp = load_problem(rig.root, None, "ds4-argodrive")
    cand = CandidateDrive("usb", ceiling_curve(150e6, 2e-4), write_Bps=100e6)
    t = read_timing(_run_result(tmp_path / "run.json", (10.0, 0.2), (10.0, 0.3)), "ds4-argodrive")
    w = whatif(rp, rig, add=cand, timing=t)
    assert w.compute_bound == ("prefill", "decode") and w.pays is False
    assert all(p.end_to_end < 0.03 < p.gain for p in w.phases)
    assert "compute-bound" in w.verdict() and "would not pay" in w.verdict()
    io = whatif(rp, rig, add=cand, timing=read_timing(_run_result(tmp_path / "io.json", (10.0, 9.0), (10.0, 9.0)),
                                                      "ds4-argodrive"))
    assert io.pays and not io.compute_bound


def test_a_partial_member_holds_the_hottest_files_and_is_given_only_their_reads(tmp_path):
    model = write_dir_model(tmp_path / "m", "glm_moe_dsa", layers=4, experts=16, shards=4, dim=256, ff=128)
    rig, _ = make_dir_rig(tmp_path / "rig", model, names=("fast",), models=(FAST,))
    rp = load_problem(rig.root, None, "colibri", cache_experts=0)
    cand = CandidateDrive("usb", ceiling_curve(400e6, 5e-5), write_Bps=100e6)    # twice the primary's ceiling
    full = whatif(rp, rig, add=cand)
    part = whatif(rp, rig, add=cand, partial=0.5)
    shards = sorted(f for f in os.listdir(model) if f.endswith(".safetensors"))
    assert part.holds and set(part.holds) < set(shards)
    assert part.copy_bytes == sum(os.path.getsize(model / f) for f in part.holds) < full.copy_bytes
    assert any("partial" in n for n in part.notes)
    # it can serve only the experts of the files it holds: less than a full copy, more than nothing
    assert all(0 < p.gain < f.gain for p, f in zip(part.phases, full.phases))
    with pytest.raises(UsageError, match="full replicas"):        # ds4-argodrive reads only full replicas
        whatif(load_problem(_gguf_rig(tmp_path / "g").root, None, "ds4-argodrive"), _gguf_rig(tmp_path / "g2"),
               add=cand, partial=0.5)


def test_cli_whatif_json_and_the_one_change_rule(tmp_path):
    rig = _gguf_rig(tmp_path)
    r = runner.invoke(app, ["whatif", "--rig", rig.root, "--add-ceiling", "usb=0.15@0.2/0.1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "whatif" and d["schema"] == 1 and d["change"] == "add" and d["after"][-1] == "usb"
    assert d["copy_s"] == pytest.approx(d["copy_bytes"] / 0.1e9) and d["phases"][0]["gain_per_GB"] > 0
    r = runner.invoke(app, ["whatif", "--rig", rig.root, "--remove", "slow", "--add-ceiling", "x=1"])
    assert r.exit_code == 2 and "one change" in r.output


def test_cli_whatif_add_measures_a_scratch_file_on_the_drive_and_removes_it(tmp_path):
    rig = _gguf_rig(tmp_path)
    drive = tmp_path / "newdrive"
    drive.mkdir()
    (drive / "keep.bin").write_bytes(b"user data")
    r = runner.invoke(app, ["whatif", "--rig", rig.root, "--add", str(drive), "--name", "new", "--scratch-size", "48M",
                            "--preset", "seq,decode,rand4k", "--seconds", "0.05", "--repeat", "1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["drive"] == "new" and d["write_Bps"] > 0 and "measured by iobench" in d["how"]
    assert sorted(os.listdir(drive)) == ["keep.bin"]                  # the scratch file is gone, nothing else
    saved = os.listdir(os.path.join(rig.root, "bench", "scratch"))
    assert len(saved) == 1
    r = runner.invoke(app, ["whatif", "--rig", rig.root, "--add-bench", os.path.join(rig.root, "bench", "scratch", saved[0]),
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["drive"] == "new"


def test_a_runs_timing_comes_from_a_run_result_or_the_engines_own_log(tmp_path):
    t = read_timing(_run_result(tmp_path / "r.json", (4.0, 1.0), (8.0, 6.0)), "ds4-argodrive")
    assert t.read_share("prefill") == 0.25 and t.read_share("decode") == 0.75
    log = tmp_path / "colibri.log"
    log.write_text("PROFILO PREFILL (2.00s):\nPROFILE: expert-disk 1.000s service / 0.500s wait | expert-matmul 1.000s | "
                   "attention 0.300s (including kvb 0.000s) | lm_head 0.100s | other 0.100s\n")
    assert read_timing(str(log), "colibri").phases == {"prefill": (2.0, 0.5)}
    with pytest.raises(UsageError, match="gives no timing"):
        read_timing(str(log), "ds4-argodrive")
    (tmp_path / "empty.json").write_text(json.dumps({"schema": 1, "kind": "run", "prefill": {}}))
    with pytest.raises(UsageError, match="read_wait_seconds"):
        read_timing(str(tmp_path / "empty.json"), "ds4-argodrive")


def test_the_newest_harness_arm_of_the_engine_is_the_default_timing(tmp_path):
    from core.rig import Rig
    from planner.whatifs import latest_timing

    rig = Rig(root=str(tmp_path))
    assert latest_timing(rig, "ds4-argodrive") is None
    arms = tmp_path / "runs" / "20261201T000000Z" / "arms"
    arms.mkdir(parents=True)
    _run_result(arms / "01-a.json", (1.0, 0.5), (1.0, 0.5))
    later = tmp_path / "runs" / "20261202T000000Z" / "arms"
    later.mkdir(parents=True)
    _run_result(later / "01-b.json", (1.0, 0.1), (1.0, 0.1))
    t = latest_timing(rig, "ds4-argodrive")
    assert t.source.endswith("01-b.json") and t.read_share("decode") == pytest.approx(0.1)
    assert latest_timing(rig, "colibri") is None                        # another engine's runs say nothing


def test_a_drive_on_the_device_of_the_rigs_drives_is_priced_as_sharing_its_bandwidth(tmp_path):
    from planner.whatifs import same_device

    rig = _gguf_rig(tmp_path)
    rp = load_problem(rig.root, None, "ds4-argodrive")
    here = CandidateDrive("folder", ceiling_curve(150e6, 2e-4), path=str(tmp_path / "another-folder"))
    assert same_device(rp, here) == (0, 1)                    # every folder here is on tmp_path's device
    assert same_device(rp, CandidateDrive("given", ceiling_curve(150e6, 2e-4))) == ()   # ceilings name no device
    apart = whatif(rp, rig, add=here)
    shared = whatif(rp, rig, add=here, shares=(0, 1))
    assert any("on the device of fast, slow" in n for n in shared.notes)
    assert all(s.gain < a.gain for s, a in zip(shared.phases, apart.phases))


def test_a_removal_names_its_worst_phase():
    from planner.whatif import PhaseChange, WhatIf
    prefill = PhaseChange("prefill", (10, 5, 7), (3, 2), 1.0, 1.2, 10.0, 8.3, 0.74, -0.171)
    decode = PhaseChange("decode", (1, 1, 2), (1, 1), 1.0, 1.0, 2.0, 2.0, 0.84, 0.0)
    w = WhatIf("colibri", "remove", "green", ("a", "b", "c"), ("a", "b"), (prefill, decode), None, None, "", None,
               False, "", ())
    assert w.verdict() == "without green: prefill -17.1% end to end"
