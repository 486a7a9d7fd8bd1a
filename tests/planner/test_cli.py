import json
import os

import pytest
from typer.testing import CliRunner

from core.rig import Rig
from planner.cli import app
from planner.plan import Phase, Plan, Source, plan_from_dict, plan_to_dict
from planner.plans import latest_plan, load_plan, save_plan
from iobench.drivemodel import DriveModel
from tests.planner.helpers import FAST, SLOW, make_rig, tuner_rig

runner = CliRunner()
COMPONENT_BYTES = 6_635_520        # DeepSeek V4.1 Flash Q4's expert component (the named workload ds4-v41)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_split_json_matches_design_worked_fact():
    r = invoke("split", "--weights", "10:6:6", "--length", COMPONENT_BYTES, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [p["length"] for p in d["pieces"]] == [2_965_504, 1_835_008, 1_835_008]
    assert [p["blocks"] for p in d["pieces"]] == [11, 7, 7]
    assert d["smallest_equivalent"] == [3, 2, 2]


@pytest.mark.parametrize("args", [
    ("split", "--weights", "0:5:5"),
    ("split", "--weights", "101:5:5"),
    ("split", "--weights", "10:5:5:5"),
    ("split", "--weights", "10:5:5", "--length", "-1"),
    ("split", "--weights", "10:5:5", "--length", "6.6MB"),
    ("split", "--weights", "10:5:5", "--offset", "-4096"),
    ("split", "--weights", "10:x"),
])
def test_bad_split_input_is_one_line_and_exit_2(args):
    r = invoke(*args)
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("planner: error: ")


def test_solve_writes_a_plan_that_loads_back(tmp_path):
    rig, bench = tuner_rig(tmp_path / "rig")
    r = invoke("solve", "--rig", rig.root, "--json", "--background", "primary:engram")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert os.path.dirname(d["path"]) == os.path.join(rig.root, "plans")
    p = load_plan(d["path"])
    assert [s.name for s in p.sources] == ["fast", "slow", "laggy"]
    assert p.provenance["bench"] == bench and p.provenance["rig"] == rig.root
    assert set(p.baselines) == {"prefill", "decode"}
    assert {"capability", "equal"} <= set(p.baselines["decode"])
    assert p.decode.predicted["throughput_Bps"] >= p.baselines["decode"]["equal"]["throughput_Bps"]
    assert {a["phase"] for a in p.alternatives} == {"prefill", "decode"}
    assert latest_plan(rig) == p
    shown = invoke("show", d["path"])
    assert shown.exit_code == 0 and "prefill" in shown.stdout and "█" in shown.stdout


def test_simulate_json(tmp_path):
    rig, _ = make_rig(tmp_path / "rig")
    r = invoke("simulate", "--rig", rig.root, "--weights", "10:6:6", "--phase", "decode", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # the rig's model is not here: ds4-v41, whose every decode read is a 6,635,520 B component
    # that 10:6:6 cuts into 2,965,504 / 1,835,008 / 1,835,008 B
    b = [s["bytes"] for s in d["sources"]]
    assert b[0] / b[1] == pytest.approx(2_965_504 / 1_835_008) and b[1] == b[2]
    assert d["read_bytes"] == pytest.approx(COMPONENT_BYTES) and len({s["pieces"] for s in d["sources"]}) == 1
    assert [s["experts"] > 0 for s in d["sources"]] == [True, False, False]     # each read starts on the primary
    assert sum(s["share"] for s in d["sources"]) == pytest.approx(1.0)
    assert d["lands_last"] in ("fast", "slow", "laggy") and d["time_per_read_s"] > 0 and d["tok_s"] > 0
    assert "notice: the rig's model" in r.stderr


@pytest.mark.parametrize("args", [
    ("simulate", "--weights", "10:5", "--phase", "decode"),             # 2 weights for 3 sources
    ("simulate", "--weights", "10:5:5", "--phase", "middle"),
    ("simulate", "--weights", "10:5:5", "--phase", "decode", "--background", "green:engram"),
    ("simulate", "--weights", "10:5:5", "--phase", "decode", "--background", "primary:150%"),
])
def test_bad_model_input_is_exit_2(tmp_path, args):
    rig, _ = make_rig(tmp_path / "rig")
    r = invoke(*args, "--rig", rig.root)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stderr.startswith("planner: error: ")


def test_rig_primary_unknown_to_the_bench_result_is_exit_2(tmp_path):
    rig, bench = make_rig(tmp_path / "rig")
    with open(bench) as f:
        d = json.load(f)
    d["drives"][0].update(name="other", path="/elsewhere/model.gguf")
    with open(bench, "w") as f:
        json.dump(d, f)
    r = invoke("solve", "--rig", rig.root)
    assert r.exit_code == 2
    assert "'fast'" in r.stderr and "Traceback" not in r.output


def test_a_replica_unknown_to_the_bench_result_is_left_out_and_said(tmp_path):
    """A replica synced after the last bench: the plan goes on with the members measured and says
    which command measures the new one (refusing left the rig stuck when it could not be measured)."""
    rig, bench = make_rig(tmp_path / "rig")
    with open(bench) as f:
        d = json.load(f)
    d["drives"][2].update(name="other", path="/elsewhere/model.gguf")
    with open(bench, "w") as f:
        json.dump(d, f)
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    assert [s["name"] for s in json.loads(r.stdout)["sources"]] == ["fast", "slow"]
    assert "replica 'laggy' is not in the bench result" in r.stderr and "iobench run --rig" in r.stderr


@pytest.mark.parametrize("text", [
    "{",
    "[]",
    json.dumps({"kind": "plan", "schema": 99}),
    json.dumps({"kind": "plan", "schema": 1, "sources": [{"name": "a", "path": "/a"}],
                "prefill": {"weights": [0]}, "decode": {"weights": [1]}}),
    json.dumps({"kind": "plan", "schema": 1, "sources": [{"name": "a", "path": "/a"}],
                "prefill": {"weights": [1, 1]}, "decode": {"weights": [1]}}),
])
def test_malformed_plan_file_is_exit_2(tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_text(text)
    r = invoke("show", path)
    assert r.exit_code == 2
    assert "Traceback" not in r.output and r.stderr.startswith(f"planner: error: {path}")


def test_plans_and_results_are_named_the_same_way_in_every_tool(tmp_path):
    """`planner show latest` works as `engine-bridge run --plan latest` does: a file, 'latest' or
    a name in rig/plans; --bench takes a result the same way (a file, 'latest', a name in rig/bench)."""
    rig, _ = tuner_rig(tmp_path / "rig")          # a small model: each solve of the named ds4-v41 took seconds
    r = invoke("solve", "--rig", rig.root, "--bench", "latest", "--json")
    assert r.exit_code == 0, r.output
    path = json.loads(r.stdout)["path"]
    name = os.path.basename(path)
    bench = os.path.basename(json.loads(r.stdout)["provenance"]["bench"])
    assert invoke("solve", "--rig", rig.root, "--bench", bench[:-len(".json")]).exit_code == 0
    for ref in ("latest", name, name[:-len(".json")]):
        shown = invoke("show", ref, "--rig", rig.root, "--json")
        assert shown.exit_code == 0, shown.output
    assert invoke("show", name, "--rig", rig.root).stdout.startswith(f"plan {path}")


def test_show_without_plans_says_how_to_make_one(tmp_path):
    r = invoke("show", "--rig", tmp_path / "rig")
    assert r.exit_code == 3 and "planner solve" in r.stderr


@pytest.mark.parametrize("args, message", [
    (("solve", "--bench", "/nonexistent/result.json"), "/nonexistent/result.json: no such iobench result file"),
    (("show", "/nonexistent/plan.json"), "/nonexistent/plan.json: no such plan file"),
    (("show", "latest"), "no plans in"),
])
def test_a_missing_result_or_plan_is_exit_3(tmp_path, args, message):
    rig, _ = make_rig(tmp_path / "rig")
    r = invoke(*args, "--rig", rig.root)
    assert r.exit_code == 3, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("planner: error: ") and message in lines[0]


def test_plan_schema_keys_are_pinned_and_round_trip(tmp_path):
    plan = Plan(sources=(Source("internal", "/a/m.gguf"), Source("green", "/b/m.gguf"), Source("white", "/c/m.gguf")),
                prefill=Phase((2, 1, 1), {"throughput_Bps": 1.0}), decode=Phase((3, 2, 2), {"throughput_Bps": 2.0}),
                baselines={"decode": {"equal": {}}}, alternatives=({"phase": "decode", "weights": [1, 1, 1]},),
                provenance={"bench": "/r/bench/x.json"})
    d = plan_to_dict(plan)
    assert list(d) == ["schema", "kind", "engine", "created", "sources", "prefill", "decode",
                       "baselines", "alternatives", "provenance", "geometry", "workload", "switches"]
    assert d["schema"] == 3 and d["kind"] == "plan" and d["switches"] == []
    assert list(d["prefill"]) == ["weights", "predicted"] and list(d["sources"][0]) == ["name", "path"]
    rig = Rig(root=str(tmp_path / "rig"))
    path = save_plan(rig, plan)
    back = load_plan(path)
    assert back.created and back == plan.__class__(**{**plan.__dict__, "created": back.created})
    assert plan_from_dict(json.loads(json.dumps(plan_to_dict(back)))) == back
    assert os.path.basename(path).endswith("Z.json")


def test_without_rig_toml_the_bench_order_is_the_source_order(tmp_path):
    rig, bench = make_rig(tmp_path / "rig")
    os.remove(rig.rig_file)
    r = invoke("simulate", "--rig", rig.root, "--bench", bench, "--weights", "2:1:1", "--phase", "prefill", "--json")
    assert r.exit_code == 0, r.output
    assert [s["name"] for s in json.loads(r.stdout)["sources"]] == ["fast", "slow", "laggy"]


def test_background_specs():
    from core.errors import UsageError
    from planner.plans import parse_background

    names = ["internal", "green", "white"]
    assert parse_background("primary:engram", names).source == 0
    b = parse_background("white:25%", names)
    assert (b.source, b.kind, b.value) == (2, "busy", 0.25)
    for bad in ("primary", "green:fast", "blue:engram", "green:100%", "green:x%"):
        with pytest.raises(UsageError):
            parse_background(bad, names)


def test_fit_only_is_recorded_in_provenance(tmp_path):
    rig, _ = tuner_rig(tmp_path / "rig")
    for flag, expect in (([], True), (["--fit-only"], False)):
        r = invoke("solve", "--rig", rig.root, "--json", *flag)
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["provenance"]["calibrated"] is expect


def test_show_gives_each_alternative_one_signed_delta_and_whole_paths_when_piped(tmp_path):
    deep = tmp_path.joinpath(*[f"thunderbolt-enclosure-{i:02d}" for i in range(6)], "rig")
    rig, _ = tuner_rig(deep)
    r = invoke("solve", "--rig", rig.root, "--json")
    assert r.exit_code == 0, r.output
    path = json.loads(r.stdout)["path"]
    with open(path) as f:
        d = json.load(f)
    decode = [a for a in d["alternatives"] if a["phase"] == "decode"]
    # One alternative a hair faster than the plan (within the solver's tie tolerance), one slower,
    # and one with the plan's own weights (never listed as an alternative to itself).
    decode[0]["behind"], decode[1]["behind"] = -0.001, 0.012
    decode[0]["tied"], decode[1]["tied"] = True, False
    decode[2]["weights"] = d["decode"]["weights"]
    with open(path, "w") as f:
        json.dump(d, f)
    shown = invoke("show", path)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    decode_at = next(i for i, x in enumerate(lines) if x.startswith("decode "))
    (tie,) = [x for x in lines[decode_at:] if x.startswith("  as fast within 0.1%")]
    (line,) = [x for x in lines[decode_at:] if x.startswith("  next best")]
    assert "(+0.1%)" in tie and "smaller weights" in tie and "(+" not in line
    assert "(-1.2%)" in line and "--" not in line and "+-" not in line
    own = ":".join(map(str, d["decode"]["weights"])) + " ("
    assert own not in tie and own not in line
    sources = [x for x in shown.stdout.splitlines() if x.startswith("sources: ")]
    assert sources == ["sources: " + ", ".join(f"{i}:{s['name']}={s['path']}" for i, s in enumerate(d["sources"]))]
    assert "…" not in shown.stdout



def test_solve_takes_quiet_like_the_other_long_commands(tmp_path):
    """`planner solve -q` was refused where sync, verify, repair, iobench run, bench and ladder take
    -q/--quiet: the plan is the result (still printed), the notices and 'plan written' go."""
    # a small model (each solve of the named ds4-v41 took seconds) on drives one of which is too slow to
    # be given reads: the notice that says so
    rig, _ = tuner_rig(tmp_path / "rig", models=(FAST, SLOW, DriveModel(lat_s=20e-3, stream_bw=1e6, bw_max=1e6)))
    loud = invoke("solve", "--rig", rig.root)
    quiet = invoke("solve", "--rig", rig.root, "-q")
    assert loud.exit_code == quiet.exit_code == 0, quiet.output
    assert "plan written to" in loud.stderr and "notice: decode: laggy reads nothing" in loud.stderr
    assert quiet.stderr.strip() == ""
    assert quiet.stdout.startswith("plan ") and "prefill" in quiet.stdout
