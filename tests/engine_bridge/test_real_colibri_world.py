"""The real colibri (COLIBRI_BIN) through the product's own paths: `engine-bridge launch` reads its
lines with the product's parser (engines/colibri/colibri_workload.py) and records the calibration
in a plan; the next `planner solve` uses it (the cache per layer the run printed, its loads in
flight, its compute: an end-to-end prediction beside reads only); `autotune --binary` runs the real
binary, prints both errors per arm and records the calibration for the next solve. Skipped without
COLIBRI_BIN (docs/engine.md builds it)."""

import json
import os

import pytest
from typer.testing import CliRunner

from engine_bridge.cli import app as eb_app
from engine_bridge.tuning.real_engine import tune_with_engine
from planner.cli import app as planner_app
from planner.plans import latest_plan_path, load_plan
from tests.planner.helpers import colibri_copies_in, rig_on

COLIBRI_BIN = os.environ.get("COLIBRI_BIN", "")
pytestmark = pytest.mark.skipif(
    not COLIBRI_BIN or not os.access(COLIBRI_BIN, os.X_OK),
    reason="COLIBRI_BIN is not set to colibri's built engine binary (docs/engine.md)" if not COLIBRI_BIN
    else f"COLIBRI_BIN={COLIBRI_BIN} is not an executable file")
runner = CliRunner()
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
GEN = 8
CAP = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("real-colibri")
    paths = colibri_copies_in(d)
    ref = d / "ref.json"
    ref.write_text(json.dumps({"prompt_ids": PROMPT, "full_ids": PROMPT + [0] * GEN}))
    return paths, str(ref)


def test_launch_reads_colibris_lines_and_the_next_solve_uses_them(tmp_path, models, monkeypatch):
    paths, ref = models
    root = str(tmp_path / "rig")
    rig_on(root, paths)
    r = runner.invoke(planner_app, ["solve", "--rig", root, "--engine", "colibri", "--page-cache", "0",
                                    "--prompt-tokens", str(len(PROMPT)), "--engine-arg", str(CAP), "--json"],
                      env={"CAP_RAISE": "0"})
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)
    assert first["provenance"]["world"]["cache_experts"] == CAP * first["geometry"]["layers"]   # from its argument
    r = runner.invoke(eb_app, ["export", "--rig", root, "--plan", "latest", "--format", "colibri", "--profile", "p",
                               "--allow-unverified"])
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("REF", ref)
    monkeypatch.setenv("PROF", "1")
    monkeypatch.setenv("CAP_RAISE", "0")
    monkeypatch.setenv("USAGE_SAVE", "0")
    r = runner.invoke(eb_app, ["launch", "--rig", root, "--binary", COLIBRI_BIN, "--profile",
                               os.path.join(root, "profiles", "p.json"), "--out", str(tmp_path / "run"), "--json", "--",
                               str(CAP)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    cal = doc["calibration"]
    assert cal["cache_per_layer"] == CAP and cal["tokens"] == GEN and cal["window"] == "run"
    assert cal["bytes_read"] > 0 and cal["compute_s"] > 0 and cal["in_flight"] >= 1 and cal["overlap"] is False
    assert cal["prompt_tokens"] == len(PROMPT) and doc["tok_s"] > 0
    assert cal["resident_bytes"] > 1 << 20                                   # colibri's peak, measured by wait4
    assert cal["buffered"] is True and cal["ram_bytes"] > 0       # storage_bytes: 0 when the page cache held the model
    stdout = open(doc["stdout"]).read()
    assert f"{cal['lines']['mb_per_token']:.1f} MB/token" in stdout           # the figure as colibri printed it
    assert load_plan(doc["calibration_plan"]).provenance["engine_calibration"]["record"] == cal
    r = runner.invoke(planner_app, ["solve", "--rig", root, "--engine", "colibri", "--page-cache", "0",
                                    "--prompt-tokens", str(len(PROMPT)), "--json"])
    assert r.exit_code == 0, r.output
    nxt = json.loads(r.stdout)
    assert nxt["workload"]["traffic"]["source"] == "engine"
    assert nxt["provenance"]["world"]["cache_experts"] == CAP * nxt["geometry"]["layers"]
    assert nxt["provenance"]["model"]["concurrency"]["decode"]["shared"] == cal["in_flight"]
    dec = nxt["decode"]["predicted"]
    assert 0 < dec["e2e_tok_s"] < dec["tok_s"]


def test_autotune_binary_runs_colibri_reports_both_errors_and_records_the_calibration(tmp_path, models):
    paths, ref = models
    root = str(tmp_path / "rig")
    rig_on(root, paths)
    doc, folder = tune_with_engine(root, COLIBRI_BIN, None, [str(CAP)], allow_unverified=True, rounds=1, budget_s=600,
                                   prompt_tokens=len(PROMPT),
                                   inherited={**os.environ, "REF": ref, "PROF": "1", "CAP_RAISE": "0"})
    assert doc["engine_calibration"]["cache_per_layer"] == CAP
    assert all(t["calibration"]["tokens"] == GEN for t in doc["trials"] if not t["failed"])
    assert any("e2e err" in line for line in doc["lines"])
    assert all(a["error_pct"] is not None for a in doc["arms"] if a["qualified"] and a["predicted_tok_s"])
    plan = load_plan(latest_plan_path(__import__("core.rig", fromlist=["load_rig"]).load_rig(root)))
    assert plan.provenance["engine_calibration"]["record"]["cache_per_layer"] == CAP
    # the tuner's next solve prices what the engine did: e2e predictions for every planned arm
    doc2, _ = tune_with_engine(root, COLIBRI_BIN, None, [str(CAP)], allow_unverified=True, rounds=1, budget_s=600,
                               prompt_tokens=len(PROMPT),
                               inherited={**os.environ, "REF": ref, "PROF": "1", "CAP_RAISE": "0"})
    planned = [a for a in doc2["arms"] if a["predicted_tok_s"]]
    assert planned and all(a["predicted_e2e_tok_s"] for a in planned)
    assert all(a["error_e2e_pct"] is not None for a in planned if a["qualified"])
