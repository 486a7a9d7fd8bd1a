"""Tables and terminal bar charts of iobench results (Rich renderables; rates in decimal GB/s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from .constants import PRESETS, SPREAD_WARN_PCT
from .result import BenchResult, GroupResult

BAR_WIDTH = 40
NO_LIMIT = (1 << 31) - 1        # a queue limit this large (INT_MAX, UINT_MAX) is no limit


def gbs(bw: float) -> str:
    return f"{bw / 1e9:.3f}"


def ms(ns: float) -> str:
    v = ns / 1e6
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _flags(suspect: bool, spread: float, trials_spread: float = 0.0) -> str:
    out = []
    if suspect:
        out.append("CACHE?")
    if max(spread, trials_spread) > SPREAD_WARN_PCT:
        out.append("spread")
    return " ".join(out)


def trials_cell(trials_bw, trials_spread_pct: float) -> str:
    """'3: 1.2' = three restarted trials whose rates spread 1.2 %; '1' for a single trial."""
    return f"{len(trials_bw)}: {trials_spread_pct:.1f}" if trials_bw else "1"


def _table(title: str, columns: Sequence[str], left: Sequence[str] = ()) -> Table:
    """Every column named (the last, "flags", holds CACHE? and spread: a result to distrust)."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in columns:
        t.add_column(col, justify="left" if col in left or col == "flags" else "right",
                     no_wrap=col in ("drive", "preset", "group", "drive/group"), min_width=7 if col == "preset" else None)
    return t


def drives_table(r: BenchResult) -> Table:
    """One row per drive and preset: the best lane count's numbers (p95 and more in --json)."""
    t = _table("Drives alone (GB/s decimal; latency at the best lane count; spr% over the windows, "
               "trials: restarted trials and their spread %)",
               ("drive", "preset", "MiB", "GB/s", "IOPS", "p50 ms", "p99 ms", "knee", "spr%", "trials", "flags"),
               ("drive", "preset"))
    for d in r.drives:
        for name in PRESETS:
            p = d.presets.get(name)
            if p is None:
                continue
            t.add_row(d.name, name, f"{p.piece_bytes / (1 << 20):.2f}", gbs(p.bw_bytes), f"{p.iops:.0f}",
                      ms(p.lat_ns.p50), ms(p.lat_ns.p99), str(p.knee_lanes),
                      f"{p.spread_pct:.1f}", trials_cell(p.trials_bw, p.trials_spread_pct),
                      _flags(p.suspect_cache, p.spread_pct, p.trials_spread_pct))
    return t


def queue_table(r: BenchResult) -> Table | None:
    """Each drive's queue limits: what a read is cut into before the device sees it."""
    if not any(d.queue for d in r.drives):
        return None
    t = _table("Device queues (a read reaches the device in requests of at most 'unit')",
               ("drive", "device", "from", "unit KiB", "max KiB", "hw KiB", "segs", "seg KiB", "lbs", "pbs",
                "opt", "min", "nr", "rot"), ("drive", "device", "from"))

    def v(x, div=1):
        if x is None:
            return "-"
        if x >= NO_LIMIT:               # the kernel's way of saying "no limit" (INT_MAX, UINT_MAX)
            return "none"
        return f"{x // div}" if x % div == 0 else f"{x / div:.1f}"

    for d in r.drives:
        q = d.queue
        if q is None:
            continue
        t.add_row(d.name, q.device or "-", q.source, v(q.unit, 1024), v(q.max_sectors_kb), v(q.max_hw_sectors_kb),
                  v(q.max_segments), v(q.max_segment_size, 1024), v(q.logical_block_size), v(q.physical_block_size),
                  v(q.optimal_io_size), v(q.minimum_io_size), v(q.nr_requests),
                  "-" if q.rotational is None else "yes" if q.rotational else "no")
    return t


