"""Engine profiles (pure): the environment and arguments an engine needs to run a plan, named
profiles layered as "base plus exactly these keys", and the renderings (the engine's shell file,
JSON). What an engine is given, and what its env file says, is the engine's own (`Engine.profile`,
`engines.handoff`: `engines.ds4_argodrive.ds4_profile`, `engines.colibri.colibri_profile`); the checks a plan
must pass first are the engine's too, asked through `engine_bridge.profiles.rules`. Nothing here
touches the disk, and nothing here tests an engine's name.

Profile JSON (schema 1), written beside every exported env file as `<name>.json`:

    {"schema": 1, "kind": "profile", "id": "...", "engine": "ds4-argodrive", "variant": "",
     "environment": {"DS4_ARGODRIVE_PRIMARY_WEIGHT": "10", ...},   # ordered as exported
     "unset": ["DS4_...", ...], "argv": ["--ssd-streaming", "-m", "/abs/...", ...],
     "primary": "/abs/...", "primary_weight": 10, "replicas": [...], "replica_weights": [5, 5],
     "decode_weights": [10, 6, 6], "cache_experts": 4600,
     "model": {"size": 518596067328, "blake3": "..."},
     "allow_unverified": false, "unverified": [], "provenance": {...}, "plan": {...}}

`variant` is the engine variant that runs the model (colibri: the family member its launcher picks
by config.json's model_type, e.g. "glm53"; "" for an engine without variants). A profile written
before the key existed loads with "".
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from core.errors import RigError, UsageError
from engines.handoff import PHASES, Request, Setting
from engines.registry import ENGINES

from .rules import check_cache, profile_of

PROFILE_SCHEMA = 1
DEFINITION_SCHEMA = 1
# An engine's name writes its profile as a shell file and JSON; json: the plan's engine's profile as JSON alone.
JSON_FORMAT = "json"


def formats() -> tuple[str, ...]:
    """What `export --format` takes: each registered engine with a profile, then json."""
    return tuple(n for n, e in ENGINES.items() if e.profile is not None) + (JSON_FORMAT,)


def plan_keys() -> frozenset[str]:
    """Variables only a plan sets (every registered engine's): a named profile may not."""
    return frozenset(k for e in ENGINES.values() if e.profile is not None for k in e.profile.plan_keys())

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def valid_name(name: str) -> bool:
    """Profile names become file names: letters, digits, '.', '_' and '-', not starting with a dot."""
    return bool(_NAME_RE.match(name))


# ---------------------------------------------------------------------------------------------
# Nouns

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
    cache_experts: int | None                   # experts (an engine argument); None for an engine without one
    model_size: int | None = None               # bytes, from the manifest
    model_blake3: str = ""
    allow_unverified: bool = False
    unverified: tuple[str, ...] = ()            # replicas exported without a matching stamp
    provenance: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    schema: int = PROFILE_SCHEMA
    variant: str = ""                           # the engine variant that runs the model ('' none)

    @property
    def sources(self) -> int:
        return 1 + len(self.replicas)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.environment)


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
        if k in plan_keys():
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
    """Every key an exported profile of this engine speaks for: set it, or unset it (the keys named
    profiles set or unset count for an engine that takes named profiles)."""
    prof = profile_of(engine)
    named = [k for d in definitions for k in [k for k, _ in d.set] + list(d.unset)] if prof.named_profiles else []
    return prof.managed_keys(named)


# ---------------------------------------------------------------------------------------------
# Building a profile from a plan

