"""colibri's read pattern: what the member running the model reads for one step, the weights
that make a difference, its reads in flight and the models it loads (pure; docs/engine-profiles.md).


- `moe` resolves a layer's unique experts in blocks of PREFILL_BLOCK (ESlot ws[64]); a block's
  misses are loaded at once and the block's compute waits for them all: in prefill a group per
  block of the step's experts (the blocks are counted over the misses alone: a prefill from a
  cold cache misses every expert). A decoded token's layer waits for its misses: one group.
- `expert_load_impl` reads an expert's weight tensors (contiguous in one shard) with one pread
  from the drive the member's placement picks (`FamilyMember.route`), each tensor falling back to the
  primary as the member does when that drive's copy lacks its shard (`FamilyMember.serve`); adjacent
  tensors served by one drive are one read. Its small scale reads are not counted.
- With DIRECT=1 the read is the 4 KiB-aligned O_DIRECT window (`direct_window`, clipped to the
  file); with stripes on as well (COLI_MIR_STRIPE), a window of at least STRIPE_MIN bytes held by
  two or more drives is cut into legs over them (`stripe_read`, with STRIPE_LEGS: equal legs in
  the code we run, tekintian/colibri 4ef9a99). Only the members that stripe do.
- READ_THREADS loads in flight (PIPE_WORKERS' default, and OpenMP's on an 8-core machine:
  *assumed*, colibri sizes both from the machine), each load with all its legs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..base import Piece
from ..pattern import Concurrency, Pattern, Read, Setup, Step
from .constants import (
    ALIGN,
    DIRECT,
    HASH_BUCKETS,
    NAME,
    PREFILL_BLOCK,
    READ_THREADS,
    SHARD_SUFFIX,
    STRIPE,
    STRIPE_LEGS,
    TOKENIZER,
    WEIGHT_MAX,
    WEIGHT_MIN,
)
from .family import FAMILY, FamilyMember, cuts_many, member_for
from .placement import direct_window, stripe_read


def reads_model(fmt: str, layout: str, files: Sequence[str]) -> str:
    """colibri loads a directory of safetensors shards holding tokenizer.json: the coli launcher's
    `need_model` refuses a model directory without TOKENIZER, c/st.h `st_scan_dir` indexes the
    *.safetensors (SHARD_SUFFIX) at the top of it. A lone shard stands for its folder (export then
    checks that folder). '' when colibri reads such a model, else one line why not."""
    if fmt != "safetensors":
        what = "a split GGUF set" if layout == "gguf-split" else \
            f"a {fmt} {'directory' if layout == 'dir' else 'file' if layout == 'file' else layout}"
        return f"{NAME} loads a directory of safetensors shards with {TOKENIZER}; this model is {what}"
    if layout == "file":
        return ""
    if layout != "dir":
        return f"{NAME} loads a directory of safetensors shards with {TOKENIZER}; this model is a safetensors {layout}"
    top = [f for f in files if "/" not in f]
    if not any(f.endswith(SHARD_SUFFIX) for f in top):
        return f"{NAME} loads the *{SHARD_SUFFIX} shards at the top of the model directory; this one has none"
    if TOKENIZER not in top:
        return f"{NAME}'s coli launcher refuses a model directory without {TOKENIZER} (need_model); this one has none"
    return ""



def preference(fmt: str, layout: str, files: Sequence[str]) -> int:
    """1: a directory of safetensors shards (or a lone shard standing for its folder) is the format
    colibri loads (asked only of a model it reads)."""
    return 1


def _window(geometry, file: str, offset: int, length: int) -> tuple[int, int]:
    """The O_DIRECT window of [offset, offset+length), clipped to the file's end when known."""
    o, n = direct_window(offset, length)
    size = geometry.file_bytes(file)
    return (o, min(n, size - o)) if size is not None else (o, n)


_LAYOUT: dict = {}       # (geometry id, member, layer, expert) -> (geometry, bucket, extents, merged): weight-independent


def _layout(geometry, member: FamilyMember, layer: int, expert: int):
    """(bucket, the expert's extents in component order, the same sorted by place and merged
    where they touch)."""
    key = (id(geometry), member.name, layer, expert)
    hit = _LAYOUT.get(key)
    if hit is not None and hit[0] is geometry:
        return hit[1:]
    ext = geometry.expert_ranges(layer, expert)          # in component order: the anchor (gate) first
    merged: list[list] = []
    for x in sorted(ext, key=lambda x: (x.file, x.offset)):
        if merged and merged[-1][0] == x.file and merged[-1][1] + merged[-1][2] == x.offset:
            merged[-1][2] += x.length
        else:
            merged.append([x.file, x.offset, x.length])
    out = (member.bucket(layer, expert, geometry.experts), tuple(ext), tuple(tuple(m) for m in merged))
    if len(_LAYOUT) > 200_000:
        _LAYOUT.clear()
    _LAYOUT[key] = (geometry,) + out
    return out


_CUTS: dict = {}


def _member_cuts(member: FamilyMember, weights: tuple) -> tuple[int, ...]:
    key = (member.name, weights)
    c = _CUTS.get(key)
    if c is None:
        c = _CUTS[key] = member.cuts(weights)
    return c


def _routed(member: FamilyMember, bucket: int, weights: tuple) -> int:
    """The drive (index into `weights`) whose cut slice holds `bucket` (`FamilyMember.route`)."""
    if len(weights) < 2:
        return 0
    c, r = _member_cuts(member, weights), 0
    while r + 1 < len(c) and bucket >= c[r]:
        r += 1
    return r


