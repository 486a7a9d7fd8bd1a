"""`synth --format colibri`: a directory colibri's GLM engine loads, read by safetensors' own
reader, by our tensor table and geometry, computed by the embedded engine (one output hash for
every cache size and replica set), and, when COLIBRI_BIN names a built colibri binary, run by the
real colibri with and without two mirrors."""

import hashlib
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from engine_bridge.cli import app
from engine_bridge.moe.constants import ROW_INT8
from engines.colibri.constants import GLM_MODEL_TYPE as COLIBRI_MODEL_TYPE
from engine_bridge.moe.resident import inspect_model, load_resident
from engine_bridge.moe.session import run_model
from engine_bridge.reader.settings import EMBEDDED
from engine_bridge.moe.inputs import SourceSet
from engine_bridge.moe.synth_colibri import (
    SHARD_NAME,
    SPECIAL_TOKENS,
    ColibriSpec,
    check_spec,
    synthesize_colibri,
    tensor_plan,
)
from models.formats import read_safetensors_header
from models.modelset import discover
from models.tensortable import inspect_model as inspect_any
from tests.engine_bridge.helpers import COLIBRI_SPEC

# 2 layers x 8 experts, top-2; a component is 786,432 B (3 split blocks of 256 KiB, so every
# source of a 3-source run reads a piece of it) and an expert 2.25 MiB. About 42 MB.
SPEC = COLIBRI_SPEC
SMALL = ColibriSpec(layers=2, experts=4, top_k=2, dim=128, ff=256, vocab=300, shards=2, seed=3)
PROMPT, GEN = 32, 6
runner = CliRunner()


def digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


# -- the directory ---------------------------------------------------------------------------------

def test_safetensors_reads_every_shard_and_the_format_is_colibris(colibri_dir):
    from safetensors import safe_open

    d = colibri_dir / "model"
    shards = sorted(p.name for p in d.iterdir() if p.suffix == ".safetensors")
    assert shards == [SHARD_NAME.format(k) for k in range(SPEC.shards)] == ["out-00000.safetensors", "out-00001.safetensors"]
    tensors, where = {}, {}
    for name in shards:
        with safe_open(str(d / name), framework="np") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
                where[k] = name
    plan = tensor_plan(SPEC)
    want = {t.name for t in plan} | {t.name + ".qs" for t in plan if t.rows}
    assert set(tensors) == want
    for t in plan:
        if t.rows:          # int8 rows, flat U8 of O*I bytes, and one F32 scale per row
            o, i = t.shape
            assert tensors[t.name].dtype == np.uint8 and tensors[t.name].shape == (o * i,)
            assert tensors[t.name + ".qs"].dtype == np.float32 and tensors[t.name + ".qs"].shape == (o,)
            assert (tensors[t.name + ".qs"] > 0).all() and where[t.name + ".qs"] == where[t.name]
        else:
            assert tensors[t.name].dtype == np.float32 and tensors[t.name].shape == t.shape
    # each layer sits whole in one shard; embeddings first, final norm and lm_head last
    for i in range(SPEC.layers):
        assert len({s for k, s in where.items() if k.startswith(f"model.layers.{i}.")}) == 1
    assert where["model.embed_tokens.weight"] == shards[0] and where["lm_head.weight"] == where["model.norm.weight"] == shards[-1]
    # an expert's three weights are contiguous in its shard (colibri reads them with one pread)
    for i in range(SPEC.layers):
        p = f"model.layers.{i}.mlp.experts."
        h = read_safetensors_header(str(d / where[p + "0.gate_proj.weight"])).tensors
        for e in range(SPEC.experts):
            spans = sorted(h[f"{p}{e}.{c}_proj.weight"]["data_offsets"] for c in ("gate", "up", "down"))
            assert spans[0][1] == spans[1][0] and spans[1][1] == spans[2][0]
            assert spans[2][1] - spans[0][0] == SPEC.expert_bytes


