"""One execution: the embedded engine reads exactly the target engine's read pattern.

A run records its routing (`--trace-out`); walking that routing through the same cache policy
and asking the engine's module for each step's pattern, without any read, gives the bytes each
source must have read. The run's reader counters must equal them to the byte, for ds4-argodrive
(every read cut by its rule) and for colibri (whole experts placed by its family member, with
and without O_DIRECT windows and stripes), and the output must not change."""

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from engine_bridge.cli import app
from engine_bridge.engine.replay import load_trace, replay_steps, trace_steps
from engine_bridge.engine.staging import StepReads
from engine_bridge.engine.synth_colibri import ColibriSpec, synthesize_colibri
from engines.registry import get_engine
from models.cache import ExpertCache
from models.tensortable import inspect_model

runner = CliRunner()
PROMPT, GEN, CACHE = 40, 5, 3
COLIBRI = ColibriSpec(layers=2, experts=8, top_k=2, dim=512, ff=1536, vocab=300, shards=2, seed=5)


@pytest.fixture(scope="module")
def colibri_copies(tmp_path_factory):
    d = tmp_path_factory.mktemp("colibri-copies")
    synthesize_colibri(str(d / "model"), COLIBRI)
    for name in ("r1", "r2"):
        shutil.copytree(d / "model", d / name)
    return d


class _Zero:
    def __init__(self, n):
        self.view = memoryview(bytearray(n))

    def result(self):
        return self.view

    def release(self):
        pass


def expected_bytes(model: str, trace: str, engine: str, weights, switches=()) -> dict:
    """Per phase, the bytes each source reads when `engine` performs the traced run's steps."""
    g = inspect_model(model)
    d = load_trace(trace)
    got = {"prefill": np.zeros(len(weights), dtype=np.int64), "decode": np.zeros(len(weights), dtype=np.int64)}

    def submit(read, phase):
        for p in read.pieces:
            got[phase][p.source] += p.length
        return _Zero(read.length)

    reads_of = StepReads(get_engine(engine), g, {"prefill": weights, "decode": weights}, switches)
    e = get_engine(engine)
    in_flight = {ph: (c.shared if c.per_read else None) for ph in ("prefill", "decode") for c in (e.concurrency(ph),)}
    replay_steps(g, trace_steps(d, trace), g.layers, ExpertCache(CACHE, g.layers * g.experts), submit, reads_of,
                 in_flight=in_flight)
    return {ph: v.tolist() for ph, v in got.items()}


def _run(tmp_path, model, replicas, weights, extra=()):
    trace = str(tmp_path / "trace.json")
    args = ["run", "--model", model, "--primary-weight", str(weights[0]), "--prompt-tokens", str(PROMPT),
            "--gen-tokens", str(GEN), "--cache-experts", str(CACHE), "--lanes", "2", "--no-hedge",
            "--trace-out", trace, "--json"]
    for r, w in zip(replicas, weights[1:]):
        args += ["--replica", f"{r}*{w}"]
    r = runner.invoke(app, args + list(extra))
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), trace


def _delivered(result) -> dict:
    return {ph: [s["bytes"] for s in result[ph]["sources"]] for ph in ("prefill", "decode")}


def test_ds4_runs_read_exactly_its_pattern(model_dir, tmp_path):
    m = str(model_dir / "model.gguf")
    res, trace = _run(tmp_path, m, [str(model_dir / "r1.gguf"), str(model_dir / "r2.gguf")], (10, 5, 5))
    assert res["engine"] == "ds4-argodrive"
    want = expected_bytes(m, trace, "ds4-argodrive", (10, 5, 5))
    assert _delivered(res) == want and all(want["prefill"])


@pytest.mark.parametrize("switches", [(), ("direct",), ("direct", "stripe")])
def test_colibri_runs_read_exactly_its_pattern(colibri_copies, tmp_path, switches):
    m = str(colibri_copies / "model")
    extra = [x for k in switches for x in ("--switch", k)]
    res, trace = _run(tmp_path, m, [str(colibri_copies / "r1"), str(colibri_copies / "r2")], (2, 1, 1), extra)
    assert res["engine"] == "colibri" and res["switches"] == list(switches)
    want = expected_bytes(m, trace, "colibri", (2, 1, 1), switches)
    assert _delivered(res) == want
    alone, _ = _run(tmp_path, m, [], (1,))
    assert res["output_sha256"] == alone["output_sha256"]
    if "stripe" in switches:
        # an expert read of this model is 4.5 MiB: striped over all three copies, so every drive reads
        assert all(want["prefill"]) and all(want["decode"])


def test_colibri_places_whole_experts_on_the_drives_its_cuts_pick(colibri_copies, tmp_path):
    """Without stripes each expert read lands whole on one drive: the pieces per read are 1."""
    m = str(colibri_copies / "model")
    res, _ = _run(tmp_path, m, [str(colibri_copies / "r1"), str(colibri_copies / "r2")], (2, 1, 1))
    for ph in ("prefill", "decode"):
        assert sum(s["reads"] for s in res[ph]["sources"]) == res[ph]["reads"]
