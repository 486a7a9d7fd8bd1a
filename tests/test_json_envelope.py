"""Every command's --json output has the one envelope of core.results: one JSON object on stdout
whose first keys are `schema` (an int) and `kind` (a str), then the data; an error with --json is
a document too (kind "error", the message and the exit code).

The list of commands is read from the five apps, so a command that gains --json without a case
here fails `test_every_json_command_has_a_case` until it is added."""

import json
import os
import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from core.cli import print_result
from core.results import Document, envelope
from engine_bridge.cli import app as bridge_app
from engine_bridge.moe.synth import synthesize
from fleet.cli import app as fleet_app
from fleet.constants import OK
from fleet.report import FleetReport, NodeResult, report_to_dict
from iobench.cli import app as iobench_app
from planner.cli import app as planner_app
from replicas.cli import app as replicas_app
from tests.engine_bridge.helpers import SPEC
from tests.helpers import write_random
from tests.planner.helpers import tuner_rig
from tests.replicas.helpers import synced_rig

APPS = {"replicas": replicas_app, "iobench": iobench_app, "planner": planner_app, "engine-bridge": bridge_app,
        "fleet": fleet_app}
MiB = 1 << 20


def json_commands():
    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + (name,))
        elif any("--json" in getattr(p, "opts", ()) for p in cmd.params):
            yield path
    return {" ".join(p) for name, app in APPS.items() for p in walk(get_command(app), (name,))}


# Each case: (command, how to set it up -> argv after the command's words, the kind expected).
# A command whose success needs what a test machine lacks (root and loop devices, fio, a real
# engine binary, minutes of measuring) is run into an error, whose document is checked instead.

def _replicas(tmp_path):
    rig, _, paths = synced_rig(tmp_path, size=2 * MiB + 5)
    return rig, paths


def _planner_rig(tmp_path):
    rig, bench = tuner_rig(tmp_path / "rig")
    return rig.root, bench


def _iobench_results(tmp_path):
    f = tmp_path / "a.bin"
    write_random(f, 4 * MiB, seed=1)
    r = CliRunner().invoke(iobench_app, ["run", str(f), "--preset", "seq", "--seconds", "0.05", "--repeat", "2",
                                         "--lanes", "1", "--json"])
    assert r.exit_code == 0, r.output
    bench = os.path.join(os.environ["REPLICA_TUNER_RIG"], "bench")
    path = os.path.join(bench, sorted(os.listdir(bench))[-1])
    return path


def _model(tmp_path):
    path = tmp_path / "model.gguf"
    synthesize(str(path), SPEC)
    return str(path)


CASES = {
    "replicas init": (lambda t: ["--rig", str(t / "r"), "--model", _write(t / "m.bin", 4096), "--format", "raw"],
                        "init"),
    "replicas hash": (lambda t: [_write(t / "m.bin", 4096)], "manifest"),
    "replicas hash -c": (lambda t: _sums(t), "check"),
    "replicas hash A B": (lambda t: [_write(t / "a.bin", 4096), _write(t / "b.bin", 4096, 1)], "hashes"),
    "replicas sync": (lambda t: ["--rig", str(t / "rig"), "--dry-run", "--allow-same-device", _write(t / "m.bin", 4096),
                                 _mkdir(t / "d")], "sync"),
    "replicas verify": (lambda t: ["--rig", _replicas(t)[0]], "verify"),
    "replicas repair": (lambda t: (lambda r: ["--rig", r[0], r[1][1]])(_replicas(t)), "repair"),
    "replicas status": (lambda t: ["--rig", _replicas(t)[0]], "status"),
    "replicas upstream": (lambda t: _upstream(t), "upstream"),
    "replicas resplit": (lambda t: [_model(t), _mkdir(t / "set")], "resplit"),
    "iobench run": (lambda t: [_write(t / "a.bin", 4 * MiB), "--preset", "seq", "--seconds", "0.05", "--repeat", "2",
                               "--lanes", "1", "--no-save"], "iobench"),
    "iobench show": (lambda t: [_iobench_results(t)], "iobench"),
    "iobench compare": (lambda t: [_iobench_results(t)] * 2, "iobench-compare"),
    "iobench fio": (lambda t: [str(t / "missing.bin")], "error"),
    "iobench scratch": (lambda t: [str(t / "no-folder")], "error"),
    "iobench testbed up": (lambda t: ["--root", str(t / "tb"), "--drive", "a:0"], "error"),
    "iobench testbed show": (lambda t: ["--root", str(t / "no-testbed")], "error"),
    "planner split": (lambda t: ["--weights", "10:5:5"], "split"),
    "planner solve": (lambda t: ["--rig", _planner_rig(t)[0]], "plan"),
    "planner simulate": (lambda t: ["--rig", _planner_rig(t)[0], "--weights", "10:6:6", "--phase", "decode"],
                         "prediction"),
    "planner show": (lambda t: _solved(t), "plan"),
    "planner whatif": (lambda t: ["--rig", _planner_rig(t)[0], "--remove", "slow"], "whatif"),
    "engine-bridge synth": (lambda t: [str(t / "s.gguf"), "--layers", "2", "--experts", "4", "--top-k", "2",
                                       "--dim", "512", "--ff", "1024", "--vocab", "256"], "synth"),
    "engine-bridge run": (lambda t: ["--model", _model(t), "--prompt-tokens", "4", "--gen-tokens", "1"], "run"),
    "engine-bridge replay": (lambda t: ["--model", _model(t), "--prompt-tokens", "4", "--gen-tokens", "1"], "replay"),
    "engine-bridge bench": (lambda t: ["--rig", str(t / "no-rig"), "--arm", "one=1"], "error"),
    "engine-bridge ladder": (lambda t: ["--rig", str(t / "no-rig")], "error"),
    "engine-bridge profiles": (lambda t: [], "profiles"),
    "engine-bridge launch": (lambda t: ["--binary", str(t / "no-engine"), "--profile", str(t / "p.json")], "error"),
    "engine-bridge autotune": (lambda t: ["--rig", str(t / "no-rig")], "error"),
    # A fleet run needs a Ray cluster (tests/fleet): here, its error; `show` reads a report file.
    "fleet run": (lambda t: [str(t / "no-fleet.toml"), "--rig", str(t / "rig")], "error"),
    "fleet show": (lambda t: [_fleet_report(t)], "fleet"),
}


