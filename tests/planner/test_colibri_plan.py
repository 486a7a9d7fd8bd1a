"""colibri plans through `planner solve` and `planner simulate`: one weight vector and the switches,
the experts each drive serves for every member of colibri's family, a model an engine cannot
read refused in one line, and the plan's switch keys."""

import json
import re

import pytest
from typer.testing import CliRunner

from core.errors import RigError
from engines.colibri.family import member_for
from models.tensortable import inspect_model
from planner.cli import app
from planner.plan import Phase, Plan, Source, plan_from_dict, plan_to_dict
from planner.plans import load_plan
from planner.workload import model_workload
from tests.planner.helpers import FAST, LAGGY, SLOW, make_dir_rig, tuner_rig, write_dir_model

runner = CliRunner()
MODEL_TYPES = ("glm_moe_dsa", "deepseek_v4", "deepseek_v41", "glm5_next")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def dir_rig(tmp_path, model_type="glm_moe_dsa", copies=True, drives=3, **kw):
    model = write_dir_model(tmp_path / model_type, model_type, **kw)
    rig, _ = make_dir_rig(tmp_path / "rig", model, names=("fast", "slow", "laggy")[:drives],
                          models=(FAST, SLOW, LAGGY)[:drives], copies=copies)
    return rig, model


def one_error_line(r):
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("planner: error: "), r.output
    return lines[0]


def test_colibri_on_a_gguf_rig_is_refused_naming_ds4_argodrive(tmp_path):
    rig, _ = tuner_rig(tmp_path / "rig")                       # its model: one GGUF file
    for cmd in (["solve"], ["simulate", "--weights", "1:1:1", "--phase", "decode"]):
        r = invoke(*cmd, "--rig", rig.root, "--engine", "colibri")
        assert r.exit_code == 2
        line = one_error_line(r)
        assert "colibri loads a directory of safetensors shards" in line and "--engine ds4-argodrive" in line


def test_ds4_on_a_safetensors_directory_rig_is_refused_naming_colibri(tmp_path):
    rig, _ = dir_rig(tmp_path)
    r = invoke("solve", "--rig", rig.root, "--engine", "ds4-argodrive")     # without --engine: colibri, which reads it
    assert r.exit_code == 2
    line = one_error_line(r)
    assert "ds4-argodrive reads one GGUF file (-m); this model is a safetensors directory" in line
    assert "--engine colibri" in line


