"""ds4-argodrive's profile (`engines.handoff.EngineProfile`): the environment and arguments a
plan gives the engine, the rules its reader would otherwise discover the hard way, and whether a
run's log proves the profile was applied (docs/engine-profiles.md). Pure.

The names are the engine's (`constants`), its log lines are read by `ds4_log` (from its reader,
argodrive_read.h: `ar_open` parses the split, `ar_close` prints the per-source bytes). This module
is the engine's `Engine.profile`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from core.units import plural

from . import constants as ds4
from ..handoff import (
    NO_SOURCES,
    PHASES,
    Check,
    Request,
    RunReading,
    Setting,
    SourceFacts,
    StandinCall,
    StandinRun,
    Violation,
    bad_characters,
    exit_check,
    idle_note,
    lines_matching,
    printed_step,
    list_rules,
    served_nothing,
    unverified,
    weight_rules,
)
from .ds4_log import LOG_SOURCE_BYTES, ReaderLog, read_log as read_reader_log, weights_text


# ---------------------------------------------------------------------------------------------
# Environment and arguments (docs/engine-profiles.md)

def split_environment(primary_weight: int, replicas: Sequence[str], replica_weights: Sequence[int],
                      decode_weights: Sequence[int]) -> tuple[tuple[str, str], ...]:
    """The split keys for base weights (primary first) and decode weights (one per source);
    none for a single source, which the engine reads without a split."""
    if not replicas:
        return ()
    return ((ds4.ENV_PRIMARY_WEIGHT, str(primary_weight)),
            (ds4.ENV_REPLICAS, ",".join(f"{p}*{w}" for p, w in zip(replicas, replica_weights))),
            (ds4.ENV_DECODE_WEIGHTS, ",".join(map(str, decode_weights))))


def engine_args(primary: str, cache_experts: int | None) -> tuple[str, ...]:
    """The arguments a profile gives: stream experts from `primary`, `cache_experts` of them in RAM."""
    return (ds4.ARG_STREAMING, ds4.ARG_MODEL, primary, ds4.ARG_CACHE_EXPERTS, str(cache_experts))


named_profiles = True       # io-base, stack-levers, rig/profiles/*.toml: ds4 knobs under the plan's keys
cache_experts = True        # --ssd-streaming-cache-experts is an argument every profile gives
source_view = None          # ds4 is given the model's file (-m) and each replica's file
checks = ("exit", "sources", "decode-split", "source-bytes", "cache-budget", "prefill-staging")


def clear_prefix() -> str:
    """The launcher starts ds4 without any inherited DS4_* variable: a stale presence flag would
    turn a switch on whatever the profile says."""
    return ds4.ENV_PREFIX


def profile_args() -> frozenset[str]:
    return ds4.PROFILE_ARGS


def plan_keys() -> tuple[str, ...]:
    return ds4.SPLIT_KEYS


def managed_keys(named: Iterable[str] = ()) -> tuple[str, ...]:
    """The split keys, the engine's knobs and every key a named profile sets or unsets: a key a
    profile does not set is unset, never set to 0 (presence-based flags are among them)."""
    return tuple(dict.fromkeys(list(ds4.SPLIT_KEYS) + list(ds4.KNOWN_KEYS) + list(named)))


def variant(facts: Sequence[SourceFacts]) -> str:
    return ""


# ---------------------------------------------------------------------------------------------
# Export: the rules, the environment and arguments, the env file's header

def check(facts: Sequence[SourceFacts], request: Request, *, allow_unverified: bool = False,
          manifest_size: int | None = None) -> list[Violation]:
    """Every rule ds4's reader would otherwise discover the hard way (ar_open rejects the whole
    configuration and reads the primary alone) or ignore with a log line (a decode list of the
    wrong count). Returns all violations; an empty list means the engine will take it."""
    limit = ds4.MAX_SOURCES
    n = len(facts)
    if n == 0:
        return [NO_SOURCES]
    v = list_rules(facts, limit, f"{n} sources but {ds4.NAME} reads from at most {limit} (the primary and "
                                 f"{limit - 1} replicas); drop a replica from the plan")
    for f in facts:
        found = bad_characters(f.path, ds4.PATH_FORBIDDEN)
        if found:
            v.append(Violation("bad-character", f"sources[{f.index}]",
                               f"{f.path!r} contains {' and '.join(repr(c) for c in found)}, which {ds4.NAME} uses as "
                               "a separator; rename the directory or file"))
    v += weight_rules(n, request.prefill, request.decode, ds4.WEIGHT_MIN, ds4.WEIGHT_MAX)
    primary = facts[0]
    if not primary.exists:
        v.append(Violation("missing", "sources[0]", f"primary {primary.path} does not exist"))
    elif not primary.regular:
        v.append(Violation("not-regular", "sources[0]", f"primary {primary.path} is not a regular file"))
    elif manifest_size is not None and primary.size != manifest_size:
        v.append(Violation("size", "sources[0]",
                           f"primary {primary.path} is {primary.size} bytes but the manifest describes {manifest_size}; "
                           "re-hash the model with `replicas sync`"))
    seen: dict[tuple[int, int], int] = {}
    if primary.exists and primary.device is not None and primary.inode is not None:
        seen[(primary.device, primary.inode)] = 0
    for f in facts[1:]:
        where = f"sources[{f.index}]"
        if not f.exists or f.state == "missing":
            v.append(Violation("missing", where, f"replica {f.path} does not exist; run `replicas sync`"))
            continue
        if not f.regular:
            v.append(Violation("not-regular", where, f"replica {f.path} is not a regular file"))
            continue
        if primary.size is not None and f.size != primary.size:
            v.append(Violation("size", where, f"replica {f.path} is {f.size} bytes, the primary {primary.size}; "
                                              "run `replicas repair` or `replicas sync`"))
        key = (f.device, f.inode)
        if f.device is not None and f.inode is not None:
            if key in seen:
                v.append(Violation("same-inode", where,
                                   f"replica {f.path} is the same file (inode) as sources[{seen[key]}]; "
                                   "a replica must be a separate copy, not a hard link"))
            else:
                seen[key] = f.index
        if f.state != "verified" and not allow_unverified:
            v.append(unverified(f, where))
    return v


def setting(request: Request) -> Setting:
    """The split keys (base weights primary first, the decode list), then the named profile's
    keys; the arguments stream experts from the primary with the requested cache."""
    p = request.paths
    env = dict(split_environment(request.prefill[0], p[1:], request.prefill[1:], request.decode))
    env.update((k, v) for k, v in request.named if k not in env)
    return Setting(tuple(env.items()), engine_args(p[0], request.cache_experts))


def header(request: Request, s: Setting) -> tuple[str, ...]:
    w = request.prefill
    decode = request.decode if request.sources > 1 else ()
    return ("engine arguments: " + " ".join(shlex.quote(a) for a in s.argv),
            f"weights: prefill (base) {':'.join(map(str, w))}"
            + (f", decode {':'.join(map(str, decode))}" if decode else " (single source: no split)")
            + f"; expert cache {request.cache_experts} experts")


def unset_note() -> str:
    return "presence-based flags this profile does not want"


def given_by(argv: Sequence[str], environment: Mapping[str, str]) -> str:
    return " ".join(argv)


# ---------------------------------------------------------------------------------------------
# Launch: what to ask the engine to print, and the verdict on what it printed

def report_env(variant: str = "") -> dict[str, str]:
    """The cache report carries the budget line only when asked; "the requested cache was
    honoured" is a gate, so the launcher asks."""
    return {ds4.ENV_TIMING_SUMMARY: "1"}


