"""A plan's workload from the model: its geometry, the routing model's traffic, the engine's reads;
the named workload ds4-v41; the plan recording both; no silent idle drive."""

import json

import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from engines.ds4_argodrive import BLOCK, COMPONENT_BYTES, PREFILL_CHUNK
from planner import workload as workload_module
from planner.cli import app
from planner.constants import (
    CACHE_EXPERTS,
    DECODE_MISSES_PER_TOKEN,
    MISSES_TOLERANCE,
    PREFILL_EXPERTS_PER_LAYER,
    PREFILL_TOLERANCE,
    ROUTING_MEASURE_TOKENS,
    V41_EXPERTS,
)
from planner.idle import best_with_every_source, check_idle
from planner.model import Drive, decode_workload, prefill_workload
from planner.plan import Source, plan_from_dict
from planner.plans import load_plan
from models.routing import FIELD_DECODE_MISSES
from planner.solve import solve_plan
from planner.workload import (
    V41_SHAPE,
    ModelShape,
    model_workload,
    named_workload,
    phase_workloads,
    simulate_traffic,
)
from tests.helpers import impure_imports
from tests.planner.helpers import FAST, SLOW, make_rig
from tests.models.geometry_helpers import write_header_only, write_moe_split_gguf

runner = CliRunner()
SMALL_COMPONENT = 557_056        # Q8_0 slices of 512 x 1024: 2 blocks of 256 KiB and a 32 KiB tail


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def write_small(path, layers=6, experts=32, top_k=4):
    """A header-only GGUF of the issue's small model: 557,056 B expert components."""
    write_header_only(path, layers=layers, experts=experts, top_k=top_k, ne0=1024, ne1=512, qtype="Q8_0")
    return path


def test_the_workload_module_is_pure():
    assert impure_imports(workload_module) == []


@pytest.mark.parametrize("cache", sorted(FIELD_DECODE_MISSES))
def test_v41_geometry_gives_the_field_figures_within_tolerance(cache):
    """The routing model through the engine's cache policy, on V4.1's geometry, against DESIGN §7."""
    t = simulate_traffic(V41_SHAPE, 512, cache)
    print(f"cache {cache}: {t.experts_per_layer:.1f} experts/layer at 512 tokens (field {PREFILL_EXPERTS_PER_LAYER}), "
          f"{t.misses_per_token:.2f} misses/token (field {FIELD_DECODE_MISSES[cache]})")
    assert abs(t.experts_per_layer - PREFILL_EXPERTS_PER_LAYER) <= PREFILL_TOLERANCE * V41_EXPERTS
    assert abs(t.misses_per_token - FIELD_DECODE_MISSES[cache]) <= MISSES_TOLERANCE * FIELD_DECODE_MISSES[cache]
    assert t.source == "routing-model" and t.cache_experts == cache


def test_traffic_follows_the_settings():
    small = ModelShape("s", 6, 32, 4, SMALL_COMPONENT, 3, 3 * SMALL_COMPONENT)
    short, long = simulate_traffic(small, 64, 20), simulate_traffic(small, 1024, 20)
    assert short.experts_per_layer < long.experts_per_layer <= 2 * 32    # 2 chunks of 512, at most 32 each
    big = simulate_traffic(small, 64, 6 * 32)
    # the whole model fits: only an expert's first selection misses, at most once per expert
    assert big.misses_per_token * ROUTING_MEASURE_TOKENS <= 6 * 32
    assert big.misses_per_token < short.misses_per_token
    assert simulate_traffic(small, 64, 0).misses_per_token == pytest.approx(6 * 4, rel=0.25)   # every selection
    assert simulate_traffic(small, 64).cache_experts == round(CACHE_EXPERTS / (40 * 384) * 6 * 32)
    with pytest.raises(UsageError, match="--prompt-tokens 0"):
        simulate_traffic(small, 0)


def test_named_ds4_v41_is_the_field_workload_the_planner_always_used():
    wl = named_workload("ds4-v41", "ds4-argodrive")
    assert wl.prefill == prefill_workload(8) and wl.decode == decode_workload()
    assert wl.decode.read_bytes == COMPONENT_BYTES and wl.decode.in_flight == 3
    assert wl.traffic.experts_per_layer == PREFILL_EXPERTS_PER_LAYER and wl.traffic.source == "field"
    assert wl.decode.batches_per_layer == pytest.approx(DECODE_MISSES_PER_TOKEN / 40)
    with pytest.raises(UsageError, match="named workloads are ds4-v41"):
        named_workload("v3", "ds4-argodrive")


