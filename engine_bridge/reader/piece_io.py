"""One piece read from one source's copy: exact bytes into a read's buffer, O_DIRECT on any range.

A piece's aligned interior is read straight into the read's page-aligned buffer; its unaligned
edges (GGUF aligns tensors to 32 bytes only) through one covering page of the lane's scratch,
copied, so neighbouring pieces never touch each other's bytes.
"""

from __future__ import annotations

from core.coldio import ColdReader, align_down, align_up

from .sources import ShortRead


def read_piece(reader: ColdReader, buf, base: int, off: int, ln: int, scratch) -> None:
    """Exact bytes [off, off+ln) into `buf` (whose byte 0 is file offset `base`): the aligned
    interior directly, unaligned edges through a covering page of `scratch` (never touching a
    neighbour's bytes)."""
    a = reader.alignment
    buf = memoryview(buf)
    end = off + ln
    lo, hi = align_up(off, a), align_down(end, a)
    if lo >= hi:  # no whole aligned page inside the piece: one or two covering pages
        start = align_down(off, a)
        span = align_up(end, a) - start
        if reader.read_into(scratch[:span], start) < end - start:
            raise ShortRead()
        buf[off - base:end - base] = scratch[off - start:end - start]
        return
    if off < lo:
        if reader.read_into(scratch[:a], lo - a) < a:
            raise ShortRead()
        buf[off - base:lo - base] = scratch[off - (lo - a):a]
    if reader.read_into(buf[lo - base:hi - base], lo) < hi - lo:
        raise ShortRead()
    if hi < end:
        if reader.read_into(scratch[:a], hi) < end - hi:
            raise ShortRead()
        buf[hi - base:end - base] = scratch[:end - hi]
