"""The rig folder: rig.toml (model + replicas, hand-editable) and manifest.json (docs/architecture.md).

rig.toml:

    schema = 1
    [model]                 # the primary: the engine's -m file, source 0
    path = "/abs/internal/model.gguf"
    name = "internal"       # drive label used by iobench groups and tables
    layout = "file"         # or "gguf-split" (path: the set's first file) or "dir" (path: the directory)
    format = "gguf"         # "gguf", "safetensors" or "raw"
    files = ["model.gguf"]  # every file of the model, relative to the path's directory (dir: to the path)
    [[replica]]             # in engine order: source 1, source 2
    path = "/abs/green/model.gguf"
    name = "green"
    holds = ["model-00003-of-00009.safetensors"]   # a partial replica: the files it holds (absent: all)
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass, replace

import tomli_w

from .constants import (
    BENCH_DIR,
    DEFAULT_RIG,
    MANIFEST_FILE,
    PLANS_DIR,
    RIG_ENV,
    RIG_FILE,
    RIG_SCHEMA,
    RUNS_DIR,
    SCRUB_FILE,
    STAMPS_DIR,
    USAGE_DIR,
    VERDICTS_FILE,
)
from .errors import MissingError, RigError, UsageError
from .fsutil import atomic_write_text, describe_link


@dataclass(frozen=True)
class Member:
    path: str        # absolute path of the file
    name: str        # drive label
    role: str        # 'primary' or 'replica'
    # A partial replica: the model's files (relative paths) this member holds; None: every file.
    # A file outside it is not the member's, so it is never "missing" there (docs/replicas.md).
    holds: tuple[str, ...] | None = None

    @property
    def partial(self) -> bool:
        return self.holds is not None

    def holds_file(self, rel: str) -> bool:
        return self.holds is None or rel in self.holds


@dataclass(frozen=True)
class Rig:
    root: str
    model: Member | None = None
    replicas: tuple[Member, ...] = ()
    # The model's layout (models.modelset says what they mean); a rig written before models
    # could be several files has none of them: one file.
    layout: str = "file"
    format: str = ""
    files: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[Member, ...]:
        return ((self.model,) if self.model else ()) + self.replicas

    @property
    def rig_file(self) -> str:
        return os.path.join(self.root, RIG_FILE)

    @property
    def manifest_file(self) -> str:
        return os.path.join(self.root, MANIFEST_FILE)

    # The folders each stage writes (docs/architecture.md, the rig folder). Reading code uses these names;
    # writing code asks `subdir()` so the folder exists.
    @property
    def bench_dir(self) -> str:
        return os.path.join(self.root, BENCH_DIR)

    @property
    def plans_dir(self) -> str:
        return os.path.join(self.root, PLANS_DIR)

    @property
    def runs_dir(self) -> str:
        return os.path.join(self.root, RUNS_DIR)

    @property
    def usage_dir(self) -> str:
        return os.path.join(self.root, USAGE_DIR)

    @property
    def stamps_dir(self) -> str:
        return os.path.join(self.root, STAMPS_DIR)

    @property
    def verdicts_file(self) -> str:
        return os.path.join(self.root, VERDICTS_FILE)

    @property
    def scrub_file(self) -> str:
        return os.path.join(self.root, SCRUB_FILE)

    def subdir(self, name: str) -> str:
        """rig/bench, rig/plans, rig/profiles, rig/runs, rig/stamps (created on demand)."""
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        return path

    def timestamped_files(self, name: str) -> list[str]:
        """The JSON files a stage wrote in rig/NAME (bench, plans), oldest first: their names are
        fixed-width UTC timestamps, so name order is time order. Hidden temporaries are skipped."""
        d = os.path.join(self.root, name)
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return []
        return [os.path.join(d, n) for n in names]

    def resolve(self, ref: str, name: str, noun: str, remedy: str) -> str:
        """What users type for a file a stage wrote (a plan, an iobench result), the same in every
        tool: a path, 'latest' (the newest in rig/NAME), or its name in rig/NAME (with or without
        .json). MissingError (exit 3) when nothing matches, saying where it looked and `remedy`."""
        if os.path.lexists(ref) and ref != "latest":
            return os.path.abspath(ref)        # a file, or a path of another kind its loader names
        d = os.path.join(self.root, name)
        if ref == "latest":
            files = self.timestamped_files(name)
            if not files:
                raise MissingError(f"no {noun}s in {d}: {remedy}")
            return files[-1]
        for cand in (os.path.join(d, ref), os.path.join(d, ref + ".json"), os.path.join(self.root, ref)):
            if os.path.isfile(cand):
                return cand
        raise MissingError(f"{ref}: no such {noun} file, nor one of that name in {d}; give a file, its name there, or 'latest'")

    def member(self, path_or_name: str) -> Member:
        real = os.path.realpath(path_or_name)
        for m in self.members:
            if m.name == path_or_name or os.path.realpath(m.path) == real:
                return m
        raise UsageError(f"{path_or_name} is not a member of the rig at {self.root}; members: "
                         + (", ".join(f"{m.name}={m.path}" for m in self.members) or "none (run `replicas sync`)"))


def rig_dir(option: str | None = None) -> str:
    """--rig DIR, else $REPLICA_TUNER_RIG, else ./rig; returned absolute. A folder that need not
    exist yet, but a path whose nearest existing part is not a folder (a file given by mistake)
    is refused here, once for every command, naming where the path came from."""
    given = option or os.environ.get(RIG_ENV) or DEFAULT_RIG
    root = os.path.abspath(given)
    where = "--rig" if option else (f"${RIG_ENV}" if os.environ.get(RIG_ENV) else "the default rig")
    check_folder_path(root, f"{where} {given}", "give the rig folder (the one holding rig.toml), or a new folder's path")
    return root


def check_folder_path(path: str, what: str, fix: str) -> None:
    """Refuse a folder path that is not one, or that runs through something that is not one (it
    can never be a folder), saying what it is: a file, a fifo, a symbolic link loop, a link to
    nowhere."""
    part = path
    while part and not os.path.lexists(part):
        parent = os.path.dirname(part)
        if parent == part:
            return
        part = parent
    if part and not os.path.isdir(part):
        kind = describe_link(part) or _kind_of(part)
        where = f"is {kind}" if part == path else f"runs through {part}, {kind}"
        raise UsageError(f"{what}: {where}, not a folder; {fix}")


def _kind_of(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"a path that cannot be read ({e.strerror or e})"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a file"


def _bad(where: str, key: str, what: str) -> RigError:
    return RigError(f"{where}: key '{key}' {what}; fix the file or recreate it with `replicas init`")


def parse_rig(text: str, root: str, where: str) -> Rig:
    """Parse rig.toml text (pure): every problem names the file, the key and what is wrong."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RigError(f"{where}: not valid TOML ({e}); fix the file or recreate it with `replicas init`") from None
    schema = doc.get("schema", RIG_SCHEMA)
    if schema != RIG_SCHEMA:
        raise _bad(where, "schema", f"is {schema!r}, this version reads {RIG_SCHEMA}")
    unknown = set(doc) - {"schema", "model", "replica"}
    if unknown:
        raise _bad(where, sorted(unknown)[0], "is not known (expected schema, [model], [[replica]])")

    def member(d, key, role):
        if not isinstance(d, dict):
            raise _bad(where, key, "must be a table")
        known = {"path", "name"} | (set(MODEL_KEYS) if role == "primary" else {"holds"})
        extra = set(d) - known
        if extra:
            raise _bad(where, f"{key}.{sorted(extra)[0]}", f"is not known (expected {', '.join(sorted(known))})")
        path = d.get("path")
        if not isinstance(path, str) or not path:
            raise _bad(where, f"{key}.path", "is missing or not a string")
        if not os.path.isabs(path):
            raise _bad(where, f"{key}.path", f"must be an absolute path, got {path!r}")
        name = d.get("name", "")
        if not isinstance(name, str) or not name or any(c in name for c in ",= *"):
            raise _bad(where, f"{key}.name", f"must be a non-empty label without ',', '=', '*' or spaces, got {name!r}")
        holds = d.get("holds")
        if holds is not None:
            if not isinstance(holds, list) or not all(isinstance(f, str) and f for f in holds) \
                    or len(set(holds)) != len(holds):
                raise _bad(where, f"{key}.holds", "must be a list of the model's files, each once")
            holds = tuple(sorted(holds))
        return Member(path=path, name=name, role=role, holds=holds)

    model = member(doc["model"], "model", "primary") if "model" in doc else None
    layout, fmt, files = _model_keys(doc.get("model") or {}, where)
    reps = doc.get("replica", [])
    if not isinstance(reps, list):
        raise _bad(where, "replica", "must be an array of tables ([[replica]])")
    replicas = tuple(member(r, f"replica[{i}]", "replica") for i, r in enumerate(reps))
    for i, r in enumerate(replicas):
        stray = sorted(set(r.holds or ()) - set(files)) if files else []
        if stray:
            raise _bad(where, f"replica[{i}].holds", f"names {stray[0]!r}, which is not one of model.files")
    if replicas and model is None:
        raise _bad(where, "model", "is missing but replicas are listed")
    seen_names, seen_paths = {}, {}
    for i, m in enumerate(((model,) if model else ()) + replicas):
        key = "model" if m.role == "primary" else f"replica[{i - 1}]"
        if m.name in seen_names:
            raise _bad(where, f"{key}.name", f"repeats {m.name!r} (also {seen_names[m.name]})")
        if m.path in seen_paths:
            raise _bad(where, f"{key}.path", f"repeats {m.path!r} (also {seen_paths[m.path]})")
        seen_names[m.name] = key
        seen_paths[m.path] = key
    return Rig(root=root, model=model, replicas=replicas, layout=layout, format=fmt, files=files)


