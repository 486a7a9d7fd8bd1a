"""The fio job equivalent to an iobench shape, and fio's answer (fio's `bw_bytes`, bytes/s)."""

from __future__ import annotations

import json
import shutil
import subprocess

from core.errors import MismatchError, MissingError
from core import platform
from core.constants import ALIGNMENT

from .shapes import Shape


def fio_binary() -> str | None:
    return shutil.which("fio")


def fio_args(fio: str, path: str, shape: Shape, lanes: int, runtime_s: float, ramp_s: float,
             engine: str | None = None) -> list[str]:
    """fio command line reading `path` like `shape` at `lanes` in flight (pure).

    seq and prefill walk the file (prefill skips the rest of each chunk: `rw=read:<skip>`);
    decode reads random offsets on the component grid. One job, `lanes` deep, O_DIRECT.
    """
    engine = engine or ("libaio" if platform.is_linux() else "posixaio")
    args = [fio, "--name=iobench", f"--filename={path}", "--readonly", "--direct=1", f"--ioengine={engine}",
            f"--iodepth={lanes}", f"--bs={shape.piece_bytes}", f"--runtime={max(1, round(runtime_s * 1000))}ms",
            "--time_based", f"--ramp_time={round(ramp_s * 1000)}ms", "--output-format=json",
            "--lat_percentiles=1", "--percentile_list=50:95:99", "--randrepeat=0", "--norandommap"]
    if shape.pattern == "seq":
        skip = shape.step - shape.piece_bytes
        args.append(f"--rw=read:{skip}" if skip > 0 else "--rw=read")
        if shape.first:
            args.append(f"--offset={shape.first - shape.first % ALIGNMENT}")
    else:
        align = shape.step if shape.step % ALIGNMENT == 0 else ALIGNMENT
        args += ["--rw=randread", f"--blockalign={align}"]
        if shape.first:
            args.append(f"--offset={shape.first - shape.first % ALIGNMENT}")
    return args


def parse_fio_json(text: str) -> dict:
    """{'bw_bytes', 'iops', 'lat_ns': {'p50', 'p95', 'p99', 'mean'}} of the first job's reads (pure)."""
    start = text.find("{")     # fio may print notes before the JSON
    doc = json.loads(text[start:] if start >= 0 else text)
    read = doc["jobs"][0]["read"]
    lat = read.get("lat_ns") or read.get("clat_ns") or {}
    pct = lat.get("percentile") or {}

    def p(key):
        for k, v in pct.items():
            if abs(float(k) - key) < 1e-6:
                return int(v)
        return 0

    return {"bw_bytes": float(read["bw_bytes"]), "iops": float(read["iops"]),
            "lat_ns": {"p50": p(50), "p95": p(95), "p99": p(99), "mean": int(lat.get("mean", 0))}}


def run_fio(args: list[str], timeout: float) -> dict:
    if not args or not shutil.which(args[0]):
        raise MissingError("fio is not installed (apt-get install fio / brew install fio)")
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MismatchError(f"fio did not finish within {timeout:.0f}s") from None
    if p.returncode != 0:
        msg = (p.stderr.strip() or p.stdout.strip()).splitlines()
        raise MismatchError(f"fio failed (exit {p.returncode}): {msg[-1] if msg else 'no output'}")
    try:
        return parse_fio_json(p.stdout)
    except (ValueError, KeyError, IndexError) as e:
        raise MismatchError(f"fio's JSON output could not be read ({e})") from None
