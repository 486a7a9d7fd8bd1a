"""A fitted model of one drive, for the planner: how long a request takes at a queue depth (pure).

One request alone costs a fixed latency plus its size over the rate one request streams at;
`in_flight` requests overlap, until the drive's bandwidth ceiling or its operation-rate (IOPS)
ceiling binds:

    t1(s)        = lat_s + s / stream_bw                         seconds, one request alone
    throughput   = min(q * s / t1(s), bw_max, iops_max * s / ops(s))   bytes/s, q in flight
    request_time = q * s / throughput                            seconds (Little's law)

`ops(s)` counts the drive operations one request becomes: the block layer issues at most
`io_unit` bytes per operation (one bio), and an IOPS limit (a cgroup's read_iops, a slow
controller) counts those, so a 1.5 MiB piece costs two operations and a 1 MiB piece one.

The fit is a small grid search in log space on the measured (size, in_flight, bytes/s) trials,
minimising squared log error; the IOPS ceiling is kept only where it explains the data clearly
better than bandwidth alone. `fit_err_pct` is the mean absolute relative throughput error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .constants import DRIVE_IO_UNIT

MODEL_SCHEMA = 1


@dataclass(frozen=True)
class DriveSample:
    """One measured trial: `in_flight` requests of `size_bytes` each kept outstanding on the drive."""

    size_bytes: int
    in_flight: int
    bw_bytes: float            # bytes/s delivered
    weight: float = 1.0        # relative weight in the fit


@dataclass(frozen=True)
class DriveModel:
    lat_s: float               # fixed per-request latency, s
    stream_bw: float           # bytes/s one request streams at once started
    bw_max: float              # bytes/s ceiling with many requests in flight
    iops_max: float | None = None   # drive operations/s ceiling; None when it never binds
    io_unit: int = DRIVE_IO_UNIT    # bytes per drive operation the IOPS ceiling counts
    fit_err_pct: float = 0.0   # mean |predicted/measured - 1| over the trials, %
    samples: int = 0           # trials the fit saw

    def ops(self, size_bytes: int) -> int:
        """Drive operations one request of size_bytes becomes (at least 1)."""
        return max(1, -(-int(size_bytes) // self.io_unit))

    def throughput(self, size_bytes: int, in_flight: int) -> float:
        """Bytes/s the drive delivers with `in_flight` requests of `size_bytes` outstanding."""
        s = max(0, int(size_bytes))
        q = max(1, int(in_flight))
        if s == 0:
            return 0.0
        t1 = self.lat_s + s / self.stream_bw
        bw = min(q * s / t1, self.bw_max)
        if self.iops_max:
            bw = min(bw, self.iops_max * s / self.ops(s))
        return bw

    def request_time(self, size_bytes: int, in_flight: int) -> float:
        """Mean seconds for one request of `size_bytes` while `in_flight` such requests are
        outstanding on the drive (in_flight=1: the request alone)."""
        s = max(0, int(size_bytes))
        q = max(1, int(in_flight))
        if s == 0:
            return self.lat_s
        return q * s / self.throughput(s, q)


def _predict(lat: np.ndarray, sbw: np.ndarray, bw_max: float, iops: float | None, unit: int,
             size: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Throughput for every (lat, stream_bw) pair (broadcast over a leading grid axis) and sample."""
    t1 = lat[..., None] + size / sbw[..., None]
    bw = np.minimum(q * size / t1, bw_max)
    if iops:
        ops = np.maximum(1, np.ceil(size / unit))
        bw = np.minimum(bw, iops * size / ops)
    return bw


