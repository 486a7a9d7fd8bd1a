"""A RAM member (a replica in tmpfs, /dev/shm here) through the whole chain: sync (with the RAM
warning), verify, iobench (measured as RAM, not flagged), planner solve, export for colibri
(weights per drive), the embedded engine (same output with and without it), status after it is
gone ('gone', no alarm) and sync restoring it; an engine that cannot use one refuses it; and, with
COLIBRI_BIN, the real colibri reading from it."""

import json
import os
import shutil
import uuid

import pytest
from typer.testing import CliRunner

from core.tiers import is_memory
from engine_bridge.cli import app as bridge
from engine_bridge.moe.synth_colibri import synthesize_colibri
from engines.registry import get_engine
from iobench.cli import app as iobench
from planner.cli import app as planner
from replicas.cli import app as replicas
from tests.engine_bridge.export_helpers import make_rig, write_plan
from tests.engine_bridge.helpers import COLIBRI_SPEC

runner = CliRunner()
SHM = "/dev/shm"
needs_shm = pytest.mark.skipif(not (os.path.isdir(SHM) and os.access(SHM, os.W_OK) and is_memory(SHM)),
                               reason="no writable tmpfs at /dev/shm here")


@pytest.fixture
def shm_dir():
    """A folder of this test's own under /dev/shm, removed after (with whatever the test put there)."""
    d = os.path.join(SHM, f"replica-tuner-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def ok(r):
    assert r.exit_code == 0, r.output
    return r


@needs_shm
def test_a_tmpfs_member_through_sync_verify_iobench_solve_export_and_the_embedded_engine(tmp_path, shm_dir):
    src, root = tmp_path / "disk1", str(tmp_path / "rig")
    src.mkdir()
    synthesize_colibri(str(src / "model"), COLIBRI_SPEC)
    r = ok(runner.invoke(replicas, ["sync", str(src / "model"), shm_dir, "--rig", root]))
    assert "in RAM (tmpfs)" in r.stderr and "vanishes at reboot" in r.stderr
    ram = os.path.join(shm_dir, "model")
    ok(runner.invoke(replicas, ["verify", "--rig", root, "--full"]))

    r = ok(runner.invoke(iobench, ["run", "--rig", root, "--preset", "seq,decode,rand4k", "--lanes", "1,2",
                                   "--seconds", "0.05", "--repeat", "2", "--alone", "--json"]))
    drives = {d["name"]: d for d in json.loads(r.stdout)["drives"]}
    shm = next(d for d in drives.values() if d["path"].startswith(shm_dir))
    assert shm["model"] is not None and not any(p["suspect_cache"] for p in shm["presets"].values())
    assert any("RAM member" in n for n in shm["notes"])

    r = ok(runner.invoke(planner, ["solve", "--rig", root, "--engine", "colibri", "--cache-experts", "0",
                                   "--page-cache", "0", "--json"]))
    plan = json.loads(r.stdout)
    assert [s["path"] for s in plan["sources"]][-1] == ram
    r = ok(runner.invoke(bridge, ["export", "--rig", root, "--plan", "latest", "--format", "colibri", "--profile", "ram"]))
    assert "is in RAM (tmpfs)" in r.stderr and "vanishes at reboot" in r.stderr
    env = open(os.path.join(root, "profiles", "ram.env")).read()
    assert f"export COLI_MODEL_MIRROR='{ram}'" in env
    weights = ",".join(map(str, plan["prefill"]["weights"]))
    assert f"export COLI_DISK_WEIGHTS='{weights}'" in env
    prof = json.load(open(os.path.join(root, "profiles", "ram.json")))
    assert prof["provenance"]["memory_members"] == [ram]

    def run(*extra):
        r = ok(runner.invoke(bridge, ["run", "--rig", root, *extra, "--prompt-tokens", "24", "--gen-tokens", "6",
                                      "--cache-experts", "0", "--json"]))
        return json.loads(r.stdout)

    with_ram = run("--plan", "latest")
    alone = run("--model", str(src / "model"))
    assert with_ram["output_sha256"] == alone["output_sha256"]
    served = {s["path"]: s["bytes"] for s in with_ram["sources"]}
    assert served[ram] > 0                                          # the RAM member served its share

    shutil.rmtree(ram)                                              # a reboot empties tmpfs
    r = ok(runner.invoke(replicas, ["status", "--rig", root, "--json"]))      # exit 0: no alarm
    member = next(m for m in json.loads(r.stdout)["members"] if m["path"] == ram)
    assert member["state"] == "gone" and member["memory"] is True
    r = ok(runner.invoke(replicas, ["status", "--rig", root]))
    assert "gone" in r.stdout and "restores it" in r.stdout
    shutil.rmtree(shm_dir)                                          # the folder goes too
    ok(runner.invoke(replicas, ["sync", str(src / "model"), "--rig", root]))   # no folder: restore what is gone
    r = ok(runner.invoke(replicas, ["status", "--rig", root, "--json"]))
    assert {m["state"] for m in json.loads(r.stdout)["members"]} == {"verified"}


@needs_shm
def test_an_engine_that_cannot_use_a_ram_member_refuses_it_in_one_line(tmp_path, shm_dir):
    root, paths, _ = make_rig(tmp_path, drives=2)
    ram = os.path.join(shm_dir, "model.gguf")
    shutil.copyfile(paths[1], ram)
    plan = write_plan(tmp_path, [paths[0], ram], (10, 5), (10, 6))
    r = runner.invoke(bridge, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", "-o",
                               str(tmp_path / "p.env"), "--allow-unverified"])
    assert r.exit_code == 2
    assert "sources[1]: is in RAM (tmpfs): " + get_engine("ds4-argodrive").memory_member in r.output
    assert not get_engine("colibri").memory_member                   # colibri takes one (weights per drive)


