"""ds4-argodrive (the Argodrive fork of ds4): what it does, as data and pure functions.

Read from the engine's expert reader and profile handling (docs/engine-profiles.md): up to 3 sources
(the `-m` primary, then `DS4_ARGODRIVE_REPLICAS` in order), integer weights 1..100, every
routed-expert read cut on a 256 KiB grid with the primary taking the front and the tail; the
environment and arguments it reads; the log lines in which it says what it applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from core.errors import UsageError
from models.modelset import Extent

from . import ds4_argodrive_profile
from .base import Engine, Piece
from .pattern import Concurrency, Pattern, Read, Setup, Step

NAME = "ds4-argodrive"

BLOCK = 262_144                  # bytes: the split granule (256 KiB)
MAX_SOURCES = 3                  # primary + at most 2 replicas
WEIGHT_MIN, WEIGHT_MAX = 1, 100
PATH_FORBIDDEN = ",*"            # DS4_ARGODRIVE_REPLICAS is "path*weight,path*weight"

# The read shapes the engine issues (docs/iobench.md, docs/planner.md).
PREFILL_CHUNK = 32 << 20         # bytes: one prefill staging chunk
PREFILL_LANES = 8                # chunks in flight per drive while prefill stages (DS4_ARGODRIVE_PREFILL_LANES default)
DECODE_THREADS = 9               # the expert pread pool (DS4_METAL_STREAMING_EXPERT_PREAD_THREADS)
DECODE_BATCH = 3                 # component reads issued together: one missed expert (gate, up, down)
# One expert component of DeepSeek V4.1 Flash Q4, the engine's model: the decode read size used
# only when no model header is at hand to ask.
COMPONENT_BYTES = 6_635_520


def block_counts(blocks: int, weights: Sequence[int]) -> tuple[int, ...]:
    """Whole blocks per source: floor shares, then leftovers one at a time to the largest
    remainder (ties to the lower index), the winner's remainder zeroed."""
    total = sum(weights)
    counts = [blocks * w // total for w in weights]
    rems = [blocks * w % total for w in weights]
    for _ in range(blocks - sum(counts)):
        best = max(range(len(weights)), key=lambda i: (rems[i], -i))
        counts[best] += 1
        rems[best] = 0
    return tuple(counts)


def split_ds4(offset: int, length: int, weights: Sequence[int], block: int = BLOCK) -> tuple[Piece, ...]:
    """The primary reads the front (its blocks plus the tail), then source 1, then source 2;
    contiguous, covering [offset, offset+length) exactly."""
    if length < 0 or offset < 0:
        raise UsageError(f"read ({offset}, {length}): offset and length must be >= 0")
    blocks, tail = divmod(length, block)
    counts = block_counts(blocks, weights)
    pieces, pos = [], offset
    for i, c in enumerate(counts):
        n = c * block + (tail if i == 0 else 0)
        pieces.append(Piece(i, pos, n, c))
        pos += n
    return tuple(pieces)


# ---------------------------------------------------------------------------------------------
# Environment and arguments (docs/engine-profiles.md)

ENV_PREFIX = "DS4_"              # every variable the engine reads starts so
ENV_PRIMARY_WEIGHT = "DS4_ARGODRIVE_PRIMARY_WEIGHT"     # base weight of source 0
ENV_REPLICAS = "DS4_ARGODRIVE_REPLICAS"                 # "path*weight,path*weight": replicas, base weights
ENV_DECODE_WEIGHTS = "DS4_ARGODRIVE_DECODE_WEIGHTS"     # "w0,w1,w2": one per source, decode phase only
SPLIT_KEYS = (ENV_PRIMARY_WEIGHT, ENV_REPLICAS, ENV_DECODE_WEIGHTS)

ENV_PREFILL_SPLIT = "DS4_ARGODRIVE_PREFILL_SPLIT"
ENV_PREFILL_LANES = "DS4_ARGODRIVE_PREFILL_LANES"
ENV_PREAD_THREADS = "DS4_METAL_STREAMING_EXPERT_PREAD_THREADS"
# On/off switches the engine tests by presence: setting one to 0 still turns it on, so a
# profile that does not want a switch must unset it.
PRESENCE_FLAGS = (
    ENV_PREFILL_SPLIT, "DS4_ARGODRIVE_PREFILL_SELECTIVE", "DS4_ARGODRIVE_PREFILL_AHEAD",
    "DS4_ARGODRIVE_FLAG_READBACK", "DS4_ARGODRIVE_BF16_EPILOGUES", "DS4_ARGODRIVE_PSO_CACHE",
)
VALUE_KEYS = (ENV_PREFILL_LANES, ENV_PREAD_THREADS)     # read as numbers
KNOWN_KEYS = PRESENCE_FLAGS + VALUE_KEYS                # the engine's knobs besides the split
# The cache report carries the expert-cache budget line only when this is set.
ENV_TIMING_SUMMARY = "DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY"

ARG_STREAMING = "--ssd-streaming"
ARG_MODEL, ARG_MODEL_LONG = "-m", "--model"
ARG_CACHE_EXPERTS = "--ssd-streaming-cache-experts"    # the expert-cache size is an argument, not a variable
PROFILE_ARGS = frozenset({ARG_MODEL, ARG_MODEL_LONG, ARG_CACHE_EXPERTS})   # given by a profile, never twice


def split_environment(primary_weight: int, replicas: Sequence[str], replica_weights: Sequence[int],
                      decode_weights: Sequence[int]) -> tuple[tuple[str, str], ...]:
    """The split keys for base weights (primary first) and decode weights (one per source);
    none for a single source, which the engine reads without a split."""
    if not replicas:
        return ()
    return ((ENV_PRIMARY_WEIGHT, str(primary_weight)),
            (ENV_REPLICAS, ",".join(f"{p}*{w}" for p, w in zip(replicas, replica_weights))),
            (ENV_DECODE_WEIGHTS, ",".join(map(str, decode_weights))))


def engine_args(primary: str, cache_experts: int | None) -> tuple[str, ...]:
    """The arguments a profile gives: stream experts from `primary`, `cache_experts` of them in RAM."""
    return (ARG_STREAMING, ARG_MODEL, primary, ARG_CACHE_EXPERTS, str(cache_experts))


# ---------------------------------------------------------------------------------------------
# Log lines: what the engine says it applied (its reader's fprintf formats, docs/engine-profiles.md; the reader
# is argodrive_read.h: `ar_open` parses the split, `ar_close` prints the per-source bytes)

LOG_SOURCES = re.compile(r"expert reader sources=(\d+)")
# ar_open prints the decode list verbatim ("%s"); strtoul skips the blanks after each comma, so
# "10, 6, 6" is applied like "10,6,6" and printed with its spaces.
LOG_DECODE_SPLIT = re.compile(r"decode split (\d[\d,\s]*?)(?: \(prefill keeps the base weights\))?[ \t]*$", re.M)
# A decode list of the wrong count or range is dropped with only this line; the base weights run.
LOG_DECODE_IGNORED = re.compile(r"ignoring " + re.escape(ENV_DECODE_WEIGHTS)
                                + r"=(.*?)(?: \(want \d+ comma-separated weights 1\.\.100\))?[ \t]*$", re.M)
# Printed by ar_close per source it had opened: at the end of every reader session, and also
# when ar_open rejects its configuration (a relative path, a 4th source, a bad weight, a size or
# inode clash), which closes the reader at once: then every line says bytes=0 and the engine
# never says 'expert reader sources='.
LOG_SOURCE_BYTES = re.compile(r"source\[(\d+)\] bytes=(\d+)")
LOG_CACHE_BUDGET = re.compile(r"streaming expert cache budget=(\d+) experts")
LOG_DECODE_CACHE = re.compile(r"decode cache requested=(\d+) effective=(\d+)")
LOG_CACHE_CAP = re.compile(r"(using locked cache cap:.*|runtime cache cap now .*)")
# Prefill staging refused its chunk (e.g. the reader is off); the engine falls back to the layer sweep.
LOG_PREFILL_REJECTED = re.compile(r"prefill stage rejected: (.*)")


def weights_text(text: str) -> str:
    """A weight list as the engine reads it: blanks dropped ('10, 6, 6' -> '10,6,6')."""
    return re.sub(r"\s+", "", text)


@dataclass(frozen=True)
class LogReport:
    """What one run's log (stdout and stderr) says the engine applied. None or empty: the
    engine printed no such line."""
    sources: int | None = None                      # the last 'expert reader sources=N'
    decode_split: str | None = None                 # the last 'decode split W0,W1,...', blanks dropped
    decode_ignored: str | None = None               # the last decode list the engine ignored, verbatim
    source_bytes: dict[int, int] = field(default_factory=dict)   # source -> bytes, summed over reader sessions
    cache_budgets: tuple[int, ...] = ()             # experts, every budget line in order
    cache_caps: tuple[str, ...] = ()                # lines in which the engine capped the cache
    decode_cache: tuple[tuple[int, int], ...] = ()  # (requested, effective) decode cache, experts
    prefill_rejected: str | None = None             # the last reason prefill staging was rejected

    @property
    def rejected(self) -> bool:
        """The reader refused its replica configuration: source lines, every one bytes=0, and no
        'expert reader sources=' line (ar_open closed the reader before it served a read)."""
        return bool(self.source_bytes) and self.sources is None and not any(self.source_bytes.values())


def _last(rx: re.Pattern, text: str):
    found = rx.findall(text)
    return found[-1] if found else None


def read_log(text: str) -> LogReport:
    """Every line of `text` the engine prints about what it applied."""
    sources = _last(LOG_SOURCES, text)
    split = _last(LOG_DECODE_SPLIT, text)
    per: dict[int, int] = {}
    for i, b in LOG_SOURCE_BYTES.findall(text):
        per[int(i)] = per.get(int(i), 0) + int(b)
    return LogReport(
        sources=None if sources is None else int(sources),
        decode_split=None if split is None else weights_text(split),
        decode_ignored=_last(LOG_DECODE_IGNORED, text),
        source_bytes=dict(sorted(per.items())),
        cache_budgets=tuple(int(x) for x in LOG_CACHE_BUDGET.findall(text)),
        cache_caps=tuple(LOG_CACHE_CAP.findall(text)),
        decode_cache=tuple((int(a), int(b)) for a, b in LOG_DECODE_CACHE.findall(text)),
        prefill_rejected=_last(LOG_PREFILL_REJECTED, text),
    )


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


# ---------------------------------------------------------------------------------------------
# The weights the solver tries: one vector per distinct split of the phase's read (10:5:5 and
# 2:1:1 cut a 6,635,520 B component identically), the smallest integers of each

def block_counts_many(blocks: int, weights: np.ndarray) -> np.ndarray:
    """`block_counts` for every row of `weights` (N x n) at once; identical results."""
    w = np.asarray(weights, dtype=np.int64)
    total = w.sum(axis=1, keepdims=True)
    counts = blocks * w // total
    rems = blocks * w % total
    left = blocks - counts.sum(axis=1)
    # Sum of remainders is left * total with each below total, so the `left` largest are positive
    # and distinct sources: one extra block each, ties to the lower index (stable sort).
    order = np.argsort(-rems, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(w.shape[1]), w.shape).copy(), axis=1)
    return counts + (rank < left[:, None])


