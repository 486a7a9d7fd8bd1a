"""Reading a model's tensor table from its files' headers (the I/O around `models.geometry`).

GGUF through the gguf library (it maps the file and parses the header; tensor data is never
touched, so this is cheap on a 500 GB file and works on a sparse header-only copy); every member
of a split set is read and each tensor keeps the member that holds it, its offset absolute within
that file. safetensors through each shard's JSON header (no torch): data starts at 8 + the header
length, so a tensor's absolute offset is that plus its `data_offsets[0]`; `config.json` in the
model's directory gives experts per token and the like.
"""

from __future__ import annotations

import json
import os

from core.errors import MissingError, RigError, UsageError

from .formats import GGUF, SAFETENSORS, read_safetensors_header
from .geometry import Geometry, TensorInfo, TensorTable, geometry_from_table
from .modelset import DIR, ModelSet, discover

CONFIG_JSON = "config.json"


def inspect_model(path: str | ModelSet) -> Geometry:
    """The routed-expert geometry of the model at `path` (a GGUF file, any member of a split set,
    a safetensors directory) or of a ModelSet; one clear error line when it has none."""
    if isinstance(path, str) and not os.path.lexists(path):
        raise MissingError(f"{path}: model not found; give the model's file, a member of its split set, or its directory")
    model = path if isinstance(path, ModelSet) else discover(path)
    return geometry_from_table(read_tensor_table(model))


def read_tensor_table(model: ModelSet) -> TensorTable:
    if model.format == GGUF:
        return _gguf_table(model)
    if model.format == SAFETENSORS:
        return _safetensors_table(model)
    raise UsageError(f"{model.path}: a {model.format} model has no tensor table to read; give a GGUF file or set, or a "
                     "safetensors directory")


def _size(model: ModelSet) -> int:
    return sum(os.path.getsize(p) for p in model.paths)


def _file_sizes(model: ModelSet) -> tuple[tuple[str, int], ...]:
    return tuple((rel, os.path.getsize(p)) for rel, p in zip(model.files, model.paths))


def open_gguf(path: str):
    """A gguf.GGUFReader on `path`, or one error line naming the file and the fix."""
    import gguf

    if not os.path.exists(path):
        raise MissingError(f"{path}: model not found; give the path of a GGUF file (make one with `engine-bridge synth`)")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: not a regular file; give a GGUF model file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UsageError(f"{path}: not a GGUF file (magic {magic!r}); give a .gguf model (make one with `engine-bridge synth`)")
    try:
        return gguf.GGUFReader(path, "r")
    except ValueError as e:
        if "GGMLQuantizationType" in str(e):
            raise UsageError(f"{path}: a tensor type this gguf library does not know ({e}); upgrade the gguf package") from None
        raise UsageError(f"{path}: damaged or truncated GGUF header (ValueError: {e}); re-copy or re-create the file") from None
    except Exception as e:  # the library raises IndexError/struct errors/... on damaged headers
        raise UsageError(f"{path}: damaged or truncated GGUF header ({type(e).__name__}: {e}); re-copy or re-create the "
                         f"file") from None


def _scalar(field):
    try:
        v = field.contents()
    except Exception:          # array fields of unusual types: the geometry needs only scalars
        return None
    return v if isinstance(v, (int, float, str, bool)) else None


def _gguf_table(model: ModelSet) -> TensorTable:
    tensors: list[TensorInfo] = []
    meta: dict = {}
    alignment = 0
    for rel, p in zip(model.files, model.paths):
        r = open_gguf(p)
        size = os.path.getsize(p)
        end = max((t.data_offset + t.n_bytes for t in r.tensors), default=r.data_offset)
        if end > size:
            raise UsageError(f"{p}: truncated: tensor data ends at byte {end} but the file has {size}; re-copy or re-create it")
        for k, f in r.fields.items():
            if k not in meta and not k.startswith("tokenizer."):
                v = _scalar(f)
                if v is not None:
                    meta[k] = v
        alignment = alignment or int(r.alignment)
        tensors += [TensorInfo(t.name, rel, int(t.data_offset), int(t.n_bytes), t.tensor_type.name,
                               tuple(int(x) for x in t.shape)) for t in r.tensors]
    return TensorTable(model.path, GGUF, model.layout, _size(model), str(meta.get("general.architecture", "?")),
                       alignment, tuple(tensors), meta, _file_sizes(model))


def _safetensors_table(model: ModelSet) -> TensorTable:
    tensors: list[TensorInfo] = []
    for rel, p in zip(model.files, model.paths):
        if not rel.endswith(".safetensors"):
            continue
        h = read_safetensors_header(p)
        for name, t in h.tensors.items():
            b, e = t["data_offsets"]
            tensors.append(TensorInfo(name, rel, h.data_start + b, e - b, str(t.get("dtype", "?")),
                                      tuple(int(x) for x in t.get("shape", ()))))
    meta = _config(model)
    return TensorTable(model.path, SAFETENSORS, model.layout, _size(model), str(meta.get("model_type", "?")), 1,
                       tuple(tensors), meta, _file_sizes(model))


def _config(model: ModelSet) -> dict:
    """config.json of a directory model, a multimodal model's text_config merged over it; {} when absent."""
    if model.layout != DIR or CONFIG_JSON not in model.files:
        return {}
    p = model.abs(CONFIG_JSON)
    try:
        with open(p, encoding="utf-8") as f:
            doc = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RigError(f"{p}: not JSON ({e}); re-download the model's config.json") from None
    if not isinstance(doc, dict):
        raise RigError(f"{p}: not a JSON object; re-download the model's config.json")
    text = doc.get("text_config")
    return {**doc, **text} if isinstance(text, dict) else doc
