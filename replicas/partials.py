"""`replicas sync --partial`: the facts a partial replica is chosen from, read from the disk
(docs/replicas.md, "Partial replicas"); the choice itself is `partial.choose_partial` (pure).

- the model's routed experts, from its headers (`models.tensortable.inspect_model`);
- the usage history: the rig's `usage/*.json` (each embedded-engine run or replay on the rig's
  model) and the history a target engine keeps in the model's directory, read only through the
  engine that writes it (`Engine.usage_file`, `Engine.read_usage`: colibri's `.coli_usage`);
- the drives' ceilings: the newest iobench result in the rig, read by its documented JSON shape
  (`drives[].drive.key` and `drives[].presets.<preset>.bw_bytes`, iobench/result.py): replicas
  sits below iobench, so it reads the file, not the module;
- the budget: SIZE (binary units), PCT% of the model, or `auto` (the destination's free space,
  plus what the member already holds, less a reserve).
"""

from __future__ import annotations

import os

from core import rig as rigmod
from core.errors import RigError, UsageError
from core.events import Notice, Reporter, emit
from core.fsutil import free_bytes
from core.jsonfile import read_json
from core.units import format_bytes, parse_size
from engines.registry import ENGINES, engine_for_model, get_engine
from models.modelset import DIR, ModelSet
from models.tensortable import inspect_model
from models.usage import USAGE_KIND, Usage, split_history, usage_from_dict

from .partial import ExpertTable, PartialChoice, ShardUse, choose_partial
from .syncfacts import drive_key
from .syncplan import headroom

CEILING_PRESETS = ("decode", "prefill", "seq")    # a partial replica serves misses: decode's shape first


def no_history() -> str:
    """What sync says when there is no history, naming the engines that keep one of their own."""
    keepers = "".join(f", or {e.name}, which keeps {e.usage_file}" for e in ENGINES.values() if e.usage_file)
    return ("no usage history yet: shards ranked evenly by their routed-expert bytes; run the model "
            f"(`engine-bridge run` or `replay` with this rig{keepers}) and sync --partial again to re-balance")


def load_history(rig: rigmod.Rig, model: ModelSet, layers: int, experts: int,
                 report: Reporter = None) -> list[Usage]:
    """Every usage record of this model: the rig's, then each engine's own history in the model's
    directory (`Engine.usage_file`; one line per file that cannot be used, and it is skipped)."""
    out = []
    for path in rig.timestamped_files(os.path.basename(rig.usage_dir)):
        try:
            out.append(usage_from_dict(read_json(path, USAGE_KIND, "delete it or run the model again"), path))
        except (ValueError, RigError) as e:
            emit(report, Notice(path, f"usage record skipped: {e}"))
    if model.layout != DIR:
        return out
    for e in ENGINES.values():
        if not e.usage_file or e.read_usage is None:
            continue
        path = os.path.join(model.path, e.usage_file)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        except OSError as err:
            emit(report, Notice(path, f"{e.name}'s usage history skipped: {err.strerror or err}"))
            data = None
        if data:
            try:
                out.append(e.read_usage(data, path, layers, experts))
            except ValueError as err:
                emit(report, Notice(path, f"{e.name}'s usage history skipped: {err}"))
    return out


def drive_ceilings(rig: rigmod.Rig) -> dict[str, float]:
    """{drive key: bytes/s} from the newest iobench result (decode's shape, else prefill's, else
    sequential); {} when there is none."""
    files = rig.timestamped_files(os.path.basename(rig.bench_dir))
    if not files:
        return {}
    try:
        doc = read_json(files[-1], "iobench", "run `iobench run` again", kind_key="kind")
    except RigError:
        return {}
    out = {}
    for d in doc.get("drives") or []:
        key = ((d or {}).get("drive") or {}).get("key")
        presets = (d or {}).get("presets") or {}
        for p in CEILING_PRESETS:
            bw = (presets.get(p) or {}).get("bw_bytes")
            if key and isinstance(bw, (int, float)) and bw > 0:
                out[key] = float(bw)
                break
    return out


