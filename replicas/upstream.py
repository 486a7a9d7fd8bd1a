"""The model's upstream identity: the digests its publisher gives for each file (pure).

A manifest proves replicas identical to each other (BLAKE3 per piece); these digests tie the
model to what was published. They come from where the user has them (docs/replicas.md):

- a Hugging Face cache snapshot: each file is a symlink to `blobs/<etag>`, and the etag is the
  file's SHA-256 for a Git LFS file (64 hex digits) or its git blob SHA-1 for a small file (40),
  the layout https://huggingface.co/docs/hub/local-cache describes;
- a `sha256sum`-style file (`HEX  NAME` or `HEX *NAME` lines);
- an OCI image manifest (`layers[]`, each `digest: "sha256:HEX"`, `size`, and the file's name in
  the `org.opencontainers.image.title` annotation; without titles a layer is matched by its size
  when exactly one file of the model has it).

SHA-256 is not BLAKE3, so checking these needs its own pass over the bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from core.errors import RigError

UPSTREAM_SCHEMA = 1
UPSTREAM_KIND = "upstream"
SHA256, GIT_SHA1 = "sha256", "git-sha1"
ALGORITHMS = (SHA256, GIT_SHA1)
OCI_TITLE = "org.opencontainers.image.title"
_HEX = {SHA256: re.compile(r"[0-9a-f]{64}"), GIT_SHA1: re.compile(r"[0-9a-f]{40}")}


@dataclass(frozen=True)
class UpstreamFile:
    path: str          # the file's path in the model (the manifest's name)
    algorithm: str     # sha256 / git-sha1
    digest: str        # hex


@dataclass(frozen=True)
class Upstream:
    files: tuple[UpstreamFile, ...]
    source: str = ""   # where the digests were read (a snapshot folder, a sums file, an OCI manifest)
    schema: int = UPSTREAM_SCHEMA

    KIND: ClassVar[str] = UPSTREAM_KIND      # the result `replicas upstream --json` prints: the file's document
    SCHEMA: ClassVar[int] = UPSTREAM_SCHEMA

    def to_dict(self) -> dict:
        return upstream_to_dict(self)

    def file(self, path: str) -> UpstreamFile | None:
        return next((f for f in self.files if f.path == path), None)


def algorithm_of(hexdigest: str) -> str | None:
    """sha256 for 64 hex digits, git-sha1 for 40 (a Hugging Face blob's name), else None."""
    h = hexdigest.lower()
    return next((a for a in ALGORITHMS if _HEX[a].fullmatch(h)), None)


def parse_sums(text: str, where: str) -> dict[str, str]:
    """`sha256sum` lines -> {name: hex}; blank and '#' lines are skipped, anything else refused."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"\s*([0-9a-fA-F]{64}) [ *](.+)", line)
        if not m:
            raise RigError(f"{where}:{n}: not a sha256sum line (HEX  NAME): {line[:80]!r}")
        out[m.group(2).removeprefix("./")] = m.group(1).lower()
    return out


def parse_oci(doc: dict, where: str, sizes: dict[str, int]) -> dict[str, str]:
    """An OCI image manifest's layers -> {model file: sha256 hex}, by title, else by a size only one
    of the model's files (`sizes`: name -> bytes) has."""
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers:
        raise RigError(f"{where}: no 'layers' list: not an OCI image manifest")
    out = {}
    for i, layer in enumerate(layers):
        digest = str(layer.get("digest", "")) if isinstance(layer, dict) else ""
        algo, _, hexd = digest.partition(":")
        if algo != SHA256 or algorithm_of(hexd) != SHA256:
            raise RigError(f"{where}: layers[{i}]: digest {digest!r} is not sha256:HEX")
        title = (layer.get("annotations") or {}).get(OCI_TITLE)
        if title:
            out[title] = hexd.lower()
            continue
        same = [name for name, size in sizes.items() if size == layer.get("size")]
        if len(same) == 1:
            out[same[0]] = hexd.lower()
    return out


def upstream_of(digests: dict[str, str], names: tuple[str, ...], source: str) -> Upstream:
    """The upstream digests of the model's files (`names`), from {name: hex} as a source lists them.
    A file the source does not list is left out (it has no published digest); a source listing none
    of the model's files is refused."""
    files = []
    for name in names:
        hexd = digests.get(name)
        if hexd is None:
            continue
        algo = algorithm_of(hexd)
        if algo is None:
            raise RigError(f"{source}: {name}: {hexd!r} is neither a SHA-256 nor a git SHA-1")
        files.append(UpstreamFile(name, algo, hexd.lower()))
    if not files:
        raise RigError(f"{source}: lists none of the model's files ({', '.join(names[:3])}"
                       f"{', ...' if len(names) > 3 else ''}); give the model's own snapshot, sums file or OCI manifest")
    return Upstream(tuple(files), source)


def upstream_to_dict(u: Upstream) -> dict:
    return {"schema": u.schema, "kind": UPSTREAM_KIND, "source": u.source,
            "files": [{"path": f.path, "algorithm": f.algorithm, "digest": f.digest} for f in u.files]}


def upstream_from_dict(d: dict, where: str = "upstream.json") -> Upstream:
    if not isinstance(d, dict) or d.get("schema") != UPSTREAM_SCHEMA or d.get("kind") != UPSTREAM_KIND:
        raise RigError(f"{where}: not an upstream digests file (schema {UPSTREAM_SCHEMA}, kind {UPSTREAM_KIND}); "
                       "write it with `replicas upstream SOURCE`")
    files = []
    for i, f in enumerate(d.get("files") or ()):
        try:
            path, algo, hexd = f["path"], f["algorithm"], f["digest"]
        except (TypeError, KeyError):
            raise RigError(f"{where}: files[{i}]: needs path, algorithm and digest") from None
        if algo not in ALGORITHMS or algorithm_of(hexd) != algo:
            raise RigError(f"{where}: files[{i}] ({path}): {algo} digest {hexd!r} is malformed")
        files.append(UpstreamFile(path, algo, hexd))
    if not files:
        raise RigError(f"{where}: lists no files; write it with `replicas upstream SOURCE`")
    return Upstream(tuple(files), str(d.get("source", "")))


@dataclass(frozen=True)
class UpstreamCheck:
    """One copy of the model against its upstream digests: 'match' when every listed file's digest
    is the published one, 'mismatch' when any differs, 'missing' when a listed file is not there."""
    state: str
    problems: tuple[str, ...] = ()
    checked: int = 0          # files hashed
    bytes_read: int = 0


def judge_upstream(upstream: Upstream, found: dict[str, str | None], where: str, holds=None) -> UpstreamCheck:
    """found: {path: hex computed, None when the file could not be read}; `holds(path)`: whether
    the copy holds that file (a partial replica holds some; None: every file)."""
    problems, state = [], "match"
    for f in upstream.files:
        if holds is not None and not holds(f.path):
            continue
        got = found.get(f.path)
        if got is None:
            problems.append(f"{where}: {f.path}: missing or unreadable, its upstream {f.algorithm} is {f.digest}")
            state = "mismatch" if state == "mismatch" else "missing"
        elif got != f.digest:
            problems.append(f"{where}: {f.path}: {f.algorithm} {got} is not the published {f.digest}")
            state = "mismatch"
    return UpstreamCheck(state, tuple(problems), checked=sum(v is not None for v in found.values()))
