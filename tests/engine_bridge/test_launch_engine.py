"""engine-bridge launch against a stand-in engine: a small program, written here, that reads
the profile's environment and arguments like ds4 does, really reads every source file it is
given, and prints the engine's confirmation lines and a ds4-bench CSV (or leaves some out)."""

import json
import os
import stat
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from engine_bridge.cli import app
from engine_bridge.profiles.export import export_profile
from engine_bridge.profiles.launch import _wait, launch_arm
from tests.engine_bridge.export_helpers import make_rig, write_plan

runner = CliRunner()

KNOWN = ("DS4_ARGODRIVE_PRIMARY_WEIGHT", "DS4_ARGODRIVE_REPLICAS", "DS4_ARGODRIVE_DECODE_WEIGHTS",
         "DS4_ARGODRIVE_PREFILL_SPLIT", "DS4_ARGODRIVE_PREFILL_SELECTIVE", "DS4_ARGODRIVE_PREFILL_AHEAD",
         "DS4_ARGODRIVE_PREFILL_LANES", "DS4_METAL_STREAMING_EXPERT_PREAD_THREADS",
         "DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY")

ENGINE = '''\
#!{python}
# Stand-in for ds4-bench. Variables it reads: {known}
import os, sys, time
OMIT, CAP, ZERO, EXIT, SLEEP, REJECT = {omit!r}, {cap!r}, {zero!r}, {exit!r}, {sleep!r}, {reject!r}
args = sys.argv[1:]
err = sys.stderr
for k in sorted(os.environ):
    if k.startswith("DS4_"):
        print("env " + k + "=" + os.environ[k], file=err)
print("argv " + " ".join(args), file=err)
model = args[args.index("-m") + 1]
cache = int(args[args.index("--ssd-streaming-cache-experts") + 1])
reps = os.environ.get("DS4_ARGODRIVE_REPLICAS", "")
paths = [model] + [r.rsplit("*", 1)[0] for r in reps.split(",") if r]
if reps and "sources" not in OMIT:
    print("ds4: experimental Argodrive expert reader sources=%d; Engram unchanged" % len(paths), file=err)
dw = os.environ.get("DS4_ARGODRIVE_DECODE_WEIGHTS", "")
if reps and dw and "decode" not in OMIT:
    if len(dw.split(",")) == len(paths):
        print("ds4: Argodrive decode split %s (prefill keeps the base weights)" % dw, file=err)
    else:
        print("ds4: ignoring DS4_ARGODRIVE_DECODE_WEIGHTS=%s (want %d comma-separated weights 1..100)" % (dw, len(paths)),
              file=err)
if REJECT:
    print("ds4: Argodrive prefill stage rejected: reader invalid=0 sources=1", file=err)
time.sleep(SLEEP)
header = "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,gen_first_ms,gen_steady_tokens,gen_steady_tps,kvcache_bytes"
csv = [header, "512,512,43.6,128,17.1,210.5,127,17.4,1048576"]
out = sys.stdout
if "--csv" in args:
    out = open(args[args.index("--csv") + 1], "w")
if "csv" not in OMIT:
    out.write("\\n".join(csv) + "\\n")
    out.flush()
if "cache" not in OMIT and os.environ.get("DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY"):
    print("ds4:   streaming expert cache budget=%d experts entries=10 hit_rate=0.5" % (min(cache, CAP) if CAP else cache),
          file=err)
if reps and "bytes" not in OMIT:
    for i, p in enumerate(paths):
        with open(p, "rb") as f:
            n = 0 if i in ZERO else len(f.read(65536))
        print("ds4: Argodrive source[%d] bytes=%d" % (i, n), file=err)
sys.exit(EXIT)
'''


def stand_in(tmp_path, omit=(), cap=0, zero=(), exit=0, sleep=0, reject=False, known=KNOWN, name="ds4-bench"):
    path = tmp_path / name
    path.write_text(ENGINE.format(python=sys.executable, known=" ".join(known), omit=set(omit), cap=cap,
                                  zero=set(zero), exit=exit, sleep=sleep, reject=reject))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def exported(tmp_path, drives=3, prefill=(10, 5, 5), decode=(10, 6, 6), cache=4600):
    root, paths, _ = make_rig(tmp_path, drives)
    plan = write_plan(tmp_path, paths, prefill[:drives], decode[:drives])
    res = export_profile(rig_root=root, plan_path=plan, fmt="ds4-argodrive", cache_experts=cache)
    return root, paths, res.files[1]


