"""`iobench testbed`: the command surface everywhere; building, throttling, crashing and taking
down real drives where the machine allows it (root, loop devices, a block I/O controller)."""

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from core.errors import UsageError
from iobench import testbed
from iobench.cli import app
from iobench.testbed_spec import cgroup_name, plan_drives

runner = CliRunner()
PROBLEMS = testbed.check()
needs_testbed = pytest.mark.skipif(bool(PROBLEMS), reason=f"no testbed here: {', '.join(PROBLEMS)}")
SIZE = 64 << 20
IOBENCH = [sys.executable, "-c", "from iobench.cli import main; main()"]


def test_check_says_yes_with_exit_0_or_why_not_with_exit_1():
    r = runner.invoke(app, ["testbed", "check"])
    if PROBLEMS:
        assert r.exit_code == 1 and r.output.startswith("unavailable: ") and PROBLEMS[0] in r.output
    else:
        assert r.exit_code == 0 and r.output.startswith("ok: root, loop devices, cgroup v")


def test_no_testbed_at_a_folder_is_exit_3_in_one_line(tmp_path):
    r = runner.invoke(app, ["testbed", "show", "--root", str(tmp_path)])
    assert r.exit_code == 3
    assert r.output.strip().splitlines() == [
        f"iobench: error: {tmp_path}/testbed.json: no such testbed state file; build one with `iobench testbed up`"]
    r = runner.invoke(app, ["testbed", "down", "--root", str(tmp_path)])
    assert r.exit_code == 3 and len(r.output.strip().splitlines()) == 1


def test_a_state_file_of_another_kind_is_exit_2_and_nothing_is_touched(tmp_path):
    (tmp_path / "testbed.json").write_text('{"kind": "something-else"}')
    r = runner.invoke(app, ["testbed", "down", "--root", str(tmp_path)])
    assert r.exit_code == 2 and "not a testbed state file" in r.output
    assert (tmp_path / "testbed.json").read_text() == '{"kind": "something-else"}'


def test_bad_limits_are_exit_2_before_anything_is_made(tmp_path):
    root = tmp_path / "bed"
    for args, text in ((["--drive", "a:0"], "--drive 'a:0'"), (["--drive", "a:5", "--iops", "b:3"], "--iops names b"),
                       (["--drive", "a:5", "--size", "1M"], "--size '1M'")):
        r = runner.invoke(app, ["testbed", "up", "--root", str(root), *args])
        assert r.exit_code == 2 and text in r.output, r.output
    assert not root.exists()


def test_run_wants_a_command(tmp_path):
    with pytest.raises(UsageError, match="wants a command"):
        testbed.exec_in_group(str(tmp_path), [])


# ---- on real drives ---------------------------------------------------------------------------

def leftovers(root: str) -> list[str]:
    """Anything of a testbed at `root` still on the machine."""
    found = [line for line in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()
             if root in line]
    with open("/proc/self/mountinfo") as f:
        found += [line for line in f if root in line]
    ctl, _ = testbed.controller()
    if os.path.exists(os.path.join(ctl.mount, cgroup_name(root))):
        found.append(f"group {cgroup_name(root)}")
    return found


@pytest.fixture
def bed_root(tmp_path):
    root = os.path.realpath(tmp_path / "bed")
    yield root
    if os.path.exists(os.path.join(root, "testbed.json")):
        testbed.down(root, kill=True)       # a failed test must not leave drives behind for the next
    assert leftovers(root) == []