COLIBRI_BIN = os.environ.get("COLIBRI_BIN", "")


@needs_shm
@pytest.mark.skipif(not COLIBRI_BIN or not os.access(COLIBRI_BIN, os.X_OK),
                    reason="COLIBRI_BIN is not set to a built colibri binary (docs/engine.md)")
def test_the_real_colibri_reads_a_mirror_in_ram_with_the_same_tokens_and_times_its_reads(tmp_path, shm_dir):
    from engines.colibri import read_timing
    from tests.engine_bridge.test_synth_colibri import colibri as run_colibri

    model = tmp_path / "model"
    synthesize_colibri(str(model), COLIBRI_SPEC)
    shutil.copytree(model, os.path.join(shm_dir, "model"))
    alone, _, _ = run_colibri(model, tmp_path)
    tokens, out, err = run_colibri(model, tmp_path, COLI_MODEL_MIRROR=os.path.join(shm_dir, "model"),
                                   COLI_DISK_WEIGHTS="1,1000")
    assert tokens == alone
    assert f"[MIRROR] {os.path.join(shm_dir, 'model')}: 2/2 shards (replica 1)" in err
    t = read_timing(out + err)
    assert t and all(0 <= wait <= total for total, wait in t.values())


def test_colibri_times_its_phases_from_its_profile_lines():
    from engines.colibri import read_timing

    text = ("PROFILO PREFILL (1.50s):\n"
            "PROFILE: expert-disk 0.400s service / 0.300s wait | expert-matmul 0.500s | attention 0.200s "
            "(including kvb 0.010s) | lm_head 0.100s | other 0.400s\n"
            "steady state...\n"
            "PROFILE: expert-disk 0.900s service / 0.800s wait | expert-matmul 1.000s | attention 0.200s "
            "(including kvb 0.010s) | lm_head 0.100s | other 0.100s\n")
    assert read_timing(text) == {"prefill": (1.5, 0.3), "decode": (pytest.approx(2.2), 0.8)}
    assert read_timing("no profile here") == {}
    assert get_engine("colibri").timing is read_timing and get_engine("ds4-argodrive").timing is None
