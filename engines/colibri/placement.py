"""Where colibri reads an expert from (pure): the placement hashes of (layer, expert), the cuts of
256 one weight per drive gives, and the striped O_DIRECT read (c/colibri.c `expert_route`,
`mirror_setup`, `mir_pread_striped`; c/deepseek_v4.c, c/deepseek_v41.c, c/glm53.c for the family's
other members, `family`)."""

from __future__ import annotations

from typing import Sequence

from ..base import Piece
from .constants import ALIGN, GOLDEN, HASH_BUCKETS, STRIPE_MIN

_M32 = 0xFFFFFFFF


def cuts(weights: Sequence[float]) -> tuple[int, ...]:
    """Cumulative cuts of 256, one per drive (primary first): drive r serves hash values in
    [cuts[r-1], cuts[r]). Every drive keeps a non-empty slice; the last absorbs rounding
    (the GLM engine's mirror_setup; the family's other members: `family.FamilyMember.cuts`)."""
    return _float_cuts(weights, force_last=True)


def expert_hash(layer: int, expert: int) -> int:
    """expert_route's hash of (layer, expert): 0..255, in uint32 arithmetic."""
    h = ((layer * 2654435761) & _M32) ^ ((expert * 0x9E3779B9) & _M32)
    h ^= h >> 16
    h = (h * 0x45D9F3B) & _M32
    h ^= h >> 16
    return h & 255


# ---------------------------------------------------------------------------------------------
# The striped read (mir_pread_striped) and the O_DIRECT window it stripes

def direct_window(offset: int, length: int) -> tuple[int, int]:
    """(offset, length) in bytes of the 4 KiB-aligned window expert_load_impl reads with
    O_DIRECT for an expert's weights at [offset, offset+length)."""
    base = offset & ~(ALIGN - 1)
    need = offset - base + length
    return base, (need + ALIGN - 1) & ~(ALIGN - 1)


def stripes(length: int, holders: int) -> bool:
    """Whether mir_pread_striped cuts a window of `length` bytes over `holders` drives."""
    return holders >= 2 and length >= STRIPE_MIN


def stripe_read(offset: int, length: int, routed: int, holders: Sequence[int],
                weights: Sequence[float] | None = None, legs: str = "equal") -> tuple[Piece, ...]:
    """The pieces that serve one O_DIRECT window [offset, offset+length) with striping on, leg
    i on holders[(routed + i) % drives] (`holders`: the drives holding the shard with an O_DIRECT
    descriptor, ascending). `routed` is a drive number used as a list index, as the source does:
    with a partial mirror chunk 0 can land on another drive. A window colibri does not stripe is
    one piece on the routed drive (the primary when the routed drive lacks the shard).

    legs='equal' (c/colibri.c `mir_pread_striped` before the weighted-stripe change, the code in
    every stored upstream snapshot read): chunks of ceil(length / drives) rounded up to 4 KiB,
    the last one shorter.

    legs='weighted' (`mir_stripe_plan`, the weighted-stripe change colibri's docs credit to PR
    #1270): `weights` holds one weight per loaded drive (primary first; the holders' numbers
    index it). Each holder's share is the width of its slice of the cuts the weights give
    (`cuts`, not the raw weight), at least 1; every leg but the last is
    floor(length * share / sum of the holders' shares) rounded up to 4 KiB and clipped to what
    is left; the last leg takes the rest. A leg that comes out empty is skipped; fewer than two
    non-empty legs and colibri reads the window whole on the routed drive."""
    if legs not in ("equal", "weighted"):
        raise ValueError(f"legs must be 'equal' or 'weighted', not {legs!r}")
    hs = sorted(holders)
    if routed not in hs:
        routed = 0
    whole = (Piece(routed, offset, length, length // ALIGN),)
    if not stripes(length, len(hs)):
        return whole
    n = len(hs)
    if legs == "equal":
        chunk = ((length + n - 1) // n + ALIGN - 1) & ~(ALIGN - 1)
        pieces = []
        for i in range(n):
            o = i * chunk
            if o >= length:
                break
            size = min(chunk, length - o)
            pieces.append(Piece(hs[(routed + i) % n], offset + o, size, size // ALIGN))
        return tuple(pieces)
    if weights is None:
        raise ValueError("weighted legs need one weight per loaded drive")
    if any(h < 0 or h >= len(weights) for h in hs):
        raise ValueError(f"holders {tuple(hs)} name drives beyond the {len(weights)} weights")
    c = cuts(weights)
    share = [max(1, c[h] - (c[h - 1] if h else 0)) for h in hs]
    total = sum(share)
    pieces, acc = [], 0
    for i in range(n):
        k = (routed + i) % n
        want = length - acc if i == n - 1 else ((length * share[k] // total) + ALIGN - 1) & ~(ALIGN - 1)
        want = max(0, min(want, length - acc))
        if want > 0:
            pieces.append(Piece(hs[k], offset + acc, want, want // ALIGN))
        acc += want
    return tuple(pieces) if len(pieces) >= 2 else whole



def _float_cuts(weights: Sequence[float], force_last: bool) -> tuple[int, ...]:
    """The cut loop colibri.c, deepseek_v4.c and deepseek_v41.c share: c = (int)(256*cum/W + 0.5),
    at least the previous cut + 1, at most 256. colibri.c and deepseek_v4.c then force the last
    cut to 256; deepseek_v41.c does not, and need not: cum == W at the last drive, so it is 256."""
    total = 0.0
    for w in weights:
        total += w
    out, acc, cum = [], 0, 0.0
    for w in weights:
        cum += w
        c = int(256.0 * cum / total + 0.5)
        if c <= acc:
            c = acc + 1
        c = min(c, HASH_BUCKETS)
        out.append(c)
        acc = c
    if force_last:
        out[-1] = HASH_BUCKETS
    return tuple(out)


def _integer_cuts(weights: Sequence[int]) -> tuple[int, ...]:
    """c/glm53.c glm53_mirror_setup: cut = (256*acc + total/2) / total in integers, clamped to
    1..256, no guard against the previous cut (a drive's slice can be empty), the last 256."""
    total = sum(weights)
    out, acc = [], 0
    for w in weights:
        acc += w
        out.append(min(max((HASH_BUCKETS * acc + total // 2) // total, 1), HASH_BUCKETS))
    out[-1] = HASH_BUCKETS
    return tuple(out)


def flat_hash(layer: int, expert: int, experts_per_layer: int) -> int:
    """c/deepseek_v4.c v4_expert_route and c/deepseek_v41.c expert_route: the flat index
    layer*experts_per_layer + eid (C int, then uint32), times 2654435761 (uint32), bits 16..23."""
    idx = (layer * experts_per_layer + expert) & _M32
    return (((idx * GOLDEN) & _M32) >> 16) & 255

