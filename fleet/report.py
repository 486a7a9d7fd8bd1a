"""What a fleet run found: per node its drives, replica state, ceilings, chosen weights, predicted
tok/s and problems, and the fleet's table (pure; the JSON shape is pinned by tests/fleet)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from replicas.checks import FilePiece

from .constants import OK, REPORT_KIND, REPORT_SCHEMA, STATUSES


@dataclass(frozen=True)
class DriveRow:
    name: str                        # the rig's name of the member (its drive label)
    path: str
    role: str                        # primary / replica
    state: str                       # identical / mismatch / missing / unreadable ('' not verified)
    bad: tuple[FilePiece, ...] = ()      # the bad pieces, by model file and piece
    seq_Bps: float | None = None     # ceilings from the node's iobench result, bytes/s
    prefill_Bps: float | None = None
    decode_Bps: float | None = None
    prefill_weight: int | None = None   # the node's plan
    decode_weight: int | None = None


@dataclass(frozen=True)
class NodeResult:
    node: str
    status: str                      # fleet.constants.STATUSES
    rig: str = ""
    host: str = ""                   # the cluster's address of the node that ran the job
    seconds: float = 0.0
    reused: bool = False             # nothing changed since the last run: its result, not re-measured
    drives: tuple[DriveRow, ...] = ()
    engine: str = ""
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    upstream: str = ""               # '' not checked, 'match', 'mismatch'
    bench: str = ""                  # paths on the node: the iobench result, plan and profile used
    plan: str = ""
    profile: str = ""
    problems: tuple[str, ...] = ()

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")


@dataclass(frozen=True)
class FleetReport:
    created: str                     # ISO 8601 UTC
    manifest: str                    # the model digest every node was checked against
    nodes: tuple[NodeResult, ...]
    engine: str = ""
    upstream: str = ""               # the upstream file's source ('' none)
    settings: dict = field(default_factory=dict)
    schema: int = REPORT_SCHEMA

    KIND: ClassVar[str] = REPORT_KIND      # `fleet run --json` and `fleet show --json` print the report file's document
    SCHEMA: ClassVar[int] = REPORT_SCHEMA

    def to_dict(self) -> dict:
        return report_to_dict(self)

    @property
    def ok(self) -> bool:
        return all(n.status == OK for n in self.nodes)


def failed(node: str, status: str, problem: str, **kw) -> NodeResult:
    """A node whose job did not finish: its status and one line why."""
    return NodeResult(node=node, status=status, problems=(problem,), **kw)


def reused(result: NodeResult) -> NodeResult:
    return replace(result, reused=True)


# ---- dict <-> dataclass -----------------------------------------------------------------------

def _drive_to(d: DriveRow) -> dict:
    return {"name": d.name, "path": d.path, "role": d.role, "state": d.state,
            "bad_pieces": [{"file": b.file, "index": b.index, "offset": b.offset, "length": b.length} for b in d.bad],
            "ceilings_Bps": {"seq": d.seq_Bps, "prefill": d.prefill_Bps, "decode": d.decode_Bps},
            "weights": {"prefill": d.prefill_weight, "decode": d.decode_weight}}


def node_to_dict(n: NodeResult) -> dict:
    return {"node": n.node, "status": n.status, "rig": n.rig, "host": n.host, "seconds": round(n.seconds, 3),
            "reused": n.reused, "engine": n.engine, "drives": [_drive_to(d) for d in n.drives],
            "predicted_tok_s": {"prefill": n.prefill_tok_s, "decode": n.decode_tok_s}, "upstream": n.upstream,
            "bench": n.bench, "plan": n.plan, "profile": n.profile, "problems": list(n.problems)}


def node_from_dict(d: dict) -> NodeResult:
    drives = tuple(DriveRow(name=x["name"], path=x["path"], role=x["role"], state=x["state"],
                            bad=tuple(FilePiece(**b) for b in x.get("bad_pieces", ())),
                            seq_Bps=x["ceilings_Bps"]["seq"], prefill_Bps=x["ceilings_Bps"]["prefill"],
                            decode_Bps=x["ceilings_Bps"]["decode"], prefill_weight=x["weights"]["prefill"],
                            decode_weight=x["weights"]["decode"]) for x in d.get("drives", ()))
    tok = d.get("predicted_tok_s") or {}
    return NodeResult(node=d["node"], status=d["status"], rig=d.get("rig", ""), host=d.get("host", ""),
                      seconds=d.get("seconds", 0.0), reused=d.get("reused", False), drives=drives,
                      engine=d.get("engine", ""), prefill_tok_s=tok.get("prefill"), decode_tok_s=tok.get("decode"),
                      upstream=d.get("upstream", ""), bench=d.get("bench", ""), plan=d.get("plan", ""),
                      profile=d.get("profile", ""), problems=tuple(d.get("problems", ())))


def report_to_dict(r: FleetReport) -> dict:
    return {"schema": r.schema, "kind": REPORT_KIND, "created": r.created, "manifest": r.manifest, "engine": r.engine,
            "upstream": r.upstream, "settings": r.settings, "ok": r.ok,
            "counts": {s: c for s in STATUSES if (c := sum(n.status == s for n in r.nodes))},
            "nodes": [node_to_dict(n) for n in r.nodes]}


def report_from_dict(d: dict) -> FleetReport:
    return FleetReport(created=d["created"], manifest=d["manifest"], nodes=tuple(node_from_dict(n) for n in d["nodes"]),
                       engine=d.get("engine", ""), upstream=d.get("upstream", ""), settings=d.get("settings", {}),
                       schema=d["schema"])


# ---- the table --------------------------------------------------------------------------------

COLUMNS = ("node", "status", "drive", "replica", "seq MB/s", "prefill MB/s", "decode MB/s", "weights p/d",
           "prefill tok/s", "decode tok/s")


def _mbs(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def _tok(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _state(d: DriveRow) -> str:
    return f"{d.state} ({len(d.bad)} bad)" if d.bad else (d.state or "-")


def table_rows(r: FleetReport) -> list[tuple[str, ...]]:
    """One row per drive of each node (the node's figures on its first row); a node without drives
    (down, lost, timed out, missing) gets one row."""
    rows = []
    for n in r.nodes:
        status = n.status + (" (reused)" if n.reused else "")
        head = (n.node, status)
        tail = (_tok(n.prefill_tok_s), _tok(n.decode_tok_s))
        if not n.drives:
            rows.append(head + ("-",) * 6 + tail)
            continue
        for i, d in enumerate(n.drives):
            w = "-" if d.prefill_weight is None else f"{d.prefill_weight}/{d.decode_weight}"
            rows.append((head if i == 0 else ("", "")) + (d.name, _state(d), _mbs(d.seq_Bps), _mbs(d.prefill_Bps),
                                                          _mbs(d.decode_Bps), w) + (tail if i == 0 else ("", "")))
    return rows


def problem_lines(r: FleetReport) -> list[str]:
    """Every problem of every node, one line each, named by node; bad pieces named by file and piece."""
    lines = []
    for n in r.nodes:
        for d in n.drives:
            for b in d.bad:
                lines.append(f"{n.node}: {d.name} ({d.path}): {b.file} bad piece {b.index} at byte {b.offset}, "
                             f"{b.length} bytes")
        lines.extend(f"{n.node}: {p}" for p in n.problems)
    return lines


def render_table(r: FleetReport) -> str:
    """The fleet as plain text: the table, then the problems."""
    rows = [COLUMNS, *table_rows(r)]
    width = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    left = {0, 1, 2, 3}
    lines = ["  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, width))).rstrip()
             for row in rows]
    counts = ", ".join(f"{sum(n.status == s for n in r.nodes)} {s}" for s in STATUSES if any(n.status == s for n in r.nodes))
    lines.append(f"{len(r.nodes)} node(s): {counts}; manifest {r.manifest[:16]}" + (f"; engine {r.engine}" if r.engine else ""))
    problems = problem_lines(r)
    if problems:
        lines.append("problems:")
        lines.extend(f"  {p}" for p in problems)
    return "\n".join(lines) + "\n"
