"""The rig's manifest.json: reading and writing it (the Manifest noun and its maths are in manifest.py)."""

from __future__ import annotations

import os

from core.jsonfile import read_json, write_json
from core.rig import Rig

from .constants import MANIFEST_SCHEMAS
from .manifest import ModelManifest, manifest_from_dict, model_manifest_to_dict


def load_manifest(rig: Rig, required: bool = True) -> ModelManifest | None:
    """The rig's manifest; None when it does not exist and is not `required` (missing: exit 3)."""
    path = rig.manifest_file
    if not required and not os.path.lexists(path):
        return None
    doc = read_json(path, "manifest", "run `replicas sync` (it hashes the model) to re-create it",
                    schema=MANIFEST_SCHEMAS, kind_key=None)
    return manifest_from_dict(doc, path)


def load_manifest_file(path: str) -> ModelManifest:
    """A manifest given by path: the portable form of manifest.json, the same JSON shape (copy
    rig/manifest.json to another host, or save `replicas hash --json FILE`). Missing: exit 3."""
    doc = read_json(path, "manifest", "give a manifest.json from a rig, or one saved from `replicas hash --json FILE`",
                    schema=MANIFEST_SCHEMAS, kind_key=None)
    return manifest_from_dict(doc, path)


def save_manifest(rig: Rig, manifest: ModelManifest) -> None:
    os.makedirs(rig.root, exist_ok=True)
    write_json(rig.manifest_file, model_manifest_to_dict(manifest))