def read_log(text: str, variant: str = "") -> ReaderLog:
    return read_reader_log(text)


@dataclass(frozen=True)
class ReaderExpectation:
    sources: int                 # 1 = primary only
    decode_split: str = ""       # e.g. "10,6,6"; "" when there is no split
    cache_experts: int | None = None
    prefill_split: bool = False  # DS4_ARGODRIVE_PREFILL_SPLIT requested
    idle: tuple[tuple[str, ...], ...] = ()   # per source: phases in which the plan gives it nothing


def expect(request: Request, environment: Mapping[str, str]) -> ReaderExpectation:
    env = dict(environment)
    return ReaderExpectation(sources=request.sources, decode_split=weights_text(env.get(ds4.ENV_DECODE_WEIGHTS, "")),
                       cache_experts=request.cache_experts, prefill_split=ds4.ENV_PREFILL_SPLIT in env,
                       idle=request.idle)


REJECTED = ("the engine rejected the replica configuration: every source it had opened reported bytes=0 and "
            "it never opened the split reader (a relative or unreadable path, more than 3 sources, a weight "
            "outside 1..100, or a replica of another size or the same inode)")


def _sources(log: ReaderLog, n: int) -> Check:
    if log.sources is None:
        if n > 1 and log.rejected:
            return Check("sources", False, str(n), "rejected", REJECTED)
        if n > 1:
            return Check("sources", False, str(n), "none",
                         "no 'expert reader sources=' line: the engine did not open the split reader")
        return Check("sources", True, "1", "none", "single source: the engine reads the primary alone")
    ok = log.sources == n
    return Check("sources", ok, str(n), str(log.sources),
                 f"engine opened {plural(log.sources, 'source')}" + ("" if ok else f", {n} requested"))


