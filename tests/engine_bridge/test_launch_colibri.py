"""engine-bridge launch with a colibri profile against a stand-in: a small program, written here,
that reads the variables like colibri's mirror_setup does, really reads each drive's shards, and
prints colibri's lines (c/colibri.c and c/st.h fprintf/printf formats, or c/glm53.c's) — or leaves
some out. The verdict on the lines alone is tested in tests/engines/test_colibri_launch.py."""

import json
import os
import stat
import sys

from typer.testing import CliRunner

from engine_bridge.cli import app
from engine_bridge.profiles.export import export_profile
from engine_bridge.profiles.launch import launch_arm
from engines.colibri import colibri_profile
from tests.engine_bridge.export_helpers import make_dir_rig, write_plan

CHECKS = colibri_profile.checks

runner = CliRunner()

COLI = '''\
#!{python}
# Stand-in for colibri's engine. Variables it reads: SNAP COLI_MODEL COLI_MODEL_MIRROR SNAP_MIRROR
# COLI_DISK_WEIGHTS COLI_MIR_STRIPE DIRECT PROF
import os, sys
SKIP, WEIGHTS, STATS, IDLE, GLM53 = {skip!r}, {weights!r}, {stats!r}, {idle!r}, {glm53!r}
err = sys.stderr
for k in sorted(os.environ):
    if k.startswith("COLI_") or k in ("SNAP", "SNAP_MIRROR", "DIRECT", "PROF"):
        print("env " + k + "=" + os.environ[k], file=err)
print("argv " + " ".join(sys.argv[1:]), file=err)
snap = os.environ.get("SNAP") or os.environ["COLI_MODEL"]
shards = sorted(n for n in os.listdir(snap) if n.endswith(".safetensors"))
spec = os.environ.get("COLI_MODEL_MIRROR") or os.environ.get("SNAP_MIRROR") or ""
drives = [snap]
for p in (x.strip(" ") for x in spec.replace(",", ";").split(";")):
    if not p:
        continue
    have = [n for n in shards if os.path.isfile(os.path.join(p, n))
            and os.path.getsize(os.path.join(p, n)) == os.path.getsize(os.path.join(snap, n))]
    if p in SKIP or not have:
        if GLM53:
            print("[GLM53 MIRROR] %s: no usable shards -- ignored" % p, file=err)
        else:
            print("[MIRROR] %s: no usable shard (missing or divergent copy) \\u2014 skipped" % p, file=err)
        continue
    if GLM53:
        print("[GLM53 MIRROR] replica %d: %s (%d/%d shards)" % (len(drives), p, len(have), len(shards)), file=err)
    else:
        print("[MIRROR] %s: %d/%d shards (replica %d)" % (p, len(have), len(shards), len(drives)), file=err)
    drives.append(p)
if len(drives) < 2:
    if not GLM53:
        print("[MIRROR] no usable mirror \\u2014 running on the primary drive only", file=err)
elif GLM53:
    # c/glm53.c glm53_mirror_setup: strtol weights, integer cuts, no statistics line
    w = os.environ.get("COLI_DISK_WEIGHTS", "")
    try:
        wt = [int(x) for x in w.split(",")] if WEIGHTS else []
    except ValueError:
        wt = []
    how = "COLI_DISK_WEIGHTS"
    if len(wt) != len(drives):
        if w:
            print("[GLM53 MIRROR] invalid COLI_DISK_WEIGHTS '%s' for %d drives; probing bandwidth" % (w, len(drives)),
                  file=err)
        wt, how = [1] * len(drives), "startup bandwidth probe"
    cuts, acc = [], 0
    for x in wt:
        acc += x
        cuts.append(min(max((256 * acc + sum(wt) // 2) // sum(wt), 1), 256))
    cuts[-1] = 256
    shares = ["%d%%" % ((100 * (c - (cuts[i - 1] if i else 0)) + 128) // 256) for i, c in enumerate(cuts)]
    print("[GLM53 MIRROR] %d drives | routing %s (%s)" % (len(drives), " / ".join(shares), how), file=err)
else:
    w = os.environ.get("COLI_DISK_WEIGHTS", "")
    wt = [float(x) for x in w.replace(" ", ",").split(",") if x] if WEIGHTS else []
    how = "COLI_DISK_WEIGHTS"
    if len(wt) != len(drives) or any(x <= 0 for x in wt):
        if w:
            print("[MIRROR] invalid COLI_DISK_WEIGHTS '%s' (want %d positive comma-separated weights, e.g. 9,3) "
                  "\\u2014 probing instead" % (w, len(drives)), file=err)
        wt, how = [1.0] * len(drives), "measured"
    cuts, acc, cum = [], 0, 0.0
    for x in wt:
        cum += x
        c = max(int(256.0 * cum / sum(wt) + 0.5), acc + 1)
        cuts.append(min(c, 256))
        acc = cuts[-1]
    cuts[-1] = 256
    shares = ["%.0f%%" % (100.0 * (c - (cuts[i - 1] if i else 0)) / 256) for i, c in enumerate(cuts)]
    print("[MIRROR] %d drives | read split %s (%s)" % (len(drives), " / ".join(shares), how), file=err)
    if STATS and os.environ.get("PROF") == "1":
        served = []
        for i, d in enumerate(drives):
            n = 0
            if i not in IDLE:
                for s in shards:
                    with open(os.path.join(d, s), "rb") as f:
                        n += len(f.read())
            served.append((n, len(shards) if n else 0))
        line = "MIRROR: primary %.2f GB (%d reads)" % (served[0][0] / 1e9, served[0][1])
        for i, (n, r) in enumerate(served[1:], 1):
            line += " | mirror%d %.2f GB (%d reads)" % (i, n / 1e9, r)
        print(line + " \\u2014 50%% of expert bytes from the mirrors")
sys.exit(0)
'''


