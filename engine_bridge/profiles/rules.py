"""The engine's rules as a checker (pure): every rule an engine would otherwise discover the hard
way, or ignore with no more than a log line, judged on facts about the plan's sources (DESIGN §6).

Nothing here touches the disk: facts about files (size, inode, verification state) arrive as
`SourceFacts` gathered by `engine_bridge.profiles.export`; the limits come from the engine's
own module through `engines.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from core.errors import UsageError
from engines import colibri
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
    # colibri loads directories: the one this source stands for ('' when it stands for none),
    # why not when it does not, its shard files (basename, bytes) and whether it has a tokenizer.
    directory: str = ""
    not_loadable: str = ""
    shards: tuple[tuple[str, int], ...] = ()
    tokenizer: bool = False


@dataclass(frozen=True)
class Violation:
    rule: str        # short id, e.g. 'too-many-sources', 'unverified'
    where: str       # e.g. 'sources[2]' or 'decode.weights'
    reason: str      # one sentence: what, and how to fix

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


NO_SOURCES = Violation("no-sources", "sources", "the plan names no sources; re-create it with `planner solve`")


def _list_rules(facts: Sequence[SourceFacts], limit: int, too_many: str) -> list[Violation]:
    """What every engine asks of its source list: at most `limit` sources (`too_many` says why
    not), each an absolute path."""
    v = [Violation("too-many-sources", "sources", too_many)] if len(facts) > limit else []
    v += [Violation("relative-path", f"sources[{f.index}]", f"{f.path!r} is not an absolute path; the engine needs one")
          for f in facts if not f.path.startswith("/")]
    return v


def _unverified(f: SourceFacts, where: str) -> Violation:
    """A replica the manifest has not vouched for (never verified, or changed since)."""
    how = ("was modified since it was verified" if f.state == "stale"
           else "has never been verified against the manifest")
    return Violation("unverified", where, f"replica {f.path} {how}; run `replicas verify` (or export with --allow-unverified)")


def _weight_ok(w, e: Engine) -> bool:
    return isinstance(w, int) and not isinstance(w, bool) and e.weight_min <= w <= e.weight_max


def check_sources(facts: Sequence[SourceFacts], prefill: Sequence, decode: Sequence, *,
                  engine: str = DEFAULT_ENGINE, allow_unverified: bool = False,
                  manifest_size: int | None = None) -> list[Violation]:
    """Every rule the engine would otherwise discover the hard way (or ignore with a log line).

    Returns all violations, each with its reason; an empty list means the engine will take it.
    """
    e = get_engine(engine)
    if e.name == colibri.NAME:
        return check_colibri(facts, prefill, decode, allow_unverified=allow_unverified)
    limit = e.max_sources
    n = len(facts)
    if n == 0:
        return [NO_SOURCES]
    v = _list_rules(facts, limit, f"{n} sources but {engine} reads from at most {limit} (the primary and {limit - 1} "
                                  "replicas); drop a replica from the plan")
    for f in facts:
        where = f"sources[{f.index}]"
        found = sorted({c for c in f.path if c in e.path_forbidden})
        if found:
            v.append(Violation("bad-character", where,
                               f"{f.path!r} contains {' and '.join(repr(c) for c in found)}, which {engine} uses as a separator; "
                               "rename the directory or file"))
    v += _weight_rules(n, prefill, decode, e)
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
            v.append(_unverified(f, where))
    return v


def _weight_rules(n: int, prefill: Sequence, decode: Sequence, e: Engine) -> list[Violation]:
    v = []
    for phase, weights in (("prefill.weights", prefill), ("decode.weights", decode)):
        if len(weights) != n:
            v.append(Violation("weight-count", phase,
                               f"{len(weights)} weights for {n} sources (the engine ignores a wrong count "
                               "and only logs that it did); "
                               "give exactly one weight per source"))
        for i, w in enumerate(weights):
            if not _weight_ok(w, e):
                v.append(Violation("weight-range", f"{phase}[{i}]",
                                   f"weight {w!r} is not an integer {e.weight_min}..{e.weight_max}"))
    return v


def check_colibri(facts: Sequence[SourceFacts], prefill: Sequence, decode: Sequence, *,
                  allow_unverified: bool = False) -> list[Violation]:
    """colibri's rules (engines.colibri; c/colibri.c mirror_setup, c/st.h st_mirror_add, c/coli
    need_model): the model and every mirror are directories of safetensors shards; a mirror
    entry holds no ';' or ',', no edge blank, fits colibri's buffers and is not the model
    directory; at most 4 mirrors; every primary shard is in every mirror with its size (colibri
    would read a missing or different shard from the primary, against the plan's weights)."""
    e = get_engine(colibri.NAME)
    n = len(facts)
    if n == 0:
        return [NO_SOURCES]
    v = _list_rules(facts, e.max_sources, f"{n} sources but colibri reads at most {colibri.MAX_MIRRORS} mirrors "
                                          "besides the model (ST_MAX_MIR); drop a replica from the plan")
    for f in facts:
        if f.path.startswith("/") and f.exists and f.not_loadable:
            v.append(Violation("not-a-directory-model", f"sources[{f.index}]", f.not_loadable))
    v += _weight_rules(n, prefill, decode, e)
    primary = facts[0]
    if not primary.exists:
        v.append(Violation("missing", "sources[0]", f"model {primary.path} does not exist"))
    elif primary.directory and not primary.shards:
        v.append(Violation("no-shards", "sources[0]",
                           f"model directory {primary.directory} holds no *{colibri.SHARD_SUFFIX} shard for colibri to load"))
    elif primary.directory and not primary.tokenizer:
        v.append(Violation("no-tokenizer", "sources[0]",
                           f"model directory {primary.directory} has no {colibri.TOKENIZER}; colibri's coli launcher refuses it"))
    mirrors = [f.directory for f in facts[1:] if f.directory]
    if len(colibri.MIRROR_SEPARATOR.join(mirrors)) > colibri.MIRROR_LIST_MAX:
        v.append(Violation("mirror-list-length", "sources",
                           f"the mirror list is longer than the {colibri.MIRROR_LIST_MAX} characters colibri keeps; "
                           "use shorter directory paths"))
    want = dict(primary.shards)
    for f in facts[1:]:
        where = f"sources[{f.index}]"
        if not f.exists or f.state == "missing":
            v.append(Violation("missing", where, f"replica {f.path} does not exist; run `replicas sync`"))
            continue
        d = f.directory
        if not d:
            continue
        found = sorted({c for c in d if c in colibri.PATH_FORBIDDEN})
        if found:
            v.append(Violation("bad-character", where,
                               f"{d!r} contains {' and '.join(repr(c) for c in found)}, which colibri uses as a separator "
                               f"in {colibri.ENV_MIRROR}; rename the directory"))
        if d != d.strip(" "):
            v.append(Violation("edge-blank", where, f"{d!r} starts or ends with a blank, which colibri trims away; rename the directory"))
        if d == primary.directory or (f.device is not None and (f.device, f.inode) == (primary.device, primary.inode)):
            v.append(Violation("same-directory", where,
                               f"replica {d} is the model directory itself; colibri ignores it (a mirror must be another copy)"))
            continue
        have = dict(f.shards)
        long = [b for b in want if len(f"{d}/{b}") > colibri.SHARD_PATH_MAX]
        if long:
            v.append(Violation("path-length", where, f"{d}/{long[0]} is longer than the {colibri.SHARD_PATH_MAX} "
                                                     "characters colibri can open; use a shorter directory path"))
        absent = [b for b in want if b not in have]
        if absent:
            v.append(Violation("partial-mirror", where,
                               f"replica {d} lacks {len(absent)} of {len(want)} shards ({absent[0]}"
                               f"{', ...' if len(absent) > 1 else ''}); colibri would read them from the model drive; "
                               "run `replicas sync`"))
        resized = [b for b in want if b in have and have[b] != want[b]]
        if resized:
            v.append(Violation("size", where, f"replica {d}/{resized[0]} is {have[resized[0]]} bytes, the model's "
                                              f"{want[resized[0]]}; colibri would skip it; run `replicas repair`"))
        if f.state != "verified" and not allow_unverified:
            v.append(_unverified(f, where))
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
