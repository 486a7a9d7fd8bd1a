"""engine-bridge export refuses every plan the engine would reject or silently mis-read."""

import os

import pytest
from typer.testing import CliRunner

from core.errors import RigError, UsageError
from engine_bridge.cli import app
from engine_bridge.profiles.profile import parse_definition, resolve
from engine_bridge.profiles.rules import SourceFacts, check_cache, check_sources
from tests.engine_bridge.export_helpers import make_dir_rig, make_rig, raw_plan, write_plan, write_raw_plan

runner = CliRunner()


def refused(root, plan, *extra, code=2):
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive",
                            "--cache-experts", "4600", *extra])
    assert r.exit_code == code, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("engine-bridge: error: "), r.stderr
    assert not os.path.exists(os.path.join(root, "profiles", "plan.env"))
    return lines[0]


def test_more_sources_than_the_engine_takes(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3)
    plan = write_raw_plan(tmp_path, raw_plan(paths + [paths[2]], (4, 1, 1, 1), (4, 1, 1, 1)))
    assert "at most 3 sources" in refused(root, plan)


def test_plan_solved_for_another_engine(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    doc = raw_plan(paths, (10, 5), (10, 6))
    doc["engine"] = "colibri"
    plan = write_raw_plan(tmp_path, doc)
    assert "the plan was solved for colibri's reads, not ds4-argodrive's" in refused(root, plan)


def test_a_model_the_engine_cannot_read_is_refused_in_one_line_naming_the_engine_that_can(tmp_path):
    # a ds4 plan of a safetensors directory: not three 'not a regular file', one line naming colibri
    root, dirs = make_dir_rig(tmp_path, 3)
    plan = write_plan(tmp_path, dirs, (10, 5, 5), (10, 6, 6))
    line = refused(root, plan, "--allow-unverified")
    assert line == (f"engine-bridge: error: plan {plan}: ds4-argodrive reads one GGUF file (-m); this model is a "
                    "safetensors directory; colibri reads it: solve the plan for it (`planner solve --engine colibri`) "
                    "and export with --format colibri")


def test_a_gguf_model_for_colibri_names_ds4(tmp_path, model_dir):
    root, paths, _ = make_rig(tmp_path, 2)
    plan = write_plan(tmp_path, [str(model_dir / "model.gguf"), str(model_dir / "r1.gguf")], (2, 1), (2, 1))
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "colibri", "-o", str(tmp_path / "c.env")])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert ("colibri loads a directory of safetensors shards with tokenizer.json; this model is a gguf file; "
            "ds4-argodrive or llama.cpp reads it") in r.stderr