def _decode_split(log: ReaderLog, want: str) -> Check:
    if not want:
        return Check("decode-split", True, "", "", "no decode split requested (single source)")
    if log.decode_ignored is not None:
        return Check("decode-split", False, want, f"ignored {log.decode_ignored}",
                     f"engine ignored {ds4.ENV_DECODE_WEIGHTS}={log.decode_ignored} (wrong count or range)")
    if log.decode_split is None:
        return Check("decode-split", False, want, "none", "no 'decode split' line: decode would use the base weights")
    ok = log.decode_split == weights_text(want)
    return Check("decode-split", ok, want, log.decode_split,
                 "engine applied the decode split" if ok else f"engine applied decode split {log.decode_split}")


def _source_bytes(log: ReaderLog, n: int, idle: Sequence[Sequence[str]] = ()) -> Check:
    per = log.source_bytes
    # bytes=0 lines appear even when the reader rejected its configuration (the split is off),
    # so a source must show bytes > 0, not just a line — unless the plan leaves it idle in a
    # phase (its share of that phase's reads is 0 blocks): then 0 bytes is what the plan said.
    # A single source prints none unless the reader ran; when it did, its lines are held to the same.
    want = range(n) if (n > 1 or per) else range(0)
    idle_of = {i: tuple(idle[i]) for i in range(min(n, len(idle))) if idle[i]}
    observed = ",".join(f"{i}:{per[i]}" for i in sorted(per)) or "none"
    expected = f"{n} sources > 0" + (f" (idle: {', '.join(f'source[{i}] {idle_note(p)}' for i, p in idle_of.items())})"
                                     if idle_of else "")
    if n > 1 and log.rejected:
        return Check("source-bytes", False, expected, observed, REJECTED)
    if not want:
        return Check("source-bytes", True, "", observed, "single source: no per-source report expected")
    problems, notes = [], []
    for i in want:
        phases = idle_of.get(i, ())
        if i not in per:
            problems.append(f"source[{i}] reported no bytes")
        elif per[i] == 0:
            ok, say = served_nothing(f"source[{i}]", phases)
            if ok:
                notes.append(say)
            else:
                problems.append(f"source[{i}] read 0 bytes")
        elif set(phases) >= set(PHASES):
            notes.append(f"source[{i}] read {per[i]} bytes though the plan gives it nothing {idle_note(phases)}")
    problems += [f"source[{i}] was not requested" for i in sorted(per) if i >= n]
    if problems:
        return Check("source-bytes", False, expected, observed, "; ".join(problems + notes))
    busy = "every source delivered bytes" if not notes else "every other source delivered bytes"
    return Check("source-bytes", True, expected, observed, "; ".join([busy] + notes))


