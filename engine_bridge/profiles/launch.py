"""Launching a real engine (ds4 / ds4-bench, or colibri: its `coli` launcher or engine binary)
with an exported profile, and proving from its log that what was requested was applied
(docs/engine-profiles.md): a requested setting is not proof.

This is the I/O half: `launch_arm` starts the engine in a clean environment (the profile's
managed keys cleared, and whatever the engine's profile clears by prefix: ds4's inherited DS4_*)
plus the profile, captures stdout/stderr/CSV to a run folder and returns a `LaunchResult`. The
judgement of the captured text is pure and the engine's own (`Engine.profile.judge`, in
`engines/`), reached through `engine_bridge.profiles.confirm`; every branch is tested on
captured text in tests/engines.

Launch record (schema 1), written to RUN_DIR/launch.json and printed by `launch --json`:

    {"schema": 1, "kind": "launch", "ok": true, "failed": [], "profile": "...", ...,
     "confirmations": [{"name": "sources", "ok": true, "expected": "3", "observed": "3", "detail": "..."}, ...],
     "dead_knobs": [], "metrics": {...last CSV row...}, "csv_rows": [...], ...}
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import ClassVar, Mapping, Sequence

from core.constants import PROFILES_DIR, RIG_FILE, RUNS_DIR
from core.errors import MissingError, UsageError
from core.fsutil import atomic_write_text, require_file
from core.platform import is_linux, maxrss_bytes
from core.jsonfile import write_json
from core.tiers import is_memory
from engines.registry import ENGINES

from .confirm import (
    Check,
    confirm,
    csv_block,
    dead_knobs,
    engine_argv,
    last_words,
    launch_environment,
    parse_bench_csv,
    report_env,
)
from .profile import Profile

LAUNCH_SCHEMA = 1


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
    tok_s: float | None = None              # the engine's own speed line, as its profile reads it
    calibration: dict = field(default_factory=dict)   # what its lines say it did (Engine.calibrate; {} none)
    calibration_plan: str = ""              # the plan the calibration was recorded in ('' none)
    engine_said: str = ""                   # the engine's last stderr line when it did not exit 0 (why, in its words)
    cwd: str = ""                           # where the engine ran: the caller's directory
    schema: int = LAUNCH_SCHEMA

    KIND: ClassVar[str] = "launch"          # a result (core.results): `launch --json`, launch.json's shape
    SCHEMA: ClassVar[int] = LAUNCH_SCHEMA

    def to_dict(self) -> dict:
        return launch_to_dict(self)

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

def launch_to_dict(r: LaunchResult) -> dict:
    return {
        "schema": r.schema,
        "kind": LaunchResult.KIND,
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
        "tok_s": r.tok_s,
        "calibration": dict(r.calibration),
        "calibration_plan": r.calibration_plan,
        "engine_said": r.engine_said,
        "cwd": r.cwd,
    }


def resolve_profile(ref: str, rig_root: str) -> str:
    """What users type after --profile, the way plans and bench results are found: a file; 'latest'
    (the profile export wrote last into rig/profiles, its N-1 profiles aside); or a profile's name
    there (NAME, NAME.json or NAME.env). MissingError (exit 3) when nothing matches."""
    if (os.path.lexists(ref) or os.sep in ref) and ref != "latest":
        return ref                      # a path: its loader names what is wrong with it
    d = os.path.join(rig_root, PROFILES_DIR)
    if ref == "latest":
        try:
            names = [n for n in os.listdir(d) if n.endswith(".json") and ".without-" not in n and not n.startswith(".")]
        except OSError:
            names = []
        if not names:
            raise MissingError(f"no exported profiles in {d}: run `engine-bridge export --rig {rig_root}` first")
        return max((os.path.join(d, n) for n in names), key=lambda x: (os.path.getmtime(x), x))
    for cand in (os.path.join(d, ref), os.path.join(d, ref + ".json"), os.path.join(d, ref + ".env")):
        if os.path.isfile(cand):
            return cand
    raise MissingError(f"--profile {ref}: no such profile file, nor one of that name in {d}; give a file, its name "
                       "there, or 'latest'")


def profile_rig(profile: str) -> str | None:
    """The rig a profile file was exported into (the folder holding rig.toml above its
    `profiles/` folder), or None: a launch of it without --rig runs and records its calibration
    there, not in the default rig."""
    d = os.path.dirname(os.path.abspath(profile))
    if os.path.basename(d) != PROFILES_DIR:
        return None
    root = os.path.dirname(d)
    return root if os.path.isfile(os.path.join(root, RIG_FILE)) else None


def read_binary(binary: str) -> bytes:
    require_file(binary, "engine binary", "build ds4 / ds4-bench (or colibri) and give its path with --binary",
                 executable=True)
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
    return os.path.join(rig_root, RUNS_DIR, f"launch-{profile_id}-{stamp}")


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
    gone = fallback_for(p, profile_path)
    if gone:
        raise MissingError(f"{profile_path}: {gone}")
    if p.engine not in ENGINES or ENGINES[p.engine].profile is None:
        launchable = ", ".join(n for n, e in ENGINES.items() if e.profile is not None)
        raise UsageError(f"{profile_path}: a {p.engine} profile; launch confirms {launchable} log lines only")
    binary = which(binary)
    blob = read_binary(binary)
    argv = engine_argv(os.path.abspath(binary), p, list(args))
    env = launch_environment(os.environ if inherited is None else inherited, p)
    added = {k: env[k] for k in list(p.env) + list(report_env(p))}
    dead = tuple(dead_knobs(blob, list(added)))

    cwd = os.getcwd()
    if run_dir:
        check_run_dir(run_dir)
    run_dir = os.path.abspath(run_dir or default_run_dir(rig_root or cwd, p.id))
    os.makedirs(run_dir, exist_ok=True)
    out_path, err_path = os.path.join(run_dir, "stdout.txt"), os.path.join(run_dir, "stderr.txt")
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        # The engine runs where the user stands: its relative paths (--prompt-file prompt.txt, --csv
        # out.csv) are the user's; the run folder only receives what is captured, by absolute path.
        proc = subprocess.Popen(argv, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=cwd)
        peak = fetched = 0
        try:
            rc, peak, fetched = _wait(proc, timeout)
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
        src = os.path.join(cwd, csv_src)          # as the engine saw it (an absolute path stays)
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

    checks = confirm(stdout + "\n" + stderr, p, rc)
    failed = tuple(c.name for c in checks if not c.ok)
    eng = ENGINES[p.engine]
    reading = eng.profile.read_run(stdout, stderr, p.variant) if hasattr(eng.profile, "read_run") else None
    cal = eng.calibrate(stdout + "\n" + stderr) if eng.calibrate and rc == 0 else {}
    if cal and reading is not None and reading.prompt_tokens:
        cal = {**cal, "prompt_tokens": reading.prompt_tokens}
    if cal:
        cal = {**cal, **_measured(p, peak, fetched)}
    result = LaunchResult(ok=not failed, failed=failed, confirmations=checks, profile=p.id,
                          profile_file=os.path.abspath(profile_path), binary=os.path.abspath(binary),
                          argv=tuple(argv), environment=added, dead_knobs=dead, returncode=rc, run_dir=run_dir,
                          stdout_path=out_path, stderr_path=err_path, csv_path=csv_path, csv_rows=rows,
                          started=started, seconds=round(seconds, 3),
                          tok_s=reading.tok_s if reading is not None else None, calibration=cal,
                          engine_said=last_words(stderr or stdout) if rc != 0 else "", cwd=cwd)
    write_json(os.path.join(run_dir, "launch.json"), launch_to_dict(result), indent=2)
    return result


def check_run_dir(path: str) -> None:
    """--out DIR: a new or empty folder, or a launch folder of ours (its launch.json); a user's
    folder with other files is refused (its stdout.txt would be replaced), exit 2."""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise UsageError(f"--out {path}: not a folder; give a new or empty folder")
    names = os.listdir(path)
    if names and "launch.json" not in names:
        raise UsageError(f"--out {path}: holds files launch did not write ({', '.join(sorted(names)[:3])}); give a new "
                         "or empty folder")


def _wait(proc: subprocess.Popen, timeout: float | None) -> tuple[int, int, int]:
    """(exit code, peak resident bytes, bytes read from storage) of the engine: reaped with wait4,
    whose rusage is this child's own — ru_maxrss, what it held of the RAM beside the page cache at
    its peak; ru_inblock, the 512-byte blocks its reads fetched from the drives (Linux counts its
    storage reads there: page-cache hits are not in it, the kernel's readahead is); 0 where the
    system does not say. TimeoutExpired after `timeout` seconds, the process left running."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            inblock = max(0, int(usage.ru_inblock)) * 512 if is_linux() else 0    # only Linux counts its reads there
            return proc.returncode, maxrss_bytes(usage.ru_maxrss), inblock
        if deadline is not None and time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(0.01)


def _measured(p: Profile, peak: int, fetched: int) -> dict:
    """What launch measured of the engine's run, for the calibration (docs/planner.md "Calibrated
    by the engine's own lines"): its peak resident memory, the bytes the drives served it, whether
    its reads went through the page cache (the profile's switches, as its engine prices them), and
    the RAM it ran under (its memory cgroup's limit: a page cache share holds only for that RAM)."""
    from core.ram import ram_limit
    from engines.pattern import Setup

    from .profile import plan_switches

    eng = ENGINES[p.engine]
    out = {"buffered": bool(eng.buffered(Setup((1,), plan_switches(p)))), "ram_bytes": ram_limit().bytes}
    if peak:
        out["resident_bytes"] = peak
    if fetched:
        out["storage_bytes"] = fetched
    return out


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


def gone_sources(p: Profile) -> list[tuple[str, str]]:
    """(name, path) of the profile's sources that are not there (a drive unplugged, a RAM member
    after a reboot)."""
    return [(str(s.get("name", "")), str(s.get("path", ""))) for s in (p.plan or {}).get("sources") or ()
            if isinstance(s, dict) and s.get("path") and not os.path.exists(str(s["path"]))]


def fallback_for(p: Profile, profile_path: str) -> str:
    """'' when every source of the profile is there; else one line naming the gone sources and
    the N-1 profile export wrote for that case (beside this one), or saying there is none."""
    gone = gone_sources(p)
    if not gone:
        return ""
    names = ", ".join(f"{n} ({path})" for n, path in gone)
    listed = (p.provenance or {}).get("fallbacks") or {}
    if len(gone) == 1 and gone[0][0] in listed:
        alt = os.path.join(os.path.dirname(os.path.abspath(profile_path)), str(listed[gone[0][0]].get("profile", "")))
        ok = os.path.isfile(alt)
        return (f"{names} is gone, and the engine fails closed without it: launch with --profile {alt}"
                + ("" if ok else " (not found: export the plan again)") + ", the plan re-solved without it"
                + ("; `replicas sync` restores a RAM member" if is_memory(gone[0][1]) else ""))
    return (f"{names} {'is' if len(gone) == 1 else 'are'} gone, and the engine fails closed without "
            f"{'it' if len(gone) == 1 else 'them'}; no N-1 profile covers this: solve and export for the drives left")


def preflight(binary: str, profile_path: str) -> tuple[Profile, list[str]]:
    """Before launching: the profile, and the variables it would set that the binary never names.
    A source that is gone is refused here (MissingError naming the N-1 profile to use)."""
    from .export import load_profile

    p = load_profile(profile_path)
    gone = fallback_for(p, profile_path)
    if gone:
        raise MissingError(f"{profile_path}: {gone}")
    blob = read_binary(which(binary))
    return p, dead_knobs(blob, list(p.env) + [k for k in report_env(p) if k not in p.env])
