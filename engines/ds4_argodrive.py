"""ds4-argodrive (the Argodrive fork of ds4): what it does, as data and pure functions.

Read from the engine's expert reader and profile handling (DESIGN §5, §6): up to 3 sources
(the `-m` primary, then `DS4_ARGODRIVE_REPLICAS` in order), integer weights 1..100, every
routed-expert read cut on a 256 KiB grid with the primary taking the front and the tail.
"""

from __future__ import annotations

from typing import Sequence

from core.errors import UsageError

from .base import Engine, Piece

NAME = "ds4-argodrive"

BLOCK = 262_144                  # bytes: the split granule (256 KiB)
MAX_SOURCES = 3                  # primary + at most 2 replicas
WEIGHT_MIN, WEIGHT_MAX = 1, 100
PATH_FORBIDDEN = ",*"            # DS4_ARGODRIVE_REPLICAS is "path*weight,path*weight"

# The read shapes the engine issues (DESIGN §4, §7).
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


ENGINE = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX,
                granule=BLOCK, split=split_ds4, path_forbidden=PATH_FORBIDDEN)
