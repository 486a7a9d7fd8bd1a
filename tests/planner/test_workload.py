"""A plan's workload from the model: its geometry, the routing model's traffic through the cache
(each phase's steps); the named workload ds4-v41; the plan recording both; idle drives said."""

import json

import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from planner import workload as workload_module
from planner.cli import app
from planner.constants import (
    V41_CACHE_EXPERTS,
    DECODE_MISSES_PER_TOKEN,
    MISSES_TOLERANCE,
    PREFILL_EXPERTS_PER_LAYER,
    PREFILL_TOLERANCE,
    ROUTING_MEASURE_TOKENS,
    V41_COMPONENT_BYTES,
    V41_EXPERTS,
)
from planner.plan import plan_from_dict
from planner.plans import load_plan
from models.routing import FIELD_DECODE_MISSES
from models.tensortable import inspect_model
from planner.workload import (
    V41_SHAPE,
    ModelShape,
    model_workload,
    named_workload,
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
    """The routing model through the engine's cache policy, on V4.1's geometry, against docs/planner.md."""
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
    assert simulate_traffic(small, 64).cache_experts == round(V41_CACHE_EXPERTS / (40 * 384) * 6 * 32)
    with pytest.raises(UsageError, match="--prompt-tokens 0"):
        simulate_traffic(small, 0)


def test_named_ds4_v41_is_the_field_workload():
    """V4.1's shape as a stacked GGUF, run by colibri's V4.1 engine; its steps scaled so the steps
    priced read the field's experts per layer and misses per token exactly, over every layer of
    every decoded token."""
    wl = named_workload("ds4-v41")
    assert wl.shape == V41_SHAPE and wl.traffic.source == "field"
    assert wl.traffic.experts_per_layer == PREFILL_EXPERTS_PER_LAYER
    assert wl.traffic.misses_per_token == DECODE_MISSES_PER_TOKEN
    g = wl.geometry
    assert (g.layers, g.experts, g.top_k, g.component_bytes, g.arch) == (40, 384, 6, V41_COMPONENT_BYTES, "deepseek_v41")
    pre, dec = wl.phases["prefill"], wl.phases["decode"]
    assert sum(len(x.experts) for x in pre.steps) * pre.scale / 40 == pytest.approx(PREFILL_EXPERTS_PER_LAYER)
    assert sum(len(x.experts) for x in dec.steps) * dec.scale / dec.tokens == pytest.approx(DECODE_MISSES_PER_TOKEN)
    assert dec.total_steps == pytest.approx(dec.tokens * 40, abs=1)
    assert len(pre.steps) == 8 and len(dec.steps) == 128               # sampled: PREFILL_SAMPLE, DECODE_SAMPLE
    with pytest.raises(UsageError, match="named workloads are ds4-v41"):
        named_workload("v3")


def test_a_models_steps_come_from_its_geometry(tmp_path):
    g = inspect_model(str(write_small(tmp_path / "m.gguf")))
    wl = model_workload(g, 512, 58)
    assert wl.shape == ModelShape.from_geometry(g) and wl.traffic.cache_experts == 58
    for ph, steps in wl.phases.items():
        assert all(st.phase == ph and 0 <= st.layer < 6 and all(0 <= e < 32 for e in st.experts) for st in steps.steps)
        assert list(steps.steps[0].experts) == sorted(set(steps.steps[0].experts))
    pre, dec = wl.phases["prefill"], wl.phases["decode"]
    assert pre.total_steps == 6 and pre.tokens == 512                  # one chunk of 512 tokens, 6 layers
    assert dec.total_steps == ROUTING_MEASURE_TOKENS * 6
    per_layer = sum(len(x.experts) for x in pre.steps) * pre.scale / 6
    assert per_layer == pytest.approx(wl.traffic.experts_per_layer)
    d = wl.as_dict()
    assert list(d) == ["name", "traffic", "prefill", "decode"]
    assert list(d["decode"]) == ["steps", "scale", "empty", "tokens", "experts_per_step"]


def test_solve_plans_the_rigs_own_model_and_records_geometry_and_workload(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    write_small(rig.model.path)                        # the primary holds a (header-only) small model
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    p = load_plan(json.loads(r.stdout)["path"])
    assert p.schema == 3 and p.geometry["component_bytes"] == SMALL_COMPONENT and p.geometry["layers"] == 6
    assert p.workload["name"] == "model" and p.workload["engine"] == "ds4-argodrive"
    assert p.workload["traffic"]["source"] == "routing-model" and p.workload["decode"]["steps"] > 0
    # a decode read is 2 blocks of 256 KiB and a tail: three drives cannot all take part
    assert p.workload["idle"]["decode"]["sources"] and set(p.workload["idle"]) <= {"prefill", "decode"}
    for ph, rep in p.workload["idle"].items():
        assert rep["why"] in r.stderr and all(s in rep["why"] for s in rep["sources"])
    assert "ds4-v41" not in r.stderr


def test_workload_ds4_v41_plans_from_no_model_and_a_missing_model_is_said(tmp_path):
    rig, _ = make_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))   # no model files here
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    assert "notice: the rig's model" in r.stderr and "--workload ds4-v41" in r.stderr
    p = load_plan(json.loads(r.stdout)["path"])
    assert p.workload["name"] == "ds4-v41" and p.geometry["component_bytes"] == V41_COMPONENT_BYTES
    r = invoke("solve", "--rig", rig.root, "--json", "--workload", "ds4-v41")
    assert r.exit_code == 0 and "notice: the rig's model" not in r.stderr
    assert load_plan(json.loads(r.stdout)["path"]).workload["traffic"]["misses_per_token"] == DECODE_MISSES_PER_TOKEN


