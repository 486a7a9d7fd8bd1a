"""Stand-in engines: the embedded engine behind a real engine's interface (docs/engine.md,
"Stand-in engines"), so the real-engine tuner (`engine-bridge autotune --binary`) runs end to end
where the real binary cannot (no Metal here for ds4-argodrive; no DeepSeek V4.1 model for colibri's
V4.1 engine).

    python -m engine_bridge.standin ENGINE [ENGINE ARGS]      (ENGINE: ds4-argodrive or colibri)

It reads the same environment variables and arguments as the engine (the engine's profile reads
them: `standin_call` of its `Engine.profile`), reads the model's experts in the engine's read
pattern with real reads through the split reader while the embedded engine computes the tokens
(greedy), and prints the engine's own lines (`standin_lines`): the load and split lines, the
per-drive counters, the output and the timing. `engine-bridge standin PATH --engine NAME` writes an
executable that starts it, for `--binary`.

What it does not reproduce: the real engine's compute speed (it is numpy), its threads beyond the
reads it keeps in flight, its page cache use (every read is cold, O_DIRECT), and for colibri's
probe the real probe's reads (it times one cold read of each drive's first shard).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time

import numpy as np

from core.coldio import aligned_buffer, open_cold
from engines.handoff import StandinRun
from engines.registry import ENGINES

PROBE_BYTES = 8 << 20            # bytes each drive is timed reading when the engine probes


def look(path: str) -> dict:
    """The facts an engine's call is judged on: a directory's model_type, layers and shards
    (name -> (bytes, safetensors header)); a file's size, device and inode; {} when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return {}
    if not stat.S_ISDIR(st.st_mode):
        return {"size": st.st_size, "dev": st.st_dev, "ino": st.st_ino}
    out: dict = {"shards": {}}
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        out["model_type"] = cfg.get("model_type")
        out["layers"] = cfg.get("num_hidden_layers")
    except (OSError, ValueError):
        return {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            with open(os.path.join(path, name), "rb") as f:
                head = f.read(8)
                n = int.from_bytes(head, "little") if len(head) == 8 else 0
                header = head + f.read(min(n, 100 << 20))
            out["shards"][name] = (os.path.getsize(os.path.join(path, name)), header)
    return out


def probe_weights(models) -> tuple[int, ...]:
    """One integer weight per source from a cold read of PROBE_BYTES of its largest file, timed:
    what an engine that measures its drives at startup would see (scaled so the fastest is 100)."""
    rates = []
    for m in models:
        path = max(m.paths, key=os.path.getsize)
        size = os.path.getsize(path)
        n = max(4096, min(PROBE_BYTES, size - size % 4096))
        with open_cold(path) as r:
            buf = aligned_buffer(n)
            t0 = time.perf_counter()
            r.read_into(buf, 0)
            rates.append(n / max(time.perf_counter() - t0, 1e-9))
    top = max(rates)
    return tuple(max(1, round(100 * x / top)) for x in rates)


def run(engine: str, argv, env) -> int:
    from engine_bridge.moe.blas import pin_blas_threads
    from engine_bridge.moe.inference import EmbeddedEngine, prompt_tokens
    from engine_bridge.moe.resident import inspect_model, load_resident
    from engine_bridge.moe.inputs import SourceSet
    from engine_bridge.reader import SplitReader
    from models.cache import ExpertCache
    from models.modelset import discover

    prof = ENGINES[engine].profile
    call = prof.standin_call(env, list(argv), look)
    if call.error:
        _say(sys.stderr, call.error)
        return call.rc
    for line in call.stderr:
        _say(sys.stderr, line)
    pin_blas_threads(1)
    models = tuple(discover(p) for p in call.sources)
    geometry = inspect_model(models[0].path)
    resident = load_resident(geometry)
    expected = None
    if call.reference:
        with open(call.reference, encoding="utf-8") as f:
            ref = json.load(f)
        prompt = np.asarray(ref[call.prompt_key], dtype=np.int64)
        if call.full_key:
            expected = tuple(int(x) for x in ref[call.full_key][len(prompt):])
        else:
            expected = tuple(int(x) for x in ref[call.expected_key])
        gen = len(expected)
    else:
        prompt = prompt_tokens(call.prompt_tokens, resident.vocab, call.prompt_seed)
        gen = call.gen_tokens
    weights, how = call.weights, call.how
    if weights is None:
        weights, how = probe_weights(models), "measured"
    decode = call.decode_weights or weights
    sources = SourceSet(models=models, prefill=tuple(weights), decode=tuple(decode), engine=engine,
                        switches=frozenset(call.switches))
    total = geometry.layers * geometry.experts
    cache = ExpertCache(min(call.cache_experts, total), total)
    # no hedging: the engines do not re-issue a late piece elsewhere, so neither does their stand-in
    with SplitReader(models, sources.prefill, sources.decode, engine=engine, cold=True) as reader:
        eng = EmbeddedEngine(geometry, resident, reader.submit_read, sources.step_reads(geometry, reader.healthy), cache,
                     in_flight=sources.in_flight())
        try:
            o = eng.run(prompt, max(gen - 1, 0))     # the first token comes from the prefill's logits
        finally:
            eng.close()
        stats = reader.stats()
    done = StandinRun(prompt=tuple(int(x) for x in prompt), output=tuple(o.tokens[:gen]), expected=expected,
                      prefill_s=o.prefill.seconds, decode_s=o.decode.seconds, hits=o.prefill.hits + o.decode.hits,
                      misses=o.prefill.misses + o.decode.misses,
                      sources=tuple((s.bytes, s.reads, s.lands_last, s.gap_ns) for s in stats.sources),
                      weights=tuple(weights), how=how, layers=geometry.layers, experts=geometry.experts,
                      model_type=geometry.arch)
    out, err, rc = prof.standin_lines(call, done)
    for line in err:
        _say(sys.stderr, line)
    for line in out:
        _say(sys.stdout, line)
    return rc


STANDIN_MARK = b"# replica-tuner's stand-in for "     # its second line: what `standin` may replace


def launcher_text(engine: str, python: str = sys.executable) -> str:
    """An executable (sh) that runs the stand-in of `engine` with this Python and this checkout of
    the project. It names the variables the stand-in reads, so `launch`'s dead-knob scan finds them."""
    prof = ENGINES[engine].profile
    names = sorted(set(prof.managed_keys()) | set(prof.report_env()) | set(prof.frozen_state()[0]))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return ("#!/bin/sh\n"
            f"# replica-tuner's stand-in for {engine}: the embedded engine behind its interface (docs/engine.md)\n"
            f"# reads: {' '.join(names)}\n"
            f"PYTHONPATH={_sh(root)}${{PYTHONPATH:+:$PYTHONPATH}} exec {_sh(python)} -m engine_bridge.standin {engine} \"$@\"\n")


def _say(stream, line: str) -> None:
    """One line of the engine's own output (the stand-in is a program whose lines are its interface)."""
    stream.write(line + "\n")
    stream.flush()


def _sh(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ENGINES or ENGINES[sys.argv[1]].profile is None:
        _say(sys.stderr, f"usage: python -m engine_bridge.standin ENGINE [ARGS] (ENGINE: "
                         f"{', '.join(n for n, e in ENGINES.items() if e.profile is not None)})")
        raise SystemExit(2)
    raise SystemExit(run(sys.argv[1], sys.argv[2:], dict(os.environ)))


if __name__ == "__main__":
    main()
