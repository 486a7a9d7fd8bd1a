"""Exporting a plan as an engine profile (I/O around engine_bridge.profile): read the plan, the
rig and its manifest, look at the model (can the engine read it at all?) and at every source on
disk (size, inode, verification stamp; for an engine that loads directories, the directory a
source stands for, its files and config.json), check the engine's rules, then write the env file
and its JSON companion atomically.

Which facts matter and what they mean is the engine's (`Engine.profile`, `Engine.reads_model`);
this module gathers them and never tests an engine's name.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, replace
from typing import ClassVar
from datetime import datetime, timezone
from importlib import metadata, resources

from core import rig as rigmod
from core.constants import PROFILES_DIR
from core.errors import MissingError, ReplicaTunerError, RigError, UsageError, WriteError
from core.fsutil import atomic_write_text, check_output
from core.events import Reporter
from core.jsonfile import read_json, write_json
from core.tiers import is_memory
from engine_bridge.profiles import profile as pf
from engine_bridge.profiles import rules
from engines.handoff import SourceFacts
from engines.registry import DEFAULT_ENGINE
from models.modelset import discover
from models.tensortable import CONFIG_JSON
from planner.fallback import fallback_plans
from planner.plan import Plan, plan_to_dict
from planner.plans import load_plan, resolve_plan_path
from replicas.manifests import load_manifest
from replicas.stamps import stamp_state

SHIPPED = "shipped"
DEFAULT_BASE = "io-base"


@dataclass(frozen=True)
class ExportResult:
    profile: pf.Profile
    files: tuple[str, ...]       # written, absolute ('-' for stdout)
    text: str = ""               # what went to stdout when the output is '-'
    fallbacks: tuple[tuple[str, str], ...] = ()   # (drive, the N-1 profile's JSON written without it)
    skipped: tuple[tuple[str, str], ...] = ()     # (drive, why no N-1 profile was written without it)


# ---------------------------------------------------------------------------------------------
# Named profile definitions

def shipped_definitions() -> dict[str, pf.Definition]:
    out = {}
    folder = resources.files("engine_bridge").joinpath("profiles")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            d = pf.parse_definition(entry.read_text(encoding="utf-8"), f"engine_bridge/profiles/{entry.name}", SHIPPED)
            out[d.name] = d
    return out


def user_definitions(rig_root: str) -> dict[str, pf.Definition]:
    """rig/profiles/*.toml; a user profile with a shipped profile's name replaces it."""
    folder = os.path.join(rig_root, PROFILES_DIR)
    out = {}
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return out
    for n in names:
        if not n.endswith(".toml"):
            continue
        path = os.path.join(folder, n)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise RigError(f"{path}: not UTF-8 text; fix the profile file") from None
        d = pf.parse_definition(text, path, path)
        if d.name in out:
            raise RigError(f"{path}: profile name {d.name!r} is also defined in {out[d.name].origin}; rename one")
        out[d.name] = d
    return out


@dataclass(frozen=True)
class ProfileList:
    """`engine-bridge profiles --json`: the named profiles (shipped and the rig's) with their
    deltas, and the profiles exported into the rig."""

    definitions: dict          # name -> pf.Definition, as all_definitions returns them
    exported: tuple            # pf.Profile, as exported_profiles returns them

    KIND: ClassVar[str] = "profiles"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return {"definitions": [pf.definition_to_dict(d, self.definitions) for d in self.definitions.values()],
                "exported": [{"id": p.id, "engine": p.engine, "sources": p.sources,
                              "weights": [p.primary_weight, *p.replica_weights],
                              "decode_weights": list(p.decode_weights), "cache_experts": p.cache_experts,
                              "unverified": list(p.unverified)} for p in self.exported]}


def all_definitions(rig_root: str) -> dict[str, pf.Definition]:
    defs = shipped_definitions()
    defs.update(user_definitions(rig_root))
    return defs


def definition_from_path(path: str) -> pf.Definition:
    try:
        with open(path, encoding="utf-8") as f:
            return pf.parse_definition(f.read(), path, path)
    except FileNotFoundError:
        raise MissingError(f"{path}: no such profile file") from None


# ---------------------------------------------------------------------------------------------
# Facts about the model and the sources

def model_kind(path: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(format, layout, files) of the model at the plan's primary path (`models.modelset.discover`),
    or None when it cannot tell (missing, unreadable, or bytes of no known format: the rules then
    say what is wrong with the source itself)."""
    try:
        m = discover(path)
    except (ReplicaTunerError, OSError):
        return None
    return m.format, m.layout, m.files


def model_files(path: str) -> tuple[tuple[str, int], ...]:
    """The model's files at the plan's primary path (relative to its folder) and their bytes; ()
    when it cannot tell (the rules then say what is wrong with the source itself)."""
    try:
        m = discover(path)
        return tuple((rel, os.path.getsize(p)) for rel, p in zip(m.files, m.paths))
    except (ReplicaTunerError, OSError):
        return ()


def _listing(directory: str) -> tuple[tuple[str, int], ...]:
    """The regular files directly in a directory, with their sizes (a directory that cannot be
    listed: none)."""
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return ()
    for n in names:
        p = os.path.join(directory, n)
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((n, st.st_size))
    return tuple(out)


def _config(directory: str) -> tuple[str, str | None]:
    """config.json in a model directory: ('', None) absent, ('ok', its model_type or None), or
    (why it could not be read, None)."""
    path = os.path.join(directory, CONFIG_JSON)
    if not os.path.isfile(path):
        return "", None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"is not readable JSON ({e})", None
    if not isinstance(doc, dict):
        return "is not a JSON object", None
    mt = doc.get("model_type")
    return "ok", mt if isinstance(mt, str) else None


def source_facts(plan_dict: dict, manifest, rig, view=None) -> list[SourceFacts]:
    """Stat every source; replicas also get their stamp state against the manifest. `view`: the
    engine's `source_view` when it loads directories — then each source is also looked at as the
    engine sees it (the directory it stands for, the files there, its config.json), and its stamp
    is read on the member path whatever it is."""
    facts = []
    primary_name = ""
    partial = {os.path.realpath(m.path): m.holds for m in rig.replicas if m.partial}
    for i, s in enumerate(plan_dict["sources"]):
        path = s["path"]
        holds = partial.get(os.path.realpath(path)) if i else None
        try:
            st = os.stat(path)
        except OSError:
            facts.append(SourceFacts(i, path, exists=False, regular=False, state="missing" if i else ""))
            continue
        regular, is_dir = stat.S_ISREG(st.st_mode), stat.S_ISDIR(st.st_mode)
        if view is None:
            state = ""
            if i:
                state = stamp_state(path, manifest, rig, holds) if (manifest is not None and regular) else "unverified"
            facts.append(SourceFacts(i, path, exists=True, regular=regular, size=st.st_size,
                                     device=st.st_dev, inode=st.st_ino, state=state, holds=holds))
            continue
        if i == 0 and not is_dir:
            primary_name = os.path.basename(path)
        v = view(path, is_dir, _listing(path if is_dir else os.path.dirname(path)), primary_name if i else "")
        if v.directory:
            st = os.stat(v.directory)
        config, model_type = _config(v.directory) if v.directory else ("", None)
        state = ""
        if i:
            state = stamp_state(path, manifest, rig, holds) if manifest is not None else "unverified"
        facts.append(SourceFacts(i, path, exists=True, regular=not is_dir, device=st.st_dev, inode=st.st_ino,
                                 state=state, directory=v.directory, not_loadable=v.not_loadable, shards=v.shards,
                                 tokenizer=v.tokenizer, config=config, model_type=model_type, holds=holds))
    return facts


# ---------------------------------------------------------------------------------------------
# Export

def _version() -> str:
    try:
        return metadata.version("replica-tuner")
    except metadata.PackageNotFoundError:
        return "unknown"


def _companion(path: str) -> str:
    return path[: -len(".env")] + ".json" if path.endswith(".env") else path + ".json"


def export_profile(*, rig_root: str, plan_path: str = "", fmt: str | None, name: str | None = None,
                   base: str | None = None, cache_experts: int | None = None, output: str | None = None,
                   allow_unverified: bool = False, fallbacks: bool = True, report: Reporter = None,
                   plan: Plan | None = None) -> ExportResult:
    """Check the plan against the engine's rules and write its profile; raises on any violation.
    `plan_path`: a plan file, 'latest' or a plan's name in <rig>/plans (rig.toml and the plan are
    each read once); or `plan`, a plan value never written to a file (the real-engine tuner's arms:
    then `name` is needed, and the provenance names no plan file). `fmt`: an engine's name (its env
    file and JSON), or 'json' (the plan's
    engine's profile as JSON alone). With `fallbacks` (and a file to write), also the N-1 profiles
    beside it: the plan re-solved without each of its drives (`planner.fallback`), named
    NAME.without-DRIVE; the chosen profile's provenance lists them (`fallbacks`), for `launch` to
    name when a drive is gone; `report` gets a Notice before each re-solve."""
    if fmt is not None and fmt not in pf.formats():
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(pf.formats())}")
    rig = rigmod.load_rig(rig_root, must_exist=False)
    if plan is None:
        plan_path = resolve_plan_path(plan_path, rig)
        plan = load_plan(plan_path)
    elif not name:
        raise UsageError("export of a plan value: give the profile a name")
    if fmt is None:              # the plan knows its engine
        fmt = plan.engine
        if fmt not in pf.formats():
            raise UsageError(f"the plan is for {fmt}, which has no engine profile; give --format {pf.JSON_FORMAT}")
    engine = plan.engine if fmt == pf.JSON_FORMAT else fmt
    prof = rules.profile_of(engine)
    # A profile for an engine other than the default one carries the engine's name by default.
    profile_id = name or os.path.splitext(os.path.basename(plan_path))[0] + (f"-{engine}" if engine != DEFAULT_ENGINE else "")
    if not pf.valid_name(profile_id):
        raise UsageError(f"--profile {profile_id!r}: use letters, digits, '.', '_' or '-'")

    manifest = load_manifest(rig, required=False)    # the model: every file, one digest (its identity)

    definitions = all_definitions(rig_root)
    layered = None
    if prof.named_profiles:
        if base and (os.sep in base or base.endswith(".toml")):
            d = definition_from_path(base)
            definitions[d.name] = d
            base = d.name
        layered = pf.resolve(base or DEFAULT_BASE, definitions)
    cache = cache_experts if cache_experts is not None else (layered.cache_experts if layered else None)
    if cache is None and (plan.priced_cache or 0) > 0:
        cache = plan.priced_cache             # the cache the plan was priced with
    if output == "-":
        main = os.path.join(rig.subdir(PROFILES_DIR), profile_id + ".env")     # links are named, not written
    elif fmt == pf.JSON_FORMAT:
        main = os.path.abspath(output) if output else os.path.join(rig.subdir(PROFILES_DIR), profile_id + ".json")
    else:
        main = os.path.abspath(output) if output else os.path.join(rig.subdir(PROFILES_DIR), profile_id + ".env")
    folder, stem = os.path.dirname(main), os.path.splitext(os.path.basename(main))[0]
    ctx = _Context(fmt, engine, rig, manifest, definitions, layered, cache, allow_unverified, folder)
    profile = _profile_for(ctx, plan, plan_path, profile_id, link_dir=os.path.join(folder, stem + LINKS_SUFFIX))

    if output != "-":       # its own files before the N-1 re-solves (each a whole solve): a user's file refused at once
        for f in profile_files(fmt, main):
            check_output(f, "export", our_profile, forceable=False)
    if output == "-":
        text = json.dumps(pf.profile_to_dict(profile), indent=2) + "\n" if fmt == pf.JSON_FORMAT else pf.render_env(profile)
        return ExportResult(profile, ("-",), text)
    extra: list[pf.Profile] = []
    skipped: list[tuple[str, str]] = []
    listed = {}
    for fb in (fallback_plans(rig, plan, report) if fallbacks else ()):
        fid = f"{profile_id}.without-{fb.drive}"
        why = fb.why
        if fb.plan is not None:
            try:
                extra.append(_profile_for(ctx, fb.plan, plan_path, fid,
                                          link_dir=os.path.join(folder, f"{stem}.without-{fb.drive}{LINKS_SUFFIX}")))
            except ReplicaTunerError as e:
                why = str(e)
        if why:
            skipped.append((fb.drive, why))
        else:
            listed[fb.drive] = {"path": fb.path, "profile": f"{stem}.without-{fb.drive}.json"}
    if listed or skipped:
        profile = replace(profile, provenance={**profile.provenance, "fallbacks": listed,
                                               "fallbacks_skipped": dict(skipped)})
    paths = {p.id: os.path.join(folder, f"{stem}.without-{p.id.rsplit('.without-', 1)[1]}{os.path.splitext(main)[1]}")
             for p in extra}
    for target in [main, *paths.values()]:      # every file it will write, before the first: never a user's file
        for f in profile_files(fmt, target):
            check_output(f, "export", our_profile, forceable=False)
    files = write_links(profile) + write_profile(profile, fmt, main)
    written = []
    for p in extra:
        drive = p.id.rsplit(".without-", 1)[1]
        write_links(p)
        written.append((drive, write_profile(p, fmt, paths[p.id])[-1]))
    return ExportResult(profile, files, fallbacks=tuple(written), skipped=tuple(skipped))


LINKS_SUFFIX = ".links"


def write_links(profile: pf.Profile) -> tuple[str, ...]:
    """The folder of links an engine placed by files is given (`EngineProfile.links`), written
    beside the profile: each link under a temporary name, then renamed over the one export wrote
    before. A folder holding anything but links is not export's and is never touched. Returns
    the folder ((), none)."""
    links = pf.profile_links(profile)
    if not links:
        return ()
    folder = pf.request_of(profile).link_dir
    missing = [t for _, t in links if not os.path.isfile(t)]
    if missing:
        raise MissingError(f"{missing[0]}: no such file ({len(missing)} of the {len(links)} files the links point at); "
                           "sync the replica (`replicas sync`) or solve the plan again")
    try:
        os.makedirs(folder, exist_ok=True)
        names = set(os.listdir(folder))
        foreign = sorted(n for n in names if not os.path.islink(os.path.join(folder, n)))
        if foreign:
            raise UsageError(f"{os.path.join(folder, foreign[0])}: not a link export wrote; the links folder "
                             f"{folder} must hold only links: move it away or export under another --profile")
        want = {n for n, _ in links}
        for name, target in links:
            tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(target, tmp)
            os.rename(tmp, os.path.join(folder, name))
        for stale in sorted(names - want):          # links of an earlier export of another model
            os.unlink(os.path.join(folder, stale))
    except OSError as e:
        raise WriteError(f"{folder}: writing the links failed ({e.strerror or e}); check the folder's permissions") from None
    return (folder,)


@dataclass(frozen=True)
class _Context:
    """What every profile of one export shares."""
    fmt: str
    engine: str
    rig: rigmod.Rig
    manifest: object
    definitions: dict
    layered: object
    cache: int | None
    allow_unverified: bool
    folder: str = ""             # where the profiles (and an engine's links folders) are written


def our_profile(head: bytes) -> bool:
    """A file export may replace: a profile it wrote (the env file's header, the JSON's kind)."""
    return b"exported by replica-tuner" in head or b'"kind": "profile"' in head


def profile_files(fmt: str, path: str) -> tuple[str, ...]:
    """The files `write_profile` writes for `path`: the JSON alone, or the env file and its JSON companion
    (`launch` reads a profile's JSON beside its env file)."""
    return (path,) if fmt == pf.JSON_FORMAT else (path, _companion(path))


def write_profile(profile: pf.Profile, fmt: str, path: str) -> tuple[str, ...]:
    """Write a profile (atomically): its JSON at `path` (format json), else its env file there and
    the JSON beside it. Returns the files written, the JSON last."""
    if fmt == pf.JSON_FORMAT:
        return (write_json(path, pf.profile_to_dict(profile), indent=2),)
    atomic_write_text(path, pf.render_env(profile))
    return (path, write_json(_companion(path), pf.profile_to_dict(profile), indent=2))


def _profile_for(ctx: _Context, plan, plan_path: str, profile_id: str, link_dir: str = "") -> pf.Profile:
    """The profile of one plan, every rule checked (raises on a violation)."""
    engine, rig, manifest = ctx.engine, ctx.rig, ctx.manifest
    prof = rules.profile_of(engine)
    plan_dict = plan_to_dict(plan)
    # The model first: an engine that cannot read it at all is refused in one line, naming the
    # engine that can, rather than by every rule its files break.
    kind = model_kind(plan_dict["sources"][0]["path"])
    if kind is not None:
        why, readers = rules.check_model(engine, *kind)
        if why and readers:
            raise UsageError(f"plan {plan_path or profile_id}: {why}; {' or '.join(readers)} reads it: solve the plan for it "
                             f"(`planner solve --engine {readers[0]}`) and export with --format {readers[0]}")

    facts = source_facts(plan_dict, manifest, rig, prof.source_view)
    files = model_files(plan_dict["sources"][0]["path"])
    violations = rules.check_sources(facts, plan.prefill.weights, plan.decode.weights, engine=engine,
                                     allow_unverified=ctx.allow_unverified,
                                     manifest_size=manifest.size if manifest else None, switches=plan.switches,
                                     files=files)
    violations += rules.check_engine(plan.engine, engine)
    memory = tuple(s["path"] for s in plan_dict["sources"] if is_memory(s["path"]))
    violations += rules.check_memory(engine, [i for i, s in enumerate(plan_dict["sources"]) if s["path"] in memory])
    if prof.cache_experts:
        violations += rules.check_cache(ctx.cache)
    if violations:
        err = rules.refusal(f"plan {plan_path or profile_id}", violations)
        if all(v.rule == "missing" for v in violations):
            raise MissingError(str(err))
        raise err

    unverified = tuple(f.path for f in facts[1:] if f.state != "verified")
    # an engine that loads directories is given the directories, not the member paths
    paths = tuple(f.directory for f in facts) if prof.source_view is not None else None
    provenance = {
        "plan_file": os.path.abspath(plan_path) if plan_path else "",
        "plan_created": plan.created,
        "plan_provenance": plan.provenance,
        "chain": list(ctx.layered.chain) if ctx.layered else [],
        "rig": rig.root,
        "manifest_digest": manifest.digest() if manifest else "",
        "exported_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tool": f"replica-tuner {_version()}",
        "format": ctx.fmt,
        **({"memory_members": list(memory)} if memory else {}),
        **({"without": plan.provenance["without"]} if plan.provenance.get("without") else {}),
    }
    if any(f.holds is not None for f in facts):
        # partial replicas, by source index: the files each holds (docs/replicas.md, "Partial replicas")
        provenance["partial"] = {str(f.index): list(f.holds) for f in facts if f.holds is not None}
    return pf.build_profile(
        profile_id=profile_id, engine=engine, plan=plan_dict, layered=ctx.layered, cache_experts=ctx.cache,
        managed=pf.managed_keys(engine, ctx.definitions.values()),
        model_size=manifest.size if manifest else None, model_blake3=manifest.digest() if manifest else "",
        allow_unverified=ctx.allow_unverified, unverified=unverified, provenance=provenance,
        paths=paths, switches=plan.switches, variant=prof.variant(facts), files=files, link_dir=link_dir)


# ---------------------------------------------------------------------------------------------
# Listing

def exported_profiles(rig_root: str) -> list[pf.Profile]:
    """Profiles already exported into rig/profiles/*.json (unreadable ones are skipped)."""
    folder = os.path.join(rig_root, PROFILES_DIR)
    out = []
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".json"):
            try:
                out.append(load_profile(os.path.join(folder, n)))
            except (RigError, MissingError):
                continue
    return out


def load_profile(path: str) -> pf.Profile:
    """A profile's JSON; given the .env file, its .json companion beside it."""
    if path.endswith(".env"):
        path = _companion(path)
    d = read_json(path, "profile", "`engine-bridge export` writes NAME.env and NAME.json; export the profile again",
                  schema=pf.PROFILE_SCHEMA)
    return pf.profile_from_dict(d, path)
