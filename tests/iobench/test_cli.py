"""`iobench` at its surface: exit codes, JSON on stdout, result files, bad input."""

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from core.rig import Member, Rig, save_rig
from iobench.cli import app
from tests.helpers import write_random
from tests.iobench.helpers import write_moe_gguf

MiB = 1 << 20
FAST = ["--seconds", "0.05", "--repeat", "2"]


def invoke(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r


def bench_dir():
    return os.path.join(os.environ["REPLICA_TUNER_RIG"], "bench")


@pytest.fixture
def two_files(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    write_random(a, 12 * MiB, seed=1)
    write_random(b, 12 * MiB, seed=2)
    return str(a), str(b)


def test_run_seq_on_two_files_prints_json_and_writes_the_result(two_files):
    r = invoke("run", *two_files, "--preset", "seq", *FAST, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "iobench" and d["schema"] == 2
    assert d["drives"][0]["queue"]["source"] in ("sysfs", "ioreg", "unknown")
    assert [x["path"] for x in d["drives"]] == list(two_files)
    assert len({x["name"] for x in d["drives"]}) == 2           # same mount point, names made unique
    seq = d["drives"][0]["presets"]["seq"]
    assert seq["piece_bytes"] == MiB and seq["bw_bytes"] > 0 and seq["knee_lanes"] == 8
    assert len(seq["runs_bw"]) == 2
    assert [g["preset"] for g in d["together"]] == ["seq"]
    assert d["drives"][0]["model"]["bw_max"] > 0
    files = os.listdir(bench_dir())
    assert len(files) == 1 and files[0].endswith("Z.json")
    with open(os.path.join(bench_dir(), files[0])) as f:
        assert json.load(f) == d


def test_a_directory_model_or_a_split_set_given_by_path_is_read_as_a_rig_member_is(tmp_path):
    """A path names a model as everywhere else (its directory, any file of its split set): the
    file holding most of it is read, not refused as 'not a regular file'; the default presets a
    model is too small for are skipped with a note on that drive, not the whole run refused."""
    from tests.helpers import write_safetensors_dir, write_split_gguf

    d = write_safetensors_dir(tmp_path / "m", shards=2, shard_bytes=12 * MiB)
    split = write_split_gguf(tmp_path / "s", "split", 3, tensor_bytes=6 * MiB)
    r = invoke("run", d, split[1], *FAST, "--json")
    assert r.exit_code == 0, r.output
    drives = json.loads(r.stdout)["drives"]
    assert [os.path.dirname(x["path"]) for x in drives] == [str(d), str(tmp_path / "s")]
    assert all(x["path"].endswith((".safetensors", ".gguf")) for x in drives)
    assert all("prefill preset skipped" in " ".join(x["notes"]) for x in drives)
    assert "prefill" not in drives[0]["presets"] and "seq" in drives[0]["presets"]


def test_run_from_the_rig_with_a_group_and_every_preset(tmp_path):
    paths = []
    for i, name in enumerate(("internal", "green", "white")):
        p = tmp_path / f"{name}.bin"
        with open(p, "wb") as f:                  # mostly sparse: only the shapes matter here
            f.truncate(72 * MiB)
        paths.append(str(p))
    root = os.environ["REPLICA_TUNER_RIG"]
    save_rig(Rig(root=root, model=Member(paths[0], "internal", "primary"),
                 replicas=(Member(paths[1], "green", "replica"), Member(paths[2], "white", "replica"))))
    # --restarts 1: decode's restarts are test_decode_restarts_its_trials_and_keeps_their_spread's (each a trial here)
    r = invoke("run", "--lanes", "1", "--group", "hub=green,white", "--weights", "10:5:5", *FAST, "--restarts", "1", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [x["name"] for x in d["drives"]] == ["internal", "green", "white"]
    pre = [x["presets"]["prefill"]["piece_bytes"] for x in d["drives"]]
    dec = [x["presets"]["decode"]["piece_bytes"] for x in d["drives"]]
    assert pre == [16 * MiB, 8 * MiB, 8 * MiB]
    assert dec == [3_489_792, 1_572_864, 1_572_864]
    assert [(g["name"], g["preset"]) for g in d["groups"]] == [("hub", p) for p in ("seq", "prefill", "decode", "rand4k")]
    assert [g["drives"] for g in d["together"]] == [["internal", "green", "white"]] * 4
    assert d["drives"][0]["presets"]["rand4k"]["piece_bytes"] == 4096
    assert d["settings"]["weights"] == [10, 5, 5] and d["settings"]["weights_from"] == "--weights"
    # show and compare read it back
    r = invoke("show")
    assert r.exit_code == 0 and "internal" in r.stdout and "Ceilings" in r.stdout
    r = invoke("show", "--json")
    assert json.loads(r.stdout)["created"] == d["created"]


def test_alone_and_together_flags(two_files):
    r = invoke("run", *two_files, "--preset", "seq", "--alone", *FAST, "--json")
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["together"] == [] and d["drives"][0]["presets"]["seq"]
    r = invoke("run", *two_files, "--preset", "seq", "--together", *FAST, "--json")
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["drives"][0]["presets"] == {} and d["together"][0]["members"][0]["lanes"] == 8


def test_gguf_decode_uses_the_expert_components(tmp_path):
    p = tmp_path / "m.gguf"
    comp = write_moe_gguf(p, layers=2, experts=4, rows=8, cols=512)
    r = invoke("run", p, "--preset", "decode", "--lanes", "1,2", *FAST, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    dec = d["drives"][0]["presets"]["decode"]
    assert dec["piece_bytes"] == comp == 16384
    assert [x["lanes"] for x in dec["lanes"]] == [1, 2]
    assert "decode: the model's 16,384 B components from 6 expert tensors" in d["drives"][0]["notes"]


def test_decode_restarts_its_trials_and_keeps_their_spread(tmp_path):
    p = tmp_path / "m.gguf"
    write_moe_gguf(p, layers=2, experts=4, rows=8, cols=512)
    r = invoke("run", p, "--preset", "decode", "--lanes", "1,2", *FAST, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    dec = d["drives"][0]["presets"]["decode"]
    assert d["settings"]["restarts"] == {"decode": 3}
    for lane in dec["lanes"]:
        trials = sorted(lane["trials_bw"])
        if len(trials) == 2:                     # the first two agreed within 1 %: no third
            assert (trials[1] - trials[0]) / trials[1] <= 0.01 and lane["bw_bytes"] == pytest.approx(sum(trials) / 2)
        else:
            assert len(trials) == 3 and trials[1] == lane["bw_bytes"]              # the median trial
        assert len(lane["runs_bw"]) == len(trials) * 2                           # trials of 2 windows
    r = invoke("run", p, "--preset", "decode", "--lanes", "1", "--restarts", "2", *FAST, "--json")
    assert r.exit_code == 0, r.output
    lane, = json.loads(r.stdout)["drives"][0]["presets"]["decode"]["lanes"]
    assert len(lane["trials_bw"]) == 2
    shown = invoke("show", "--lanes")
    assert shown.exit_code == 0 and "trials" in shown.stdout and "2: " in shown.stdout
    r = invoke("run", p, "--preset", "decode", "--restarts", "0", *FAST)
    assert r.exit_code == 2 and "--restarts" in r.output


def test_show_and_compare(two_files):
    for _ in range(2):
        assert invoke("run", two_files[0], "--preset", "seq", *FAST).exit_code == 0
    a, b = sorted(os.path.join(bench_dir(), n) for n in os.listdir(bench_dir()))
    r = invoke("compare", a, b, "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert len(rows) == 1 and rows[0]["preset"] == "seq" and rows[0]["ratio"] > 0
    r = invoke("compare", a, b)
    assert r.exit_code == 0 and "B/A" in r.stdout
    r = invoke("show", a)
    assert r.exit_code == 0 and "seq" in r.stdout
    # every column of every table has a header (the flags column had none)
    from iobench import render
    from iobench.result import load_result

    ra, rb = load_result(a), load_result(b)
    tables = [render.drives_table(ra), render.compare_table(render.compare_rows(ra, rb)), render.groups_table(ra)]
    for t in filter(None, tables):
        assert all(str(c.header).strip() for c in t.columns), [c.header for c in t.columns]


@pytest.mark.parametrize("args,message", [
    (["run", "{tmp}"], "holds no GGUF or safetensors file"),
    (["run", "{small}", "--preset", "seq"], "too small"),
    (["run", "{a}", "--lanes", "x"], "--lanes"),
    (["run", "{a}", "--lanes", "0"], "--lanes"),
    (["run", "{a}", "--preset", "bogus"], "--preset"),
    (["run", "{a}", "{b}", "--group", "hub"], "--group"),
    (["run", "{a}", "{b}", "--group", "hub=a,nope"], "no drive named"),
    (["run", "{a}", "{b}", "--weights", "10:5:5"], "one weight per drive"),
    (["run", "{a}", "{b}", "--weights", "10:5", "--decode-weights", "1:2:3"], "one weight per drive"),
    (["run", "{a}", "--weights", "0"], "weight"),
    (["run", "{a}", "--seconds", "0"], "--seconds"),
    (["run", "{a}", "{a}"], "twice"),
    (["run", "{a}", "--together"], "at least two drives"),
    (["run", "{a}", "{b}", "{small}", "{c}", "--preset", "prefill"], "at most 3 sources as ds4-argodrive does"),
    (["compare", "{a}", "{b}"], "a.bin: not UTF-8 text, so not an iobench result file"),
])
def test_bad_input_exits_2(tmp_path, args, message):
    run_bad_input(tmp_path, args, message, 2)


@pytest.mark.parametrize("args", [["run", "/no/such/file"], ["run", "{a}", "{b}", "{small}", "{tmp}/x", "--preset", "seq"]])
def test_a_missing_file_exits_3(tmp_path, args):
    run_bad_input(tmp_path, args, "no such file", 3)


def test_no_rig_is_a_rig_file_missing_exit_3(tmp_path):
    """rig.toml missing is README's 'a rig file missing' (3), as a missing bench result or plan is."""
    run_bad_input(tmp_path, ["run"], "no rig", 3)


def run_bad_input(tmp_path, args, message, code):
    a, b, c, small = tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin", tmp_path / "small.bin"
    write_random(a, 12 * MiB, seed=1)
    write_random(b, 12 * MiB, seed=2)
    write_random(c, 12 * MiB, seed=5)
    write_random(small, MiB, seed=3)
    subst = {"{tmp}": str(tmp_path), "{a}": str(a), "{b}": str(b), "{c}": str(c), "{small}": str(small)}
    r = invoke(*[subst.get(x, x) for x in args])
    assert r.exit_code == code, r.output
    assert message in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (["show"], "no iobench results"),
    (["show", "latest"], "no iobench results"),
    (["show", "/no/such.json"], "/no/such.json: no such iobench result file"),
    (["compare", "/no/such.json", "/no/other.json"], "/no/such.json: no such iobench result file"),
])
def test_missing_result_exits_3_like_a_missing_plan(args, message):
    r = invoke(*args)
    assert r.exit_code == 3, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("iobench: error: ") and message in lines[0]
    assert "Traceback" not in r.output


def test_a_file_in_tmpfs_is_measured_as_a_ram_member_not_flagged(tmp_path):
    from core.tiers import is_memory

    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK) or not is_memory(shm):
        pytest.skip("no writable /dev/shm (tmpfs) here")
    p = os.path.join(shm, f"iobench-test-{os.getpid()}.bin")
    try:
        write_random(p, 32 * MiB, seed=4)
        r = invoke("run", p, "--preset", "seq,decode", "--lanes", "1,2", *FAST, "--json")
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        drive = d["drives"][0]
        assert drive["presets"]["seq"]["suspect_cache"] is False          # RAM is what a RAM member answers from
        assert drive["model"] is not None and drive["model"]["bw_max"] > 0  # so the planner can price it
        assert any("RAM member" in n and "reboot" in n for n in drive["notes"])
    finally:
        os.remove(p)


def test_scratch_measures_a_folder_and_removes_only_its_own_file(tmp_path):
    folder = tmp_path / "drive"
    folder.mkdir()
    (folder / "mine.bin").write_bytes(b"x" * 4096)
    r = invoke("scratch", folder, "--size", "32M", "--name", "new", "--preset", "seq,decode", "--lanes", "1,2", *FAST, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    sc = d["settings"]["scratch"]
    assert sc["removed"] is True and sc["size"] == 32 * MiB and sc["write_Bps"] > 0
    assert d["drives"][0]["name"] == "new" and d["drives"][0]["model"] is not None
    assert sorted(os.listdir(folder)) == ["mine.bin"]
    assert len(os.listdir(os.path.join(bench_dir(), "scratch"))) == 1            # kept apart from the rig's results
    assert not [f for f in os.listdir(bench_dir()) if f.endswith(".json")]


def test_a_scratch_file_that_changed_under_us_is_not_removed(tmp_path):
    from iobench.scratch import remove_scratch, write_scratch

    s = write_scratch(str(tmp_path), 1)
    assert os.path.getsize(s.path) == 8 * MiB and s.write_Bps > 0
    os.remove(s.path)
    with open(s.path, "wb") as f:           # something else now has this name: never ours to delete
        f.write(b"other")
    assert remove_scratch(s) is False and os.path.exists(s.path)
    os.remove(s.path)
    r = invoke("scratch", tmp_path / "nope")
    assert r.exit_code == 3 and "no such folder" in r.output


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_side_by_side(tmp_path):
    p = tmp_path / "f.bin"
    write_random(p, 24 * MiB, seed=5)
    r = invoke("fio", p, "--preset", "seq", "--seconds", "0.2", "--repeat", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["fio"]["bw_bytes"] > 0 and d["iobench"]["bw_bytes"] > 0 and d["ratio"] > 0
    assert "--rw=read" in d["fio_args"] and "--bs=1048576" in d["fio_args"]
    r = invoke("fio", p, "--preset", "seq", "--seconds", "0.2", "--repeat", "1")
    assert r.exit_code == 0 and "iobench/fio" in r.stdout


def test_run_names_its_result_once_and_piped_lines_keep_long_paths_whole(tmp_path):
    deep = tmp_path.joinpath(*[f"enclosure-{i:02d}-thunderbolt" for i in range(6)])
    deep.mkdir(parents=True)
    f = deep / "DeepSeek-V4.1-Flash-Q4_K_M.gguf"
    write_random(f, 12 * MiB, seed=7)
    r = invoke("run", f, "--preset", "seq", *FAST)
    assert r.exit_code == 0, r.output
    (result,) = [os.path.join(bench_dir(), n) for n in os.listdir(bench_dir())]
    assert (r.stdout + r.stderr).count(result) == 1
    assert f"iobench: wrote {result}" in r.stderr.splitlines()
    assert "…" not in r.stdout
    shown = invoke("show", result)
    assert shown.exit_code == 0 and f"result: {result}" in shown.stdout.splitlines()
    compared = invoke("compare", result, result)
    assert compared.exit_code == 0
    assert any(line.startswith(f"A = {result} (") for line in compared.stdout.splitlines())
    assert any(line.startswith(f"B = {result} (") for line in compared.stdout.splitlines())


@pytest.mark.parametrize("args", [["run", "/no/such/file"], ["show", "/no/such.json"], ["run", "--seconds", "x"]])
def test_an_error_is_one_line_that_ends_with_a_newline(args):
    r = invoke(*args)
    assert r.exit_code in (2, 3) and r.stdout == ""
    assert r.stderr.startswith("iobench: error: ") and r.stderr.endswith("\n") and r.stderr.count("\n") == 1


@pytest.mark.parametrize("command, usage", [
    ("run", "Usage: iobench run [OPTIONS] [PATH]..."),
    ("show", "Usage: iobench show [OPTIONS] [RESULT]"),
    ("compare", "Usage: iobench compare [OPTIONS] A B"),
    ("fio", "Usage: iobench fio [OPTIONS] PATH"),
])
def test_usage_lines_name_the_arguments_plainly(command, usage):
    r = invoke(command, "-h")
    assert r.exit_code == 0 and usage in [line.strip() for line in r.stdout.splitlines()]


def test_quiet_run_prints_the_result_and_nothing_on_stderr(two_files):
    loud = invoke("run", *two_files, "--preset", "seq", *FAST)
    assert loud.exit_code == 0 and "iobench: wrote" in loud.stderr
    r = invoke("run", *two_files, "--preset", "seq", *FAST, "--quiet")
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and "seq" in r.stdout


def _block_device_of(path):
    from core.sysfs import dev_of, device_dir
    return device_dir(dev_of(path) or "")


def test_run_measures_together_the_drives_sharing_a_disk_and_says_so(tmp_path):
    """Two files on tmp_path's disk and one in /dev/shm (no block device): the two form a group
    from sysfs, measured as its own group run before the together run of all three."""
    if not _block_device_of(str(tmp_path)):
        pytest.skip("tmp_path sits on no block device sysfs shows")
    if not os.path.isdir("/dev/shm") or _block_device_of("/dev/shm"):
        pytest.skip("needs /dev/shm on a memory file system")
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    write_random(a, 12 * MiB, seed=1)
    write_random(b, 12 * MiB, seed=2)
    shm = os.path.join("/dev/shm", f"rt-topology-{os.getpid()}-{tmp_path.name}.bin")
    try:
        write_random(shm, 12 * MiB, seed=3)
        r = invoke("run", a, b, shm, "--preset", "seq", "--lanes", "1", *FAST, "--json")
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        names = [x["name"] for x in d["drives"]]
        g, = d["topology"]["groups"]
        assert g["drives"] == names[:2] and g["reason"].startswith("disk ")
        assert d["settings"]["topology_groups"] == [g["name"]]
        assert [(x["name"], x["drives"]) for x in d["groups"]] == [(g["name"], names[:2])]
        assert "no block device" in d["topology"]["drives"][2]["note"]
        r = invoke("show")
        assert f"share {g['reason']}; measured together as group {g['name']}" in r.stdout
        r = invoke("run", a, b, shm, "--preset", "seq", "--lanes", "1", "--alone", *FAST)
        assert f"share {g['reason']}; not measured together" in r.stdout
        r = invoke("run", a, b, shm, "--preset", "seq", "--lanes", "1", "--no-topology", "--alone", *FAST, "--json")
        d = json.loads(r.stdout)
        assert d["topology"] is None and d["groups"] == []
    finally:
        os.unlink(shm)
