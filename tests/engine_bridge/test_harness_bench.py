"""run_bench and the bench/ladder commands with a replaceable runner (no engine processes)."""

import json
import os

import pytest
from typer.testing import CliRunner

from core.errors import MissingError, UsageError
from core.rig import Member, Rig, save_rig
from engine_bridge.cli import app
from engine_bridge.harness import runner as harness
from engine_bridge.harness.arms import Snapshot
from engine_bridge.harness.runner import (
    ArmFailed,
    engine_command,
    ladder_specs,
    resolve_arm,
    run_bench,
    snapshot,
    write_arm_plan,
)
from planner.plans import load_plan


@pytest.fixture
def rig(tmp_path):
    paths = []
    for name in ("internal", "green", "white"):
        p = tmp_path / name / "model.gguf"
        p.parent.mkdir()
        p.write_bytes(b"x" * 8192)
        paths.append(str(p))
    r = Rig(root=str(tmp_path / "rig"), model=Member(paths[0], "internal", "primary"),
            replicas=(Member(paths[1], "green", "replica"), Member(paths[2], "white", "replica")))
    save_rig(r)
    return r


def fake_runner(speeds, calls, fail=()):
    """Tok/s proportional to the arm's source count; same hash everywhere; plan file read back."""
    def run(spec, settings, workdir, seq):
        calls.append((seq, spec.name, settings))
        if spec.name in fail:
            raise ArmFailed("exit 3: drive gone")
        plan = load_plan(os.path.join(workdir, "plans", f"{spec.name}.json"))
        assert [s.path for s in plan.sources] == list(spec.sources)
        k = len(spec.sources)
        return {"prefill_tps": speeds[0] * k, "gen_tps": speeds[1] * k, "gen_steady_tps": speeds[1] * k,
                "gen_first_ms": 3.0, "ctx_tokens": 10, "prefill_tokens": 8, "gen_tokens": 2, "gen_steady_tokens": 1,
                "kvcache_bytes": 0, "output_sha256": "f" * 64, "cache_experts": settings.get("cache_experts") or 64,
                "cache_experts_applied": settings.get("cache_experts") or 64, "hits": 1, "misses": 1,
                "misses_per_token": 0.5, "events": [],
                "sources": [{"index": i, "degraded": False} for i in range(k)]}, ""
    return run


def quiet_probe():
    return Snapshot(t=0.0)


def test_run_bench_writes_the_run_folder(rig, tmp_path):
    calls = []
    specs = ladder_specs([m.path for m in rig.members], (2, 1, 1), (10, 6, 6))
    assert [s.name for s in specs] == ["1drive", "2drives", "3drives"]
    assert specs[1].prefill_weights == (2, 1) and specs[2].decode_weights == (10, 6, 6)
    out = tmp_path / "run"
    doc, paths = run_bench(specs, "ladder", {"cache_experts": 32}, str(out), runner=fake_runner((10, 2), calls),
                           probe=quiet_probe)
    assert [c[1] for c in calls] == "1drive 2drives 1drive 3drives 3drives 1drive 2drives 1drive".split()
    assert all(r["ok"] for r in doc["rows"])
    assert doc["gains"]["3drives"]["prefill_tps"] == pytest.approx(3.0)
    assert doc["claims"]["2drives"]["prefill_tps"] == "gain"
    for key in ("results", "summary", "chart", "csv"):
        assert os.path.getsize(paths[key]) > 0
    assert json.load(open(paths["results"]))["kind"] == "bench-results"
    assert open(paths["csv"]).read().splitlines()[0].startswith("seq,arm,ok,failed,ctx_tokens,prefill_tokens")
    assert sorted(os.listdir(out / "arms"))[0] == "00-1drive.json"


