"""A whole run of the embedded engine (the I/O ring around `inference.EmbeddedEngine`): the model's
sources in, the run result out (RUN_SCHEMA, `kind: "run"`), plus the files a run may leave
(the ds4-bench CSV row, the routing trace for `replay --trace`)."""

from __future__ import annotations

import contextlib
import csv
import gc
import io
import os
import resource
import time
from typing import ClassVar, Sequence

import numpy as np

from core.errors import UsageError
from core.fsutil import check_output
from core.platform import maxrss_bytes
from core.results import Document
from core.rig import Rig
from core.jsonfile import write_json
from models.usage import MISSES, usage_of, usage_to_dict
from engine_bridge.reader import SplitReader
from engine_bridge.reader.settings import EMBEDDED, OFF, ReaderSettings

from models.cache import ExpertCache
from .constants import CSV_COLUMNS, DEQUANT_THREADS, PREFILL_CHUNK_TOKENS, RUN_SCHEMA, TRACE_SCHEMA
from .idle import PHASES, idle_sources
from .inference import EmbeddedEngine, RunOutcome, prompt_tokens, tokens_sha256
from .resident import Geometry, inspect_model, load_resident
from .inputs import SourceSet
from .staging import PhaseCounters


class RunResults(Document):
    """`engine-bridge run --json`: the run's results (`run_result`, kind "run")."""

    KIND: ClassVar[str] = "run"
    SCHEMA: ClassVar[int] = RUN_SCHEMA


def run_model(sources: SourceSet, prompt: int, gen: int, cache_experts: int, reader: ReaderSettings = EMBEDDED,
              prompt_seed: int = 0, chunk_tokens: int = PREFILL_CHUNK_TOKENS, cold: bool = True,
              trace: bool = False, dequant_threads: int = DEQUANT_THREADS,
              prompt_ids: Sequence[int] | None = None) -> dict:
    """Load the primary's resident weights, run prefill and greedy decode with experts streamed
    through a SplitReader over `sources`; returns the run result (RUN_SCHEMA shape, see
    `run_result`; each phase lists per source the bytes and pieces given and read, and `idle` the
    sources that read nothing in a phase, `idle.idle_sources`). reader: the split reader's lanes
    and what it does beyond the engine's reads (`ReaderSettings`; by default hedging, re-weighting
    and balancing are on: one slow drive must not hold every read; docs/reader.md). prompt_ids:
    the prompt's token ids (a tokenized text) instead of `prompt` ids drawn from `prompt_seed`."""
    geometry = inspect_model(sources.models[0].path)
    resident = load_resident(geometry)
    if prompt_ids is not None:
        ids = np.asarray(list(prompt_ids), dtype=np.int64)
        if ids.size and not (0 <= ids.min() and ids.max() < resident.vocab):
            raise UsageError(f"prompt ids must be in 0..{resident.vocab - 1} (the model's vocabulary)")
        prompt = int(ids.size)
    for name, v, lo in (("--prompt-tokens", prompt, 1), ("--gen-tokens", gen, 0), ("--cache-experts", cache_experts, 0)):
        if v < lo:
            raise UsageError(f"{name} {v}: must be at least {lo}")
    if prompt_ids is None:
        ids = prompt_tokens(prompt, resident.vocab, prompt_seed)
    total = geometry.layers * geometry.experts
    applied = min(cache_experts, total)
    cache = ExpertCache(applied, total)
    holds = sources.holds()
    with SplitReader(sources.models, sources.prefill, sources.decode, settings=reader, cold=cold,
                     engine=sources.engine, holds=holds) as split:
        eng = EmbeddedEngine(geometry, resident, split.submit_read,
                     sources.step_reads(geometry, split.healthy, holds, split.weights_now), cache,
                     chunk_tokens=chunk_tokens, record_trace=trace, dequant_threads=dequant_threads,
                     in_flight=sources.in_flight())
        try:
            with frozen_heap():
                outcome = eng.run(ids, gen)
        finally:
            eng.close()
        stats = split.stats()
        text = split.format_stats()
        settings = split.settings
    result = run_result(outcome, geometry, sources, cache_experts, applied, settings.lanes, stats, text,
                        settings.to_dict())
    result["expert_misses"] = cache.miss_counts.reshape(geometry.layers, geometry.experts)
    # what the run held of the RAM beside the page cache at its peak (the model's resident weights,
    # the expert cache, the reader's buffers): what a RAM budget must leave to the process
    result["peak_rss_bytes"] = maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return result


