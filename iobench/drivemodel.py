"""A fitted model of one drive, for the planner: how long a request takes at a queue depth (pure).

One request alone costs a fixed latency plus its size over the rate one request streams at;
`in_flight` requests overlap, until the drive's bandwidth ceiling or its operation-rate (IOPS)
ceiling binds:

    t1(s)        = lat_s + s / stream_bw                         seconds, one request alone
    throughput   = min(q * s / t1(s), bw_max, iops_max * s / ops(s))   bytes/s, q in flight
    request_time = q * s / throughput                            seconds (Little's law)

`ops(s) = ceil(s / io_unit)` counts the device requests one read becomes (`iounit.requests_for`):
the block layer cuts a read at the queue's limits and an IOPS limit (a cgroup's riops, a slow
controller) counts those requests, so the price of a read is a staircase in whole units: a
read one byte over a unit costs a whole request more. `io_unit` comes from the device's own
queue limits (`iounit.QueueLimits.units`: the cut with scattered pages, or with merged ones);
where the OS reports none it is measured, fitted among a few common sizes.

The fit is a small grid search in log space on the measured (size, in_flight, bytes/s) trials,
minimising squared log error, over the ceilings (bw_max, and iops_max with io_unit) and then
lat_s and stream_bw; the IOPS ceiling is kept only where it explains the data clearly better
than bandwidth alone. `fit_err_pct` is the mean absolute relative throughput error.

A model written before the staircase (model schema 1) was fitted with a smooth count,
max(1, s / io_unit); it loads with `staircase=False` and keeps pricing reads that way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .constants import DRIVE_IO_UNIT
from .iounit import requests_for

MODEL_SCHEMA = 2
READ_MODEL_SCHEMAS = (1, 2)


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
    io_unit: int = DRIVE_IO_UNIT    # bytes per device request: the IOPS ceiling counts these
    fit_err_pct: float = 0.0   # mean |predicted/measured - 1| over the trials, %
    samples: int = 0           # trials the fit saw
    staircase: bool = True     # False: a schema-1 model, fitted with a smooth operation count

    def ops(self, size_bytes: int) -> float:
        """Device requests one read of size_bytes becomes: ceil(size / io_unit), at least 1
        (schema-1 models: max(1, size / io_unit))."""
        if not self.staircase:
            return max(1.0, size_bytes / self.io_unit)
        return float(max(1, requests_for(int(size_bytes), self.io_unit)))

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


UNITS = tuple(k << 10 for k in (128, 256, 512, 768, 1024, 1536, 2048))   # io_unit candidates, bytes
CEILING_STEPS = (0.80, 0.85, 0.90, 0.93, 0.96, 0.98, 1.0)   # bw_max candidates, x the best trial
IOPS_STEPS = (0.85, 0.92, 1.0)                               # iops_max candidates, x the best trial


def _ops(size: np.ndarray, unit: float) -> np.ndarray:
    """Device requests per read of each size: the staircase DriveModel.ops prices."""
    return np.array([max(1, requests_for(int(s), int(unit))) for s in size], dtype=float)


def _predict(lat: np.ndarray, sbw: np.ndarray, bw_max: float, iops: float | None, unit: float,
             size: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Throughput for every (lat, stream_bw) pair (broadcast over a leading grid axis) and sample."""
    t1 = lat[..., None] + size / sbw[..., None]
    bw = np.minimum(q * size / t1, bw_max)
    if iops:
        bw = np.minimum(bw, iops * size / _ops(size, unit))
    return bw


class _Grid:
    """Squared-log-error search over (lat_s, stream_bw) for fixed ceilings."""

    def __init__(self, size, q, meas, w):
        self.size, self.q, self.w = size, q, w
        self.log_meas = np.log(meas)

    def search(self, lats, sbws, bw_max, iops, unit):
        L, S = np.meshgrid(lats, sbws, indexing="ij")
        L, S = L.ravel(), S.ravel()
        pred = _predict(L, S, bw_max, iops, unit, self.size, self.q)
        loss = (self.w * (np.log(pred) - self.log_meas) ** 2).sum(axis=1) / self.w.sum()
        # among equally good fits (too few distinct sizes to tell), prefer the least
        # pessimistic: one request streaming at the ceiling
        loss = loss + 1e-9 * np.log(bw_max / S) ** 2
        i = int(np.argmin(loss))
        return float(loss[i]), float(L[i]), float(S[i])

    def coarse(self, bw_max, iops, unit):
        return self.search(np.concatenate(([0.0], np.logspace(-7, 0.5, 61))), bw_max * np.logspace(-2.5, 0.7, 49),
                           bw_max, iops, unit)

    def fine(self, lat, sbw, bw_max, iops, unit):
        step_l, step_s = 10 ** (7.5 / 60), 10 ** (3.2 / 48)
        fine_l = (np.concatenate(([0.0], lat * np.logspace(-math.log10(step_l), math.log10(step_l), 41))) if lat > 0
                  else np.concatenate(([0.0], np.logspace(-9, -6.9, 41))))
        fine_s = sbw * np.logspace(-math.log10(step_s), math.log10(step_s), 41)
        return self.search(fine_l, fine_s, bw_max, iops, unit)


