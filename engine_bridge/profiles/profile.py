"""Engine profiles (pure): the environment and arguments an engine needs to run a plan, the
engine's own rules as a checker, named profiles layered as "base plus exactly these keys",
and the renderings (ds4-argodrive shell file, colibri shell file, JSON) (DESIGN §6).

Nothing here touches the disk: facts about files (size, inode, verification state) arrive as
`SourceFacts` gathered by `engine_bridge.export`.

Profile JSON (schema 1), written beside every exported env file as `<name>.json`:

    {"schema": 1, "kind": "profile", "id": "...", "engine": "ds4-argodrive",
     "environment": {"DS4_ARGODRIVE_PRIMARY_WEIGHT": "10", ...},   # ordered as exported
     "unset": ["DS4_...", ...], "argv": ["--ssd-streaming", "-m", "/abs/...", ...],
     "primary": "/abs/...", "primary_weight": 10, "replicas": [...], "replica_weights": [5, 5],
     "decode_weights": [10, 6, 6], "cache_experts": 4600,
     "model": {"size": 518596067328, "blake3": "..."},
     "allow_unverified": false, "unverified": [], "provenance": {...}, "plan": {...}}
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from core.errors import RigError, UsageError
from engines.registry import DEFAULT_ENGINE

PROFILE_SCHEMA = 1
DEFINITION_SCHEMA = 1
FORMATS = ("ds4-argodrive", "colibri", "json")

# ds4-argodrive (DESIGN §5, §6).
DS4_MAX_SOURCES = 3                     # primary + at most 2 replicas
WEIGHT_MIN, WEIGHT_MAX = 1, 100
K_PRIMARY_WEIGHT = "DS4_ARGODRIVE_PRIMARY_WEIGHT"
K_REPLICAS = "DS4_ARGODRIVE_REPLICAS"
K_DECODE_WEIGHTS = "DS4_ARGODRIVE_DECODE_WEIGHTS"
PLAN_KEYS = (K_PRIMARY_WEIGHT, K_REPLICAS, K_DECODE_WEIGHTS)   # owned by the plan, never by a named profile
# Other keys of the engine this tool speaks for (DESIGN §6). Several are presence-based flags
# (setting =0 still turns them on), so an exported profile unsets every managed key it does not
# set; named profiles add their own keys to the managed set.
DS4_KNOWN_KEYS = (
    "DS4_ARGODRIVE_PREFILL_SPLIT", "DS4_ARGODRIVE_PREFILL_SELECTIVE", "DS4_ARGODRIVE_PREFILL_AHEAD",
    "DS4_ARGODRIVE_PREFILL_LANES", "DS4_METAL_STREAMING_EXPERT_PREAD_THREADS",
    "DS4_ARGODRIVE_FLAG_READBACK", "DS4_ARGODRIVE_BF16_EPILOGUES", "DS4_ARGODRIVE_PSO_CACHE",
)

# colibri (JustVugg/colibri, docs/multidisk.md): COLI_MODEL is the primary, COLI_MODEL_MIRROR a
# ';'-separated list of byte-identical copies, COLI_DISK_WEIGHTS comma-separated positive
# relative weights, primary first; SNAP_MIRROR is the legacy alias of COLI_MODEL_MIRROR.
COLI_MODEL, COLI_MIRROR, COLI_WEIGHTS, COLI_LEGACY_MIRROR = "COLI_MODEL", "COLI_MODEL_MIRROR", "COLI_DISK_WEIGHTS", "SNAP_MIRROR"
COLI_MAX_SOURCES = 5                    # primary + ST_MAX_MIR (4) mirrors

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def valid_name(name: str) -> bool:
    """Profile names become file names: letters, digits, '.', '_' and '-', not starting with a dot."""
    return bool(_NAME_RE.match(name))


# ---------------------------------------------------------------------------------------------
# Nouns

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


@dataclass(frozen=True)
class Definition:
    """A named profile: a base profile plus exactly these keys (a shipped or user .toml)."""
    name: str
    base: str = ""
    set: tuple[tuple[str, str], ...] = ()
    unset: tuple[str, ...] = ()
    cache_experts: int | None = None
    description: str = ""
    origin: str = ""            # 'shipped' or the file it came from


@dataclass(frozen=True)
class Layered:
    """A definition resolved through its bases."""
    name: str
    chain: tuple[str, ...]                      # base first, this profile last
    environment: tuple[tuple[str, str], ...]    # ordered: base keys first, then each layer's additions
    cache_experts: int | None


@dataclass(frozen=True)
class Profile:
    id: str
    engine: str
    environment: tuple[tuple[str, str], ...]    # ordered key -> value, as exported
    unset: tuple[str, ...]                      # managed keys this profile does not want
    argv: tuple[str, ...]                       # engine arguments (after the binary)
    primary: str
    primary_weight: int
    replicas: tuple[str, ...]
    replica_weights: tuple[int, ...]            # base (prefill) weights of the replicas
    decode_weights: tuple[int, ...]             # one per source, primary first ((), single source)
    cache_experts: int | None                   # experts (an engine argument); None for colibri
    model_size: int | None = None               # bytes, from the manifest
    model_blake3: str = ""
    allow_unverified: bool = False
    unverified: tuple[str, ...] = ()            # replicas exported without a matching stamp
    provenance: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    schema: int = PROFILE_SCHEMA

    @property
    def sources(self) -> int:
        return 1 + len(self.replicas)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.environment)


# ---------------------------------------------------------------------------------------------
# The engine's rules

def _weights_ok(w) -> bool:
    return isinstance(w, int) and not isinstance(w, bool) and WEIGHT_MIN <= w <= WEIGHT_MAX


def check_sources(facts: Sequence[SourceFacts], prefill: Sequence, decode: Sequence, *,
                  engine: str = DEFAULT_ENGINE, allow_unverified: bool = False,
                  manifest_size: int | None = None) -> list[Violation]:
    """Every rule the engine would otherwise discover the hard way (or silently ignore).

    Returns all violations, each with its reason; an empty list means the engine will take it.
    """
    v: list[Violation] = []
    limit = COLI_MAX_SOURCES if engine == "colibri" else DS4_MAX_SOURCES
    n = len(facts)
    if n == 0:
        return [Violation("no-sources", "sources", "the plan names no sources; re-create it with `planner solve`")]
    if n > limit:
        v.append(Violation("too-many-sources", "sources",
                           f"{n} sources but {engine} reads from at most {limit} (the primary and {limit - 1} replicas); "
                           "drop a replica from the plan"))
    bad_chars = ";," if engine == "colibri" else ",*"
    for f in facts:
        where = f"sources[{f.index}]"
        if not f.path.startswith("/"):
            v.append(Violation("relative-path", where, f"{f.path!r} is not an absolute path; the engine needs one"))
        found = sorted({c for c in f.path if c in bad_chars})
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
            if not _weights_ok(w):
                v.append(Violation("weight-range", f"{phase}[{i}]",
                                   f"weight {w!r} is not an integer {WEIGHT_MIN}..{WEIGHT_MAX}"))
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
    """A plan's weights follow the split rule of the engine it was solved for. colibri places
    whole experts by weight, so any plan's base weights serve it; ds4-argodrive needs a plan
    solved with its own rule."""
    if engine == "ds4-argodrive" and plan_engine != "ds4-argodrive":
        return [Violation("engine", "engine", f"the plan was solved for {plan_engine!r}, whose split differs from "
                                              "ds4-argodrive's; solve again with `planner solve` for ds4-argodrive")]
    return []


def refusal(where: str, violations: Sequence[Violation]) -> UsageError:
    """One line naming every violation (exit 2)."""
    n = len(violations)
    return UsageError(f"{where} breaks {n} engine rule{'s' if n != 1 else ''}: " + "; ".join(map(str, violations)))


# ---------------------------------------------------------------------------------------------
# Named profiles

def parse_definition(text: str, where: str, origin: str = "") -> Definition:
    """A named profile file (TOML):

        schema = 1
        name = "io-base"
        base = ""                  # optional: the profile this one extends
        description = "..."
        cache_experts = 4600       # optional
        unset = ["KEY", ...]       # optional: keys of the base this profile removes
        [set]                      # exactly the keys this profile adds or changes
        DS4_ARGODRIVE_PREFILL_SPLIT = "1"
    """
    def bad(key, what):
        return RigError(f"{where}: key '{key}' {what}; fix the profile file")

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RigError(f"{where}: not valid TOML ({e}); fix the profile file") from None
    if doc.get("schema", DEFINITION_SCHEMA) != DEFINITION_SCHEMA:
        raise bad("schema", f"is {doc.get('schema')!r}, this version reads {DEFINITION_SCHEMA}")
    unknown = set(doc) - {"schema", "name", "base", "description", "cache_experts", "unset", "set"}
    if unknown:
        raise bad(sorted(unknown)[0], "is not known (expected name, base, description, cache_experts, unset, [set])")
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise bad("name", f"must be a name of letters, digits, '.', '_' or '-', got {name!r}")
    base = doc.get("base", "")
    if not isinstance(base, str) or (base and not _NAME_RE.match(base)):
        raise bad("base", f"must be a profile name, got {base!r}")
    if base == name:
        raise bad("base", "names the profile itself")
    sets = doc.get("set", {})
    if not isinstance(sets, dict):
        raise bad("set", "must be a table of KEY = \"value\"")
    pairs = []
    for k, val in sets.items():
        if not _KEY_RE.match(k):
            raise bad(f"set.{k}", "is not an environment variable name")
        if k in PLAN_KEYS or k in (COLI_MODEL, COLI_MIRROR, COLI_WEIGHTS, COLI_LEGACY_MIRROR):
            raise bad(f"set.{k}", "comes from the plan, not from a profile; remove it")
        if isinstance(val, bool) or not isinstance(val, (str, int)):
            raise bad(f"set.{k}", "must be a string or an integer")
        pairs.append((k, str(val)))
    unset = doc.get("unset", [])
    if not isinstance(unset, list) or not all(isinstance(k, str) and _KEY_RE.match(k) for k in unset):
        raise bad("unset", "must be a list of environment variable names")
    both = set(unset) & set(sets)
    if both:
        raise bad("unset", f"also sets {sorted(both)[0]}")
    cache = doc.get("cache_experts")
    if cache is not None and check_cache(cache):
        raise bad("cache_experts", f"must be a positive integer, got {cache!r}")
    desc = doc.get("description", "")
    if not isinstance(desc, str):
        raise bad("description", "must be a string")
    return Definition(name=name, base=base, set=tuple(pairs), unset=tuple(unset), cache_experts=cache,
                      description=desc, origin=origin)


def resolve(name: str, definitions: dict[str, Definition]) -> Layered:
    """Follow `base` links from `name` down to a profile with no base, then apply each layer."""
    chain, seen = [], set()
    cur = name
    while cur:
        if cur in seen:
            raise RigError(f"profile {name!r}: its bases form a loop ({' -> '.join(chain + [cur])}); fix the base keys")
        d = definitions.get(cur)
        if d is None:
            known = ", ".join(sorted(definitions)) or "none"
            where = f"profile {chain[-1]!r} names base {cur!r}, which" if chain else f"profile {cur!r}"
            raise UsageError(f"{where} is not known; known profiles: {known} (add one as rig/profiles/NAME.toml)")
        seen.add(cur)
        chain.append(cur)
        cur = d.base
    chain.reverse()
    env: dict[str, str] = {}
    cache = None
    for n in chain:
        d = definitions[n]
        for k in d.unset:
            env.pop(k, None)
        for k, val in d.set:
            env[k] = val
        if d.cache_experts is not None:
            cache = d.cache_experts
    return Layered(name=name, chain=tuple(chain), environment=tuple(env.items()), cache_experts=cache)


def delta(d: Definition, definitions: dict[str, Definition]) -> dict:
    """What a named profile changes relative to its base: added, changed and removed keys."""
    before = dict(resolve(d.base, definitions).environment) if d.base else {}
    base_cache = resolve(d.base, definitions).cache_experts if d.base else None
    added = {k: v for k, v in d.set if k not in before}
    changed = {k: v for k, v in d.set if k in before and before[k] != v}
    removed = [k for k in d.unset if k in before]
    out = {"added": added, "changed": changed, "removed": removed}
    if d.cache_experts is not None and d.cache_experts != base_cache:
        out["cache_experts"] = d.cache_experts
    return out


def definition_to_dict(d: Definition, definitions: dict[str, Definition]) -> dict:
    layered = resolve(d.name, definitions)
    return {"name": d.name, "base": d.base, "origin": d.origin, "description": d.description,
            "chain": list(layered.chain), "delta": delta(d, definitions),
            "environment": dict(layered.environment), "cache_experts": layered.cache_experts}


def managed_keys(engine: str, definitions: Iterable[Definition] = ()) -> tuple[str, ...]:
    """Every key an exported profile of this engine speaks for: set it, or unset it."""
    if engine == "colibri":      # named profiles hold ds4 knobs; colibri's own are the four below
        return (COLI_MODEL, COLI_MIRROR, COLI_WEIGHTS, COLI_LEGACY_MIRROR)
    keys = list(PLAN_KEYS) + list(DS4_KNOWN_KEYS)
    for d in definitions:
        keys += [k for k, _ in d.set] + list(d.unset)
    return tuple(dict.fromkeys(keys))


# ---------------------------------------------------------------------------------------------
# Building a profile from a plan

def build_profile(*, profile_id: str, engine: str, plan: dict, layered: Layered | None,
                  cache_experts: int | None, managed: Sequence[str], model_size: int | None = None,
                  model_blake3: str = "", allow_unverified: bool = False,
                  unverified: Sequence[str] = (), provenance: dict | None = None) -> Profile:
    """The profile for a checked plan (`plan` is planner.plan.plan_to_dict's shape)."""
    paths = [s["path"] for s in plan["sources"]]
    prefill = list(plan["prefill"]["weights"])
    decode = list(plan["decode"]["weights"])
    primary, replicas = paths[0], tuple(paths[1:])
    env: dict[str, str] = {}
    if engine == "colibri":
        env[COLI_MODEL] = primary
        if replicas:
            env[COLI_MIRROR] = ";".join(replicas)
            env[COLI_WEIGHTS] = ",".join(map(str, prefill))
        argv: tuple[str, ...] = ()
    else:
        if replicas:
            env[K_PRIMARY_WEIGHT] = str(prefill[0])
            env[K_REPLICAS] = ",".join(f"{p}*{w}" for p, w in zip(replicas, prefill[1:]))
            env[K_DECODE_WEIGHTS] = ",".join(map(str, decode))
        argv = ("--ssd-streaming", "-m", primary, "--ssd-streaming-cache-experts", str(cache_experts))
    if layered is not None and engine != "colibri":
        env.update((k, v) for k, v in layered.environment if k not in env)
    unset = tuple(sorted(k for k in managed if k not in env))
    return Profile(id=profile_id, engine=engine, environment=tuple(env.items()), unset=unset, argv=argv,
                   primary=primary, primary_weight=prefill[0], replicas=replicas,
                   replica_weights=tuple(prefill[1:]), decode_weights=tuple(decode) if replicas else (),
                   cache_experts=cache_experts, model_size=model_size, model_blake3=model_blake3,
                   allow_unverified=allow_unverified, unverified=tuple(unverified),
                   provenance=dict(provenance or {}), plan=dict(plan))


# ---------------------------------------------------------------------------------------------
# Rendering

def sh_quote(value: str) -> str:
    """Always single-quoted (shlex.quote leaves safe strings bare; the file reads better uniform)."""
    q = shlex.quote(value)
    return q if q.startswith("'") else f"'{q}'"


def render_env(p: Profile) -> str:
    """The shell file: a header comment with the engine arguments, `export K='v'`, `unset K`."""
    lines = [f"# {p.engine} profile {p.id!r}, exported by replica-tuner (engine-bridge export)"]
    if p.engine == "colibri":
        lines.append("# colibri reads COLI_MODEL (primary) and COLI_MODEL_MIRROR (copies, ';'-separated);")
        lines.append(f"# COLI_DISK_WEIGHTS are the plan's base weights {':'.join(map(str, (p.primary_weight,) + p.replica_weights))} "
                     "(colibri places whole experts by hash; it has no separate decode split)")
    else:
        lines.append("# engine arguments: " + " ".join(shlex.quote(a) for a in p.argv))
        w = (p.primary_weight,) + p.replica_weights
        lines.append(f"# weights: prefill (base) {':'.join(map(str, w))}"
                     + (f", decode {':'.join(map(str, p.decode_weights))}" if p.decode_weights else " (single source: no split)")
                     + f"; expert cache {p.cache_experts} experts")
    if p.model_size is not None:
        lines.append(f"# model: {p.model_size} bytes, blake3 {p.model_blake3}")
    if p.provenance.get("plan_file"):
        lines.append(f"# plan: {p.provenance['plan_file']}")
    if p.provenance.get("chain"):
        lines.append(f"# named profile: {' + '.join(p.provenance['chain'])}")
    if p.unverified:
        lines.append("# WARNING: exported with --allow-unverified; not verified against the manifest: " + ", ".join(p.unverified))
    lines.append("# load with: . FILE   (the unset lines clear presence-based flags this profile does not want)")
    lines += [f"export {k}={sh_quote(v)}" for k, v in p.environment]
    lines += [f"unset {k}" for k in p.unset]
    return "\n".join(lines) + "\n"


def profile_to_dict(p: Profile) -> dict:
    return {
        "schema": p.schema,
        "kind": "profile",
        "id": p.id,
        "engine": p.engine,
        "environment": dict(p.environment),
        "unset": list(p.unset),
        "argv": list(p.argv),
        "primary": p.primary,
        "primary_weight": p.primary_weight,
        "replicas": list(p.replicas),
        "replica_weights": list(p.replica_weights),
        "decode_weights": list(p.decode_weights),
        "cache_experts": p.cache_experts,
        "model": {"size": p.model_size, "blake3": p.model_blake3},
        "allow_unverified": p.allow_unverified,
        "unverified": list(p.unverified),
        "provenance": p.provenance,
        "plan": p.plan,
    }


def profile_from_dict(d: dict, where: str = "profile") -> Profile:
    def bad(key, what):
        return RigError(f"{where}: key '{key}' {what}; export the profile again with `engine-bridge export`")

    if not isinstance(d, dict) or d.get("kind") != "profile":
        raise RigError(f"{where}: not a profile file (no \"kind\": \"profile\"); give the .json written by `engine-bridge export`")
    if d.get("schema") != PROFILE_SCHEMA:
        raise bad("schema", f"is {d.get('schema')!r}, this version reads {PROFILE_SCHEMA}")
    for key, typ in (("id", str), ("engine", str), ("environment", dict), ("unset", list), ("argv", list),
                     ("primary", str), ("primary_weight", int), ("replicas", list), ("replica_weights", list),
                     ("decode_weights", list)):
        if not isinstance(d.get(key), typ) or isinstance(d.get(key), bool):
            raise bad(key, f"is missing or not a {typ.__name__}")
    if d.get("cache_experts") is not None and check_cache(d.get("cache_experts")):
        raise bad("cache_experts", "is not a positive integer")
    env = d["environment"]
    if not all(isinstance(k, str) and _KEY_RE.match(k) and isinstance(v, str) for k, v in env.items()):
        raise bad("environment", "must map variable names to strings")
    model = d.get("model") or {}
    return Profile(id=d["id"], engine=d["engine"], environment=tuple(env.items()), unset=tuple(d["unset"]),
                   argv=tuple(map(str, d["argv"])), primary=d["primary"], primary_weight=d["primary_weight"],
                   replicas=tuple(d["replicas"]), replica_weights=tuple(d["replica_weights"]),
                   decode_weights=tuple(d["decode_weights"]), cache_experts=d.get("cache_experts"),
                   model_size=model.get("size"), model_blake3=model.get("blake3", ""),
                   allow_unverified=bool(d.get("allow_unverified", False)), unverified=tuple(d.get("unverified", ())),
                   provenance=dict(d.get("provenance") or {}), plan=dict(d.get("plan") or {}))
