"""The device's I/O unit: the queue limits a drive reports, and how many device requests one read
becomes (pure).

The block layer never hands a device more than one request's worth at a time: a read is cut
into requests of at most `max_sectors_kb`, and of at most `max_segments` memory segments of at
most `max_segment_size` each. A buffer of anonymous memory (what iobench and the engine read
into) lies in 4 KiB pages that are rarely next to each other in physical memory, so each page is
a segment: on a loop device (1280 KiB, 128 segments) a read is cut every 512 KiB, not 1280.
`QueueLimits.request_bytes` is that unit; `contiguous_request_bytes` the unit when the pages do
happen to merge. An operation-rate limit (a cgroup's riops, a slow controller) counts these
requests, so a drive's cost per read is a staircase in ceil(bytes / unit), not a smooth line.

Where the cut falls, as Linux does it (block/blk-merge.c, get_max_io_size): each request is at
most the unit, and a request that starts off a physical-block boundary ends on one, so the
requests after it are aligned. The read itself covers whole logical blocks. A file offset is
taken as the device offset: file systems place extents on block boundaries of at least 4 KiB,
so the alignment the rule asks about is the same.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

PAGE = 4096            # bytes per memory page: one segment of a buffer whose pages are scattered

# The sysfs queue files read (Linux), in the order the result and the table show them.
QUEUE_KEYS = ("max_sectors_kb", "max_hw_sectors_kb", "max_segments", "max_segment_size", "logical_block_size",
              "physical_block_size", "optimal_io_size", "minimum_io_size", "rotational", "nr_requests")


@dataclass(frozen=True)
class QueueLimits:
    """What a drive's request queue says about the requests it takes. None: not reported.

    source: 'sysfs' (Linux, every field), 'ioreg' (macOS: the maximum read size and segments
    only; unconfirmed on a real Mac) or 'unknown' (no block device: tmpfs, overlay, or nothing
    readable; the drive model then measures its unit).
    """

    source: str = "unknown"
    device: str = ""                         # whose queue: 'nvme0n1', 'loop3', 'dm-0', 'disk4'
    max_sectors_kb: int | None = None        # KiB per request at most (the kernel's current cap)
    max_hw_sectors_kb: int | None = None     # KiB per request the hardware allows
    max_segments: int | None = None          # memory segments per request
    max_segment_size: int | None = None      # bytes per segment
    logical_block_size: int | None = None    # bytes: the smallest addressable unit
    physical_block_size: int | None = None   # bytes: the unit the device writes internally
    optimal_io_size: int | None = None       # bytes; 0 when the device names none
    minimum_io_size: int | None = None       # bytes
    rotational: bool | None = None
    nr_requests: int | None = None           # requests the queue holds at once
    # Not the device's: whether the buffers iobench read into lay in huge pages (physically
    # contiguous, `core.coldio.aligned_buffer`). True: every read is cut at
    # contiguous_request_bytes; False or None: at either unit, as the pages happen to lie.
    buffers_contiguous: bool | None = None

    @property
    def known(self) -> bool:
        return self.max_request_bytes is not None

    @property
    def max_request_bytes(self) -> int | None:
        """Bytes per request at most by size alone (max_sectors_kb)."""
        return self.max_sectors_kb * 1024 if self.max_sectors_kb else None

    def _unit(self, segment: int | None) -> int | None:
        cap = self.max_request_bytes
        if cap is None:
            return None
        if self.max_segments and segment:
            cap = min(cap, self.max_segments * segment)
        lbs = self.logical_block_size or 512
        return max(lbs, cap - cap % lbs)

    @property
    def request_bytes(self) -> int | None:
        """Bytes per device request when the buffer's pages are scattered (each page a segment):
        the unit a read is cut into. None when the limits are unknown."""
        seg = min(PAGE, self.max_segment_size) if self.max_segment_size else PAGE
        return self._unit(seg)

    @property
    def contiguous_request_bytes(self) -> int | None:
        """Bytes per device request when the buffer's pages merge into the largest segments."""
        return self._unit(self.max_segment_size)

    @property
    def unit(self) -> int | None:
        """Bytes per device request for the buffers the reads went into: the contiguous cut when
        they lay in huge pages, else the scattered one (the smaller; a read may still get the
        larger when its pages happen to lie together)."""
        return self.contiguous_request_bytes if self.buffers_contiguous else self.request_bytes

    def units(self) -> tuple[int, ...]:
        """The device request sizes a read can be cut into, smallest first (empty: unknown):
        one when the buffers were contiguous, both cuts otherwise."""
        if self.buffers_contiguous and self.contiguous_request_bytes:
            return (self.contiguous_request_bytes,)
        return tuple(sorted({u for u in (self.request_bytes, self.contiguous_request_bytes) if u}))


