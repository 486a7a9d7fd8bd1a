"""colibri plans: `planner solve --engine colibri` (one weight vector, the stripe switch, colibri's
own workload), the plan's `stripe` key, and no silent idle drive."""

import json
import os

import pytest
from typer.testing import CliRunner

from core.errors import RigError, UsageError
from planner.cli import app
from planner.colibri_model import ColibriWorkload
from planner.idle import colibri_idle
from planner.model import Drive
from planner.plan import Phase, Plan, Source, plan_from_dict, plan_to_dict
from planner.plans import load_plan, shards_held
from planner.solve import colibri_single, solve_colibri_plan
from tests.planner.helpers import FAST, SLOW, make_rig

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_solve_colibri_writes_one_weight_vector_and_the_stripe_switch(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    r = invoke("solve", "--rig", rig.root, "--engine", "colibri", "--workload", "ds4-v41", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["engine"] == "colibri" and d["stripe"] is False
    assert d["prefill"]["weights"] == d["decode"]["weights"]          # colibri places once for both phases
    assert d["workload"]["engine"] == d["workload"]["modelled_as"] == "colibri"
    assert d["workload"]["decode"]["read_bytes"] == 19_906_560       # a whole expert, not a component
    pre = d["prefill"]["predicted"]
    assert [s["name"] for s in pre["sources"]] == ["fast", "slow", "laggy"]
    assert sum(s["cut"] for s in pre["sources"]) == 256
    assert sum(s["experts"] for s in pre["sources"]) == 40 * 384
    assert pre["sources"][0]["experts"] > pre["sources"][1]["experts"] > pre["sources"][2]["experts"] > 0
    stripe = d["provenance"]["model"]["stripe"]
    assert stripe["possible"] and set(stripe["score"]) == {"off", "on"} and stripe["score"]["off"] <= stripe["score"]["on"]
    shown = invoke("show", d["path"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    w = ":".join(map(str, d["prefill"]["weights"]))
    assert f"colibri weights {w} for both phases (COLI_DISK_WEIGHTS); stripe: off (objective" in text
    assert "cut /256" in text and "experts" in text and "whole, each from the drive its placement picks" in text
    assert "predicted as ds4-argodrive" not in text


def test_reads_under_4_mib_never_stripe_and_say_why():
    cw = ColibriWorkload(layers=8, experts=64, top_k=4, expert_bytes=3 << 20, prefill_reads=40.0, misses_per_token=6.0)
    drives = (Drive("a", FAST), Drive("b", FAST))
    plan = solve_colibri_plan((Source("a", "/a"), Source("b", "/b")), drives, cw)
    assert plan.stripe is False
    assert "under the 4 MiB colibri stripes" in plan.provenance["model"]["stripe"]["why_not"]
    big = solve_colibri_plan((Source("a", "/a"), Source("b", "/b")), drives,
                             ColibriWorkload(layers=8, experts=64, top_k=4, expert_bytes=16 << 20, prefill_reads=40.0,
                                             misses_per_token=6.0))
    assert big.stripe is True and big.baselines["decode"]["other_stripe"]["stripe"] is False
    assert big.prefill.predicted["stripe"] is True


def test_the_stripe_key_is_pinned_for_colibri_only_and_old_plans_load():
    src = (Source("a", "/a"), Source("b", "/b"))
    plan = Plan(sources=src, prefill=Phase((2, 1)), decode=Phase((2, 1)), engine="colibri", stripe=True)
    d = plan_to_dict(plan)
    assert list(d) == ["schema", "kind", "engine", "created", "sources", "prefill", "decode", "baselines",
                       "alternatives", "provenance", "geometry", "workload", "stripe"]
    assert d["schema"] == 2 and plan_from_dict(json.loads(json.dumps(d))) == plan
    ds4 = plan_to_dict(Plan(sources=src, prefill=Phase((2, 1)), decode=Phase((2, 1))))
    assert "stripe" not in ds4
    del d["stripe"]                                            # a colibri plan written before the key
    assert plan_from_dict(d).stripe is False
    d["stripe"] = "yes"
    with pytest.raises(RigError, match="p.json: key 'stripe' must be true or false, got 'yes'"):
        plan_from_dict(d, "p.json")


def test_a_drive_without_experts_or_shards_is_named():
    # 2 layers x 4 experts hash into buckets 0, 243, 44, 218, 190, 52, 200, 186: weights 100:1:1 cut at
    # 251 and 253, so the two mirrors' slices hold none of them.
    cw = ColibriWorkload(layers=2, experts=4, top_k=2, expert_bytes=1 << 20, prefill_reads=4.0, misses_per_token=1.0)
    drives = (Drive("m", FAST), Drive("g", SLOW), Drive("w", SLOW))
    pred = colibri_single(drives, cw, (100, 1, 1), False, (), ())
    plan = Plan(sources=tuple(Source(d.name, "/" + d.name) for d in drives), engine="colibri",
                prefill=Phase((100, 1, 1), pred["prefill"]), decode=Phase((100, 1, 1), pred["decode"]))
    got = colibri_idle(plan, (2, 4))
    assert [r.source for r in got] == ["g", "w"]
    assert got[0].text() == ("g serves no expert reads: weights 100:1:1 give it 2 of 256 hash buckets, and none of the "
                             "model's 2 x 4 (layer, expert) pairs hash there")
    got = colibri_idle(plan, (2, 4), ((2, 2), (0, 2), None))
    assert got[0].source == "g" and "it holds none of the model's 2 shards" in got[0].text()
    fine = colibri_single(drives, cw, (9, 3, 3), False, (), ())
    assert colibri_idle(Plan(sources=plan.sources, engine="colibri", prefill=Phase((9, 3, 3), fine["prefill"]),
                             decode=Phase((9, 3, 3), fine["decode"])), (2, 4)) == []


def test_shards_held_counts_the_models_shards_by_name(tmp_path):
    dirs = []
    for name in ("m", "g", "w"):
        os.makedirs(tmp_path / name)
        dirs.append(str(tmp_path / name))
    for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
        open(os.path.join(dirs[0], n), "w").close()
    open(os.path.join(dirs[1], "model-00002-of-00002.safetensors"), "w").close()
    srcs = tuple(Source(n, d) for n, d in zip("mgw", dirs))
    assert shards_held(srcs) == ((2, 2), (1, 2), (0, 2))
    assert shards_held((Source("m", str(tmp_path / "model.gguf")), Source("g", dirs[1]))) == (None, None)


def test_a_solved_plan_on_disk_round_trips(tmp_path):
    rig, _ = make_rig(tmp_path / "rig", names=("a", "b"), models=(FAST, FAST))
    r = invoke("solve", "--rig", rig.root, "--engine", "colibri", "--workload", "ds4-v41", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["stripe"] is True                                   # twin drives, 19.9 MB reads: striping wins
    p = load_plan(d["path"])
    assert p.stripe is True and p.engine == "colibri"
    sim = invoke("simulate", "--rig", rig.root, "--engine", "colibri", "--workload", "ds4-v41", "--phase", "decode",
                 "--weights", ":".join(map(str, p.decode.weights)), "--stripe", "--json")
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.stdout)["throughput_Bps"] == p.decode.predicted["throughput_Bps"]
    bad = invoke("simulate", "--rig", rig.root, "--phase", "decode", "--weights", "1:1", "--stripe")
    assert bad.exit_code == 2 and "ds4-argodrive does not stripe reads" in bad.stderr


def test_a_cache_holding_every_expert_still_solves():
    cw = ColibriWorkload(layers=4, experts=16, top_k=2, expert_bytes=1 << 20, prefill_reads=8.0, misses_per_token=0.0)
    plan = solve_colibri_plan((Source("a", "/a"), Source("b", "/b")), (Drive("a", FAST), Drive("b", SLOW)), cw)
    assert plan.decode.predicted["throughput_Bps"] == 0.0 and plan.baselines["decode"]["gain_over_equal"] == 1.0
    assert plan.prefill.predicted["throughput_Bps"] > 0


def test_the_tuner_refuses_a_colibri_plan_in_one_line(tmp_path):
    from planner.tui.load import load_tuner

    rig, _ = make_rig(tmp_path / "rig")
    assert invoke("solve", "--rig", rig.root, "--engine", "colibri", "--workload", "ds4-v41").exit_code == 0
    with pytest.raises(UsageError, match=r"is for colibri; the tuner edits ds4-argodrive's per-read splits"):
        load_tuner(rig.root)
