"""`planner`: the exact split of a read, the one pricing of every engine's reads, the solver and plan files."""

from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.table import Table

from core.cli import JsonOption, QuietOption, RigOption, err, make_app, out, print_result, run
from core.errors import UsageError
from core.rig import load_rig, rig_dir
from core.units import format_rate, format_signed_pct, parse_size
from engines.registry import DEFAULT_ENGINE, ENGINES, get_engine
from engines.split import describe_split, parse_weights
from engines.switches import Switches, switch_label

from models.constants import V41_COMPONENT_BYTES

from .constants import PREFILL_TOKENS, TIE_TOLERANCE
from .plan import Plan, engine_switches
from .plans import latest_plan_path, load_plan, resolve_plan_path
from .rigmodel import RigProblem, problem_for_rig, solve_rig
from .solve import PhasePrediction, predict
from .workload import NAMED

app = make_app("planner", "Split reads across replicas: exact split arithmetic, one pricing of every engine's reads, the "
                          "solver, plans.")

EngineOption = typer.Option(DEFAULT_ENGINE, "--engine", help=f"Engine whose reads are planned: {', '.join(ENGINES)}.")
BenchOption = typer.Option(None, "--bench", metavar="RESULT",
                           help="iobench result: a file, its name in rig/bench, or 'latest' (default: the newest).")
BackgroundOption = typer.Option(None, "--background", metavar="SOURCE:KIND",
                                help="Other work on a source: primary:engram (Engram rows per decoded token) or "
                                     "NAME:PERCENT% busy. Repeatable.")
LanesOption = typer.Option(None, "--lanes", min=1, max=64,
                           help="Reads in flight per drive, for an engine that keeps them per drive (default: the engine's; "
                                "ds4-argodrive's prefill lanes, 8).")
ThreadsOption = typer.Option(None, "--threads", min=1, max=256,
                             help="Reads in flight over all drives, for an engine that shares one pool (default: the engine's; "
                                  "ds4-argodrive's decode pread pool, 9; colibri's expert loads, 8).")
WorkloadOption = typer.Option(None, "--workload", metavar="NAME",
                              help=f"Plan a named workload instead of the rig's model: {', '.join(NAMED)} (DeepSeek V4.1 "
                                   "Flash's reads, see docs/planner.md).")
ModelOption = typer.Option(None, "--model", metavar="PATH",
                           help="Plan this model (GGUF file, split set member, safetensors directory; a header-only copy "
                                "will do) instead of the rig's.")
PromptOption = typer.Option(PREFILL_TOKENS, "--prompt-tokens", min=1, help="Prompt tokens the prefill prediction is for.")
CacheOption = typer.Option(None, "--cache-experts", min=0, help="Experts the engine's cache holds (default: 30% of the "
                                                                "model's routed experts, ds4-v41's 4,600 of 15,360).")
FitOnlyOption = typer.Option(False, "--fit-only", help="Use iobench's fitted drive models alone, not corrected by its "
                                                       "measurements near each shape.")
TailsOption = typer.Option(False, "--tails", help="Price the decode barrier from each drive's measured latency quantiles as "
                                                  "independent "
                           "draws (off by default: on throttled test drives it under-predicted decode by up to 50 %; see "
                           "docs/planner.md).")
PageCacheOption = typer.Option("auto", "--page-cache", metavar="SIZE",
                               help="RAM the page cache can give the model, for an engine whose reads go through it "
                                    "(in the switches it is priced on): re-reads of that share come from RAM. 'auto': the "
                                    "RAM this process may use (its memory cgroup's limit, else MemTotal) less what the "
                                    "engine keeps of its own; 0: every read from a drive (docs/planner.md).")
EngineArgOption = typer.Option([], "--engine-arg", metavar="ARG",
                               help="An argument the engine will be started with (repeatable), for what it sizes of its "
                                    "own from them (colibri: its expert cache per layer, argv[1]); its environment is "
                                    "this process's (CAP, CAP_RAISE, RAM_GB).")