MODEL_KEYS = ("layout", "format", "files")
LAYOUTS = ("file", "gguf-split", "dir")


def _model_keys(d: dict, where: str) -> tuple[str, str, tuple[str, ...]]:
    layout = d.get("layout", "file")
    if layout not in LAYOUTS:
        raise _bad(where, "model.layout", f"is {layout!r}; expected one of {', '.join(LAYOUTS)}")
    fmt = d.get("format", "")
    if not isinstance(fmt, str):
        raise _bad(where, "model.format", "is not a string")
    files = d.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        raise _bad(where, "model.files", "must be a list of relative paths")
    for f in files:
        parts = f.split("/")
        if f.startswith("/") or ".." in parts or "" in parts:
            raise _bad(where, "model.files", f"holds {f!r}; each must be a plain relative path inside the model")
    if len(set(files)) != len(files):
        raise _bad(where, "model.files", "repeats a file")
    if layout != "file" and not files:
        raise _bad(where, "model.files", f"is missing; a {layout} model lists its files")
    return layout, fmt, tuple(files)


def render_rig(rig: Rig) -> str:
    doc: dict = {"schema": RIG_SCHEMA}
    if rig.model:
        doc["model"] = {"path": rig.model.path, "name": rig.model.name}
        if rig.format:
            doc["model"] |= {"layout": rig.layout, "format": rig.format, "files": list(rig.files)}
    if rig.replicas:
        doc["replica"] = [{"path": m.path, "name": m.name} | ({"holds": list(m.holds)} if m.partial else {})
                          for m in rig.replicas]
    head = "# replica-tuner rig: the model (primary, the engine's -m) and its replicas, in engine order.\n"
    return head + tomli_w.dumps(doc)