def test_relative_path(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    rel = os.path.relpath(paths[1])
    plan = write_plan(tmp_path, [paths[0], rel], (10, 5), (10, 6))
    line = refused(root, plan)
    assert f"sources[1]: {rel!r} is not an absolute path" in line


@pytest.mark.parametrize("char", [",", "*"])
def test_path_with_separator_character(tmp_path, char):
    root, paths, manifest = make_rig(tmp_path, 2)
    odd_dir = tmp_path / f"green{char}2"
    odd_dir.mkdir()
    odd = str(odd_dir / "model.gguf")
    os.rename(paths[1], odd)
    plan = write_plan(tmp_path, [paths[0], odd], (10, 5), (10, 6))
    line = refused(root, plan, "--allow-unverified")
    assert f"contains {char!r}" in line and "separator" in line


@pytest.mark.parametrize("prefill, decode, needle", [
    ((10, 0), (10, 6), "each must be an integer 1..100"),
    ((10, 5), (10, 101), "each must be an integer 1..100"),
    ((10, 5), (10, 6, 6), "3 weights for 2 sources"),
])
def test_bad_weights_in_the_plan_file(tmp_path, prefill, decode, needle):
    root, paths, _ = make_rig(tmp_path, 2)
    plan = write_raw_plan(tmp_path, raw_plan(paths, prefill, decode))
    assert needle in refused(root, plan)


def test_replica_of_another_size(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3)
    with open(paths[2], "ab") as f:
        f.write(b"x")
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    line = refused(root, plan, "--allow-unverified")
    size = os.path.getsize(paths[0])
    assert f"sources[2]: replica {paths[2]} is {size + 1} bytes, the primary {size}" in line


def test_replica_that_is_the_primary_by_inode(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    os.unlink(paths[1])
    os.link(paths[0], paths[1])
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    assert "is the same file (inode) as sources[0]" in refused(root, plan, "--allow-unverified")


def test_two_replicas_on_one_inode(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3)
    os.unlink(paths[2])
    os.link(paths[1], paths[2])
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    assert "sources[2]: replica" in (line := refused(root, plan, "--allow-unverified")) and "as sources[1]" in line


def test_unverified_replica(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3, verify=False)
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    line = refused(root, plan)
    assert "breaks 2 engine rules" in line
    assert f"replica {paths[1]} has never been verified against the manifest; run `replicas verify`" in line


def test_stale_replica(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    st = os.stat(paths[1])
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    assert "was modified since it was verified" in refused(root, plan)


def test_missing_replica_is_exit_3(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    os.unlink(paths[1])
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    assert "does not exist; run `replicas sync`" in refused(root, plan, code=3)


def test_primary_that_is_not_the_manifests_file(tmp_path):
    root, paths, _ = make_rig(tmp_path, 1)
    with open(paths[0], "ab") as f:
        f.write(b"more")
    plan = write_plan(tmp_path, paths, (1,), (1,))
    assert "but the manifest describes" in refused(root, plan)


def test_cache_size_is_required_and_positive(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive"])
    assert r.exit_code == 2 and "no expert-cache size: pass --cache-experts N" in r.stderr
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", "--cache-experts", "0"])
    assert r.exit_code == 2 and "must be a positive integer" in r.stderr


def test_unknown_base_format_and_plan(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", "--base", "nope",
                            "--cache-experts", "1"])
    assert r.exit_code == 2 and "profile 'nope' is not known; known profiles: io-base, stack-levers" in r.stderr
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "vllm"])
    assert r.exit_code == 2 and "use one of ds4-argodrive, colibri, llama.cpp, json" in r.stderr
    r = runner.invoke(app, ["export", "--rig", root, "--plan", str(tmp_path / "none.json"), "--format", "json"])
    assert r.exit_code == 3 and "none.json: no such plan file" in r.stderr


# The checker itself, on facts alone (rules a Plan object cannot even be built with).

def facts(n, size=100):
    return [SourceFacts(i, f"/d{i}/m", size=size, device=1, inode=10 + i, state="verified" if i else "") for i in range(n)]


def test_checker_reports_every_violation_with_its_reason():
    f = facts(4)
    f[1] = SourceFacts(1, "d1/m,x", size=99, device=1, inode=10, state="stale")
    v = check_sources(f, (10, 5, 5, 0), (10, 6), allow_unverified=False, manifest_size=100)
    rules = [x.rule for x in v]
    assert rules == ["too-many-sources", "relative-path", "bad-character", "weight-range", "weight-count",
                     "size", "same-inode", "unverified"]
    assert str(v[3]) == "prefill.weights[3]: weight 0 is not an integer 1..100"
    assert "ignores a wrong count and only logs that it did" in v[4].reason


def test_checker_accepts_a_good_plan_and_unverified_when_allowed():
    assert check_sources(facts(3), (10, 5, 5), (10, 6, 6)) == []
    f = facts(3)
    f[2] = SourceFacts(2, "/d2/m", size=100, device=1, inode=12, state="unverified")
    assert [x.rule for x in check_sources(f, (10, 5, 5), (10, 6, 6))] == ["unverified"]
    assert check_sources(f, (10, 5, 5), (10, 6, 6), allow_unverified=True) == []
    assert check_sources(facts(5), (1,) * 5, (1,) * 5, engine="colibri") == []     # files: no directory to judge
    assert [x.rule for x in check_sources(facts(6), (1,) * 6, (1,) * 6, engine="colibri")] == ["too-many-sources"]
    assert check_cache(4600) == [] and check_cache(True)[0].rule == "cache-range"


def test_definitions_refuse_plan_keys_loops_and_contradictions():
    with pytest.raises(RigError, match="comes from the plan"):
        parse_definition('name = "x"\n[set]\nDS4_ARGODRIVE_REPLICAS = "/a*1"\n', "x.toml")
    with pytest.raises(RigError, match="also sets"):
        parse_definition('name = "x"\nunset = ["A"]\n[set]\nA = "1"\n', "x.toml")
    with pytest.raises(RigError, match="not known"):
        parse_definition('name = "x"\nextra = 1\n', "x.toml")
    a = parse_definition('name = "a"\nbase = "b"\n', "a.toml")
    b = parse_definition('name = "b"\nbase = "a"\n', "b.toml")
    with pytest.raises(RigError, match="loop"):
        resolve("a", {"a": a, "b": b})
    with pytest.raises(UsageError, match="names base 'b', which is not known"):
        resolve("a", {"a": a})
