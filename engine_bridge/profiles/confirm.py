"""The launcher's pure half: what an engine run is started with, and whether its log proves that
what the profile asked for was applied — a requested setting is not proof. Text in, verdicts out;
`engine_bridge.profiles.launch` starts the process and captures the text.

Nothing here knows an engine: what to add so the engine reports what it applied, which inherited
variables to drop, which arguments the profile owns, and the verdict on the log are the engine's
own (`Engine.profile`: `report_env`, `clear_prefix`, `profile_args`, `expect` and `judge`, in
`engines.ds4_argodrive.ds4_profile` and `engines.colibri.colibri_profile`). Here: asking them for a profile,
the dead-knob scan of a binary, and the ds4-bench CSV a run printed or wrote.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from core.errors import UsageError
from engines.handoff import Check

from .profile import Profile, request_of
from .rules import profile_of

__all__ = ["Check", "NOT_JUDGED", "confirm", "csv_block", "dead_knobs", "engine_argv", "last_words", "launch_environment",
           "parse_bench_csv", "report_env"]

CSV_HEADER_START = "ctx_tokens,"     # ds4-bench's CSV header begins so (docs/engine-profiles.md)


# ---------------------------------------------------------------------------------------------
# What to start the engine with

def report_env(p: Profile) -> dict[str, str]:
    """What the launcher adds so the engine prints what it applied."""
    return dict(profile_of(p.engine).report_env(p.variant))


def launch_environment(inherited: Mapping[str, str], p: Profile) -> dict[str, str]:
    """The inherited environment without the profile's managed keys (and without any variable the
    engine's profile says to clear by prefix), plus the profile and the report switches."""
    prefix = profile_of(p.engine).clear_prefix()
    env = {k: v for k, v in inherited.items()
           if not (prefix and k.startswith(prefix)) and k not in p.unset}
    env.update(p.environment)
    for k, v in report_env(p).items():
        env.setdefault(k, v)
    return env


def engine_argv(binary: str, p: Profile, args: Sequence[str]) -> list[str]:
    """The binary, the profile's arguments, then the caller's; refuses an argument the profile
    already gives (e.g. the model, which the profile names by an argument or a variable)."""
    prof = profile_of(p.engine)
    clash = [a for a in args if a.split("=", 1)[0] in prof.profile_args()]
    if clash:
        raise UsageError(f"engine argument {clash[0]!r} is already given by the profile "
                         f"({prof.given_by(p.argv, p.env)}); remove it after --, or export another profile")
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

def confirm(text: str, p: Profile, returncode: int | None = 0) -> tuple[Check, ...]:
    """Judge an engine's log (stdout + stderr) against what the profile asked for, by the engine's
    own verdict: one Check per name in its profile's `checks`. returncode None means the engine
    was stopped (timeout); negative, killed by that signal."""
    prof = profile_of(p.engine)
    checks = tuple(prof.judge(text, prof.expect(request_of(p), p.env), returncode))
    if returncode == 0:
        return checks
    # The engine did not finish: what it had not yet printed is no failure of mirrors, weights or
    # bytes served — the exit is the one verdict, and the engine's own last line says why.
    return tuple(c if c.ok or c.name == "exit" else Check(c.name, False, c.expected, "-", NOT_JUDGED) for c in checks)


NOT_JUDGED = "not judged: the engine did not finish"


def last_words(text: str, lines: int = 1) -> str:
    """The engine's last non-empty line(s) of a stream (why it stopped, in its own words)."""
    kept = [x.strip() for x in text.splitlines() if x.strip()]
    return " / ".join(kept[-lines:])


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
