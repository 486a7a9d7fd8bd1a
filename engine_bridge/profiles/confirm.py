"""The launcher's pure half (DESIGN §6, §8): what an engine run is started with, and whether a
ds4-argodrive log proves that what the profile asked for was applied — a requested setting is
not proof. Text in, verdicts out; `engine_bridge.profiles.launch` starts the process and
captures the text; colibri's log is judged in `engine_bridge.profiles.confirm_colibri`.

The engine's log lines are read by `engines.ds4_argodrive.read_log`; this module judges them
against an `Expectation` and parses the ds4-bench CSV the run printed or wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from core.errors import UsageError
from engines import colibri
from engines import ds4_argodrive as ds4

from .profile import Profile

# The engine prints its cache budget in the cache report only when asked; the launcher asks,
# because "the requested cache was honoured" is a gate (DESIGN §8).
REPORT_ENV = {ds4.ENV_TIMING_SUMMARY: "1"}
# colibri prints its MIRROR: statistics (bytes and reads per drive) at the end of a run; its
# docs ask PROF=1 for them (docs/multidisk.md), so the launcher asks.
COLIBRI_REPORT_ENV = {colibri.ENV_PROF: "1"}
CSV_HEADER_START = "ctx_tokens,"     # ds4-bench's CSV header begins so (DESIGN §8 lists its columns)
CHECKS = ("exit", "sources", "decode-split", "source-bytes", "cache-budget", "prefill-staging")


# ---------------------------------------------------------------------------------------------
# What to start the engine with

def report_env(p: Profile) -> dict[str, str]:
    """What the launcher adds so the engine prints what it applied."""
    return dict(COLIBRI_REPORT_ENV if p.engine == colibri.NAME else REPORT_ENV)


def launch_environment(inherited: Mapping[str, str], p: Profile) -> dict[str, str]:
    """The inherited environment without the profile's managed keys (and, for ds4, without any
    DS4_* variable), plus the profile and the report switches."""
    prefix = ds4.ENV_PREFIX if p.engine == ds4.NAME else None
    env = {k: v for k, v in inherited.items()
           if not (prefix and k.startswith(prefix)) and k not in p.unset}
    env.update(p.environment)
    for k, v in report_env(p).items():
        env.setdefault(k, v)
    return env


def engine_argv(binary: str, p: Profile, args: Sequence[str]) -> list[str]:
    """The binary, the profile's arguments, then the caller's; refuses an argument the profile
    already gives (for colibri: --model, which COLI_MODEL already is)."""
    given = {colibri.ARG_MODEL} if p.engine == colibri.NAME else ds4.PROFILE_ARGS
    clash = [a for a in args if a.split("=", 1)[0] in given]
    if clash:
        by = " ".join(p.argv) if p.argv else f"{colibri.ENV_MODEL}={p.primary}"
        raise UsageError(f"engine argument {clash[0]!r} is already given by the profile ({by}); "
                         "remove it after --, or export another profile")
    return [binary, *p.argv, *args]


def dead_knobs(blob: bytes, names: Sequence[str]) -> list[str]:
    """Variables whose names appear nowhere in the binary: the engine cannot read them.

    A name counts only as a whole word, so DS4_ARGODRIVE_PREFILL is not found inside
    DS4_ARGODRIVE_PREFILL_LANES.
    """
    dead = []
    for n in names:
        if not re.search(rb"(?<![A-Za-z0-9_])" + re.escape(n.encode()) + rb"(?![A-Za-z0-9_])", blob):
            dead.append(n)
    return dead


# ---------------------------------------------------------------------------------------------
# What the log says

@dataclass(frozen=True)
class Expectation:
    sources: int                 # 1 = primary only
    decode_split: str = ""       # e.g. "10,6,6"; "" when there is no split
    cache_experts: int | None = None
    prefill_split: bool = False  # DS4_ARGODRIVE_PREFILL_SPLIT requested


def expectation_of(p: Profile) -> Expectation:
    env = p.env
    return Expectation(sources=p.sources, decode_split=ds4.weights_text(env.get(ds4.ENV_DECODE_WEIGHTS, "")),
                       cache_experts=p.cache_experts, prefill_split=ds4.ENV_PREFILL_SPLIT in env)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    expected: str
    observed: str
    detail: str


def exit_check(returncode: int | None) -> Check:
    if returncode == 0:
        return Check("exit", True, "0", "0", "engine exited cleanly")
    seen = "timeout" if returncode is None else str(returncode)
    why = ("engine was stopped after the timeout" if returncode is None
           else f"engine was killed by signal {-returncode}" if returncode < 0
           else f"engine exited with code {returncode}")
    return Check("exit", False, "0", seen, why)


REJECTED = ("the engine rejected the replica configuration: every source it had opened reported bytes=0 and "
            "it never opened the split reader (a relative or unreadable path, more than 3 sources, a weight "
            "outside 1..100, or a replica of another size or the same inode)")


def _sources(log: ds4.LogReport, n: int) -> Check:
    if log.sources is None:
        if n > 1 and log.rejected:
            return Check("sources", False, str(n), "rejected", REJECTED)
        if n > 1:
            return Check("sources", False, str(n), "none",
                         "no 'expert reader sources=' line: the engine did not open the split reader")
        return Check("sources", True, "1", "none", "single source: the engine reads the primary alone")
    ok = log.sources == n
    return Check("sources", ok, str(n), str(log.sources),
                 f"engine opened {log.sources} source(s)" + ("" if ok else f", {n} requested"))


def _decode_split(log: ds4.LogReport, want: str) -> Check:
    if not want:
        return Check("decode-split", True, "", "", "no decode split requested (single source)")
    if log.decode_ignored is not None:
        return Check("decode-split", False, want, f"ignored {log.decode_ignored}",
                     f"engine ignored {ds4.ENV_DECODE_WEIGHTS}={log.decode_ignored} (wrong count or range)")
    if log.decode_split is None:
        return Check("decode-split", False, want, "none", "no 'decode split' line: decode would use the base weights")
    ok = log.decode_split == ds4.weights_text(want)
    return Check("decode-split", ok, want, log.decode_split,
                 "engine applied the decode split" if ok else f"engine applied decode split {log.decode_split}")


def _source_bytes(log: ds4.LogReport, n: int) -> Check:
    per = log.source_bytes
    # bytes=0 lines appear even when the reader rejected its configuration (the split is off),
    # so every source must show bytes > 0, not just a line. A single source prints none unless
    # the reader ran; when it did, its lines are held to the same.
    want = range(n) if (n > 1 or per) else range(0)
    observed = ",".join(f"{i}:{per[i]}" for i in sorted(per)) or "none"
    if n > 1 and log.rejected:
        return Check("source-bytes", False, f"{n} sources > 0", observed, REJECTED)
    problems = [f"source[{i}] reported no bytes" for i in want if i not in per]
    problems += [f"source[{i}] read 0 bytes" for i in want if per.get(i) == 0]
    problems += [f"source[{i}] was not requested" for i in sorted(per) if i >= n]
    if not want:
        return Check("source-bytes", True, "", observed, "single source: no per-source report expected")
    return Check("source-bytes", not problems, f"{n} sources > 0", observed,
                 "; ".join(problems) if problems else "every source delivered bytes")


def _cache_budget(log: ds4.LogReport, req: int) -> Check:
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


def _prefill_staging(log: ds4.LogReport, requested: bool) -> Check:
    rejected = log.prefill_rejected
    if requested and rejected is not None:
        return Check("prefill-staging", False, "staged", "rejected",
                     f"prefill staging rejected ({rejected.strip()}); the engine fell back to the layer sweep")
    return Check("prefill-staging", True, "staged" if requested else "",
                 "rejected" if rejected is not None else "", "no rejection reported")


def confirm(text: str, expect: Expectation, returncode: int | None = 0) -> tuple[Check, ...]:
    """Judge an engine's log (stdout + stderr) against what the profile asked for, one Check
    per name in CHECKS ('cache-budget' only when a cache size was asked for).

    returncode None means the engine was stopped (timeout); negative, killed by that signal.
    """
    log = ds4.read_log(text)
    checks = [exit_check(returncode), _sources(log, expect.sources), _decode_split(log, expect.decode_split),
              _source_bytes(log, expect.sources)]
    if expect.cache_experts is not None:
        checks.append(_cache_budget(log, expect.cache_experts))
    checks.append(_prefill_staging(log, expect.prefill_split))
    return tuple(checks)


# ---------------------------------------------------------------------------------------------
# The ds4-bench CSV

def _number(s: str):
    try:
        return int(s)
    except ValueError:
        try:
            return float(s)
        except ValueError:
            return s


def csv_block(text: str) -> list[str]:
    """The ds4-bench CSV lines (header `ctx_tokens,prefill_tokens,...` and its rows) found
    anywhere in the text, verbatim; [] when there is none."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(CSV_HEADER_START):
            width = len(line.strip().split(","))
            block = [line.strip()]
            for row in lines[i + 1:]:
                parts = row.strip().split(",")
                if len(parts) != width or not parts[0].strip().isdigit():
                    break
                block.append(row.strip())
            return block
    return []


def parse_bench_csv(text: str) -> tuple[dict, ...]:
    """The ds4-bench CSV rows as dicts (numbers parsed), wherever the CSV is in the text."""
    block = csv_block(text)
    if not block:
        return ()
    cols = block[0].split(",")
    return tuple({c: _number(v) for c, v in zip(cols, row.split(","))} for row in block[1:])