def parse_budget(spec: str, dest: str, model_bytes: int, held_bytes: int) -> int:
    """Bytes a partial replica at `dest` may hold: SIZE (64G), PCT% of the model, or auto."""
    text = str(spec).strip()
    if text == "auto":
        free = free_bytes(dest) + held_bytes
        return max(0, free - headroom(free))
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise UsageError(f"--partial {spec!r}: a share of the model is 1%..100%, e.g. 25%")
        return int(model_bytes * pct / 100)
    return parse_size(text, "--partial")


def expert_table(g, sizes, rank, held, serves) -> tuple[list[ShardUse], ExpertTable]:
    """The model's files as `partial.choose_partial` sees them, and its experts: their files, events
    (None: every expert once, the even ranking), bytes, and what a replica holding some files
    serves of each (`serves`: the engine's `replica_serves`; None: each component by its file)."""
    files, ranks, helds, nbytes, exts = [], [], [], [], []
    expert_bytes: dict[str, int] = {}
    for layer in range(g.layers):
        for e in range(g.experts):
            ext = g.expert_ranges(layer, e)
            for x in ext:
                expert_bytes[x.file] = expert_bytes.get(x.file, 0) + x.length
            files.append(frozenset(x.file for x in ext))
            ranks.append(1.0 if rank is None else float(rank[layer, e]))
            helds.append(1.0 if held is None else float(held[layer, e]))
            nbytes.append(sum(x.length for x in ext))
            exts.append((layer, e, ext))

    def served(i: int, have: frozenset[str]) -> int:
        layer, e, ext = exts[i]
        if serves is not None:
            return serves(g, layer, e, have)
        return sum(x.length for x in ext if x.file in have)

    uses = [ShardUse(f, b, expert_bytes.get(f, 0)) for f, b in sizes]
    return uses, ExpertTable(tuple(files), tuple(ranks), tuple(helds), tuple(nbytes), served)


def choose_members(model: ModelSet, dest_dirs: list[str], rig: rigmod.Rig, spec: str,
                   report: Reporter = None) -> list[PartialChoice]:
    """The files each destination holds as a partial replica of `model` (see the module doc)."""
    if len(model.files) < 2:
        raise UsageError(f"--partial: {model.path} is one file; a partial replica holds some of a model's files "
                         "(a directory of safetensors shards, or a split GGUF set)")
    g = inspect_model(model)
    sizes = [(rel, os.path.getsize(p)) for rel, p in zip(model.files, model.paths)]
    records = load_history(rig, model, g.layers, g.experts, report)
    split = split_history(records, g.layers, g.experts)
    history = no_history() if split is None else f"{split.kind} history, {split.how}"
    if split is None:
        emit(report, Notice(model.path, no_history()))
    engine = get_engine(engine_for_model(model.format, model.layout, model.files))
    uses, table = expert_table(g, sizes, None if split is None else split.rank, None if split is None else split.held,
                               engine.replica_serves)
    ceilings = drive_ceilings(rig)
    full = [m for m in rig.members if not m.partial and os.path.exists(m.path)]
    b_full = {drive_key(m.path) for m in full}
    out = []
    for d in dest_dirs:
        final = model.in_dir(d)
        have = [rel for rel in model.files if os.path.isfile(final.abs(rel))]
        held_bytes = sum(b for rel, b in sizes if rel in have)
        budget = parse_budget(spec, d, sum(b for _, b in sizes), held_bytes)
        key = drive_key(d)
        b_dest = ceilings.get(key)
        b_rest = sum(ceilings.get(k, 0.0) for k in b_full - {key}) or None
        share = b_dest / (b_dest + b_rest) if b_dest and b_rest else None
        if share is None:
            emit(report, Notice(d, "no iobench ceilings for this drive and the rig's full members: filling the budget "
                                   "(run `iobench run` on a scratch file there to size it to its bandwidth share)"))
        c = choose_partial(d, uses, table, budget, share=share, b_rest=b_rest, b_dest=b_dest, history=history,
                           keep=have)
        if not c.holds:
            smallest = min((u.bytes for u in uses if u.expert_bytes), default=0)
            raise UsageError(f"--partial {spec}: a budget of {format_bytes(budget)} at {d} holds no shard (the smallest "
                             f"with routed experts is {format_bytes(smallest)}); give a larger budget")
        out.append(c)
    return out