ModeOption = typer.Option([], "--switch", metavar="NAME",
                          help="An engine switch to price on (repeatable, or NAME,NAME); each engine's own: "
                               + " | ".join(f"{e.name}: {e.switches.help()}" for e in ENGINES.values() if e.switches) + ".")

BAR = 40


def _int(text: str, what: str, minimum: int = 0) -> int:
    try:
        v = int(str(text).replace("_", ""))
    except ValueError:
        raise UsageError(f"{what} {text!r}: give a whole number of bytes, e.g. {V41_COMPONENT_BYTES}") from None
    if v < minimum:
        raise UsageError(f"{what} {v}: must be >= {minimum}")
    return v


def _bar(part: int, whole: int) -> str:
    n = round(BAR * part / whole) if whole else 0
    return "█" * n + "·" * (BAR - n)


@app.command()
def split(weights: str = typer.Option(..., "--weights", metavar="W0:W1:W2", help="Integer weights, primary first, e.g. 10:5:5."),
          length: str = typer.Option("6635520", "--length", help="Bytes in the read (default: a DeepSeek V4.1 Q4 expert "
                                                                 "component)."),
          offset: str = typer.Option("0", "--offset", help="Byte offset of the read in the file."),
          engine: str = EngineOption, json_out: bool = JsonOption):
    """The pieces each source reads of one read, exactly as an engine that cuts reads computes them (docs/engine-profiles.md)."""
    r = describe_split(_int(offset, "--offset"), _int(length, "--length"), parse_weights(weights, engine), engine)
    if json_out:
        print_result(r)
        return
    w, smallest, n_len, n_off, pieces = r.weights, r.smallest_equivalent, r.length, r.offset, r.pieces
    t = Table(title=f"{engine} split of {n_len:,} B at {n_off:,} by {':'.join(map(str, w))}"
                    + (f" (same as {':'.join(map(str, smallest))})" if smallest != w else ""))
    for col in ("source", "offset", "blocks", "bytes", "share"):
        t.add_column(col, justify="left" if col in ("source", "share") else "right")
    for p in pieces:
        t.add_row(str(p.source), f"{p.offset:,}", str(p.blocks), f"{p.length:,}", _bar(p.length, n_len))
    out.print(t)


def _page_cache(text: str) -> int | None:
    """--page-cache: 'auto' (None: the RAM this process runs under, less the engine's own —
    `rigmodel.engine_world`), or a size (0: none)."""
    t = str(text).strip().lower()
    if t == "auto":
        return None
    return 0 if t == "0" else parse_size(text, "--page-cache")


def _problem_options(lanes, threads, workload, model, prompt_tokens, cache_experts, fit_only: bool, tails: bool,
                     page_cache: str, engine_args=()) -> dict:
    """`solve` and `simulate`'s options as `rigmodel.problem_for_rig`'s keywords."""
    return dict(lanes=lanes, threads=threads, workload=workload, model=model, prompt_tokens=prompt_tokens,
                cache_experts=cache_experts, calibrate=not fit_only, tails=tails, page_cache_bytes=_page_cache(page_cache),
                engine_args=tuple(engine_args or ()))


@app.command()
def solve(rig: Optional[str] = RigOption, bench: Optional[str] = BenchOption, engine: str = EngineOption,
          background: Optional[List[str]] = BackgroundOption, lanes: Optional[int] = LanesOption,
          threads: Optional[int] = ThreadsOption, top: int = typer.Option(5, "--top", min=0, max=50, help="Alternatives to "
                                                                                                          "keep per phase."),
          workload: Optional[str] = WorkloadOption, model: Optional[str] = ModelOption, prompt_tokens: int = PromptOption,
          cache_experts: Optional[int] = CacheOption, fit_only: bool = FitOnlyOption, tails: bool = TailsOption,
          page_cache: str = PageCacheOption, engine_arg: Optional[List[str]] = EngineArgOption,
          quiet: bool = QuietOption, json_out: bool = JsonOption):
    """Find the weights (and switches) for the rig's model and engine; write rig/plans/<timestamp>.json."""
    saved = solve_rig(rig_dir(rig), bench, engine, background or (), top,
                      **_problem_options(lanes, threads, workload, model, prompt_tokens, cache_experts, fit_only, tails,
                                         page_cache, engine_arg))
    # Said once the plan is written, so a failing command still says one line.
    for text in () if quiet else saved.notices:
        err.print(f"notice: {text}", markup=False)
    if json_out:
        print_result(saved)
    else:
        _render_plan(saved.plan, saved.path)
    if not quiet:
        err.print(f"plan written to {saved.path}")