def test_solve_colibri_writes_one_weight_vector_and_its_switches(tmp_path):
    rig, _ = dir_rig(tmp_path, drives=2)
    r = invoke("solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["engine"] == "colibri" and d["prefill"]["weights"] == d["decode"]["weights"]
    assert d["schema"] == 3 and set(d["switches"]) <= {"direct", "stripe"}
    assert d["workload"]["engine"] == "colibri" and d["workload"]["name"] == "model"
    assert d["geometry"]["arch"] == "glm_moe_dsa" and d["geometry"]["layout"] == "dir"
    assert set(d["provenance"]["model"]["scores"]) == {"default", "direct", "direct+stripe"}
    for ph in ("prefill", "decode"):
        pred = d[ph]["predicted"]
        assert [s["name"] for s in pred["sources"]] == ["fast", "slow"]
        steps = d["workload"][ph]
        # every expert a layer reads is counted once, on the drive whose piece holds its first byte
        assert sum(s["experts"] for s in pred["sources"]) == pytest.approx(
            steps["experts_per_step"] * steps["steps"] * steps["scale"] / (steps["steps"] * steps["scale"] + steps["empty"]))
    shown = invoke("show", d["path"])
    assert shown.exit_code == 0, shown.output
    w = ":".join(map(str, d["prefill"]["weights"]))
    assert f"weights {w} for both phases; switches: " in " ".join(shown.stdout.split())


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_simulate_reports_the_experts_each_drive_serves_for_every_family_member(tmp_path, model_type):
    """The experts per layer of each source are those the member's placement routes to it, over
    the decode steps the workload prices (the routing model through the cache, as solve's)."""
    rig, model = dir_rig(tmp_path, model_type)
    weights = (3, 2, 1)
    r = invoke("simulate", "--rig", rig.root, "--engine", "colibri", "--phase", "decode",
               "--weights", ":".join(map(str, weights)), "--page-cache", "0", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    g = inspect_model(str(model))
    member = member_for(model_type)
    steps = model_workload(g).phases["decode"]
    want = [0.0, 0.0, 0.0]
    for st in steps.steps:
        for e in st.experts:
            want[member.route(st.layer, e, g.experts, weights)] += steps.scale
    assert [s["experts"] for s in d["sources"]] == pytest.approx([x / steps.total_steps for x in want])
    assert all(x > 0 for x in want)                 # the hash spreads the model's experts over all three
    assert d["weights"] == list(weights) and d["switches"] == []


def test_a_mirror_without_the_models_shards_serves_no_expert(tmp_path):
    """Directories that hold none of the shards: every member falls back to the primary."""
    rig, _ = dir_rig(tmp_path, "deepseek_v41", copies=False)
    r = invoke("simulate", "--rig", rig.root, "--engine", "colibri", "--phase", "decode", "--weights", "1:1:1",
               "--page-cache", "0", "--json")
    assert r.exit_code == 0, r.output
    src = json.loads(r.stdout)["sources"]
    assert src[0]["experts"] > 0 and src[1]["experts"] == src[2]["experts"] == 0
    assert src[1]["bytes"] == src[2]["bytes"] == 0


def test_simulate_prices_the_switches_asked_and_refuses_the_ones_the_engine_lacks(tmp_path):
    rig, _ = dir_rig(tmp_path)
    base = ["simulate", "--rig", rig.root, "--engine", "colibri", "--phase", "prefill", "--weights", "2:1:1", "--json"]
    plain = json.loads(invoke(*base).stdout)
    direct = json.loads(invoke(*base, "--switch", "direct").stdout)
    assert direct["switches"] == ["direct"] and plain["switches"] == []
    assert direct["sources"][0]["bytes"] > plain["sources"][0]["bytes"]     # O_DIRECT reads whole 4 KiB pages
    r = invoke(*base, "--switch", "stripe")
    assert r.exit_code == 2 and "--switch stripe needs --switch direct" in one_error_line(r)
    gguf, _ = tuner_rig(tmp_path / "g")
    r = invoke("simulate", "--rig", gguf.root, "--phase", "decode", "--weights", "1:1:1", "--switch", "direct")
    assert r.exit_code == 2 and "ds4-argodrive has no switches" in one_error_line(r)


def test_a_solved_plan_is_simulated_to_the_same_prediction(tmp_path):
    rig, _ = dir_rig(tmp_path, drives=2)
    r = invoke("solve", "--rig", rig.root, "--engine", "colibri", "--top", "0", "--json")
    assert r.exit_code == 0, r.output
    p = load_plan(json.loads(r.stdout)["path"])
    switches = [a for k in sorted(p.switches) for a in ("--switch", k)]
    for ph in ("prefill", "decode"):
        sim = invoke("simulate", "--rig", rig.root, "--engine", "colibri", "--phase", ph,
                     "--weights", ":".join(map(str, getattr(p, ph).weights)), *switches, "--json")
        assert sim.exit_code == 0, sim.output
        doc = json.loads(sim.stdout)
        assert doc.pop("kind") == "prediction" and doc.pop("schema") == 1      # the envelope, then the block
        assert doc == pytest.approx(getattr(p, ph).predicted)


def test_the_switches_are_one_key_and_old_plans_with_a_key_per_switch_load():
    src = (Source("a", "/a"), Source("b", "/b"))
    plan = Plan(sources=src, prefill=Phase((2, 1)), decode=Phase((2, 1)), engine="colibri",
                switches=frozenset({"stripe", "direct"}))
    d = plan_to_dict(plan)
    assert list(d) == ["schema", "kind", "engine", "created", "sources", "prefill", "decode", "baselines",
                       "alternatives", "provenance", "geometry", "workload", "switches"]
    assert d["schema"] == 3 and d["switches"] == ["direct", "stripe"]
    assert plan_from_dict(json.loads(json.dumps(d))) == plan
    ds4 = plan_to_dict(Plan(sources=src, prefill=Phase((2, 1)), decode=Phase((2, 1))))
    assert ds4["switches"] == [] and "stripe" not in ds4 and "direct" not in ds4
    # schema 2: a true/false key per switch, named after it
    old = {**{k: v for k, v in d.items() if k != "switches"}, "schema": 2, "direct": True, "stripe": True}
    assert plan_from_dict(old).switches == frozenset({"direct", "stripe"})
    del old["direct"]                                          # a plan from before 'direct': it striped only with O_DIRECT
    assert plan_from_dict(old).switches == frozenset({"direct", "stripe"})
    del old["stripe"]
    assert plan_from_dict(old).switches == frozenset()
    old["stripe"] = "yes"
    with pytest.raises(RigError, match="p.json: key 'stripe' must be true or false, got 'yes'"):
        plan_from_dict(old, "p.json")
    with pytest.raises(RigError, match="key 'switches' is not a setting the engine takes "
                                       r"\(switch stripe needs switch direct"):
        plan_from_dict({**d, "switches": ["stripe"]}, "p.json")
    with pytest.raises(RigError, match="switch prefetch: colibri has the switches direct, stripe"):
        plan_from_dict({**d, "switches": ["prefetch"]}, "p.json")
    with pytest.raises(RigError, match="key 'switches' must be a list of switch names"):
        plan_from_dict({**d, "switches": "direct"}, "p.json")


def test_buffered_re_reads_come_from_the_page_cache_that_holds_them(tmp_path):
    """colibri without DIRECT=1 reads through the page cache: with room for the whole model, an
    expert read again in the run costs no drive time, so decode reads only what it never read
    before; O_DIRECT reads are priced the same whatever the RAM."""
    rig, model = dir_rig(tmp_path, "glm_moe_dsa")
    routed = inspect_model(str(model)).routed_bytes

    def sim(*extra):
        r = invoke("simulate", "--rig", rig.root, "--engine", "colibri", "--phase", "decode", "--weights", "1:1:1",
                   "--json", *extra)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    cold, warm, half = sim("--page-cache", "0"), sim("--page-cache", "1T"), sim("--page-cache", str(routed // 2))
    assert warm["seconds"] < cold["seconds"]
    assert sum(s["bytes"] for s in warm["sources"]) < sum(s["bytes"] for s in cold["sources"])
    assert warm["seconds"] <= half["seconds"] <= cold["seconds"]
    direct_cold = sim("--page-cache", "0", "--switch", "direct")
    direct_warm = sim("--page-cache", "1T", "--switch", "direct")
    assert direct_cold["seconds"] == direct_warm["seconds"]


def test_a_phase_that_reads_nothing_leaves_the_objective_a_ratio_of_seconds(tmp_path):
    """No expert cache and a page cache holding the whole model: decode's reads are all hits by
    default (0 s) while O_DIRECT still reads. The objective measures such a phase against the
    run's fastest, so every mode's score stays a plain ratio of seconds (it was 1.9e299: a
    division by a 1e-300 floor) and the printed objective has no 300-digit numbers."""
    rig, _ = dir_rig(tmp_path, drives=2)
    r = invoke("solve", "--rig", rig.root, "--engine", "colibri", "--cache-experts", "0", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["decode"]["predicted"]["seconds"] == 0.0 and "direct" not in d["switches"]   # the phase reads nothing
    scores = d["provenance"]["model"]["scores"]
    assert scores["default"] == 1.0 and scores["direct"] > 1.0                   # O_DIRECT reads in decode: it costs more
    assert all(s < 1e6 for s in scores.values()), scores                       # a ratio of seconds of one run
    shown = invoke("show", d["path"])
    assert shown.exit_code == 0 and not re.search(r"\d{13}", shown.stdout), shown.stdout
