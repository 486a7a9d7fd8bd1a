"""The engine's rules as a checker (pure): every rule an engine would otherwise discover the hard
way, or ignore with no more than a log line, judged on facts about the plan's sources.

Nothing here touches the disk, and nothing here knows an engine: facts about files (size, inode,
verification state, the directory an engine loads) arrive as `SourceFacts` gathered by
`engine_bridge.profiles.export`; the rules themselves are the engine's own, asked through
`Engine.profile.check` (`engines.handoff`); which models an engine reads through
`Engine.reads_model`.
"""

from __future__ import annotations

from typing import Sequence

from core.errors import UsageError
from engines.handoff import NO_SOURCES, Request, SourceFacts, Violation, check_cache
from engines.registry import DEFAULT_ENGINE, ENGINES, get_engine, readers_of

__all__ = ["NO_SOURCES", "SourceFacts", "Violation", "check_cache", "check_engine", "check_model", "check_sources",
           "profile_of", "refusal"]


def profile_of(engine: str):
    """The engine's profile (`engines.handoff.EngineProfile`); UsageError when it has none."""
    prof = get_engine(engine).profile
    if prof is None:
        with_profile = ", ".join(n for n, e in ENGINES.items() if e.profile is not None)
        raise UsageError(f"engine {engine!r} has no profile to export or launch; engines that do: {with_profile}")
    return prof


def check_sources(facts: Sequence[SourceFacts], prefill: Sequence, decode: Sequence, *,
                  engine: str = DEFAULT_ENGINE, allow_unverified: bool = False,
                  manifest_size: int | None = None, switches: frozenset[str] = frozenset(),
                  files: Sequence[tuple[str, int]] = ()) -> list[Violation]:
    """Every rule the engine would otherwise discover the hard way (or ignore with a log line).

    Returns all violations, each with its reason; an empty list means the engine will take it.
    """
    request = Request(paths=tuple(f.directory or f.path for f in facts), prefill=tuple(prefill),
                      decode=tuple(decode), switches=frozenset(switches), holds=tuple(f.holds for f in facts),
                      files=tuple(files))
    return profile_of(engine).check(facts, request, allow_unverified=allow_unverified, manifest_size=manifest_size)


def check_engine(plan_engine: str, engine: str) -> list[Violation]:
    """A plan's weights (and switches) were chosen for its own engine's reads: another engine reads
    the model otherwise, so its profile needs a plan solved for it."""
    if plan_engine != engine:
        return [Violation("engine", "engine", f"the plan was solved for {plan_engine}'s reads, not {engine}'s; "
                                              f"solve again with `planner solve --engine {engine}`")]
    return []


def check_model(engine: str, fmt: str, layout: str, files: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Whether the engine reads a model of this format and layout: ('', ()) when it does, else
    (its one line why not, the engines that do read it)."""
    e = get_engine(engine)
    why = e.reads_model(fmt, layout, files) if e.reads_model is not None else ""
    if not why:
        return "", ()
    readers = tuple(x.name for x in readers_of(fmt, layout, files) if x is not e)
    return why, readers


def check_memory(engine: str, sources: Sequence[int]) -> list[Violation]:
    """A source kept in RAM (tmpfs) for an engine that cannot use one (`Engine.memory_member`)."""
    why = get_engine(engine).memory_member
    return [Violation("memory-member", f"sources[{i}]", f"is in RAM (tmpfs): {why}") for i in sources] if why else []


def refusal(where: str, violations: Sequence[Violation]) -> UsageError:
    """One line naming every violation (exit 2)."""
    n = len(violations)
    return UsageError(f"{where} breaks {n} engine rule{'s' if n != 1 else ''}: " + "; ".join(map(str, violations)))
