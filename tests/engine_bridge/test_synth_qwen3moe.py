"""`synth --format qwen3moe`: a GGUF the real llama.cpp runs, read back by the gguf library, by our
tensor table and geometry (replay), computed by the embedded engine (one output hash for every
cache size, replica set and file layout), and, when LLAMA_CPP_BIN_DIR names llama.cpp's binaries,
loaded and run by the real llama.cpp (deterministic, same tokenizer, same greedy tokens as ours)."""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from engine_bridge.cli import app
from engine_bridge.moe.constants import COMPONENTS
from engine_bridge.moe.inference import dequantize
from engine_bridge.moe.inputs import SourceSet
from engine_bridge.moe.resident import inspect_model, load_resident
from engine_bridge.moe.session import run_model
from engine_bridge.reader.settings import EMBEDDED
from engine_bridge.moe.synth_qwen3moe import (
    SPECIAL_TOKENS,
    Qwen3MoeSpec,
    check_spec,
    decode,
    encode,
    max_vocab,
    synthesize_qwen3moe,
    tensor_plan,
    train_bpe,
    vocabulary,
)
from models.modelset import discover
from models.tensortable import inspect_model as inspect_any
from replicas.resplit import resplit
from tests.helpers import llama_completion, llama_cpp_bin, llama_simple, needs_llama_cpp

# 6 layers (75 tensors, the shape of the one-tensor-per-file set) x 8 experts, top-2, width 64: ~1 MB.
SPEC = Qwen3MoeSpec(layers=6, experts=8, top_k=2, dim=64, ff=64, heads=2, kv_heads=1, head_dim=32, seed=3)
PROMPT, GEN = 24, 6
runner = CliRunner()


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """The model (q8_0 experts) and two copies; an f32-expert twin ("f32.gguf")."""
    d = tmp_path_factory.mktemp("qwen3moe")
    synthesize_qwen3moe(str(d / "m.gguf"), SPEC)
    for name in ("r1.gguf", "r2.gguf"):
        shutil.copyfile(d / "m.gguf", d / name)
    synthesize_qwen3moe(str(d / "f32.gguf"), Qwen3MoeSpec(**{**SPEC.__dict__, "quant": "f32"}))
    return d


# -- the file ---------------------------------------------------------------------------------------

def test_the_gguf_library_reads_llama_cpps_qwen3moe_layout(qwen):
    r = gguf.GGUFReader(str(qwen / "m.gguf"))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    assert f["general.architecture"] == "qwen3moe" and r.alignment == 32          # GGUF's default, as published files
    for key, want in (("block_count", 6), ("embedding_length", 64), ("expert_count", 8), ("expert_used_count", 2),
                      ("expert_feed_forward_length", 64), ("attention.head_count", 2), ("attention.head_count_kv", 1),
                      ("attention.key_length", 32), ("attention.value_length", 32), ("context_length", 4096)):
        assert f[f"qwen3moe.{key}"] == want, key
    assert f["qwen3moe.rope.freq_base"] == 1e6 and f["qwen3moe.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert (f["tokenizer.ggml.model"], f["tokenizer.ggml.pre"], f["tokenizer.ggml.add_bos_token"]) == ("gpt2", "qwen2", False)
    tokens = f["tokenizer.ggml.tokens"]
    assert len(tokens) == max_vocab() == len(set(tokens)) and tokens[-3:] == list(SPECIAL_TOKENS)
    assert f["tokenizer.ggml.bos_token_id"] == max_vocab() - 3 and f["tokenizer.ggml.eos_token_id"] == max_vocab() - 1
    assert f["tokenizer.ggml.token_type"][-4:] == [1, 3, 3, 3]
    # exactly the tensors src/models/qwen3moe.cpp creates, in ggml order (ne) and type
    ne = {t.name: (tuple(int(x) for x in t.shape), t.tensor_type.name) for t in r.tensors}
    want = {"token_embd.weight": ((64, 331), "F32"), "output_norm.weight": ((64,), "F32"),
            "output.weight": ((64, 331), "F32")}
    for i in range(6):
        p = f"blk.{i}."
        want.update({p + "attn_norm.weight": ((64,), "F32"), p + "attn_q.weight": ((64, 64), "F32"),
                     p + "attn_k.weight": ((64, 32), "F32"), p + "attn_v.weight": ((64, 32), "F32"),
                     p + "attn_output.weight": ((64, 64), "F32"), p + "attn_q_norm.weight": ((32,), "F32"),
                     p + "attn_k_norm.weight": ((32,), "F32"), p + "ffn_norm.weight": ((64,), "F32"),
                     p + "ffn_gate_inp.weight": ((64, 8), "F32"), p + "ffn_gate_exps.weight": ((64, 64, 8), "Q8_0"),
                     p + "ffn_up_exps.weight": ((64, 64, 8), "Q8_0"), p + "ffn_down_exps.weight": ((64, 64, 8), "Q8_0")})
    assert ne == want and len(r.tensors) == 75 == len(tensor_plan(check_spec(SPEC)))
    out = next(t for t in r.tensors if t.name == "output.weight")
    assert not np.asarray(out.data)[-3:].any() and np.asarray(out.data)[:-3].any()   # control tokens: logit 0


def test_same_arguments_same_bytes_other_seed_other_bytes(tmp_path, qwen):
    synthesize_qwen3moe(str(tmp_path / "a.gguf"), SPEC)
    synthesize_qwen3moe(str(tmp_path / "b.gguf"), Qwen3MoeSpec(**{**SPEC.__dict__, "seed": 4}))
    assert sha(tmp_path / "a.gguf") == sha(qwen / "m.gguf") != sha(tmp_path / "b.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf"]            # no temporary left


def test_an_existing_file_is_refused_unless_forced(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"mine")
    with pytest.raises(UsageError, match="already exists; give another name, or --force"):
        synthesize_qwen3moe(str(p), SPEC)
    assert p.read_bytes() == b"mine"
    synthesize_qwen3moe(str(p), SPEC, force=True)
    assert p.read_bytes()[:4] == b"GGUF" and sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]
    with pytest.raises(UsageError, match="is a folder"):
        synthesize_qwen3moe(str(tmp_path), SPEC, force=True)