def test_a_confirmed_arm(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_ARGODRIVE_PSO_CACHE", "0")       # inherited: must not reach the engine
    monkeypatch.setenv("DS4_STALE_KNOB", "1")
    monkeypatch.setenv("HARNESS_MARK", "kept")
    root, paths, prof = exported(tmp_path)
    r = launch_arm(stand_in(tmp_path), prof, ["--ctx-start", "512"], run_dir=str(tmp_path / "run"))
    assert r.ok and r.failed == () and r.returncode == 0, r.confirmations
    assert r.metrics["prefill_tps"] == 43.6 and r.metrics["gen_steady_tps"] == 17.4
    assert r.cache_experts_applied == 4600
    assert [c.expected for c in r.confirmations if c.name == "cache-budget"] == ["4600"]
    assert r.dead_knobs == ()
    log = open(r.stderr_path).read()
    env = dict(line[4:].split("=", 1) for line in log.splitlines() if line.startswith("env "))
    assert env["DS4_ARGODRIVE_REPLICAS"] == f"{paths[1]}*5,{paths[2]}*5"
    assert env["DS4_ARGODRIVE_DECODE_WEIGHTS"] == "10,6,6"
    assert "DS4_ARGODRIVE_PSO_CACHE" not in env and "DS4_STALE_KNOB" not in env
    assert f"argv --ssd-streaming -m {paths[0]} --ssd-streaming-cache-experts 4600 --ctx-start 512" in log
    assert open(r.csv_path).read().startswith("ctx_tokens,prefill_tokens")
    record = json.load(open(os.path.join(r.run_dir, "launch.json")))
    assert list(record) == ["schema", "kind", "ok", "failed", "profile", "profile_file", "binary", "argv", "environment",
                            "dead_knobs", "returncode", "confirmations", "metrics", "csv_rows", "run_dir", "stdout",
                            "stderr", "csv", "started", "seconds", "tok_s", "calibration", "calibration_plan",
                            "engine_said", "cwd"]
    assert record["kind"] == "launch" and record["ok"] is True


@pytest.mark.parametrize("omit, name", [("sources", "sources"), ("decode", "decode-split"),
                                        ("bytes", "source-bytes"), ("cache", "cache-budget")])
def test_a_missing_confirmation_fails_the_arm_by_name(tmp_path, omit, name):
    root, paths, prof = exported(tmp_path)
    r = runner.invoke(app, ["launch", "--binary", stand_in(tmp_path, omit={omit}), "--profile", prof,
                            "--out", str(tmp_path / "run")])
    assert r.exit_code == 1, r.output
    assert f"arm failed, not confirmed by the engine log: {name} (" in r.stderr
    assert json.load(open(tmp_path / "run" / "launch.json"))["failed"] == [name]


def test_reduced_cache_zero_bytes_rejection_and_exit_code(tmp_path):
    root, paths, prof = exported(tmp_path)
    capped = launch_arm(stand_in(tmp_path, cap=4000), prof, run_dir=str(tmp_path / "a"))
    assert capped.failed == ("cache-budget",) and capped.cache_experts_applied == 4000
    assert launch_arm(stand_in(tmp_path, zero={2}), prof, run_dir=str(tmp_path / "b")).failed == ("source-bytes",)
    assert launch_arm(stand_in(tmp_path, reject=True), prof, run_dir=str(tmp_path / "c")).failed == ("prefill-staging",)
    r = launch_arm(stand_in(tmp_path, exit=3), prof, run_dir=str(tmp_path / "d"))
    assert r.failed == ("exit",) and r.returncode == 3


def test_a_source_the_plan_leaves_idle_may_read_nothing(tmp_path):
    # 3 blocks and a tail over 10:5:1: the plan's decode read gives source 2 no block, and its
    # workload names it idle in decode; a run whose source 2 read nothing is what the plan said
    root, paths, _ = make_rig(tmp_path, 3)
    plan = write_plan(tmp_path, paths, (10, 5, 1), (10, 5, 1))
    doc = json.load(open(plan))
    doc["decode"]["predicted"] = {"sources": [{"name": s["name"], "bytes": b}
                                              for s, b in zip(doc["sources"], (524_288, 262_144, 0))]}
    doc["workload"] = {"idle": {"decode": {"sources": [doc["sources"][2]["name"]], "why": "no block"}}}
    json.dump(doc, open(plan, "w"))
    prof = export_profile(rig_root=root, plan_path=plan, fmt="ds4-argodrive", cache_experts=4600).files[1]
    r = launch_arm(stand_in(tmp_path, zero={2}), prof, run_dir=str(tmp_path / "idle"))
    assert r.ok, r.confirmations
    c = {x.name: x for x in r.confirmations}["source-bytes"]
    assert "source[2] served 0 bytes, expected idle: the plan gives it nothing in decode" in c.detail
    # source 1 the plan gives bytes: reading nothing still fails the arm
    r = launch_arm(stand_in(tmp_path, zero={1, 2}), prof, run_dir=str(tmp_path / "busy"))
    assert r.failed == ("source-bytes",) and "source[1] read 0 bytes" in r.confirmations[3].detail


def test_timeout_stops_the_engine(tmp_path):
    root, paths, prof = exported(tmp_path, drives=2)
    r = launch_arm(stand_in(tmp_path, sleep=30), prof, run_dir=str(tmp_path / "run"), timeout=0.5)
    assert r.returncode is None and "exit" in r.failed


def test_single_drive_arm_and_csv_to_a_file(tmp_path, monkeypatch):
    """The engine runs where the user stands: a relative --csv is the user's file, read from there."""
    root, paths, prof = exported(tmp_path, drives=1, prefill=(1,), decode=(1,), cache=3600)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    r = launch_arm(stand_in(tmp_path), prof, ["--csv", "bench.csv"], run_dir=str(tmp_path / "run"))
    assert r.ok, r.confirmations
    assert r.csv_path == str(tmp_path / "here" / "bench.csv") and r.metrics["ctx_tokens"] == 512
    assert r.cwd == str(tmp_path / "here") and not os.path.exists(tmp_path / "run" / "bench.csv")


def test_the_engine_opens_the_users_relative_paths(tmp_path, monkeypatch):
    """README's own example passes `--prompt-file prompt.txt`: the engine must find it where the
    user stands, not in the run folder."""
    root, paths, prof = exported(tmp_path)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "prompt.txt").write_text("Tell me about drives.")
    monkeypatch.chdir(tmp_path / "here")
    engine = tmp_path / "prompted"
    engine.write_text(f"#!/bin/sh\n[ -r prompt.txt ] || {{ echo \"cannot open prompt file prompt.txt (cwd $(pwd))\" >&2; "
                      f"exit 1; }}\nexec {stand_in(tmp_path)} \"$@\"\n# {' '.join(KNOWN)}\n")
    engine.chmod(0o755)
    r = runner.invoke(app, ["launch", "--binary", str(engine), "--profile", prof, "--out", str(tmp_path / "run"),
                            "--", "--prompt-file", "prompt.txt"])
    assert r.exit_code == 0, r.output