def _write(path, size, seed=0):
    write_random(path, size, seed=seed)
    return str(path)


def _mkdir(path):
    os.makedirs(path)
    return str(path)


def _sums(tmp_path):
    f = _write(tmp_path / "m.bin", 4096)
    r = CliRunner().invoke(replicas_app, ["hash", f])
    (tmp_path / "sums").write_text(r.stdout)
    return ["-c", str(tmp_path / "sums")]


def _upstream(tmp_path):
    """A synced rig and a sha256sum file of its model: `replicas upstream SUMS --rig RIG`."""
    import hashlib

    rig, data, paths = synced_rig(tmp_path, size=2 * MiB + 5)
    (tmp_path / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  {os.path.basename(paths[0])}\n")
    return [str(tmp_path / "SHA256SUMS"), "--rig", rig]


def _fleet_report(tmp_path):
    report = FleetReport("2026-12-01T17:00:00.000Z", "ab" * 32, (NodeResult("alpha", OK, rig="/srv/rig"),))
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report_to_dict(report)))
    return str(path)


def _solved(tmp_path):
    root, _ = _planner_rig(tmp_path)
    r = CliRunner().invoke(planner_app, ["solve", "--rig", root, "--json"])
    assert r.exit_code == 0, r.output
    return [json.loads(r.stdout)["path"]]


def test_every_json_command_has_a_case():
    cased = {" ".join(k.split()[:3]) if k.startswith("iobench testbed") else " ".join(k.split()[:2]) for k in CASES}
    assert json_commands() - cased == set(), "add a case for each command above to CASES"


@pytest.mark.parametrize("case", sorted(CASES))
def test_json_output_has_the_envelope(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_args, kind = CASES[case]
    words = case.split()
    app, command = APPS[words[0]], [w for w in words[1:] if w not in ("-c", "A", "B")]
    r = CliRunner().invoke(app, [*command, *map(str, make_args(tmp_path)), "--json"])
    doc = json.loads(r.stdout)                     # one JSON document, nothing else on stdout
    assert isinstance(doc, dict) and list(doc)[:2] == ["schema", "kind"], doc
    assert isinstance(doc["schema"], int) and not isinstance(doc["schema"], bool)
    assert doc["kind"] == kind, (r.exit_code, r.stderr)
    if kind == "error":
        assert r.exit_code != 0 and doc["exit_code"] == r.exit_code
        assert r.stderr.strip().endswith(doc["error"])     # the same line as on stderr
    else:
        assert r.exit_code == 0, r.output


def test_a_usage_error_with_json_is_a_document_with_exit_2():
    r = CliRunner().invoke(planner_app, ["split", "--json"])          # --weights missing
    doc = json.loads(r.stdout)
    assert r.exit_code == 2 and doc["kind"] == "error" and doc["exit_code"] == 2 and "--weights" in doc["error"]
    r = CliRunner().invoke(planner_app, ["split"])                    # without --json: stderr only
    assert r.exit_code == 2 and r.stdout == ""


def test_a_result_printed_before_an_error_is_not_followed_by_an_error_document():
    from core.cli import JsonOption, make_app
    from core.errors import MismatchError

    class Outcome(Document):
        KIND, SCHEMA = "outcome", 1

    app = make_app("t", "t")

    @app.command()
    def go(json_out: bool = JsonOption):
        print_result(Outcome({"ok": False}))
        raise MismatchError("not confirmed")

    @app.command()
    def other():
        pass

    r = CliRunner().invoke(app, ["go", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout) == {"schema": 1, "kind": "outcome", "ok": False}
    assert "t: error: not confirmed" in r.stderr


def test_the_envelope_refuses_what_is_not_a_result():
    class NoKind(Document):
        pass

    class Lying(Document):
        KIND, SCHEMA = "plan", 1

    with pytest.raises(TypeError):
        envelope({"schema": 1, "kind": "x"})                  # a bare dict is not a result
    with pytest.raises(TypeError):
        envelope(NoKind({}))
    with pytest.raises(ValueError):
        envelope(Lying({"kind": "run"}))
    assert envelope(Lying({"schema": 1, "a": 1})) == {"schema": 1, "kind": "plan", "a": 1}


def test_no_command_module_prints_json_of_its_own():
    """JSON reaches stdout only through core.cli.print_result."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for pkg in ("replicas", "iobench", "planner", "engine_bridge", "fleet"):
        for dirpath, _, files in os.walk(os.path.join(root, pkg)):
            for f in files:
                if f.endswith(".py"):
                    text = open(os.path.join(dirpath, f)).read()
                    if "print_json" in text or re.search(r"(write|print|echo)\(json\.dumps", text):
                        found.append(os.path.relpath(os.path.join(dirpath, f), root))
    assert found == []
