"""Our embedded engine and the real llama.cpp on the same qwen3moe model: how many greedy tokens agree.

    LLAMA_CPP_BIN_DIR=/path/to/llama.cpp/bin python -m bench.llama_cpp_agreement [--tokens 40]

For each model shape and expert type (`synth --format qwen3moe`, written to a temporary folder)
and each prompt: the prompt is tokenized by our encoder (the same ids as llama-tokenize, tested),
our engine decodes greedily (`run_model` with those ids), llama.cpp decodes greedily with
llama-simple on one OpenMP thread, and the line says how many leading tokens agree (compared as the
bytes both print). No timing is measured. llama-simple, not llama-completion: llama-completion's
logger is not flushed at exit, so its stdout can end short (docs/engine.md, "The real llama.cpp");
llama-simple prints each token from its main thread and gives the same greedy text.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from engine_bridge.moe.inputs import SourceSet
from engine_bridge.moe.session import run_model
from engine_bridge.reader.settings import EMBEDDED
from engine_bridge.moe.synth_qwen3moe import Qwen3MoeSpec, decode, encode, max_vocab, synthesize_qwen3moe
from models.modelset import discover

PROMPTS = ("hello world", "the quick brown fox", "once upon a time")
SHAPES = {
    "tiny (6 x 8 experts, width 64)": dict(layers=6, experts=8, top_k=2, dim=64, ff=64, heads=2, kv_heads=1, head_dim=32,
                                           seed=3),
    "default (6 x 16 experts, width 512)": dict(),
}


def llama_text(binary: str, model: str, prompt: str, n: int) -> bytes:
    """The bytes llama-simple generates after echoing the prompt (it ends with a newline)."""
    p = subprocess.run([binary, "-m", model, "-n", str(n), prompt], capture_output=True, stdin=subprocess.DEVNULL,
                       timeout=600, env={**os.environ, "OMP_THREAD_LIMIT": "1"})
    if p.returncode or not p.stdout.startswith(prompt.encode()):
        sys.exit(f"llama-simple failed (rc {p.returncode}): {p.stderr.decode(errors='replace')[-500:]}")
    return p.stdout[len(prompt.encode()):-1]


def agreeing_tokens(ours: list[int], theirs: bytes, vocab: int) -> int:
    n, at = 0, 0
    for t in ours:
        piece = decode([t], vocab)
        if theirs[at:at + len(piece)] != piece:
            break
        at += len(piece)
        n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=40, help="tokens each engine generates")
    a = ap.parse_args()
    folder = os.environ.get("LLAMA_CPP_BIN_DIR", "")
    binary = os.path.join(folder, "llama-simple")
    if not folder or not os.access(binary, os.X_OK):
        print("LLAMA_CPP_BIN_DIR must name the bin folder of a llama.cpp build (bench/build_llama_cpp.sh)", file=sys.stderr)
        return 2
    vocab = max_vocab()
    with tempfile.TemporaryDirectory() as tmp:
        for shape, kw in SHAPES.items():
            for quant in ("f32", "q8_0"):
                path = os.path.join(tmp, f"m-{quant}.gguf")
                s = synthesize_qwen3moe(path, Qwen3MoeSpec(**kw, quant=quant), force=True)
                counts = []
                for prompt in PROMPTS:
                    ids = encode(prompt, vocab)
                    ours = run_model(SourceSet((discover(path),), (10,), (10,)), len(ids), a.tokens - 1, 10_000,
                                     EMBEDDED.but(lanes=2), 0,
                                     prompt_ids=ids)["output_ids"]
                    counts.append(agreeing_tokens(ours, llama_text(binary, path, prompt, a.tokens), vocab))
                print(f"{shape}, {quant} experts ({s['bytes'] / 1e6:.1f} MB): tokens agreeing of {a.tokens}: "
                      + ", ".join(f"{p!r} {c}" for p, c in zip(PROMPTS, counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
