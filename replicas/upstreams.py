"""Recording and checking the model's upstream digests (the I/O around `upstream.py`).

`record_upstream` reads them from what the user has (a Hugging Face cache snapshot, a sha256sum
file, an OCI image manifest) into rig/upstream.json; `check_upstream` hashes one copy of the model
with the published algorithm (SHA-256, or the git blob SHA-1 of a small Hugging Face file) in one
cold sequential pass per file: BLAKE3 pieces cannot give a SHA-256, so this is a pass of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading

from core.coldio import open_cold, read_sequential
from core.constants import UPSTREAM_FILE
from core.errors import Interrupted, RigError, UsageError
from core.events import Progress, Reporter, emit
from core.fsutil import read_text
from core.jsonfile import read_json, write_json
from core.rig import Rig
from models.modelset import member_files

from .manifest import ModelManifest
from .upstream import (GIT_SHA1, UPSTREAM_KIND, UPSTREAM_SCHEMA, Upstream, UpstreamCheck, algorithm_of, judge_upstream,
                       parse_oci, parse_sums, upstream_from_dict, upstream_of, upstream_to_dict)


def record_upstream(source: str, manifest: ModelManifest) -> Upstream:
    """The published digests of the manifest's files, from `source`: a Hugging Face snapshot folder
    (its symlinks' blob names), a sha256sum file or an OCI image manifest (JSON)."""
    names = manifest.names
    if os.path.isdir(source):
        found = {}
        for name in names:
            link = os.path.join(source, name)
            if os.path.islink(link):
                blob = os.path.basename(os.readlink(link))
                if algorithm_of(blob):
                    found[name] = blob
        if not found:
            raise UsageError(f"{source}: no file of the model is a link to a Hugging Face blob (blobs/<sha256>); give "
                             "the snapshot folder (…/models--ORG--NAME/snapshots/REVISION), a sha256sum file or an OCI manifest")
        return upstream_of(found, names, os.path.abspath(source))
    text = read_text(source, "file of published digests",
                     "give a Hugging Face snapshot folder, a sha256sum file or an OCI manifest")
    where = os.path.abspath(source)
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise RigError(f"{source}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return upstream_of(parse_oci(doc, source, {f.name: f.size for f in manifest.files}), names, where)
    return upstream_of(parse_sums(text, source), names, where)


def save_upstream(rig: Rig, upstream: Upstream) -> str:
    os.makedirs(rig.root, exist_ok=True)
    return write_json(os.path.join(rig.root, UPSTREAM_FILE), upstream_to_dict(upstream))


def load_upstream(path: str) -> Upstream:
    doc = read_json(path, UPSTREAM_KIND, "write it with `replicas upstream SOURCE`", schema=UPSTREAM_SCHEMA,
                    what="upstream digests")
    return upstream_from_dict(doc, path)


class _Digest:
    """One file's upstream digest taken as bytes pass (the git blob header needs the size first)."""

    def __init__(self, algorithm: str, size: int):
        self.h = hashlib.sha1() if algorithm == GIT_SHA1 else hashlib.sha256()
        if algorithm == GIT_SHA1:
            self.h.update(f"blob {size}\0".encode())     # git's blob header: what a Hugging Face small file's etag hashes
        self.fed = 0

    def update(self, data) -> None:
        self.h.update(data)
        self.fed += len(data)


class UpstreamTap:
    """Upstream digests taken on verify's own read (`verify_members(tap=...)`): a whole-file cold
    read of a listed file of `members` (core.rig.Member, each the files it holds) feeds its SHA-256 too, so a --full verify
    costs no second pass. `known(model_path)` gives the digests of the files read whole; the others
    (stamp-trusted in a quick verify, sampled, resumed) still need `check_upstream`'s own pass."""

    def __init__(self, members, manifest: ModelManifest, upstream: Upstream):
        listed = {f.path: f for f in upstream.files}
        self.files: dict[str, tuple[str, str]] = {}        # abs path -> (model path, relative path)
        self.algorithms = {}
        for m in members:                                  # a partial replica: the files it holds only
            mp = m.path
            for rel, path, _ in member_files(m, manifest):
                if rel in listed:
                    self.files[path] = (mp, rel)
                    self.algorithms[path] = listed[rel].algorithm
        self.taken: dict[str, _Digest] = {}

    def __call__(self, path: str):
        if path not in self.files:
            return None
        try:
            size = os.path.getsize(path)
        except OSError:
            return None
        d = self.taken[path] = _Digest(self.algorithms[path], size)
        return d.update

    def known(self, model_path: str) -> dict[str, str]:
        """{relative path: hex} of `model_path`'s files whose every byte went through the tap."""
        out = {}
        for path, d in self.taken.items():
            mp, rel = self.files[path]
            try:
                whole = d.fed == os.path.getsize(path)
            except OSError:
                whole = False
            if mp == model_path and whole:
                out[rel] = d.h.hexdigest()
        return out


def digest_file(path: str, algorithm: str, report: Reporter = None, cancel: threading.Event | None = None) -> tuple[str, int]:
    """(hex digest, bytes read) of a file by `algorithm`, read once, cold. OSError if unreadable."""
    with open_cold(path) as reader:
        size = reader.size
        d = _Digest(algorithm, size)
        for _, view in read_sequential(reader, 0, size, cancel=cancel):
            d.update(view)
            emit(report, Progress(path, "upstream", d.fed, size))
        if cancel is not None and cancel.is_set():
            raise Interrupted(f"hashing {path} cancelled")
    return d.h.hexdigest(), d.fed


def check_upstream(member, manifest: ModelManifest, upstream: Upstream, report: Reporter = None,
                   cancel: threading.Event | None = None, known: dict[str, str] | None = None) -> UpstreamCheck:
    """A member's copy of the model (core.rig.Member) against its upstream digests: the files it
    holds (a partial replica's own set; the files it never holds are not its to have, so they are
    not "missing", `models.modelset.member_files`); `known`: digests already taken on another read
    ({relative path: hex}, `UpstreamTap.known`), not read again."""
    model_path = member.path
    found: dict[str, str | None] = dict(known or {})
    total = 0
    listed = {f.path: f for f in upstream.files}
    for rel, path, _ in member_files(member, manifest):
        if rel not in listed or rel in found:
            continue
        try:
            found[rel], n = digest_file(path, listed[rel].algorithm, report, cancel)
            total += n
        except OSError:
            found[rel] = None
    check = judge_upstream(upstream, found, model_path, holds=member.holds_file)
    return UpstreamCheck(check.state, check.problems, check.checked, total)
