"""engine-bridge commands: synth, run and replay (the embedded engine)."""

from __future__ import annotations

import os
from typing import List, Optional

import typer

from core.cli import JsonOption, RigOption, err, print_result
from core.errors import UsageError
from core.units import format_bytes, format_rate, parse_size, plural
from engines.registry import ENGINES
from engine_bridge.reader.hedging import HedgePolicy
from engine_bridge.reader.balancing import BalancePolicy, check_balance
from engine_bridge.reader.reweighting import ReweighPolicy, check_reweigh
from engine_bridge.reader.settings import ReaderSettings, check_settings
from engine_bridge.moe.constants import (
    DEFAULT_CACHE_EXPERTS,
    COLIBRI_FORMAT,
    DEQUANT_THREADS,
    GEN_TOKENS,
    LANES,
    PREFILL_CHUNK_TOKENS,
    PRIMARY_WEIGHT,
    PROMPT_SEED,
    PROMPT_TOKENS,
    QWEN3MOE_FORMAT,
    SYNTH_DEFAULTS,
    SYNTH_FORMATS,
)
from engine_bridge.moe.synth_colibri import model_types as synth_model_types


def _report_reader(result: dict) -> None:
    """The reader's per-source counters and its failover events, on stderr."""
    err.print(result["reader"]["text"], highlight=False, markup=False, soft_wrap=True)
    for e in result["events"]:
        err.print(f"event: {e['kind']} source {e['source']}: {e['message']}", highlight=False, markup=False, soft_wrap=True)


def _report_idle(result: dict) -> None:
    """A source that read nothing in a phase: a warning when it was given bytes (the run did not
    measure the plan asked for), a note when the split gave it nothing (docs/engine.md)."""
    for e in result.get("idle") or ():
        label = "warning" if e["kind"] == "unread" else "note"
        err.print(f"{label}: {e['message']}", highlight=False, markup=False, soft_wrap=True)


