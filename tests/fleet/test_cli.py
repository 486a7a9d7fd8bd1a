"""`fleet` at the surface, without a cluster: one line and the documented exit code."""

import sys

from core.rig import Rig
from fleet.cli import app
from replicas.manifest import Manifest, ModelManifest
from replicas.manifests import save_manifest
from tests.fleet.helpers import fleet_file
from tests.replicas.helpers import runner


def test_without_ray_the_run_says_how_to_get_it(tmp_path, monkeypatch):
    save_manifest(Rig(str(tmp_path / "rig")), ModelManifest((Manifest(10, "ab" * 32, 4, ("a", "b", "c"), "m.gguf"),)))
    path = fleet_file(tmp_path / "fleet.toml", {"alpha": "/srv/rig"})
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` fails as if it were not installed
    res = runner.invoke(app, ["run", path, "--rig", str(tmp_path / "rig")])
    assert res.exit_code == 2
    assert "pip install 'replica-tuner[fleet]'" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_missing_fleet_file_manifest_or_report_is_exit_3(tmp_path):
    res = runner.invoke(app, ["run", str(tmp_path / "absent.toml"), "--rig", str(tmp_path / "rig")])
    assert res.exit_code == 3 and "no such fleet file" in res.stderr
    path = fleet_file(tmp_path / "fleet.toml", {"alpha": "/srv/rig"})
    res = runner.invoke(app, ["run", path, "--rig", str(tmp_path / "rig")])
    assert res.exit_code == 3 and "no manifest for the fleet" in res.stderr
    res = runner.invoke(app, ["show", "--rig", str(tmp_path / "rig")])
    assert res.exit_code == 3 and "no fleet reports" in res.stderr
