"""`engine-bridge autotune` and `PatternMeasure`: the planner's measured-tuner logic driven by the
real split reader executing the target engine's read pattern, on small generated models (a GGUF
ds4-argodrive reads, a safetensors directory colibri reads) with three copies."""

import json
import os
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from core.errors import Interrupted, UsageError
from engine_bridge.cli import app
from engine_bridge.tuning.embedded import PatternMeasure, autotune, reader_concurrency, render, timed_rate, tuner_measure
from engine_bridge.reader.split_reader import SplitReader
from engines.pattern import Concurrency, Setup
from engines.registry import get_engine
from models.modelset import discover
from models.tensortable import inspect_model
from planner.plan import Source
from planner.plans import load_plan, plan_files
from planner.solve import Problem
from planner.workload import model_workload
from tests.planner.helpers import NAMES, colibri_copies_in, drives3, gguf_copies_in, make_rig, rig_on

runner = CliRunner()
DS4, COLIBRI = "ds4-argodrive", "colibri"
@pytest.fixture(scope="module")
def gguf_copies(tmp_path_factory):
    """A synthesised GGUF and two byte-identical copies (distinct inodes): their paths, primary first."""
    return gguf_copies_in(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def colibri_copies(tmp_path_factory):
    """A synthesised colibri directory and two copies: their paths, primary first."""
    return colibri_copies_in(tmp_path_factory.mktemp("colibri"))


def problem_of(engine, paths):
    """The problem of the model at paths[0] for `engine` on make_rig's three drive models."""
    g = inspect_model(discover(paths[0]))
    return Problem(get_engine(engine), g, drives3()[:len(paths)], model_workload(g).phases)


class Ticks:
    """A clock that moves one second each time it is read: `timed_rate` with no warm-up then runs
    exactly ceil(seconds) steps."""

    def __init__(self):
        self.now = -1.0

    def __call__(self):
        self.now += 1.0
        return self.now


# -- PatternMeasure ----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine,weights,mode", [
    (DS4, (2, 1, 1), ()),
    (DS4, (1, 3, 2), ()),
    (COLIBRI, (2, 1, 1), ()),
    (COLIBRI, (1, 2, 3), ("direct",)),
])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_pattern_measure_reads_what_the_engines_pattern_gives_each_source(engine, weights, mode, phase, request):
    """Two passes over the phase's steps: the reader's counters of the phase (bytes and pieces each
    source was given and read) are what the engine's patterns of those steps give each source."""
    paths = request.getfixturevalue("gguf_copies" if engine == DS4 else "colibri_copies")
    p = problem_of(engine, paths)
    steps = p.phases[phase].steps
    m = PatternMeasure([discover(x) for x in paths], p, warmup=0.0, rest=0.0, clock=Ticks())
    assert m(phase, weights, 2 * len(steps), frozenset(mode)) > 0
    assert Counter(m.steps) == Counter(steps * 2)                     # every step twice, whatever the order
    setup = Setup(weights, frozenset(mode))
    want_bytes = np.sum([p.engine.pattern(p.geometry, st, setup).source_bytes(3) for st in m.steps], axis=0)
    want_pieces = np.sum([p.engine.pattern(p.geometry, st, setup).source_pieces(3) for st in m.steps], axis=0)
    got = next(x for x in m.stats.phases if x.phase == phase)
    assert [s.given_bytes for s in got.sources] == [s.bytes for s in got.sources] == want_bytes.tolist()
    assert [s.given_pieces for s in got.sources] == [s.reads for s in got.sources] == want_pieces.tolist()
    assert sum(b > 0 for b in want_bytes) >= 2                         # the reads really were split
    other = next(x for x in m.stats.phases if x.phase != phase)
    assert other.bytes == 0 and not m.stats.events


def test_o_direct_windows_read_more_than_the_buffered_pattern(colibri_copies):
    """colibri's mode is part of the pattern: with O_DIRECT the same experts cost their windows."""
    p = problem_of(COLIBRI, colibri_copies)
    m = PatternMeasure(colibri_copies, p, warmup=0.0, rest=0.0, clock=Ticks())
    n = len(p.phases["decode"].steps)
    m("decode", (1, 1, 1), n)
    buffered = next(x for x in m.stats.phases if x.phase == "decode").bytes
    m("decode", (1, 1, 1), n, frozenset({"direct"}))
    direct = next(x for x in m.stats.phases if x.phase == "decode").bytes
    assert direct > buffered > 0


