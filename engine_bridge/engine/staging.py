"""How the engine stages routed experts through the reader; shared by the engine and replay.

Where an expert's bytes are comes from the geometry as one `Extent` (file, offset, length) per
component (`Geometry.expert_ranges`), so a model of several files (a split GGUF set, a directory of
shards) is staged like a single file. A layer's missing experts are read in id order; in prefill
consecutive experts whose components follow each other in the same file are coalesced into one
read per component of up to STAGE_BYTES (one expert per read in decode, and wherever the bytes
are not contiguous, as with one tensor per expert), with up to STAGE_WINDOW bytes submitted ahead
of the expert being used. Reads go through `submit(offset, length, phase, file=REL) -> ticket`
(the split reader's `submit`; `ticket.result()` waits for the read's barrier); this module opens
no file. Replay drives the same code, so it measures the engine's read pattern.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from models.modelset import Extent

from .constants import STAGE_BYTES, STAGE_WINDOW
from .model import Geometry

Submit = Callable[..., "object"]   # (offset, length, phase, file=REL) -> ticket with .result() -> bytes


@dataclass
class PhaseCounters:
    hits: int = 0            # selected experts found in the cache (one per expert per layer step)
    misses: int = 0          # selected experts read through the reader
    reads: int = 0           # ranges handed to the reader
    bytes: int = 0           # bytes read
    seconds: float = 0.0     # wall time of the phase
    read_wait_seconds: float = 0.0   # time spent waiting for reads to land (the rest is compute)

    def as_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "reads": self.reads, "bytes": self.bytes,
                "seconds": round(self.seconds, 6), "read_wait_seconds": round(self.read_wait_seconds, 6)}


def follows(a: Sequence[Extent], b: Sequence[Extent]) -> bool:
    """True when every component of `b` starts where the same component of `a` ends, in the same file."""
    return len(a) == len(b) and all(x.file == y.file and x.offset + x.length == y.offset for x, y in zip(a, b))


def expert_runs(experts: Sequence[int], where: Mapping[int, Sequence[Extent]], phase: str,
                stage_bytes: int = STAGE_BYTES) -> list[list[int]]:
    """Group sorted expert ids into runs read together (one read per component): in prefill,
    consecutive experts whose bytes follow each other (`follows`), as long as a run's largest
    component read stays within stage_bytes; in decode, one expert each. `where`: expert id ->
    its extents (`Geometry.expert_ranges`)."""
    runs: list[list[int]] = []
    widest = 0                      # bytes of the current run's largest component read
    for e in experts:
        size = max((x.length for x in where[e]), default=0)
        if (phase == "prefill" and runs and e == runs[-1][-1] + 1 and follows(where[runs[-1][-1]], where[e])
                and widest + size <= stage_bytes):
            runs[-1].append(e)
            widest += size
        else:
            runs.append([e])
            widest = size
    return runs


def run_reads(run: Sequence[int], where: Mapping[int, Sequence[Extent]]) -> list[Extent]:
    """The reads of a run: per component, from its first expert's extent over the whole run."""
    first = where[run[0]]
    return [Extent(x.file, x.offset, sum(where[e][c].length for e in run)) for c, x in enumerate(first)]


def stage_reads(submit: Submit, g: Geometry, layer: int, missing: Sequence[int], phase: str, counters: PhaseCounters,
                stage_bytes: int = STAGE_BYTES, window: int = STAGE_WINDOW):
    """Yield (expert, [a buffer per component], release) for the missing experts of a layer, in
    id order, while later reads are still in flight (at most `window` bytes submitted ahead). The
    engine and replay both read through here, so replay measures the engine's read pattern.
    `release` is None except on a run's last expert: call it when every buffer of the run (this
    and the previous experts yielded) is no longer needed, so the reader can reuse them."""
    where = {e: g.expert_ranges(layer, e) for e in missing}
    todo = deque(expert_runs(missing, where, phase, stage_bytes))
    pending: deque = deque()
    inflight = 0
    while todo or pending:
        while todo and (not pending or inflight + sum(x.length for x in run_reads(todo[0], where)) <= window):
            run = todo.popleft()
            reads = run_reads(run, where)
            n = sum(x.length for x in reads)
            pending.append((run, reads, n, [submit(x.offset, x.length, phase, file=x.file) for x in reads]))
            inflight += n
            counters.reads += len(reads)
            counters.bytes += n
        run, reads, n, tickets = pending.popleft()
        t0 = time.perf_counter()
        bufs = [memoryview(t.result()) for t in tickets]
        counters.read_wait_seconds += time.perf_counter() - t0
        inflight -= n
        for b, x in zip(bufs, reads):
            if len(b) != x.length:
                raise RuntimeError(f"reader returned {len(b)} bytes for a {x.length}-byte read")
        at = [0] * len(reads)                     # where the next expert's bytes start in each read
        for j, e in enumerate(run):
            parts = []
            for c, x in enumerate(where[e]):
                parts.append(bufs[c][at[c]:at[c] + x.length])
                at[c] += x.length
            yield e, parts, (_releaser(tickets) if j == len(run) - 1 else None)


def _releaser(tickets):
    """Give a run's read buffers back to the reader's pool (once its last expert is dequantized)."""
    def release():
        for t in tickets:
            rel = getattr(t, "release", None)
            if rel is not None:
                rel()
    return release