def device_requests(nbytes: int, offset: int = 0, unit: int = 1 << 20, logical: int = 512,
                    physical: int | None = None) -> int:
    """Device requests one read of `nbytes` at byte `offset` becomes, with requests of at most
    `unit` bytes, logical blocks of `logical` bytes and cuts aligned to `physical` bytes (default:
    `logical`). 0 for an empty read.

    The read covers whole logical blocks; the first request ends on a physical-block boundary when
    it can, and every one after it is `unit` rounded down to whole physical blocks."""
    if nbytes <= 0:
        return 0
    if logical <= 0 or unit < logical:
        raise ValueError(f"unit {unit} and logical block {logical}: need 0 < logical <= unit")
    physical = physical or logical
    pos = offset - offset % logical
    end = -(-(offset + nbytes) // logical) * logical
    n = 0
    while pos < end:
        head = pos % physical
        if head == 0 and unit >= physical:
            step = unit - unit % physical             # aligned from here on: equal cuts
            return n + -(-(end - pos) // step)
        cut = (head + unit) - (head + unit) % physical
        pos += cut - head if cut > head else unit - unit % logical
        n += 1
    return n


def requests_for(nbytes: int, unit: int) -> int:
    """Device requests one read of `nbytes` starting on a block boundary becomes (every piece the
    engine and iobench read does): ceil(nbytes / unit); 0 for an empty read."""
    return device_requests(nbytes, 0, unit, logical=min(512, unit))


# ---- what the OS reports ----------------------------------------------------------------------

def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def limits_from_sysfs(values: dict[str, str], device: str = "") -> QueueLimits:
    """QueueLimits from the text of /sys/block/<dev>/queue/<key> files (key -> text; a file that
    is missing or unreadable is left out). A value that is not an integer is left unknown."""
    got = {k: _int(values.get(k)) for k in QUEUE_KEYS}
    rot = got.pop("rotational")
    if not any(v is not None for v in got.values()) and rot is None:
        return QueueLimits(source="unknown", device=device)
    return QueueLimits(source="sysfs", device=device, rotational=None if rot is None else bool(rot), **got)


_IOREG_NODE = re.compile(r"\+-o\s+IOBlockStorageDriver\b")
_IOREG_BSD = re.compile(r'"BSD Name"\s*=\s*"([^"]+)"')
_IOREG_NUM = {
    "max_bytes": re.compile(r'"(?:IO)?Maximum ?Byte ?Count ?Read"\s*=\s*(\d+)'),
    "max_segments": re.compile(r'"(?:IO)?Maximum ?Segment ?Count ?Read"\s*=\s*(\d+)'),
    "max_segment_size": re.compile(r'"(?:IO)?Maximum ?Segment ?Byte ?Count ?Read"\s*=\s*(\d+)'),
    "block": re.compile(r'"Preferred Block Size"\s*=\s*(\d+)'),
}


def limits_from_ioreg(text: str, disk: str) -> QueueLimits:
    """QueueLimits of whole disk `disk` ('disk4') from `ioreg -r -c IOBlockStorageDriver -l -w0`
    output: the block storage driver whose subtree names that BSD disk, its maximum read (bytes)
    and segments. Unconfirmed: written from IOKit's property names, not tried on a Mac."""
    nodes = _IOREG_NODE.split(text)[1:]
    for node in nodes:
        if disk not in _IOREG_BSD.findall(node):
            continue
        nums = {k: (int(m.group(1)) if (m := rx.search(node)) else None) for k, rx in _IOREG_NUM.items()}
        if not nums["max_bytes"]:
            break
        return QueueLimits(source="ioreg", device=disk, max_sectors_kb=nums["max_bytes"] // 1024,
                           max_segments=nums["max_segments"], max_segment_size=nums["max_segment_size"],
                           logical_block_size=nums["block"])
    return QueueLimits(source="unknown", device=disk)


# ---- JSON -------------------------------------------------------------------------------------

def limits_to_dict(q: QueueLimits) -> dict:
    d = asdict(q)
    d["request_bytes"] = q.request_bytes            # derived, written for readers of the file
    d["unit"] = q.unit
    return d


def limits_from_dict(d: dict) -> QueueLimits:
    """Inverse of limits_to_dict; raises TypeError/ValueError on a malformed value."""
    out = {}
    for f in fields(QueueLimits):
        v = d.get(f.name)
        if f.name in ("source", "device"):
            out[f.name] = str(v if v is not None else f.default)
        elif v is None:
            out[f.name] = None
        elif f.name in ("rotational", "buffers_contiguous"):
            out[f.name] = bool(v)
        elif isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"queue {f.name}: {v!r} is not a whole number")
        else:
            out[f.name] = v
    return QueueLimits(**out)