def test_an_engine_that_exits_non_zero_is_named_with_its_own_last_line(tmp_path):
    """Not a table blaming mirrors, weights and bytes: the exit is the verdict, in the engine's words."""
    root, paths, prof = exported(tmp_path)
    engine = tmp_path / "dies"
    engine.write_text(f"#!/bin/sh\necho loading >&2\necho 'engine: cannot load model: out of memory' >&2\nexit 3\n"
                      f"# {' '.join(KNOWN)}\n")
    engine.chmod(0o755)
    r = runner.invoke(app, ["launch", "--binary", str(engine), "--profile", prof, "--out", str(tmp_path / "run")])
    assert r.exit_code == 1, r.output
    assert "the engine exited 3: engine: cannot load model: out of memory" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("engine-bridge: error: the engine exited 3: engine: cannot load")
    record = json.load(open(tmp_path / "run" / "launch.json"))
    assert record["engine_said"] == "engine: cannot load model: out of memory"
    judged = {c["name"]: c for c in record["confirmations"]}
    assert judged["exit"]["observed"] == "3"
    assert all(c["detail"] == "not judged: the engine did not finish" for n, c in judged.items() if n != "exit" and not c["ok"])


def test_dead_knobs_are_listed_before_launching(tmp_path):
    root, paths, prof = exported(tmp_path)
    engine = stand_in(tmp_path, known=[k for k in KNOWN if k != "DS4_METAL_STREAMING_EXPERT_PREAD_THREADS"])
    r = runner.invoke(app, ["launch", "--binary", engine, "--profile", prof, "--out", str(tmp_path / "run"), "--json"])
    assert r.exit_code == 0, r.output
    first = r.stderr.splitlines()[0]
    assert first.startswith("dead knobs:") and "never names DS4_METAL_STREAMING_EXPERT_PREAD_THREADS" in first
    assert json.loads(r.stdout)["dead_knobs"] == ["DS4_METAL_STREAMING_EXPERT_PREAD_THREADS"]


def test_engine_args_after_double_dash_and_refusals(tmp_path):
    root, paths, prof = exported(tmp_path, drives=2)
    engine = stand_in(tmp_path)
    r = runner.invoke(app, ["launch", "--binary", engine, "--profile", prof.replace(".json", ".env"),
                            "--out", str(tmp_path / "run"), "--", "--ctx-start", "2048"])
    assert r.exit_code == 0, r.output
    assert "--ctx-start 2048" in open(tmp_path / "run" / "stderr.txt").read()
    r = runner.invoke(app, ["launch", "--binary", engine, "--profile", prof, "--", "-m", "/other"])
    assert r.exit_code == 2 and "already given by the profile" in r.stderr
    r = runner.invoke(app, ["launch", "--binary", str(tmp_path / "nope"), "--profile", prof])
    assert r.exit_code == 3 and "engine binary" in r.stderr and "no such file" in r.stderr


def test_a_bare_binary_name_is_found_on_path(tmp_path, monkeypatch):
    root, paths, prof = exported(tmp_path, drives=2)
    engine = stand_in(tmp_path, name="ds4-standin")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    r = launch_arm("ds4-standin", prof, run_dir=str(tmp_path / "run"))
    assert r.ok and r.binary == engine and r.argv[0] == engine


def test_the_engines_peak_memory_is_measured_in_bytes():
    """launch's wait reaps the engine with its own rusage: its peak resident memory in bytes (Linux
    counts KiB), here a child that touched 64 MiB."""
    proc = subprocess.Popen([sys.executable, "-c", "b = bytearray(64 << 20); b[::4096] = b'x' * 16384"])
    rc, peak, _ = _wait(proc, 60)
    assert rc == 0 and 64 << 20 <= peak < 1 << 30
