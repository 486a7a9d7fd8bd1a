"""Launching a real ds4 / ds4-bench binary with an exported profile, and proving from its log
that what was requested was applied (DESIGN §6, §8): a requested setting is not proof.

The first half of this module is pure (text in, verdicts out) so every branch is tested on
captured text; `launch_arm` is the I/O half: a clean environment (inherited DS4_* cleared) plus
the profile, stdout/stderr/CSV captured to a run folder, and a `LaunchResult`.

Launch record (schema 1), written to RUN_DIR/launch.json and printed by `launch --json`:

    {"schema": 1, "kind": "launch", "ok": true, "failed": [], "profile": "...", ...,
     "confirmations": [{"name": "sources", "ok": true, "expected": "3", "observed": "3", "detail": "..."}, ...],
     "dead_knobs": [], "metrics": {...last CSV row...}, "csv_rows": [...], ...}
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Sequence

from core.errors import MissingError, UsageError
from core.fsutil import atomic_write_text
from engine_bridge.profiles import profile as pf

LAUNCH_SCHEMA = 1
# The engine prints its cache budget in the cache report only when asked; the launcher asks,
# because "the requested cache was honoured" is a gate (DESIGN §8).
REPORT_ENV = {"DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY": "1"}
CSV_HEADER_START = "ctx_tokens,"
CHECKS = ("exit", "sources", "decode-split", "source-bytes", "cache-budget", "prefill-staging")

_SOURCES = re.compile(r"expert reader sources=(\d+)")
_DECODE = re.compile(r"decode split (\S+)")
_DECODE_IGNORED = re.compile(r"ignoring DS4_ARGODRIVE_DECODE_WEIGHTS=(\S*)")
_BYTES = re.compile(r"source\[(\d+)\] bytes=(\d+)")
_BUDGET = re.compile(r"streaming expert cache budget=(\d+) experts")
_DECODE_CACHE = re.compile(r"decode cache requested=(\d+) effective=(\d+)")
_CACHE_CAPPED = re.compile(r"(using locked cache cap:.*|runtime cache cap now .*)")
_REJECTED = re.compile(r"prefill stage rejected: (.*)")


# ---------------------------------------------------------------------------------------------
# Pure: what to expect, what the log says

@dataclass(frozen=True)
class Expectation:
    sources: int                 # 1 = primary only
    decode_split: str = ""       # e.g. "10,6,6"; "" when there is no split
    cache_experts: int | None = None
    prefill_split: bool = False  # DS4_ARGODRIVE_PREFILL_SPLIT requested


def expectation_of(p: pf.Profile) -> Expectation:
    env = p.env
    return Expectation(sources=p.sources, decode_split=env.get(pf.K_DECODE_WEIGHTS, ""),
                       cache_experts=p.cache_experts, prefill_split="DS4_ARGODRIVE_PREFILL_SPLIT" in env)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    expected: str
    observed: str
    detail: str


def _last(rx: re.Pattern, text: str):
    found = rx.findall(text)
    return found[-1] if found else None


def confirm(text: str, expect: Expectation, returncode: int | None = 0) -> tuple[Check, ...]:
    """Judge an engine's log (stdout + stderr) against what the profile asked for.

    returncode None means the engine was stopped (timeout); negative, killed by that signal.
    """
    checks = []

    if returncode == 0:
        checks.append(Check("exit", True, "0", "0", "engine exited cleanly"))
    else:
        seen = "timeout" if returncode is None else str(returncode)
        why = ("engine was stopped after the timeout" if returncode is None
               else f"engine was killed by signal {-returncode}" if returncode < 0
               else f"engine exited with code {returncode}")
        checks.append(Check("exit", False, "0", seen, why))

    n = expect.sources
    got = _last(_SOURCES, text)
    if got is None:
        if n > 1:
            checks.append(Check("sources", False, str(n), "none",
                                "no 'expert reader sources=' line: the engine did not open the split reader"))
        else:
            checks.append(Check("sources", True, "1", "none", "single source: the engine reads the primary alone"))
    else:
        ok = int(got) == n
        checks.append(Check("sources", ok, str(n), got,
                            f"engine opened {got} source(s)" + ("" if ok else f", {n} requested")))

    if expect.decode_split:
        ignored = _last(_DECODE_IGNORED, text)
        split = _last(_DECODE, text)
        if ignored is not None:
            checks.append(Check("decode-split", False, expect.decode_split, f"ignored {ignored}",
                                f"engine ignored DS4_ARGODRIVE_DECODE_WEIGHTS={ignored} (wrong count or range)"))
        elif split is None:
            checks.append(Check("decode-split", False, expect.decode_split, "none",
                                "no 'decode split' line: decode would use the base weights"))
        else:
            ok = split == expect.decode_split
            checks.append(Check("decode-split", ok, expect.decode_split, split,
                                "engine applied the decode split" if ok else f"engine applied decode split {split}"))
    else:
        checks.append(Check("decode-split", True, "", "", "no decode split requested (single source)"))

    per: dict[int, int] = {}
    for i, b in _BYTES.findall(text):
        per[int(i)] = per.get(int(i), 0) + int(b)   # summed over reader sessions
    want = range(n) if (n > 1 or per) else range(0)
    problems = [f"source[{i}] reported no bytes" for i in want if i not in per]
    problems += [f"source[{i}] read 0 bytes" for i in want if per.get(i) == 0]
    problems += [f"source[{i}] was not requested" for i in sorted(per) if i >= n]
    observed = ",".join(f"{i}:{per[i]}" for i in sorted(per)) or "none"
    if not want:
        checks.append(Check("source-bytes", True, "", observed, "single source: no per-source report expected"))
    else:
        checks.append(Check("source-bytes", not problems, f"{n} sources > 0", observed,
                            "; ".join(problems) if problems else "every source delivered bytes"))

    if expect.cache_experts is not None:
        req = expect.cache_experts
        budgets = [int(x) for x in _BUDGET.findall(text)]
        capped = _CACHE_CAPPED.findall(text)
        decode_cut = [(int(a), int(b)) for a, b in _DECODE_CACHE.findall(text) if int(b) < int(a)]
        observed = ",".join(map(str, budgets)) or "none"
        if not budgets:
            checks.append(Check("cache-budget", False, str(req), "none",
                                "no 'streaming expert cache budget=' line: the cache size is unconfirmed"))
        elif min(budgets) < req:
            checks.append(Check("cache-budget", False, str(req), observed,
                                f"engine reduced the expert cache to {min(budgets)} of {req} experts"))
        elif capped:
            checks.append(Check("cache-budget", False, str(req), observed, f"engine capped the cache: {capped[-1].strip()}"))
        elif decode_cut:
            a, b = decode_cut[-1]
            checks.append(Check("cache-budget", False, str(req), observed,
                                f"engine reduced the decode cache to {b} of {a} experts"))
        else:
            checks.append(Check("cache-budget", True, str(req), observed, "requested cache honoured"))

    rejected = _last(_REJECTED, text)
    if expect.prefill_split and rejected is not None:
        checks.append(Check("prefill-staging", False, "staged", "rejected",
                            f"prefill staging rejected ({rejected.strip()}); the engine fell back to the layer sweep"))
    else:
        checks.append(Check("prefill-staging", True, "staged" if expect.prefill_split else "",
                            "rejected" if rejected is not None else "", "no rejection reported"))
    return tuple(checks)


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


def launch_environment(inherited: Mapping[str, str], p: pf.Profile) -> dict[str, str]:
    """The inherited environment without any DS4_* variable or managed key, plus the profile."""
    env = {k: v for k, v in inherited.items() if not k.startswith("DS4_") and k not in p.unset}
    env.update(p.environment)
    for k, v in REPORT_ENV.items():
        env.setdefault(k, v)
    return env


def engine_argv(binary: str, p: pf.Profile, args: Sequence[str]) -> list[str]:
    owned = {"-m", "--model", "--ssd-streaming-cache-experts"}
    clash = [a for a in args if a.split("=", 1)[0] in owned]
    if clash:
        raise UsageError(f"engine argument {clash[0]!r} is already given by the profile ({' '.join(p.argv)}); "
                         "remove it after --, or export another profile")
    return [binary, *p.argv, *args]


# ---------------------------------------------------------------------------------------------
# I/O: run the engine

@dataclass(frozen=True)
class LaunchResult:
    ok: bool
    failed: tuple[str, ...]                 # names of the confirmations that failed
    confirmations: tuple[Check, ...]
    profile: str                            # profile id
    profile_file: str
    binary: str
    argv: tuple[str, ...]
    environment: dict                       # what the launcher set on top of the clean environment
    dead_knobs: tuple[str, ...]
    returncode: int | None
    run_dir: str
    stdout_path: str
    stderr_path: str
    csv_path: str                           # '' when no CSV was produced
    csv_rows: tuple[dict, ...] = ()
    started: str = ""
    seconds: float = 0.0
    schema: int = LAUNCH_SCHEMA

    @property
    def metrics(self) -> dict:
        """The last CSV row (ds4-bench writes one per context frontier)."""
        return dict(self.csv_rows[-1]) if self.csv_rows else {}

    @property
    def cache_experts_applied(self) -> int | None:
        """The smallest cache budget the engine reported (experts), None if it reported none."""
        for c in self.confirmations:
            if c.name == "cache-budget" and c.observed not in ("", "none"):
                return min(int(x) for x in c.observed.split(","))
        return None

    def arm_result(self) -> dict:
        """One arm's row for the harness: the ds4-bench CSV columns of the last row, the cache
        requested and applied, and the launcher's verdict."""
        requested = next((int(c.expected) for c in self.confirmations if c.name == "cache-budget"), None)
        return {**self.metrics, "cache_experts": requested, "cache_experts_applied": self.cache_experts_applied,
                "confirmed": self.ok, "failed": list(self.failed), "run_dir": self.run_dir}