def colibri_plan(*args, **kw):
    """A plan solved for colibri (`export_helpers.write_plan` for this engine)."""
    return write_plan(*args, engine="colibri", **kw)


def stand_in(tmp_path, skip=(), weights=True, stats=True, idle=(), glm53=False):
    path = tmp_path / "glm"
    path.write_text(COLI.format(python=sys.executable, skip=set(skip), weights=weights, stats=stats, idle=set(idle),
                                glm53=glm53))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def exported(tmp_path, drives=3, weights=(9, 3, 3), model_type="glm_moe_dsa", predicted_bytes=None):
    """A colibri profile of a directory rig; `predicted_bytes`: the bytes the plan predicts per
    drive in both phases (a 0 is a drive the plan leaves idle)."""
    root, dirs = make_dir_rig(tmp_path, drives, model_type=model_type)
    plan = colibri_plan(tmp_path, dirs, weights[:drives], weights[:drives])
    if predicted_bytes is not None:
        doc = json.load(open(plan))
        for ph in ("prefill", "decode"):
            doc[ph]["predicted"] = {"sources": [{"name": s["name"], "bytes": b}
                                                for s, b in zip(doc["sources"], predicted_bytes)]}
        json.dump(doc, open(plan, "w"))
    res = export_profile(rig_root=root, plan_path=plan, fmt="colibri", allow_unverified=True)
    return root, dirs, res.files[1]


def test_a_confirmed_colibri_arm_reports_what_each_drive_served(tmp_path, monkeypatch):
    monkeypatch.setenv("SNAP_MIRROR", "/stale/mirror")         # inherited: must not reach the engine
    monkeypatch.setenv("COLI_RAM", "16")                       # not the profile's: kept
    root, dirs, prof = exported(tmp_path)
    r = launch_arm(stand_in(tmp_path), prof, ["--ctx", "2048"], run_dir=str(tmp_path / "run"))
    assert r.ok and r.failed == () and r.returncode == 0, r.confirmations
    checks = {c.name: c for c in r.confirmations}
    assert list(checks) == list(CHECKS)
    assert checks["mirrors"].observed == f"{dirs[1]} 2/2 shards replica 1; {dirs[2]} 2/2 shards replica 2"
    assert checks["weights"].observed == "60/20/20"
    shard_bytes = sum(os.path.getsize(os.path.join(dirs[0], n)) for n in os.listdir(dirs[0]) if n.endswith(".safetensors"))
    gb = round(shard_bytes / 1e9, 2)                            # the line's two decimals
    assert checks["served"].observed == ", ".join(f"{d}:{round(gb * 1e9)}B/2r" for d in range(3))
    assert checks["served"].detail.startswith("primary ") and "mirror2" in checks["served"].detail
    log = open(r.stderr_path).read()
    env = dict(line[4:].split("=", 1) for line in log.splitlines() if line.startswith("env "))
    assert env == {"COLI_MODEL": dirs[0], "SNAP": dirs[0], "COLI_MODEL_MIRROR": f"{dirs[1]};{dirs[2]}",
                   "COLI_DISK_WEIGHTS": "9,3,3", "PROF": "1", "COLI_RAM": "16"}
    assert "argv --ctx 2048" in log
    record = json.load(open(os.path.join(r.run_dir, "launch.json")))
    assert record["ok"] is True and [c["name"] for c in record["confirmations"]] == list(CHECKS)