@needs_testbed
def test_up_run_show_down_leave_nothing_behind(bed_root):
    drives = plan_drives({"fast": 40, "slow": 20}, 0, {"slow": 300})
    state = testbed.up(bed_root, drives, SIZE)
    assert state.phase == "up" and [d.name for d in state.drives] == ["fast", "slow"]
    for d in state.drives:
        assert os.path.ismount(d.mount) and d.device.startswith("/dev/loop")
        backing = open(f"/sys/block/{os.path.basename(d.device)}/loop/backing_file").read().strip()
        dio = open(f"/sys/block/{os.path.basename(d.device)}/loop/dio").read().strip()
        assert backing == d.image and dio == "1"
    slow = state.drive("slow")
    if state.controller == "v1":
        with open(os.path.join(state.cgroup, "blkio.throttle.read_bps_device")) as f:
            assert sorted(f.read().split("\n")[:2]) == sorted([f"{d.majmin} {int(d.limits.read_mbs * 1e6)}"
                                                                for d in state.drives])
        with open(os.path.join(state.cgroup, "blkio.throttle.read_iops_device")) as f:
            assert f.read().split() == [slow.majmin, "300"]
    else:
        with open(os.path.join(state.cgroup, "io.max")) as f:
            assert f"{slow.majmin} rbps=20000000 wbps=max riops=300 wiops=max" in f.read()

    # `run` puts the command in the group: it sees the group in its own /proc/self/cgroup
    p = subprocess.run([*IOBENCH, "testbed", "run", "--root", bed_root, "--", "cat", "/proc/self/cgroup"],
                       capture_output=True, text=True, check=True)
    assert cgroup_name(bed_root) in p.stdout

    r = runner.invoke(app, ["testbed", "show", "--root", bed_root, "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["phase"] == "up"
    assert [(d["name"], d["mount"], d["read_mbs"], d["read_iops"]) for d in doc["drives"]] == [
        ("fast", f"{bed_root}/fast", 40.0, 0.0), ("slow", f"{bed_root}/slow", 20.0, 300.0)]

    r = runner.invoke(app, ["testbed", "down", "--root", bed_root])
    assert r.exit_code == 0, r.output
    assert leftovers(bed_root) == [] and not os.path.exists(bed_root)


@needs_testbed
def test_up_builds_only_in_an_empty_folder_and_never_in_a_group_it_did_not_make(bed_root):
    os.makedirs(bed_root)
    with open(os.path.join(bed_root, "precious"), "w") as f:
        f.write("keep me")
    drives = plan_drives({"a": 10})
    with pytest.raises(UsageError, match="not an empty folder"):
        testbed.up(bed_root, drives, SIZE)
    assert os.listdir(bed_root) == ["precious"]
    os.remove(os.path.join(bed_root, "precious"))

    ctl, _ = testbed.controller()
    theirs = os.path.join(ctl.mount, cgroup_name(bed_root))
    os.mkdir(theirs)
    try:
        with pytest.raises(UsageError, match="did not make it"):
            testbed.up(bed_root, drives, SIZE)
        assert os.path.isdir(theirs) and os.listdir(bed_root) == []
    finally:
        os.rmdir(theirs)


def _crash_after_first_drive(root: str) -> None:
    def report(msg):
        os._exit(9)                 # as a SIGKILL would: no teardown, the state stays half-built
    testbed.up(root, plan_drives({"a": 10, "b": 5}), SIZE, report=report)


@needs_testbed
def test_down_takes_apart_what_a_crash_left_half_built(bed_root):
    child = multiprocessing.get_context("fork").Process(target=_crash_after_first_drive, args=(bed_root,))
    child.start()
    child.join()
    assert child.exitcode == 9
    state = testbed.load_state(bed_root)
    assert state.phase == "building" and state.drives[0].mounted and not state.drives[1].device
    assert leftovers(bed_root) != []

    r = runner.invoke(app, ["testbed", "down", "--root", bed_root])
    assert r.exit_code == 0, r.output
    assert leftovers(bed_root) == [] and not os.path.exists(bed_root)


@needs_testbed
def test_down_leaves_running_commands_alone_unless_told_to_kill(bed_root):
    testbed.up(bed_root, plan_drives({"a": 10}), SIZE)
    sleeper = subprocess.Popen([*IOBENCH, "testbed", "run", "--root", bed_root, "--", "sleep", "600"])
    try:
        state = testbed.load_state(bed_root)
        # the child writes its own pid into the group before it execs `sleep`
        while sleeper.pid not in testbed.group_pids(state):
            assert sleeper.poll() is None
            os.sched_yield()
        r = runner.invoke(app, ["testbed", "down", "--root", bed_root])
        assert r.exit_code == 2 and f"pids {sleeper.pid}" in r.output and "--kill" in r.output
        assert os.path.ismount(state.drives[0].mount)
        r = runner.invoke(app, ["testbed", "down", "--root", bed_root, "--kill"])
        assert r.exit_code == 0, r.output
        assert sleeper.wait() == -9
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