def test_size_solves_the_expert_width_and_progress_reaches_the_total(tmp_path):
    seen = []
    spec = Qwen3MoeSpec(**{**SPEC.__dict__, "size": 3_000_000})
    s = synthesize_qwen3moe(str(tmp_path / "m.gguf"), spec, progress=lambda done, total: seen.append((done, total)))
    step = 3 * 6 * 8 * 64 * 34                   # bytes of 32 more expert width (one Q8_0 block per row)
    assert s["ff"] % 32 == 0 and s["ff"] > 64 and 3_000_000 - step - 64 * 1024 < s["bytes"] <= 3_000_000
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) == 75
    assert s["bytes"] == os.path.getsize(tmp_path / "m.gguf") and s["routed_bytes"] == 6 * 8 * s["expert_bytes"]


@pytest.mark.parametrize("bad, msg", [
    (dict(top_k=9), "--top-k 9 is more than --experts 8"),
    (dict(dim=100), "--dim 100: must be a multiple of 32"),
    (dict(ff=40), "--ff 40: must be a multiple of 32"),
    (dict(heads=3, kv_heads=2), "heads 3: must be a multiple of kv_heads 2"),
    (dict(head_dim=33), "RoPE needs an even head width"),
    (dict(vocab=100), "--vocab 100: the tokenizer has 260..331 ids"),
    (dict(layers=0), "--layers 0: must be a positive integer"),
    (dict(experts=2000, top_k=2), "at most 512 layers and 1024 experts"),
    (dict(quant="q4_k"), "--quant 'q4_k'"),
    (dict(size=1000), "--size 1000: too small"),
])
def test_shapes_llama_cpp_or_the_writer_cannot_take_are_refused(bad, msg):
    with pytest.raises(UsageError, match=re.escape(msg)):
        check_spec(Qwen3MoeSpec(**{**SPEC.__dict__, **bad}))


def test_the_tokenizer_is_a_real_byte_level_bpe():
    merges = train_bpe()
    tokens, kept = vocabulary(max_vocab())
    assert len(merges) == len(kept) == max_vocab() - 259 and len(tokens) == max_vocab()
    for m in merges:                                         # a merge's parts and its result are tokens
        a, b = m.split(" ")
        assert a in tokens and b in tokens and a + b in tokens
    text = "hello world. the quick brown fox jumps, 42 times!\n"
    ids = encode(text, max_vocab())
    assert decode(ids, max_vocab()) == text.encode() and len(ids) < 0.6 * len(text.encode())  # merges apply
    fewer = encode(text, 260)                                                                  # one merge kept
    assert max(fewer) < 260 and len(fewer) > len(ids) and decode(fewer, 260) == text.encode()
    assert decode([max_vocab() - 3, *ids], max_vocab()) == text.encode()                       # control tokens print nothing