@lru_cache(maxsize=4)
def weight_space(n: int) -> np.ndarray:
    """Every weight vector of n sources (1..100 each), smallest first: by sum, max, then lexicographic."""
    axes = np.meshgrid(*([np.arange(WEIGHT_MIN, WEIGHT_MAX + 1, dtype=np.int64)] * n), indexing="ij")
    w = np.stack([a.ravel() for a in axes], axis=1)
    keys = [w[:, i] for i in reversed(range(n))] + [w.max(axis=1), w.sum(axis=1)]
    return w[np.lexsort(keys)]


@lru_cache(maxsize=16)
def split_classes(n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts K x n, smallest weights K x n): every distinct split of a `length`-byte read the
    engine's weights can produce, with the smallest weights that produce it."""
    w = weight_space(n)
    blocks = length // BLOCK
    counts = block_counts_many(blocks, w)
    key = np.zeros(len(w), dtype=np.int64)
    for i in range(n):
        key = key * (blocks + 1) + counts[:, i]
    _, first = np.unique(key, return_index=True)
    first.sort()                      # keep the smallest-first order of the representatives
    return counts[first], w[first]


def smallest_equivalent(weights: Sequence[int], length: int) -> tuple[int, ...]:
    """The smallest weights that split a `length`-byte read exactly as `weights` do."""
    w = np.asarray([list(weights)], dtype=np.int64)
    target = block_counts_many(length // BLOCK, w)[0]
    counts, smallest = split_classes(w.shape[1], length)
    hit = np.flatnonzero((counts == target).all(axis=1))
    return tuple(int(x) for x in smallest[hit[0]])


def weight_grid(n: int, geometry, phase: str = "decode") -> np.ndarray:
    """The distinct splits of the phase's typical read on this model (decode: a component;
    prefill: a staging chunk), as their smallest weights."""
    length = geometry.component_bytes if phase == "decode" else max(PREFILL_CHUNK, geometry.component_bytes)
    return split_classes(n, length)[1]


def reads_model(fmt: str, layout: str, files: Sequence[str]) -> str:
    """ds4 opens one GGUF file (`-m`); a split set or a safetensors directory it cannot read."""
    if fmt == "gguf" and layout == "file":
        return ""
    what = "a split GGUF set" if layout == "gguf-split" else "a safetensors directory" if fmt == "safetensors" else \
        f"a {fmt} {layout}"
    return f"{NAME} reads one GGUF file (-m); this model is {what}"


# ds4-argodrive cuts every routed-expert read across every source (the split above) and its reader
# takes a replica only as a regular file of the primary's size (docs/engine-profiles.md, the rules
# export checks), so a replica holding part of the model cannot serve it.
PARTIAL_REFUSAL = (f"{NAME} splits every read across every source and reads only full replicas "
                   "(a regular file of the primary's size)")
# A copy in RAM is no member for this engine: it cuts every read across every source, so each must
# hold the whole model (a RAM copy of the whole 518 GB file, which no machine it runs on holds), and
# it runs on macOS (Metal), which has no tmpfs. Our reading of its design, not a check in its code.
MEMORY_MEMBER = ("ds4-argodrive cuts every read across every source, so a RAM member would have to hold the whole "
                 "model in RAM, and it runs on macOS, which has no tmpfs; keep RAM members for colibri")

ENGINE = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX,
                granule=BLOCK, split=split_ds4, path_forbidden=PATH_FORBIDDEN, pattern=read_pattern,
                concurrency=concurrency, grid=weight_grid, reads_model=reads_model, equivalent=smallest_equivalent,
                profile=ds4_argodrive_profile, memory_member=MEMORY_MEMBER, partial_refusal=PARTIAL_REFUSAL)