def test_failed_arm_is_kept_and_labelled(rig, tmp_path):
    specs = [resolve_arm("A", "1", rig), resolve_arm("B", "2:1/10:6", rig)]
    doc, _ = run_bench(specs, "ABBA", {}, str(tmp_path / "o"), runner=fake_runner((10, 2), [], fail=("B",)),
                       probe=quiet_probe)
    assert [r["failed"] for r in doc["rows"]] == [[], ["error"], ["error"], []]
    assert doc["rows"][1]["error"] == "exit 3: drive gone"
    assert doc["medians"]["B"]["n"] == 0 and doc["gains"]["B"]["prefill_tps"] is None


def test_resolve_arm_inline_and_plan(rig, tmp_path):
    a = resolve_arm("s", "10:5:5/10:6:6", rig)
    assert a.sources == tuple(m.path for m in rig.members) and a.decode_weights == (10, 6, 6)
    plan_file = write_arm_plan(a, str(tmp_path / "p.json"))
    b = resolve_arm("p", plan_file, rig)
    assert (b.sources, b.prefill_weights, b.decode_weights, b.plan) == (a.sources, a.prefill_weights,
                                                                        a.decode_weights, plan_file)
    os.makedirs(os.path.join(rig.root, "plans"))
    os.rename(plan_file, os.path.join(rig.root, "plans", "best.json"))
    assert resolve_arm("p", "best", rig).prefill_weights == (10, 5, 5)
    with pytest.raises(UsageError, match="3 weights but the rig"):
        resolve_arm("x", "1:1:1", Rig(root=rig.root, model=rig.model))
    with pytest.raises(UsageError, match="at most 3 sources"):
        resolve_arm("x", "1:1:1:1", rig)
    with pytest.raises(UsageError, match="decode weights"):
        resolve_arm("x", "2:1/1", rig)
    with pytest.raises(Exception, match="no such plan file"):
        resolve_arm("x", "nope.json", rig)


def test_engine_command():
    from engine_bridge.harness.arms import ArmSpec
    spec = ArmSpec("A", ("/m", "/r"), (2, 1), (2, 1))
    cmd = engine_command(spec, {"prompt_tokens": 64, "gen_tokens": None, "cache_experts": 8, "lanes": 2,
                                "run_args": ["--cached"], "wrap": ["drives", "run", "--"]}, "/p.json")
    assert cmd[:3] == ["drives", "run", "--"]
    i = cmd.index("--model") - 1
    assert cmd[i:i + 6] == ["run", "--model", "/m", "--plan", "/p.json", "--json"]
    assert "--gen-tokens" not in cmd and cmd[cmd.index("--cache-experts") + 1] == "8" and cmd[-1] == "--cached"
    # with a rig the arm's run takes its model from it (a split set or a directory says so there)
    cmd = engine_command(spec, {"rig": "/rig"}, "/p.json")
    i = cmd.index("--rig") - 1
    assert cmd[i:i + 6] == ["run", "--rig", "/rig", "--plan", "/p.json", "--json"] and "--model" not in cmd


@pytest.mark.parametrize("measured, weights", [({"internal": 783.0, "green": 36.0, "white": 853.0}, (92, 4, 100)),
                                               ({"internal": 900.0, "green": 0.0, "white": 450.0}, (100, 1, 50)),
                                               (None, (2, 1, 2))])
def test_the_stall_benchs_measured_half_reference_is_a_plan_a_run_accepts(tmp_path, measured, weights):
    """What the drives deliver in MB/s (hundreds) is put in a plan's terms, 1..100 the fastest 100:
    a plan of the raw figures was refused and stopped a bench (docs/reader.md "Round 37")."""
    from bench.stall_bench import best_weights, spec_for
    assert best_weights(measured) == weights
    paths = [str(tmp_path / n) for n in ("a", "b", "c")]
    spec = spec_for("half", "best", paths, best_weights(measured))
    plan = load_plan(write_arm_plan(spec, str(tmp_path / "best.json")))
    assert plan.prefill.weights == weights and plan.decode.weights == weights


def test_snapshot_reads_proc():
    s = snapshot()
    assert s.t > 0 and s.cpu_busy_s > 0 and s.own_cpu_s > 0 and s.swap_free_kb >= 0 and s.pswpout >= 0


