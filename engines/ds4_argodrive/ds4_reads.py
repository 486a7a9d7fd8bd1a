"""ds4-argodrive's read pattern: what it reads for one step, cut by its rule (pure;
docs/engine-profiles.md), its reads in flight and the models it opens."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from models.modelset import Extent

from ..base import Piece
from ..pattern import Concurrency, Pattern, Read, ReadShapes, Setup, Step
from .blocks import split_ds4
from .constants import COMPONENT_BYTES, DECODE_THREADS, NAME, PREFILL_CHUNK, PREFILL_LANES

# ---------------------------------------------------------------------------------------------
# The read pattern: what the engine reads for one step, cut by its rule (docs/engine-profiles.md)
#
# Prefill stages the union of the chunk's selected experts that miss the cache ("selective
# staging"): consecutive experts whose slices follow each other in one tensor are read together,
# one read per component of up to PREFILL_CHUNK bytes. Decode reads each missed expert's
# components one read each. Every read is cut by the phase's weights (`split_ds4`), and the
# layer waits for all of its reads: one group per step.

def follows(a: Sequence[Extent], b: Sequence[Extent]) -> bool:
    """True when every component of `b` starts where the same component of `a` ends, in the same file."""
    return len(a) == len(b) and all(x.file == y.file and x.offset + x.length == y.offset for x, y in zip(a, b))


def expert_runs(experts: Sequence[int], where, phase: str, chunk: int = PREFILL_CHUNK) -> list[list[int]]:
    """Sorted expert ids grouped into runs read together (one read per component): in prefill,
    consecutive experts whose bytes follow each other (`follows`) while a run's largest component
    read stays within `chunk` bytes; in decode, one expert each. `where`: expert -> its Extents."""
    runs: list[list[int]] = []
    widest = 0
    for e in experts:
        size = max((x.length for x in where[e]), default=0)
        if (phase == "prefill" and runs and e == runs[-1][-1] + 1 and follows(where[runs[-1][-1]], where[e])
                and widest + size <= chunk):
            runs[-1].append(e)
            widest += size
        else:
            runs.append([e])
            widest = size
    return runs


def run_extents(run: Sequence[int], where) -> list[Extent]:
    """The reads of a run: per component, from its first expert's extent over the whole run."""
    first = where[run[0]]
    return [Extent(x.file, x.offset, sum(where[e][c].length for e in run)) for c, x in enumerate(first)]


@lru_cache(maxsize=65536)
def _cut(length: int, weights: tuple[int, ...], sources: tuple[int, ...]) -> tuple[tuple[int, int, int, int], ...]:
    """(source, relative offset, length, blocks) of each non-empty piece of a read of `length` bytes
    cut over `sources` by their `weights`."""
    return tuple((s, p.offset, p.length, p.blocks) for s, p in zip(sources, split_ds4(0, length, weights)) if p.length)


def cut_read(x: Extent, weights: Sequence[int], sources: Sequence[int]) -> Read:
    """One read cut by the engine's rule over `sources` (their weights, in order); empty pieces dropped."""
    src = tuple(sources)
    o = x.offset
    return Read(x.file, o, x.length, tuple(Piece(s, o + r, n, b) for s, r, n, b in
                                           _cut(x.length, tuple(weights[i] for i in src), src)))


_STAGED: dict = {}           # (geometry id, step) -> (geometry, its staged extents): weight-independent


def staged_extents(geometry, step: Step) -> tuple[Extent, ...]:
    """The reads of one step before they are cut: staged runs (prefill), one per component (decode)."""
    key = (id(geometry), step)
    hit = _STAGED.get(key)
    if hit is not None and hit[0] is geometry:
        return hit[1]
    where = {e: geometry.expert_ranges(step.layer, e) for e in step.experts}
    chunk = max(PREFILL_CHUNK, geometry.component_bytes)
    out = tuple(x for run in expert_runs(step.experts, where, step.phase, chunk) for x in run_extents(run, where))
    if len(_STAGED) > 8192:
        _STAGED.clear()
    _STAGED[key] = (geometry, out)
    return out


def read_pattern(geometry, step: Step, setup: Setup) -> Pattern:
    """The reads of one step: staged runs (prefill) or one read per component (decode), each cut
    over every usable source by the phase's weights; one group. A source that may not serve (the
    reader's failover) gives its share to the others by their weights, as `split_ds4` over the
    rest would. `geometry`: a `models.geometry.Geometry`."""
    usable = setup.usable()
    w = setup.weights
    if any(h is not None for h in setup.holds):
        # a copy without the read's file cannot serve it (the engine itself wants full replicas:
        # a plan leaves partial ones out; the reader's failover may meet one)
        reads = tuple(cut_read(x, w, [i for i in usable if setup.holds_file(i, x.file)] or [0])
                      for x in staged_extents(geometry, step))
    else:
        reads = tuple(cut_read(x, w, usable) for x in staged_extents(geometry, step))
    return Pattern(step, (reads,) if reads else ())


def concurrency(phase: str) -> Concurrency:
    """Prefill keeps PREFILL_LANES reads in flight on each drive; decode shares a pool of DECODE_THREADS."""
    return Concurrency(per_source=PREFILL_LANES) if phase == "prefill" else Concurrency(shared=DECODE_THREADS)


def read_shapes(component_bytes: int | None = None) -> ReadShapes:
    """A prefill staging chunk (PREFILL_CHUNK, or the component when it is larger, as
    `staged_extents` stages) and a decode component: the model's, else V4.1's (COMPONENT_BYTES)."""
    if component_bytes is None:
        return ReadShapes(PREFILL_CHUNK, COMPONENT_BYTES)
    return ReadShapes(max(PREFILL_CHUNK, component_bytes), component_bytes)


def preference(fmt: str, layout: str, files: Sequence[str]) -> int:
    """1: one GGUF file is the format ds4 is made for (asked only of a model it reads). Its models
    are DeepSeek V4's, but the question is asked of the format, layout and files alone."""
    return 1


def reads_model(fmt: str, layout: str, files: Sequence[str]) -> str:
    """ds4 opens one GGUF file (`-m`); a split set or a safetensors directory it cannot read."""
    if fmt == "gguf" and layout == "file":
        return ""
    what = "a split GGUF set" if layout == "gguf-split" else "a safetensors directory" if fmt == "safetensors" else \
        f"a {fmt} {layout}"
    return f"{NAME} reads one GGUF file (-m); this model is {what}"