@contextlib.contextmanager
def frozen_heap():
    """Run a block with everything alive before it frozen out of the garbage collector's walks
    (`gc.freeze`, undone after, also on an error): the modules, the model and the reader live for
    the whole run, and a full collection that walks them (about 48,000 objects, 11–14 ms on a
    2-core machine) landed in one arm's decode and not in another's (docs/reader.md "Round 8")."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def bench_row(o: RunOutcome) -> dict:
    """The ds4-bench CSV row (docs/harness.md) of a run."""
    gen = len(o.step_seconds)
    steady = o.step_seconds[1:]
    return {
        "ctx_tokens": o.prompt + gen,
        "prefill_tokens": o.prompt,
        "prefill_tps": round(o.prompt / o.prefill.seconds, 3) if o.prefill.seconds > 0 else 0.0,
        "gen_tokens": gen,
        "gen_tps": round(gen / o.decode.seconds, 3) if o.decode.seconds > 0 and gen else 0.0,
        "gen_first_ms": round(o.step_seconds[0] * 1000, 3) if gen else 0.0,
        "gen_steady_tokens": len(steady),
        "gen_steady_tps": round(len(steady) / sum(steady), 3) if steady and sum(steady) > 0 else 0.0,
        "kvcache_bytes": o.kvcache_bytes,
    }


def run_result(o: RunOutcome, g: Geometry, sources: SourceSet, requested: int, applied: int, lanes: int,
               stats, stats_text: str, hedging: dict | None = None) -> dict:
    row = bench_row(o)
    hits = o.prefill.hits + o.decode.hits
    misses = o.prefill.misses + o.decode.misses
    gen = len(o.step_seconds)
    sd = stats.to_dict()
    phases = sd["phases"]
    weights = {"prefill": list(sources.prefill), "decode": list(sources.decode)}
    idle = idle_sources(phases, weights, sources.paths, [s.degraded for s in stats.sources], sources.planned)
    return {
        "schema": RUN_SCHEMA,
        "kind": RunResults.KIND,
        **row,
        "output_sha256": tokens_sha256(o.tokens),
        "cache_experts": requested,
        "cache_experts_applied": applied,
        "hits": hits,
        "misses": misses,
        "misses_per_token": round(o.decode.misses / gen, 4) if gen else 0.0,
        "engine": sources.engine,
        "switches": sorted(sources.switches),
        "weights": weights,
        "sources": sd["sources"],
        "events": sd["events"],
        "lanes": lanes,
        **(hedging or OFF),
        "weights_now": sd["weights_now"],
        "reweighs": sd["reweighs"],
        "model": g.as_dict(),
        "prefill": phase_dict(o.prefill, phases["prefill"]),
        "decode": phase_dict(o.decode, phases["decode"]),
        "planned": {ph: sources.planned.get(ph) for ph in PHASES},
        "idle": idle,
        "output_tokens": len(o.tokens),
        "output_ids": list(o.tokens),
        "reader": {"reads": sd["reads"], "bytes": sd["bytes"], "text": stats_text, "watchdog": sd["watchdog"],
                   "build": sd["build"]},
        **({"trace": o.trace} if o.trace is not None else {}),
    }


def phase_dict(c: PhaseCounters, reader_phase: dict) -> dict:
    """A phase of the run result: the engine's counters, the phase's largest read (bytes) and
    what each source was given and read in it (`reader.readstats.PhaseSourceStats`)."""
    return {**c.as_dict(), "largest_read": reader_phase["largest_read"], "sources": reader_phase["sources"]}


# -- what a run leaves on disk ------------------------------------------------------------------

def csv_text(row: dict, header: bool) -> str:
    """The ds4-bench CSV line of a run or replay result (with the header line if asked)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(CSV_COLUMNS)
    w.writerow([row[c] for c in CSV_COLUMNS])
    return buf.getvalue()


def our_csv(head: bytes) -> bool:
    """A file `--csv` may append to: empty, or a ds4-bench CSV of ours (it starts with our header)."""
    return not head.strip() or head.startswith(",".join(CSV_COLUMNS).encode())


def our_trace(head: bytes) -> bool:
    return b'"kind": "routing-trace"' in head


def check_outputs(csv_file: str | None = None, trace_out: str | None = None) -> None:
    """Before a run or replay: the files it will write can be written (core.fsutil.check_output),
    so a wrong --csv fails at once, not after the whole run, and no user file is appended to."""
    if csv_file:
        check_output(csv_file, "--csv", our_csv, forceable=False)
    if trace_out:
        check_output(trace_out, "--trace-out", our_trace, forceable=False)


def append_csv(path: str, result: dict) -> None:
    """Append the result's CSV row to `path`, with the header when the file is new or empty."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", encoding="utf-8") as f:
        f.write(csv_text(result, header=new))


def trace_doc(result: dict, trace: list) -> dict:
    """The routing trace `replay --trace` reads (see `replay.load_trace`), from a run's recorded routing."""
    m = result["model"]
    return {"schema": TRACE_SCHEMA, "kind": "routing-trace", "layers": m["layers"], "experts": m["experts"],
            "top_k": m["top_k"], "steps": [{"phase": ph, "layers": sel} for ph, sel in trace]}


def usage_dir_of(the_rig: Rig, primary: str) -> str | None:
    """The rig's usage/ folder when the run's primary is the rig's model (its history), else None
    (`the_rig`: as the run read it, `sources.run_inputs`)."""
    if the_rig.model is None or os.path.realpath(the_rig.model.path) != os.path.realpath(primary):
        return None
    return the_rig.usage_dir


def save_run(result: dict, csv_file: str | None = None, trace_out: str | None = None,
             usage_dir: str | None = None) -> dict:
    """Write what a run or replay leaves: its CSV row appended to `csv_file`, (a run recorded
    with trace=True) its routing trace to `trace_out`, and each expert's misses as a usage record
    in `usage_dir` (the rig's usage/, which `replicas sync --partial` ranks shards by). Returns the
    result without its raw trace and counts."""
    trace = result.pop("trace", None)
    misses = result.pop("expert_misses", None)
    if usage_dir and misses is not None and misses.sum() > 0:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        doc = usage_to_dict(usage_of(misses, MISSES, f"engine-bridge {result.get('kind', 'run')}", created))
        os.makedirs(usage_dir, exist_ok=True)
        name = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns() % 1_000_000_000:09d}Z.json"
        write_json(os.path.join(usage_dir, name), doc, indent=None)
    if trace_out:
        write_json(trace_out, trace_doc(result, trace), indent=None)
    if csv_file:
        append_csv(csv_file, result)
    return result