def test_config_and_tokenizer_are_what_colibri_reads(colibri_dir):
    d = colibri_dir / "model"
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == COLIBRI_MODEL_TYPE and cfg["n_group"] == 1 and cfg["index_topk"] == 0
    assert (cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["num_experts_per_tok"]) == (2, 8, 2)
    assert (cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["vocab_size"]) == (512, 1536, 300)
    assert cfg["first_k_dense_replace"] == 0 and cfg["n_shared_experts"] == 1
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    ids = sorted(list(vocab.values()) + [a["id"] for a in tok["added_tokens"]])
    assert ids == list(range(SPEC.vocab))                      # every id the model can emit has a string
    assert [a["content"] for a in tok["added_tokens"]] == list(SPECIAL_TOKENS)
    assert cfg["eos_token_id"] == next(a["id"] for a in tok["added_tokens"] if a["content"] == "<|endoftext|>")
    for a, b in tok["model"]["merges"]:                        # a merge's parts and result are tokens
        assert a in vocab and b in vocab and a + b in vocab
    assert tok["model"]["type"] == "BPE" and len(vocab) >= 256


def test_our_tensor_table_and_geometry_find_the_experts(colibri_dir):
    d = colibri_dir / "model"
    g = inspect_any(str(d))
    assert (g.format, g.layout, g.arch, g.stacked) == ("safetensors", "dir", COLIBRI_MODEL_TYPE, False)
    assert (g.layers, g.experts, g.top_k, g.components) == (2, 8, 2, ("gate", "up", "down"))
    assert g.shared_experts == 1 and g.layer_ids == (0, 1) and g.uniform
    assert g.component_bytes == SPEC.component_bytes and g.expert_bytes == SPEC.expert_bytes
    assert g.routed_bytes == SPEC.layers * SPEC.experts * SPEC.expert_bytes
    assert inspect_model(str(d)) == g                          # `run` takes it as it is
    from safetensors import safe_open

    for layer, e in ((0, 0), (1, 7), (1, 3)):
        for c, ext in zip(g.components, g.expert_ranges(layer, e)):
            with open(d / ext.file, "rb") as f:
                f.seek(ext.offset)
                raw = f.read(ext.length)
            with safe_open(str(d / ext.file), framework="np") as f:
                assert raw == f.get_tensor(f"model.layers.{layer}.mlp.experts.{e}.{c}_proj.weight").tobytes()