def lanes_table(r: BenchResult) -> Table:
    lanes = sorted({x.lanes for d in r.drives for p in d.presets.values() for x in p.lanes})
    t = _table("GB/s by lanes (requests in flight per drive; * = knee)",
               ["drive", "preset"] + [f"x{n}" for n in lanes], ("drive", "preset"))
    for d in r.drives:
        for name in PRESETS:
            p = d.presets.get(name)
            if p is None:
                continue
            by = {x.lanes: x for x in p.lanes}
            t.add_row(d.name, name, *[gbs(by[n].bw_bytes) + ("*" if n == p.knee_lanes else "") if n in by else ""
                                      for n in lanes])
    return t


def alone_sum(r: BenchResult, g: GroupResult) -> float:
    """Bytes/s the group's members reached alone with the same preset (0 if unknown)."""
    total = 0.0
    for name in g.drives:
        try:
            total += r.drive(name).presets[g.preset].bw_bytes
        except KeyError:
            return 0.0
    return total


def groups_table(r: BenchResult) -> Table | None:
    rows: list[GroupResult] = list(r.groups) + list(r.together)
    if not rows:
        return None
    t = _table("Together (one gate, one shared window; ratio = GB/s / sum alone)",
               ("group", "preset", "GB/s", "alone", "ratio", "members GB/s", "spr%", "trials", "flags"),
               ("group", "preset", "members GB/s"))
    for g in rows:
        s = alone_sum(r, g)
        t.add_row(g.name, g.preset, gbs(g.bw_bytes), gbs(s) if s else "-",
                  f"{g.bw_bytes / s:.3f}" if s else "-", " ".join(f"{m.name} {gbs(m.bw_bytes)}" for m in g.members),
                  f"{g.spread_pct:.1f}", trials_cell(g.trials_bw, g.trials_spread_pct),
                  _flags(g.suspect_cache, g.spread_pct, g.trials_spread_pct))
    return t


def models_table(r: BenchResult) -> Table | None:
    if not any(d.model for d in r.drives):
        return None
    t = _table("Fitted drive models (request = lat + size/stream, up to the ceilings; "
               "the IOPS cap counts ceil(size / unit) device requests per read)",
               ("drive", "lat us", "stream GB/s", "ceiling GB/s", "IOPS cap", "fit err %", "trials"), ("drive",))
    for d in r.drives:
        m = d.model
        if m is None:
            continue
        t.add_row(d.name, f"{m.lat_s * 1e6:.0f}", gbs(m.stream_bw), gbs(m.bw_max),
                  f"{m.iops_max:.0f} x {m.io_unit >> 10} KiB" if m.iops_max else "-", f"{m.fit_err_pct:.1f}", str(m.samples))
    return t


def bar_chart(rows: Sequence[tuple[str, float, str]], title: str = "", width: int = BAR_WIDTH) -> Text:
    """Horizontal bars: (label, bytes/s, flag) each; the longest bar is the largest value."""
    text = Text()
    if title:
        text.append(title + "\n", style="bold")
    if not rows:
        return text
    top = max(v for _, v, _ in rows) or 1.0
    pad = max(len(label) for label, _, _ in rows)
    for label, v, flag in rows:
        n = v / top * width
        full = int(n)
        bar = "█" * full + ("▌" if n - full >= 0.5 else "")
        text.append(f"{label:<{pad}} ")
        text.append(f"{bar:<{width + 1}}", style="yellow" if flag else "cyan")
        text.append(f" {gbs(v)} GB/s" + (f"  {flag}" if flag else "") + "\n")
    return text


def ceiling_rows(r: BenchResult, tag: str = "") -> list[tuple[str, float, str]]:
    rows = []
    for name in PRESETS:
        for d in r.drives:
            p = d.presets.get(name)
            if p is not None:
                rows.append((f"{d.name} {name}{tag}", p.bw_bytes, _flags(p.suspect_cache, p.spread_pct, p.trials_spread_pct)))
    for g in list(r.groups) + list(r.together):
        rows.append((f"{g.name} {g.preset}{tag}", g.bw_bytes, _flags(g.suspect_cache, g.spread_pct, g.trials_spread_pct)))
    return rows


@dataclass(frozen=True)
class Comparison:
    """`iobench compare`: two result files and, per drive (or group) and preset, both ceilings and B/A."""

    a: str                  # the baseline's path
    b: str
    rows: tuple[dict, ...]  # compare_rows

    KIND: ClassVar[str] = "iobench-compare"
    SCHEMA: ClassVar[int] = 1

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "rows": list(self.rows)}