def _cache_budget(log: ReaderLog, req: int) -> Check:
    budgets = log.cache_budgets
    decode_cut = [(a, b) for a, b in log.decode_cache if b < a]
    observed = ",".join(map(str, budgets)) or "none"
    if not budgets:
        return Check("cache-budget", False, str(req), "none",
                     "no 'streaming expert cache budget=' line: the cache size is unconfirmed")
    if min(budgets) < req:
        return Check("cache-budget", False, str(req), observed,
                     f"engine reduced the expert cache to {min(budgets)} of {req} experts")
    if log.cache_caps:
        return Check("cache-budget", False, str(req), observed, f"engine capped the cache: {log.cache_caps[-1].strip()}")
    if decode_cut:
        a, b = decode_cut[-1]
        return Check("cache-budget", False, str(req), observed, f"engine reduced the decode cache to {b} of {a} experts")
    return Check("cache-budget", True, str(req), observed, "requested cache honoured")


def _prefill_staging(log: ReaderLog, requested: bool) -> Check:
    rejected = log.prefill_rejected
    if requested and rejected is not None:
        return Check("prefill-staging", False, "staged", "rejected",
                     f"prefill staging rejected ({rejected.strip()}); the engine fell back to the layer sweep")
    return Check("prefill-staging", True, "staged" if requested else "",
                 "rejected" if rejected is not None else "", "no rejection reported")


def judge(text: str, expectation: ReaderExpectation, returncode: int | None = 0) -> tuple[Check, ...]:
    """Judge a ds4 log (stdout + stderr) against what the profile asked for, one Check per name in
    `checks` ('cache-budget' only when a cache size was asked for). returncode None means the
    engine was stopped (timeout); negative, killed by that signal."""
    e = expectation
    log = read_reader_log(text)
    out = [exit_check(returncode), _sources(log, e.sources), _decode_split(log, e.decode_split),
           _source_bytes(log, e.sources, e.idle)]
    if e.cache_experts is not None:
        out.append(_cache_budget(log, e.cache_experts))
    out.append(_prefill_staging(log, e.prefill_split))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# The real-engine tuner: what a run says besides what it applied, and the state it keeps

CSV_HEADER = re.compile(r"^ctx_tokens,")


def _csv_last_row(text: str) -> dict[str, str]:
    """The last row of ds4-bench's CSV (`ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,...`)."""
    lines = text.splitlines()
    row: dict[str, str] = {}
    for i, line in enumerate(lines):
        if CSV_HEADER.match(line.strip()):
            cols = line.strip().split(",")
            for r in lines[i + 1:]:
                parts = r.strip().split(",")
                if len(parts) != len(cols) or not parts[0].strip().isdigit():
                    break
                row = dict(zip(cols, parts))
    return row


def _csv_timing(row: Mapping[str, str]) -> tuple[int, float, int, float, float] | None:
    """(prompt tokens, their tok/s, generated tokens, their tok/s, prefill + generation seconds)
    of ds4-bench's CSV row; None when the row does not say."""
    try:
        p, pt, g, gt = (float(row[k]) for k in ("prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps"))
    except (KeyError, ValueError):
        return None
    return int(p), pt, int(g), gt, (p / pt if pt > 0 else 0.0) + (g / gt if gt > 0 else 0.0)


def read_run(stdout: str, stderr: str, variant: str = "") -> RunReading:
    """ds4-bench's CSV row (prefill and generation tok/s, docs/harness.md) as one speed: generated
    tokens over prefill + generation seconds ('run'); the reader's per-source bytes
    (`source[i] bytes=`, summed over reader sessions); the output: the stdout lines that are neither
    the CSV nor a 'ds4:' log line (the generated text; unconfirmed: ds4-bench's own output was not
    read, so a run that prints none is measured without the drift gate's evidence)."""
    text = stdout + "\n" + stderr
    log = read_reader_log(text)
    row = _csv_last_row(text)
    tok_s = prompt = gen = None
    timing = _csv_timing(row)
    if timing is not None:
        prompt, _, gen, _, seconds = timing
        tok_s = gen / seconds if seconds > 0 and gen > 0 else None
    body = [ln for ln in stdout.splitlines() if ln.strip() and not ln.startswith("ds4:")
            and not CSV_HEADER.match(ln) and not (ln[:1].isdigit() and ln.count(",") >= 4)]
    step = None
    if tok_s is not None:       # the CSV's rates are printed to 3 decimals: their step, carried into the speed
        step = tok_s * max(printed_step(row["prefill_tps"]) / float(row["prefill_tps"]) if float(row["prefill_tps"]) else 0.0,
                           printed_step(row["gen_tps"]) / float(row["gen_tps"]) if float(row["gen_tps"]) else 0.0)
    return RunReading("\n".join(body) if body else None, tok_s, "run", prompt, gen, dict(log.source_bytes),
                      lines_matching(text, LOG_SOURCE_BYTES, re.compile(r"lands_last="), CSV_HEADER), step)


