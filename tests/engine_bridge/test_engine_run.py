import gc
import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from engine_bridge.cli import app
from engine_bridge.moe.constants import CSV_COLUMNS
from engine_bridge.moe.resident import inspect_model
from engine_bridge.moe import session
from engine_bridge.moe.session import frozen_heap, run_model
from engine_bridge.moe.inputs import SourceSet
from engine_bridge.reader.settings import EMBEDDED, ReaderSettings
from tests.engine_bridge.helpers import SPEC

PROMPT, GEN = 48, 6
runner = CliRunner()


def run(d, reps=(), prefill=(10,), decode=None, cache=24, lanes=8, reader=EMBEDDED, **kw):
    paths = (str(d / "model.gguf"),) + tuple(str(d / r) for r in reps)
    src = SourceSet(paths, tuple(prefill), tuple(decode or prefill))
    return run_model(src, PROMPT, GEN, cache, reader.but(lanes=lanes), prompt_seed=11, **kw)


CONFIGS = [
    dict(),                                                                        # 1 source, everything fits
    dict(reps=("r1.gguf",), prefill=(10, 5), decode=(10, 6), cache=5, lanes=1, dequant_threads=0),  # 2 sources
    dict(reps=("r1.gguf", "r2.gguf"), prefill=(10, 5, 5), decode=(10, 6, 6), cache=1, lanes=3),  # < one layer
    dict(reps=("r1.gguf", "r2.gguf"), prefill=(1, 100, 37), decode=(3, 1, 100), cache=0, lanes=2),
    dict(reps=("r2.gguf", "r1.gguf"), prefill=(7, 7, 7), cache=9, lanes=5, chunk_tokens=20),
]


def test_output_hash_is_the_same_for_every_source_count_weight_lane_and_cache_size(model_dir):
    results = [run(model_dir, **c) for c in CONFIGS]
    hashes = {r["output_sha256"] for r in results[:4]}
    assert len(hashes) == 1, [r["output_sha256"] for r in results]
    # the reads really were split: every source delivered bytes in the 3-source runs
    for r in results[2:4]:
        assert all(s["bytes"] > 0 for s in r["sources"]) and len(r["sources"]) == 3
    # a cache smaller than one layer's selected experts still computes every selected expert
    small = results[2]
    assert small["cache_experts_applied"] == 1 and small["misses"] > results[0]["misses"]
    assert results[0]["decode"]["misses"] == 0 and results[3]["hits"] == 0
    # prefill chunking changes the arithmetic order, so it is a different (but valid) run
    assert results[4]["gen_tokens"] == GEN


def test_a_run_says_its_peak_resident_memory_in_bytes(model_dir):
    """`peak_rss_bytes`: what the process held of the RAM at its peak, in bytes (Linux's ru_maxrss
    is in KiB, a thousandth of it): at least what it holds now, which /proc says in pages (less a
    few MiB the test may have touched since the run asked)."""
    res = run(model_dir)
    with open("/proc/self/statm", encoding="ascii") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert now > 8 << 20 and res["peak_rss_bytes"] >= now - (4 << 20)


def test_the_run_is_timed_with_what_lived_before_it_out_of_the_collectors_walk(model_dir, monkeypatch):
    """The model, the modules and the reader live for the whole run: frozen out of the garbage
    collector's full walks while the engine runs, and given back after (docs/reader.md "Round 8")."""
    seen = []
    real = session.EmbeddedEngine.run

    def run_and_look(self, *a, **kw):
        seen.append(gc.get_freeze_count())
        return real(self, *a, **kw)

    monkeypatch.setattr(session.EmbeddedEngine, "run", run_and_look)
    assert run(model_dir)["gen_tokens"] == GEN
    assert seen and seen[0] > 0 and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError, match="mid-run"):
        with frozen_heap():
            raise RuntimeError("mid-run")
    assert gc.get_freeze_count() == 0