def load_rig(root: str, must_exist: bool = True) -> Rig:
    """rig.toml, by README's table as every rig file (core.jsonfile): missing is exit 3 (a rig
    file missing — with `must_exist`; else an empty rig); there but not readable as text (a
    folder, permissions, a link loop, not UTF-8) is exit 2, one line naming the file."""
    path = os.path.join(root, RIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if must_exist:
            raise MissingError(f"no rig at {root} ({RIG_FILE} missing): run `replicas init --rig {root} --model PATH` or "
                               "`replicas sync`, or pass --rig") from None
        return Rig(root=root)
    except UnicodeDecodeError:
        raise RigError(f"{path}: not UTF-8 text; fix the file or recreate it with `replicas init`") from None
    except IsADirectoryError:
        raise RigError(f"{path}: a folder where a file was expected; move it away and recreate the file with "
                       "`replicas init`") from None
    except OSError as e:
        raise RigError(f"{path}: cannot be read ({e.strerror or e}); fix its permissions or recreate it with "
                       "`replicas init`") from None
    return parse_rig(text, root, path)


def save_rig(rig: Rig) -> None:
    os.makedirs(rig.root, exist_ok=True)
    atomic_write_text(rig.rig_file, render_rig(rig))


def unique_name(wanted: str, taken: set[str]) -> str:
    base = "".join(c if c.isalnum() or c in "-_." else "-" for c in wanted) or "drive"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


def with_model(rig: Rig, path: str, name: str, layout: str = "file", fmt: str = "",
               files: tuple[str, ...] = ()) -> Rig:
    """The rig with its model (primary) set; a rig that already has this model is returned with
    the layout filled in if it had none (a rig written before multi-file models)."""
    path = os.path.abspath(path)
    if rig.model and os.path.realpath(rig.model.path) == os.path.realpath(path):
        return rig if rig.format or not fmt else replace(rig, layout=layout, format=fmt, files=tuple(files))
    if rig.model:
        raise UsageError(f"the rig at {rig.root} already has model {rig.model.path}; use another --rig for {path}")
    taken = {m.name for m in rig.replicas}
    return replace(rig, model=Member(path, unique_name(name, taken), "primary"), layout=layout, format=fmt,
                   files=tuple(files))


def with_replica(rig: Rig, path: str, name: str, holds: tuple[str, ...] | None = None, *,
                 keep_holds: bool = True) -> Rig:
    """The rig with this replica; `holds`: the files a partial replica holds (None: every file).
    An existing member keeps what it holds unless `keep_holds` is False (sync set it again)."""
    path = os.path.abspath(path)
    holds = tuple(sorted(holds)) if holds is not None else None
    for i, m in enumerate(rig.members):
        if os.path.realpath(m.path) == os.path.realpath(path):
            if keep_holds or m.role != "replica" or m.holds == holds:
                return rig
            k = i - (1 if rig.model else 0)
            return replace(rig, replicas=rig.replicas[:k] + (replace(m, holds=holds),) + rig.replicas[k + 1:])
    taken = {m.name for m in rig.members}
    return replace(rig, replicas=rig.replicas + (Member(path, unique_name(name, taken), "replica", holds),))
