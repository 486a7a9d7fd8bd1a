"""The harness's pure parts: orders, gates, medians, gains, pairs, claims, results shape, rendering."""

import json
import xml.dom.minidom

import pytest

from core.errors import UsageError
from engine_bridge.harness.arms import (
    ArmSpec,
    Row,
    Snapshot,
    arm_sequence,
    build_results,
    gate_cache,
    gate_load,
    gate_plan,
    gate_sha,
    gate_swap,
    other_cpu,
    parse_arm,
)
from engine_bridge.harness.summary import render_failures, render_idle, render_markdown, render_svg
from planner.measured import RESULTS_KEYS, parse_results
from tests.helpers import impure_imports


def test_orders():
    assert arm_sequence(["A", "B"], "ABBA") == ("A", "B", "B", "A")
    assert arm_sequence(["A", "B"], "BAAB") == ("B", "A", "A", "B")
    assert arm_sequence(["A", "B"], "ABAB") == ("A", "B", "A", "B")
    assert arm_sequence(["U", "S1", "S2", "S3"], "ladder") == tuple("U S1 U S2 U S3 S3 U S2 U S1 U".split())
    assert arm_sequence(["U", "S1", "S2"], "ladder") == tuple("U S1 U S2 S2 U S1 U".split())
    assert arm_sequence(["A", "B"], "ABBA", repeat=2) == tuple("ABBAABBA")
    for bad, msg in ((["A"], "at least two"), (["A", "A"], "once")):
        with pytest.raises(UsageError, match=msg):
            arm_sequence(bad, "ABBA")
    with pytest.raises(UsageError, match="--order"):
        arm_sequence(["A", "B"], "AABB")


def test_parse_arm():
    assert parse_arm("base=plans/a.json") == ("base", "plans/a.json")
    assert parse_arm("s=10:5:5/10:6:6") == ("s", "10:5:5/10:6:6")
    for bad in ("nothing", "=x.json", "a b=x", "a="):
        with pytest.raises(UsageError, match="--arm"):
            parse_arm(bad)


def test_gates():
    assert gate_sha("ab" * 32, "ab" * 32).ok
    assert not gate_sha("ab" * 32, "cd" * 32).ok and "differs" in gate_sha("ab" * 32, "cd" * 32).detail
    assert not gate_sha(None, "cd").ok
    assert gate_cache({"cache_experts_applied": 64}, 64).ok
    assert not gate_cache({"cache_experts_applied": 32}, 64).ok
    assert gate_cache({"cache_experts": 16, "cache_experts_applied": 16}, None).ok
    assert not gate_cache({}, 64).ok
    # no --cache-experts on a model of fewer experts than run's default: every arm failed the gate
    small = gate_cache({"cache_experts": 64, "cache_experts_applied": 32}, None)
    assert small.ok and "run's default 64" in small.detail
    assert not gate_cache({"cache_experts": 64, "cache_experts_applied": 80}, None).ok
    assert gate_swap(Snapshot(swap_free_kb=100, pswpout=5), Snapshot(swap_free_kb=100, pswpout=5)).ok
    assert not gate_swap(Snapshot(pswpout=5), Snapshot(pswpout=6)).ok
    assert not gate_swap(Snapshot(swap_free_kb=100), Snapshot(swap_free_kb=90)).ok
    b, a = Snapshot(t=0, cpu_user_s=0, own_user_s=0), Snapshot(t=10, cpu_user_s=12, own_user_s=9)
    assert other_cpu(b, a) == pytest.approx(0.3)
    assert gate_load(b, a, 0.5).ok and not gate_load(b, a, 0.2).ok