# Options `run` and `replay` share (the same sources, cache and reader settings).
SHARED = dict(
    plan=typer.Option(None, "--plan", metavar="PLAN", help="Plan file, 'latest', or a name in <rig>/plans: sources and weights."),
    replica=typer.Option([], "--replica", metavar="PATH*W",
                         help="A replica (its file, first split file or directory) and its base weight (repeatable)."),
    primary_weight=typer.Option(PRIMARY_WEIGHT, "--primary-weight", help="Base weight of the primary with --replica."),
    decode_weights=typer.Option(None, "--decode-weights", metavar="W,W,..", help="Decode weights, one per source."),
    cache_experts=typer.Option(DEFAULT_CACHE_EXPERTS, "--cache-experts", help="Expert cache size, experts."),
    lanes=typer.Option(LANES, "--lanes", help="Reader threads per source."),
    chunk_tokens=typer.Option(PREFILL_CHUNK_TOKENS, "--chunk-tokens", help="Prefill chunk, tokens."),
    csv_file=typer.Option(None, "--csv", metavar="FILE", help="Append the ds4-bench CSV row here."),
    cached=typer.Option(False, "--cached", help="Page-cache reads instead of cold reads (reader ceiling only)."),
    hedge=typer.Option(True, "--hedge/--no-hedge", help="Re-read a late piece from another replica (default on; see "
                                                        "docs/reader.md)."),
    hedge_min_busy=typer.Option(HedgePolicy.min_busy_ns / 1e9, "--hedge-min-busy", metavar="SECONDS",
                                help="Busy time a drive's delivered rate must rest on before hedging holds a drive to it "
                                     "(0, the default: from its first delivery; a drive is degraded only on evidence "
                                     "that holds against bursts, see docs/reader.md)."),
    reweigh=typer.Option(True, "--reweigh/--no-reweigh", help="Move weight between the drives as their delivered rates change "
                         "(default on; each change is a 'reweighted' event; see docs/reader.md)."),
    reweigh_floor=typer.Option(ReweighPolicy.floor, "--reweigh-floor", metavar="SHARE",
                               help="Least share of a read a drive keeps when weight moves off it (0 < SHARE < 0.5)."),
    reweigh_band=typer.Option(ReweighPolicy.band, "--reweigh-band", metavar="X",
                              help="A drive's rate per weight must be off by more than this factor to move it (> 1)."),
    reweigh_window=typer.Option(ReweighPolicy.window_ns / 1e9, "--reweigh-window", metavar="SECONDS",
                                help="Seconds of reads each re-weighting decision looks at."),
    balance=typer.Option(True, "--balance/--no-balance", help="Queue pieces as chunks and let an idle drive take queued "
                         "chunks of a slower one (default on; counted as stolen_bytes; the bench harness turns it off to "
                         "measure a plan as cut; see docs/reader.md)."),
    balance_chunk=typer.Option("1MiB", "--balance-chunk", metavar="SIZE",
                               help="Smallest chunk a piece is queued as when balancing (a multiple of 4 KiB); a "
                                    "drive's chunk doubles while the reader's own cost per request is over 1/32 of "
                                    "its time at the drive's pace (see docs/reader.md)."),
    balance_chunk_max=typer.Option(None, "--balance-chunk-max", metavar="SIZE",
                                   help="Largest chunk a drive's chunk grows to with its pace (default 16 MiB, or "
                                        "--balance-chunk when larger; equal to --balance-chunk: every drive's chunk "
                                        "that size)."),
    balance_depth=typer.Option(BalancePolicy.depth_ns / 1e9, "--balance-depth", metavar="SECONDS",
                               help="Most of a drive's own pace it keeps in the kernel when balancing (0, the default: "
                                    "what it reads while the fastest drive reads a chunk per lane, and for a drive cut "
                                    "more than its pace says, its pace's share of the reads outstanding)."),
    engine=typer.Option(None, "--engine", metavar="NAME", help="With --replica: the engine whose reads to perform (default: "
                        "the engine that reads this model, by the preference each engine states; known: "
                        + ", ".join(ENGINES) + "). With --plan: the plan's."),
    switch=typer.Option([], "--switch", metavar="NAME", help="With --replica: an engine switch to turn on (repeatable, or "
                        "NAME,NAME); each engine's own: "
                        + " | ".join(f"{e.name}: {e.switches.help()}" for e in ENGINES.values() if e.switches) + "."),
)


def hedge_options(min_busy_s: float) -> HedgePolicy:
    """The hedging knob `run` and `replay` take, checked (exit 2 naming the option)."""
    if not min_busy_s >= 0:
        raise UsageError(f"--hedge-min-busy {min_busy_s!r}: must be seconds >= 0")
    return HedgePolicy(min_busy_ns=int(round(min_busy_s * 1e9)))


def reweigh_options(floor: float, band: float, window_s: float) -> ReweighPolicy:
    """The re-weighting knobs `run` and `replay` take, checked (exit 2 naming the option)."""
    try:
        return check_reweigh(ReweighPolicy(window_ns=int(round(window_s * 1e9)), band=band, floor=floor,
                                           snap=min(ReweighPolicy.snap, (1 + band) / 2)))
    except ValueError as e:
        opt = {"floor": "--reweigh-floor", "band": "--reweigh-band", "window_ns": "--reweigh-window"}
        name = next((o for k, o in opt.items() if f"reweigh {k} " in str(e)), "--reweigh-*")
        raise UsageError(f"{name}: {e}") from None


def balance_options(chunk: str, chunk_max: Optional[str], depth_s: float) -> BalancePolicy:
    """The balancing knobs `run` and `replay` take, checked (exit 2 naming the option)."""
    size = parse_size(chunk, "--balance-chunk")
    most = max(BalancePolicy.chunk_max, size) if chunk_max is None else parse_size(chunk_max, "--balance-chunk-max")
    if not depth_s >= 0:
        raise UsageError(f"--balance-depth {depth_s!r}: must be seconds >= 0")
    try:
        return check_balance(BalancePolicy(chunk_bytes=size, chunk_max=most, depth_ns=int(round(depth_s * 1e9))))
    except ValueError as e:
        opt = f"--balance-chunk-max {chunk_max}" if "chunk_max" in str(e) else f"--balance-chunk {chunk}"
        raise UsageError(f"{opt}: {e}") from None


