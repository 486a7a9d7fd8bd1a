"""The routing model reproduces the field facts of docs/planner.md within the stated tolerances."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from engine_bridge.cli import app
from models.cache import ExpertCache
from engine_bridge.moe.constants import CSV_COLUMNS
from engine_bridge.moe.resident import ExpertTensor, Geometry
from engine_bridge.moe.replay import model_steps, replay_steps
from models.routing import (
    COVERAGE_TOLERANCE,
    FIELD_COVERAGE,
    FIELD_DECODE_MISSES,
    FIELD_EXPERTS,
    FIELD_LAYERS,
    FIELD_TOP_K,
    MISSES_TOLERANCE,
    Router,
    RoutingModel,
    coverage,
)
from tests.engine_bridge.helpers import SPEC

runner = CliRunner()
COMPONENT = 6_635_520


def field_geometry() -> Geometry:
    per = FIELD_EXPERTS * COMPONENT
    tensors = tuple(ExpertTensor(layer, c, 4096 + (3 * layer + i) * per, per, COMPONENT, "Q4_K", (7168, 2048, FIELD_EXPERTS),
                                 "field.gguf")
                    for layer in range(FIELD_LAYERS) for i, c in enumerate(("gate", "up", "down")))
    return Geometry("/field.gguf", 4096 + 3 * FIELD_LAYERS * per, "deepseek", FIELD_LAYERS, FIELD_EXPERTS, FIELD_TOP_K,
                    COMPONENT, tensors, 4096)


class _Done:
    """A read that has already landed (the calibration counts misses; it needs no bytes)."""

    def __init__(self, view):
        self.view = view

    def result(self):
        return self.view


def test_selections_are_distinct_sorted_and_deterministic():
    m = RoutingModel(3, 16, 4, seed=5)
    a, b = Router(m).next(20), Router(m).next(20)
    assert np.array_equal(a, b) and a.shape == (20, 3, 4)
    assert all(len(set(row)) == 4 and list(row) == sorted(row) for row in a.reshape(-1, 4).tolist())
    assert not np.array_equal(a, Router(RoutingModel(3, 16, 4, seed=6)).next(20))


def test_prefill_coverage_matches_the_field():
    sel = Router(RoutingModel(FIELD_LAYERS, FIELD_EXPERTS, FIELD_TOP_K, seed=1)).next(2048)
    for tokens, want in FIELD_COVERAGE.items():
        got = coverage(sel[:tokens], FIELD_EXPERTS)
        print(f"coverage at {tokens} tokens: {got:.3f} (field {want})")
        assert abs(got - want) <= COVERAGE_TOLERANCE, (tokens, got, want)


def one_drive(g):
    """ds4-argodrive's reads of this geometry from one drive."""
    from engine_bridge.moe.staging import StepReads
    from engines.registry import get_engine

    return StepReads(get_engine("ds4-argodrive"), g, {"prefill": (1,), "decode": (1,)})


@pytest.fixture(scope="module")
def field_steps():
    g = field_geometry()
    return list(model_steps(Router(RoutingModel(g.layers, g.experts, g.top_k, seed=2)), 512, 200, 512))


@pytest.mark.parametrize("cache", sorted(FIELD_DECODE_MISSES))
def test_decode_misses_per_token_match_the_field(cache, field_steps):
    g = field_geometry()
    zero = memoryview(bytearray(32 << 20))
    submit = lambda read, phase: _Done(zero[:read.length])  # noqa: E731
    c = ExpertCache(cache, g.layers * g.experts)
    replay_steps(g, field_steps[:1 + 32], g.layers, c, submit, one_drive(g))   # the prefill chunk, then 32 warm-up tokens
    out = replay_steps(g, field_steps[1 + 32:], g.layers, c, submit, one_drive(g))
    got = out["counters"]["decode"].misses / out["tokens"]["decode"]
    want = FIELD_DECODE_MISSES[cache]
    print(f"cache {cache}: {got:.2f} misses/token (field {want})")
    assert abs(got - want) <= MISSES_TOLERANCE * want, (cache, got, want)
    assert out["counters"]["decode"].bytes == out["counters"]["decode"].misses * 3 * COMPONENT


