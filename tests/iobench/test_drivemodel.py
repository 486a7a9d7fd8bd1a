"""The fitted drive model: its formula, the staircase pricing of device requests, the fit, and its
JSON form."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iobench.drivemodel import DriveModel, DriveSample, fit_drive_model, model_from_dict, model_to_dict

MiB = 1 << 20
SIZES = [4096, 1 * MiB, 1_572_864, 3_489_792, 8 * MiB, 16 * MiB]
DEPTHS = [1, 2, 3, 4, 8, 16]


def samples_of(model, sizes=SIZES, depths=DEPTHS, noise=0.0):
    out = []
    for i, s in enumerate(sizes):
        for j, q in enumerate(depths):
            wobble = 1 + noise * (((i * 7 + j * 3) % 5) - 2) / 2
            out.append(DriveSample(s, q, model.throughput(s, q) * wobble))
    return out


def test_formula_alone_overlapped_and_capped():
    m = DriveModel(lat_s=100e-6, stream_bw=2e9, bw_max=6e9)
    s = 4 * MiB
    t1 = 100e-6 + s / 2e9
    assert m.request_time(s, 1) == pytest.approx(t1)
    assert m.throughput(s, 1) == pytest.approx(s / t1)
    assert m.throughput(s, 2) == pytest.approx(2 * s / t1)
    assert m.throughput(s, 64) == pytest.approx(6e9)
    assert m.request_time(s, 64) == pytest.approx(64 * s / 6e9)       # Little's law
    assert m.request_time(0, 4) == pytest.approx(100e-6)
    assert m.throughput(0, 4) == 0.0


def test_iops_ceiling_counts_io_units():
    m = DriveModel(lat_s=0.0, stream_bw=1e12, bw_max=1e12, iops_max=100, io_unit=MiB)
    assert m.ops(1) == 1 and m.ops(MiB) == 1 and m.ops(3 * MiB // 2) == 2      # whole device requests
    assert m.throughput(4096, 8) == pytest.approx(100 * 4096)          # small reads: 100 per second
    assert m.throughput(MiB, 8) == pytest.approx(100 * MiB)
    assert m.throughput(8 * MiB, 8) == pytest.approx(100 * MiB)        # large reads: io_unit x 100 per second
    assert m.request_time(MiB, 1) == pytest.approx(0.01)
    assert m.request_time(264, 1) == pytest.approx(0.01)               # one Engram row still costs an operation


KiB = 1 << 10


def test_staircase_prices_whole_device_requests():
    # an IOPS-limited drive (60 requests/s) whose queue cuts reads every 512 KiB: the rate a
    # request size gets is 60 x size / ceil(size / 512 KiB), worked by hand
    m = DriveModel(lat_s=0.0, stream_bw=1e12, bw_max=1e12, iops_max=60, io_unit=512 * KiB)
    cases = [
        (4096, 1, 60 * 4096),                          # rand4k: one request
        (512 * KiB, 1, 31_457_280),                    # 60 x 524,288
        (512 * KiB + 4096, 2, 15_851_520),             # one page over: a second request, half the rate
        (1_572_864, 3, 31_457_280),                    # decode 10:5:5 replica piece: exactly 3 units
        (1_835_008, 4, 27_525_120),                    # decode 10:6:6 replica piece: 3.5 units -> 4
        (3_489_792, 7, 60 * 3_489_792 / 7),            # decode 10:5:5 primary piece: 6.66 units -> 7
        (16 * MiB, 32, 31_457_280),
    ]
    for size, ops, bw in cases:
        assert m.ops(size) == ops
        assert m.throughput(size, 8) == pytest.approx(bw)
        assert m.request_time(size, 1) == pytest.approx(ops / 60)        # alone: its requests at 60/s
    # the smooth count a schema-1 model was fitted with: 3.5 units cost 3.5 requests
    smooth = DriveModel(lat_s=0.0, stream_bw=1e12, bw_max=1e12, iops_max=60, io_unit=512 * KiB, staircase=False)
    assert smooth.ops(1_835_008) == 3.5 and smooth.request_time(1_835_008, 1) == pytest.approx(3.5 / 60)
    assert smooth.ops(4096) == 1


def test_the_staircase_fit_uses_the_queues_units():
    # a loop device's queue: 1280 KiB requests, 128 segments, so 512 KiB with scattered pages
    true = DriveModel(lat_s=2e-3, stream_bw=100e6, bw_max=100e6, iops_max=60, io_unit=512 * KiB)
    sizes = SIZES + [1_835_008, 2_965_504, 512 * KiB + 4096]
    m = fit_drive_model(samples_of(true, sizes=sizes), units=(512 * KiB, 1280 * KiB))
    assert m.io_unit == 512 * KiB and m.staircase
    assert m.iops_max == pytest.approx(60, rel=0.02)
    for s in sizes:
        assert m.throughput(s, 4) == pytest.approx(true.throughput(s, 4), rel=0.03)
    # told only of a unit the drive does not cut at, the fit cannot follow the steps as well
    wrong = fit_drive_model(samples_of(true, sizes=sizes), units=(1280 * KiB,))
    assert wrong.io_unit == 1280 * KiB and wrong.fit_err_pct > m.fit_err_pct


def test_fit_recovers_a_latency_bandwidth_drive():
    true = DriveModel(lat_s=80e-6, stream_bw=3e9, bw_max=7e9)
    m = fit_drive_model(samples_of(true))
    assert m.lat_s == pytest.approx(80e-6, rel=0.05)
    assert m.stream_bw == pytest.approx(3e9, rel=0.02)
    assert m.bw_max == pytest.approx(7e9)
    assert m.iops_max is None
    assert m.fit_err_pct < 0.5
    assert m.samples == len(SIZES) * len(DEPTHS)


def test_fit_finds_an_iops_limited_drive():
    # 100 MB/s of bandwidth but only 60 operations/s of at most 512 KiB: small reads are slow and
    # large ones reach 60 x 512 KiB = 31 MB/s
    true = DriveModel(lat_s=2e-3, stream_bw=100e6, bw_max=100e6, iops_max=60, io_unit=512 << 10)
    m = fit_drive_model(samples_of(true))
    assert m.iops_max == pytest.approx(60, rel=0.02)
    assert m.io_unit == 512 << 10
    assert m.fit_err_pct < 1.0
    for s in SIZES:
        for q in (1, 4, 16):
            assert m.throughput(s, q) == pytest.approx(true.throughput(s, q), rel=0.03)


def test_fit_keeps_no_iops_ceiling_when_bandwidth_explains_the_trials():
    true = DriveModel(lat_s=200e-6, stream_bw=100e6, bw_max=100e6)
    m = fit_drive_model(samples_of(true, noise=0.02))
    assert m.iops_max is None
    assert m.fit_err_pct < 3.0


def test_fit_of_one_sample_is_not_pessimistic():
    m = fit_drive_model([DriveSample(MiB, 8, 2e8)])
    assert m.throughput(MiB, 8) == pytest.approx(2e8, rel=0.01)
    assert m.stream_bw == pytest.approx(2e8, rel=0.05)


def test_fit_needs_a_usable_sample():
    with pytest.raises(ValueError):
        fit_drive_model([])
    with pytest.raises(ValueError):
        fit_drive_model([DriveSample(MiB, 1, 0.0)])


def test_dict_round_trip_and_keys():
    m = DriveModel(lat_s=1e-4, stream_bw=1e9, bw_max=2e9, iops_max=5000.0, io_unit=512 * 1024, fit_err_pct=1.5, samples=9)
    d = model_to_dict(m)
    assert {"schema", "lat_s", "stream_bw", "bw_max", "iops_max", "io_unit", "fit_err_pct", "samples", "staircase"} <= set(d)
    assert d["schema"] == 2 and d["staircase"] is True and "ceil(size/io_unit)" in d["form"]
    assert model_from_dict(d) == m
    with pytest.raises(ValueError):
        model_from_dict({**d, "schema": 99})
    old = {k: v for k, v in d.items() if k != "staircase"} | {"schema": 1}
    assert model_from_dict(old) == DriveModel(**{**m.__dict__, "staircase": False})


@settings(max_examples=60, deadline=None)
@given(lat=st.floats(0, 0.01), sbw=st.floats(1e6, 1e10), cap=st.floats(1e6, 1e10),
       iops=st.one_of(st.none(), st.floats(10, 1e6)), size=st.integers(1, 64 * MiB), q=st.integers(1, 64))
def test_model_invariants(lat, sbw, cap, iops, size, q):
    m = DriveModel(lat_s=lat, stream_bw=sbw, bw_max=cap, iops_max=iops)
    thr = m.throughput(size, q)
    assert 0 < thr <= cap * (1 + 1e-9)
    assert m.request_time(size, q) >= (lat + size / sbw) * (1 - 1e-9)   # never faster than alone
    assert m.request_time(size, 1) == pytest.approx(size / m.throughput(size, 1))
    assert m.throughput(size, q + 1) >= thr * (1 - 1e-9)          # more in flight never slower
    assert m.request_time(size, q + 1) >= m.request_time(size, q) * (1 - 1e-9)  # nor each faster