def launch_to_dict(r: LaunchResult) -> dict:
    return {
        "schema": r.schema,
        "kind": "launch",
        "ok": r.ok,
        "failed": list(r.failed),
        "profile": r.profile,
        "profile_file": r.profile_file,
        "binary": r.binary,
        "argv": list(r.argv),
        "environment": r.environment,
        "dead_knobs": list(r.dead_knobs),
        "returncode": r.returncode,
        "confirmations": [{"name": c.name, "ok": c.ok, "expected": c.expected, "observed": c.observed,
                           "detail": c.detail} for c in r.confirmations],
        "metrics": r.metrics,
        "csv_rows": [dict(x) for x in r.csv_rows],
        "run_dir": r.run_dir,
        "stdout": r.stdout_path,
        "stderr": r.stderr_path,
        "csv": r.csv_path,
        "started": r.started,
        "seconds": r.seconds,
    }


def read_binary(binary: str) -> bytes:
    if not os.path.exists(binary):
        raise MissingError(f"{binary}: no such engine binary; build ds4 / ds4-bench and give its path with --binary")
    if not os.path.isfile(binary):
        raise UsageError(f"{binary}: not a file; give the ds4 or ds4-bench executable with --binary")
    if not os.access(binary, os.X_OK):
        raise UsageError(f"{binary}: not executable (chmod +x)")
    with open(binary, "rb") as f:
        return f.read()


