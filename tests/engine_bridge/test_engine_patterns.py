"""One execution: the embedded engine reads exactly the target engine's read pattern.

A run records its routing (`--trace-out`); walking that routing through the same cache policy
and asking the engine's module for each step's pattern, without any read, gives the bytes each
source must have read. The run's reader counters must equal them to the byte, for ds4-argodrive
(every read cut by its rule) and for colibri (whole experts placed by its family member, with
and without O_DIRECT windows and stripes), and the output must not change."""

import json
import shutil
import pytest
from typer.testing import CliRunner

from engine_bridge.cli import app
from engine_bridge.moe.replay import load_trace, pattern_bytes, trace_steps
from engine_bridge.moe.inputs import SourceSet
from engine_bridge.moe.synth_colibri import ColibriSpec, synthesize_colibri
from models.tensortable import inspect_model

runner = CliRunner()
PROMPT, GEN, CACHE = 40, 5, 3
def expected_bytes(model: str, trace: str, engine: str, weights, switches=()) -> dict:
    """Per phase, the bytes each source reads when `engine` performs the traced run's steps."""
    g = inspect_model(model)
    s = SourceSet((model,) * len(weights), tuple(weights), tuple(weights), engine=engine, switches=tuple(switches))
    return pattern_bytes(g, trace_steps(load_trace(trace), trace), CACHE, s.step_reads(g), s.in_flight())


def _run(tmp_path, model, replicas, weights, extra=()):
    trace = str(tmp_path / "trace.json")
    args = ["run", "--model", model, "--primary-weight", str(weights[0]), "--prompt-tokens", str(PROMPT),
            "--gen-tokens", str(GEN), "--cache-experts", str(CACHE), "--lanes", "2", "--no-hedge", "--no-reweigh", "--no-balance",
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
def test_colibri_runs_read_exactly_its_pattern(colibri_dir, tmp_path, switches):
    m = str(colibri_dir / "model")
    extra = [x for k in switches for x in ("--switch", k)]
    res, trace = _run(tmp_path, m, [str(colibri_dir / "r1"), str(colibri_dir / "r2")], (2, 1, 1), extra)
    assert res["engine"] == "colibri" and res["switches"] == list(switches)
    want = expected_bytes(m, trace, "colibri", (2, 1, 1), switches)
    assert _delivered(res) == want
    alone, _ = _run(tmp_path, m, [], (1,))
    assert res["output_sha256"] == alone["output_sha256"]


def test_colibri_places_whole_experts_on_the_drives_its_cuts_pick(colibri_dir, tmp_path):
    """Without stripes each expert read lands whole on one drive: the pieces per read are 1."""
    m = str(colibri_dir / "model")
    res, _ = _run(tmp_path, m, [str(colibri_dir / "r1"), str(colibri_dir / "r2")], (2, 1, 1))
    for ph in ("prefill", "decode"):
        assert sum(s["reads"] for s in res[ph]["sources"]) == res[ph]["reads"]


@pytest.fixture(scope="module")
def wide_colibri(tmp_path_factory):
    """A colibri-format model whose expert reads are 4.5 MiB: over colibri's 4 MiB stripe threshold."""
    d = tmp_path_factory.mktemp("colibri-wide")
    synthesize_colibri(str(d / "model"), ColibriSpec(layers=2, experts=8, top_k=2, dim=1024, ff=1536, vocab=300,
                                                     shards=2, seed=5))
    for name in ("r1", "r2"):
        shutil.copytree(d / "model", d / name)
    return d


def test_colibri_stripes_each_large_read_over_every_drive(wide_colibri, tmp_path):
    m = str(wide_colibri / "model")
    reps = [str(wide_colibri / "r1"), str(wide_colibri / "r2")]
    res, trace = _run(tmp_path, m, reps, (2, 1, 1), ["--switch", "direct", "--switch", "stripe"])
    assert _delivered(res) == expected_bytes(m, trace, "colibri", (2, 1, 1), ("direct", "stripe"))
    for ph in ("prefill", "decode"):
        pieces = [s["reads"] for s in res[ph]["sources"]]
        # equal legs (the code colibri runs, 4ef9a99): every read is cut in three, one leg per drive
        assert pieces == [res[ph]["reads"]] * 3, (ph, pieces, res[ph]["reads"])
    whole, trace = _run(tmp_path, m, reps, (2, 1, 1), ["--switch", "direct"])
    assert all(sum(s["reads"] for s in whole[ph]["sources"]) == whole[ph]["reads"] for ph in ("prefill", "decode"))
    assert whole["output_sha256"] == res["output_sha256"]
