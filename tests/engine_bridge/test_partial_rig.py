"""A rig with a partial replica end to end: the embedded engine reads it with colibri's pattern
and gives the same output hash as the full rig (the partial member serving only the shards it
holds), the run records each expert's misses as usage history, and `engine-bridge export --format
colibri` writes the partial mirror with its weights, checked line by line."""

import json
import os

import pytest
from typer.testing import CliRunner

from core import rig as rigmod
from engine_bridge.cli import app
from engine_bridge.moe.session import run_model
from engine_bridge.reader.settings import EMBEDDED
from engine_bridge.moe.inputs import build_sources
from engine_bridge.moe.synth_colibri import ColibriSpec, synthesize_colibri
from models.modelset import discover
from models.tensortable import inspect_model
from replicas.cli import app as replicas_app
from replicas.manifests import load_manifest
from tests.engine_bridge.export_helpers import write_plan

runner = CliRunner()
# 4 layers x 8 experts in 4 shards (a layer each); experts large enough to be real reads.
SPEC = ColibriSpec(layers=4, experts=8, top_k=2, dim=256, ff=256, vocab=300, shards=4, q_lora=64, kv_lora=64, seed=5)
PROMPT, GEN, CACHE = 24, 4, 6


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """(rig dir, primary, full replica, partial replica holding half the shards)."""
    t = tmp_path_factory.mktemp("partial-rig")
    primary = str(t / "internal" / "moe")
    os.makedirs(os.path.dirname(primary))
    synthesize_colibri(primary, SPEC)
    root = str(t / "rig")
    for d in ("green", "white"):
        (t / d).mkdir()
    base = ["--rig", root, "--piece-size", "64K", "--allow-same-device"]
    assert runner.invoke(replicas_app, ["sync", *base, primary, str(t / "green")]).exit_code == 0
    r = runner.invoke(replicas_app, ["sync", *base, "--partial", "50%", primary, str(t / "white")])
    assert r.exit_code == 0, r.output
    return root, primary, str(t / "green" / "moe"), str(t / "white" / "moe")


def run(root, primary, replicas, weights):
    src = build_sources(discover(primary), [f"{p}*{w}" for p, w in zip(replicas, weights[1:])], weights[0], None,
                        None, root, "colibri")
    return src, run_model(src, PROMPT, GEN, CACHE, EMBEDDED.but(lanes=2), prompt_seed=3)


def test_the_embedded_engine_reads_a_partial_rig_with_the_full_rigs_output(rig):
    root, primary, full, part = rig
    holds = rigmod.load_rig(root).member(part).holds
    _, alone = run(root, primary, [], (1,))
    _, whole = run(root, primary, [full], (1, 3))
    src, partial = run(root, primary, [part], (1, 3))
    assert src.holds()[1] == frozenset(holds)
    assert alone["output_sha256"] == whole["output_sha256"] == partial["output_sha256"]
    # the partial member served reads (from the shards it holds), the primary the rest
    assert partial["sources"][1]["bytes"] > 0 and partial["sources"][0]["bytes"] > 0
    g = inspect_model(primary)
    held_bytes = sum(x.length for lay in range(g.layers) for e in range(g.experts)
                     for x in g.expert_ranges(lay, e) if x.file in holds)
    assert partial["sources"][1]["bytes"] <= 2 * held_bytes        # prefill and decode re-reads at most


def test_a_run_on_the_rig_records_each_experts_misses(rig, tmp_path):
    root, primary, _, _ = rig
    before = set(os.listdir(os.path.join(root, "usage"))) if os.path.isdir(os.path.join(root, "usage")) else set()
    r = runner.invoke(app, ["replay", "--rig", root, "--model", primary, "--prompt-tokens", "32", "--gen-tokens", "4",
                            "--cache-experts", "4", "--json"])
    assert r.exit_code == 0, r.output
    (new,) = set(os.listdir(os.path.join(root, "usage"))) - before
    doc = json.load(open(os.path.join(root, "usage", new)))
    assert doc["kind"] == "usage" and doc["events"] == "misses" and doc["source"] == "engine-bridge replay"
    assert (doc["layers"], doc["experts"]) == (SPEC.layers, SPEC.experts)
    assert sum(c for _, _, c in doc["counts"]) == json.loads(r.stdout)["misses"]


def test_colibri_export_of_a_partial_mirror_line_by_line(rig, tmp_path):
    root, primary, full, part = rig
    holds = rigmod.load_rig(root).member(part).holds
    plan = write_plan(tmp_path, [primary, full, part], (4, 2, 3), (4, 2, 3), engine="colibri")
    out = str(tmp_path / "colibri.env")
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "colibri", "-o", out])
    assert r.exit_code == 0, r.output
    m = load_manifest(rigmod.load_rig(root))
    assert open(out).read().splitlines() == [
        "# colibri profile 'plan-colibri', exported by replica-tuner (engine-bridge export)",
        "# colibri: the coli launcher reads COLI_MODEL, the engine binary SNAP (both the model directory); "
        "COLI_MODEL_MIRROR lists mirror directories (';'-separated);",
        "# COLI_DISK_WEIGHTS are the plan's base weights 4:2:3 (colibri places whole experts by a hash of "
        "(layer, expert); it has no separate decode split)",
        "# engine: colibri's glm (c/colibri.c), which its launcher runs for this model's config.json model_type",
        f"# mirror 2 {part} is a partial replica holding 2 shard(s) ({', '.join(holds)}); colibri reads the others "
        "from the model drive (c/st.h st_mirror_add); the weights were solved for what it holds",
        f"# model: {m.size} bytes, digest {m.digest()} (replica-tuner's manifest digest, not a file's b3sum)",
        f"# plan: {plan}",
        "# load with: . FILE   (the unset lines clear colibri variables this profile does not want: "
        "an inherited mirror list, a split layout, striping)",
        f"export COLI_MODEL='{primary}'",
        f"export SNAP='{primary}'",
        f"export COLI_MODEL_MIRROR='{full};{part}'",
        "export COLI_DISK_WEIGHTS='4,2,3'",
        "unset COLI_MIR_STRIPE",
        "unset COLI_MODEL_DIRS",
        "unset DIRECT",
        "unset SNAP_MIRROR",
    ]
    doc = json.load(open(str(tmp_path / "colibri.json")))
    assert doc["provenance"]["partial"] == {"2": list(holds)}


def test_colibri_export_refuses_a_partial_mirror_that_lost_a_shard_it_holds(rig, tmp_path):
    root, primary, full, part = rig
    holds = rigmod.load_rig(root).member(part).holds
    plan = write_plan(tmp_path, [primary, part], (2, 1), (2, 1), engine="colibri")
    gone = os.path.join(part, holds[0])
    os.rename(gone, gone + ".away")
    try:
        r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "colibri", "-o",
                                str(tmp_path / "c.env")])
    finally:
        os.rename(gone + ".away", gone)
    assert r.exit_code != 0
    assert f"partial replica {part} lacks 1 of the 2 shards the rig says it holds ({holds[0]})" in r.stderr
