"""engine-bridge commands: synth, run and replay (the embedded engine)."""

from __future__ import annotations

import csv
import ctypes
import glob
import io
import json
import os
from typing import List, Optional

import typer

from core.cli import JsonOption, RigOption, err, print_json
from core.errors import UsageError
from core.fsutil import atomic_write_text
from core.units import format_bytes, format_rate
from engine_bridge.engine.constants import (
    CACHE_EXPERTS,
    CSV_COLUMNS,
    DEQUANT_THREADS,
    GEN_TOKENS,
    LANES,
    PREFILL_CHUNK_TOKENS,
    PRIMARY_WEIGHT,
    PROMPT_SEED,
    PROMPT_TOKENS,
    SYNTH_DEFAULTS,
    TRACE_SCHEMA,
)


def limit_blas_threads(n: int = 1) -> bool:
    """Pin numpy's OpenBLAS to n threads (best effort; True if applied).

    The engine's matrices are small and the reader's lanes need the other core: with BLAS
    threads spinning on a loaded 2-core machine the same forward pass ran 8x slower.
    """
    import numpy as np

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*.so*"))
    for lib in libs:
        try:
            so = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads_64_", "openblas_set_num_threads"):
            fn = getattr(so, sym, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                return True
    return False


def parse_replica(text: str) -> tuple[str, int]:
    """'PATH*W' -> (absolute path, W)."""
    path, star, w = str(text).rpartition("*")
    if not star or not path:
        raise UsageError(f"--replica {text!r}: use PATH*WEIGHT, e.g. /mnt/green/model.gguf*5")
    try:
        weight = int(w)
    except ValueError:
        raise UsageError(f"--replica {text!r}: weight {w!r} is not an integer 1..100") from None
    return os.path.abspath(path), weight


def resolve_plan(plan: str, rig: Optional[str]) -> str:
    """A plan path, 'latest' (the newest in <rig>/plans), or a name in <rig>/plans (.json optional)."""
    from core.rig import Rig, rig_dir
    from planner.plans import resolve_plan_path

    return resolve_plan_path(plan, Rig(root=rig_dir(rig)))


def build_sources(model: str, replicas: List[str], primary_weight: int, decode_weights: Optional[str],
                  plan: Optional[str], rig: Optional[str]):
    from engine_bridge.engine.inference import SourceSet
    from engines.split import check_weights, parse_weights
    from planner.plan import plan_from_json

    model = os.path.abspath(model)
    if plan:
        if replicas:
            raise UsageError("give either --plan or --replica, not both (the plan lists its sources)")
        path = resolve_plan(plan, rig)
        with open(path, encoding="utf-8") as f:
            p = plan_from_json(f.read(), path)
        paths = tuple(os.path.abspath(s.path) for s in p.sources)
        if os.path.realpath(paths[0]) != os.path.realpath(model):
            raise UsageError(f"--model {model} is not the plan's primary {paths[0]} ({path}); run the plan's model "
                             "or re-solve the plan for this one")
        prefill, decode = tuple(p.prefill.weights), tuple(p.decode.weights)
        if decode_weights:
            decode = parse_weights(decode_weights)
    else:
        reps = [parse_replica(r) for r in replicas]
        paths = (model,) + tuple(p for p, _ in reps)
        prefill = check_weights((primary_weight,) + tuple(w for _, w in reps))
        decode = parse_weights(decode_weights) if decode_weights else prefill
    if len(decode) != len(paths):
        raise UsageError(f"--decode-weights {':'.join(map(str, decode))}: {len(decode)} weights for {len(paths)} sources; "
                         "give exactly one per source, primary first (the engine silently ignores a wrong count)")
    return SourceSet(paths=paths, prefill=prefill, decode=decode)


def csv_text(row: dict, header: bool) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(CSV_COLUMNS)
    w.writerow([row[c] for c in CSV_COLUMNS])
    return buf.getvalue()


def _append_csv_and_report(result: dict, csv_file: Optional[str]) -> None:
    """Append the CSV row (header on a new file) and print the reader's counters and events on stderr."""
    if csv_file:
        new = not os.path.exists(csv_file) or os.path.getsize(csv_file) == 0
        with open(csv_file, "a", encoding="utf-8") as f:
            f.write(csv_text(result, header=new))
    err.print(result["reader"]["text"], highlight=False, markup=False, soft_wrap=True)
    for e in result["events"]:
        err.print(f"event: {e['kind']} source {e['source']}: {e['message']}", highlight=False, markup=False, soft_wrap=True)


def _trace_doc(result: dict, trace: list) -> dict:
    m = result["model"]
    return {"schema": TRACE_SCHEMA, "kind": "routing-trace", "layers": m["layers"], "experts": m["experts"],
            "top_k": m["top_k"], "steps": [{"phase": ph, "layers": sel} for ph, sel in trace]}


# Options `run` and `replay` share (the same sources, cache and reader settings).
SHARED = dict(
    plan=typer.Option(None, "--plan", metavar="PLAN", help="Plan file, 'latest', or a name in <rig>/plans: sources and weights."),
    replica=typer.Option([], "--replica", metavar="PATH*W", help="A replica and its base weight (repeatable)."),
    primary_weight=typer.Option(PRIMARY_WEIGHT, "--primary-weight", help="Base weight of the primary with --replica."),
    decode_weights=typer.Option(None, "--decode-weights", metavar="W,W,..", help="Decode weights, one per source."),
    cache_experts=typer.Option(CACHE_EXPERTS, "--cache-experts", help="Expert cache size, experts."),
    lanes=typer.Option(LANES, "--lanes", help="Reader threads per source."),
    chunk_tokens=typer.Option(PREFILL_CHUNK_TOKENS, "--chunk-tokens", help="Prefill chunk, tokens."),
    csv_file=typer.Option(None, "--csv", metavar="FILE", help="Append the ds4-bench CSV row here."),
    cached=typer.Option(False, "--cached", help="Page-cache reads instead of cold reads (reader ceiling only)."),
)


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""

    @app.command("synth")
    def synth_cmd(
        out: str = typer.Argument(..., metavar="OUT.gguf", help="Model file to write."),
        layers: int = typer.Option(SYNTH_DEFAULTS["layers"], "--layers", help="Transformer layers."),
        experts: int = typer.Option(SYNTH_DEFAULTS["experts"], "--experts", help="Routed experts per layer."),
        top_k: int = typer.Option(SYNTH_DEFAULTS["top_k"], "--top-k", help="Experts chosen per token."),
        dim: int = typer.Option(SYNTH_DEFAULTS["dim"], "--dim", help="Model width."),
        ff: int = typer.Option(SYNTH_DEFAULTS["ff"], "--ff", help="Expert hidden width (dim*ff must be a multiple of 65536)."),
        vocab: int = typer.Option(SYNTH_DEFAULTS["vocab"], "--vocab", help="Vocabulary size."),
        seed: int = typer.Option(SYNTH_DEFAULTS["seed"], "--seed", help="Same seed and shape, same bytes."),
        quant: str = typer.Option(SYNTH_DEFAULTS["quant"], "--quant", help="Routed expert type: q8_0, q4_0, or f32 (unquantized: least compute per byte read)."),
        json_out: bool = JsonOption,
    ):
        """Write a small but complete MoE transformer (GGUF) laid out like the real model."""
        from engine_bridge.engine.synth import SynthSpec, check_spec, synthesize

        spec = check_spec(SynthSpec(layers, experts, top_k, dim, ff, vocab, seed, quant.lower()))
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                      console=err, transient=True, disable=json_out) as bar:
            task = bar.add_task(f"synth {os.path.basename(out)}", total=None)
            summary = synthesize(out, spec, lambda done, total: bar.update(task, completed=done, total=total))
        if json_out:
            print_json({"schema": 1, "kind": "synth", **summary})
        else:
            typer.echo(f"{summary['path']}: {format_bytes(summary['bytes'])}, {spec.layers} layers x {spec.experts} experts "
                       f"(top-{spec.top_k}), component {summary['component_bytes']} B, routed {format_bytes(summary['routed_bytes'])}")

    @app.command("run")
    def run_cmd(
        model: str = typer.Option(..., "--model", metavar="PATH", help="Primary model file (source 0)."),
        rig: Optional[str] = RigOption,
        plan: Optional[str] = SHARED["plan"],
        replica: List[str] = SHARED["replica"],
        primary_weight: int = SHARED["primary_weight"],
        decode_weights: Optional[str] = SHARED["decode_weights"],
        prompt_tokens: int = typer.Option(PROMPT_TOKENS, "--prompt-tokens", help="Prompt length (deterministic ids)."),
        gen_tokens: int = typer.Option(GEN_TOKENS, "--gen-tokens", help="Tokens to generate greedily."),
        cache_experts: int = SHARED["cache_experts"],
        lanes: int = SHARED["lanes"],
        chunk_tokens: int = SHARED["chunk_tokens"],
        dequant_threads: int = typer.Option(DEQUANT_THREADS, "--dequant-threads", help="Helper threads dequantizing experts (0: inline)."),
        prompt_seed: int = typer.Option(PROMPT_SEED, "--prompt-seed", help="Seed of the prompt's token ids."),
        csv_file: Optional[str] = SHARED["csv_file"],
        trace_out: Optional[str] = typer.Option(None, "--trace-out", metavar="FILE", help="Record the routing (for replay --trace)."),
        cached: bool = SHARED["cached"],
        json_out: bool = JsonOption,
    ):
        """Run the embedded MoE engine with routed experts streamed through split reads."""
        from engine_bridge.engine.inference import run_model

        sources = build_sources(model, replica, primary_weight, decode_weights, plan, rig)
        blas = limit_blas_threads(1)
        err.print(f"run: {len(sources.paths)} source(s), prefill {':'.join(map(str, sources.prefill))}, decode "
                  f"{':'.join(map(str, sources.decode))}, {lanes} lanes, cache {cache_experts} experts, "
                  f"{prompt_tokens}+{gen_tokens} tokens{'' if blas else ' (BLAS threads not pinned)'}", highlight=False, soft_wrap=True)
        result = run_model(model, sources, prompt_tokens, gen_tokens, cache_experts, lanes, prompt_seed,
                           chunk_tokens=chunk_tokens, cold=not cached, trace=bool(trace_out),
                           dequant_threads=dequant_threads)
        trace = result.pop("trace", None)
        if trace_out:
            atomic_write_text(trace_out, json.dumps(_trace_doc(result, trace)) + "\n")
        _append_csv_and_report(result, csv_file)
        for ph in ("prefill", "decode"):
            c = result[ph]
            err.print(f"{ph}: {c['seconds']:.3f} s, waiting for reads {c['read_wait_seconds']:.3f} s "
                      f"({100 * c['read_wait_seconds'] / max(c['seconds'], 1e-9):.0f} %), read {format_bytes(c['bytes'])} "
                      f"at {format_rate(c['bytes'] / max(c['seconds'], 1e-9))}, hits {c['hits']} misses {c['misses']}",
                      highlight=False, soft_wrap=True)
        err.print(f"output_sha256 {result['output_sha256']}  misses/token {result['misses_per_token']}",
                  highlight=False, soft_wrap=True)
        if json_out:
            print_json(result)
        else:
            typer.echo(csv_text(result, header=True), nl=False)
            typer.echo(f"output_sha256={result['output_sha256']} hits={result['hits']} misses={result['misses']} "
                       f"misses_per_token={result['misses_per_token']}")

    @app.command("replay")
    def replay_cmd(
        model: str = typer.Option(..., "--model", metavar="PATH", help="Primary model file (any MoE GGUF; only its header is read for geometry)."),
        rig: Optional[str] = RigOption,
        plan: Optional[str] = SHARED["plan"],
        replica: List[str] = SHARED["replica"],
        primary_weight: int = SHARED["primary_weight"],
        decode_weights: Optional[str] = SHARED["decode_weights"],
        prompt_tokens: int = typer.Option(PROMPT_TOKENS, "--prompt-tokens", help="Prompt tokens (routing model)."),
        gen_tokens: int = typer.Option(GEN_TOKENS, "--gen-tokens", help="Decode tokens (routing model)."),
        cache_experts: int = SHARED["cache_experts"],
        lanes: int = SHARED["lanes"],
        chunk_tokens: int = SHARED["chunk_tokens"],
        routing_seed: int = typer.Option(0, "--routing-seed", help="Seed of the routing model."),
        trace: Optional[str] = typer.Option(None, "--trace", metavar="FILE", help="Replay a recorded routing trace instead of the model."),
        csv_file: Optional[str] = SHARED["csv_file"],
        cached: bool = SHARED["cached"],
        json_out: bool = JsonOption,
    ):
        """Replay the engine's expert reads (no compute) with the model's real geometry and a
        calibrated routing model or a recorded trace: what the plan delivers on these drives."""
        from engine_bridge.engine.replay import replay

        sources = build_sources(model, replica, primary_weight, decode_weights, plan, rig)
        err.print(f"replay: {len(sources.paths)} source(s), prefill {':'.join(map(str, sources.prefill))}, decode "
                  f"{':'.join(map(str, sources.decode))}, {lanes} lanes, cache {cache_experts} experts, "
                  + (f"trace {trace}" if trace else f"{prompt_tokens}+{gen_tokens} tokens (routing model)"),
                  highlight=False, soft_wrap=True)
        result = replay(model, sources, prompt_tokens, gen_tokens, cache_experts, lanes, chunk_tokens=chunk_tokens,
                        routing_seed=routing_seed, trace_path=trace, cold=not cached)
        _append_csv_and_report(result, csv_file)
        if json_out:
            print_json(result)
            return
        typer.echo(f"prefill  {result['prefill_tokens']} tokens  {result['prefill_tps']} tok/s-equivalent  "
                   f"coverage {result['coverage']}  read {format_bytes(result['prefill']['bytes'])} at "
                   f"{result['prefill_read_gbps']} GB/s")
        typer.echo(f"decode   {result['gen_tokens']} tokens  {result['gen_tps']} tok/s-equivalent (steady "
                   f"{result['gen_steady_tps']})  misses/token {result['misses_per_token']}  read "
                   f"{format_bytes(result['decode']['bytes'])} at {result['decode_read_gbps']} GB/s")
        for s in result["sources"]:
            typer.echo(f"source[{s['index']}] {s['path']}: {format_bytes(s['bytes'])} in {s['reads']} pieces, "
                       f"lands_last {s['lands_last']}{'  DEGRADED' if s['degraded'] else ''}")
