"""engine-bridge's output piped into a file or another program: whole lines, paths never cut."""

from typer.testing import CliRunner

from engine_bridge.cli import app
from tests.engine_bridge.export_helpers import make_rig, write_plan

runner = CliRunner()


def test_profiles_names_the_exported_profiles_folder_whole(tmp_path):
    deep = tmp_path.joinpath(*[f"thunderbolt-enclosure-{i:02d}" for i in range(6)])
    deep.mkdir(parents=True)
    root, paths, _ = make_rig(deep, 3)
    plan = write_plan(deep, paths, (10, 5, 5), (10, 6, 6))
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive",
                                 "--cache-experts", "4600"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["profiles", "--rig", root])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert f"exported profiles in {root}/profiles" in lines
    cells = [[c.strip() for c in line.split("│") if c.strip()] for line in lines]
    assert ["plan", "ds4-argodrive", "10:5:5", "10:6:6", "4600"] in cells
    assert "…" not in r.stdout