def calibration_record(text: str) -> dict:
    """A run's lines as the planner's calibration record (docs/planner.md, "Calibrated by the
    engine's own lines"): ds4-bench's CSV row gives the window's tokens and seconds, the reader's
    per-source lines (`source[i] bytes=`, summed over its sessions: the prompt's staged reads and
    the generated tokens' alike, so the window is the whole run) the expert bytes it read. ds4
    prints no compute time and no loads in flight, so the record has neither: its predictions stay
    reads-only. {} when the run printed no CSV row or no per-source line (the primary read alone:
    `ar_close` prints nothing then)."""
    timing, log = _csv_timing(_csv_last_row(text)), read_reader_log(text)
    read = sum(log.source_bytes.values())
    if timing is None or timing[2] < 1 or read <= 0:
        return {}
    p, pt, g, gt, seconds = timing
    out = {"window": "run", "tokens": g, "prompt_tokens": p, "bytes_read": read,
           "run_s": seconds if gt > 0 else None,
           "lines": {"source_bytes": dict(log.source_bytes), "prefill_tps": pt, "gen_tps": gt,
                     "cache_budget_experts": log.cache_budgets[-1] if log.cache_budgets else None}}
    return {k: v for k, v in out.items() if v is not None}


def frozen_state(variant: str = "") -> tuple[dict[str, str], str]:
    """ds4-argodrive keeps no learned state between runs that its reader's code shows (its cache is
    built per process); nothing to freeze (unconfirmed for the rest of ds4)."""
    return {}, "ds4-argodrive keeps no state between runs that its reader's code shows (unconfirmed for the rest of ds4)"


def links(request: Request) -> tuple[tuple[str, str], ...]:
    """None: the engine is given its sources themselves, not a folder of links."""
    return ()


