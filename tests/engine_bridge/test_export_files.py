"""engine-bridge export: the files it writes, line by line, and what they do in a shell."""

import json
import os
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine_bridge.cli import app
from engine_bridge.profiles.export import export_profile, load_profile
from engine_bridge.profiles.profile import Profile, profile_from_dict, profile_to_dict, render_env
from replicas.manifest import ModelManifest
from tests.engine_bridge.export_helpers import make_rig, write_plan
from tests.helpers import counting_opens

runner = CliRunner()

IO_BASE = [
    "export DS4_ARGODRIVE_PREFILL_SPLIT='1'",
    "export DS4_ARGODRIVE_PREFILL_SELECTIVE='1'",
    "export DS4_ARGODRIVE_PREFILL_AHEAD='1'",
    "export DS4_ARGODRIVE_PREFILL_LANES='8'",
    "export DS4_METAL_STREAMING_EXPERT_PREAD_THREADS='9'",
]
STACK_UNSETS = ["unset DS4_ARGODRIVE_BF16_EPILOGUES", "unset DS4_ARGODRIVE_FLAG_READBACK", "unset DS4_ARGODRIVE_PSO_CACHE"]


def export(tmp_path, drives, prefill, decode, *args):
    root, paths, manifest = make_rig(tmp_path, drives)
    plan = write_plan(tmp_path, paths, prefill, decode)
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", *args])
    assert r.exit_code == 0, r.output
    return root, paths, manifest, plan, r


def body(path):
    """The file without its comment header, and the header alone."""
    lines = open(path).read().splitlines()
    return [line for line in lines if not line.startswith("#")], [line for line in lines if line.startswith("#")]


def test_three_drives_10_5_5_prefill_10_6_6_decode(tmp_path):
    root, (p0, p1, p2), manifest, plan, r = export(tmp_path, 3, (10, 5, 5), (10, 6, 6), "--cache-experts", "4600")
    env_file = os.path.join(root, "profiles", "plan.env")
    assert r.stdout.split() == [env_file, os.path.join(root, "profiles", "plan.json")]
    lines, header = body(env_file)
    assert lines == [
        "export DS4_ARGODRIVE_PRIMARY_WEIGHT='10'",
        f"export DS4_ARGODRIVE_REPLICAS='{p1}*5,{p2}*5'",
        "export DS4_ARGODRIVE_DECODE_WEIGHTS='10,6,6'",
        *IO_BASE,
        *STACK_UNSETS,
    ]
    assert f"# engine arguments: --ssd-streaming -m {p0} --ssd-streaming-cache-experts 4600" in header
    assert "# weights: prefill (base) 10:5:5, decode 10:6:6; expert cache 4600 experts" in header
    digest = ModelManifest((manifest,)).digest()       # the model digest, labelled as what it is (not a b3sum)
    assert f"# model: {manifest.size} bytes, digest {digest} (replica-tuner's manifest digest, not a file's b3sum)" in header
    assert "# named profile: io-base" in header
    assert not any("WARNING" in h for h in header)


def test_two_drives_10_5_prefill_10_6_decode(tmp_path):
    root, (p0, p1), _, _, _ = export(tmp_path, 2, (10, 5), (10, 6), "--cache-experts", "4200", "--profile", "two")
    lines, header = body(os.path.join(root, "profiles", "two.env"))
    assert lines == [
        "export DS4_ARGODRIVE_PRIMARY_WEIGHT='10'",
        f"export DS4_ARGODRIVE_REPLICAS='{p1}*5'",
        "export DS4_ARGODRIVE_DECODE_WEIGHTS='10,6'",
        *IO_BASE,
        *STACK_UNSETS,
    ]
    assert f"# engine arguments: --ssd-streaming -m {p0} --ssd-streaming-cache-experts 4200" in header


def test_one_drive_unsets_every_split_key(tmp_path):
    root, (p0,), _, _, _ = export(tmp_path, 1, (1,), (1,), "--cache-experts", "3600", "--profile", "solo")
    lines, header = body(os.path.join(root, "profiles", "solo.env"))
    assert lines == [
        *IO_BASE,
        "unset DS4_ARGODRIVE_BF16_EPILOGUES",
        "unset DS4_ARGODRIVE_DECODE_WEIGHTS",
        "unset DS4_ARGODRIVE_FLAG_READBACK",
        "unset DS4_ARGODRIVE_PRIMARY_WEIGHT",
        "unset DS4_ARGODRIVE_PSO_CACHE",
        "unset DS4_ARGODRIVE_REPLICAS",
    ]
    assert "# weights: prefill (base) 1 (single source: no split); expert cache 3600 experts" in header
    p = load_profile(os.path.join(root, "profiles", "solo.json"))
    assert p.sources == 1 and p.decode_weights == () and p.argv[-1] == "3600"


