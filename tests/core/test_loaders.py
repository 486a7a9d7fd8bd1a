"""The rig's JSON files fail the same way whichever loader reads them (issue 9's error table).

Every loader (manifest, iobench result, plan, routing trace, exported profile, and the harness
results the tuner reads) goes through core.jsonfile.read_json: a missing file is MissingError,
exit 3; a directory, bytes that are not UTF-8 JSON, a document that is not an object, of another
kind or of another schema is RigError, exit 2; the message is one line that starts with the file.
The same table runs through each kind's command: exit code and one line on stderr, no traceback.
"""

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from typer.testing import CliRunner

from core.errors import EXIT_MISSING, EXIT_USAGE, MissingError, RigError
from core.rig import Member, Rig, save_rig
from engine_bridge.cli import app as bridge_app
from engine_bridge.moe.replay import load_trace
from engine_bridge.profiles.export import load_profile
from engine_bridge.profiles.profile import Profile, profile_to_dict
from fleet.report import FleetReport, NodeResult, report_to_dict
from fleet.asker import load_report
from iobench.cli import app as iobench_app
from iobench.result import BenchResult, load_result, result_to_dict
from planner.cli import app as planner_app
from planner.measured import HarnessRun, read_results
from planner.plan import Phase, Plan, Source, plan_to_dict
from planner.plans import load_plan
from replicas.cli import app as replicas_app
from replicas.manifest import Manifest, ModelManifest, model_manifest_to_dict
from replicas.manifests import load_manifest
from replicas.upstream import SHA256, Upstream, UpstreamFile, upstream_to_dict
from replicas.upstreams import load_upstream

PLAN = plan_to_dict(Plan((Source("a", "/m/a.gguf"),), Phase((1,)), Phase((1,)), created="2026-11-29T19:00:00Z"))
PROFILE = profile_to_dict(Profile(id="p", engine="ds4-argodrive", environment=(("DS4_ARGODRIVE_PRIMARY_WEIGHT", "10"),),
                                  unset=(), argv=("--metal",), primary="/m/a.gguf", primary_weight=10, replicas=(),
                                  replica_weights=(), decode_weights=(), cache_experts=4600))
MANIFEST = model_manifest_to_dict(ModelManifest((Manifest(size=10, blake3="ab" * 32, piece_size=4, pieces=("a", "b", "c"),
                                                          name="m.gguf"),)))
FLEET = report_to_dict(FleetReport("2026-12-01T17:00:00.000Z", "ab" * 32, (NodeResult("alpha", "ok"),)))
UPSTREAM = upstream_to_dict(Upstream((UpstreamFile("m.gguf", SHA256, "cd" * 32),), "SHA256SUMS"))
RESULT = result_to_dict(BenchResult(created="2026-11-29T19:00:00.000Z", drives=()))
TRACE = {"schema": 1, "kind": "routing-trace", "layers": 1, "experts": 4, "top_k": 2,
         "steps": [{"phase": "decode", "layers": [[[0, 1]]]}]}
RESULTS = {"schema": 1, "kind": "bench-results", "created": "2026-11-29T19:40:00Z", "order": "ABBA", "sequence": [],
           "control": "a", "reference": "a", "reference_sha256": None, "settings": {},
           "arms": {"a": {"plan": "", "sources": ["/m/a.gguf"], "prefill_weights": [1], "decode_weights": [1]}},
           "rows": [], "medians": {"a": {"n": 2, "n_failed": 0, "prefill_tps": 11.0, "gen_steady_tps": 2.5}},
           "gains": {}, "pairs": [], "claims": {}}


@dataclass(frozen=True)
class Kind:
    name: str
    file: str                        # where the file lives, relative to tmp_path
    load: Callable[[str], Any]       # the loader, given the file's path
    good: dict                       # a document the writer writes
    other: dict                      # a document of another kind
    loaded: type                     # what `good` loads as


KINDS = [
    # The manifest's path is fixed (rig/manifest.json) and its writer never wrote a kind.
    Kind("manifest", "rig/manifest.json", lambda p: load_manifest(Rig(root=os.path.dirname(p))), MANIFEST, PLAN, ModelManifest),
    Kind("iobench result", "rig/bench/r.json", load_result, RESULT, PLAN, BenchResult),
    Kind("plan", "rig/plans/p.json", load_plan, PLAN, PROFILE, Plan),
    Kind("routing trace", "t.json", load_trace, TRACE, PLAN, dict),
    Kind("profile", "rig/profiles/p.json", load_profile, PROFILE, PLAN, Profile),
    Kind("harness results", "rig/runs/x/results.json", read_results, RESULTS, PLAN, HarnessRun),
    Kind("fleet report", "rig/fleet/r.json", load_report, FLEET, PLAN, FleetReport),
    Kind("upstream digests", "rig/upstream.json", load_upstream, UPSTREAM, PLAN, Upstream),
]
IDS = [k.name for k in KINDS]