def fit_drive_model(samples: Iterable[DriveSample], io_unit: int = DRIVE_IO_UNIT,
                    units: Sequence[int] = ()) -> DriveModel:
    """Fit a DriveModel to measured trials. Needs at least one sample with bytes/s > 0;
    raises ValueError otherwise. `units`: the device request sizes the queue limits allow
    (`QueueLimits.units()`); the IOPS ceiling counts requests of one of them. Without them the
    unit is measured: fitted among UNITS. `io_unit` is kept when no IOPS ceiling is (default:
    the smallest of `units`)."""
    good = [x for x in samples if x.bw_bytes > 0 and x.size_bytes > 0 and x.in_flight > 0]
    if not good:
        raise ValueError("fit_drive_model: no usable samples (need size, in_flight and bytes/s > 0)")
    size = np.array([x.size_bytes for x in good], dtype=float)
    q = np.array([x.in_flight for x in good], dtype=float)
    meas = np.array([x.bw_bytes for x in good], dtype=float)
    w = np.array([max(0.0, x.weight) for x in good], dtype=float)
    if w.sum() <= 0:
        w = np.ones_like(w)
    grid = _Grid(size, q, meas, w)
    top = float(meas.max())

    units = tuple(int(u) for u in units if u and u > 0)
    if units:
        io_unit = units[0]
    variants = [(None, float(io_unit))]
    for unit in units or UNITS:
        rate = float((meas / size * _ops(size, unit)).max())     # the most operations/s any trial made
        variants += [(rate * k, float(unit)) for k in IOPS_STEPS]

    best = {}
    for bw_max in (top * k for k in CEILING_STEPS):
        for iops, unit in variants:
            loss, lat, sbw = grid.coarse(bw_max, iops, unit)
            key = iops is not None
            if key not in best or loss < best[key][0]:
                best[key] = (loss, lat, sbw, bw_max, iops, unit)
    fitted = {}
    for key, (_, lat, sbw, bw_max, iops, unit) in best.items():
        loss, lat, sbw = grid.fine(lat, sbw, bw_max, iops, unit)
        model = DriveModel(lat_s=lat, stream_bw=sbw, bw_max=bw_max, iops_max=iops, io_unit=int(unit))
        fitted[key] = (loss, _err_pct(model, good), model)
    loss, err, model = fitted[False]
    if True in fitted:
        l2, e2, m2 = fitted[True]
        # keep the IOPS ceiling only when it explains the trials clearly better
        if l2 < 0.7 * loss and e2 < err - 0.5:
            err, model = e2, m2
    return DriveModel(lat_s=model.lat_s, stream_bw=model.stream_bw, bw_max=model.bw_max, iops_max=model.iops_max,
                      io_unit=model.io_unit, fit_err_pct=round(err, 3), samples=len(good))


def _err_pct(model: DriveModel, samples: Sequence[DriveSample]) -> float:
    errs = [abs(model.throughput(x.size_bytes, x.in_flight) / x.bw_bytes - 1) for x in samples]
    return 100.0 * sum(errs) / len(errs)


def model_to_dict(m: DriveModel) -> dict:
    return {
        "schema": MODEL_SCHEMA,
        "form": ("t1 = lat_s + size/stream_bw; bw = min(q*size/t1, bw_max, iops_max*size/ops); "
                 + ("ops = ceil(size/io_unit)" if m.staircase else "ops = max(1, size/io_unit)")),
        "lat_s": m.lat_s,
        "stream_bw": m.stream_bw,
        "bw_max": m.bw_max,
        "iops_max": m.iops_max,
        "io_unit": m.io_unit,
        "fit_err_pct": m.fit_err_pct,
        "samples": m.samples,
        "staircase": m.staircase,
    }


def model_from_dict(d: dict) -> DriveModel:
    """Inverse of model_to_dict; raises KeyError/TypeError/ValueError on a malformed dict."""
    schema = d.get("schema", MODEL_SCHEMA)
    if schema not in READ_MODEL_SCHEMAS:
        raise ValueError(f"drive model schema {schema!r}, this version reads {' or '.join(map(str, READ_MODEL_SCHEMAS))}")
    iops = d.get("iops_max")
    return DriveModel(lat_s=float(d["lat_s"]), stream_bw=float(d["stream_bw"]), bw_max=float(d["bw_max"]),
                      iops_max=None if iops is None else float(iops), io_unit=int(d.get("io_unit", DRIVE_IO_UNIT)),
                      fit_err_pct=float(d.get("fit_err_pct", 0.0)), samples=int(d.get("samples", 0)),
                      staircase=schema >= 2 and bool(d.get("staircase", True)))
