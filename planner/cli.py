"""`planner`: the exact split of a read, the performance model, the solver and plan files."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import List, Optional

import typer
from rich.table import Table

from core.cli import JsonOption, RigOption, err, make_app, out, print_json, run
from core.errors import UsageError
from core.rig import load_rig, rig_dir
from core.units import format_rate, format_signed_pct
from engines.ds4_argodrive import COMPONENT_BYTES, DECODE_BATCH, DECODE_THREADS, PREFILL_LANES
from engines.registry import DEFAULT_ENGINE, ENGINES, get_engine
from engines.split import parse_weights, split_read

from .colibri_model import READ_THREADS
from .constants import PREFILL_TOKENS
from .idle import check_idle, colibri_idle
from .model import prediction_to_dict
from .plan import Plan, plan_to_dict
from .plans import latest_plan_path, load_inputs, load_plan, parse_background, save_plan, shards_held
from .rigmodel import choose_workload
from .solve import colibri_single, predict, smallest_equivalent, solve_workload
from .workload import NAMED, traffic_of

app = make_app("planner", "Split reads across replicas: exact split arithmetic, a performance model, the solver, plans.")

EngineOption = typer.Option(DEFAULT_ENGINE, "--engine", help=f"Engine whose split rule and limits apply: {', '.join(ENGINES)}.")
BenchOption = typer.Option(None, "--bench", metavar="RESULT", help="iobench result file (default: newest in rig/bench).")
BackgroundOption = typer.Option(None, "--background", metavar="SOURCE:KIND",
                                help="Other work on a source: primary:engram (Engram rows per decoded token) or NAME:PERCENT% busy. Repeatable.")
LanesOption = typer.Option(PREFILL_LANES, "--lanes", min=1, max=64, help="Prefill pieces in flight per drive.")
BatchOption = typer.Option(None, "--batch", min=1, max=64,
                           help=f"Decode component reads issued together (default: the model's components per expert, {DECODE_BATCH} for gate/up/down).")
WorkloadOption = typer.Option(None, "--workload", metavar="NAME",
                              help=f"Plan a named workload instead of the rig's model: {', '.join(NAMED)} (DeepSeek V4.1 Flash on ds4, DESIGN §7).")
ModelOption = typer.Option(None, "--model", metavar="PATH",
                           help="Plan this model (GGUF file, split set member, safetensors directory; a header-only copy will do) instead of the rig's.")
PromptOption = typer.Option(PREFILL_TOKENS, "--prompt-tokens", min=1, help="Prompt tokens the prefill prediction is for.")
CacheOption = typer.Option(None, "--cache-experts", min=0, help="Experts the engine's cache holds (default: 30% of the model's routed experts, ds4-v41's 4,600 of 15,360).")
ThreadsOption = typer.Option(None, "--threads", min=1, max=256,
                             help=f"Read threads over all sources: ds4's decode pread pool (default {DECODE_THREADS}); "
                                  f"colibri's expert loads in flight (default {READ_THREADS}, its PIPE_WORKERS).")
StripeOption = typer.Option(False, "--stripe", help="colibri: price striped reads (DIRECT=1, COLI_MIR_STRIPE).")
FitOnlyOption = typer.Option(False, "--fit-only", help="Use iobench's fitted drive models alone, not corrected by its measurements near each shape.")
TailsOption = typer.Option(False, "--tails", help="Price the decode barrier from each drive's measured latency quantiles as independent "
                           "draws (off by default: on throttled test drives it under-predicted decode by up to 50 %; see docs/planner.md).")

BAR = 40


def _int(text: str, what: str, minimum: int = 0) -> int:
    try:
        v = int(str(text).replace("_", ""))
    except ValueError:
        raise UsageError(f"{what} {text!r}: give a whole number of bytes, e.g. {COMPONENT_BYTES}") from None
    if v < minimum:
        raise UsageError(f"{what} {v}: must be >= {minimum}")
    return v


def _bar(part: int, whole: int) -> str:
    n = round(BAR * part / whole) if whole else 0
    return "█" * n + "·" * (BAR - n)


@app.command()
def split(weights: str = typer.Option(..., "--weights", metavar="W0:W1:W2", help="Integer weights, primary first, e.g. 10:5:5."),
          length: str = typer.Option(str(COMPONENT_BYTES), "--length", help="Bytes in the read."),
          offset: str = typer.Option("0", "--offset", help="Byte offset of the read in the file."),
          engine: str = EngineOption, json_out: bool = JsonOption):
    """The pieces each source reads, exactly as the engine computes them (DESIGN §5)."""
    w = parse_weights(weights, engine)
    n_len = _int(length, "--length")
    n_off = _int(offset, "--offset")
    pieces = split_read(n_off, n_len, w, engine)
    # Equivalent weights exist only where the engine cuts each read on a grid (it has a split rule).
    smallest = smallest_equivalent(w, n_len) if get_engine(engine).split is not None else w
    if json_out:
        print_json({"engine": engine, "weights": list(w), "offset": n_off, "length": n_len,
                    "smallest_equivalent": list(smallest),
                    "pieces": [{"source": p.source, "offset": p.offset, "length": p.length, "blocks": p.blocks} for p in pieces]})
        return
    t = Table(title=f"{engine} split of {n_len:,} B at {n_off:,} by {':'.join(map(str, w))}"
                    + (f" (same as {':'.join(map(str, smallest))})" if smallest != w else ""))
    for col in ("source", "offset", "blocks", "bytes", "share"):
        t.add_column(col, justify="left" if col in ("source", "share") else "right")
    for p in pieces:
        t.add_row(str(p.source), f"{p.offset:,}", str(p.blocks), f"{p.length:,}", _bar(p.length, n_len))
    out.print(t)


def _backgrounds(specs, names):
    return tuple(parse_background(s, names) for s in (specs or ()))


@app.command()
def solve(rig: Optional[str] = RigOption, bench: Optional[str] = BenchOption, engine: str = EngineOption,
          background: Optional[List[str]] = BackgroundOption, lanes: int = LanesOption, batch: int = BatchOption,
          threads: int = ThreadsOption, top: int = typer.Option(5, "--top", min=0, max=50, help="Alternatives to keep per phase."),
          workload: Optional[str] = WorkloadOption, model: Optional[str] = ModelOption, prompt_tokens: int = PromptOption,
          cache_experts: Optional[int] = CacheOption, fit_only: bool = FitOnlyOption, tails: bool = TailsOption, json_out: bool = JsonOption):
    """Find the prefill and decode weights for the rig's model; write rig/plans/<timestamp>.json."""
    root = rig_dir(rig)
    inputs = load_inputs(root, bench, calibrate=not fit_only, tails=tails)
    names = [s.name for s in inputs.sources]
    chosen = choose_workload(root, engine, workload, model, prompt_tokens, cache_experts, lanes, batch, threads)
    wl, bgs = chosen.workload, _backgrounds(background, names)
    plan = solve_workload(inputs.sources, inputs.drives, wl, bgs, inputs.provenance, top=top, links=inputs.links)
    record = wl.as_dict()
    if wl.colibri is not None:
        placed = colibri_idle(plan, (wl.colibri.layers, wl.colibri.experts), shards_held(inputs.sources))
        texts = [r.text() for r in placed]
        record["idle"] = {"placement": {"sources": [r.source for r in placed], "why": "; ".join(texts)}} if placed else {}
    else:
        plan, idle = check_idle(plan, inputs.drives, {"prefill": wl.prefill, "decode": wl.decode}, bgs, inputs.links)
        texts = [r.text() for r in idle]
        record["idle"] = {r.phase: {"sources": list(r.idle), "why": r.text()} for r in idle}
    model = dict(plan.provenance.get("model") or {})
    for ph in ("prefill", "decode"):
        model[ph] = {**model.get(ph, {}), **traffic_of(getattr(wl, ph))}
    plan = replace(plan, geometry=chosen.geometry, workload=record, provenance={**plan.provenance, "model": model})
    rig_obj = load_rig(root, must_exist=False)
    path = save_plan(rig_obj, plan)
    plan = load_plan(path)
    # Said once the plan is written, so a failing command still says one line.
    for text in ([chosen.notice] if chosen.notice else []) + texts:
        err.print(f"notice: {text}", markup=False)
    if json_out:
        d = plan_to_dict(plan)
        d["path"] = path
        print_json(d)
    else:
        _render_plan(plan, path)
    err.print(f"plan written to {path}")