def test_cli_bench_and_ladder(rig, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(harness, "subprocess_runner", fake_runner((10, 2), calls))
    monkeypatch.setattr(harness, "snapshot", quiet_probe)
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    res = runner.invoke(app, ["bench", "--rig", rig.root, "--arm", "one=1", "--arm", "two=2:1", "--order", "BAAB",
                              "--cache-experts", "16", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["sequence"] == ["two", "one", "one", "two"] and doc["control"] == "one"
    (stamp,) = os.listdir(os.path.join(rig.root, "runs"))
    assert os.path.exists(os.path.join(rig.root, "runs", stamp, "results.json"))
    assert calls[0][2]["cache_experts"] == 16
    res = runner.invoke(app, ["ladder", "--rig", rig.root, "--weights", "2:1:1", "--out", str(tmp_path / "lad")])
    assert res.exit_code == 0, res.output
    assert "3drives" in res.stdout and "3.00" in res.stdout
    assert "bench: arm 1/8" in res.stderr                  # each arm's progress, unless --quiet
    res = runner.invoke(app, ["ladder", "--rig", rig.root, "--weights", "2:1:1", "--out", str(tmp_path / "q"), "-q"])
    assert res.exit_code == 0 and res.stderr == "" and "3drives" in res.stdout
    assert os.path.exists(tmp_path / "lad" / "results.json")
    res = runner.invoke(app, ["ladder", "--rig", rig.root])
    assert res.exit_code == 3 and "no plan" in res.stderr
    res = runner.invoke(app, ["bench", "--rig", rig.root, "--arm", "one=1", "--order", "ABBA"])
    assert res.exit_code == 2 and "at least two arms" in res.stderr


def test_cli_bench_exit_1_on_hash_mismatch(rig, tmp_path, monkeypatch):
    def run(spec, settings, workdir, seq):
        r, log = fake_runner((10, 2), [])(spec, settings, workdir, seq)
        r["output_sha256"] = ("e" if spec.name == "two" else "f") * 64
        return r, log
    monkeypatch.setattr(harness, "subprocess_runner", run)
    monkeypatch.setattr(harness, "snapshot", quiet_probe)
    res = CliRunner().invoke(app, ["bench", "--rig", rig.root, "--arm", "one=1", "--arm", "two=2:1"])
    assert res.exit_code == 1
    assert "differs from the reference in arm(s) two" in res.output


def test_subprocess_runner_runs_the_real_engine(tmp_path):
    """One real arm in a fresh process (engine-bridge run --json), one that fails and is labelled."""
    import shutil
    import subprocess
    import sys

    from engine_bridge.harness.arms import ArmSpec

    model = tmp_path / "m.gguf"
    subprocess.run([sys.executable, "-c", "from engine_bridge.cli import main; main()", "synth", str(model),
                    "--layers", "2", "--experts", "4", "--top-k", "2", "--dim", "256", "--ff", "256", "--vocab", "64"],
                   check=True, capture_output=True)
    replica = tmp_path / "r.gguf"
    shutil.copyfile(model, replica)
    ok = ArmSpec("two", (str(model), str(replica)), (2, 1), (1, 1))
    gone = ArmSpec("gone", (str(model), str(tmp_path / "missing.gguf")), (2, 1), (2, 1))
    settings = {"prompt_tokens": 8, "gen_tokens": 3, "cache_experts": 2, "lanes": 2}
    calls = []

    def runner(spec, settings, workdir, seq):
        calls.append(spec.name)
        return harness.subprocess_runner(spec, settings, workdir, seq)

    # the failing arm exits at once, so ABAB costs two real engine runs
    doc, paths = run_bench([ok, gone], "ABAB", settings, str(tmp_path / "run"), runner=runner, repeat=1)
    rows = doc["rows"]
    assert [r["arm"] for r in rows] == ["two", "gone", "two", "gone"]
    assert rows[0]["output_sha256"] and rows[0]["output_sha256"] == rows[2]["output_sha256"]
    assert rows[0]["gates"]["sha"]["ok"] and rows[0]["gates"]["cache"]["ok"] and rows[0]["gates"]["swap"]["ok"]
    assert rows[0]["metrics"]["cache_experts_applied"] == 2 and rows[0]["metrics"]["prefill_tokens"] == 8
    assert [s["index"] for s in rows[0]["sources"]] == [0, 1]
    assert rows[1]["failed"] == ["error"] and "exit 3" in rows[1]["error"] and "missing.gguf" in rows[1]["error"]
    assert os.path.exists(rows[0]["log"]) and "--plan" in open(rows[0]["log"]).readline()


def test_cli_ladder_uses_newest_plan(rig, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(harness, "subprocess_runner", fake_runner((10, 2), calls))
    monkeypatch.setattr(harness, "snapshot", quiet_probe)
    os.makedirs(os.path.join(rig.root, "plans"))
    write_arm_plan(resolve_arm("p", "10:5:5/10:6:6", rig), os.path.join(rig.root, "plans", "solved.json"))
    res = CliRunner().invoke(app, ["ladder", "--rig", rig.root, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    assert doc["arms"]["2drives"]["prefill_weights"] == [10, 5] and doc["arms"]["3drives"]["decode_weights"] == [10, 6, 6]
    assert [c[1] for c in calls] == doc["sequence"] and len(calls) == 8


def test_run_folder_and_the_arms_the_commands_ask_for(rig, tmp_path):
    from engine_bridge.harness.runner import bench_arms, ladder_arms, run_folder

    empty = tmp_path / "empty"
    assert run_folder(str(empty), None) == str(empty)                  # created, used as it is
    (empty / "old.txt").write_text("x")
    fresh = run_folder(str(empty), None)                               # not empty: a new folder inside
    assert os.path.dirname(fresh) == str(empty) and os.listdir(fresh) == []
    assert os.path.dirname(run_folder(None, rig)) == os.path.join(rig.root, "runs")
    with pytest.raises(UsageError, match="no --out DIR and no rig"):
        run_folder(None, None)
    plan_file = write_arm_plan(resolve_arm("p", "10:5:5/10:6:6", rig), str(tmp_path / "p.json"))
    specs, r = bench_arms([f"a={plan_file}", "b=2:1"], rig.root)
    assert [s.sources for s in specs] == [tuple(m.path for m in rig.members), tuple(m.path for m in rig.members[:2])]
    specs, r = bench_arms([f"a={plan_file}"], str(tmp_path / "no-rig"))    # plan files need no rig
    assert specs[0].prefill_weights == (10, 5, 5) and r.model is None
    specs, _ = ladder_arms(rig.root, plan=plan_file)
    assert [s.decode_weights for s in specs] == [(10,), (10, 6), (10, 6, 6)]
    specs, _ = ladder_arms(rig.root, weights="2:1:1")
    assert [s.prefill_weights for s in specs] == [(2,), (2, 1), (2, 1, 1)] and specs[2].decode_weights == (2, 1, 1)
    with pytest.raises(UsageError, match="either --plan or --weights"):
        ladder_arms(rig.root, plan=plan_file, weights="2:1:1")
    with pytest.raises(MissingError, match="no rig at"):
        ladder_arms(str(tmp_path / "no-rig"), weights="2:1")
    save_rig(Rig(root=str(tmp_path / "bare")))
    with pytest.raises(UsageError, match="has no model"):
        ladder_arms(str(tmp_path / "bare"), weights="2:1")


def _cli_runner():
    return CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()


def test_cli_bench_exit_1_when_a_configuration_has_no_passing_arm(rig, monkeypatch):
    monkeypatch.setattr(harness, "subprocess_runner", fake_runner((10, 2), [], fail=("two",)))
    monkeypatch.setattr(harness, "snapshot", quiet_probe)
    res = _cli_runner().invoke(app, ["bench", "--rig", rig.root, "--arm", "one=1", "--arm", "two=2:1"])
    assert res.exit_code == 1, res.output
    out = res.stdout.splitlines()
    assert any(line.split()[:2] == ["two", "0/2"] for line in out)
    assert "arm 2/4 two FAILED error: exit 3: drive gone" in out and "arm 3/4 two FAILED error: exit 3: drive gone" in out
    err = [x for x in res.stderr.splitlines() if x.startswith("engine-bridge: error: ")]
    assert len(err) == 1 and err[0].startswith("engine-bridge: error: no passing arm for two (failed: error); "
                                               "nothing measured for it; see ")


def test_cli_ladder_names_each_failed_gate_and_exits_1(rig, tmp_path, monkeypatch):
    def run(spec, settings, workdir, seq):
        r, log = fake_runner((10, 2), [])(spec, settings, workdir, seq)
        if spec.name == "3drives":
            r["cache_experts_applied"] = 32          # the engine did not honour the requested cache
        return r, log
    monkeypatch.setattr(harness, "subprocess_runner", run)
    monkeypatch.setattr(harness, "snapshot", quiet_probe)
    res = _cli_runner().invoke(app, ["ladder", "--rig", rig.root, "--weights", "2:1:1", "--cache-experts", "64",
                                     "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)                      # stdout holds only the JSON
    failed = [r["seq"] for r in doc["rows"] if not r["ok"]]
    assert failed == [3, 4] and doc["medians"]["2drives"]["n"] == 2
    lines = res.stderr.splitlines()
    for seq in failed:
        assert f"arm {seq + 1}/8 3drives FAILED cache: cache 32 experts applied, 64 requested" in lines
    assert lines[-1].startswith("engine-bridge: error: no passing arm for 3drives (failed: cache)")


def test_a_control_that_never_ran_is_not_called_a_hash_mismatch(rig, tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "subprocess_runner", fake_runner((10, 2), [], fail=("one",)))
    monkeypatch.setattr(harness, "snapshot", quiet_probe)
    res = _cli_runner().invoke(app, ["bench", "--rig", rig.root, "--arm", "one=1", "--arm", "two=2:1"])
    assert res.exit_code == 1, res.output
    assert "differs from the reference" not in res.stderr
    assert "no passing arm for one, two (failed: error, sha)" in res.stderr
    assert "arm 2/4 two FAILED sha: no reference hash (the reference arm never completed)" in res.stdout.splitlines()


def test_an_arm_running_its_plan_keeps_the_plans_prediction_so_run_can_flag_an_idle_source(rig, tmp_path):
    from engine_bridge.harness.runner import ladder_arms
    from planner.plan import Phase, Plan, Source, plan_to_dict

    paths = tuple(m.path for m in rig.members)
    pred = {"sources": [{"name": n, "blocks": b, "bytes": b * 262_144} for n, b in (("i", 13), ("g", 6), ("w", 6))]}
    solved = Plan(sources=tuple(Source(n, p) for n, p in zip(("i", "g", "w"), paths)),
                  prefill=Phase((2, 1, 1), {"sources": []}), decode=Phase((2, 1, 1), pred),
                  workload={"decode": {"read_bytes": 6_635_520}}, provenance={"model": {"decode": {"read_bytes": 6_635_520}}})
    src = tmp_path / "solved.json"
    src.write_text(json.dumps(plan_to_dict(solved)))
    specs, _ = ladder_arms(rig.root, plan=str(src))
    assert [s.plan for s in specs] == ["", "", str(src)]             # only the rung that runs the plan's sources
    arm = load_plan(write_arm_plan(specs[2], str(tmp_path / "3.json")))
    assert arm.decode.predicted == pred and arm.workload == solved.workload
    assert arm.provenance["model"] == solved.provenance["model"] and arm.provenance["from"] == str(src)
    two = load_plan(write_arm_plan(specs[1], str(tmp_path / "2.json")))
    assert two.decode.predicted == {} and two.workload == {}          # two drives: the plan's prediction does not apply
    specs, _ = ladder_arms(rig.root, plan=str(src), decode_weights="10:6:6")
    other = load_plan(write_arm_plan(specs[2], str(tmp_path / "o.json")))
    assert other.decode.predicted == {} and other.prefill.predicted == {"sources": []}   # per phase: weights as planned