def idle_phases(plan: dict, sources: int) -> tuple[tuple[str, ...], ...]:
    """Per source, the phases in which the plan gives it nothing: its `predicted` block says 0
    bytes for it (`sources[i]["bytes"]`), or the plan's `workload.idle` names it (under a phase's
    name for that phase, under any other key for every phase)."""
    out: list[list[str]] = [[] for _ in range(sources)]
    names = [s.get("name") for s in plan.get("sources") or () if isinstance(s, dict)]
    for ph in PHASES:
        pred = (plan.get(ph) or {}).get("predicted") or {}
        for i, s in enumerate(pred.get("sources") or ()):
            if i < sources and isinstance(s, dict) and "bytes" in s and not s["bytes"] and ph not in out[i]:
                out[i].append(ph)
    for key, rep in ((plan.get("workload") or {}).get("idle") or {}).items():
        phases = (key,) if key in PHASES else PHASES
        for name in (rep or {}).get("sources") or () if isinstance(rep, dict) else ():
            if name in names and names.index(name) < sources:
                i = names.index(name)
                out[i] += [ph for ph in phases if ph not in out[i]]
    return tuple(tuple(ph for ph in PHASES if ph in x) for x in out)


def request_of(p: Profile) -> Request:
    """What a profile asks its engine for (the request it was built from, as the file keeps it)."""
    placed = (p.provenance or {}).get("placement") or {}
    return Request(paths=(p.primary,) + p.replicas, prefill=(p.primary_weight,) + p.replica_weights,
                   decode=p.decode_weights, switches=plan_switches(p), cache_experts=p.cache_experts,
                   variant=p.variant, idle=idle_phases(p.plan, p.sources), holds=partial_holds(p),
                   files=tuple((str(f), int(b)) for f, b in placed.get("files") or ()),
                   link_dir=str(placed.get("dir") or ""))


def profile_links(p: Profile) -> tuple[tuple[str, str], ...]:
    """(name, target) of the links the profile's engine is given its model through (export writes
    them into the folder `link_dir` names); () for an engine given its sources themselves."""
    placed = (p.provenance or {}).get("placement") or {}
    return tuple((str(n), str(t)) for n, t in placed.get("links") or ())


def plan_switches(p: Profile) -> frozenset[str]:
    """The switches of the plan a profile was exported from, as the file keeps its copy of the plan
    (a list since plan schema 3, a true/false key per switch before: the engine's `Switches.read`)."""
    e = ENGINES.get(p.engine)
    return e.switches.read(p.plan) if e is not None else frozenset(p.plan.get("switches") or ())


def partial_holds(p: Profile) -> tuple[tuple[str, ...] | None, ...]:
    """Per source, the files a partial replica holds, as export recorded them (provenance 'partial')."""
    part = (p.provenance or {}).get("partial") or {}
    n = 1 + len(p.replicas)
    return tuple(tuple(part[str(i)]) if str(i) in part else None for i in range(n))


def provenance_holds(provenance: dict | None, n: int) -> tuple[tuple[str, ...] | None, ...]:
    """Per source, the files a partial replica holds, from export's provenance ('partial')."""
    part = (provenance or {}).get("partial") or {}
    return tuple(tuple(part[str(i)]) if str(i) in part else None for i in range(n))