# How each case makes the file; None: leave it missing.
CASES = {
    "missing": None,
    "directory": "dir",
    "not utf-8": b"\xff\xfe\x00{",
    "empty": b"",
    "bad json": b'{"schema": 1,',
    "not an object": b"[1, 2, 3]",
    "wrong kind": "other",
    "wrong schema": "schema",
}


def make(kind: Kind, case: str, root) -> str:
    path = os.path.join(str(root), kind.file)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    how = json.dumps(kind.good).encode() if case == "good" else CASES[case]
    if how == "dir":
        os.makedirs(path)
    elif how == "other":
        how = json.dumps(kind.other).encode()
    elif how == "schema":
        how = json.dumps({**kind.good, "schema": 99}).encode()
    if isinstance(how, bytes):
        with open(path, "wb") as f:
            f.write(how)
    return path


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_the_writers_document_loads(kind, tmp_path):
    """The table's control: each loader accepts what its writer writes, at that path."""
    assert isinstance(kind.load(make(kind, "good", tmp_path)), kind.loaded)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_error_table(kind, case, tmp_path):
    path = make(kind, case, tmp_path)
    cls, code = (MissingError, EXIT_MISSING) if case == "missing" else (RigError, EXIT_USAGE)
    with pytest.raises(Exception) as e:
        kind.load(path)
    assert type(e.value) is cls and e.value.exit_code == code
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg


def test_messages_say_what_is_wrong_and_the_fix(tmp_path):
    """One loader's lines in full: what, where and how to fix, in the kind's own words."""
    kind = KINDS[2]   # plan
    said = {}
    for case in ("missing", "directory", "bad json", "wrong kind", "wrong schema"):
        with pytest.raises(RigError if case != "missing" else MissingError) as e:
            kind.load(make(kind, case, tmp_path / case.replace(" ", "-")))
        said[case] = str(e.value).split(": ", 1)[1]
    fix = "give a plan written by `planner solve` (rig/plans/*.json)"
    assert said == {
        "missing": f"no such plan file; {fix}",
        "directory": f"is a directory, not a plan file; {fix}",
        "bad json": f"not valid JSON (Expecting property name enclosed in double quotes at line 1 column 14); {fix}",
        "wrong kind": f"not a plan file (kind is 'profile', expected 'plan'); {fix}",
        "wrong schema": f"plan schema 99 is not 1 or 2, those this version reads; {fix}",
    }


# ---- the same table at the surface: one command per kind --------------------------------------

@dataclass(frozen=True)
class Command:
    kind: Kind
    prog: str
    app: Any
    args: Callable[[str, Any, str], list]    # (file path, tmp_path, model) -> argv
    chatter: int = 0                         # progress lines the command prints before it reads the file


def _rig_with_model(tmp_path):
    root = tmp_path / "rig"
    save_rig(Rig(root=str(root), model=Member(str(tmp_path / "model.gguf"), "internal", "primary")))
    return str(root)


COMMANDS = [
    Command(KINDS[0], "replicas", replicas_app, lambda p, t, m: ["verify", "--rig", _rig_with_model(t)]),
    Command(KINDS[1], "iobench", iobench_app, lambda p, t, m: ["show", p]),
    Command(KINDS[2], "planner", planner_app, lambda p, t, m: ["show", p]),
    Command(KINDS[3], "engine-bridge", bridge_app, lambda p, t, m: ["replay", "--model", m, "--trace", p],
            chatter=1),   # "replay: 1 source, ..., trace FILE"
    Command(KINDS[4], "engine-bridge", bridge_app, lambda p, t, m: ["launch", "--binary", "/bin/true", "--profile", p]),
]


@pytest.mark.parametrize("case", ["missing", "directory", "bad json", "wrong kind", "wrong schema"])
@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.kind.name for c in COMMANDS])
def test_error_table_through_the_cli(cmd, case, tmp_path, tiny_model):
    path = make(cmd.kind, case, tmp_path)
    r = CliRunner().invoke(cmd.app, cmd.args(path, tmp_path, str(tiny_model)))
    assert r.exit_code == (EXIT_MISSING if case == "missing" else EXIT_USAGE), r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 + cmd.chatter and lines[-1].startswith(f"{cmd.prog}: error: {path}: "), r.stderr