def reader_options(lanes: int, hedge: bool, hedge_min_busy: float, reweigh: bool, reweigh_floor: float,
                   reweigh_band: float, reweigh_window: float, balance: bool, balance_chunk: str,
                   balance_chunk_max: Optional[str], balance_depth: float) -> ReaderSettings:
    """The split reader's settings `run` and `replay` pass on (one `ReaderSettings`), checked
    before any file is read (exit 2 naming the option)."""
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise UsageError(f"--lanes {lanes!r}: must be an integer >= 1")
    return check_settings(ReaderSettings(
        lanes=lanes, hedge=hedge, hedge_policy=hedge_options(hedge_min_busy),
        reweigh=reweigh, reweigh_policy=reweigh_options(reweigh_floor, reweigh_band, reweigh_window),
        balance=balance, balance_policy=balance_options(balance_chunk, balance_chunk_max, balance_depth)))


def qwen3moe_synth(out: str, shape: dict, seed: int, quant: Optional[str], size: Optional[str], force: bool):
    """`synth --format qwen3moe` (engine_bridge/moe/synth_qwen3moe.py): its checked spec and its writer."""
    from engine_bridge.moe.synth_qwen3moe import Qwen3MoeSpec, check_spec, synthesize_qwen3moe

    if size is not None and "ff" in shape:
        raise UsageError("give --ff or --size, not both (--size solves the expert width)")
    spec = check_spec(Qwen3MoeSpec(**shape, seed=seed, quant=(quant or SYNTH_DEFAULTS["quant"]).lower(),
                                   size=parse_size(size, "--size") if size is not None else 0))
    return spec, lambda progress: synthesize_qwen3moe(out, spec, force=force, progress=progress)