def test_plan_gate_fails_a_source_given_bytes_that_read_nothing_and_names_one_the_split_left_out():
    spec = ArmSpec("S", ("/p", "/g", "/w"), (2, 1, 1), (2, 1, 1))
    srcs = [{"index": i, "bytes": 5, "degraded": False} for i in range(3)]
    split = {"phase": "decode", "source": 2, "kind": "split",
             "message": "source[2] read nothing in decode: given nothing by the split: ..."}
    g = gate_plan({"sources": srcs, "idle": [split]}, spec)
    assert g.ok and "source 2 given nothing by the split in decode" in g.detail
    unread = dict(split, kind="unread", message="source[2] read nothing in decode: the plan gives it 98,304 B ...")
    g = gate_plan({"sources": srcs, "idle": [split, unread]}, spec)
    assert not g.ok and g.detail == unread["message"]
    assert gate_plan({"sources": srcs}, spec).detail == "3 sources, none degraded"     # runs from before `idle`


def test_results_name_a_source_that_sat_out_once_per_arm_and_fail_one_given_bytes():
    H = "c" * 64
    split = {"phase": "decode", "source": 1, "kind": "split",
             "message": "source[1] read nothing in decode: given nothing by the split: ..."}
    unread = dict(split, kind="unread", message="source[1] read nothing in decode: the plan gives it 262,144 B ...")
    rows = [_row(0, "A", _result(H, 10, 5)), _row(1, "B", dict(_result(H, 20, 6, nsrc=2), idle=[split])),
            _row(2, "B", dict(_result(H, 20, 6, nsrc=2), idle=[split])), _row(3, "B", dict(_result(H, 20, 6, nsrc=2),
                                                                                       idle=[unread])),
            _row(4, "A", _result(H, 10, 5))]
    doc = build_results(SPECS, "ABBA", "ABBAB", rows, SETTINGS, "t")
    assert [r["ok"] for r in doc["rows"]] == [True, True, True, False, True]
    assert doc["rows"][1]["idle"] == [split] and doc["rows"][0]["idle"] == []
    assert render_idle(doc) == f"note: B: {split['message']}\n"
    assert render_failures(doc) == f"arm 4/5 B FAILED plan: {unread['message']}\n"


def _result(sha, pre, steady, gen=None, cache=64, applied=64, nsrc=1):
    return {"ctx_tokens": 600, "prefill_tokens": 512, "prefill_tps": pre, "gen_tokens": 88, "gen_tps": gen or steady,
            "gen_first_ms": 12.5, "gen_steady_tokens": 87, "gen_steady_tps": steady, "kvcache_bytes": 1000,
            "output_sha256": sha, "cache_experts": cache, "cache_experts_applied": applied, "hits": 10,
            "misses": 5, "misses_per_token": 0.5, "weights": {"prefill": [1], "decode": [1]},
            "sources": [{"index": i, "bytes": 1, "degraded": False} for i in range(nsrc)], "events": []}


def _row(seq, arm, result, busy=0.0, error=""):
    return Row(seq, arm, result, error, Snapshot(t=seq * 10.0, cpu_busy_s=0, own_cpu_s=0),
               Snapshot(t=seq * 10.0 + 10, cpu_busy_s=busy, own_cpu_s=0, cpu_user_s=busy))


SPECS = [ArmSpec("A", ("/p",), (1,), (1,)), ArmSpec("B", ("/p", "/r"), (2, 1), (10, 6))]
SETTINGS = {"prompt_tokens": 512, "gen_tokens": 88, "cache_experts": 64, "max_other_cpu": 0.5}