def test_a_replica_that_delivers_a_wrong_byte_changes_the_hash(model_dir, tmp_path):
    good = run(model_dir)["output_sha256"]
    bad = tmp_path / "bad.gguf"
    shutil.copyfile(model_dir / "model.gguf", bad)
    g = inspect_model(str(bad))
    with open(bad, "r+b") as f:
        for e in range(g.experts):                 # the fp16 scale of each expert's first gate block
            f.seek(g.expert_ranges(0, e)[0].offset)
            f.write(b"\x00\x7b")
    src = SourceSet((str(model_dir / "model.gguf"), str(bad)), (1, 100), (1, 100))
    # the engine's reads exactly: hedging and balancing would let the good replica serve a piece
    # of the bad one whenever it is late or queued behind (timing, so a race), hiding the byte
    r = run_model(src, PROMPT, GEN, 24, EMBEDDED.but(lanes=4, hedge=False, reweigh=False, balance=False), prompt_seed=11)
    assert r["sources"][1]["bytes"] > 0
    assert r["output_sha256"] != good


def test_json_keys_csv_row_and_counters(model_dir, tmp_path):
    d = model_dir
    csv_path = tmp_path / "bench.csv"
    args = ["run", "--model", str(d / "model.gguf"), "--replica", f"{d / 'r1.gguf'}*5", "--replica", f"{d / 'r2.gguf'}*5",
            "--decode-weights", "10,6,6", "--prompt-tokens", PROMPT, "--gen-tokens", GEN, "--cache-experts", 4,
            "--lanes", 2, "--no-hedge", "--no-reweigh", "--no-balance", "--csv", csv_path,
            "--json"]   # exact counters: nothing may move a piece
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    for k in CSV_COLUMNS + ("output_sha256", "cache_experts", "cache_experts_applied", "hits", "misses",
                            "misses_per_token", "weights", "sources", "events", "schema", "kind"):
        assert k in j, k
    assert j["kind"] == "run" and j["schema"] == 1
    assert j["weights"] == {"prefill": [10, 5, 5], "decode": [10, 6, 6]}
    assert (j["prefill_tokens"], j["gen_tokens"], j["gen_steady_tokens"], j["ctx_tokens"]) == (PROMPT, GEN, GEN - 1, PROMPT + GEN)
    assert j["cache_experts"] == 4 and j["cache_experts_applied"] == 4
    assert j["misses_per_token"] == round(j["decode"]["misses"] / GEN, 4)
    for s in j["sources"]:
        assert {"bytes", "reads", "lands_last", "gap_ns", "lat_ns"} <= set(s)
    assert sum(s["bytes"] for s in j["sources"]) == j["prefill"]["bytes"] + j["decode"]["bytes"]
    assert j["events"] == []
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",") == list(CSV_COLUMNS) and len(lines) == 2
    # the plain form prints the CSV header and row on stdout
    r2 = runner.invoke(app, [str(a) for a in args[:-1] if a != csv_path and a != "--csv"])
    assert r2.exit_code == 0, r2.output
    assert r2.stdout.splitlines()[0] == ",".join(CSV_COLUMNS)


def test_cache_larger_than_the_model_is_applied_as_the_model(model_dir):
    r = run(model_dir, cache=10_000)
    assert r["cache_experts"] == 10_000 and r["cache_experts_applied"] == SPEC.layers * SPEC.experts