def test_same_arguments_same_bytes_other_seed_other_bytes_other_shards_same_tensors(tmp_path):
    synthesize_colibri(str(tmp_path / "a"), SMALL)
    synthesize_colibri(str(tmp_path / "b"), SMALL)
    synthesize_colibri(str(tmp_path / "c"), ColibriSpec(**{**SMALL.__dict__, "seed": 4}))
    synthesize_colibri(str(tmp_path / "one"), ColibriSpec(**{**SMALL.__dict__, "shards": 1}))
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    other = digest(tmp_path / "c")
    assert all(other[n] != h for n, h in digest(tmp_path / "a").items() if n.endswith(".safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c", "one"]       # no temporary left
    from safetensors.numpy import load_file

    merged = {**load_file(str(tmp_path / "a" / SHARD_NAME.format(0))), **load_file(str(tmp_path / "a" / SHARD_NAME.format(1)))}
    single = load_file(str(tmp_path / "one" / SHARD_NAME.format(0)))
    assert merged.keys() == single.keys() and all(np.array_equal(merged[k], single[k]) for k in single)


def test_an_existing_destination_is_refused_unless_forced(tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists; give another destination or --force"):
        synthesize_colibri(str(dest), SMALL)
    assert os.listdir(dest) == ["keep.txt"]
    synthesize_colibri(str(dest), SMALL, force=True)
    assert "keep.txt" not in os.listdir(dest) and (dest / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    with pytest.raises(UsageError, match="does not exist; create it first"):
        synthesize_colibri(str(tmp_path / "no" / "m"), SMALL)


@pytest.mark.parametrize("bad, msg", [
    (dict(top_k=9, experts=8), "--top-k 9 is more than --experts 8"),
    (dict(dim=100), "--dim 100: must be a multiple of 64"),
    (dict(shards=5, layers=4), "at most --layers"),
    (dict(vocab=100), "--vocab 100"),
    (dict(layers=0), "--layers 0: must be a positive integer"),
])
def test_shapes_colibri_cannot_take_are_refused(bad, msg):
    with pytest.raises(UsageError, match=re.escape(msg)):
        check_spec(ColibriSpec(**bad))


def test_cli_writes_the_directory_and_refuses_an_existing_one(tmp_path):
    out = tmp_path / "m"
    args = ["synth", str(out), "--format", "colibri", "--layers", "1", "--experts", "2", "--top-k", "1",
            "--dim", "128", "--ff", "128", "--vocab", "300"]
    r = runner.invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["format"] == "colibri" and doc["shards"] == 1 and doc["files"] == ["config.json", "out-00000.safetensors",
                                                                                    "tokenizer.json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already exists" in r.output
    assert runner.invoke(app, args + ["--force"]).exit_code == 0
    r = runner.invoke(app, args + ["--force", "--quant", "q4_0"])
    assert r.exit_code == 2 and "--quant is for --format gguf" in r.output
    r = runner.invoke(app, ["synth", str(tmp_path / "x.gguf"), "--shards", "2"])
    assert r.exit_code == 2 and "--shards and --model-type are for --format colibri" in r.output


# -- the embedded engine ---------------------------------------------------------------------------

def run(d, reps=(), prefill=(10,), decode=None, cache=16, lanes=4, **kw):
    models = tuple(discover(str(d / n)) for n in ("model",) + tuple(reps))
    return run_model(SourceSet(models, tuple(prefill), tuple(decode or prefill)), PROMPT, GEN, cache,
                     EMBEDDED.but(lanes=lanes), prompt_seed=11, **kw)


CONFIGS = [
    dict(),                                                                               # 1 source, everything fits
    dict(reps=("r1",), prefill=(10, 5), decode=(10, 6), cache=5, lanes=1, dequant_threads=0),
    dict(reps=("r1", "r2"), prefill=(10, 5, 5), decode=(10, 6, 6), cache=1, lanes=3),    # < one layer's choices
    dict(reps=("r2", "r1"), prefill=(1, 100, 37), decode=(3, 1, 100), cache=0, lanes=2),
]


def test_the_engine_computes_it_with_one_hash_for_every_cache_and_replica_set(colibri_dir):
    g = inspect_model(str(colibri_dir / "model"))
    r = load_resident(g)
    assert r.qtype == ROW_INT8 and r.seed == 7 and (r.dim, r.ff, r.vocab) == (512, 1536, 300)
    assert len(r.row_scales) == 2 and len(r.row_scales[1]) == 8
    assert [s.shape for s in r.row_scales[1][7]] == [(1536,), (1536,), (512,)]
    results = [run(colibri_dir, **c) for c in CONFIGS]
    assert len({x["output_sha256"] for x in results}) == 1, [x["output_sha256"] for x in results]
    # the reads really were split over three copies (at 1:100:37 a 3-block component gives the primary none)
    assert len(results[2]["sources"]) == 3 and all(s["bytes"] > 0 for s in results[2]["sources"])
    assert results[0]["decode"]["misses"] == 0 and results[3]["hits"] == 0
    assert results[2]["misses"] > results[0]["misses"]
    # only the routed experts' int8 rows come through the reader: whole components, never the scales
    assert results[3]["prefill"]["bytes"] % SPEC.component_bytes == 0
    assert results[3]["decode"]["bytes"] == results[3]["decode"]["misses"] * SPEC.expert_bytes


def test_a_copy_that_delivers_a_wrong_byte_changes_the_hash(colibri_dir, tmp_path):
    good = run(colibri_dir)["output_sha256"]
    shutil.copytree(colibri_dir / "model", tmp_path / "bad")
    g = inspect_model(str(tmp_path / "bad"))
    for e in range(g.experts):                               # the first 4 KiB of each expert's gate in layer 0
        ext = g.expert_ranges(0, e)[0]
        with open(tmp_path / "bad" / ext.file, "r+b") as f:
            f.seek(ext.offset)
            f.write(b"\x7f" * 4096)
    models = (discover(str(colibri_dir / "model")), discover(str(tmp_path / "bad")))
    r = run_model(SourceSet(models, (1, 100), (1, 100)), PROMPT, GEN, 16,
                  # the engine's reads exactly: the bad copy reads its own share (hedging a late piece or
                  # balancing a queued one could hand it to the good copy: timing, so a race)
                  EMBEDDED.but(lanes=4, hedge=False, reweigh=False, balance=False), prompt_seed=11)
    assert r["sources"][1]["bytes"] > 0 and r["output_sha256"] != good


def test_cli_run_takes_the_directory_and_its_copies(colibri_dir):
    base = ["run", "--model", str(colibri_dir / "model"), "--prompt-tokens", str(PROMPT), "--gen-tokens", str(GEN),
            "--prompt-seed", "11", "--json"]
    one = runner.invoke(app, base + ["--cache-experts", "16"])
    three = runner.invoke(app, base + ["--cache-experts", "1", "--replica", f"{colibri_dir / 'r1'}*5",
                                       "--replica", f"{colibri_dir / 'r2'}*5"])
    assert one.exit_code == 0 and three.exit_code == 0, one.output + three.output
    a, b = json.loads(one.stdout), json.loads(three.stdout)
    assert a["output_sha256"] == b["output_sha256"] == run(colibri_dir)["output_sha256"]
    assert a["model"]["layout"] == "dir" and [s["bytes"] > 0 for s in b["sources"]] == [True] * 3


def test_run_refuses_a_safetensors_directory_it_cannot_compute(colibri_dir, tmp_path):
    d = tmp_path / "other"
    shutil.copytree(colibri_dir / "model", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3_moe"}))
    with pytest.raises(UsageError, match="model_type is 'qwen3_moe'"):
        inspect_model(str(d))
    (d / "config.json").write_text(json.dumps({**cfg, "first_k_dense_replace": 1}))
    with pytest.raises(UsageError, match="first_k_dense_replace 0"):
        load_resident(inspect_model(str(d)))


# -- the real colibri --------------------------------------------------------------------------------

COLIBRI_BIN = os.environ.get("COLIBRI_BIN", "")
needs_colibri = pytest.mark.skipif(
    not COLIBRI_BIN or not os.path.isfile(COLIBRI_BIN) or not os.access(COLIBRI_BIN, os.X_OK),
    reason=("COLIBRI_BIN is not set: point it at a colibri binary built from JustVugg/colibri's c/ (`make colibri`), "
            "see docs/engine.md" if not COLIBRI_BIN else f"COLIBRI_BIN={COLIBRI_BIN} is not an executable file"))
PROMPT_IDS = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
NEW = 12
MIRROR_LINE = re.compile(r"^MIRROR: primary [\d.]+ GB \((\d+) reads\)((?: \| mirror\d+ [\d.]+ GB \(\d+ reads\))*)", re.M)


def colibri(model, tmp_path, cap=1, **env):
    """Run the binary in its oracle mode (REF: fixed prompt ids, greedy, prints the new token ids,
    writes nothing into the model directory); returns (token ids, stdout, stderr)."""
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"prompt_ids": PROMPT_IDS, "full_ids": PROMPT_IDS + [0] * NEW}))
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SNAP": str(model), "REF": str(ref),
            "CAP_RAISE": "0", "PROF": "1", **env}
    p = subprocess.run([COLIBRI_BIN, str(cap)], env=full, capture_output=True, text=True, errors="replace", timeout=300,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"^GLM C engine\s*: ([\d ]+)$", p.stdout, re.M)
    assert m, p.stdout
    return [int(x) for x in m.group(1).split()], p.stdout, p.stderr


@needs_colibri
def test_the_real_colibri_runs_it_with_and_without_two_mirrors_and_prints_the_same_tokens(colibri_dir, tmp_path):
    model, mirrors = colibri_dir / "model", f"{colibri_dir / 'r1'};{colibri_dir / 'r2'}"
    before = digest(model)
    alone, out, _ = colibri(model, tmp_path)
    assert len(alone) == NEW and "MIRROR:" not in out
    for direct in ("0", "1"):
        tokens, out, err = colibri(model, tmp_path, COLI_MODEL_MIRROR=mirrors, COLI_DISK_WEIGHTS="2,1,1", DIRECT=direct)
        assert tokens == alone, f"DIRECT={direct}"
        assert f"[MIRROR] {colibri_dir / 'r1'}: 2/2 shards (replica 1)" in err
        assert f"[MIRROR] {colibri_dir / 'r2'}: 2/2 shards (replica 2)" in err
        assert "[MIRROR] 3 drives | read split 50% / 25% / 25% (COLI_DISK_WEIGHTS)" in err
        m = MIRROR_LINE.search(out)
        assert m, out
        drives = ["primary"] + re.findall(r"mirror\d+", m.group(2))
        assert drives == ["primary", "mirror1", "mirror2"]                # the MIRROR: line names 3 drives
        reads = [int(m.group(1))] + [int(x) for x in re.findall(r"\((\d+) reads\)", m.group(2))]
        assert all(n > 0 for n in reads), m.group(0)                      # each of them served expert reads
    assert digest(model) == before                                        # oracle mode writes nothing there


@needs_colibri
def test_the_real_colibri_tokenizes_a_prompt_with_the_generated_tokenizer(colibri_dir, tmp_path):
    model = tmp_path / "m"                    # text mode writes .coli_usage into the model (USAGE_SAVE is not read by
    shutil.copytree(colibri_dir / "model", model)    # the GLM engine), so it runs on a copy
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SNAP": str(model), "PROMPT": "the quick brown fox",
           "NGEN": "4", "COLI_TEMP": "0", "TOKENS": "1", "CAP_RAISE": "0"}
    p = subprocess.run([COLIBRI_BIN, "1"], env=env, capture_output=True, text=True, errors="replace", timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    gmask, sop = SPEC.vocab - 2, SPEC.vocab - 1
    m = re.search(r"^\[PROMPT_TOKENS\] \d+: ([\d ]+)$", p.stderr, re.M)
    assert m, p.stderr
    ids = [int(x) for x in m.group(1).split()]
    assert ids[:2] == [gmask, sop] and all(0 <= i < SPEC.vocab for i in ids)   # GLM's [gMASK]<sop> prefix, then BPE ids
    assert re.search(r"^\[TOKENS\] \d+ generated:", p.stderr, re.M)


@needs_colibri
def test_the_real_colibri_takes_a_mirror_holding_a_subset_of_the_shards(colibri_dir, tmp_path):
    part = tmp_path / "part"                  # a smaller drive: only the last layer's shard
    part.mkdir()
    shutil.copyfile(colibri_dir / "model" / SHARD_NAME.format(1), part / SHARD_NAME.format(1))
    alone, _, _ = colibri(colibri_dir / "model", tmp_path)
    tokens, out, err = colibri(colibri_dir / "model", tmp_path, COLI_MODEL_MIRROR=str(part), COLI_DISK_WEIGHTS="1,1")
    assert tokens == alone
    assert f"[MIRROR] {part}: 1/2 shards (replica 1)" in err and "[MIRROR] 2 drives" in err
    m = MIRROR_LINE.search(out)
    assert m and re.findall(r"mirror\d+", m.group(2)) == ["mirror1"]