def synth_cmd(
    out: str = typer.Argument(..., metavar="OUT", help="Model to write: a .gguf file, or a directory with --format colibri."),
    fmt: str = typer.Option("gguf", "--format", metavar="gguf|colibri|qwen3moe",
                            help="gguf: one GGUF file for the embedded engine (default). colibri: a directory of "
                                 "safetensors shards + config.json + tokenizer.json that colibri's GLM engine loads "
                                 "(int8 rows + per-row scales; `run` computes it too). qwen3moe: one GGUF file "
                                 "llama.cpp runs, with a BPE tokenizer (`run` computes it too)."),
    layers: Optional[int] = typer.Option(None, "--layers", help="Transformer layers (default 4; qwen3moe 6)."),
    experts: Optional[int] = typer.Option(None, "--experts", help="Routed experts per layer (default 16)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Experts chosen per token (default: gguf 2, colibri and "
                                                              "qwen3moe 4)."),
    dim: Optional[int] = typer.Option(None, "--dim", help="Model width (default: gguf and qwen3moe 512, colibri 1024)."),
    ff: Optional[int] = typer.Option(None, "--ff", help="Expert hidden width (default: gguf 1024, colibri 1536, qwen3moe "
                                                        "256); gguf: dim*ff a multiple of 65536; colibri: a multiple of "
                                                        "64; qwen3moe: of 32."),
    vocab: Optional[int] = typer.Option(None, "--vocab", help="Vocabulary size (default 512; qwen3moe: every merge "
                                                              "its tokenizer learns, 331)."),
    size: Optional[str] = typer.Option(None, "--size", metavar="SIZE", help="qwen3moe only: the file's size to come "
                                       "close to (e.g. 500M); the expert width is solved from it."),
    seed: int = typer.Option(SYNTH_DEFAULTS["seed"], "--seed", help="Same seed and shape, same bytes."),
    quant: Optional[str] = typer.Option(None, "--quant", help="gguf and qwen3moe: routed expert type, q8_0 (default), "
                                                               "q4_0, or f32 (unquantized: least compute per byte read)."),
    shards: Optional[int] = typer.Option(None, "--shards", help="colibri only: safetensors shards, each layer whole in "
                                                                 "one (default: 4, or --layers if fewer)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing OUT (refused without it)."),
    model_type: Optional[str] = typer.Option(None, "--model-type", help="colibri only: config.json model_type (default "
                                             f"{synth_model_types()[0]}, the reading engine's own; another it runs gives a "
                                             "model of that shape read by that type's rules, for the stand-in engines)."),
    json_out: bool = JsonOption,
):
    """Write a small but complete MoE transformer laid out like the real model (GGUF, or colibri's format)."""
    from core.errors import UsageError

    fmt = fmt.lower()
    if fmt not in SYNTH_FORMATS:
        raise UsageError(f"--format {fmt!r}: use {', '.join(SYNTH_FORMATS[:-1])} or {SYNTH_FORMATS[-1]}")
    shape = {k: v for k, v in dict(layers=layers, experts=experts, top_k=top_k, dim=dim, ff=ff, vocab=vocab).items()
             if v is not None}
    if size is not None and fmt != QWEN3MOE_FORMAT:
        raise UsageError("--size is for --format qwen3moe; the other formats take --ff")
    if fmt == QWEN3MOE_FORMAT:
        if shards is not None or model_type is not None:
            raise UsageError("--shards and --model-type are for --format colibri (a qwen3moe model is one GGUF file)")
        spec, write = qwen3moe_synth(out, shape, seed, quant, size, force)
    elif fmt == COLIBRI_FORMAT:
        if quant is not None:
            raise UsageError("--quant is for --format gguf and qwen3moe; colibri's format is int8 rows with per-row scales")
        from engine_bridge.moe.synth_colibri import ColibriSpec, check_spec as check_colibri, synthesize_colibri

        base = ColibriSpec(**shape, seed=seed, **({"model_type": model_type} if model_type else {}))
        spec = check_colibri(ColibriSpec(**{**base.__dict__, "shards": min(base.shards, base.layers) if shards is None
                                            else shards}))
        write = lambda progress: synthesize_colibri(out, spec, force=force, progress=progress)  # noqa: E731
    else:
        if shards is not None or model_type is not None:
            raise UsageError("--shards and --model-type are for --format colibri (a GGUF model is one file)")
        from engine_bridge.moe.synth import SynthSpec, check_spec, synthesize

        spec = check_spec(SynthSpec(**shape, seed=seed, quant=(quant or SYNTH_DEFAULTS["quant"]).lower()))
        write = lambda progress: synthesize(out, spec, progress, force=force)  # noqa: E731
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=err, transient=True, disable=json_out) as bar:
        task = bar.add_task(f"synth {os.path.basename(out)}", total=None)
        summary = write(lambda done, total: bar.update(task, completed=done, total=total))
    if json_out:
        from engine_bridge.moe.synth import SynthSummary

        print_result(SynthSummary(summary))
    else:
        typer.echo(f"{summary['path']}: {format_bytes(summary['bytes'])}, {spec.layers} layers x {spec.experts} experts "
                   f"(top-{spec.top_k}), component {summary['component_bytes']} B, routed "
                   f"{format_bytes(summary['routed_bytes'])}"
                   + (f", {spec.shards} shards" if fmt == COLIBRI_FORMAT else ""))


