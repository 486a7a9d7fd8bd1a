"""The rig's manifest.json: reading and writing it (the Manifest noun and its maths are in manifest.py)."""

from __future__ import annotations

import os
from dataclasses import replace

from core.errors import UsageError
from core.jsonfile import read_json, write_json
from core.rig import Rig
from models.modelset import DIR

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


def files_of_model(manifest: ModelManifest, paths: list[str]) -> tuple[str, ModelManifest] | None:
    """Files given one by one that are files of a directory model the manifest describes: (the
    model's folder, the manifest of just those files), so each is checked against its own entry.
    None when the manifest is not of a directory model (a file of a split set names the whole set,
    as everywhere) or a path is not a regular file (the model given whole). A file that matches no
    entry, or files of two different copies, are refused."""
    if manifest.layout != DIR or not all(os.path.isfile(p) for p in paths):
        return None
    roots, picked = set(), []
    for p in paths:
        p = os.path.abspath(p)
        hits = [f for f in manifest.files if p.endswith(os.sep + f.name.replace("/", os.sep))]
        if not hits:
            raise UsageError(f"{p}: not a file of the directory model the manifest lists "
                             f"({', '.join(manifest.names[:3])}{', ...' if len(manifest.names) > 3 else ''}); "
                             f"give one of its files or the model's folder")
        roots.add(p[:-len(hits[0].name) - 1])
        picked.append(hits[0])
    if len(roots) > 1:
        raise UsageError(f"the files given lie in {len(roots)} different copies of the model; give the files of one")
    return roots.pop(), replace(manifest, files=tuple(f for f in manifest.files if f in picked))
