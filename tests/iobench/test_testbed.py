"""`iobench testbed`: the command surface everywhere; building, throttling, holding to a RAM
budget, crashing and taking down real drives where the machine allows it (root, loop devices, a
block I/O controller; a memory controller for the budget)."""

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
from iobench.testbed_spec import cgroup_name, parse_ram, plan_drives

runner = CliRunner()
PROBLEMS = testbed.check()
needs_testbed = pytest.mark.skipif(bool(PROBLEMS), reason=f"no testbed here: {', '.join(PROBLEMS)}")
MEMORY, MEMORY_WHY = testbed.memory_controller()
needs_memory = pytest.mark.skipif(MEMORY is None, reason=f"no RAM budget here: {MEMORY_WHY}")
SERVICE_PROBLEMS = testbed.check("service")
needs_service = pytest.mark.skipif(bool(SERVICE_PROBLEMS), reason=f"no paced drives here: {', '.join(SERVICE_PROBLEMS)}")
SIZE = 64 << 20
IOBENCH = [sys.executable, "-c", "from iobench.cli import main; main()"]


def test_check_says_yes_with_exit_0_or_why_not_with_exit_1():
    r = runner.invoke(app, ["testbed", "check"])
    if PROBLEMS:
        assert r.exit_code == 1 and r.output.startswith("unavailable: ") and PROBLEMS[0] in r.output
    else:
        assert r.exit_code == 0 and r.output.startswith("ok: root, loop devices, cgroup v")
    # and whether a RAM budget can be held, in the same line
    assert len(r.output.strip().splitlines()) == 1
    assert (f"; RAM budgets: {MEMORY_WHY}" if MEMORY else f"; RAM budgets unavailable: {MEMORY_WHY}") in r.output


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
                       (["--drive", "a:5", "--size", "1M"], "--size '1M'"), (["--drive", "a:5", "--ram", "2X"], "--ram '2X'"),
                       (["--drive", "a:5", "--ram", "ref"], "needs the model: give --ram-of"),
                       (["--drive", "a:5", "--ram", "25%", "--ram-of", str(tmp_path / "nothing")],
                        "no such file or folder, and not a size")):
        r = runner.invoke(app, ["testbed", "up", "--root", str(root), *args])
        assert r.exit_code == 2 and text in r.output, r.output
    assert not root.exists()


def test_run_wants_a_command(tmp_path):
    with pytest.raises(UsageError, match="wants a command"):
        testbed.run_in_group(str(tmp_path), [])


def test_a_shares_bytes_are_the_whole_models(tmp_path):
    """--ram-of: a model's every file (a folder's, a split set's), a plain file's size, or a size."""
    (tmp_path / "plain.bin").write_bytes(b"x" * 1000)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "weights.bin").write_bytes(b"y" * 5000)
    assert testbed.bytes_of([str(tmp_path / "plain.bin")]) == 1000
    assert testbed.ram_of([str(tmp_path / "plain.bin"), str(folder)]) == 1000 + 2 + 5000
    assert testbed.ram_of(["518G"]) == 518 << 30 and testbed.ram_of([]) == 0


# ---- on real drives ---------------------------------------------------------------------------

def leftovers(root: str) -> list[str]:
    """Anything of a testbed at `root` still on the machine."""
    found = [line for line in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()
             if root in line]
    with open("/proc/self/mountinfo") as f:
        found += [line for line in f if root in line]
    for ctl, _ in (testbed.controller(), testbed.memory_controller()):
        if ctl and os.path.exists(os.path.join(ctl.mount, cgroup_name(root))):
            found.append(f"group {ctl.mount}/{cgroup_name(root)}")
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