def test_ds4_reads_of_another_model_come_from_its_geometry():
    shape = ModelShape("m", 6, 32, 4, SMALL_COMPONENT, 3, 3 * SMALL_COMPONENT)
    wl = model_workload("ds4-argodrive", shape, 512, 58, lanes=4, threads=6)
    assert (wl.prefill.read_bytes, wl.prefill.in_flight) == (PREFILL_CHUNK, 4)
    assert (wl.decode.read_bytes, wl.decode.in_flight, wl.decode.threads) == (SMALL_COMPONENT, 3, 6)
    assert wl.prefill.batches_per_layer == pytest.approx(wl.traffic.experts_per_layer * 3 * SMALL_COMPONENT / PREFILL_CHUNK)
    assert wl.decode.batches_per_layer == pytest.approx(wl.traffic.misses_per_token / 6)
    fused = ModelShape("f", 2, 8, 2, 8192, 2, 12288)          # gate_up + down: two reads per missed expert
    pre, dec = phase_workloads("ds4-argodrive", fused, wl.traffic)
    assert dec.in_flight == 2 and dec.read_bytes == 8192
    d = wl.as_dict()
    assert list(d) == ["name", "engine", "modelled_as", "traffic", "prefill", "decode"]
    assert d["decode"] == {"read_bytes": SMALL_COMPONENT, "in_flight": 3, "batches_per_layer": wl.decode.batches_per_layer,
                           "threads": 6}
    assert named_workload("ds4-v41", "colibri").as_dict()["modelled_as"] == "colibri"   # colibri is priced as itself


def test_an_idle_source_is_named_with_why_and_the_best_split_that_uses_every_source():
    drives = (Drive("a", FAST), Drive("b", FAST), Drive("c", SLOW))
    shape = ModelShape("m", 6, 32, 4, SMALL_COMPONENT, 3, 3 * SMALL_COMPONENT)
    wl = model_workload("ds4-argodrive", shape, 512, 58)
    plan = solve_plan(tuple(Source(d.name, f"/{d.name}") for d in drives), drives, wl.prefill, wl.decode)
    checked, reports = check_idle(plan, drives, {"prefill": wl.prefill, "decode": wl.decode})
    dec = checked.decode.predicted["sources"]
    assert sum(s["bytes"] for s in dec) == SMALL_COMPONENT        # the pieces add up to this model's component
    assert SMALL_COMPONENT // BLOCK == 2
    # 2 blocks and a tail: with the solver's 1:1:1 the third source gets no block, and solve says so
    assert checked.decode.weights == (1, 1, 1) and [s["bytes"] for s in dec] == [294_912, 262_144, 0]
    [r] = [r for r in reports if r.phase == "decode"]
    assert r.idle == ("c",)
    assert r.text().startswith("decode: c reads nothing: a 557,056 B read is 2 blocks of 256 KiB + 32,768 B on the "
                               "primary, and weights 1:1:1 give it none; the fastest split using every source, 1:2:2, "
                               "is predicted ")
    assert r.text().endswith("% slower") and r.every_source.throughput_Bps < r.chosen_Bps
    # with every source forced on the component, the report offers the fastest such split
    every = best_with_every_source(drives, wl.decode)
    assert every is not None and all(s.bytes > 0 for s in every.shares)
    assert every.shares[0].blocks == 0 and every.shares[0].bytes == SMALL_COMPONENT % BLOCK


def test_a_read_smaller_than_a_block_says_no_split_can_use_every_source():
    drives = (Drive("a", FAST), Drive("b", FAST))
    shape = ModelShape("tiny", 3, 4, 2, 8192, 3, 20480)
    wl = model_workload("ds4-argodrive", shape, 16, 4)
    plan = solve_plan((Source("a", "/a"), Source("b", "/b")), drives, wl.prefill, wl.decode)
    _, reports = check_idle(plan, drives, {"prefill": wl.prefill, "decode": wl.decode})
    [r] = [r for r in reports if r.phase == "decode"]
    assert r.idle == ("b",) and r.every_source is None
    assert r.text().endswith("no split of 0 blocks gives every source a piece")