@app.command()
def simulate(weights: str = typer.Option(..., "--weights", metavar="W0:W1:W2", help="Integer weights, primary first."),
             phase: str = typer.Option(..., "--phase", help="prefill or decode."),
             rig: Optional[str] = RigOption, bench: Optional[str] = BenchOption, engine: str = EngineOption,
             background: Optional[List[str]] = BackgroundOption, lanes: int = LanesOption, batch: int = BatchOption,
             threads: int = ThreadsOption, workload: Optional[str] = WorkloadOption, model: Optional[str] = ModelOption,
             prompt_tokens: int = PromptOption, cache_experts: Optional[int] = CacheOption,
             fit_only: bool = FitOnlyOption, stripe: bool = StripeOption, tails: bool = TailsOption,
             json_out: bool = JsonOption):
    """Predict one weight vector for the rig's model: time per read and per layer, per-source completion, who lands last."""
    if phase not in ("prefill", "decode"):
        raise UsageError(f"--phase {phase!r}: use prefill or decode")
    w = parse_weights(weights, engine)
    if stripe and get_engine(engine).place is None:
        raise UsageError(f"--stripe: {engine} does not stripe reads; it is colibri's switch (--engine colibri)")
    root = rig_dir(rig)
    inputs = load_inputs(root, bench, calibrate=not fit_only, tails=tails)
    names = [s.name for s in inputs.sources]
    chosen = choose_workload(root, engine, workload, model, prompt_tokens, cache_experts, lanes, batch, threads)
    bgs = _backgrounds(background, names)
    if chosen.workload.colibri is not None:
        if len(w) != len(inputs.drives):
            raise UsageError(f"weights {':'.join(map(str, w))}: {len(w)} weights for {len(inputs.drives)} drives "
                             f"({', '.join(names)}); give one weight per drive, the model's first")
        d = colibri_single(inputs.drives, chosen.workload.colibri, w, stripe, bgs, inputs.links)[phase]
    else:
        d = prediction_to_dict(predict(inputs.drives, w, getattr(chosen.workload, phase), bgs, engine, inputs.links))
    if chosen.notice:
        err.print(f"notice: {chosen.notice}", markup=False)
    if json_out:
        print_json(d)
        return
    _render_prediction(d, f"{phase} {':'.join(map(str, w))}")