def test_cli_writes_it_and_refuses_options_of_other_formats(tmp_path):
    out = tmp_path / "m.gguf"
    args = ["synth", str(out), "--format", "qwen3moe", "--layers", "1", "--experts", "4", "--top-k", "2", "--dim", "64"]
    r = runner.invoke(app, args + ["--size", "1M", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["kind"], doc["format"], doc["tensors"], doc["bytes"]) == ("synth", "qwen3moe", 15, out.stat().st_size)
    assert doc["bytes"] <= 1 << 20 and doc["ff"] % 32 == 0
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already exists" in r.output
    for extra, words in ((["--ff", "64", "--size", "1M"], "give --ff or --size"), (["--shards", "2"], "--format colibri"),
                         (["--vocab", "5"], "--vocab 5")):
        r = runner.invoke(app, args + ["--force"] + extra)
        assert r.exit_code == 2 and words in r.output, r.output
    r = runner.invoke(app, ["synth", str(tmp_path / "x.gguf"), "--size", "1M"])
    assert r.exit_code == 2 and "--size is for --format qwen3moe" in r.output


# -- our geometry, replay and the embedded engine -------------------------------------------------------

def test_our_geometry_finds_the_stacked_experts(qwen):
    path = str(qwen / "m.gguf")
    g = inspect_any(path)
    assert inspect_model(path) == g
    c = 64 * 64 // 32 * 34
    assert (g.arch, g.layers, g.experts, g.top_k, g.component_bytes, g.shared_experts) == ("qwen3moe", 6, 8, 2, c, None)
    r = gguf.GGUFReader(path)
    byname = {t.name: t for t in r.tensors}
    with open(path, "rb") as f:
        for layer, e in ((0, 0), (5, 7), (3, 2)):
            for comp, ext in zip(COMPONENTS, g.expert_ranges(layer, e)):
                t = byname[f"blk.{layer}.ffn_{comp}_exps.weight"]
                f.seek(ext.offset)
                raw = f.read(ext.length)
                assert raw == np.asarray(t.data[e]).tobytes()            # expert e is the e-th slice
                assert np.array_equal(dequantize(raw, "Q8_0", 64, 64),
                                      gguf.quants.dequantize(np.asarray(t.data[e]), gguf.GGMLQuantizationType.Q8_0))


def test_replay_runs_on_it(qwen):
    # hedging, re-weighting and balancing off: each source then reads what the engine's split gives it, the
    # same in every run (with them on, which drive takes a queued chunk depends on which lane is free first)
    r = runner.invoke(app, ["replay", "--model", str(qwen / "m.gguf"), "--replica", f"{qwen / 'r1.gguf'}*5",
                            "--prompt-tokens", "64", "--gen-tokens", "8", "--cache-experts", "4", "--json",
                            "--no-hedge", "--no-reweigh", "--no-balance"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "replay" and doc["model"]["arch"] == "qwen3moe" and doc["misses"] > 0
    # every byte the steps read is counted on the source that read it (a read smaller than ds4-argodrive's
    # 256 KiB grid stays whole on the primary, so a replica may read nothing here)
    read = [s["bytes"] for s in doc["sources"]]
    assert sum(read) == doc["prefill"]["bytes"] + doc["decode"]["bytes"] > 0


def run(paths, prefill=(10,), decode=None, cache=48, lanes=4, engine=None, **kw):
    models = tuple(discover(str(p)) for p in paths)
    sources = SourceSet(models, tuple(prefill), tuple(decode or prefill))
    if engine is not None:
        sources = dataclasses.replace(sources, engine=engine)
    return run_model(sources, PROMPT, GEN, cache, EMBEDDED.but(lanes=lanes), prompt_seed=11, **kw)


def test_the_engine_computes_it_with_one_hash_for_every_cache_replica_set_and_layout(qwen, tmp_path):
    r = load_resident(inspect_model(str(qwen / "m.gguf")))
    at = r.attention
    assert (at.heads, at.kv_heads, at.head_dim, at.rope_dims, at.rope_base) == (2, 1, 32, 32, 1e6)
    assert r.qtype == "Q8_0" and (r.dim, r.ff, r.vocab) == (64, 64, 331) and "ffn_gate_shexp" not in r.layers[0]
    m, r1, r2 = (qwen / n for n in ("m.gguf", "r1.gguf", "r2.gguf"))
    for d in ("a", "b"):                                            # one tensor per file: 75 files, twice
        (tmp_path / d).mkdir()
        resplit(str(m), str(tmp_path / d))
    split, split_copy = (tmp_path / d / "m-00001-of-00075.gguf" for d in ("a", "b"))
    results = [run([m]), run([m, r1], (10, 5), (10, 6), cache=5, lanes=1, dequant_threads=0),
               run([m, r1, r2], (10, 5, 5), cache=1, lanes=3), run([m, r2, r1], (1, 100, 37), (3, 1, 100), cache=0),
               run([split]), run([split, split_copy], (5, 5), cache=2, engine="llama.cpp")]
    assert len({x["output_sha256"] for x in results}) == 1, [x["output_sha256"] for x in results]
    assert results[4]["model"]["layout"] == "gguf-split" and len(results[0]["output_ids"]) == GEN + 1
    assert results[0]["misses"] <= 6 * 8 and results[3]["hits"] == 0 and results[2]["misses"] > results[0]["misses"]
    # the last run's engine is llama.cpp, whose own rule places the split set's files on both copies (per file), so
    # both serve whatever the reader does; under ds4-argodrive (every other run) reads under its 256 KiB grid stay
    # whole on the primary and a copy serves only what the reader moves to it, which depends on which lane is free
    # first: counted, not required
    assert all(s["bytes"] > 0 for s in results[5]["sources"])
    assert all(sum(s["bytes"] for s in x["sources"]) == x["prefill"]["bytes"] + x["decode"]["bytes"] for x in results)
    assert results[3]["decode"]["bytes"] == results[3]["decode"]["misses"] * 3 * 64 * 64 // 32 * 34


def test_a_copy_that_delivers_a_wrong_byte_changes_the_hash(qwen, tmp_path):
    good = run([qwen / "m.gguf"])["output_sha256"]
    bad = tmp_path / "bad.gguf"
    shutil.copyfile(qwen / "m.gguf", bad)
    g = inspect_model(str(bad))
    with open(bad, "r+b") as f:
        for e in range(g.experts):                          # each expert's gate in layer 0: its first block's scale
            f.seek(g.expert_ranges(0, e)[0].offset)
            f.write(b"\x00\x3c")                            # f16 1.0
    r = run([bad])
    assert r["decode"]["bytes"] + r["prefill"]["bytes"] > 0 and r["output_sha256"] != good


def test_prompt_ids_are_the_prompt(qwen):
    ids = encode("the quick brown fox", max_vocab())
    a = run_model(SourceSet((discover(str(qwen / "m.gguf")),), (10,), (10,)), 999, 3, 16, EMBEDDED.but(lanes=2), 0,
                  prompt_ids=ids)
    assert a["prefill_tokens"] == len(ids) and len(a["output_ids"]) == 4
    with pytest.raises(UsageError, match="prompt ids must be in 0..330"):
        run_model(SourceSet((discover(str(qwen / "m.gguf")),), (10,), (10,)), 1, 1, 16, EMBEDDED.but(lanes=2), 0,
                  prompt_ids=[331])


# -- the real llama.cpp -----------------------------------------------------------------------------------

@needs_llama_cpp("llama-completion", "llama-simple")
def test_llama_cpp_loads_it_and_generates_the_same_bytes_twice(qwen, tmp_path):
    """llama-simple prints every token from its main thread: two runs, the same 16 tokens.
    llama-completion (what benchmarks run) loads it and generates the same text; its stdout may be
    cut short by its unflushed logger (tests.helpers.llama_completion), so each run's stdout must be
    a prefix of that text plus its closing "\\n\\n", and all of it when its stderr says it is complete."""
    text = llama_simple(qwen / "m.gguf", "hello world", 16, cwd=tmp_path)
    assert llama_simple(qwen / "m.gguf", "hello world", 16, cwd=tmp_path) == text and len(text) >= 16
    for _ in range(2):
        out, complete = llama_completion(qwen / "m.gguf", "hello world", 16, cwd=tmp_path)
        assert (text + b"\n\n").startswith(out) and (out == text + b"\n\n" or not complete), (out, text)


@needs_llama_cpp("llama-tokenize")
def test_llama_cpp_tokenizes_as_our_encoder_does(qwen):
    for text in ("hello world. the quick brown fox", "  two  spaces, it's 123!\n\nnew", "Hello World"):
        p = subprocess.run([llama_cpp_bin("llama-tokenize"), "-m", str(qwen / "m.gguf"), "-p", text, "--ids"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        assert json.loads(p.stdout.strip().splitlines()[-1]) == encode(text, max_vocab()), text


@needs_llama_cpp("llama-simple")
def test_our_greedy_tokens_are_llama_cpps_with_f32_experts(qwen, tmp_path):
    """Both compute the same qwen3moe layer; with F32 experts neither quantizes activations, so the
    arithmetic differs only in summation order and llama.cpp's F16 KV cache. Measured
    (bench/llama_cpp_agreement.py): 33, 40 and 40 of 40 tokens equal on these prompts with one
    build, 15, 40 and 40 with the same source built on another machine's CPU (its kernels sum in
    another order: a near-tie of this tiny random model flips); the first 8 are asserted. (Q8_0
    experts: llama.cpp quantizes activations to Q8_0 and the tokens part sooner; docs/engine.md.)"""
    for prompt in ("hello world", "the quick brown fox", "once upon a time"):
        ids = encode(prompt, max_vocab())
        ours = run_model(SourceSet((discover(str(qwen / "f32.gguf")),), (10,), (10,)), len(ids), 15, 64, EMBEDDED.but(lanes=2), 0,
                         prompt_ids=ids)["output_ids"]
        theirs = llama_simple(qwen / "f32.gguf", prompt, 16, cwd=tmp_path)
        assert theirs.startswith(decode(ours[:8], max_vocab())), (prompt, decode(ours, max_vocab()), theirs)
