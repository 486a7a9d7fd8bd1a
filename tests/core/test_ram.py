"""The RAM a process may fill with the page cache: the tightest of its memory cgroup's limits and
MemTotal, read from fake /proc and cgroup trees laid out as Linux lays them out."""

import pytest

from core import ramlimit
from core.ram import ram_limit
from core.ramlimit import (
    V1_UNLIMITED,
    Hierarchy,
    RamLimit,
    cgroup_hierarchies,
    group_folder,
    groups_up,
    mem_total,
    parse_v1_limit,
    parse_v2_limit,
    proc_cgroups,
    stat_value,
    tightest,
)
from tests.core.proc_tree import MEMTOTAL_KB, ProcTree
from tests.helpers import impure_imports

TOTAL = MEMTOTAL_KB * 1024
UNLIMITED = "9223372036854771712"           # what v1 writes for no limit (PAGE_COUNTER_MAX pages)
# this machine's /proc/self/cgroup: every v1 controller at the root but memory, the unified hierarchy empty
MACHINE = """9:name=systemd:/
8:pids:/
7:blkio:/
4:memory:/process_api/6abc
2:cpuacct:/
1:cpu:/
0::/
"""


def test_the_rules_are_pure():
    assert impure_imports(ramlimit) == []


def test_proc_cgroup_names_each_controller_and_the_unified_group():
    groups = proc_cgroups(MACHINE + "3:cpu,cpuacct:/x\n")
    assert groups["memory"] == "/process_api/6abc" and groups[""] == "/" and groups["name=systemd"] == "/"
    assert groups["cpu"] == "/" and groups["cpuacct"] == "/"      # the first line of a controller wins, as read
    assert proc_cgroups("0::/user.slice/user-1000.slice/session-2.scope\n") == {
        "": "/user.slice/user-1000.slice/session-2.scope"}
    assert proc_cgroups("") == {} and proc_cgroups("garbage\n") == {}


def test_mountinfo_gives_each_hierarchy_its_point_root_and_controllers():
    info = ("22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n"
            "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
            "32 25 0:28 /docker/ab /sys/fs/cgroup/my\\040groups rw - cgroup2 cgroup2 rw,nsdelegate\n"
            "33 25 0:29 / /mnt rw master:3 propagate_from:2 - cgroup cgroup ro,blkio\n")
    assert cgroup_hierarchies(info) == [
        Hierarchy("/sys/fs/cgroup/memory", "/", "v1", ("memory",)),
        Hierarchy("/sys/fs/cgroup/cpu,cpuacct", "/", "v1", ("cpu", "cpuacct")),
        Hierarchy("/sys/fs/cgroup/my groups", "/docker/ab", "v2"),
        Hierarchy("/mnt", "/", "v1", ("blkio",))]


def test_a_group_is_a_folder_under_the_mount_and_a_container_sees_its_own_group_as_the_root():
    h = Hierarchy("/sys/fs/cgroup/memory", "/", "v1", ("memory",))
    assert group_folder(h, "/a/b") == "/sys/fs/cgroup/memory/a/b" and group_folder(h, "/") == "/sys/fs/cgroup/memory"
    c = Hierarchy("/sys/fs/cgroup", "/docker/ab", "v2")
    assert group_folder(c, "/docker/ab") == "/sys/fs/cgroup"
    assert group_folder(c, "/docker/ab/x") == "/sys/fs/cgroup/x"
    assert group_folder(c, "/docker/abc") is None and group_folder(c, "/other") is None
    assert groups_up(c, "/docker/ab/x/y") == [("/docker/ab/x/y", "/sys/fs/cgroup/x/y"), ("/docker/ab/x", "/sys/fs/cgroup/x"),
                                              ("/docker/ab", "/sys/fs/cgroup")]
    assert groups_up(h, "/a") == [("/a", "/sys/fs/cgroup/memory/a"), ("/", "/sys/fs/cgroup/memory")]


def test_limits_read_as_the_kernel_writes_them():
    assert parse_v1_limit("104857600\n") == 104857600
    assert parse_v1_limit(UNLIMITED + "\n") is None and parse_v1_limit(str(V1_UNLIMITED)) is None
    assert parse_v1_limit("") is None and parse_v1_limit("-1") is None
    assert parse_v2_limit("max\n") is None and parse_v2_limit("2147483648\n") == 2 << 30
    assert mem_total("MemTotal:       24683792 kB\nMemFree: 1 kB\n") == TOTAL
    assert mem_total("MemFree: 1 kB\n") == 0
    assert stat_value("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill") == 3
    assert stat_value("cache 5\n", "oom_kill") is None


def test_the_tightest_wins_and_the_machine_wins_a_tie():
    a = RamLimit(2 << 30, "cgroup v1", "memory.limit_in_bytes", "/a")
    assert tightest([a], TOTAL) == RamLimit(2 << 30, "cgroup v1", "memory.limit_in_bytes", "/a", TOTAL)
    assert tightest([RamLimit(TOTAL, "cgroup v2", "memory.max", "/b")], TOTAL).source == "MemTotal"
    assert tightest([], 0).describe() == "RAM unknown (no MemTotal, no cgroup limit)"


# ---- on fake trees -----------------------------------------------------------------------------