def _render_placed(p: dict, title: str) -> None:
    """A colibri prediction: whole expert reads per layer, each drive's cut, experts and share."""
    how = "striped over every drive" if p.get("stripe") else "whole, each from the drive its placement picks"
    unit = "block of up to 64 reads" if p["phase"] == "prefill" else "token's layer"
    out.print(f"[bold]{title}[/]: {format_rate(p['throughput_Bps'])}; {p['reads_per_layer']:.2f} expert reads of "
              f"{p['read_bytes']:,} B per layer, {how}; {p['time_per_layer_s'] * 1e3:.2f} ms per layer, "
              f"{p['time_per_batch_s'] * 1e3:.2f} ms per {unit}")
    t = Table()
    for col in ("source", "cut /256", "experts", "share", "bytes/layer", "busy (ms)", "share of reads"):
        t.add_column(col, justify="left" if col in ("source", "share of reads") else "right")
    whole = sum(s["experts"] for s in p["sources"])
    for s in p["sources"]:
        t.add_row(s["name"], str(s["cut"]), f"{s['experts']:,}", f"{s['share'] * 100:.1f}%", f"{s['bytes']:,.0f}",
                  f"{s['time_s'] * 1e3:.3f}", _bar(s["experts"], whole))
    out.print(t)
    out.print(f"lands last: [bold]{p['lands_last']}[/], {p['gap_s'] * 1e3:.3f} ms after the next drive")
    if p.get("tail_s"):
        out.print(f"latency tails: the last read of a layer lands {p['tail_s'] * 1e3:.3f} ms after the slowest mean")
    if p.get("bound"):
        out.print(f"bound by link [bold]{p['bound']}[/]: its members share its measured ceiling")