def build_profile(*, profile_id: str, engine: str, plan: dict, layered: Layered | None,
                  cache_experts: int | None, managed: Sequence[str], model_size: int | None = None,
                  model_blake3: str = "", allow_unverified: bool = False,
                  unverified: Sequence[str] = (), provenance: dict | None = None,
                  paths: Sequence[str] | None = None, switches: frozenset[str] = frozenset(),
                  variant: str = "", files: Sequence[tuple[str, int]] = (), link_dir: str = "") -> Profile:
    """The profile for a checked plan (`plan` is planner.plan.plan_to_dict's shape). `paths`:
    what the engine is given for each source when not the plan's paths (a directory-loading
    engine: the directories it loads); `switches`: the plan's switches that are on; `variant`: the engine
    variant that runs the model. The environment and arguments are the engine's
    (`Engine.profile.setting`)."""
    paths = list(paths) if paths is not None else [s["path"] for s in plan["sources"]]
    prefill = list(plan["prefill"]["weights"])
    decode = list(plan["decode"]["weights"])
    primary, replicas = paths[0], tuple(paths[1:])
    named = layered.environment if (layered is not None and profile_of(engine).named_profiles) else ()
    request = Request(paths=tuple(paths), prefill=tuple(prefill), decode=tuple(decode),
                      switches=frozenset(switches), cache_experts=cache_experts, named=tuple(named),
                      variant=variant, files=tuple(files), link_dir=link_dir,
                      holds=tuple(provenance_holds(provenance, len(paths))))
    s = profile_of(engine).setting(request)
    links = profile_of(engine).links(request)
    if links:
        # an engine given its model through a folder of links: where, which files, each link
        provenance = {**(provenance or {}), "placement": {"dir": link_dir, "files": [list(f) for f in files],
                                                          "links": [list(x) for x in links]}}
    env = dict(s.environment)
    unset = tuple(sorted(k for k in managed if k not in env))
    return Profile(id=profile_id, engine=engine, environment=tuple(env.items()), unset=unset, argv=tuple(s.argv),
                   primary=primary, primary_weight=prefill[0], replicas=replicas,
                   replica_weights=tuple(prefill[1:]), decode_weights=tuple(decode) if replicas else (),
                   cache_experts=cache_experts, model_size=model_size, model_blake3=model_blake3,
                   allow_unverified=allow_unverified, unverified=tuple(unverified),
                   provenance=dict(provenance or {}), plan=dict(plan), variant=variant)


# ---------------------------------------------------------------------------------------------
# Rendering

def sh_quote(value: str) -> str:
    """Always single-quoted (shlex.quote leaves safe strings bare; the file reads better uniform)."""
    q = shlex.quote(value)
    return q if q.startswith("'") else f"'{q}'"


def render_env(p: Profile) -> str:
    """The shell file: a header comment (what the engine's variables mean, its arguments), then
    `export K='v'` and `unset K`."""
    prof = profile_of(p.engine)
    lines = [f"# {p.engine} profile {p.id!r}, exported by replica-tuner (engine-bridge export)"]
    lines += [f"# {x}" for x in prof.header(request_of(p), Setting(p.environment, p.argv))]
    if p.model_size is not None:
        lines.append(f"# model: {p.model_size} bytes, blake3 {p.model_blake3}")
    if p.provenance.get("plan_file"):
        lines.append(f"# plan: {p.provenance['plan_file']}")
    if p.provenance.get("chain"):
        lines.append(f"# named profile: {' + '.join(p.provenance['chain'])}")
    if p.unverified:
        lines.append("# WARNING: exported with --allow-unverified; not verified against the manifest: " + ", ".join(p.unverified))
    lines.append(f"# load with: . FILE   (the unset lines clear {prof.unset_note()})")
    lines += [f"export {k}={sh_quote(v)}" for k, v in p.environment]
    lines += [f"unset {k}" for k in p.unset]
    return "\n".join(lines) + "\n"


def profile_to_dict(p: Profile) -> dict:
    return {
        "schema": p.schema,
        "kind": "profile",
        "id": p.id,
        "engine": p.engine,
        "variant": p.variant,
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
        raise RigError(f"{where}: not a profile file (no \"kind\": \"profile\"); give the .json written by `engine-bridge "
                       "export`")
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
    if not isinstance(d.get("variant", ""), str):
        raise bad("variant", "is not a string")
    model = d.get("model") or {}
    return Profile(id=d["id"], engine=d["engine"], environment=tuple(env.items()), unset=tuple(d["unset"]),
                   argv=tuple(map(str, d["argv"])), primary=d["primary"], primary_weight=d["primary_weight"],
                   replicas=tuple(d["replicas"]), replica_weights=tuple(d["replica_weights"]),
                   decode_weights=tuple(d["decode_weights"]), cache_experts=d.get("cache_experts"),
                   model_size=model.get("size"), model_blake3=model.get("blake3", ""),
                   allow_unverified=bool(d.get("allow_unverified", False)), unverified=tuple(d.get("unverified", ())),
                   provenance=dict(d.get("provenance") or {}), plan=dict(d.get("plan") or {}),
                   variant=d.get("variant", ""))
