"""`engine-bridge run` and `replay` find their model: --model, else the plan's primary, else the
rig's model; without any of them, one usage line and exit 2."""

import json

import pytest
from typer.testing import CliRunner

from core.errors import MissingError, UsageError
from core.rig import Member, Rig, save_rig
from engine_bridge.cli import app
from engine_bridge.moe.inputs import resolve_model
from tests.helpers import counting_opens

runner = CliRunner()
SHORT = ["--prompt-tokens", "8", "--gen-tokens", "1", "--json"]


def write_plan(path, d):
    plan = {"schema": 1, "kind": "plan", "engine": "ds4-argodrive", "created": "",
            "sources": [{"name": "a", "path": str(d / "model.gguf")}, {"name": "b", "path": str(d / "r1.gguf")}],
            "prefill": {"weights": [10, 5]}, "decode": {"weights": [10, 6]}}
    path.write_text(json.dumps(plan))
    return path


def test_resolve_model_prefers_the_option_then_the_plan_then_the_rig(model_dir, tmp_path):
    plan = write_plan(tmp_path / "p.json", model_dir)
    rig = Rig(root=str(tmp_path / "rig"), model=Member(str(model_dir / "r2.gguf"), "internal", "primary"))
    save_rig(rig)
    assert resolve_model(str(model_dir / "r1.gguf"), str(plan), rig.root).path == str(model_dir / "r1.gguf")
    assert resolve_model(None, str(plan), rig.root).path == str(model_dir / "model.gguf")
    assert resolve_model(None, None, rig.root).path == str(model_dir / "r2.gguf")
    with pytest.raises(MissingError, match="model /x/m.gguf: no such file or directory"):
        resolve_model("/x/m.gguf", str(plan), rig.root)
    with pytest.raises(MissingError, match="nope: no such plan file"):
        resolve_model(None, "nope", rig.root)
    save_rig(Rig(root=str(tmp_path / "bare")))
    with pytest.raises(UsageError, match="no model to run: give --model PATH, --plan PLAN, or --rig DIR"):
        resolve_model(None, None, str(tmp_path / "bare"))


def test_run_takes_the_model_from_the_plan(model_dir, tmp_path):
    plan = write_plan(tmp_path / "p.json", model_dir)
    r = runner.invoke(app, ["run", "--plan", str(plan), *SHORT])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["weights"] == {"prefill": [10, 5], "decode": [10, 6]}
    assert [s["path"] for s in d["sources"]] == [str(model_dir / "model.gguf"), str(model_dir / "r1.gguf")]


def test_run_and_replay_take_the_model_from_the_rig(model_dir, tmp_path):
    rig = Rig(root=str(tmp_path / "rig"), model=Member(str(model_dir / "model.gguf"), "internal", "primary"))
    save_rig(rig)
    r = runner.invoke(app, ["run", "--rig", rig.root, *SHORT])
    assert r.exit_code == 0, r.output
    assert [s["path"] for s in json.loads(r.stdout)["sources"]] == [str(model_dir / "model.gguf")]
    r = runner.invoke(app, ["replay", "--rig", rig.root, *SHORT])
    assert r.exit_code == 0, r.output
    assert [s["path"] for s in json.loads(r.stdout)["sources"]] == [str(model_dir / "model.gguf")]


@pytest.mark.parametrize("args, message", [
    (["run"], "engine-bridge: error: no model to run: give --model PATH, --plan PLAN, or --rig DIR"),
    (["replay"], "engine-bridge: error: no model to run: give --model PATH, --plan PLAN, or --rig DIR"),
    (["run", "--lanes", "many"], "engine-bridge: error: invalid value for '--lanes'"),
    (["run", "--model"], "engine-bridge: error: option '--model' requires an argument (see 'engine-bridge run -h')"),
    (["run", "--modle", "m.gguf"], "engine-bridge: error: no such option: --modle"),
])
def test_run_usage_errors_are_one_line_and_exit_2(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr


def test_run_reads_the_plan_and_rig_toml_once(model_dir, tmp_path):
    """The primary and the sources come from one reading of each (engine_bridge.moe.inputs.run_inputs)."""
    plan = write_plan(tmp_path / "p.json", model_dir)
    rig = Rig(root=str(tmp_path / "rig"), model=Member(str(model_dir / "model.gguf"), "internal", "primary"))
    save_rig(rig)
    with counting_opens() as opened:
        r = runner.invoke(app, ["run", "--plan", str(plan), "--rig", rig.root, *SHORT])
    assert r.exit_code == 0, r.output
    assert opened[str(plan)] == 1 and opened[rig.rig_file] == 1