def _render_prediction(p: dict, title: str) -> None:
    if "reads_per_layer" in p:
        _render_placed(p, title)
        return
    unit = "chunk" if p["phase"] == "prefill" else f"expert ({p['time_per_batch_s'] / p['time_per_read_s']:.0f} reads)"
    out.print(f"[bold]{title}[/]: {format_rate(p['throughput_Bps'])}; "
              f"{p['time_per_batch_s'] * 1e3:.2f} ms per {unit}, {p['time_per_read_s'] * 1e3:.2f} ms per read, "
              f"{p['time_per_layer_s'] * 1e3:.1f} ms per layer")
    t = Table()
    for col in ("source", "blocks", "bytes/read", "done (ms)", "share of read"):
        t.add_column(col, justify="left" if col in ("source", "share of read") else "right")
    whole = sum(s["bytes"] for s in p["sources"])
    for s in p["sources"]:
        t.add_row(s["name"], str(s["blocks"]), f"{s['bytes']:,}", f"{s['time_s'] * 1e3:.3f}", _bar(s["bytes"], whole))
    out.print(t)
    out.print(f"lands last: [bold]{p['lands_last']}[/], {p['gap_s'] * 1e3:.3f} ms after the next source")
    if p.get("tail_s"):
        out.print(f"latency tails: the slowest piece of a batch lands {p['tail_s'] * 1e3:.3f} ms after the slowest mean")
    if p.get("bound"):
        out.print(f"bound by link [bold]{p['bound']}[/]: its members share its measured ceiling")


def _render_plan(plan: Plan, path: str) -> None:
    out.print(f"[bold]plan[/] {path}  ({plan.engine}, {plan.created})")
    out.print("sources: " + ", ".join(f"{i}:{s.name}={s.path}" for i, s in enumerate(plan.sources)))
    _render_workload(plan)
    if get_engine(plan.engine).place is not None:
        _render_stripe(plan)
    for ph in ("prefill", "decode"):
        phase = getattr(plan, ph)
        if phase.predicted:
            _render_prediction(phase.predicted, f"{ph} {':'.join(map(str, phase.weights))}")
        else:
            out.print(f"[bold]{ph}[/] {':'.join(map(str, phase.weights))} (no prediction)")
        m = phase.measured
        if m.get("throughput_Bps"):
            err_pct = m.get("error_pct")
            out.print(f"  measured {format_rate(m['throughput_Bps'])} with the split reader (median of {m.get('n', 0)}, "
                      f"spread {m.get('spread_pct', 0.0):.1f} %, picked by {m.get('picked_by', '?')})"
                      + (f"; prediction {err_pct:+.1f} %" if isinstance(err_pct, (int, float)) else ""))
        elif m:
            out.print(f"  not measured to the end (picked by {m.get('picked_by', '?')})")
        base = plan.baselines.get(ph) or {}
        for key in ("capability", "equal"):
            b = base.get(key)
            if isinstance(b, dict) and "throughput_Bps" in b and phase.predicted.get("throughput_Bps"):
                out.print(f"  vs {key} {':'.join(map(str, b.get('weights', [])))}: {format_rate(b['throughput_Bps'])} "
                          f"(plan x{phase.predicted['throughput_Bps'] / b['throughput_Bps']:.3f})")
        alts = [a for a in plan.alternatives if isinstance(a, dict) and a.get("phase") == ph]
        if alts:
            # Each alternative's speed relative to the plan's: usually slower ("-1.2%"), but a
            # split within the solver's tie tolerance may be a hair faster ("+0.1%").
            out.print("  next best: " + ", ".join(f"{':'.join(map(str, a.get('weights', [])))} "
                                                  f"({format_signed_pct(-a.get('behind', 0))})" for a in alts))
    prov = plan.provenance
    for link in (prov.get("model") or {}).get("links") or ():
        out.print(f"shared link {link.get('name')}: {', '.join(link.get('drives', []))} at most "
                  f"{format_rate(link.get('ceiling_Bps', 0))} together")
    if prov:
        out.print(f"from bench {prov.get('bench')} (rig {prov.get('rig')}, manifest {prov.get('manifest') or 'none'})")