def expert_reads(geometry, member: FamilyMember, layer: int, expert: int, setup: Setup) -> list[Read]:
    """The reads of one expert: its tensors served by the drives the member picks (`FamilyMember.route`,
    `FamilyMember.serve`), adjacent tensors on one drive merged, each cut (or not) as the switches say."""
    usable = setup.usable()
    if not usable:
        return []
    bucket, ext, merged = _layout(geometry, member, layer, expert)
    routed = usable[_routed(member, bucket, tuple(setup.weights[i] for i in usable))]
    whole_model = all(setup.holds_file(s, x.file) for s in usable for x in ext)
    if whole_model:
        runs = [(f, o, n, routed) for f, o, n in merged]
    else:
        served = member.serve(routed, [x.file for x in ext], lambda s, f: s in usable and setup.holds_file(s, f))
        served = tuple(s if s in usable else usable[0] for s in served)
        runs = []
        for x, s in sorted(zip(ext, served), key=lambda t: (t[0].file, t[0].offset)):
            if runs and runs[-1][0] == x.file and runs[-1][1] + runs[-1][2] == x.offset and runs[-1][3] == s:
                runs[-1] = (x.file, runs[-1][1], runs[-1][2] + x.length, s)
            else:
                runs.append((x.file, x.offset, x.length, s))
    direct = DIRECT in setup.switches
    striped = direct and STRIPE in setup.switches and member.stripes
    out = []
    for file, off, n, s in runs:
        if direct:
            off, n = _window(geometry, file, off, n)
        if striped:
            holders = [h for h in usable if setup.holds_file(h, file)]
            pieces = stripe_read(off, n, s, holders, setup.weights, STRIPE_LEGS)
        else:
            pieces = (Piece(s, off, n, n // ALIGN),)
        out.append(Read(file, off, n, pieces))
    return out


def read_pattern(geometry, step: Step, setup: Setup) -> Pattern:
    """The reads of one step by the family member that runs this model (its config.json
    model_type, `geometry.arch`): whole experts on the drives its placement picks, in blocks of
    PREFILL_BLOCK (prefill) or one group (decode). A source that may not serve (the reader's
    failover, not colibri's: colibri fails closed) is left out of the placement."""
    member = member_for(geometry.arch)
    if step.phase == "prefill":
        blocks = [step.experts[i:i + PREFILL_BLOCK] for i in range(0, len(step.experts), PREFILL_BLOCK)]
    else:
        blocks = [step.experts] if step.experts else []
    groups = tuple(tuple(r for e in b for r in expert_reads(geometry, member, step.layer, e, setup)) for b in blocks)
    return Pattern(step, tuple(g for g in groups if g))


def replica_serves(geometry, layer: int, expert: int, held: frozenset) -> int:
    """Bytes of expert (layer, expert) a mirror holding the files `held` serves when colibri
    routes the expert to it: its family member's fallback for a missing shard (`FamilyMember.serve`:
    the GLM engine's anchor tensor, DeepSeek V4's shard, V4.1's tensor, GLM-5.3's whole expert)."""
    ext = geometry.expert_ranges(layer, expert)
    srcs = member_for(geometry.arch).serve(1, [x.file for x in ext], lambda src, f: src == 0 or f in held)
    return sum(x.length for x, src in zip(ext, srcs) if src == 1)


def buffered(setup: Setup) -> bool:
    """Without DIRECT=1 expert_load_impl reads with plain pread: through the page cache."""
    return DIRECT not in setup.switches


def modes(geometry) -> tuple[frozenset[str], ...]:
    """Buffered reads (colibri's default), O_DIRECT (DIRECT=1), and O_DIRECT striped where the
    member running this model stripes (COLI_MIR_STRIPE; only on the O_DIRECT path)."""
    out = (frozenset(), frozenset({DIRECT}))
    return out + (frozenset({DIRECT, STRIPE}),) if member_for(geometry.arch).stripes else out


def concurrency(phase: str) -> Concurrency:
    """READ_THREADS loads in flight in either phase, each with all its stripe legs."""
    return Concurrency(shared=READ_THREADS, per_read=True)


def weight_grid(n: int, geometry, phase: str = "decode") -> np.ndarray:
    """Every distinct cut vector the member's weights give (its cuts decide everything), as the
    smallest weights that give it; the grid is 1..GRID_MAX[n] per drive (colibri's whole 1..100
    up to three drives; beyond, nearly every vector is a cut vector of its own)."""
    return _cut_classes(member_for(geometry.arch).name, n)[1]


GRID_MAX = {1: WEIGHT_MAX, 2: WEIGHT_MAX, 3: WEIGHT_MAX, 4: 15, 5: 9}


def _grid(n: int) -> np.ndarray:
    """Every weight vector of n drives (WEIGHT_MIN..GRID_MAX[n] each), smallest first: by sum,
    max, then lexicographic."""
    top = GRID_MAX[n]
    axes = np.meshgrid(*([np.arange(WEIGHT_MIN, top + 1, dtype=np.int64)] * n), indexing="ij")
    w = np.stack([a.ravel() for a in axes], axis=1)
    keys = [w[:, i] for i in reversed(range(n))] + [w.max(axis=1), w.sum(axis=1)]
    return w[np.lexsort(keys)]


_CLASSES: dict = {}


def _cut_classes(member: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(cuts K x n, smallest weights K x n) of every distinct cut vector of the grid."""
    key = (member, n)
    if key not in _CLASSES:
        w = _grid(n)
        c = cuts_many(FAMILY[member], w)
        code = np.zeros(len(w), dtype=np.int64)
        for r in range(n):
            code = code * (HASH_BUCKETS + 1) + c[:, r]
        _, first = np.unique(code, return_index=True)
        first.sort()
        _CLASSES[key] = (c[first], w[first])
    return _CLASSES[key]