def test_replay_reads_through_the_split_reader_and_reports(model_dir):
    d = model_dir
    r = runner.invoke(app, ["replay", "--model", str(d / "model.gguf"), "--replica", f"{d / 'r1.gguf'}*5",
                            "--replica", f"{d / 'r2.gguf'}*5", "--decode-weights", "10:6:6", "--prompt-tokens", "64",
                            "--gen-tokens", "20", "--cache-experts", "6", "--lanes", "2", "--json",
                            "--no-hedge", "--no-reweigh", "--no-balance"])   # exact counters: nothing may move a piece
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    for k in CSV_COLUMNS + ("schema", "kind", "coverage", "hits", "misses", "misses_per_token", "sources", "events",
                            "weights", "cache_experts_applied", "routing"):
        assert k in j, k
    assert j["kind"] == "replay" and j["prefill_tokens"] == 64 and j["gen_tokens"] == 20
    assert all(s["bytes"] > 0 for s in j["sources"])
    assert sum(s["bytes"] for s in j["sources"]) == j["prefill"]["bytes"] + j["decode"]["bytes"]
    assert j["decode"]["bytes"] == j["decode"]["misses"] * 3 * SPEC.component_bytes


def test_a_recorded_trace_replays_the_runs_exact_cache_behaviour(model_dir, tmp_path):
    d = model_dir
    common = ["--model", str(d / "model.gguf"), "--cache-experts", "5", "--json"]
    r = runner.invoke(app, ["run", *common, "--prompt-tokens", "40", "--gen-tokens", "6",
                            "--trace-out", str(tmp_path / "t.json")])
    assert r.exit_code == 0, r.output
    run = json.loads(r.stdout)
    r = runner.invoke(app, ["replay", *common, "--trace", str(tmp_path / "t.json")])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert (rep["hits"], rep["misses"], rep["prefill_tokens"], rep["gen_tokens"]) == (run["hits"], run["misses"], 40, 6)
    assert rep["prefill"]["bytes"] == run["prefill"]["bytes"] and rep["decode"]["bytes"] == run["decode"]["bytes"]


def test_bad_traces_are_refused(model_dir, tmp_path):
    (tmp_path / "x.json").write_text('{"kind": "plan"}')
    r = runner.invoke(app, ["replay", "--model", str(model_dir / "model.gguf"), "--trace", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "routing trace" in r.output
    bad = {"schema": 1, "kind": "routing-trace", "layers": SPEC.layers, "experts": SPEC.experts, "top_k": SPEC.top_k,
           "steps": [{"phase": "decode", "layers": [[[0, 99]]] * SPEC.layers}]}
    (tmp_path / "y.json").write_text(json.dumps(bad))
    r = runner.invoke(app, ["replay", "--model", str(model_dir / "model.gguf"), "--trace", str(tmp_path / "y.json")])
    assert r.exit_code == 2 and "ids below" in r.output


@pytest.mark.parametrize("cache", [0, 20, 48, 64])
def test_the_planners_simulated_traffic_is_the_replays_exactly(cache):
    """planner.workload simulates the engine's cache policy without reads: on the same routing it
    counts the same prefill reads and decode misses as replay through ExpertCache."""
    from planner.constants import ROUTING_MEASURE_TOKENS, ROUTING_SEED, ROUTING_WARM_TOKENS
    from planner.workload import simulate

    layers, experts, top_k, prompt = 4, 16, 2, 700
    per = experts * 8192
    tensors = tuple(ExpertTensor(layer, c, (3 * layer + i) * per, per, 8192, "F32", (1, 1, experts), "m.gguf")
                    for layer in range(layers) for i, c in enumerate(("gate", "up", "down")))
    g = Geometry("/m.gguf", 3 * layers * per, "x", layers, experts, top_k, 8192, tensors, 4096)
    zero = memoryview(bytearray(1 << 20))
    submit = lambda read, phase: _Done(zero[:read.length])  # noqa: E731
    steps = list(model_steps(Router(RoutingModel(layers, experts, top_k, seed=ROUTING_SEED)), prompt,
                             ROUTING_WARM_TOKENS + ROUTING_MEASURE_TOKENS, 512))
    c = ExpertCache(cache, layers * experts)
    pre = replay_steps(g, steps[:2 + ROUTING_WARM_TOKENS], layers, c, submit, one_drive(g))   # two prefill chunks, then warm-up
    out = replay_steps(g, steps[2 + ROUTING_WARM_TOKENS:], layers, c, submit, one_drive(g))
    read_per_layer, misses = simulate(layers, experts, top_k, prompt, cache)
    assert read_per_layer == pre["counters"]["prefill"].misses / layers
    assert misses == out["counters"]["decode"].misses / ROUTING_MEASURE_TOKENS