@app.command()
def simulate(weights: str = typer.Option(..., "--weights", metavar="W0:W1:W2", help="Integer weights, primary first."),
             phase: str = typer.Option(..., "--phase", help="prefill or decode."),
             rig: Optional[str] = RigOption, bench: Optional[str] = BenchOption, engine: str = EngineOption,
             background: Optional[List[str]] = BackgroundOption, lanes: Optional[int] = LanesOption,
             threads: Optional[int] = ThreadsOption, workload: Optional[str] = WorkloadOption, model: Optional[str] = ModelOption,
             prompt_tokens: int = PromptOption, cache_experts: Optional[int] = CacheOption,
             fit_only: bool = FitOnlyOption, switch: List[str] = ModeOption, tails: bool = TailsOption,
             page_cache: str = PageCacheOption,
             json_out: bool = JsonOption):
    """Predict one weight vector for the rig's model: each drive's bytes, pieces and busy time, the phase's speed, who
    lands last."""
    if phase not in ("prefill", "decode"):
        raise UsageError(f"--phase {phase!r}: use prefill or decode")
    w = parse_weights(weights, engine)
    switches = get_engine(engine).switches.parse(switch, engine)
    _, chosen, problem = problem_for_rig(rig_dir(rig), bench, engine, background or (),
                                         **_problem_options(lanes, threads, workload, model, prompt_tokens, cache_experts,
                                                            fit_only, tails, page_cache))
    d = predict(problem, phase, w, switches)
    if chosen.notice:
        err.print(f"notice: {chosen.notice}", markup=False)
    if json_out:
        print_result(PhasePrediction(d))
        return
    _render_prediction(d, f"{phase} {':'.join(map(str, w))}", get_engine(engine).switches)