def v1_machine(tmp_path, own_limit=UNLIMITED, parent_limit=UNLIMITED, stat=True):
    t = ProcTree(tmp_path)
    mem = t.mount_v1("memory")
    t.mount_v1("blkio")
    t.mount_v2()
    t.group(mem, "/", {"memory.limit_in_bytes": UNLIMITED})
    t.group(mem, "/process_api", {"memory.limit_in_bytes": parent_limit})
    own = {"memory.limit_in_bytes": own_limit}
    if stat:
        effective = min(int(own_limit), int(parent_limit))
        own["memory.stat"] = f"cache 4096\nrss 8192\nhierarchical_memory_limit {effective}\n"
    t.group(mem, "/process_api/6abc", own)
    t.process(MACHINE)
    return t


def test_v1_unlimited_is_memtotal(tmp_path):
    t = v1_machine(tmp_path)
    got = ram_limit(proc=str(t.proc))
    assert got == RamLimit(TOTAL, "MemTotal", mem_total=TOTAL)
    assert got.describe() == "MemTotal 23.5 GiB"


def test_v1_the_own_groups_limit(tmp_path):
    t = v1_machine(tmp_path, own_limit=str(100 << 20))
    got = ram_limit(proc=str(t.proc))
    assert got == RamLimit(100 << 20, "cgroup v1", "memory.limit_in_bytes", "/process_api/6abc", TOTAL)
    assert got.describe() == "cgroup v1 limit 100.0 MiB (memory.limit_in_bytes of /process_api/6abc)"


@pytest.mark.parametrize("stat", [True, False])
def test_v1_a_tighter_limit_above_the_group_binds_and_is_named(tmp_path, stat):
    t = v1_machine(tmp_path, own_limit=str(3 << 30), parent_limit=str(2 << 30), stat=stat)
    got = ram_limit(proc=str(t.proc))
    assert (got.bytes, got.group) == (2 << 30, "/process_api")


def test_v1_an_ancestor_limit_without_use_hierarchy_does_not_bind(tmp_path):
    t = v1_machine(tmp_path, own_limit=str(3 << 30), parent_limit=str(2 << 30))
    (tmp_path / "sys/fs/cgroup/memory/process_api/6abc/memory.stat").write_text(f"hierarchical_memory_limit {3 << 30}\n")
    assert ram_limit(proc=str(t.proc)).bytes == 3 << 30        # the kernel's own answer


def test_a_limit_above_the_ram_is_the_ram(tmp_path):
    t = v1_machine(tmp_path, own_limit=str(64 << 30))
    assert ram_limit(proc=str(t.proc)).source == "MemTotal"


def v2_machine(tmp_path, files_by_group, group="/user.slice/session.scope", root="/"):
    t = ProcTree(tmp_path)
    point = t.mount_v2(root=root, name="")
    for rel, files in files_by_group.items():
        t.group(point, rel, files)
    t.process(f"0::{group}\n")
    return t


def test_v2_memory_max_and_high_up_the_hierarchy(tmp_path):
    t = v2_machine(tmp_path, {"/": {}, "/user.slice": {"memory.max": str(8 << 30), "memory.high": "max"},
                              "/user.slice/session.scope": {"memory.max": "max", "memory.high": str(6 << 30)}})
    got = ram_limit(proc=str(t.proc))
    assert got == RamLimit(6 << 30, "cgroup v2", "memory.high", "/user.slice/session.scope", TOTAL)
    (tmp_path / "sys/fs/cgroup/user.slice/memory.max").write_text(str(1 << 30) + "\n")
    got = ram_limit(proc=str(t.proc))
    assert got.describe() == "cgroup v2 limit 1.0 GiB (memory.max of /user.slice)"


def test_v2_without_the_memory_controller_is_memtotal(tmp_path):
    t = v2_machine(tmp_path, {"/": {}, "/user.slice": {}, "/user.slice/session.scope": {"cgroup.procs": "1"}})
    assert ram_limit(proc=str(t.proc)).source == "MemTotal"


def test_a_container_reads_its_own_groups_files_at_the_mount_point(tmp_path):
    t = v2_machine(tmp_path, {"/": {"memory.max": str(512 << 20)}}, group="/docker/ab", root="/docker/ab")
    got = ram_limit(proc=str(t.proc))
    assert (got.bytes, got.group) == (512 << 20, "/docker/ab")


def test_another_pid_and_another_group_are_asked_about_alike(tmp_path):
    t = v1_machine(tmp_path)
    t.group(tmp_path / "sys/fs/cgroup/memory", "/bed", {"memory.limit_in_bytes": str(57 << 20)})
    t.process("4:memory:/bed\n0::/\n", pid="4242")
    assert ram_limit(4242, proc=str(t.proc)).bytes == 57 << 20
    assert ram_limit(proc=str(t.proc), groups={"memory": "/bed"}).describe() == (
        "cgroup v1 limit 57.0 MiB (memory.limit_in_bytes of /bed)")


def test_no_proc_at_all_says_so(tmp_path):
    got = ram_limit(proc=str(tmp_path / "nothing"))
    assert got == RamLimit(0, "MemTotal") and got.describe().startswith("RAM unknown")
