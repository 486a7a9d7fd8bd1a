"""`engine-bridge autotune`: the planner's measured-tuner logic driven by the real split reader on
real replica files (small workloads, so the files stay small)."""

import json
import os
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from engine_bridge.cli import app
from engine_bridge.commands.autotune import SplitMeasure, autotune, render, timed_rate
from engine_bridge.reader.split_reader import SplitReader
from planner.model import decode_workload, prefill_workload
from planner.plans import load_plan
from tests.planner.helpers import make_rig

runner = CliRunner()


def rig_with_replicas(root, size):
    """make_rig's three drives, with byte-identical files of `size` bytes at their paths."""
    rig, bench = make_rig(root)
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8).tobytes()
    for m in (rig.model,) + rig.replicas:
        with open(m.path, "wb") as f:
            f.write(data)
    return rig


SMALL = {"prefill": prefill_workload(lanes=2, chunk=1 << 20), "decode": decode_workload(batch=3, threads=9, length=300_000)}


def test_autotune_measures_every_candidate_each_round_and_writes_the_measured_best(tmp_path):
    rig = rig_with_replicas(tmp_path / "rig", 4 << 20)
    seen = []
    plan, path = autotune(rig.root, None, SMALL, budget_s=600.0, trial_s=0.02, top=2, rounds=2, warmup_s=0.0, rest_s=0.0,
                          on_trial=lambda t, arm: seen.append((t.round, arm.phase, arm.weights)))
    assert os.path.dirname(path) == rig.plans_dir and load_plan(path) == plan
    auto = plan.provenance["autotune"]
    arms = [(a["phase"], tuple(a["weights"])) for a in auto["arms"]]
    assert [(p, w) for _, p, w in seen] == arms + arms[::-1]            # ABBA over both phases
    assert auto["rounds_done"] == 2 and not auto["stopped_by_budget"] and len(auto["trials"]) == 2 * len(arms)
    assert auto["warmup_s"] == 0.0 and auto["rest_s"] == 0.0
    for ph in ("prefill", "decode"):
        m = getattr(plan, ph).measured
        assert m["picked_by"] == "measured" and m["n"] == 2 and m["rounds"] == [0, 1]
        assert all(c["measured_Bps"] > 0 and len(c["runs_Bps"]) == 2 for c in m["candidates"])
        best = max(m["candidates"], key=lambda c: c["measured_Bps"])
        assert list(getattr(plan, ph).weights) == best["weights"] and m["throughput_Bps"] == best["measured_Bps"]
        assert getattr(plan, ph).predicted["weights"] == best["weights"]
        assert {"capability", "equal", "model #1"} <= {r for c in m["candidates"] for r in c["roles"]}


def test_split_measure_rests_before_each_trial_with_the_reader_open(tmp_path, monkeypatch):
    """No reads for `rest` seconds right before a trial's first read (a limiter then forgets the
    budget the previous trial left unused), once per trial; rest 0 does not wait at all."""
    rig = rig_with_replicas(tmp_path / "rig", 4 << 20)
    paths = [rig.model.path] + [r.path for r in rig.replicas]
    reads, rests = [], []
    real = SplitReader.read_many

    def read_many(self, *a, **k):
        reads.append(len(rests))
        return real(self, *a, **k)

    def sleep(s):       # each read records how many rests came before it: 0 would be a read before the rest
        rests.append(s)

    monkeypatch.setattr(SplitReader, "read_many", read_many)
    m = SplitMeasure(paths, SMALL, warmup=0.0, rest=0.25, sleep=sleep)
    assert m("decode", (2, 1, 1), 0.01) > 0 and rests == [0.25] and reads and set(reads) == {1}
    assert m("decode", (1,), 0.01, sources=paths[1:2]) > 0 and rests == [0.25, 0.25] and set(reads) == {1, 2}
    n = len(reads)
    assert SplitMeasure(paths, SMALL, warmup=0.0, rest=0.0, sleep=sleep)("decode", (1, 1, 1), 0.01) > 0
    assert rests == [0.25, 0.25] and len(reads) > n