def test_env_file_round_trips_through_a_shell(tmp_path):
    root, (p0, p1, p2), _, _, _ = export(tmp_path, 3, (10, 5, 5), (10, 6, 6), "--cache-experts", "4600")
    env_file = os.path.join(root, "profiles", "plan.env")
    # A polluted shell: a stale presence flag set to 0 (which the engine would read as "on") and
    # an old replica list; sourcing the profile must leave exactly the profile's values.
    polluted = {"PATH": os.environ["PATH"], "DS4_ARGODRIVE_PSO_CACHE": "0", "DS4_ARGODRIVE_REPLICAS": "/old*1"}
    out = subprocess.run(["sh", "-c", '. "$1"; env', "sh", env_file], env=polluted, capture_output=True,
                         text=True, check=True).stdout
    got = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("DS4_"))
    want = load_profile(os.path.join(root, "profiles", "plan.json")).env
    assert got == want
    assert got["DS4_ARGODRIVE_REPLICAS"] == f"{p1}*5,{p2}*5"


def test_quoting_survives_a_path_with_quote_and_space(tmp_path):
    drive = tmp_path / "it's a drive"
    drive.mkdir()
    root, paths, manifest = make_rig(tmp_path, 2)
    odd = str(drive / "model.gguf")
    os.rename(paths[1], odd)
    # The rig must know the replica at its new path for the stamp to be found: re-verify there.
    from core.rig import Member, load_rig
    from replicas.verify import check_member
    assert check_member(Member(odd, "odd", "replica"), manifest, load_rig(root), mode="full").state == "identical"
    plan = write_plan(tmp_path, [paths[0], odd], (2, 1), (10, 6))
    res = export_profile(rig_root=root, plan_path=plan, fmt="ds4-argodrive", cache_experts=10, output=str(tmp_path / "odd.env"))
    out = subprocess.run(["sh", "-c", '. "$1"; printf %s "$DS4_ARGODRIVE_REPLICAS"', "sh", res.files[0]],
                         capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]}).stdout
    assert out == f"{odd}*1"
    assert res.files[1] == str(tmp_path / "odd.json")


def test_profile_json_shape_is_pinned_and_round_trips(tmp_path):
    root, _, manifest, plan, _ = export(tmp_path, 3, (10, 5, 5), (10, 6, 6), "--cache-experts", "4600")
    d = json.load(open(os.path.join(root, "profiles", "plan.json")))
    assert list(d) == ["schema", "kind", "id", "engine", "variant", "environment", "unset", "argv", "primary",
                       "primary_weight", "replicas", "replica_weights", "decode_weights", "cache_experts",
                       "model", "allow_unverified", "unverified", "provenance", "plan"]
    assert d["schema"] == 1 and d["kind"] == "profile" and d["variant"] == ""
    del d["variant"]                                # a profile written before the key loads as ""
    assert profile_from_dict(d).variant == ""
    d = json.load(open(os.path.join(root, "profiles", "plan.json")))
    assert d["primary_weight"] == 10 and d["replica_weights"] == [5, 5] and d["decode_weights"] == [10, 6, 6]
    assert d["model"] == {"size": manifest.size, "blake3": ModelManifest((manifest,)).digest()}
    assert d["provenance"]["plan_file"] == plan and d["provenance"]["chain"] == ["io-base"]
    assert d["plan"]["prefill"]["weights"] == [10, 5, 5]
    assert profile_to_dict(profile_from_dict(d)) == d


