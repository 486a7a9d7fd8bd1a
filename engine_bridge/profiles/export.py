"""Exporting a plan as an engine profile (I/O around engine_bridge.profile): read the plan, the
rig and its manifest, look at every source on disk (size, inode, verification stamp), check the
engine's rules, then write the env file and its JSON companion atomically.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata, resources

from core import rig as rigmod
from core.constants import PROFILES_DIR
from core.errors import MissingError, RigError, UsageError
from core.fsutil import atomic_write_text
from core.jsonfile import read_json
from engine_bridge.profiles import profile as pf
from engine_bridge.profiles import rules
from engines import colibri, ds4_argodrive
from planner.plan import plan_to_dict
from planner.plans import load_plan
from replicas.manifests import load_manifest
from replicas.stamps import stamp_state

SHIPPED = "shipped"
DEFAULT_BASE = "io-base"


@dataclass(frozen=True)
class ExportResult:
    profile: pf.Profile
    files: tuple[str, ...]       # written, absolute ('-' for stdout)
    text: str = ""               # what went to stdout when the output is '-'


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
# Facts about the sources

def source_facts(plan_dict: dict, manifest, rig) -> list[rules.SourceFacts]:
    """Stat every source; replicas also get their stamp state against the manifest."""
    facts = []
    for i, s in enumerate(plan_dict["sources"]):
        path = s["path"]
        try:
            st = os.stat(path)
        except OSError:
            facts.append(rules.SourceFacts(i, path, exists=False, regular=False, state="missing" if i else ""))
            continue
        regular = stat.S_ISREG(st.st_mode)
        state = ""
        if i:
            state = stamp_state(path, manifest, rig) if (manifest is not None and regular) else "unverified"
        facts.append(rules.SourceFacts(i, path, exists=True, regular=regular, size=st.st_size,
                                       device=st.st_dev, inode=st.st_ino, state=state))
    return facts


def _shards(directory: str) -> tuple[tuple[str, int], ...]:
    """The *.safetensors files colibri indexes in a directory (c/st.h st_scan_dir), with sizes."""
    out = []
    for n in sorted(os.listdir(directory)):
        path = os.path.join(directory, n)
        if n.endswith(colibri.SHARD_SUFFIX) and os.path.isfile(path):
            out.append((n, os.stat(path).st_size))
    return tuple(out)


def colibri_directory(path: str, primary_name: str = "") -> tuple[str, str]:
    """(the directory colibri loads for a plan source, why none) — a directory member is the
    directory; a single-file member stands for its folder only when that folder holds no other
    shard (colibri loads every *.safetensors in it) and, for a replica, the file has the model's
    name (st_mirror_add looks a mirror's shard up by the model's basename)."""
    if os.path.isdir(path):
        return path, ""
    name, folder = os.path.basename(path), os.path.dirname(path)
    if not name.endswith(colibri.SHARD_SUFFIX):
        return "", (f"{path} is not a directory of safetensors shards, which is all colibri loads "
                    "(give the model's directory, or export for ds4-argodrive)")
    if primary_name and name != primary_name:
        return "", f"{path} is not named {primary_name} like the model, so colibri would not find it as a mirror shard"
    others = [n for n, _ in _shards(folder) if n != name]
    if others:
        return "", (f"colibri would load every shard in {folder}, not only {name} (also {others[0]}); "
                    "keep the model alone in its directory")
    return folder, ""


def colibri_facts(plan_dict: dict, manifest, rig) -> list[rules.SourceFacts]:
    """Stat every source as colibri sees it: the directory it loads, its shards, its tokenizer;
    replicas also get their stamp state (on the member path) against the manifest."""
    facts: list[rules.SourceFacts] = []
    primary_name = ""
    for i, s in enumerate(plan_dict["sources"]):
        path = s["path"]
        if not os.path.exists(path):
            facts.append(rules.SourceFacts(i, path, exists=False, regular=False, state="missing" if i else ""))
            continue
        directory, why = colibri_directory(path, primary_name if i else "")
        if i == 0 and not os.path.isdir(path):
            primary_name = os.path.basename(path)
        shards, st = (_shards(directory), os.stat(directory)) if directory else ((), os.stat(path))
        state = ""
        if i:
            state = stamp_state(path, manifest, rig) if manifest is not None else "unverified"
        facts.append(rules.SourceFacts(i, path, exists=True, regular=not os.path.isdir(path), device=st.st_dev,
                                       inode=st.st_ino, state=state, directory=directory, not_loadable=why,
                                       shards=shards,
                                       tokenizer=bool(directory) and os.path.isfile(os.path.join(directory, colibri.TOKENIZER))))
    return facts


def plan_stripes(plan_path: str) -> bool:
    """Whether the plan says colibri should stripe each large read over the drives: its
    top-level "stripe" (default false)."""
    with open(plan_path, encoding="utf-8") as f:
        doc = json.load(f)
    stripe = doc.get("stripe", False) if isinstance(doc, dict) else False
    if not isinstance(stripe, bool):
        raise UsageError(f"{plan_path}: key 'stripe' must be true or false, got {stripe!r}")
    return stripe


# ---------------------------------------------------------------------------------------------
# Export

def _version() -> str:
    try:
        return metadata.version("replica-tuner")
    except metadata.PackageNotFoundError:
        return "unknown"


def _companion(path: str) -> str:
    return path[: -len(".env")] + ".json" if path.endswith(".env") else path + ".json"


def export_profile(*, rig_root: str, plan_path: str, fmt: str, name: str | None = None,
                   base: str | None = None, cache_experts: int | None = None, output: str | None = None,
                   allow_unverified: bool = False) -> ExportResult:
    """Check the plan against the engine's rules and write its profile; raises on any violation."""
    if fmt not in pf.FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(pf.FORMATS)}")
    engine = colibri.NAME if fmt == colibri.NAME else ds4_argodrive.NAME   # json: ds4-argodrive's profile
    plan = load_plan(plan_path)
    plan_dict = plan_to_dict(plan)
    profile_id = name or os.path.splitext(os.path.basename(plan_path))[0] + (f"-{colibri.NAME}" if engine == colibri.NAME else "")
    if not pf.valid_name(profile_id):
        raise UsageError(f"--profile {profile_id!r}: use letters, digits, '.', '_' or '-'")

    rig = rigmod.load_rig(rig_root, must_exist=False)
    manifest = load_manifest(rig, required=False)    # the model: every file, one digest (its identity)

    definitions = all_definitions(rig_root)
    layered = None
    if engine != colibri.NAME:
        if base and (os.sep in base or base.endswith(".toml")):
            d = definition_from_path(base)
            definitions[d.name] = d
            base = d.name
        layered = pf.resolve(base or DEFAULT_BASE, definitions)
    cache = cache_experts if cache_experts is not None else (layered.cache_experts if layered else None)

    colibri_export = engine == colibri.NAME
    facts = colibri_facts(plan_dict, manifest, rig) if colibri_export else source_facts(plan_dict, manifest, rig)
    violations = rules.check_sources(facts, plan.prefill.weights, plan.decode.weights, engine=engine,
                                     allow_unverified=allow_unverified,
                                     manifest_size=manifest.size if manifest else None)
    violations += rules.check_engine(plan.engine, engine)
    if engine != colibri.NAME:
        violations += rules.check_cache(cache)
    if violations:
        err = rules.refusal(f"plan {plan_path}", violations)
        if all(v.rule == "missing" for v in violations):
            raise MissingError(str(err))
        raise err

    unverified = tuple(f.path for f in facts[1:] if f.state != "verified")
    # colibri is given the directories it loads, not the member paths
    paths = tuple(f.directory for f in facts) if colibri_export else None
    provenance = {
        "plan_file": os.path.abspath(plan_path),
        "plan_created": plan.created,
        "plan_provenance": plan.provenance,
        "chain": list(layered.chain) if layered else [],
        "rig": rig.root,
        "manifest_digest": manifest.digest() if manifest else "",
        "exported_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tool": f"replica-tuner {_version()}",
        "format": fmt,
    }
    profile = pf.build_profile(
        profile_id=profile_id, engine=engine, plan=plan_dict, layered=layered, cache_experts=cache,
        managed=pf.managed_keys(engine, definitions.values()),
        model_size=manifest.size if manifest else None, model_blake3=manifest.digest() if manifest else "",
        allow_unverified=allow_unverified, unverified=unverified, provenance=provenance,
        paths=paths, stripe=colibri_export and plan_stripes(plan_path))

    doc = json.dumps(pf.profile_to_dict(profile), indent=2) + "\n"
    if fmt == "json":
        if output == "-":
            return ExportResult(profile, ("-",), doc)
        path = os.path.abspath(output) if output else os.path.join(rig.subdir(PROFILES_DIR), profile_id + ".json")
        atomic_write_text(path, doc)
        return ExportResult(profile, (path,))
    if output == "-":
        return ExportResult(profile, ("-",), pf.render_env(profile))
    env_path = os.path.abspath(output) if output else os.path.join(rig.subdir(PROFILES_DIR), profile_id + ".env")
    json_path = _companion(env_path)
    atomic_write_text(env_path, pf.render_env(profile))
    atomic_write_text(json_path, doc)
    return ExportResult(profile, (env_path, json_path))


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