def test_split_measure_refuses_files_smaller_than_one_read(tmp_path):
    rig = rig_with_replicas(tmp_path / "rig", 1 << 20)
    m = SplitMeasure([rig.model.path] + [r.path for r in rig.replicas], dict(SMALL, prefill=prefill_workload(2, 2 << 20)),
                     rest=0.0)
    with pytest.raises(UsageError, match="less than one prefill read"):
        m("prefill", (1, 1, 1), 0.01)
    assert m("decode", (2, 1, 1), 0.01) > 0


def test_cli_writes_the_plan_as_json(tmp_path):
    rig = rig_with_replicas(tmp_path / "rig", 33 << 20)        # one 32 MiB prefill chunk fits
    r = runner.invoke(app, ["autotune", "--rig", rig.root, "--seconds", "0.01", "--warmup", "0", "--rest", "0", "--rounds", "1", "--top", "1",
                            "--quiet", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert set(d["decode"]) == {"weights", "predicted", "measured"} and d["decode"]["measured"]["n"] == 1
    assert load_plan(d["path"]).decode.weights == tuple(d["decode"]["weights"])
    assert r.stderr == ""
    shown = runner.invoke(app, ["autotune", "--rig", rig.root, "--seconds", "0.01", "--warmup", "0", "--rest", "0", "--rounds", "1", "--top", "1"])
    assert shown.exit_code == 0, shown.output
    out = shown.stdout.splitlines()
    arms = len(d["provenance"]["autotune"]["arms"])
    assert out[0].startswith(f"autotune: 1 of 1 rounds, {arms} of {arms} trials in ") and "prefill:" in out and "decode:" in out
    assert sum(line.endswith("<- picked") for line in out) == 2 and out[-1].startswith("plan written to ")
    assert shown.stderr.count("autotune: round 1 ") == len(d["provenance"]["autotune"]["arms"])


def test_the_summary_says_how_many_trials_of_the_planned_rounds_ran(tmp_path):
    """A budget that cuts the second round short: the first line counts the rounds begun and the
    trials done of those planned, and says the budget stopped the run."""
    rig = rig_with_replicas(tmp_path / "rig", 4 << 20)
    now = [0.0]

    def measure(phase, weights, seconds):
        now[0] += seconds + 0.8
        return 100.0 * sum(weights)

    def run(budget):
        return autotune(rig.root, None, SMALL, budget_s=budget, trial_s=4.0, top=1, rounds=2, measure=measure,
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


@pytest.mark.parametrize("args,code", [(["--budget", "0"], 2), (["--seconds", "-1"], 2), (["--warmup", "-1"], 2),
                                       (["--rest", "-0.1"], 2)])
def test_cli_bad_budget_is_one_line(tmp_path, args, code):
    rig = rig_with_replicas(tmp_path / "rig", 1 << 20)
    r = runner.invoke(app, ["autotune", "--rig", rig.root] + args)
    assert r.exit_code == code
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("engine-bridge: error: ") and "Traceback" not in r.output


def test_cli_without_a_bench_result_is_exit_3(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    r = runner.invoke(app, ["autotune", "--rig", str(root)])
    assert r.exit_code == 3 and "iobench run" in r.stderr


def test_the_rig_s_own_model_sets_the_reads_and_the_plan_records_them(tmp_path):
    """A synthesised GGUF (557,056 B components) at the rig's three paths: autotune plans and
    measures that model's reads, as `planner solve` does, and the plan says so."""
    from engine_bridge.engine.synth import SynthSpec, check_spec, synthesize

    rig, _ = make_rig(tmp_path / "rig")
    synthesize(rig.model.path, check_spec(SynthSpec(2, 16, 2, 512, 1024, 256, 1, "q8_0")), lambda done, total: None)
    for r in rig.replicas:
        shutil.copyfile(rig.model.path, r.path)
    r = runner.invoke(app, ["autotune", "--rig", rig.root, "--seconds", "0.01", "--warmup", "0", "--rest", "0", "--rounds", "1", "--top", "1",
                            "--quiet", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["workload"]["name"] == "model" and d["workload"]["decode"]["read_bytes"] == 557_056
    assert d["geometry"]["layers"] == 2 and d["geometry"]["experts"] == 16
    assert d["decode"]["predicted"]["sources"][0]["bytes"] + sum(s["bytes"] for s in d["decode"]["predicted"]["sources"][1:]) == 557_056
    assert d["decode"]["measured"]["n"] == 1 and r.stderr == ""


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