def _render_stripe(plan: Plan) -> None:
    """colibri: one weight vector for both phases, whether it stripes and why."""
    st = (plan.provenance.get("model") or {}).get("stripe") or {}
    weights = ":".join(map(str, plan.prefill.weights))
    line = f"colibri weights {weights} for both phases (COLI_DISK_WEIGHTS); stripe: {'on' if plan.stripe else 'off'}"
    if st.get("why_not"):
        line += f" ({st['why_not']})"
    elif isinstance(st.get("score"), dict) and len(st["score"]) > 1:
        line += (f" (objective {st['score'].get('on', 0):.4f} striped vs {st['score'].get('off', 0):.4f} whole: "
                 f"{st.get('objective', '')}; ties go to off)")
    out.print(line, markup=False)


def _render_workload(plan: Plan) -> None:
    """The model and traffic the plan was solved for (schema 2 plans), and any idle source."""
    g, w = plan.geometry, plan.workload
    if not g or not w:
        return
    t = w.get("traffic") or {}
    name = w.get("name") if w.get("name") != "model" else g.get("path")
    out.print(f"workload: {name}: {g.get('layers')} layers x {g.get('experts')} experts, {g.get('top_k')} per token, "
              f"{g.get('component_bytes', 0):,} B components; {t.get('experts_per_layer', 0):.1f} experts per layer at "
              f"{t.get('prompt_tokens')} tokens, {t.get('misses_per_token', 0):.2f} misses per token with "
              f"{t.get('cache_experts')} cached ({t.get('source')})", markup=False)
    if w.get("modelled_as") and w.get("modelled_as") != w.get("engine"):
        out.print(f"  {w.get('engine')}'s reads are predicted as {w.get('modelled_as')}'s", markup=False)
    for rep in (w.get("idle") or {}).values():
        out.print(f"  idle: {rep.get('why')}", markup=False)


@app.command()
def show(plan: Optional[str] = typer.Argument(None, metavar="PLAN", help="Plan file (default: newest in rig/plans)."),
         rig: Optional[str] = RigOption, json_out: bool = JsonOption):
    """A readable summary of a plan, with the split of one read drawn per source."""
    path = plan or latest_plan_path(load_rig(rig_dir(rig), must_exist=False))
    p = load_plan(path)
    if json_out:
        print_json(plan_to_dict(p))
    else:
        _render_plan(p, os.path.abspath(path))


@app.command()
def tune(rig: Optional[str] = RigOption, bench: Optional[str] = BenchOption,
         plan: Optional[str] = typer.Option(None, "--plan", metavar="PLAN",
                                            help="Plan to start from and reset to: a file, a name in rig/plans or 'latest' (default: the newest; solved in the tuner if there is none)."),
         fit_only: bool = FitOnlyOption):
    """Open the split tuner: nudge weights per phase, read the model's prediction, save a plan."""
    from .tui.app import run_tuner  # Textual loads only for this command

    run_tuner(rig_dir(rig), bench, plan, calibrate=not fit_only)


def main() -> None:
    run(app, "planner")


if __name__ == "__main__":
    main()