def test_json_format_to_stdout_is_the_same_shape(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "json", "--cache-experts", "4600", "-o", "-"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "profile" and d["environment"]["DS4_ARGODRIVE_DECODE_WEIGHTS"] == "10,6"
    assert d["plan"]["sources"][1]["path"] == paths[1]


def test_named_profile_layering_and_cache_from_the_profile(tmp_path):
    root, (p0, p1, p2), _, _, _ = export(tmp_path, 3, (10, 5, 5), (10, 6, 6), "--base", "stack-levers", "--profile", "stack")
    lines, header = body(os.path.join(root, "profiles", "stack.env"))
    assert lines[3:] == IO_BASE + ["export DS4_ARGODRIVE_FLAG_READBACK='1'", "export DS4_ARGODRIVE_BF16_EPILOGUES='1'",
                                   "export DS4_ARGODRIVE_PSO_CACHE='1'"]
    assert "# named profile: io-base + stack-levers" in header
    assert header[1].endswith("--ssd-streaming-cache-experts 4600")


def test_user_profile_in_the_rig_adds_and_removes_keys(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    (tmp_path / "rig" / "profiles").mkdir()
    (tmp_path / "rig" / "profiles" / "lean.toml").write_text(
        'schema = 1\nname = "lean"\nbase = "stack-levers"\ncache_experts = 3600\n'
        'unset = ["DS4_ARGODRIVE_PREFILL_AHEAD"]\n[set]\nDS4_ARGODRIVE_PREFILL_LANES = "4"\nDS4_ARGODRIVE_NEW_LEVER = "1"\n')
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", "--base", "lean"])
    assert r.exit_code == 0, r.output
    p = load_profile(os.path.join(root, "profiles", "plan.json"))
    assert p.cache_experts == 3600
    assert p.env["DS4_ARGODRIVE_PREFILL_LANES"] == "4" and p.env["DS4_ARGODRIVE_NEW_LEVER"] == "1"
    assert "DS4_ARGODRIVE_PREFILL_AHEAD" in p.unset and "DS4_ARGODRIVE_PREFILL_AHEAD" not in p.env

    r = runner.invoke(app, ["profiles", "--rig", root, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    lean = next(d for d in doc["definitions"] if d["name"] == "lean")
    assert lean["chain"] == ["io-base", "stack-levers", "lean"]
    assert lean["delta"] == {"added": {"DS4_ARGODRIVE_NEW_LEVER": "1"}, "changed": {"DS4_ARGODRIVE_PREFILL_LANES": "4"},
                             "removed": ["DS4_ARGODRIVE_PREFILL_AHEAD"], "cache_experts": 3600}
    stack = next(d for d in doc["definitions"] if d["name"] == "stack-levers")
    assert stack["delta"]["added"] == {"DS4_ARGODRIVE_FLAG_READBACK": "1", "DS4_ARGODRIVE_BF16_EPILOGUES": "1",
                                       "DS4_ARGODRIVE_PSO_CACHE": "1"}
    assert [e["id"] for e in doc["exported"]] == ["plan"]
    # The table names every profile and its delta.
    r = runner.invoke(app, ["profiles", "--rig", root])
    assert r.exit_code == 0
    assert "lean = stack-levers + (profiles/lean.toml)" in r.stdout
    assert "  + DS4_ARGODRIVE_NEW_LEVER=1\n  ~ DS4_ARGODRIVE_PREFILL_LANES=4\n  - DS4_ARGODRIVE_PREFILL_AHEAD\n" in r.stdout


def test_allow_unverified_marks_the_profile(tmp_path):
    root, paths, _ = make_rig(tmp_path, 3, verify=False)
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive",
                            "--cache-experts", "4600", "--allow-unverified"])
    assert r.exit_code == 0, r.output
    p = load_profile(os.path.join(root, "profiles", "plan.json"))
    assert p.allow_unverified and p.unverified == tuple(paths[1:])
    assert "not verified" in r.stderr
    header = body(os.path.join(root, "profiles", "plan.env"))[1]
    assert any(h.startswith("# WARNING: exported with --allow-unverified") and paths[2] in h for h in header)


def test_exports_are_atomic_and_overwrite_cleanly(tmp_path):
    root, paths, _ = make_rig(tmp_path, 2)
    plan = write_plan(tmp_path, paths, (10, 5), (10, 6))
    for cache in ("4200", "4600"):
        r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", "--cache-experts", cache])
        assert r.exit_code == 0, r.output
    assert sorted(os.listdir(os.path.join(root, "profiles"))) == ["plan.env", "plan.json"]
    assert load_profile(os.path.join(root, "profiles", "plan.env")).cache_experts == 4600


# Any value a path can hold survives the shell: quotes, spaces, $, backquotes, backslashes, newlines.
_value = st.text(st.one_of(st.sampled_from(list("a/ '\"$`\\\n*,;!#&|(){}~")),
                          st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")), max_size=40)


@settings(max_examples=40, deadline=None)
@given(values=st.lists(_value, min_size=1, max_size=4))
def test_any_value_round_trips_through_sh(values):
    env = tuple((f"DS4_TEST_{i}", v) for i, v in enumerate(values))
    p = Profile(id="h", engine="ds4-argodrive", environment=env, unset=("DS4_GONE",), argv=("-m", "/m"),
                primary="/m", primary_weight=1, replicas=(), replica_weights=(), decode_weights=(), cache_experts=1)
    script = render_env(p) + 'for k in ' + " ".join(k for k, _ in env) + '; do eval "printf \'%s\\\\0\' \\"\\$$k\\""; done\n'
    script += '[ -z "${DS4_GONE+x}" ] || printf LEAK\n'
    out = subprocess.run(["sh", "-c", script], capture_output=True, check=True,
                         env={"PATH": os.environ["PATH"], "DS4_GONE": "0", "LC_ALL": "C.UTF-8"}).stdout
    *got, rest = out.split(b"\0")
    assert got == [v.encode() for _, v in env] and rest == b""      # rest would hold LEAK


def test_export_reads_the_plan_and_rig_toml_once(tmp_path):
    # The N-1 profiles (--fallbacks, the default) are re-solved from the rig export has loaded.
    root, paths, _ = make_rig(tmp_path, 3)
    plan = write_plan(tmp_path, paths, (10, 5, 5), (10, 6, 6))
    with counting_opens() as opened:
        r = runner.invoke(app, ["export", "--rig", root, "--plan", plan, "--format", "ds4-argodrive", "--cache-experts", "4600"])
    assert r.exit_code == 0, r.output
    assert opened[plan] == 1 and opened[os.path.join(root, "rig.toml")] == 1