def compare_rows(a: BenchResult, b: BenchResult) -> list[dict]:
    """Per drive (or group) and preset present in either result: both rates and b / a (pure)."""
    def rates(r: BenchResult) -> dict:
        out = {}
        for d in r.drives:
            for name, p in d.presets.items():
                out[(d.name, name)] = p
        for g in list(r.groups) + list(r.together):
            out[(g.name, g.preset)] = g
        return out

    ra, rb = rates(a), rates(b)
    keys = list(ra) + [k for k in rb if k not in ra]
    rows = []
    for k in keys:
        x, y = ra.get(k), rb.get(k)
        bw_a = x.bw_bytes if x else None
        bw_b = y.bw_bytes if y else None
        rows.append({"name": k[0], "preset": k[1], "a_bw_bytes": bw_a, "b_bw_bytes": bw_b,
                     "ratio": (bw_b / bw_a) if bw_a and bw_b else None,
                     "suspect_cache": bool((x and x.suspect_cache) or (y and y.suspect_cache))})
    return rows


def compare_table(rows: Sequence[dict]) -> Table:
    """Both results' ceilings per drive (or group) and preset; which file is A and which B is said
    above the table (a title holding paths would wrap at the table's width)."""
    t = _table("", ("drive/group", "preset", "A GB/s", "B GB/s", "B/A", "flags"), ("drive/group", "preset"))
    for row in rows:
        t.add_row(row["name"], row["preset"], gbs(row["a_bw_bytes"]) if row["a_bw_bytes"] is not None else "-",
                  gbs(row["b_bw_bytes"]) if row["b_bw_bytes"] is not None else "-",
                  f"{row['ratio']:.3f}" if row["ratio"] is not None else "-", "CACHE?" if row["suspect_cache"] else "")
    return t


def compare_chart(a: BenchResult, b: BenchResult) -> Text:
    rows = []
    for row in compare_rows(a, b):
        label = f"{row['name']} {row['preset']}"
        if row["a_bw_bytes"] is not None:
            rows.append((label + " A", row["a_bw_bytes"], ""))
        if row["b_bw_bytes"] is not None:
            rows.append((label + " B", row["b_bw_bytes"], ""))
    return bar_chart(rows, "Ceilings, A vs B")


def topology_text(r: BenchResult) -> Text:
    """What the OS said the drives share, and which group run measured each set."""
    text = Text()
    if r.topology is None:
        return text
    measured = set(r.settings.get("topology_groups") or ())
    ran = {g.name for g in r.groups}
    runs = {frozenset(members): g for g, members in (r.settings.get("groups") or {}).items() if g in ran}
    everyone = frozenset(d.name for d in r.drives)
    for g in r.topology.groups:
        members = frozenset(g.drives)
        run = runs.get(members)
        how = (f"measured together as group {run}" + ("" if run in measured else " (--group)") if run else
               "measured together in the together run" if members == everyone and r.together else "not measured together")
        text.append(f"shared ({r.topology.source}): {', '.join(g.drives)} share {g.reason()}; {how}\n")
    if not r.topology.groups and len(r.drives) > 1 and any(d.links for d in r.topology.drives):
        text.append(f"shared ({r.topology.source}): no two drives share a disk, controller, bus or hub\n", style="dim")
    for d in r.topology.drives:
        if d.note:
            text.append(f"{d.name}: {d.note}\n", style="dim")
    return text


def notes_text(r: BenchResult) -> Text:
    text = Text()
    for d in r.drives:
        for n in d.notes:
            text.append(f"{d.name}: {n}\n", style="dim")
        for p in d.presets.values():
            for n in p.notes:
                text.append(f"{d.name} {p.preset}: {n}\n", style="yellow")
    s = r.settings
    if s.get("weights"):
        text.append(f"split weights: prefill {':'.join(map(str, s['weights']))}, decode "
                    f"{':'.join(map(str, s.get('decode_weights') or s['weights']))} ({s.get('weights_from')})\n", style="dim")
    return text
