"""The cold-read seam's contract: every reader passes the same cases.

Readers: `ColdReader` opened with O_DIRECT (Linux), with F_NOCACHE (macOS), with the fadvise
fallback (a file system without O_DIRECT), `CachedReader` (plain buffered reads), and the
failing-on-purpose `tests.helpers.FailingReader` while it is healthy. Cases: the facts
(`how`, `direct`, `alignment`, `size`), `read_into` at aligned offsets, at and past the end of
the file and on a file that shrank, the helpers built on it (`read_range`, `read_sequential`,
`hash_file`), and errors surfacing as documented — the failing variant of each reader breaks
on purpose for those.
"""

import errno
import mmap
import os
import random
import re
import threading

import pytest

from core.errors import MissingError
from core import platform
from core.coldio import (
    CachedReader,
    ColdReader,
    align_down,
    align_up,
    aligned_buffer,
    buffer_footprint,
    drop_pages,
    read_range,
    read_sequential,
)
from core.coldio import huge_backed as coldio_huge_backed
from core.constants import ALIGNMENT, HUGE_BUFFER_MIN, HUGE_PAGE
from replicas.hashing import hash_file
from tests.helpers import FailingReader, FailingReads, write_random

MiB = 1 << 20
KINDS = ("o_direct", "f_nocache", "fadvise", "cached", "failing")
DIRECT_HOWS = ("o_direct", "f_nocache")


@pytest.fixture(params=KINDS)
def kind(request, monkeypatch):
    k = request.param
    if k == "f_nocache" and not platform.is_darwin():
        pytest.skip("F_NOCACHE is macOS only")
    if k == "o_direct" and not platform.is_linux():
        pytest.skip("O_DIRECT is the Linux cold read")
    if k == "fadvise":      # what a file system without O_DIRECT gets, on any file system
        monkeypatch.setattr(platform, "open_direct", lambda p: (os.open(p, os.O_RDONLY | os.O_CLOEXEC), "fadvise"))
    return k


def reader_class(kind):
    return {"cached": CachedReader, "failing": FailingReader}.get(kind, ColdReader)


@pytest.fixture
def open_reader(kind):
    """Opens a file with the kind's reader (closed after the test)."""
    opened = []

    def open_(path, cls=None):
        r = (cls or reader_class(kind))(str(path))
        opened.append(r)
        if kind in DIRECT_HOWS and r.how != kind:
            pytest.skip(f"this file system refuses {kind} (the reader fell back to {r.how})")
        return r

    yield open_
    for r in opened:
        r.close()


def expected_how(kind, path):
    if kind == "failing":               # a healthy FailingReader is the platform's cold reader
        with ColdReader(str(path)) as r:
            return r.how
    return kind


# ---- facts ------------------------------------------------------------------------------------

def test_facts(tmp_path, kind, open_reader):
    p = tmp_path / "f"
    write_random(p, 3 * MiB + 1234, seed=1)
    r = open_reader(p)
    assert r.how == expected_how(kind, p)
    assert r.direct == (r.how in DIRECT_HOWS)
    assert r.alignment == ALIGNMENT == 4096
    assert r.size == 3 * MiB + 1234 and r.path == str(p)


def test_buffers_are_page_aligned_and_rounded_up():
    for n in (1, 4096, 4097, HUGE_BUFFER_MIN - ALIGNMENT, HUGE_BUFFER_MIN - 1, MiB + 1, 3 * HUGE_PAGE + 5):
        b = aligned_buffer(n)
        assert len(b) == align_up(n) and len(b) >= n and not b.readonly
        assert platform.buffer_address(b) % 4096 == 0
        assert bytes(b[::ALIGNMENT]) == bytes(len(range(0, len(b), ALIGNMENT))) and b[-1] == 0
        b[-1] = 7                                           # the whole length is ours to write
        if len(b) >= HUGE_BUFFER_MIN and hasattr(mmap, "MADV_HUGEPAGE"):
            assert platform.buffer_address(b) % HUGE_PAGE == 0     # starts on a huge page
            assert buffer_footprint(n) == align_up(n, HUGE_PAGE)   # and holds whole ones
        else:
            assert buffer_footprint(n) == len(b)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="no /proc/self/smaps (not Linux)")
def test_large_buffers_are_private_memory_that_may_take_huge_pages():
    b = aligned_buffer(4 * MiB)
    addr = platform.buffer_address(b)
    vma = _smaps_entry(addr)
    assert vma["perms"].endswith("p")                       # private: shared memory never takes THP
    thp = _thp_mode()
    if thp in ("always", "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        assert vma["THPeligible"] == "1"
    assert coldio_huge_backed(b) in (True, False)           # granted or not, the OS can say which
    assert platform.anon_huge_bytes(addr) == int(vma["AnonHugePages"].split()[0]) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="no /proc/self/smaps (not Linux)")
