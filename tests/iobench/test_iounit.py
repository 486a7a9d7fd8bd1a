"""The I/O unit (pure): how many device requests a read becomes, and the queue limits it comes from."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iobench import iounit
from iobench.iounit import (
    QueueLimits,
    device_requests,
    limits_from_dict,
    limits_from_ioreg,
    limits_from_sysfs,
    limits_to_dict,
    requests_for,
)
from tests.helpers import impure_imports

KiB, MiB = 1 << 10, 1 << 20


def test_the_unit_arithmetic_is_pure():
    assert impure_imports(iounit) == []


@pytest.mark.parametrize("nbytes, offset, unit, logical, physical, want", [
    (0, 0, 512 * KiB, 512, None, 0),                 # nothing read, nothing sent
    (1, 0, 512 * KiB, 512, None, 1),
    (512 * KiB, 0, 512 * KiB, 512, None, 1),
    (512 * KiB + 1, 0, 512 * KiB, 512, None, 2),     # one byte over: a whole request more
    (32 * MiB, 0, 512 * KiB, 512, None, 64),         # a prefill chunk through a loop device
    (32 * MiB, 0, 1280 * KiB, 512, None, 26),        # 25.6 units, merged pages
    (3_489_792, 0, 512 * KiB, 512, None, 7),         # the 10:5:5 primary's decode piece
    (4096, 100, 4096, 512, None, 2),                 # off a block: covers [0, 4608), two requests
    (4096, 512, 4096, 512, None, 1),                 # [512, 4608) on 512 B blocks: one unit
    (4096, 512, 4096, 512, 4096, 2),                 # ... on 4 KiB physical blocks: 3,584 to the boundary, 512
    # 4 KiB physical blocks, 10 KiB unit, read [512, 20992): the first request ends on a physical
    # boundary (7,680 B to 8,192), then 8 KiB each (10 KiB rounded down): 7,680 + 8,192 + 4,608
    (20480, 512, 10 * KiB, 512, 4096, 3),
    (20480, 0, 10 * KiB, 512, 4096, 3),              # aligned: 8 KiB cuts, 20 KiB -> 3 (not 2)
    (20480, 0, 10 * KiB, 512, None, 2),              # 512 B physical: 10 KiB cuts
])
def test_device_requests_by_hand(nbytes, offset, unit, logical, physical, want):
    assert device_requests(nbytes, offset, unit, logical, physical) == want


def test_device_requests_refuses_a_unit_under_a_block():
    with pytest.raises(ValueError):
        device_requests(4096, 0, 256, 512)


@given(n=st.integers(1, 64 * MiB), unit_blocks=st.integers(1, 4096))
def test_aligned_reads_cost_ceil_bytes_over_unit(n, unit_blocks):
    unit = unit_blocks * 512
    assert requests_for(n, unit) == -(-n // unit)
    assert requests_for(n + unit, unit) == requests_for(n, unit) + 1      # a staircase, one step per unit


LOOP = {"max_sectors_kb": "1280\n", "max_hw_sectors_kb": "1280\n", "max_segments": "128\n",
        "max_segment_size": "65536\n", "logical_block_size": "512\n", "physical_block_size": "512\n",
        "optimal_io_size": "0\n", "minimum_io_size": "512\n", "rotational": "0\n", "nr_requests": "128\n"}


def test_a_loop_devices_limits_and_its_units():
    q = limits_from_sysfs(LOOP, "loop3")
    assert q.source == "sysfs" and q.device == "loop3" and q.known
    assert (q.max_sectors_kb, q.max_segments, q.max_segment_size, q.rotational, q.nr_requests) == (1280, 128, 65536, False, 128)
    assert q.max_request_bytes == 1280 * KiB
    assert q.request_bytes == 512 * KiB                  # 128 segments of one scattered page each
    assert q.contiguous_request_bytes == 1280 * KiB      # 128 x 64 KiB segments: max_sectors binds
    assert q.units() == (512 * KiB, 1280 * KiB)
    assert q.unit == 512 * KiB                           # not known to be contiguous: the smaller cut


def test_huge_page_buffers_get_the_contiguous_cut_alone():
    q = replace(limits_from_sysfs(LOOP, "loop3"), buffers_contiguous=True)
    assert q.unit == 1280 * KiB and q.units() == (1280 * KiB,)
    plain = replace(q, buffers_contiguous=False)
    assert plain.unit == 512 * KiB and plain.units() == (512 * KiB, 1280 * KiB)
    d = limits_to_dict(q)
    assert d["buffers_contiguous"] is True and d["unit"] == 1280 * KiB and limits_from_dict(d) == q
    old = {k: v for k, v in d.items() if k not in ("buffers_contiguous", "unit")}     # written before
    assert limits_from_dict(old).buffers_contiguous is None


def test_a_virtio_disks_limits():
    vda = {"max_sectors_kb": "4096", "max_hw_sectors_kb": "2147483647", "max_segments": "254",
           "max_segment_size": "4294967295", "logical_block_size": "512", "physical_block_size": "4096",
           "optimal_io_size": "0", "minimum_io_size": "4096", "rotational": "1", "nr_requests": "256"}
    q = limits_from_sysfs(vda, "vda")
    assert q.request_bytes == 254 * 4096 and q.contiguous_request_bytes == 4 * MiB and q.rotational is True


def test_what_is_missing_or_garbled_is_unknown():
    q = limits_from_sysfs({**LOOP, "max_segments": "lots", "nr_requests": None}, "loop3")
    assert q.max_segments is None and q.nr_requests is None
    assert q.request_bytes == 1280 * KiB                 # no segment limit known: size alone
    assert limits_from_sysfs({}, "x") == QueueLimits(source="unknown", device="x")
    unknown = QueueLimits()
    assert not unknown.known and unknown.request_bytes is None and unknown.units() == ()


def test_limits_round_trip_through_a_dict():
    q = limits_from_sysfs(LOOP, "loop3")
    d = limits_to_dict(q)
    assert d["request_bytes"] == 512 * KiB and limits_from_dict(d) == q
    with pytest.raises(ValueError, match="max_segments"):
        limits_from_dict({**d, "max_segments": "128"})


IOREG = """\
+-o IOBlockStorageDriver  <class IOBlockStorageDriver, id 0x100000411, registered, matched, active, busy 0 (0 ms), retain 7>
  | {
  |   "Statistics" = {"Operations (Read)"=123}
  |   "IOMaximumByteCountRead" = 1048576
  |   "IOMaximumSegmentCountRead" = 256
  |   "IOMaximumSegmentByteCountRead" = 4096
  | }
  +-o APPLE SSD AP2048Z Media  <class IOMedia, id 0x100000412>
      {
        "BSD Name" = "disk0"
        "Preferred Block Size" = 4096
      }
+-o IOBlockStorageDriver  <class IOBlockStorageDriver, id 0x100000511>
  | {
  |   "Maximum Byte Count Read" = 524288
  | }
  +-o Samsung 990 PRO Media  <class IOMedia, id 0x100000512>
      {
        "BSD Name" = "disk4"
      }
"""


def test_ioreg_gives_the_maximum_read_of_the_right_disk():
    q = limits_from_ioreg(IOREG, "disk0")
    assert (q.source, q.device, q.max_sectors_kb, q.max_segments, q.max_segment_size, q.logical_block_size) == \
        ("ioreg", "disk0", 1024, 256, 4096, 4096)
    assert q.request_bytes == MiB
    other = limits_from_ioreg(IOREG, "disk4")
    assert other.max_sectors_kb == 512 and other.max_segments is None and other.request_bytes == 512 * KiB
    assert limits_from_ioreg(IOREG, "disk9") == QueueLimits(source="unknown", device="disk9")