def daemons_of(root: str) -> list[int]:
    """The pids of drive daemons serving a folder of the testbed at `root`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                argv = f.read().split("\0")
        except OSError:
            continue
        if "iobench.servedrive" in argv and any(a.startswith(root + "/") for a in argv):
            pids.append(int(pid))
    return pids


@needs_service
def test_drives_paced_by_service_time_keep_the_bytes_and_leave_nothing_behind(bed_root):
    drives = plan_drives({"fast": 40, "slow": 20}, 50)
    state = testbed.up(bed_root, drives, SIZE, pacing="service")
    assert state.pacing == "service" and len(daemons_of(bed_root)) == 2
    for d in state.drives:
        backing = open(f"/sys/block/{os.path.basename(d.device)}/loop/backing_file").read().strip()
        dio = open(f"/sys/block/{os.path.basename(d.device)}/loop/dio").read().strip()
        assert backing == f"{d.served}/.{d.name}.img" and dio == "1" and os.path.ismount(d.served)
        assert json.load(open(d.control)) == {"read_mbs": d.limits.read_mbs, "write_mbs": 50}
    if state.controller == "v1":        # the throttle's lines stay empty: the daemons keep the ceilings
        with open(os.path.join(state.cgroup, "blkio.throttle.read_bps_device")) as f:
            assert f.read().strip() == ""
    # bytes written through a drive come back the same, read with O_DIRECT from inside the group
    path = os.path.join(state.drive("slow").mount, "f.bin")
    data = os.urandom(3 << 20)
    with open(path, "wb") as f:
        f.write(data)
    os.sync()
    read = ("import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT); b = mmap.mmap(-1, 3 << 20); "
            "os.preadv(fd, [b], 0); sys.stdout.buffer.write(b)")
    p = subprocess.run([*IOBENCH, "testbed", "run", "--root", bed_root, "--", sys.executable, "-c", read, path],
                       capture_output=True, check=True)
    assert p.stdout == data
    testbed.set_read_limit(bed_root, "slow", 7.5)     # a drive that slows: its daemon's rates change, nothing else
    assert json.load(open(state.drive("slow").control)) == {"read_mbs": 7.5, "write_mbs": 50}
    r = runner.invoke(app, ["testbed", "show", "--root", bed_root])
    assert r.exit_code == 0 and "paced by service" in r.stdout and "served by pid" in r.stdout

    r = runner.invoke(app, ["testbed", "down", "--root", bed_root])
    assert r.exit_code == 0, r.output
    assert leftovers(bed_root) == [] and daemons_of(bed_root) == [] and not os.path.exists(bed_root)


def test_paced_drives_take_no_iops_ceiling(tmp_path):
    drives = plan_drives({"fast": 40}, 0, {"fast": 300})
    with pytest.raises(UsageError, match="--pacing service keeps MB/s ceilings only"):
        testbed.up(str(tmp_path / "bed"), drives, SIZE, pacing="service")
    assert not os.path.exists(tmp_path / "bed")


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
        # `run` starts the command inside the groups and waits for it outside them
        while not testbed.group_pids(state):
            assert sleeper.poll() is None
            os.sched_yield()
        (pid,) = testbed.group_pids(state)
        assert pid != sleeper.pid and parent_of(pid) == sleeper.pid
        r = runner.invoke(app, ["testbed", "down", "--root", bed_root])
        assert r.exit_code == 2 and f"pids {pid}" in r.output and "--kill" in r.output
        assert os.path.ismount(state.drives[0].mount)
        r = runner.invoke(app, ["testbed", "down", "--root", bed_root, "--kill"])
        assert r.exit_code == 0, r.output
        assert sleeper.wait() == 128 + 9                # the command's SIGKILL, as a shell says it
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


@needs_testbed
def test_down_kill_also_kills_a_command_that_entered_the_group_after_it_was_emptied(bed_root, monkeypatch):
    """A signal that stops a benchmark as it starts a run: the run's child enters the group between
    fork and exec, after `down --kill` emptied it, and the group could not be removed (its drives
    were already down). It is killed as well, and the testbed comes down."""
    testbed.up(bed_root, plan_drives({"a": 10}), SIZE)
    state = testbed.load_state(bed_root)
    kill_group, late = testbed.kill_group, []

    def emptied_then_joined(st, *args, **kw):
        kill_group(st, *args, **kw)
        if not late:
            late.append(subprocess.Popen([*IOBENCH, "testbed", "run", "--root", bed_root, "--", "sleep", "600"]))
            while not testbed.group_pids(state):
                assert late[0].poll() is None
                os.sched_yield()

    monkeypatch.setattr(testbed, "kill_group", emptied_then_joined)
    try:
        said = testbed.down(bed_root, kill=True)
        assert late[0].wait() == 128 + 9 and said[-1] == f"testbed at {bed_root} removed"
        # the first pass's lines are kept: it unmounted and detached the drive before the group refused
        assert any(x.startswith("unmounted ") for x in said) and any(x.startswith("detached ") for x in said)
    finally:
        if late and late[0].poll() is None:
            late[0].kill()
            late[0].wait()


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


# ---- the RAM budget, on real drives ------------------------------------------------------------

# A whole-file buffered read, twice, in a process of its own (nothing imported: its own memory stays
# small against the budget): the bytes each read made the block layer fetch (/proc/self/io).
READ_TWICE = """import json, sys
def fetched():
    with open("/proc/self/io") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("read_bytes:"))
