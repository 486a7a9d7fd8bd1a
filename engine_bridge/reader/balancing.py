"""Balancing: the work of reads already cut follows the drives' real pace (pure: no disk, no
threads, no clock).

Re-weighting changes how the *next* reads are cut; a step of the engine submits up to 256 MiB of
reads at once, all cut with the weights in force, so a drive that turns slow holds every one of
them. Balancing acts on reads already queued (docs/reader.md "Balancing"):

- a piece of the engine's cut is queued as *chunks* of at most `chunk_bytes`, cut at multiples of
  `chunk_bytes` in the file (so every chunk but a piece's edges is aligned for O_DIRECT);
- a drive keeps at most `depth_ns` of its own pace in the kernel, but never fewer than two chunks
  (so it never waits on us between two requests): the rest of its share waits in its queue, where
  another drive can still take it;
- a drive with nothing queued of its own *takes* the first chunk of another's queue when it would
  finish it sooner than the drive it was given to (`pick_victim`).

The bytes are the same whoever reads them (replicas are byte-identical); which drive read what is
counted (`stolen` bytes per source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class BalancePolicy:
    """The knobs of balancing (SplitReader's `balance_policy`; `run --balance-*`)."""

    chunk_bytes: int = 1 << 20        # a queued piece is cut into chunks of at most this much
    depth_ns: int = 250_000_000       # a drive keeps at most this much of its own pace in the kernel

    def to_dict(self) -> dict:
        return {"chunk_bytes": self.chunk_bytes, "depth_ms": self.depth_ns / 1e6}


ALIGN = 4096


def check_balance(p: BalancePolicy) -> BalancePolicy:
    """The policy, or ValueError naming the knob that makes no sense."""
    if isinstance(p.chunk_bytes, bool) or not isinstance(p.chunk_bytes, int) or p.chunk_bytes < ALIGN \
            or p.chunk_bytes % ALIGN:
        raise ValueError(f"balance chunk_bytes {p.chunk_bytes!r}: must be a multiple of {ALIGN} bytes, at least {ALIGN}")
    if isinstance(p.depth_ns, bool) or not isinstance(p.depth_ns, int) or p.depth_ns < 0:
        raise ValueError(f"balance depth_ns {p.depth_ns!r}: must be an integer >= 0")
    return p


def chunks(off: int, ln: int, chunk: int) -> list[tuple[int, int]]:
    """[off, off+ln) cut at the multiples of `chunk` inside it: (offset, length) each, in order."""
    out = []
    end = off + ln
    while off < end:
        nxt = min(end, (off // chunk + 1) * chunk)
        out.append((off, nxt - off))
        off = nxt
    return out


MIN_CHUNKS = 2      # a drive always has the next request queued behind the one it reads: one at a time,
                    # each request's own latency adds up (measured on throttled loop devices: 5 % of prefill)


def depth_limit(rate: float | None, policy: BalancePolicy) -> float:
    """Bytes a source at `rate` (bytes/ns; None: not known yet) may have in the kernel: `depth_ns`
    of its pace, at least MIN_CHUNKS chunks; unbounded while its pace is unknown."""
    if rate is None or math.isinf(rate):
        return math.inf
    return max(float(MIN_CHUNKS * policy.chunk_bytes), rate * policy.depth_ns)


def finish_ns(inflight: int, nbytes: int, rate: float | None, other: float | None) -> float:
    """When a source with `inflight` bytes in the kernel would have read `nbytes` more, ns from now;
    a source whose pace is unknown is taken to have `other`'s (the two compare on the bytes ahead);
    neither known, or the other's 0 (it delivers nothing: any pace beats it): the bytes themselves."""
    r = rate if rate is not None else (other or None)
    if r is None:
        return float(inflight + nbytes)
    if r <= 0:
        return math.inf
    return 0.0 if math.isinf(r) else (inflight + nbytes) / r


def pick_victim(thief: int, offers: Mapping[int, int], inflight: Sequence[int],
                rates: Mapping[int, float | None]) -> int | None:
    """The source whose first stealable chunk (`offers`: source -> its length) the idle `thief`
    should take: the one it would finish soonest relative to that source, among those it would
    finish before them at all. None: taking any would make a read wait longer."""
    best, gain = None, 0.0
    rt = rates.get(thief)
    for v, nbytes in offers.items():
        if v == thief:
            continue
        rv = rates.get(v)
        if rt is None and rv is None:
            mine, theirs = finish_ns(inflight[thief], nbytes, None, None), finish_ns(inflight[v], nbytes, None, None)
        else:
            mine, theirs = finish_ns(inflight[thief], nbytes, rt, rv), finish_ns(inflight[v], nbytes, rv, rt)
        if mine < theirs and (best is None or theirs - mine > gain):
            best, gain = v, theirs - mine
    return best
