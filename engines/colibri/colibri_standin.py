"""The stand-in (engine_bridge.standin) as colibri: how the engine binary reads its call, and the
lines it prints after the embedded engine ran it (pure)."""

from __future__ import annotations

import posixpath
import re
from typing import Mapping, Sequence

from core.errors import UsageError

from ..handoff import StandinCall, StandinRun
from . import constants as c
from .colibri_log import split_shares
from .family import FamilyMember, member_for, member_of
from .mirror_env import mirror_list, parse_weights

DEFAULT_CACHE_PER_LAYER = 8      # argv[1] absent (c/deepseek_v41.c main: `cap = argc > 1 ? ... : 8`)


def _atoi(text: str | None) -> int:
    m = re.match(r"\s*([+-]?\d+)", text or "")
    return int(m.group(1)) if m else 0


def standin_call(env: Mapping[str, str], argv: Sequence[str], look) -> StandinCall:
    """colibri's engine binary as it reads its call (`look(path)`: {'model_type', 'layers', 'shards':
    {name: (bytes, header)}} for a directory, {} when there is none): SNAP (or COLI_MODEL) the model
    directory, argv[1] the expert cache per layer; the member by config.json model_type; mirrors
    from COLI_MODEL_MIRROR (or SNAP_MIRROR), each admitted with the shards whose size and header equal
    the primary's (st_mirror_add), at most MAX_MIRRORS; COLI_DISK_WEIGHTS as the member parses it
    (rejected or absent: it probes); DIRECT=1 and COLI_MIR_STRIPE (unset: on) where the member stripes.
    Oracle mode: the GLM engine's REF=<json> (prompt_ids, full_ids), DeepSeek V4.1's argv[2]
    (prompt_ids, output_ids); without one the stand-in refuses, as neither runs a prompt it was not given here."""
    snap = env.get(c.ENV_SNAP) or env.get(c.ENV_MODEL) or ""
    if not snap:
        return StandinCall(error="SNAP=<container dir> is required", rc=2)
    facts = look(snap)
    if not facts:
        return StandinCall(error=f"[cfg] {snap}/config.json: No such file or directory", rc=1)
    try:
        m = member_for(facts.get("model_type"))
    except UsageError as e:
        return StandinCall(error=str(e), rc=1)
    cap = _atoi(argv[0]) if argv else DEFAULT_CACHE_PER_LAYER
    if m.name == "glm":
        ref, keys = env.get("REF", ""), ("prompt_ids", "", "full_ids")
    elif m.name == "deepseek_v41":
        ref, keys = (argv[1] if len(argv) > 1 else ""), ("prompt_ids", "output_ids", "")
    else:
        return StandinCall(error=f"the stand-in speaks colibri's glm and deepseek_v41 engines, not {m.name} ({m.source})",
                           rc=2)
    if not ref:
        return StandinCall(error=("REF=<json> (prompt_ids, full_ids) is required: the stand-in runs colibri's oracle mode"
                                  if m.name == "glm" else f"usage: SNAP=<dir> {m.name} <cap> <ref.json>"), rc=2)
    primary = dict(facts.get("shards") or {})
    err, loaded = [], []
    for d in mirror_list(env.get(c.ENV_MIRROR), env.get(c.ENV_LEGACY_MIRROR)):
        if len(loaded) >= c.MAX_MIRRORS:
            err.append(f"[MIRROR] {d}: too many mirrors (max {c.MAX_MIRRORS}) \u2014 ignored")
            continue
        if posixpath.normpath(d) == posixpath.normpath(snap):
            err.append(f"[MIRROR] {d} equals the model dir \u2014 ignored")
            continue
        theirs = dict((look(d) or {}).get("shards") or {})
        same = [n for n, f in primary.items() if theirs.get(n) == f]
        for n in primary:
            if n in theirs and theirs[n] != primary[n]:
                what = "size" if theirs[n][0] != primary[n][0] else "header"
                err.append(f"[MIRROR] {d}/{n}: {what} differs from the primary copy \u2014 skipped")
        if not same:
            err.append(f"[MIRROR] {d}: no usable shard (missing or divergent copy) \u2014 ignored")
            continue
        loaded.append(d)
        err.append(f"[MIRROR] {d}: {len(same)}/{len(primary)} shards (replica {len(loaded)})")
    n = 1 + len(loaded)
    text = env.get(c.ENV_WEIGHTS)
    weights = None
    if n > 1 and text:
        parsed = parse_weights(m, text, n)
        if parsed is None:
            err.append(f"[MIRROR] invalid COLI_DISK_WEIGHTS '{text}' (want {n} positive weights, e.g. 9,3) \u2014 probing "
                       "instead")
        elif all(float(w).is_integer() for w in parsed):
            weights = tuple(int(w) for w in parsed)
        else:       # the reader takes integer weights: the smallest integers with the same cuts out of 256
            weights = _integer_weights(m, parsed)
    direct = _atoi(env.get(c.ENV_DIRECT)) == 1
    stripe = direct and m.stripes and _atoi(env.get(c.ENV_STRIPE, "1")) != 0 and n > 1
    layers = int(facts.get("layers") or 0)
    on = frozenset(((c.DIRECT,) if direct else ()) + ((c.STRIPE,) if stripe else ()))
    return StandinCall(sources=(snap, *loaded), weights=weights if n > 1 else (1,), switches=on,
                       cache_experts=cap * layers, cache_per_layer=cap,
                       reference=ref, prompt_key=keys[0], expected_key=keys[1], full_key=keys[2], stderr=tuple(err),
                       variant=m.name, report=_atoi(env.get(c.ENV_PROF)) == 1 or m.name == "deepseek_v41",
                       how=c.HOW_WEIGHTS)