out = []
for _ in range(2):
    before = fetched()
    with open(sys.argv[1], "rb", buffering=0) as f:
        while f.read(4 << 20):
            pass
    out.append(fetched() - before)
print(json.dumps(out))
"""


@needs_testbed
@needs_memory
def test_a_ram_budget_sends_a_second_read_back_to_the_drive(bed_root):
    """The page cache counts against the budget: a file larger than it is read from the drive the
    second time too; without the budget the second read comes from the cache."""
    size = 192 << 20
    state = testbed.up(bed_root, plan_drives({"a": 1000}), 512 << 20, ram=parse_ram("48M"))
    assert state.ram.limit == 48 << 20 and state.ram.cgroup
    assert testbed.load_state(bed_root).ram.spec == "48M"
    path = os.path.join(state.drives[0].mount, "big.bin")
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)   # written from outside: not cached for the group
    def twice():
        p = subprocess.run([*IOBENCH, "testbed", "run", "--root", bed_root, "--", sys.executable, "-c", READ_TWICE, path],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.strip().splitlines()[-1])

    first, second = twice()
    assert first >= size * 0.9 and second >= size * 0.9, (first, second)      # from the drive both times
    status = testbed.ram_status(testbed.load_state(bed_root))
    assert status["limit"] == 48 << 20 and status["cache"] <= 48 << 20 and status["oom_kills"] in (0, None)
    mem = testbed.memory_counters(testbed.load_state(bed_root))      # 192 MiB read twice through 48: the page
    assert mem["at_limit"] > 0 and 0 < mem["peak"] <= 48 << 20, mem   # cache reached the budget, again and again

    testbed.set_ram(bed_root, None)
    assert testbed.load_state(bed_root).ram.limit == 0 and testbed.ram_status(testbed.load_state(bed_root))["limit"] == 0
    first, second = twice()
    assert second <= size * 0.1, (first, second)                               # from the page cache

    # the budget and what a command in the group sees, on screen
    r = runner.invoke(app, ["testbed", "run", "--root", bed_root, "--ram", "25%", "--ram-of", path, "--",
                            sys.executable, "-c", "from core.ram import ram_limit; print(ram_limit().describe())"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["testbed", "show", "--root", bed_root])
    assert "RAM budget 48.0 MiB = 25% of the model's 192.0 MiB" in r.output
    assert "a command run in it sees: cgroup v" in r.output and "limit 48.0 MiB" in r.output
    p = subprocess.run([*IOBENCH, "testbed", "run", "--root", bed_root, "--", sys.executable, "-c",
                        "from core.ram import ram_limit; print(ram_limit().describe())"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith(f"cgroup {state.ram.controller} limit 48.0 MiB ("), p.stdout + p.stderr
    assert cgroup_name(bed_root) in p.stdout


@needs_testbed
@needs_memory
def test_an_oom_kill_under_a_too_small_budget_is_said_in_one_line(bed_root):
    testbed.up(bed_root, plan_drives({"a": 1000}), SIZE, ram=parse_ram("32M"))
    p = subprocess.run([*IOBENCH, "testbed", "run", "--root", bed_root, "--", sys.executable, "-c",
                        "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"], capture_output=True, text=True)
    assert p.returncode == 128 + 9
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("testbed: OOM: `python") and "killed by the kernel's OOM killer" in lines[-1], p.stderr
    assert "RAM budget 32.0 MiB" in lines[-1] and "--ram" in lines[-1]
    assert testbed.ram_status(testbed.load_state(bed_root))["oom_kills"] >= 1