def test_a_mirror_that_did_not_load_a_weights_rejection_and_a_drive_that_served_nothing(tmp_path):
    root, dirs, prof = exported(tmp_path)
    r = launch_arm(stand_in(tmp_path, skip={dirs[1]}), prof, run_dir=str(tmp_path / "a"))
    c = {x.name: x for x in r.confirmations}
    assert r.failed == ("mirrors", "weights", "served")
    assert f"mirror {dirs[1]} did not load (no usable shard (missing or divergent copy))" in c["mirrors"].detail
    assert f"mirror {dirs[2]} is drive 1, not 2" in c["mirrors"].detail
    assert "colibri rejected COLI_DISK_WEIGHTS=9,3,3 (it wanted 2 weights" in c["weights"].detail
    r = launch_arm(stand_in(tmp_path, weights=False), prof, run_dir=str(tmp_path / "b"))
    assert r.failed == ("weights",)
    assert "colibri rejected COLI_DISK_WEIGHTS=9,3,3" in r.confirmations[2].detail
    r = launch_arm(stand_in(tmp_path, idle={2}), prof, run_dir=str(tmp_path / "c"))
    assert r.failed == ("served",) and "mirror2 served nothing" in r.confirmations[3].detail
    r = launch_arm(stand_in(tmp_path, stats=False), prof, run_dir=str(tmp_path / "d"))
    assert r.failed == ("served",) and "no 'MIRROR:' statistics line" in r.confirmations[3].detail


def test_a_failed_arm_on_the_command_line_names_the_check(tmp_path):
    root, dirs, prof = exported(tmp_path, drives=2, weights=(2, 1))
    r = runner.invoke(app, ["launch", "--binary", stand_in(tmp_path, skip={dirs[1]}), "--profile", prof,
                            "--out", str(tmp_path / "run")])
    assert r.exit_code == 1 and "arm failed, not confirmed by the engine log: mirrors (" in r.stderr
    r = runner.invoke(app, ["launch", "--binary", stand_in(tmp_path), "--profile", prof, "--", "--model", "/other"])
    assert r.exit_code == 2 and "already given by the profile (COLI_MODEL=" in r.stderr


def test_a_single_drive_profile_needs_no_mirror_lines(tmp_path):
    root, dirs, prof = exported(tmp_path, drives=1, weights=(1,))
    r = launch_arm(stand_in(tmp_path), prof, run_dir=str(tmp_path / "run"))
    assert r.ok, r.confirmations


def test_a_drive_the_plan_leaves_idle_is_confirmed_as_expected_idle(tmp_path):
    # the plan predicts mirror2 reads nothing (its cut holds none of the model's experts): that
    # it served nothing is what the plan said, not a failure
    root, dirs, prof = exported(tmp_path, predicted_bytes=(5_000, 2_000, 0))
    r = launch_arm(stand_in(tmp_path, idle={2}), prof, run_dir=str(tmp_path / "idle"))
    assert r.ok, r.confirmations
    served = r.confirmations[3]
    assert "mirror2 served 0 bytes, expected idle: the plan gives it nothing in prefill and decode" in served.detail
    # a drive the plan gives bytes still fails when it serves nothing
    r = launch_arm(stand_in(tmp_path, idle={1}), prof, run_dir=str(tmp_path / "busy"))
    assert r.failed == ("served",) and "mirror1 served nothing" in r.confirmations[3].detail


def test_a_glm53_model_is_confirmed_by_its_own_lines_without_per_drive_counters(tmp_path):
    root, dirs, prof = exported(tmp_path, model_type="glm5_next")
    assert json.load(open(prof))["variant"] == "glm53"
    r = launch_arm(stand_in(tmp_path, glm53=True), prof, run_dir=str(tmp_path / "run"))
    assert r.ok, r.confirmations
    c = {x.name: x for x in r.confirmations}
    assert c["mirrors"].observed == f"{dirs[1]} 2/2 shards replica 1; {dirs[2]} 2/2 shards replica 2"
    assert c["weights"].observed == "60/20/20"
    assert c["served"].detail.startswith("per-drive bytes could not be checked: colibri's glm53 engine (c/glm53.c)")
    r = launch_arm(stand_in(tmp_path, glm53=True, skip={dirs[1]}), prof, run_dir=str(tmp_path / "skip"))
    assert r.failed == ("mirrors", "weights")
    assert f"mirror {dirs[1]} did not load (no usable shards)" in r.confirmations[1].detail