@app.command()
def whatif(rig: Optional[str] = RigOption, bench: Optional[str] = BenchOption, engine: str = EngineOption,
           add: Optional[str] = typer.Option(None, "--add", metavar="DIR",
                                             help="A folder on the drive to add: measured now on a scratch file there "
                                                  "(written, read cold, removed), no replica yet."),
           add_bench: Optional[str] = typer.Option(None, "--add-bench", metavar="RESULT[:DRIVE]",
                                                   help="The drive to add from an iobench result "
                                                        "(`iobench scratch DIR` writes one)."),
           add_ceiling: Optional[str] = typer.Option(None, "--add-ceiling", metavar="NAME=READ[@LAT_MS][/WRITE]",
                                                     help="The drive to add by its read ceiling (decimal GB/s), latency of one "
                                                          "request and write speed, e.g. usb=0.9@0.2/0.8."),
           name: Optional[str] = typer.Option(None, "--name", help="The added drive's name (default: its mount point)."),
           partial: Optional[float] = typer.Option(None, "--partial", metavar="FRACTION", min=0.0, max=1.0,
                                                   help="Price the added drive as a partial member holding this share of the "
                                                        "model's bytes, its hottest files first (a model of several files)."),
           remove: Optional[str] = typer.Option(None, "--remove", metavar="DRIVE", help="Price the rig without this drive."),
           timing: Optional[str] = typer.Option(None, "--timing", metavar="RUN.json|LOG",
                                                help="A run's timing (time waiting for reads vs computing): a run result of the "
                                                     "embedded engine, or the real engine's log (default: the newest "
                                                     "harness arm)."),
           scratch_size: str = typer.Option("1G", "--scratch-size", help="Scratch file for --add (binary units)."),
           preset: str = typer.Option("all", "--preset", help="iobench presets for --add (all: seq, prefill, decode, rand4k)."),
           seconds: float = typer.Option(0.5, "--seconds", help="Seconds per iobench window for --add."),
           repeat: int = typer.Option(3, "--repeat", help="iobench windows per trial for --add."),
           scratch_lanes: Optional[str] = typer.Option(None, "--scratch-lanes", metavar="1,2,4",
                                                       help="iobench lane counts for --add (default per preset; fewer "
                                                            "for a small scratch file)."),
           workload: Optional[str] = WorkloadOption, model: Optional[str] = ModelOption, prompt_tokens: int = PromptOption,
           cache_experts: Optional[int] = CacheOption, fit_only: bool = FitOnlyOption, page_cache: str = PageCacheOption,
           json_out: bool = JsonOption):
    """Before a copy: the phase speeds with a drive added (full or partial) or removed, whether the machine is
    compute-bound, the gain per GB copied and how long the copy would take."""
    from iobench.schedule import parse_lanes, parse_presets
    from .whatifs import WhatIfRequest, run_whatif

    if sum(x is not None for x in (add, add_bench, add_ceiling, remove)) != 1:
        raise UsageError("give one change: --add DIR, --add-bench RESULT, --add-ceiling NAME=READ, or --remove DRIVE")
    req = WhatIfRequest(add=add, add_bench=add_bench, add_ceiling=add_ceiling, remove=remove, name=name, partial=partial,
                        timing=timing, scratch_size=parse_size(scratch_size, "--scratch-size"), presets=parse_presets(preset),
                        seconds=seconds, repeat=repeat, lanes=parse_lanes(scratch_lanes, "--scratch-lanes"))
    if add is not None:
        err.print(f"measuring {add} on a scratch file of {scratch_size} (removed after) ...", highlight=False)
    root = rig_dir(rig)
    rp = RigProblem(*problem_for_rig(root, bench, engine, workload=workload, model=model, prompt_tokens=prompt_tokens,
                                     cache_experts=cache_experts, calibrate=not fit_only,
                                     page_cache_bytes=_page_cache(page_cache)))
    w, saved = run_whatif(rp, load_rig(root, must_exist=False), req)
    if saved:
        err.print(f"iobench: wrote {saved}", highlight=False)
    if rp.chosen.notice:
        err.print(f"notice: {rp.chosen.notice}", markup=False)
    if json_out:
        print_result(w)
        return
    _render_whatif(w)


