"""Plans for rigs with partial replicas (docs/planner.md, "Partial replicas"): the solver prices the
engine's read pattern with what each copy holds, so a colibri mirror holding half the shards gets
its weight raised to serve its bandwidth share from the experts it has; ds4-argodrive, which cuts
every read across every source, gets the full members only and the plan says which were left out."""

import json
import os

from typer.testing import CliRunner

from core import rig as rigmod
from planner.cli import app
from planner.plans import full_members_for, load_inputs
from engines.registry import get_engine
from iobench.model import DriveModel
from tests.planner.helpers import make_dir_rig, make_rig, write_dir_model

# Bandwidth-bound drives (the test model's experts are small reads): one twice as fast as the other.
QUICK = DriveModel(lat_s=1e-7, stream_bw=200e6, bw_max=200e6)
HALF = DriveModel(lat_s=1e-7, stream_bw=100e6, bw_max=100e6)

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def make_partial(root, name, holds):
    rig = rigmod.load_rig(str(root))
    reps = tuple(rigmod.Member(m.path, m.name, m.role, tuple(holds)) if m.name == name else m for m in rig.replicas)
    rigmod.save_rig(rigmod.Rig(rig.root, rig.model, reps, rig.layout, rig.format, rig.files))


def test_a_ds4_plan_leaves_a_partial_replica_out_and_says_why(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    make_partial(rig.root, "slow", ["slow.gguf"])
    r = invoke("solve", "--rig", rig.root, "--engine", "ds4-argodrive", "--workload", "ds4-v41", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [s["name"] for s in d["sources"]] == ["fast", "laggy"]
    assert len(d["prefill"]["weights"]) == len(d["decode"]["weights"]) == 2
    (out,) = d["provenance"]["left_out"]
    assert out["name"] == "slow" and "ds4-argodrive splits every read across every source" in out["why"]
    assert "notice: replica 'slow' holds 1 of the model's" in r.stderr


def test_colibri_keeps_partial_members_and_ds4_full_ones_alone(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    make_partial(rig.root, "slow", ["slow.gguf"])
    inputs = load_inputs(rig.root)
    kept, out = full_members_for(inputs, get_engine("colibri"))
    assert kept is inputs and out == ()
    kept, out = full_members_for(inputs, get_engine("ds4-argodrive"))
    assert [s.name for s in kept.sources] == ["fast", "laggy"] and [d.name for d in kept.drives] == ["fast", "laggy"]


def solved_shares(tmp_path, partial: bool):
    model = write_dir_model(tmp_path / "m", "glm_moe_dsa", layers=4, experts=16, shards=2)
    rig, _ = make_dir_rig(tmp_path / "rig", model, names=("fast", "slow"), models=(QUICK, HALF))
    if partial:    # the mirror holds the second shard only: half the experts
        shards = sorted(f for f in os.listdir(model) if f.endswith(".safetensors"))
        os.unlink(os.path.join(rig.root, "mirror-slow", shards[0]))
        make_partial(rig.root, "slow", [shards[1]])
    r = invoke("solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    w = d["decode"]["weights"]
    shares = [s["share"] for s in d["decode"]["predicted"]["sources"]]
    return w[1] / w[0], shares


def test_colibri_weights_are_corrected_for_a_mirror_holding_half_the_shards(tmp_path):
    full_ratio, full_shares = solved_shares(tmp_path / "full", partial=False)
    part_ratio, part_shares = solved_shares(tmp_path / "part", partial=True)
    # a full mirror twice as slow gets about a third of the bytes with weights about 1:2; a mirror
    # holding half the experts needs a larger weight to serve anything like that share
    assert part_ratio > full_ratio
    assert 0 < part_shares[1] <= 0.5 + 1e-9           # it can never serve more than the experts it holds
    assert abs(full_shares[1] - 1 / 3) < 0.15