def test_pattern_measure_reads_one_drive_alone(gguf_copies):
    p = problem_of(DS4, gguf_copies)
    m = PatternMeasure(gguf_copies, p, warmup=0.0, rest=0.0, clock=Ticks())
    assert m("decode", (1,), 3, sources=gguf_copies[2:]) > 0
    got = next(x for x in m.stats.phases if x.phase == "decode")
    assert len(got.sources) == 1 and got.sources[0].bytes == sum(
        p.engine.pattern(p.geometry, st, Setup((1,))).source_bytes(1)[0] for st in m.steps)


def test_pattern_measure_rests_before_each_trial_with_the_reader_open(gguf_copies, monkeypatch):
    """No reads for `rest` seconds right before a trial's first read (a limiter then forgets the
    budget the previous trial left unused), once per trial; rest 0 does not wait at all."""
    p = problem_of(DS4, gguf_copies)
    reads, rests = [], []
    real = SplitReader.submit_read

    def submit_read(self, *a, **k):
        reads.append(len(rests))
        return real(self, *a, **k)

    def sleep(s):       # each read records how many rests came before it: 0 would be a read before the rest
        rests.append(s)

    monkeypatch.setattr(SplitReader, "submit_read", submit_read)
    m = PatternMeasure(gguf_copies, p, warmup=0.0, rest=0.25, sleep=sleep, clock=Ticks())
    assert m("decode", (2, 1, 1), 2) > 0 and rests == [0.25] and reads and set(reads) == {1}
    assert m("decode", (1,), 2, sources=gguf_copies[1:2]) > 0 and rests == [0.25, 0.25] and set(reads) == {1, 2}
    n = len(reads)
    assert PatternMeasure(gguf_copies, p, warmup=0.0, rest=0.0, sleep=sleep, clock=Ticks())("decode", (1, 1, 1), 2) > 0
    assert rests == [0.25, 0.25] and len(reads) > n


def test_every_trial_starts_at_the_same_step_in_an_order_the_seed_shuffles(gguf_copies):
    p = problem_of(DS4, gguf_copies)
    m = PatternMeasure(gguf_copies, p, seed=3, warmup=0.0, rest=0.0, clock=Ticks())
    m("decode", (1, 1, 1), 5)
    first = list(m.steps)
    m("decode", (2, 1, 1), 5)
    assert m.steps == first and len(first) == 5
    other = PatternMeasure(gguf_copies, p, seed=4, warmup=0.0, rest=0.0, clock=Ticks())
    other("decode", (1, 1, 1), 5)
    assert other.steps != first


def test_pattern_measure_refuses_a_mode_the_engine_has_not(gguf_copies):
    m = PatternMeasure(gguf_copies, problem_of(DS4, gguf_copies), warmup=0.0, rest=0.0, clock=Ticks())
    with pytest.raises(UsageError, match="ds4-argodrive has no switches"):
        m("decode", (1, 1, 1), 1, frozenset({"direct"}))


def test_reader_concurrency_keeps_the_engines_reads_in_flight():
    assert reader_concurrency(get_engine(DS4).concurrency("prefill"), 3) == (8, None)      # 8 per drive
    assert reader_concurrency(get_engine(DS4).concurrency("decode"), 3) == (3, None)       # a pool of 9 pieces
    assert reader_concurrency(get_engine(COLIBRI).concurrency("decode"), 3) == (8, 8)      # 8 whole reads
    assert reader_concurrency(Concurrency(shared=9), 2) == (5, None)


def test_the_tuners_key_measures_the_state_on_screen(gguf_copies, tmp_path):
    """`engine-bridge tune`'s `m`: the state's sources on the rig, its problem, phase, weights and mode."""
    rig = rig_on(tmp_path / "rig", gguf_copies)
    p = problem_of(DS4, gguf_copies)
    state = SimpleNamespace(sources=tuple(Source(n, x) for n, x in zip(NAMES, gguf_copies)), problem=p,
                            phase="decode", weights=lambda: (2, 1, 1), mode=frozenset())
    assert tuner_measure(rig.root, 2, warmup=0.0, rest=0.0, clock=Ticks())(state) > 0


