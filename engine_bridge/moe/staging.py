"""How the engine stages routed experts: it executes the target engine's read pattern. Shared by
the engine and replay.

For each step (a layer's experts missing from the cache, in a phase) the target engine's module
says which reads to issue, on which drives, in which groups (`engines.pattern`; `StepReads`
asks it with the run's weights and switches and the sources still healthy). This module issues
those reads through the split reader's `submit_read(read, phase) -> ticket` (`ticket.result()`
waits for the read's last piece), group after group as the engine does: a group's reads are
issued together — at most the engine's reads in flight (`Concurrency.shared` when its threads
each take a read) and STAGE_WINDOW bytes ahead — and the next group only once they have all
landed. Each expert is yielded, in id order, as soon as the reads holding its bytes have landed,
so it is computed while later reads of its group are in flight. This module opens no file and
knows no engine by name: replay drives the same code, so both measure the target engine's reads.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from engines.base import Engine
from engines.pattern import Pattern, Setup, Step

from .constants import STAGE_WINDOW
from .resident import Geometry
from .threadtimes import GROUPS, Times

SubmitRead = Callable[..., "object"]   # (Read, phase) -> ticket with .result() -> bytes and .release()


@dataclass
class PhaseCounters:
    hits: int = 0            # selected experts found in the cache (one per expert per layer step)
    misses: int = 0          # selected experts read through the reader
    reads: int = 0           # reads handed to the reader
    bytes: int = 0           # bytes read
    groups: int = 0          # groups of reads waited for (the engine's barriers)
    seconds: float = 0.0     # wall time of the phase
    read_wait_seconds: float = 0.0   # time spent waiting for reads to land (the rest is compute)
    started_ns: int = 0      # when the phase began, on the reader's clock (time.monotonic_ns, the clock of
                             # its events' t_ns: an event is placed in its phase); 0: not recorded
    threads: dict | None = None   # seconds on a core and runnable without one: the engine's thread, its
                                  # helpers, the others; the process's page faults (`threadtimes`); None:
                                  # not measured

    def as_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "reads": self.reads, "bytes": self.bytes,
                "groups": self.groups, "seconds": round(self.seconds, 6),
                "read_wait_seconds": round(self.read_wait_seconds, 6), "started_ns": self.started_ns,
                **({"threads": self.threads} if self.threads is not None else {})}

    def timed(self, start: Times | None, end: Times | None) -> None:
        """Keep where the phase's threads spent it, from `threadtimes.sample` at its start and end."""
        if start is not None and end is not None:
            d = end - start
            self.threads = {f"{g}_{k}_seconds": round(v[g] / 1e9, 6) for g in GROUPS
                            for k, v in (("cpu", d.cpu), ("runq", d.runq))}
            self.threads.update(minor_faults=d.minor_faults, major_faults=d.major_faults)


class StepReads:
    """The target engine's read pattern for each step of a run: its weights per phase, its
    switches, what each source holds, the sources the reader still uses (`healthy`, asked
    at every step: a degraded drive's share goes to the others) and the weights the reader cuts
    with now (`weights_now(phase)`, asked at every step: the reader's re-weighting moves them;
    weights only say where bytes are read, never which bytes, so the output is the same)."""

    def __init__(self, engine: Engine, geometry: Geometry, weights: dict[str, Sequence[int]],
                 switches: frozenset[str] = frozenset(), holds: Sequence[frozenset[str] | None] = (),
                 healthy: Callable[[], Sequence[int]] | None = None,
                 weights_now: Callable[[str], Sequence[int]] | None = None):
        self.engine, self.geometry = engine, geometry
        self.weights = {ph: tuple(int(x) for x in w) for ph, w in weights.items()}
        self.switches = frozenset(switches)
        self.holds = tuple(holds)
        self.healthy = healthy
        self.weights_now = weights_now

    def setup(self, phase: str) -> Setup:
        w = tuple(self.weights_now(phase)) if self.weights_now is not None else self.weights[phase]
        alive = tuple(self.healthy()) if self.healthy is not None else None
        if alive is not None and len(alive) == len(w):
            alive = None
        return Setup(w, self.switches, self.holds, alive)

    def __call__(self, step: Step) -> Pattern:
        return self.engine.pattern(self.geometry, step, self.setup(step.phase))