def default_environment(environment: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
    """ds4-argodrive takes replicas only with a weight each (DS4_ARGODRIVE_REPLICAS=path*weight):
    without a profile it reads the primary alone."""
    return None


# ---------------------------------------------------------------------------------------------
# The stand-in (engine_bridge.standin): ds4-argodrive's interface, the embedded engine's run

# the stand-in's own prompt options (ds4-bench's are not reproduced)
STANDIN_PROMPT, STANDIN_GEN = "--prompt-tokens", "--gen-tokens"


def _split_weights(text: str, n: int) -> tuple[int, ...] | None:
    parts = [x.strip() for x in text.split(",")]
    if len(parts) != n or not all(x.isdigit() and ds4.WEIGHT_MIN <= int(x) <= ds4.WEIGHT_MAX for x in parts):
        return None
    return tuple(int(x) for x in parts)


def standin_call(env: Mapping[str, str], argv: Sequence[str], look) -> StandinCall:
    """ds4-argodrive as its reader reads a call (argodrive_read.h `ar_open`; `look(path)`: {'size',
    'dev', 'ino'} of a file, {} when there is none): the model from -m/--model, the expert cache from
    --ssd-streaming-cache-experts; replicas 'path*weight,...' from DS4_ARGODRIVE_REPLICAS with the
    primary's DS4_ARGODRIVE_PRIMARY_WEIGHT; a configuration it rejects (a relative path, more than
    MAX_SOURCES, a weight outside 1..100, another size or the same inode) closes the reader with
    bytes=0 per source opened and the primary is read alone; a decode list of the wrong count or
    range is ignored with its line. The prompt: the stand-in's --prompt-tokens/--gen-tokens."""
    args = list(argv)
    opts: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        if key in (ds4.ARG_MODEL, ds4.ARG_MODEL_LONG, ds4.ARG_CACHE_EXPERTS, STANDIN_PROMPT, STANDIN_GEN, "--prompt-seed"):
            if not eq:
                if i + 1 >= len(args):
                    return StandinCall(error=f"ds4: {key} needs a value", rc=2)
                val, i = args[i + 1], i + 1
            opts[ds4.ARG_MODEL if key == ds4.ARG_MODEL_LONG else key] = val
        i += 1
    model = opts.get(ds4.ARG_MODEL, "")
    if not model or not look(model):
        return StandinCall(error=f"ds4: cannot open model {model!r}", rc=1)
    try:
        cache = int(opts.get(ds4.ARG_CACHE_EXPERTS, "0"))
        prompt, gen = int(opts.get(STANDIN_PROMPT, "32")), int(opts.get(STANDIN_GEN, "16"))
        seed = int(opts.get("--prompt-seed", "0"))
    except ValueError as e:
        return StandinCall(error=f"ds4: bad number: {e}", rc=2)
    err: list[str] = []
    sources, weights, decode = [model], None, None
    spec = env.get(ds4.ENV_REPLICAS, "")
    if spec:
        reps = [x.rpartition("*") for x in spec.split(",") if x]
        paths = [model] + [p for p, _, _ in reps]
        ws = [env.get(ds4.ENV_PRIMARY_WEIGHT, "1")] + [w for _, _, w in reps]
        ok = (len(paths) <= ds4.MAX_SOURCES and all(p.startswith("/") for p in paths)
              and all(w.strip().isdigit() and ds4.WEIGHT_MIN <= int(w) <= ds4.WEIGHT_MAX for w in ws))
        ids = [look(p) for p in paths]
        ok = ok and all(ids) and len({f["size"] for f in ids}) == 1 and len({(f["dev"], f["ino"]) for f in ids}) == len(ids)
        if not ok:
            err += [f"ds4: Argodrive source[{k}] bytes=0" for k in range(len(paths))]
        else:
            sources, weights = paths, tuple(int(w) for w in ws)
            err.append(f"ds4: experimental Argodrive expert reader sources={len(paths)}; Engram unchanged")
            text = env.get(ds4.ENV_DECODE_WEIGHTS)
            if text is not None:
                decode = _split_weights(text, len(paths))
                err.append(f"ds4: Argodrive decode split {text} (prefill keeps the base weights)" if decode else
                           f"ds4: ignoring {ds4.ENV_DECODE_WEIGHTS}={text} (want {len(paths)} comma-separated weights 1..100)")
    if ds4.ENV_TIMING_SUMMARY in env:
        err.append(f"ds4:   streaming expert cache budget={cache} experts entries={cache}")
    return StandinCall(sources=tuple(sources), weights=weights or (1,) * len(sources), decode_weights=decode,
                       cache_experts=cache, prompt_tokens=prompt, gen_tokens=gen, prompt_seed=seed, stderr=tuple(err))


def standin_lines(call: StandinCall, run: StandinRun) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """(stdout, stderr, exit code): the reader's per-source lines (ar_close) when it read more than
    the primary, the generated ids as the output text, and ds4-bench's CSV row (docs/harness.md)."""
    err = list(call.stderr)
    if len(call.sources) > 1:
        for k, (b, reads, last, gap) in enumerate(run.sources):
            err.append(f"ds4: Argodrive source[{k}] bytes={b}")
            err.append(f"ds4: Argodrive source[{k}] lands_last={last} gap_ns={gap} reads={reads}")
    gen = len(run.output)
    cols = ("ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps")
    row = (len(run.prompt) + gen, len(run.prompt), round(len(run.prompt) / run.prefill_s, 3) if run.prefill_s > 0 else 0.0,
           gen, round(gen / run.decode_s, 3) if run.decode_s > 0 else 0.0)
    out = [" ".join(map(str, run.output)), ",".join(cols), ",".join(map(str, row))]
    return tuple(out), tuple(err), 0