def run_cmd(
    model: Optional[str] = typer.Option(None, "--model", metavar="PATH",
                                        help="Primary model (source 0): its file, any file of its split set, or its "
                                             "directory; default: the plan's primary, else the rig's model."),
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
    dequant_threads: int = typer.Option(DEQUANT_THREADS, "--dequant-threads", help="Helper threads dequantizing experts "
                                                                                   "(0: inline)."),
    prompt_seed: int = typer.Option(PROMPT_SEED, "--prompt-seed", help="Seed of the prompt's token ids."),
    csv_file: Optional[str] = SHARED["csv_file"],
    trace_out: Optional[str] = typer.Option(None, "--trace-out", metavar="FILE", help="Record the routing (for replay "
                                                                                      "--trace)."),
    cached: bool = SHARED["cached"],
    hedge: bool = SHARED["hedge"],
    hedge_min_busy: float = SHARED["hedge_min_busy"],
    reweigh: bool = SHARED["reweigh"],
    reweigh_floor: float = SHARED["reweigh_floor"],
    reweigh_band: float = SHARED["reweigh_band"],
    reweigh_window: float = SHARED["reweigh_window"],
    balance: bool = SHARED["balance"],
    balance_chunk: str = SHARED["balance_chunk"],
    balance_chunk_max: Optional[str] = SHARED["balance_chunk_max"],
    balance_depth: float = SHARED["balance_depth"],
    engine: Optional[str] = SHARED["engine"],
    switch: List[str] = SHARED["switch"],
    json_out: bool = JsonOption,
):
    """Run the embedded MoE engine with routed experts streamed through split reads."""
    from engine_bridge.moe.blas import pin_blas_threads
    from engine_bridge.moe.session import RunResults, check_outputs, csv_text, run_model, save_run, usage_dir_of
    from engine_bridge.moe.inputs import model_of, run_inputs, sources_of

    check_outputs(csv_file, trace_out)       # before the run, not after it

    reader = reader_options(lanes, hedge, hedge_min_busy, reweigh, reweigh_floor, reweigh_band, reweigh_window,
                            balance, balance_chunk, balance_chunk_max, balance_depth)
    blas = pin_blas_threads(1)
    inputs = run_inputs(plan, rig)           # rig.toml and the plan, read once
    sources = sources_of(model_of(model, inputs), replica, primary_weight, decode_weights, inputs, engine,
                         tuple(switch))
    err.print(f"run: {plural(len(sources.paths), 'source')}, prefill {':'.join(map(str, sources.prefill))}, decode "
              f"{':'.join(map(str, sources.decode))}, {lanes} lanes, cache {cache_experts} experts, "
              f"{prompt_tokens}+{gen_tokens} tokens{'' if blas else ' (BLAS threads not pinned)'}",
              highlight=False, soft_wrap=True)
    result = save_run(run_model(sources, prompt_tokens, gen_tokens, cache_experts, reader, prompt_seed,
                                chunk_tokens=chunk_tokens, cold=not cached, trace=bool(trace_out),
                                dequant_threads=dequant_threads), csv_file=csv_file, trace_out=trace_out,
                      usage_dir=usage_dir_of(inputs.rig, sources.paths[0]))
    _report_reader(result)
    for ph in ("prefill", "decode"):
        c = result[ph]
        err.print(f"{ph}: {c['seconds']:.3f} s, waiting for reads {c['read_wait_seconds']:.3f} s "
                  f"({100 * c['read_wait_seconds'] / max(c['seconds'], 1e-9):.0f} %), read {format_bytes(c['bytes'])} "
                  f"at {format_rate(c['bytes'] / max(c['seconds'], 1e-9))}, hits {c['hits']} misses {c['misses']}",
                  highlight=False, soft_wrap=True)
        err.print(f"{ph} per source: " + ", ".join(f"[{s['index']}] {s['bytes']:,} B in {plural(s['reads'], 'piece')}"
                                                  for s in c["sources"]), highlight=False, soft_wrap=True)
        if c.get("threads"):
            t = c["threads"]
            err.print(f"{ph} threads, on a core / waiting for one: engine {t['engine_cpu_seconds']:.3f} / "
                      f"{t['engine_runq_seconds']:.3f} s, its helpers {t['helpers_cpu_seconds']:.3f} / "
                      f"{t['helpers_runq_seconds']:.3f} s, the reader and the rest {t['others_cpu_seconds']:.3f} / "
                      f"{t['others_runq_seconds']:.3f} s; {t['minor_faults']:,} page faults",
                      highlight=False, soft_wrap=True)
    _report_idle(result)
    err.print(f"output_sha256 {result['output_sha256']}  misses/token {result['misses_per_token']}",
              highlight=False, soft_wrap=True)
    if json_out:
        print_result(RunResults(result))
    else:
        typer.echo(csv_text(result, header=True), nl=False)
        typer.echo(f"output_sha256={result['output_sha256']} hits={result['hits']} misses={result['misses']} "
                   f"misses_per_token={result['misses_per_token']}")

