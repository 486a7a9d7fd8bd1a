"""The fleet file: which nodes, and where each keeps its rig (pure; docs/fleet.md).

    # fleet.toml
    schema = 1
    manifest = "rig/manifest.json"   # optional: the model every node must hold (default: the asker's rig's)
    upstream = "rig/upstream.json"   # optional: its published digests (default: the asker's rig's, if any)
    engine = "ds4-argodrive"         # optional: the engine each node's plan and profile are for

    [[node]]
    name = "alpha"                   # a Ray node advertising the resource fleet:alpha, else its address or hostname
    rig = "/srv/models/rig"          # that node's rig folder, absolute, on that node
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from core.errors import RigError

from .constants import FLEET_FILE_SCHEMA


@dataclass(frozen=True)
class NodeSpec:
    name: str      # the fleet's name of the node (its resource fleet:NAME), or its address / hostname
    rig: str       # the node's rig folder, absolute on the node


@dataclass(frozen=True)
class FleetSpec:
    nodes: tuple[NodeSpec, ...]
    manifest: str = ""     # as written (relative to the fleet file); "" the asker's rig's
    upstream: str = ""
    engine: str = ""       # "" the default engine


def parse_fleet(text: str, where: str) -> FleetSpec:
    """A fleet file's text; every problem is a RigError naming the file and the key."""
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RigError(f"{where}: not valid TOML ({e}); see docs/fleet.md for the shape") from None
    if d.get("schema", FLEET_FILE_SCHEMA) != FLEET_FILE_SCHEMA:
        raise RigError(f"{where}: schema {d.get('schema')!r}, this version reads schema {FLEET_FILE_SCHEMA}")
    for key in ("manifest", "upstream", "engine"):
        if not isinstance(d.get(key, ""), str):
            raise RigError(f"{where}: key '{key}' must be a string")
    raw = d.get("node")
    if not isinstance(raw, list) or not raw:
        raise RigError(f'{where}: no [[node]] tables; give one per node: [[node]] name = "alpha" rig = "/srv/rig"')
    nodes, seen = [], set()
    for i, n in enumerate(raw):
        at = f"{where}: node[{i}]"
        if not isinstance(n, dict):
            raise RigError(f"{at}: expected a table")
        name, rig = n.get("name"), n.get("rig")
        if not isinstance(name, str) or not name.strip():
            raise RigError(f"{at}: key 'name' missing or empty (the node's fleet:NAME resource, address or hostname)")
        if not isinstance(rig, str) or not rig.startswith("/"):
            raise RigError(f"{at} ({name}): key 'rig' must be the node's rig folder as an absolute path, got {rig!r}")
        unknown = sorted(set(n) - {"name", "rig"})
        if unknown:
            raise RigError(f"{at} ({name}): unknown key(s) {', '.join(unknown)}; a node has 'name' and 'rig'")
        if name in seen:
            raise RigError(f"{at}: node '{name}' is listed twice")
        seen.add(name)
        nodes.append(NodeSpec(name.strip(), rig))
    return FleetSpec(tuple(nodes), d.get("manifest", ""), d.get("upstream", ""), d.get("engine", ""))
