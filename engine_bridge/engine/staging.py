"""How the engine stages routed experts through the reader; shared by the engine and replay.

A layer's missing experts are read in id order, contiguous experts of one tensor coalesced
into reads of up to STAGE_BYTES in prefill (one expert per read in decode), with up to
STAGE_WINDOW bytes submitted ahead of the expert being used. Reads go through
`submit(offset, length, phase) -> ticket` (the split reader's `submit`; `ticket.result()` waits
for the read's barrier); this module opens no file. Replay drives the same code, so it measures
the engine's read pattern.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from .constants import COMPONENTS, STAGE_BYTES, STAGE_WINDOW
from .model import Geometry

Submit = Callable[[int, int, str], "object"]   # (offset, length, phase) -> ticket with .result() -> bytes


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


def expert_runs(experts: Sequence[int], phase: str, component_bytes: int, stage_bytes: int = STAGE_BYTES) -> list[list[int]]:
    """Group sorted expert ids into runs read together: in prefill, contiguous experts up to
    stage_bytes per component tensor (one read per component); in decode, one expert each."""
    per = max(1, stage_bytes // component_bytes) if phase == "prefill" else 1
    runs: list[list[int]] = []
    for e in experts:
        if runs and e == runs[-1][-1] + 1 and len(runs[-1]) < per:
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs


def stage_reads(submit: Submit, g: Geometry, layer: int, missing: Sequence[int], phase: str, counters: PhaseCounters,
                stage_bytes: int = STAGE_BYTES, window: int = STAGE_WINDOW):
    """Yield (expert, [gate, up, down] buffers, release) for the missing experts of a layer, in id
    order, while later reads are still in flight (at most `window` bytes submitted ahead). The
    engine and replay both read through here, so replay measures the engine's read pattern.
    `release` is None except on a run's last expert: call it when every buffer of the run (this
    and the previous experts yielded) is no longer needed, so the reader can reuse them."""
    cb = g.component_bytes
    bases = [g.tensor(layer, c).offset for c in COMPONENTS]
    todo = deque(expert_runs(missing, phase, cb, stage_bytes))
    pending: deque = deque()
    inflight = 0
    while todo or pending:
        while todo and (not pending or inflight + 3 * len(todo[0]) * cb <= window):
            run = todo.popleft()
            n = len(run) * cb
            pending.append((run, [submit(b + run[0] * cb, n, phase) for b in bases]))
            inflight += 3 * n
            counters.reads += 3
            counters.bytes += 3 * n
        run, tickets = pending.popleft()
        t0 = time.perf_counter()
        bufs = [memoryview(t.result()) for t in tickets]
        counters.read_wait_seconds += time.perf_counter() - t0
        inflight -= 3 * len(run) * cb
        for b in bufs:
            if len(b) != len(run) * cb:
                raise RuntimeError(f"reader returned {len(b)} bytes for a {len(run) * cb}-byte read")
        for j, e in enumerate(run):
            last = j == len(run) - 1
            yield e, [b[j * cb:(j + 1) * cb] for b in bufs], (_releaser(tickets) if last else None)


def _releaser(tickets):
    """Give a run's read buffers back to the reader's pool (once its last expert is dequantized)."""
    def release():
        for t in tickets:
            rel = getattr(t, "release", None)
            if rel is not None:
                rel()
    return release