def _integer_weights(m: FamilyMember, weights: Sequence[float]) -> tuple[int, ...]:
    """Integers whose cuts equal the float weights' (scaled by 1000, rounded; the cuts are out of 256)."""
    want = m.cuts(weights)
    for scale in (1, 10, 100, 1000, 10000):
        top = max(weights)
        w = tuple(max(1, round(x / top * scale)) for x in weights)
        if m.cuts(w) == want:
            return w
    return tuple(max(1, round(x / max(weights) * 10000)) for x in weights)


def standin_lines(call: StandinCall, run: StandinRun) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """(stdout lines, stderr lines, exit code) as the member prints them after its setup lines
    (`_GLM_*`, `_V41_*` above; the MIRROR: line of `colibri_log.read_stats`)."""
    m = member_of(call.variant)
    n = len(call.sources)
    out, err = [], list(call.stderr)
    mb = [b for b, *_ in run.sources]
    total = sum(mb)
    stats = (f"MIRROR: primary {mb[0] / 1e9:.2f} GB ({run.sources[0][1]} reads)"
             + "".join(f" | mirror{r} {mb[r] / 1e9:.2f} GB ({run.sources[r][1]} reads)" for r in range(1, n))
             + f" \u2014 {100.0 * (total - mb[0]) / total if total else 0.0:.0f}% of expert bytes from the mirrors")
    matched = sum(1 for a, b in zip(run.output, run.expected or ()) if a == b)
    seconds = run.prefill_s + run.decode_s
    if m.name == "glm":
        if n > 1:
            shares = " / ".join(f"{p}%" for p in split_shares("glm", run.weights))
            err.append(f"[MIRROR] {n} drives | read split {shares} ({run.how})")
        err.append(f"[prefill] layer {run.layers}/{run.layers} \u00b7 {len(run.prompt)} token \u00b7 +{run.prefill_s:.2f}s")
        out += [f"== GLM C engine ({run.model_type}), cache={call.cache_per_layer} experts/layer | replica-tuner stand-in: "
                "the embedded engine ==", "",
                "Reference (oracle): " + "".join(f"{x} " for x in (run.expected or ())),
                "GLM C engine      : " + "".join(f"{x} " for x in run.output),
                f"Matching tokens: {matched}/{len(run.output)}",
                f"Expert cache hit rate: {100.0 * run.hits / max(run.hits + run.misses, 1):.1f}% (0 pin + {run.hits} lru / "
                f"{run.misses} miss) | RSS: 0.00 GB | {len(run.output) / seconds if seconds > 0 else 0.0:.1f} tok/s"]
        if n > 1 and call.report:
            out.append(stats)
        return tuple(out), tuple(err), 0
    if n > 1:
        shares = " ".join(f"{'primary' if i == 0 else 'mirror'} {p}%" for i, p in enumerate(split_shares(m.name, run.weights)))
        err.append(f"[MIRROR] {n} replicas, split {run.how}: {shares}")
    err.append(f"[v41] {run.layers} layers, {run.experts} experts/layer — replica-tuner stand-in: the embedded engine")
    out.append(" ".join(map(str, run.output)))
    for i, (a, b) in enumerate(zip(run.output, run.expected or ())):
        if a != b:
            err.append(f"[mismatch] step {i}: got {a}, reference {b}")
    err.append(f"Matching tokens: {matched}/{len(run.expected or ())}")
    err.append(f"[v41] prefill {len(run.prompt)} tokens in {run.prefill_s:.2f}s | decode {len(run.output)} in "
               f"{run.decode_s:.2f}s ({len(run.output) / (run.decode_s if run.decode_s > 0 else 1):.2f} tok/s)")
    if n > 1:
        err.append(stats)
    ok = run.expected is not None and matched == len(run.expected) == len(run.output)
    return tuple(out), tuple(err), 0 if ok else 1