def test_drop_pages_gives_a_buffers_memory_back_and_keeps_it_usable():
    b = aligned_buffer(8 * MiB)                                   # faulted in
    b[:] = b"\x5a" * len(b)
    addr = platform.buffer_address(b)

    def rss() -> int:
        return int(_smaps_entry(addr)["Rss"].split()[0]) * 1024

    before = rss()
    assert drop_pages(b)
    assert before - rss() >= 8 * MiB and not any(b[::ALIGNMENT])  # given back; its old bytes are gone
    b[:4] = b"abcd"
    assert bytes(b[:4]) == b"abcd" and len(b) == 8 * MiB           # still the same buffer
    other = bytearray(b"keep")
    assert not drop_pages(other) and other == b"keep"              # not memory of aligned_buffer: left alone


def test_anon_huge_bytes_reads_the_mapping_holding_the_address(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text("7f0000000000-7f0000400000 rw-p 00000000 00:00 0 \nSize:               4096 kB\n"
                     "AnonHugePages:      2048 kB\nVmFlags: rd wr mr mw me ac hg\n"
                     "7f0000400000-7f0000401000 rw-s 00000000 00:01 17        /dev/zero (deleted)\n"
                     "AnonHugePages:         0 kB\n")
    assert platform.anon_huge_bytes(0x7F0000000000, str(smaps)) == 2 * MiB
    assert platform.anon_huge_bytes(0x7F00003FFFFF, str(smaps)) == 2 * MiB
    assert platform.anon_huge_bytes(0x7F0000400000, str(smaps)) == 0
    assert platform.anon_huge_bytes(0x7F0000401000, str(smaps)) is None      # no mapping there
    assert platform.anon_huge_bytes(0, str(tmp_path / "absent")) is None      # no smaps: cannot say


def _smaps_entry(addr: int) -> dict:
    out, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                if inside:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
                if inside:
                    out["perms"] = line.split()[1]
            elif inside and ":" in line:
                k, v = line.split(":", 1)
                out[k] = v.strip()
    return out


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return "never"


# ---- read_into --------------------------------------------------------------------------------

def test_read_into_at_aligned_offsets(tmp_path, open_reader):
    size = 3 * MiB + 1234
    p = tmp_path / "f"
    data = write_random(p, size, seed=2)
    r = open_reader(p)
    rng = random.Random(2)
    for _ in range(30):
        off = rng.randrange(0, align_down(size - ALIGNMENT), ALIGNMENT)
        length = rng.randrange(ALIGNMENT, align_down(size - off) + 1, ALIGNMENT)
        buf = aligned_buffer(length)
        assert r.read_into(memoryview(buf)[:length], off) == length
        assert bytes(buf[:length]) == data[off:off + length]


def test_read_into_at_and_past_the_end_of_the_file(tmp_path, open_reader):
    size = MiB + 1234
    p = tmp_path / "f"
    data = write_random(p, size, seed=3)
    r = open_reader(p)
    buf = aligned_buffer(4 * ALIGNMENT)
    last = align_down(size)
    assert r.read_into(buf, last) == 1234                 # short only at end of file
    assert bytes(buf[:1234]) == data[last:]
    assert r.read_into(buf, last - ALIGNMENT) == ALIGNMENT + 1234
    assert bytes(buf[:ALIGNMENT + 1234]) == data[last - ALIGNMENT:]
    assert r.read_into(buf, align_up(size)) == 0
    assert r.read_into(buf, 10 * align_up(size)) == 0


def test_read_into_an_aligned_file_ends_exactly(tmp_path, open_reader):
    p = tmp_path / "f"
    data = write_random(p, 2 * ALIGNMENT, seed=4)
    r = open_reader(p)
    buf = aligned_buffer(4 * ALIGNMENT)
    assert r.read_into(buf, 0) == 2 * ALIGNMENT and bytes(buf[:2 * ALIGNMENT]) == data
    assert r.read_into(buf, 2 * ALIGNMENT) == 0


def test_a_file_that_shrank_after_open_reads_short(tmp_path, open_reader):
    p = tmp_path / "f"
    data = write_random(p, MiB, seed=5)
    r = open_reader(p)
    os.truncate(p, 5000)
    buf = aligned_buffer(4 * ALIGNMENT)
    assert r.read_into(buf, 0) == 5000 and bytes(buf[:5000]) == data[:5000]
    assert r.read_into(buf, 2 * ALIGNMENT) == 0
    assert r.size == MiB                                   # the size at open
    got = b"".join(bytes(v) for _, v in read_sequential(r, 0, r.size, block=ALIGNMENT, depth=2))
    assert got == data[:5000]                              # the stream ends early, never past the bytes


def test_reads_from_many_threads_at_once(tmp_path, open_reader):
    size = 4 * MiB
    p = tmp_path / "f"
    data = write_random(p, size, seed=6)
    r = open_reader(p)
    wrong = []

    def lane(seed):
        rng = random.Random(seed)
        buf = aligned_buffer(64 * 1024)
        for _ in range(40):
            off = rng.randrange(0, size - len(buf) + 1, ALIGNMENT)
            if r.read_into(buf, off) != len(buf) or bytes(buf) != data[off:off + len(buf)]:
                wrong.append(off)

    threads = [threading.Thread(target=lane, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


# ---- what is built on it ------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 4095, 4096, 1 << 20, (3 << 20) + 1234])
def test_read_range_equals_plain_reads(tmp_path, open_reader, size):
    p = tmp_path / "f"
    data = write_random(p, size, seed=size)
    rng = random.Random(size)
    r = open_reader(p)
    for _ in range(25):
        off = rng.randrange(size)
        length = rng.randrange(1, size - off + 1)
        assert bytes(read_range(r, off, length)) == data[off:off + length]
    assert bytes(read_range(r, size - 1, 100)) == data[-1:]       # short at end of file
    assert bytes(read_range(r, size, 100)) == b""


def test_read_sequential_streams_the_file_in_order(tmp_path, open_reader):
    p = tmp_path / "f"
    data = write_random(p, (5 << 20) + 77, seed=5)
    r = open_reader(p)
    got = b"".join(bytes(v) for _, v in read_sequential(r, 0, r.size, block=1 << 20, depth=3))
    assert got == data
    part = [(off, bytes(v)) for off, v in read_sequential(r, MiB, 3 * MiB + 10, block=MiB, depth=2)]
    assert [off for off, _ in part] == [MiB, 2 * MiB, 3 * MiB]
    assert b"".join(v for _, v in part) == data[MiB:3 * MiB + 10]
    with pytest.raises(ValueError, match="aligned"):
        next(read_sequential(r, 100, r.size))


def test_hash_file_through_any_reader(tmp_path, open_reader):
    p = tmp_path / "f"
    write_random(p, 3 * MiB + 99, seed=7)
    assert hash_file(str(p), MiB, reader=open_reader(p)) == hash_file(str(p), MiB)


# ---- errors -------------------------------------------------------------------------------------

def test_opening_a_missing_file_raises_file_not_found(tmp_path, kind):
    with pytest.raises(FileNotFoundError):
        reader_class(kind)(str(tmp_path / "gone"))


def test_a_closed_reader_raises_os_error(tmp_path, open_reader):
    p = tmp_path / "f"
    write_random(p, 2 * ALIGNMENT, seed=8)
    r = open_reader(p)
    r.close()
    r.close()                                              # closing twice is harmless
    with pytest.raises(OSError) as e:
        r.read_into(aligned_buffer(ALIGNMENT), 0)
    assert e.value.errno == errno.EBADF


def failing(kind, path, ok):
    """The kind's reader class, broken on purpose after `ok` reads of `path`."""
    base = reader_class(kind)
    if base is FailingReader:
        return type("FailingReaderHere", (FailingReader,), {"broken": {str(path): ok}})
    return type(f"Failing{base.__name__}", (FailingReads, base), {"broken": {str(path): ok}})


def test_a_failing_read_raises_eio_naming_the_file(tmp_path, kind, open_reader):
    p, other = tmp_path / "f", tmp_path / "g"
    data = write_random(p, 4 * ALIGNMENT, seed=9)
    write_random(other, 4 * ALIGNMENT, seed=10)
    cls = failing(kind, p, ok=2)
    r = open_reader(p, cls)
    buf = aligned_buffer(ALIGNMENT)
    for off in (0, ALIGNMENT):                             # the reads before the drive breaks
        assert r.read_into(buf, off) == ALIGNMENT and bytes(buf) == data[off:off + ALIGNMENT]
    with pytest.raises(OSError) as e:
        r.read_into(buf, 2 * ALIGNMENT)
    assert e.value.errno == errno.EIO and e.value.filename == str(p)
    with pytest.raises(OSError):
        read_range(r, 5, 10)
    assert open_reader(other, cls).read_into(buf, 0) == ALIGNMENT     # other files are not broken


def test_failing_reads_surface_as_documented_above_the_reader(tmp_path, kind, open_reader):
    p = tmp_path / "f"
    write_random(p, 3 * MiB, seed=11)
    got = []
    with pytest.raises(OSError) as e:                      # read_sequential: the OSError of the read that failed
        for off, _ in read_sequential(open_reader(p, failing(kind, p, ok=1)), block=MiB, depth=1):
            got.append(off)
    assert e.value.errno == errno.EIO and got == [0]
    with pytest.raises(MissingError, match=re.escape(f"{p}: read failed: Input/output error")) as e:
        hash_file(str(p), MiB, reader=open_reader(p, failing(kind, p, ok=0)))
    assert e.value.exit_code == 3