class _Holdings:
    """Which read of a pattern holds each byte range: per file, the reads sorted by offset."""

    def __init__(self, reads):
        self.by_file: dict[str, list[tuple[int, int, int]]] = {}
        for i, r in enumerate(reads):
            self.by_file.setdefault(r.file, []).append((r.offset, r.offset + r.length, i))
        for v in self.by_file.values():
            v.sort()
        self.starts = {f: [a for a, _, _ in v] for f, v in self.by_file.items()}

    def find(self, x) -> tuple[int, int]:
        """(read index, offset of x within it) of the read holding extent x whole."""
        rows = self.by_file.get(x.file, [])
        j = bisect.bisect_right(self.starts.get(x.file, []), x.offset) - 1
        while j >= 0:
            a, b, i = rows[j]
            if a <= x.offset and x.offset + x.length <= b:
                return i, x.offset - a
            j -= 1
        raise RuntimeError(f"the read pattern does not cover {x.file}:{x.offset}+{x.length}")


def stage_reads(submit_read: SubmitRead, reads_of: Callable[[Step], Pattern], g: Geometry, layer: int,
                missing: Sequence[int], phase: str, counters: PhaseCounters, window: int = STAGE_WINDOW,
                in_flight: int | None = None):
    """Yield (expert, [a buffer per component], release) for the missing experts of a layer, in id
    order within each group of the target engine's pattern, while later reads of the group are in
    flight. Call `release()` when the expert's buffers are no longer needed: a read's buffer goes
    back to the reader once every expert it holds has been released. `in_flight`: the most reads
    outstanding at once (None: only `window` bytes limit them)."""
    if not missing:
        return
    pattern = reads_of(Step(phase, layer, tuple(missing)))
    reads = pattern.reads
    where = {e: g.expert_ranges(layer, e) for e in missing}
    hold = _Holdings(reads)
    located = {e: [hold.find(x) for x in where[e]] for e in missing}
    users = [0] * len(reads)
    for e in missing:
        for i in {i for i, _ in located[e]}:
            users[i] += 1
    first = {}
    start = 0
    for gi, group in enumerate(pattern.groups):
        for k in range(len(group)):
            first[start + k] = gi
        start += len(group)
    by_group: list[list[int]] = [[] for _ in pattern.groups]
    for e in missing:
        by_group[max(first[i] for i, _ in located[e])].append(e)
    tickets: dict[int, object] = {}
    start = 0
    for gi, group in enumerate(pattern.groups):
        todo = deque(range(start, start + len(group)))
        start += len(group)
        outstanding: deque = deque()
        inflight = 0
        counters.groups += 1

        def issue():
            nonlocal inflight
            while todo and (not outstanding or ((in_flight is None or len(outstanding) < in_flight)
                                                and inflight + reads[todo[0]].length <= window)):
                i = todo.popleft()
                tickets[i] = submit_read(reads[i], phase)
                outstanding.append(i)
                inflight += reads[i].length
                counters.reads += 1
                counters.bytes += reads[i].length

        def landed(i):
            nonlocal inflight
            t0 = time.perf_counter()
            buf = memoryview(tickets[i].result())
            counters.read_wait_seconds += time.perf_counter() - t0
            if len(buf) != reads[i].length:
                raise RuntimeError(f"reader returned {len(buf)} bytes for a {reads[i].length}-byte read")
            if i in outstanding:
                outstanding.remove(i)
                inflight -= reads[i].length
                if users[i] == 0:              # bytes no expert of this step needs (an O_DIRECT window's edge)
                    getattr(tickets[i], "release", lambda: None)()
            issue()
            return buf

        issue()
        for e in sorted(by_group[gi]):
            parts = []
            for (i, at), x in zip(located[e], where[e]):
                while i not in tickets:         # not issued yet: the window is full of earlier reads
                    landed(outstanding[0])
                parts.append(landed(i)[at:at + x.length])
            yield e, parts, _releaser(e, located, users, tickets)
        while todo or outstanding:             # the group's barrier: every read has landed
            if outstanding:
                landed(outstanding[0])
            else:
                issue()


def _releaser(e: int, located, users: list[int], tickets: dict):
    """Hand the reads holding expert e back to the reader once no other expert needs them."""
    def release():
        for i in {i for i, _ in located[e]}:
            users[i] -= 1
            if users[i] == 0:
                rel = getattr(tickets[i], "release", None)
                if rel is not None:
                    rel()
    return release