def test_solve_plans_the_rigs_own_model_and_records_geometry_and_workload(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    write_small(rig.model.path)                        # the primary holds a (header-only) small model
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    p = load_plan(json.loads(r.stdout)["path"])
    assert p.schema == 2 and p.geometry["component_bytes"] == SMALL_COMPONENT and p.geometry["layers"] == 6
    assert p.workload["name"] == "model" and p.workload["decode"]["read_bytes"] == SMALL_COMPONENT
    assert p.workload["traffic"]["source"] == "routing-model"
    assert sum(s["bytes"] for s in p.decode.predicted["sources"]) == SMALL_COMPONENT
    assert set(p.workload["idle"]) <= {"prefill", "decode"}
    for ph, rep in p.workload["idle"].items():
        assert rep["why"] in r.stderr and all(s in rep["why"] for s in rep["sources"])
    assert "ds4-v41" not in r.stderr


def test_workload_ds4_v41_plans_from_no_model_and_a_missing_model_is_said(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")                # its model files are not on this machine
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    assert "notice: the rig's model" in r.stderr and "--workload ds4-v41" in r.stderr
    p = load_plan(json.loads(r.stdout)["path"])
    assert p.workload["name"] == "ds4-v41" and p.geometry["component_bytes"] == COMPONENT_BYTES
    r = invoke("solve", "--rig", rig.root, "--json", "--workload", "ds4-v41")
    assert r.exit_code == 0 and "notice: the rig's model" not in r.stderr
    assert load_plan(json.loads(r.stdout)["path"]).workload["traffic"]["misses_per_token"] == DECODE_MISSES_PER_TOKEN


def test_a_raw_rig_model_is_said_to_be_raw_not_told_to_pass_format_raw(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")                # make_rig's model: a file of opaque bytes
    with open(rig.model.path, "wb") as f:
        f.write(b"\x00" * 65536)
    for m in rig.replicas:
        with open(m.path, "wb") as f:
            f.write(b"\x00" * 65536)
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    assert f"notice: the rig's model {rig.model.path} is raw bytes" in r.stderr and "pass --format raw" not in r.stderr
    assert load_plan(json.loads(r.stdout)["path"]).workload["name"] == "ds4-v41"


def test_simulate_and_solve_take_another_models_header(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    paths = write_moe_split_gguf(tmp_path / "split", "m")          # components of 4,096 and 8,192 B
    r = invoke("simulate", "--rig", rig.root, "--model", paths[0], "--weights", "1:1:1", "--phase", "decode", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [s["bytes"] for s in d["sources"]] == [8192, 0, 0]       # the largest component, all on the primary
    dense = tmp_path / "dense.gguf"
    write_header_only(dense, names=["blk.0.ffn_gate.weight"], experts=2)
    r = invoke("solve", "--rig", rig.root, "--model", dense)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "no routed expert tensors" in r.stderr
    r = invoke("solve", "--rig", rig.root, "--workload", "v9")
    assert r.exit_code == 2 and "named workloads are ds4-v41" in r.stderr


def test_a_schema_1_plan_loads_with_no_geometry_or_workload():
    d = {"schema": 1, "kind": "plan", "engine": "ds4-argodrive", "created": "",
         "sources": [{"name": "a", "path": "/a"}], "prefill": {"weights": [1]}, "decode": {"weights": [1]}}
    p = plan_from_dict(d)
    assert p.geometry == {} and p.workload == {}
    with pytest.raises(UsageError, match="key 'workload' is not an object"):
        plan_from_dict({**d, "schema": 2, "workload": [1]})


def test_a_split_using_every_source_wins_when_it_is_as_fast():
    """check_idle replaces a phase's idle split by the fastest split using every source when that is
    no slower (the tie rule otherwise prefers the smaller weights, which may leave a drive idle)."""
    drives = (Drive("a", FAST), Drive("b", FAST))
    shape = ModelShape("m", 6, 32, 4, SMALL_COMPONENT, 3, 3 * SMALL_COMPONENT)
    wl = model_workload("ds4-argodrive", shape, 512, 58)
    plan = solve_plan((Source("a", "/a"), Source("b", "/b")), drives, wl.prefill, wl.decode)
    every = best_with_every_source(drives, wl.decode)
    slow_idle = {"throughput_Bps": every.throughput_Bps, "sources": [{"name": "a", "bytes": SMALL_COMPONENT},
                                                                        {"name": "b", "bytes": 0}]}
    idle_plan = plan.__class__(**{**plan.__dict__, "decode": plan.decode.__class__((5, 1), slow_idle)})
    checked, reports = check_idle(idle_plan, drives, {"decode": wl.decode})
    assert reports == [] and checked.decode.weights == every.weights
    assert all(s["bytes"] > 0 for s in checked.decode.predicted["sources"])


def test_the_tuner_predicts_with_the_workload_the_plan_was_solved_for(tmp_path):
    from planner.tui.load import load_tuner

    rig, _ = make_rig(tmp_path / "rig")
    write_small(rig.model.path)
    fresh = load_tuner(rig.root)                       # no plan yet: the rig's own model
    assert fresh.workloads["decode"].read_bytes == SMALL_COMPONENT
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    p = load_plan(json.loads(r.stdout)["path"])
    state = load_tuner(rig.root)
    for ph in ("prefill", "decode"):
        wl = state.workloads[ph]
        assert wl == fresh.workloads[ph]
        assert wl.misses_per_token == p.workload["traffic"]["misses_per_token"]
        assert state.views[ph].prediction.time_per_layer_s == pytest.approx(getattr(p, ph).predicted["time_per_layer_s"])


def test_show_says_the_workload_and_the_idle_source(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    write_small(rig.model.path)
    r = invoke("solve", "--rig", rig.root, "--json")
    path = json.loads(r.stdout)["path"]
    shown = invoke("show", path)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert f"workload: {rig.model.path}: 6 layers x 32 experts, 4 per token, 557,056 B components;" in text
    assert "(routing-model)" in text and "idle: decode: laggy reads nothing" in text
    r = invoke("solve", "--rig", rig.root, "--workload", "ds4-v41", "--engine", "colibri", "--json")
    shown = invoke("show", json.loads(r.stdout)["path"])
    text = " ".join(shown.stdout.split())
    assert "workload: ds4-v41: 40 layers x 384 experts, 6 per token, 6,635,520 B components; 187.4 experts per layer" in text
    # colibri's reads are priced as colibri's (whole experts by placement), not as ds4's
    assert "predicted as ds4-argodrive" not in text and "for both phases (COLI_DISK_WEIGHTS); stripe: " in text
