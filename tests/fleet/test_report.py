"""The fleet report: its JSON shape (pinned), the round trip, the table and the exit code."""

import pytest

from fleet.cli import exit_code
from fleet.constants import DOWN, LOST, MISMATCH, OK
from fleet.report import DriveRow, FleetReport, NodeResult, render_table, report_from_dict, report_to_dict
from replicas.checks import FilePiece
from tests.helpers import impure_imports

DRIVES = (DriveRow("internal", "/a/m.gguf", "primary", "identical", (), 3.0e7, 2.9e7, 2.5e7, 10, 12),
          DriveRow("green", "/b/m.gguf", "replica", "mismatch", (FilePiece("m.gguf", 2, 2 << 20, 1 << 20),)))
REPORT = FleetReport("2026-12-01T17:00:00.000Z", "ab" * 32, (
    NodeResult("alpha", OK, rig="/srv/rig", host="10.0.0.1", seconds=4.2, drives=DRIVES[:1], engine="ds4-argodrive",
               prefill_tok_s=120.5, decode_tok_s=4.25, plan="/srv/rig/plans/p.json", profile="/srv/rig/profiles/f.env"),
    NodeResult("beta", MISMATCH, rig="/srv/rig", drives=DRIVES, problems=("green: repair with `replicas repair /b/m.gguf`",)),
    NodeResult("gamma", LOST, problems=("the node left the cluster",)),
), engine="ds4-argodrive")


def test_the_json_shape_is_pinned_and_loads_back():
    d = report_to_dict(REPORT)
    assert list(d) == ["schema", "kind", "created", "manifest", "engine", "upstream", "settings", "ok", "counts", "nodes"]
    assert d["kind"] == "fleet" and d["ok"] is False and d["counts"] == {"ok": 1, "mismatch": 1, "lost": 1}
    assert list(d["nodes"][0]) == ["node", "status", "rig", "host", "seconds", "reused", "engine", "drives",
                                   "predicted_tok_s", "upstream", "bench", "plan", "profile", "problems"]
    assert list(d["nodes"][1]["drives"][1]) == ["name", "path", "role", "state", "bad_pieces", "ceilings_Bps", "weights"]
    assert d["nodes"][1]["drives"][1]["bad_pieces"] == [{"file": "m.gguf", "index": 2, "offset": 2 << 20, "length": 1 << 20}]
    assert report_from_dict(d) == REPORT


def test_the_table_has_a_row_per_drive_and_names_every_problem():
    text = render_table(REPORT)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["node", "status", "drive", "replica"]
    assert lines[1].split() == ["alpha", "ok", "internal", "identical", "30.0", "29.0", "25.0", "10/12", "120.50", "4.25"]
    assert lines[3].split()[:4] == ["green", "mismatch", "(1", "bad)"]
    assert lines[4].split()[:2] == ["gamma", "lost"]
    assert "3 node(s): 1 ok, 1 mismatch, 1 lost" in text
    assert "  beta: green (/b/m.gguf): m.gguf bad piece 2 at byte 2097152, 1048576 bytes" in lines
    assert "  gamma: the node left the cluster" in lines


@pytest.mark.parametrize("statuses, code", [((OK, OK), 0), ((OK, DOWN), 3), ((LOST, MISMATCH), 1), ((OK, "failed"), 1)])
def test_exit_code(statuses, code):
    r = FleetReport("t", "d", tuple(NodeResult(f"n{i}", s) for i, s in enumerate(statuses)))
    assert exit_code(r) == code


def test_a_status_outside_the_list_is_refused():
    with pytest.raises(ValueError):
        NodeResult("a", "fine")


def test_pure_modules_stay_pure():
    import importlib

    for name in ("fleet.report", "fleet.spec", "fleet.job", "replicas.upstream"):
        assert impure_imports(importlib.import_module(name)) == [], name