# -- autotune --------------------------------------------------------------------------------------

def test_autotune_measures_every_candidate_each_round_and_writes_the_measured_best(gguf_copies, tmp_path):
    rig = rig_on(tmp_path / "rig", gguf_copies)
    seen = []
    plan, path = autotune(rig.root, budget_s=600.0, trial_s=0.02, top=2, rounds=2, warmup_s=0.0, rest_s=0.0,
                          on_trial=lambda t, arm: seen.append((t.round, arm.phase, arm.weights)))
    assert os.path.dirname(path) == rig.plans_dir and load_plan(path) == plan
    auto = plan.provenance["autotune"]
    arms = [(a["phase"], tuple(a["weights"])) for a in auto["arms"]]
    assert [(p, w) for _, p, w in seen] == arms + arms[::-1]            # ABBA over both phases
    assert auto["rounds_done"] == 2 and not auto["stopped_by_budget"] and len(auto["trials"]) == 2 * len(arms)
    assert auto["warmup_s"] == 0.0 and auto["rest_s"] == 0.0 and auto["engine"] == DS4 and not auto["joint"]
    for ph in ("prefill", "decode"):
        m = getattr(plan, ph).measured
        assert m["picked_by"] == "measured" and m["n"] == 2 and m["rounds"] == [0, 1]
        assert all(c["measured_Bps"] > 0 and len(c["runs_Bps"]) == 2 and c["mode"] == [] for c in m["candidates"])
        best = max(m["candidates"], key=lambda c: c["measured_Bps"])
        assert list(getattr(plan, ph).weights) == best["weights"] and m["throughput_Bps"] == best["measured_Bps"]
        assert getattr(plan, ph).predicted["weights"] == best["weights"]
        assert {"capability", "equal", "model #1"} <= {r for c in m["candidates"] for r in c["roles"]}
    assert plan.workload["name"] == "model" and plan.geometry["layers"] == 2 and plan.geometry["experts"] == 8


def test_autotune_measures_colibris_candidates_on_both_phases_and_picks_them_jointly(colibri_copies, tmp_path):
    rig = rig_on(tmp_path / "rig", colibri_copies)
    plan, path = autotune(rig.root, engine=COLIBRI, budget_s=600.0, trial_s=0.02, top=2, rounds=2, warmup_s=0.0,
                          rest_s=0.0)
    assert plan.engine == COLIBRI and plan.prefill.weights == plan.decode.weights
    auto = plan.provenance["autotune"]
    assert auto["joint"] and auto["rounds_done"] == 2 and len(auto["trials"]) == 2 * len(auto["arms"])
    pre, dec = plan.prefill.measured, plan.decode.measured
    cands = [(c["weights"], c["mode"]) for c in pre["candidates"]]
    assert cands == [(c["weights"], c["mode"]) for c in dec["candidates"]]
    assert any(c["mode"] == ["direct"] for c in pre["candidates"])       # the engine's modes are candidates
    assert all(c["measured_Bps"] > 0 and "objective" in c for c in pre["candidates"] + dec["candidates"])
    picked = next(c for c in pre["candidates"] if c["weights"] == list(plan.prefill.weights)
                  and c["mode"] == sorted(plan.switches))
    assert picked["objective"] == min(c["objective"] for c in pre["candidates"])
    assert pre["picked_by"] == dec["picked_by"] == "measured"
    text = render(plan, path)
    assert text.count("jointly by measurement") == 2 and text.count("<- picked") == 2


