"""The engine's rules as a checker (pure): every rule an engine would otherwise discover the hard
way, or silently ignore, judged on facts about the plan's sources (DESIGN §6).

Nothing here touches the disk: facts about files (size, inode, verification state) arrive as
`SourceFacts` gathered by `engine_bridge.profiles.export`; the limits come from the engine's
own module through `engines.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from core.errors import UsageError
from engines.base import Engine
from engines.registry import DEFAULT_ENGINE, get_engine


@dataclass(frozen=True)
class SourceFacts:
    """What the disk says about one source of a plan (gathered by export, judged here)."""
    index: int                  # 0 = primary, then replicas in engine order
    path: str
    exists: bool = True
    regular: bool = True
    size: int | None = None     # bytes
    device: int | None = None
    inode: int | None = None
    state: str = ""             # replicas: 'verified' | 'stale' | 'unverified' | 'missing'; primary: ''


@dataclass(frozen=True)
class Violation:
    rule: str        # short id, e.g. 'too-many-sources', 'unverified'
    where: str       # e.g. 'sources[2]' or 'decode.weights'
    reason: str      # one sentence: what, and how to fix

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def _weight_ok(w, e: Engine) -> bool:
    return isinstance(w, int) and not isinstance(w, bool) and e.weight_min <= w <= e.weight_max


def check_sources(facts: Sequence[SourceFacts], prefill: Sequence, decode: Sequence, *,
                  engine: str = DEFAULT_ENGINE, allow_unverified: bool = False,
                  manifest_size: int | None = None) -> list[Violation]:
    """Every rule the engine would otherwise discover the hard way (or silently ignore).

    Returns all violations, each with its reason; an empty list means the engine will take it.
    """
    e = get_engine(engine)
    v: list[Violation] = []
    limit = e.max_sources
    n = len(facts)
    if n == 0:
        return [Violation("no-sources", "sources", "the plan names no sources; re-create it with `planner solve`")]
    if n > limit:
        v.append(Violation("too-many-sources", "sources",
                           f"{n} sources but {engine} reads from at most {limit} (the primary and {limit - 1} replicas); "
                           "drop a replica from the plan"))
    for f in facts:
        where = f"sources[{f.index}]"
        if not f.path.startswith("/"):
            v.append(Violation("relative-path", where, f"{f.path!r} is not an absolute path; the engine needs one"))
        found = sorted({c for c in f.path if c in e.path_forbidden})
        if found:
            v.append(Violation("bad-character", where,
                               f"{f.path!r} contains {' and '.join(repr(c) for c in found)}, which {engine} uses as a separator; "
                               "rename the directory or file"))
    for phase, weights in (("prefill.weights", prefill), ("decode.weights", decode)):
        if len(weights) != n:
            v.append(Violation("weight-count", phase,
                               f"{len(weights)} weights for {n} sources (the engine silently ignores a wrong count); "
                               "give exactly one weight per source"))
        for i, w in enumerate(weights):
            if not _weight_ok(w, e):
                v.append(Violation("weight-range", f"{phase}[{i}]",
                                   f"weight {w!r} is not an integer {e.weight_min}..{e.weight_max}"))
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
            how = ("was modified since it was verified" if f.state == "stale"
                   else "has never been verified against the manifest")
            v.append(Violation("unverified", where,
                               f"replica {f.path} {how}; run `replicas verify` (or export with --allow-unverified)"))
    return v


def check_cache(cache_experts) -> list[Violation]:
    if cache_experts is None:
        return [Violation("no-cache", "cache_experts",
                          "no expert-cache size: pass --cache-experts N or use a profile that sets cache_experts")]
    if isinstance(cache_experts, bool) or not isinstance(cache_experts, int) or cache_experts <= 0:
        return [Violation("cache-range", "cache_experts", f"{cache_experts!r} must be a positive integer (experts)")]
    return []


def check_engine(plan_engine: str, engine: str) -> list[Violation]:
    """A plan's weights follow the split rule of the engine it was solved for. An engine that
    places whole experts by weight (no split rule, e.g. colibri) is served by any plan's base
    weights; an engine that splits each read needs a plan solved with its own rule."""
    if get_engine(engine).split is not None and plan_engine != engine:
        return [Violation("engine", "engine", f"the plan was solved for {plan_engine!r}, whose split differs from "
                                              f"{engine}'s; solve again with `planner solve` for {engine}")]
    return []


def refusal(where: str, violations: Sequence[Violation]) -> UsageError:
    """One line naming every violation (exit 2)."""
    n = len(violations)
    return UsageError(f"{where} breaks {n} engine rule{'s' if n != 1 else ''}: " + "; ".join(map(str, violations)))