def test_build_results_medians_gains_pairs_and_labels():
    H, X = "a" * 64, "b" * 64
    degraded = _result(H, 500, 500, nsrc=2)
    degraded["sources"][1]["degraded"] = True
    rows = [_row(0, "A", _result(H, 10, 5)), _row(1, "B", _result(H, 20, 6, nsrc=2)),
            _row(2, "B", _result(H, 22, 4, nsrc=2)), _row(3, "A", _result(H, 12, 5)),
            _row(4, "A", _result(X, 100, 100)),                      # wrong hash: kept, labelled, excluded
            _row(5, "B", _result(H, 500, 500, nsrc=2), busy=9.0),     # others busy: load gate
            _row(6, "B", None, error="exit 3: gone"),                 # never ran
            _row(7, "B", _result(H, 500, 500, applied=32, nsrc=2)),   # cache not honoured
            _row(8, "B", degraded),                                   # a replica failed mid-run
            _row(9, "B", _result(H, 500, 500, nsrc=1))]               # read fewer sources than the arm has
    doc = build_results(SPECS, "ABBA", [r.arm for r in rows], rows, SETTINGS, "2026-11-29T19:00:00Z")
    assert tuple(doc) == RESULTS_KEYS
    parse_results(json.loads(json.dumps(doc)))
    assert [r["failed"] for r in doc["rows"]] == [[], [], [], [], ["sha"], ["load"], ["error"], ["cache"], ["plan"],
                                                  ["plan"]]
    assert "source(s) 1 degraded" in doc["rows"][8]["gates"]["plan"]["detail"]
    assert doc["reference_sha256"] == H
    m = doc["medians"]
    assert m["A"]["n"] == 2 and m["A"]["n_failed"] == 1 and m["A"]["prefill_tps"] == 11
    assert m["B"]["n"] == 2 and m["B"]["n_failed"] == 5 and m["B"]["prefill_tps"] == 21 and m["B"]["gen_steady_tps"] == 5
    assert doc["gains"]["B"]["prefill_tps"] == pytest.approx(21 / 11)
    assert doc["gains"]["A"]["prefill_tps"] == 1
    # B@1 pairs with A@0 (tie between 0 and 3 -> nearer is 0), B@2 with A@3
    assert [(p["seq"], p["control_seq"]) for p in doc["pairs"]] == [(1, 0), (2, 3)]
    assert doc["pairs"][0]["prefill_tps_delta"] == 10 and doc["pairs"][1]["gen_steady_tps_delta"] == -1
    assert doc["claims"]["B"] == {"prefill_tps": "gain", "gen_tps": "unclear", "gen_steady_tps": "unclear"}
    row = doc["rows"][0]
    assert set(row) == {"seq", "arm", "ok", "failed", "error", "gates", "wall_s", "output_sha256", "metrics",
                        "weights", "sources", "events", "idle", "log"}
    assert set(row["gates"]) == {"sha", "cache", "plan", "swap", "load"}


def test_reference_never_completing_fails_every_sha_gate():
    rows = [_row(0, "A", None, error="boom"), _row(1, "B", _result("a" * 64, 1, 1, nsrc=2))]
    doc = build_results(SPECS, "ABAB", ["A", "B"], rows, SETTINGS, "t")
    assert doc["rows"][1]["failed"] == ["sha"]
    assert doc["medians"]["A"]["prefill_tps"] is None and doc["gains"]["B"]["prefill_tps"] is None
    render_markdown(doc), render_svg(doc)   # nothing to plot still renders


def test_markdown_and_svg():
    H = "c" * 64
    rows = [_row(0, "A", _result(H, 10, 5)), _row(1, "B", _result(H, 20, 6, nsrc=2)),
            _row(2, "B", _result("d" * 64, 1, 1, nsrc=2)), _row(3, "A", _result(H, 10, 5))]
    doc = build_results(SPECS, "ABBA", "ABBA", rows, SETTINGS, "t")
    md = render_markdown(doc)
    assert "| B | 2 | 2:1 | 10:6 | 1 | 1 | 20.00 | 2.00 |" in md
    assert "FAILED: sha" in md and "differs from the reference" in md
    assert "- **B** vs A: prefill gain" in md
    svg = render_svg(doc)
    dom = xml.dom.minidom.parseString(svg)           # well-formed
    assert len(dom.getElementsByTagName("rect")) == 1 + 4   # background + 2 panels x 2 bars
    assert "(2.00x)" in svg and svg.count("<circle") == 6 and svg.count("<path") == 2


def test_the_pure_parts_stay_pure():
    from engine_bridge.harness import arms, summary

    assert impure_imports(arms) == [] and impure_imports(summary) == []