def _render_whatif(w) -> None:
    what = f"{w.change} {w.drive}" + (" (partial)" if w.holds is not None else "") + (" (RAM)" if w.memory else "")
    out.print(f"[bold]what if[/]: {what} — {w.engine}, {' + '.join(w.before)} -> {' + '.join(w.after)}", highlight=False)
    if w.how:
        out.print(f"  {w.drive}: {w.how}", highlight=False, markup=False)
    t = Table()
    for col in ("phase", "weights now", "weights then", "tok/s now", "tok/s then", "reads", "reads share", "end to end",
                "per GB"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for p in w.phases:
        per = w.gain_per_GB(p)
        t.add_row(p.phase, ":".join(map(str, p.weights_before)), ":".join(map(str, p.weights_after)),
                  f"{p.tok_s_before:,.2f}", f"{p.tok_s_after:,.2f}", format_signed_pct(p.gain),
                  f"{p.read_share:.0%}" if p.read_share is not None else "-",
                  format_signed_pct(p.end_to_end) if p.end_to_end is not None else "-",
                  f"{per * 100:+.3f}%" if per is not None else "-")
    out.print(t)
    if w.copy_bytes:
        dur = f"{w.copy_s / 60:,.1f} min at {w.write_Bps / 1e6:,.0f} MB/s" if w.copy_s else "unknown (no write speed)"
        out.print(f"copy: {w.copy_bytes:,} B, {dur}", highlight=False)
    if w.timing_source:
        out.print(f"timing from {w.timing_source}", highlight=False, markup=False)
    for n in w.notes:
        out.print(f"note: {n}", highlight=False, markup=False)
    out.print(f"[bold]{w.verdict()}[/]", highlight=False)


def _render_prediction(p: dict, title: str, declared: Switches) -> None:
    """One phase's prediction: the phase's speed (and the engine's switches it was made with), and
    per drive its share of the bytes, its pieces and busy time per layer, and how often it lands last."""
    if "seconds" not in p:                     # a plan from before the one pricing
        out.print(f"[bold]{title}[/]: {format_rate(p.get('throughput_Bps', 0))}", markup=True)
        return
    sw = sorted(declared.read(p))
    out.print(f"[bold]{title}[/]{' (' + ', '.join(sw) + ')' if sw else ''}: {format_rate(p['throughput_Bps'])}, "
              f"{p['tok_s']:,.1f} tok/s of reads; {p['time_per_layer_s'] * 1e3:.3f} ms per layer, "
              f"{p['reads_per_layer']:.2f} reads of {p['read_bytes']:,.0f} B in {p['groups_per_layer']:.2f} groups per layer")
    t = Table()
    for col in ("source", "share", "bytes/layer", "pieces/layer", "experts/layer", "busy (ms/layer)", "lands last",
                "share of bytes"):
        t.add_column(col, justify="left" if col in ("source", "share of bytes") else "right")
    for s in p["sources"]:
        t.add_row(s["name"], f"{s['share'] * 100:.1f}%", f"{s['bytes']:,.0f}", f"{s['pieces']:.2f}",
                  f"{s['experts']:.2f}" if "experts" in s else "-", f"{s['time_s'] * 1e3:.3f}",
                  f"{s['lands_last'] * 100:.0f}%", _bar(round(s["share"] * 1000), 1000))
    out.print(t)
    out.print(f"lands last most often: [bold]{p['lands_last']}[/], {p['gap_s'] * 1e3:.3f} ms after the next drive")
    if p.get("tail_s"):
        out.print(f"latency tails: the last piece of a group lands {p['tail_s'] * 1e3:.3f} ms after the slowest mean")
    if p.get("bound"):
        out.print(f"bound by link [bold]{p['bound']}[/]: its members share its measured ceiling")


def _render_plan(plan: Plan, path: str) -> None:
    out.print(f"[bold]plan[/] {path}  ({plan.engine}, {plan.created})")
    out.print("sources: " + ", ".join(f"{i}:{s.name}={s.path}" for i, s in enumerate(plan.sources)))
    _render_workload(plan)
    _render_switches(plan)
    for ph in ("prefill", "decode"):
        phase = getattr(plan, ph)
        if phase.predicted:
            _render_prediction(phase.predicted, f"{ph} {':'.join(map(str, phase.weights))}", engine_switches(plan.engine))
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
        _render_alternatives(plan, ph, phase)
    prov = plan.provenance
    _render_engine_trials(prov.get("engine_trials") or {})
    for link in (prov.get("model") or {}).get("links") or ():
        out.print(f"shared link {link.get('name')}: {', '.join(link.get('drives', []))} at most "
                  f"{format_rate(link.get('ceiling_Bps', 0))} together")
    if prov:
        out.print(f"from bench {prov.get('bench')} (rig {prov.get('rig')}, manifest {prov.get('manifest') or 'none'})")


def _alt_label(a: dict, declared: Switches) -> str:
    """An alternative's weights, and its switches where the engine has any (the same weights with
    other switches on is another candidate)."""
    on = switch_label(declared.read(a))
    return ":".join(map(str, a.get("weights", []))) + (f" {on}" if on else " (no switches)" if declared else "")


def _render_alternatives(plan: Plan, ph: str, phase) -> None:
    """The solver's runners-up for a phase, never the plan's own split: ties first (as fast as the
    best within the solver's tie tolerance; the plan took the preferred one: default switches,
    smaller weights), then the next best, each with its speed relative to the plan's."""
    switches = engine_switches(plan.engine)
    own = (list(phase.weights), plan.switches)
    alts = [a for a in plan.alternatives if isinstance(a, dict) and a.get("phase") == ph
            and (list(a.get("weights", [])), switches.read(a)) != own]
    ties = [a for a in alts if a.get("tied")]
    rest = [a for a in alts if not a.get("tied")]

    def listed(group: list[dict]) -> str:
        return ", ".join(f"{_alt_label(a, switches)} ({format_signed_pct(-a.get('behind', 0))})" for a in group)

    if ties:
        prefers = "the default switches, then the smaller weights" if switches else "the smaller weights"
        out.print(f"  as fast within {TIE_TOLERANCE:.1%} (the plan takes {prefers}): " + listed(ties))
    if rest:
        out.print("  next best: " + listed(rest))


def _render_engine_trials(t: dict) -> None:
    """What the engine itself measured (`engine-bridge autotune --binary`): every arm's predicted and
    measured tok/s, the winner and its gains."""
    if not t:
        return
    out.print(f"measured by the engine {t.get('engine')} ({t.get('measured_by')}); report {t.get('report')}", markup=False)
    for a in t.get("arms") or ():
        med, pred, e = a.get("median_tok_s"), a.get("predicted_tok_s"), a.get("error_pct")
        out.print(f"  {a.get('label'):<28} {', '.join(a.get('roles') or [])[:36]:<36} "
                  f"predicted {'-' if pred is None else f'{pred:.2f}':>8}  measured {'-' if med is None else f'{med:.2f}':>8} "
                  f"tok/s (spread {a.get('spread_pct', 0.0):.1f} %, prediction {'-' if e is None else f'{e:+.1f} %'})"
                  + ("" if a.get("qualified") else f"  OUT: {a.get('why')}"), markup=False)

    def pct(x):
        return "-" if x is None else f"{x:+.1f} %"
    out.print(f"  winner {t.get('winner')} ({t.get('why')}); gain over the engine's default "
              f"{pct(t.get('gain_over_default_pct'))}, over equal weights {pct(t.get('gain_over_equal_pct'))}", markup=False)


def _render_switches(plan: Plan) -> None:
    """An engine with switches: which the plan turns on, and the objective per setting."""
    names = get_engine(plan.engine).switches.names
    if not names:
        return
    on = [k for k in names if k in plan.switches]
    scores = (plan.provenance.get("model") or {}).get("scores") or {}
    line = f"switches: {', '.join(on) if on else 'none'} (of {', '.join(names)})"
    if plan.prefill.weights == plan.decode.weights:
        line = f"weights {':'.join(map(str, plan.prefill.weights))} for both phases; " + line
    if len(scores) > 1:
        line += ("; objective " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
                 + " (sum over phases of seconds / the phase's fastest)")
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
    for rep in (w.get("idle") or {}).values():
        out.print(f"  idle: {rep.get('why')}", markup=False)


@app.command()
def show(plan: Optional[str] = typer.Argument(None, metavar="PLAN",
                                              help="Plan file, its name in rig/plans, or 'latest' (default: the newest)."),
         rig: Optional[str] = RigOption, json_out: bool = JsonOption):
    """A readable summary of a plan, with the split of one read drawn per source."""
    the_rig = load_rig(rig_dir(rig), must_exist=False)
    path = resolve_plan_path(plan, the_rig) if plan else latest_plan_path(the_rig)
    p = load_plan(path)
    if json_out:
        print_result(p)
    else:
        _render_plan(p, os.path.abspath(path))


@app.command()
def tune(rig: Optional[str] = RigOption, bench: Optional[str] = BenchOption,
         plan: Optional[str] = typer.Option(None, "--plan", metavar="PLAN",
                                            help="Plan to start from and reset to: a file, a name in rig/plans or 'latest' "
                                                 "(default: the newest; solved in the tuner if there is none)."),
         engine: Optional[str] = typer.Option(None, "--engine", help=f"Engine to tune: {', '.join(ENGINES)} (default: the "
                                                                     "plan's; "
                                              "with no --plan, the newest plan for it, else solved in the tuner)."),
         fit_only: bool = FitOnlyOption):
    """Open the split tuner: nudge weights per phase and the engine's switches, read the prediction, save a plan."""
    from .tui.app import run_tuner  # Textual loads only for this command

    if engine is not None:
        get_engine(engine)                       # an unknown engine is one line before the screen
    run_tuner(rig_dir(rig), bench, plan, calibrate=not fit_only, engine=engine)


def main() -> None:
    run(app, "planner")


if __name__ == "__main__":
    main()