def test_cli_writes_the_plan_as_json(gguf_copies, tmp_path):
    rig = rig_on(tmp_path / "rig", gguf_copies)
    args = ["autotune", "--rig", rig.root, "--seconds", "0.01", "--warmup", "0", "--rest", "0", "--rounds", "1", "--top", "1"]
    r = runner.invoke(app, args + ["--quiet", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert set(d["decode"]) == {"weights", "predicted", "measured"} and d["decode"]["measured"]["n"] == 1
    assert load_plan(d["path"]).decode.weights == tuple(d["decode"]["weights"])
    assert d["workload"]["engine"] == DS4 and r.stderr == ""
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    out = shown.stdout.splitlines()
    arms = len(d["provenance"]["autotune"]["arms"])
    assert out[0].startswith(f"autotune: 1 of 1 rounds, {arms} of {arms} trials in ") and "prefill:" in out and "decode:" in out
    assert sum(line.endswith("<- picked") for line in out) == 2 and out[-1].startswith("plan written to ")
    assert shown.stderr.count("autotune: round 1 ") == arms


def test_cli_lanes_and_threads_override_the_engines_concurrency(gguf_copies, tmp_path):
    rig = rig_on(tmp_path / "rig", gguf_copies)
    r = runner.invoke(app, ["autotune", "--rig", rig.root, "--seconds", "0.01", "--warmup", "0", "--rest", "0",
                            "--rounds", "1", "--top", "1", "--lanes", "2", "--threads", "4", "--quiet", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["provenance"]["model"]["concurrency"] == {"prefill": {"per_source": 2, "shared": None},
                                                      "decode": {"per_source": None, "shared": 4}}
    assert d["provenance"]["autotune"]["lanes"] == 2 and d["provenance"]["autotune"]["threads"] == 4


def test_the_summary_says_how_many_trials_of_the_planned_rounds_ran(gguf_copies, tmp_path):
    """A budget that cuts the second round short: the first line counts the rounds begun and the
    trials done of those planned, and says the budget stopped the run."""
    rig = rig_on(tmp_path / "rig", gguf_copies)
    now = [0.0]

    def measure(phase, weights, seconds, mode):
        now[0] += seconds + 0.8
        return 100.0 * sum(weights)

    def run(budget):
        return autotune(rig.root, budget_s=budget, trial_s=4.0, top=1, rounds=2, measure=measure,
                        clock=lambda: now[0], warmup_s=0.5, rest_s=0.3)

    whole, path = run(600.0)
    arms = len(whole.provenance["autotune"]["arms"])
    assert render(whole, path).splitlines()[0].startswith(f"autotune: 2 of 2 rounds, {2 * arms} of {2 * arms} trials in ")
    now[0] = 0.0
    plan, path = run(4.8 * (arms + 1) + 0.1)        # trials of 4 s + 0.8 s: one round and one trial fit
    auto = plan.provenance["autotune"]
    assert auto["stopped_by_budget"] and len(auto["trials"]) == arms + 1
    first = render(plan, path).splitlines()[0]
    assert first == (f"autotune: 2 of 2 rounds, {arms + 1} of {2 * arms} trials in {auto['wall_s']:.0f} s "
                     f"(budget {auto['budget_s']:.0f} s, stopped by the budget)")


@pytest.mark.parametrize("args", [["--budget", "0"], ["--seconds", "-1"], ["--warmup", "-1"], ["--rest", "-0.1"],
                                  ["--budget", "1"], ["--budget", "4.7"], ["--budget", "2", "--seconds", "1.5"]])
def test_cli_bad_budget_is_one_line_and_writes_no_plan(tmp_path, gguf_copies, args):
    """`--budget 1` with 4 s trials (plus the 0.5 s warm-up and 0.3 s rest) fits no trial: refused
    before anything is solved or read, and no plan becomes the newest."""
    rig = rig_on(tmp_path / "rig", gguf_copies)
    r = runner.invoke(app, ["autotune", "--rig", rig.root] + args)
    assert r.exit_code == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("engine-bridge: error: ") and "Traceback" not in r.output
    assert plan_files(rig) == []
    if args[:2] == ["--budget", "1"]:
        assert "one trial takes 4.8 s" in lines[0]


def test_a_run_that_measured_nothing_writes_no_plan(gguf_copies, tmp_path):
    rig = rig_on(tmp_path / "rig", gguf_copies)
    with pytest.raises(Interrupted, match="no plan written"):
        autotune(rig.root, budget_s=600.0, trial_s=1.0, warmup_s=0.0, rest_s=0.0, stop=lambda: True,
                 measure=lambda *a: pytest.fail("measured after stop"))
    assert plan_files(rig) == []


def test_cli_without_a_bench_result_is_exit_3(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    r = runner.invoke(app, ["autotune", "--rig", str(root)])
    assert r.exit_code == 3 and "iobench run" in r.stderr


def test_a_rig_whose_model_cannot_be_read_is_refused_in_one_line(tmp_path):
    """Random bytes at the rig's paths: there is no engine read pattern to execute on them."""
    rig, _ = make_rig(tmp_path / "rig")
    data = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    for m in (rig.model,) + rig.replicas:
        with open(m.path, "wb") as f:
            f.write(data)
    r = runner.invoke(app, ["autotune", "--rig", rig.root, "--seconds", "0.01", "--warmup", "0", "--rest", "0"])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "reads of the rig's own model" in lines[0] and plan_files(rig) == []


def test_an_engine_that_cannot_read_the_rigs_model_is_one_line(gguf_copies, colibri_copies, tmp_path):
    for engine, paths in ((COLIBRI, gguf_copies), (DS4, colibri_copies)):
        rig = rig_on(tmp_path / engine, paths)
        r = runner.invoke(app, ["autotune", "--rig", rig.root, "--engine", engine, "--seconds", "0.01"])
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and f"--engine {DS4 if engine == COLIBRI else COLIBRI}" in lines[0]


class StepClock:
    """A clock that moves only when a step runs: each step takes the next of `durations`."""

    def __init__(self, durations):
        self.now, self.durations = 0.0, list(durations)

    def __call__(self):
        return self.now

    def step(self, nbytes):
        def run():
            self.now += self.durations.pop(0)
            return nbytes
        return run


def test_timed_rate_leaves_the_warm_up_out_and_takes_the_slope():
    # a fast start (a throttle's saved budget: 4 steps of 0.01 s) inside the warm-up, then steps of
    # 0.1 s, one of them late (0.3 s): the slope through every step's end, not bytes over the last
    # end, and nothing of the warm-up
    clock = StepClock([0.01] * 4 + [0.1] * 10 + [0.3] + [0.1] * 10)
    rate = timed_rate(clock.step(1_000_000), 1.85, warmup=0.035, clock=clock)
    assert len(clock.durations) == 4              # 4 warm-up steps, then 17 until 1.9 s >= 1.85 s
    t = np.cumsum([0.0] + [0.1] * 10 + [0.3] + [0.1] * 6)
    want = np.polyfit(t, np.arange(18) * 1_000_000.0, 1)[0]
    assert rate == pytest.approx(want, rel=1e-9)
    assert abs(rate / (17 * 1_000_000 / 1.9) - 1) > 0.01     # bytes over the last end would differ


def test_timed_rate_without_warm_up_counts_from_the_first_step():
    clock = StepClock([0.5, 0.5])
    assert timed_rate(clock.step(100), 1.0, warmup=0.0, clock=clock) == pytest.approx(200.0)


def test_an_interrupted_autotune_is_130_and_writes_no_plan_latest_would_take(gguf_copies, tmp_path):
    """Ctrl-C after the first trial: exit 130, and what was measured kept outside rig/plans (it became
    `latest`, which export and run then took as if the budget had been measured)."""
    from core.errors import Interrupted

    rig = rig_on(tmp_path / "rig", gguf_copies)
    done = []
    with pytest.raises(Interrupted) as e:
        autotune(rig.root, budget_s=600.0, trial_s=0.02, top=2, rounds=2, warmup_s=0.0, rest_s=0.0,
                 on_trial=lambda t, arm: done.append(t), stop=lambda: len(done) >= 1)
    assert e.value.exit_code == 130 and "not a plan in rig/plans" in str(e.value)
    assert not os.path.isdir(rig.plans_dir) or os.listdir(rig.plans_dir) == []
    kept = str(e.value).split("what was measured is in ")[1].split(",")[0]
    assert load_plan(kept).provenance["autotune"]["interrupted"]


def test_a_pick_on_one_trial_per_candidate_says_so(gguf_copies, tmp_path):
    rig = rig_on(tmp_path / "rig", gguf_copies)
    plan, path = autotune(rig.root, budget_s=600.0, trial_s=0.02, top=2, rounds=1, warmup_s=0.0, rest_s=0.0)
    assert "measured once per candidate: not confirmed by a second round" in render(plan, path)
    plan, path = autotune(rig.root, budget_s=600.0, trial_s=0.02, top=2, rounds=2, warmup_s=0.0, rest_s=0.0)
    assert "measured once" not in render(plan, path)