def _fit_grid(size, q, meas, w, bw_max, iops, unit):
    """Best (lat_s, stream_bw, loss) by a coarse then a fine log grid."""
    log_meas = np.log(meas)

    def search(lats, sbws):
        L, S = np.meshgrid(lats, sbws, indexing="ij")
        pred = _predict(L.ravel(), S.ravel(), bw_max, iops, unit, size, q)
        loss = (w * (np.log(pred) - log_meas) ** 2).sum(axis=1) / w.sum()
        # among equally good fits (too few distinct sizes to tell), prefer the least
        # pessimistic: one request streaming at the ceiling
        loss = loss + 1e-9 * np.log(bw_max / S.ravel()) ** 2
        i = int(np.argmin(loss))
        return float(L.ravel()[i]), float(S.ravel()[i]), float(loss[i])

    lats = np.concatenate(([0.0], np.logspace(-7, 0.5, 151)))
    sbws = bw_max * np.logspace(-2.5, 0.7, 129)
    lat, sbw, _ = search(lats, sbws)
    # refine: +-one coarse step around the best, 41 points each way
    step_l, step_s = 10 ** (7.5 / 150), 10 ** (3.2 / 128)
    fine_l = np.concatenate(([0.0], lat * np.logspace(-math.log10(step_l), math.log10(step_l), 41))) if lat > 0 \
        else np.concatenate(([0.0], np.logspace(-9, -7, 41)))
    fine_s = sbw * np.logspace(-math.log10(step_s), math.log10(step_s), 41)
    return search(fine_l, fine_s)


def fit_drive_model(samples: Iterable[DriveSample], io_unit: int = DRIVE_IO_UNIT) -> DriveModel:
    """Fit a DriveModel to measured trials. Needs at least one sample with bytes/s > 0;
    raises ValueError otherwise."""
    good = [x for x in samples if x.bw_bytes > 0 and x.size_bytes > 0 and x.in_flight > 0]
    if not good:
        raise ValueError("fit_drive_model: no usable samples (need size, in_flight and bytes/s > 0)")
    size = np.array([x.size_bytes for x in good], dtype=float)
    q = np.array([x.in_flight for x in good], dtype=float)
    meas = np.array([x.bw_bytes for x in good], dtype=float)
    w = np.array([max(0.0, x.weight) for x in good], dtype=float)
    if w.sum() <= 0:
        w = np.ones_like(w)
    bw_max = float(meas.max())

    best = None
    ops = np.maximum(1, np.ceil(size / io_unit))
    iops_candidate = float((meas / size * ops).max())
    for iops in (None, iops_candidate):
        lat, sbw, loss = _fit_grid(size, q, meas, w, bw_max, iops, io_unit)
        model = DriveModel(lat_s=lat, stream_bw=sbw, bw_max=bw_max, iops_max=iops, io_unit=io_unit)
        err = _err_pct(model, good)
        if best is None:
            best = (loss, err, model)
        # keep the IOPS ceiling only when it explains the trials clearly better
        elif loss < 0.7 * best[0] and err < best[1] - 0.5:
            best = (loss, err, model)
    _, err, model = best
    return DriveModel(lat_s=model.lat_s, stream_bw=model.stream_bw, bw_max=model.bw_max,
                      iops_max=model.iops_max, io_unit=io_unit, fit_err_pct=round(err, 3),
                      samples=len(good))


def _err_pct(model: DriveModel, samples: Sequence[DriveSample]) -> float:
    errs = [abs(model.throughput(x.size_bytes, x.in_flight) / x.bw_bytes - 1) for x in samples]
    return 100.0 * sum(errs) / len(errs)


def model_to_dict(m: DriveModel) -> dict:
    return {
        "schema": MODEL_SCHEMA,
        "form": "t1 = lat_s + size/stream_bw; bw = min(q*size/t1, bw_max, iops_max*size/ceil(size/io_unit))",
        "lat_s": m.lat_s,
        "stream_bw": m.stream_bw,
        "bw_max": m.bw_max,
        "iops_max": m.iops_max,
        "io_unit": m.io_unit,
        "fit_err_pct": m.fit_err_pct,
        "samples": m.samples,
    }


def model_from_dict(d: dict) -> DriveModel:
    """Inverse of model_to_dict; raises KeyError/TypeError/ValueError on a malformed dict."""
    if d.get("schema", MODEL_SCHEMA) != MODEL_SCHEMA:
        raise ValueError(f"drive model schema {d.get('schema')!r}, this version reads {MODEL_SCHEMA}")
    iops = d.get("iops_max")
    return DriveModel(lat_s=float(d["lat_s"]), stream_bw=float(d["stream_bw"]), bw_max=float(d["bw_max"]),
                      iops_max=None if iops is None else float(iops), io_unit=int(d.get("io_unit", DRIVE_IO_UNIT)),
                      fit_err_pct=float(d.get("fit_err_pct", 0.0)), samples=int(d.get("samples", 0)))