def test_a_raw_rig_model_is_said_to_be_raw_not_told_to_pass_format_raw(tmp_path):
    rig, _ = make_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))   # a file of opaque bytes
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
    other = tmp_path / "other.gguf"
    write_header_only(other, layers=3, experts=8, top_k=2, ne0=256, ne1=32, qtype="Q8_0")   # 8,704 B components
    r = invoke("simulate", "--rig", rig.root, "--model", other, "--weights", "1:1:1", "--phase", "decode", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # components under one 256 KiB block: the primary reads them all
    assert d["sources"][0]["bytes"] > 0 and d["sources"][1]["bytes"] == d["sources"][2]["bytes"] == 0
    assert d["sources"][0]["experts"] > 0 and d["read_bytes"] == 8704
    paths = write_moe_split_gguf(tmp_path / "split", "m")
    r = invoke("simulate", "--rig", rig.root, "--model", paths[0], "--weights", "1:1:1", "--phase", "decode")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "reads one GGUF file (-m); this model is a split GGUF set; plan and run it with --engine llama.cpp" in r.stderr
    r = invoke("simulate", "--rig", rig.root, "--model", paths[0], "--weights", "1:1:1", "--phase", "decode",
               "--engine", "llama.cpp", "--page-cache", "0", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert sum(s["bytes"] for s in d["sources"]) > 0 and d["read_bytes"] > 0     # llama.cpp reads a split set
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


def test_the_tuner_predicts_with_the_workload_the_plan_was_solved_for(tmp_path):
    from planner.tui.load import load_tuner

    rig, _ = make_rig(tmp_path / "rig", names=("fast", "slow"), models=(FAST, SLOW))
    write_small(rig.model.path)
    r = invoke("solve", "--rig", rig.root, "--prompt-tokens", "128", "--cache-experts", "20", "--top", "0", "--json")
    assert r.exit_code == 0, r.output
    p = load_plan(json.loads(r.stdout)["path"])
    state = load_tuner(rig.root)
    assert state.problem.phases == model_workload(inspect_model(rig.model.path), 128, 20).phases
    for ph in ("prefill", "decode"):
        assert state.views[ph].prediction == pytest.approx(getattr(p, ph).predicted)
    assert state.workload["traffic"]["cache_experts"] == 20


def test_show_says_the_workload_and_the_idle_source(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    write_small(rig.model.path)
    r = invoke("solve", "--rig", rig.root, "--top", "0", "--json")
    path = json.loads(r.stdout)["path"]
    shown = invoke("show", path)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert f"workload: {rig.model.path}: 6 layers x 32 experts, 4 per token, 557,056 B components;" in text
    assert "(routing-model)" in text and "idle: decode: laggy reads nothing at " in text