def test_plan_file_gives_sources_and_both_weight_vectors(model_dir, tmp_path):
    d = model_dir
    plan = {"schema": 1, "kind": "plan", "engine": "ds4-argodrive", "created": "",
            "sources": [{"name": "a", "path": str(d / "model.gguf")}, {"name": "b", "path": str(d / "r1.gguf")}],
            "prefill": {"weights": [10, 5]}, "decode": {"weights": [10, 6]}}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    r = runner.invoke(app, ["run", "--model", str(d / "model.gguf"), "--plan", str(tmp_path / "p.json"),
                            "--prompt-tokens", "16", "--gen-tokens", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["weights"] == {"prefill": [10, 5], "decode": [10, 6]}
    r = runner.invoke(app, ["run", "--model", str(d / "r2.gguf"), "--plan", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "not the plan's primary" in r.output
    rig = tmp_path / "rig"
    (rig / "plans").mkdir(parents=True)
    (rig / "plans" / "20261129T190000.000Z.json").write_text(json.dumps({**plan, "decode": {"weights": [10, 7]}}))
    for name in ("latest", "20261129T190000.000Z"):
        r = runner.invoke(app, ["run", "--model", str(d / "model.gguf"), "--rig", str(rig), "--plan", name,
                                "--prompt-tokens", "8", "--gen-tokens", "1", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["weights"]["decode"] == [10, 7]
    r = runner.invoke(app, ["run", "--model", str(d / "model.gguf"), "--rig", str(rig), "--plan", "nope"])
    assert r.exit_code == 3 and "nope: no such plan file" in r.output


def _bad_inputs(d, tmp):
    short = tmp / "short.gguf"
    with open(d / "model.gguf", "rb") as f:
        short.write_bytes(f.read(os.path.getsize(d / "model.gguf") - 8192))
    junk = tmp / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 1000)
    half = tmp / "half.gguf"
    with open(d / "model.gguf", "rb") as f:
        half.write_bytes(f.read(os.path.getsize(d / "model.gguf") // 2))
    m = str(d / "model.gguf")
    return [
        (["--model", m, "--replica", f"{short}*5"], "size"),                 # wrong-size replica
        (["--model", m, "--replica", f"{m}*5"], "same file"),                # same file twice
        (["--model", m, "--replica", f"{d / 'r1.gguf'}*0"], "weight"),       # weight 0
        (["--model", m, "--replica", f"{d / 'r1.gguf'}"], "PATH*WEIGHT"),    # no weight
        (["--model", m, "--decode-weights", "10,6"], "one per source"),      # wrong decode count
        (["--model", str(junk)], "not a GGUF"),                               # non-GGUF model
        (["--model", str(half)], "truncated"),                                # truncated model
        (["--model", m, "--prompt-tokens", "0"], "--prompt-tokens"),
    ]


def test_bad_inputs_are_refused_with_one_line_and_exit_2(model_dir, tmp_path):
    for args, words in _bad_inputs(model_dir, tmp_path):
        r = runner.invoke(app, ["run", "--gen-tokens", "1", "--prompt-tokens", "4", *args])  # later options win
        assert r.exit_code == 2, (args, r.output)
        assert words in r.output, (args, r.output)
        assert "Traceback" not in r.output


def test_missing_model_is_exit_3(tmp_path):
    r = runner.invoke(app, ["run", "--model", str(tmp_path / "nope.gguf")])
    assert r.exit_code == 3 and "nope.gguf: no such file or directory" in r.output


def test_a_replica_truncated_mid_run_degrades_the_plan_but_not_the_output(model_dir, tmp_path):
    from models.cache import ExpertCache
    from engine_bridge.moe.inference import EmbeddedEngine, prompt_tokens, tokens_sha256
    from engine_bridge.moe.resident import load_resident
    from engine_bridge.moe.staging import StepReads
    from engine_bridge.reader import SplitReader
    from engines.registry import get_engine

    good = run(model_dir)["output_sha256"]
    victim = tmp_path / "victim.gguf"
    shutil.copyfile(model_dir / "model.gguf", victim)
    paths = [str(model_dir / "model.gguf"), str(model_dir / "r1.gguf"), str(victim)]
    g = inspect_model(paths[0])
    res = load_resident(g)
    with SplitReader(paths, (10, 5, 5), (10, 6, 6), settings=ReaderSettings(lanes=2), health_interval=0) as reader:
        os.truncate(victim, g.tensor(0, "gate").offset)     # after the reader checked it: every expert read is short
        reads_of = StepReads(get_engine("ds4-argodrive"), g, {"prefill": (10, 5, 5), "decode": (10, 6, 6)},
                             healthy=reader.healthy)
        eng = EmbeddedEngine(g, res, reader.submit_read, reads_of, ExpertCache(4, g.layers * g.experts))
        out = eng.run(prompt_tokens(PROMPT, res.vocab, 11), GEN)
        eng.close()
        stats = reader.stats()
    assert tokens_sha256(out.tokens) == good
    assert stats.sources[2].degraded and stats.events


@pytest.mark.parametrize("quant", ["q4_0", "f32"])
def test_other_expert_types_give_one_hash_across_sources_and_caches(tmp_path, quant):
    from engine_bridge.moe.synth import SynthSpec, synthesize

    m = tmp_path / "m.gguf"
    synthesize(str(m), SynthSpec(layers=2, experts=4, top_k=2, dim=256, ff=512, vocab=64, seed=1, quant=quant))
    shutil.copyfile(m, tmp_path / "r.gguf")
    one = run_model(SourceSet((str(m),), (10,), (10,)), 16, 3, 8, EMBEDDED.but(lanes=2), prompt_seed=1)
    two = run_model(SourceSet((str(m), str(tmp_path / "r.gguf")), (1, 3), (3, 1)), 16, 3, 1, EMBEDDED.but(lanes=3),
                    prompt_seed=1)
    assert one["output_sha256"] == two["output_sha256"]
    assert two["sources"][1]["bytes"] > 0


def test_pin_blas_threads_sets_the_bundled_openblas():
    import ctypes
    import glob

    import numpy as np

    from engine_bridge.moe.blas import pin_blas_threads

    get = None
    for lib in glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*.so*")):
        so = ctypes.CDLL(lib)
        get = get or getattr(so, "scipy_openblas_get_num_threads64_", None) or \
            getattr(so, "scipy_openblas_get_num_threads_64_", None)
    if get is None:
        pytest.skip("numpy here has no bundled scipy-openblas to ask")
    before = get()
    try:
        assert pin_blas_threads(2) is True and get() == 2
        assert pin_blas_threads(1) is True and get() == 1
    finally:
        pin_blas_threads(before)


def test_save_run_appends_the_csv_row_and_writes_a_trace_replay_reads(model_dir, tmp_path):
    from engine_bridge.moe.replay import load_trace, trace_steps
    from engine_bridge.moe.session import save_run

    csv_path, trace_path = tmp_path / "runs.csv", tmp_path / "t.json"
    result = save_run(run(model_dir, trace=True), csv_file=str(csv_path), trace_out=str(trace_path))
    assert "trace" not in result
    save_run(run(model_dir), csv_file=str(csv_path))
    lines = csv_path.read_text().splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS) and len(lines) == 3      # the header once, a row per run
    assert lines[1] == ",".join(str(result[c]) for c in CSV_COLUMNS)
    steps = list(trace_steps(load_trace(str(trace_path)), str(trace_path)))
    # one prefill chunk (48 tokens < 512), then one decode step per generated token
    assert [p for p, _ in steps] == ["prefill"] + ["decode"] * GEN
    assert steps[0][1].shape == (PROMPT, SPEC.layers, SPEC.top_k)


# -- per-phase source counters and idle sources (issue 11) -----------------------------------------

def _v41_plan(d, weights=(2, 1, 1)):
    """A plan solved for V4.1's 6,635,520 B component (13 / 6 / 6 blocks at 2:1:1), run on SPEC's 557,056 B one."""
    pieces = [3_489_792, 1_572_864, 1_572_864]
    return {"schema": 2, "kind": "plan", "engine": "ds4-argodrive", "created": "",
            "sources": [{"name": n, "path": str(d / f)} for n, f in (("i", "model.gguf"), ("g", "r1.gguf"),
                                                                    ("w", "r2.gguf"))],
            "prefill": {"weights": list(weights), "predicted": {}},
            "decode": {"weights": list(weights), "predicted": {"sources": [{"name": n, "blocks": p // 262_144, "bytes": p}
                                                                          for n, p in zip("igw", pieces)]}},
            "workload": {"decode": {"read_bytes": 6_635_520}}}


def test_run_reports_each_phase_per_source_and_the_source_the_split_left_out(model_dir):
    assert SPEC.component_bytes == 557_056                   # 2 blocks + 32 KiB: 1 / 1 / 0 blocks at 2:1:1
    r = run(model_dir, reps=("r1.gguf", "r2.gguf"), prefill=(2, 1, 1), cache=4, lanes=2, reader=ReaderSettings())
    for ph in ("prefill", "decode"):
        assert set(r[ph]) == {"hits", "misses", "reads", "bytes", "groups", "seconds", "read_wait_seconds",
                              "started_ns", "largest_read", "sources", "threads"}
        # where the phase's threads spent it (Linux's schedstat): the engine's thread computed, on a core
        # and waiting for one about as long as the phase lasted at most (the counts are taken just
        # outside its clock); the reader's lanes ran too
        th = r[ph]["threads"]
        assert set(th) == {f"{g}_{k}_seconds" for g in ("engine", "helpers", "others") for k in ("cpu", "runq")} \
            | {"minor_faults", "major_faults"}
        assert 0 < th["engine_cpu_seconds"]
        assert th["engine_cpu_seconds"] + th["engine_runq_seconds"] <= r[ph]["seconds"] * 1.5 + 0.05
        assert th["others_cpu_seconds"] > 0 and min(th.values()) >= 0
        assert [set(s) for s in r[ph]["sources"]] == [{"index", "bytes", "reads", "given_bytes", "given_pieces"}] * 3
        assert sum(s["bytes"] for s in r[ph]["sources"]) == r[ph]["bytes"]
    assert r["planned"] == {"prefill": None, "decode": None}
    # the phases' starts are on the clock of the reader's events: the decode starts once the prefill is over
    assert 0 < r["prefill"]["started_ns"] < r["decode"]["started_ns"]
    assert r["decode"]["started_ns"] - r["prefill"]["started_ns"] >= r["prefill"]["seconds"] * 1e9
    dec = r["decode"]
    assert dec["largest_read"] == 557_056 and dec["reads"] > 0
    # every decode read is one component: each source reads exactly its piece per read
    assert [(s["bytes"], s["reads"]) for s in dec["sources"]] == [
        (dec["reads"] * 294_912, dec["reads"]), (dec["reads"] * 262_144, dec["reads"]), (0, 0)]
    assert [e["source"] for e in r["idle"] if e["phase"] == "decode"] == [2]
    [e] = [e for e in r["idle"] if e["phase"] == "decode"]
    assert e["kind"] == "split" and e["by"] == "weights" and e["planned_share"] is None
    assert all(s["bytes"] > 0 for s in r["prefill"]["sources"])    # prefill reads coalesced experts: all take part
    assert r["sources"][2]["bytes"] == r["prefill"]["sources"][2]["bytes"]


def test_run_warns_when_the_plan_gave_a_source_bytes_it_never_read(model_dir, tmp_path):
    d = model_dir
    (tmp_path / "p.json").write_text(json.dumps(_v41_plan(d)))
    args = ["run", "--model", str(d / "model.gguf"), "--plan", str(tmp_path / "p.json"), "--prompt-tokens", str(PROMPT),
            "--gen-tokens", str(GEN), "--cache-experts", "4", "--lanes", "2", "--no-hedge", "--no-reweigh", "--no-balance"]
    r = runner.invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    shares = [p / 6_635_520 for p in (3_489_792, 1_572_864, 1_572_864)]
    assert j["planned"]["decode"] == {"shares": shares}
    assert j["planned"]["prefill"] is None
    [e] = j["idle"]
    assert (e["phase"], e["source"], e["kind"], e["by"], e["planned_share"]) == ("decode", 2, "unread", "plan", shares[2])
    warn = [x for x in r.stderr.splitlines() if x.startswith("warning: ")]
    assert warn == [f"warning: {e['message']}"]
    assert "decode per source: [0] " in r.stderr and "[2] 0 B in 0 pieces" in r.stderr
    # other decode weights than the plan's: its prediction no longer applies, the split explains it
    r = runner.invoke(app, args + ["--decode-weights", "2,1,1", "--json"])
    j = json.loads(r.stdout)
    assert j["planned"]["decode"] is None and [e["kind"] for e in j["idle"]] == ["split"]
    assert "note: source[2] read nothing in decode: the engine's reads at 2:1:1 gave it nothing" in r.stderr
    assert "warning:" not in r.stderr
    # a plan for an engine that cannot read this model is refused in one line, naming the one that can
    (tmp_path / "c.json").write_text(json.dumps({**_v41_plan(d), "engine": "colibri"}))
    r = runner.invoke(app, args[:4] + [str(tmp_path / "c.json")] + args[5:] + ["--json"])
    assert r.exit_code == 2, r.output
    assert "colibri loads a directory of safetensors shards" in r.stderr and "ds4-argodrive" in r.stderr