def replay_cmd(
    model: Optional[str] = typer.Option(None, "--model", metavar="PATH",
                                        help="Primary model (a MoE GGUF file or split set, or a safetensors directory; "
                                             "only its headers are read for geometry); default: the plan's primary, "
                                             "else the rig's model."),
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
    trace: Optional[str] = typer.Option(None, "--trace", metavar="FILE", help="Replay a recorded routing trace instead "
                                                                              "of the model."),
    csv_file: Optional[str] = SHARED["csv_file"],
    cached: bool = SHARED["cached"],
    hedge: bool = SHARED["hedge"],
    hedge_min_busy: float = SHARED["hedge_min_busy"],
    reweigh: bool = SHARED["reweigh"],
    reweigh_floor: float = SHARED["reweigh_floor"],
    reweigh_band: float = SHARED["reweigh_band"],
    reweigh_window: float = SHARED["reweigh_window"],
    balance: bool = SHARED["balance"],
    balance_chunk: str = SHARED["balance_chunk"],
    balance_chunk_max: Optional[str] = SHARED["balance_chunk_max"],
    balance_depth: float = SHARED["balance_depth"],
    engine: Optional[str] = SHARED["engine"],
    switch: List[str] = SHARED["switch"],
    json_out: bool = JsonOption,
):
    """Replay the engine's expert reads (no compute) with the model's real geometry and a
    calibrated routing model or a recorded trace: what the plan delivers on these drives."""
    from engine_bridge.moe.replay import ReplayResults, replay
    from engine_bridge.moe.session import check_outputs, save_run, usage_dir_of
    from engine_bridge.moe.inputs import model_of, run_inputs, sources_of

    check_outputs(csv_file)

    reader = reader_options(lanes, hedge, hedge_min_busy, reweigh, reweigh_floor, reweigh_band, reweigh_window,
                            balance, balance_chunk, balance_chunk_max, balance_depth)
    inputs = run_inputs(plan, rig)           # rig.toml and the plan, read once
    sources = sources_of(model_of(model, inputs), replica, primary_weight, decode_weights, inputs, engine,
                         tuple(switch))
    err.print(f"replay: {plural(len(sources.paths), 'source')}, prefill {':'.join(map(str, sources.prefill))}, decode "
              f"{':'.join(map(str, sources.decode))}, {lanes} lanes, cache {cache_experts} experts, "
              + (f"trace {trace}" if trace else f"{prompt_tokens}+{gen_tokens} tokens (routing model)"),
              highlight=False, soft_wrap=True)
    result = save_run(replay(sources, prompt_tokens, gen_tokens, cache_experts, reader,
                             chunk_tokens=chunk_tokens, routing_seed=routing_seed, trace_path=trace,
                             cold=not cached),
                      csv_file=csv_file, usage_dir=usage_dir_of(inputs.rig, sources.paths[0]))
    _report_reader(result)
    _report_idle(result)
    if json_out:
        print_result(ReplayResults(result))
        return
    typer.echo(f"prefill  {result['prefill_tokens']} tokens  {result['prefill_tps']} tok/s-equivalent  "
               f"coverage {result['coverage']}  read {format_bytes(result['prefill']['bytes'])} at "
               f"{result['prefill_read_gbps']} GB/s")
    typer.echo(f"decode   {result['gen_tokens']} tokens  {result['gen_tps']} tok/s-equivalent (steady "
               f"{result['gen_steady_tps']})  misses/token {result['misses_per_token']}  read "
               f"{format_bytes(result['decode']['bytes'])} at {result['decode_read_gbps']} GB/s")
    for s in result["sources"]:
        typer.echo(f"source[{s['index']}] {s['path']}: {format_bytes(s['bytes'])} in {plural(s['reads'], 'piece')}, "
                   f"lands_last {s['lands_last']}{'  DEGRADED' if s['degraded'] else ''}")


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""
    app.command("synth")(synth_cmd)
    app.command("run")(run_cmd)
    app.command("replay")(replay_cmd)