def _csv_arg(args: Sequence[str]) -> str:
    for i, a in enumerate(args):
        if a == "--csv" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--csv="):
            return a.split("=", 1)[1]
    return ""


def default_run_dir(rig_root: str, profile_id: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return os.path.join(rig_root, "runs", f"launch-{profile_id}-{stamp}")


def launch_arm(binary: str, profile_path: str, args: Sequence[str] = (), *, run_dir: str | None = None,
               rig_root: str | None = None, timeout: float | None = None,
               inherited: Mapping[str, str] | None = None) -> LaunchResult:
    """Run one arm on the real engine: clean environment + profile, capture, confirm.

    The hook for the harness: the returned result carries `ok`, the failed confirmation names
    and the ds4-bench CSV rows (`metrics` is the last row). Never raises for a failed
    confirmation; raises for a missing binary or profile, or a bad argument.
    """
    from .export import load_profile

    p = load_profile(profile_path)
    if p.engine != "ds4-argodrive":
        raise UsageError(f"{profile_path}: a {p.engine} profile; launch confirms ds4-argodrive log lines only")
    binary = which(binary)
    blob = read_binary(binary)
    argv = engine_argv(os.path.abspath(binary), p, list(args))
    env = launch_environment(os.environ if inherited is None else inherited, p)
    added = {k: env[k] for k in list(p.env) + list(REPORT_ENV)}
    dead = tuple(dead_knobs(blob, list(added)))

    run_dir = os.path.abspath(run_dir or default_run_dir(rig_root or os.getcwd(), p.id))
    os.makedirs(run_dir, exist_ok=True)
    out_path, err_path = os.path.join(run_dir, "stdout.txt"), os.path.join(run_dir, "stderr.txt")
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        proc = subprocess.Popen(argv, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=run_dir)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = None
        except BaseException:
            _stop(proc)
            raise
    seconds = time.monotonic() - t0
    with open(out_path, encoding="utf-8", errors="replace") as f:
        stdout = f.read()
    with open(err_path, encoding="utf-8", errors="replace") as f:
        stderr = f.read()

    csv_src = _csv_arg(args)
    csv_path, rows = "", ()
    if csv_src:
        src = csv_src if os.path.isabs(csv_src) else os.path.join(run_dir, csv_src)
        if os.path.isfile(src):
            with open(src, encoding="utf-8", errors="replace") as f:
                rows = parse_bench_csv(f.read())
            csv_path = src
    else:
        block = csv_block(stdout)
        if block:
            rows = parse_bench_csv(stdout)
            csv_path = os.path.join(run_dir, "engine.csv")
            atomic_write_text(csv_path, "\n".join(block) + "\n")

    checks = confirm(stdout + "\n" + stderr, expectation_of(p), rc)
    failed = tuple(c.name for c in checks if not c.ok)
    result = LaunchResult(ok=not failed, failed=failed, confirmations=checks, profile=p.id,
                          profile_file=os.path.abspath(profile_path), binary=os.path.abspath(binary),
                          argv=tuple(argv), environment=added, dead_knobs=dead, returncode=rc, run_dir=run_dir,
                          stdout_path=out_path, stderr_path=err_path, csv_path=csv_path, csv_rows=rows,
                          started=started, seconds=round(seconds, 3))
    atomic_write_text(os.path.join(run_dir, "launch.json"), json.dumps(launch_to_dict(result), indent=2) + "\n")
    return result


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def which(binary: str) -> str:
    """A bare name is looked up on PATH, like a shell would."""
    if os.sep in binary:
        return binary
    return shutil.which(binary) or binary


def preflight(binary: str, profile_path: str) -> tuple[pf.Profile, list[str]]:
    """Before launching: the profile, and the variables it would set that the binary never names."""
    from .export import load_profile

    p = load_profile(profile_path)
    blob = read_binary(which(binary))
    return p, dead_knobs(blob, list(p.env) + [k for k in REPORT_ENV if k not in p.env])
