"""The testbed's pure parts: limits, sizes, which controller, the cgroup lines, the state document."""

import json

import pytest

from core.errors import RigError, UsageError
from iobench import testbed_spec as spec
from iobench.testbed_spec import (
    Controller,
    DriveLimits,
    backing_path,
    cgroup_mounts,
    cgroup_name,
    choose_controller,
    mounted_devices,
    new_state,
    parse_pairs,
    parse_size,
    plan_drives,
    state_from_doc,
    state_text,
    state_to_doc,
    v1_lines,
    v2_line,
)
from tests.helpers import impure_imports

V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/blkio cgroup rw,relatime,blkio 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"


def test_the_spec_is_pure():
    assert impure_imports(spec) == []


def test_pairs_keep_order_and_refuse_what_is_not_name_number():
    assert parse_pairs("a:200, b:120", "--drive") == {"a": 200.0, "b": 120.0}
    assert parse_pairs(["x:1.5", "y:0"], "--iops", zero_ok=True) == {"x": 1.5, "y": 0.0}
    for bad in ("a", "a:", ":3", "a:x", "a:0", "a:-1", "a:1,a:2", "a:inf", "a:nan"):
        with pytest.raises(UsageError, match="NAME:NUMBER"):
            parse_pairs(bad, "--drive")
    with pytest.raises(UsageError, match="0 or more"):
        parse_pairs("a:-1", "--iops", zero_ok=True)


def test_drives_take_write_and_iops_limits_by_name():
    drives = plan_drives({"internal": 30, "green": 16.5}, 10, {"green": 500}, {"internal": 40})
    assert drives == (DriveLimits("internal", 30, 10, 0, 40), DriveLimits("green", 16.5, 10, 500, 0))
    assert plan_drives({"a": 1}, {"a": 7})[0].write_mbs == 7


def test_drives_refuse_unknown_names_and_names_that_are_not_folders():
    with pytest.raises(UsageError, match="--iops names b, not a drive"):
        plan_drives({"a": 1}, 0, {"b": 3})
    with pytest.raises(UsageError, match="--write-mbs names c"):
        plan_drives({"a": 1}, {"c": 3})
    for name in ("../x", ".hidden", "a b", "a/b", "x" * 33):
        with pytest.raises(UsageError, match="drive name"):
            plan_drives({name: 1})
    with pytest.raises(UsageError, match="at least one drive"):
        plan_drives({})


def test_sizes_are_binary_units_with_a_floor():
    assert parse_size("3G") == 3 << 30
    assert parse_size("512m") == 512 << 20
    assert parse_size("64MiB") == 64 << 20
    assert parse_size(str(1 << 30)) == 1 << 30
    for bad in ("", "3X", "-1G", "1.5G", "1M"):
        with pytest.raises(UsageError, match="--size"):
            parse_size(bad)


def test_the_mounts_name_both_hierarchies():
    assert cgroup_mounts(V1_MOUNTS) == ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/blkio")
    assert cgroup_mounts(V2_MOUNTS) == ("/sys/fs/cgroup", None)
    assert cgroup_mounts("") == (None, None)


def test_v2_wins_when_its_io_controller_is_there_else_v1_else_the_reason():
    ctl, why = choose_controller("/sys/fs/cgroup", "cpuset cpu io memory pids", None, False)
    assert ctl == Controller("v2", "/sys/fs/cgroup") and "v2" in why
    # this machine: a unified hierarchy without io (it is bound to v1 blkio)
    ctl, why = choose_controller("/sys/fs/cgroup/unified", "hugetlb", "/sys/fs/cgroup/blkio", True)
    assert ctl == Controller("v1", "/sys/fs/cgroup/blkio") and "blkio throttle" in why
    ctl, why = choose_controller("/sys/fs/cgroup/unified", "hugetlb", "/sys/fs/cgroup/blkio", False)
    assert ctl is None
    assert why == ("the unified hierarchy at /sys/fs/cgroup/unified has no io controller; the blkio hierarchy at "
                   "/sys/fs/cgroup/blkio has no throttle files (kernel without CONFIG_BLK_DEV_THROTTLING)")
    assert choose_controller(None, "", None, False) == (None, "no cgroup2 mount; no cgroup-v1 blkio mount")
    # "io" must be a word of the list, not part of one
    assert choose_controller("/c", "bio ionice", None, False)[0] is None


def test_v1_writes_one_line_per_limit_given_in_bytes_and_ops():
    assert v1_lines("7:3", DriveLimits("a", 30)) == [("blkio.throttle.read_bps_device", "7:3 30000000")]
    assert v1_lines("7:4", DriveLimits("b", 16.5, 10, 200, 50)) == [
        ("blkio.throttle.read_bps_device", "7:4 16500000"), ("blkio.throttle.write_bps_device", "7:4 10000000"),
        ("blkio.throttle.read_iops_device", "7:4 200"), ("blkio.throttle.write_iops_device", "7:4 50")]


def test_v2_writes_one_io_max_line_with_max_for_no_limit():
    assert v2_line("7:3", DriveLimits("a", 30)) == "7:3 rbps=30000000 wbps=max riops=max wiops=max"
    assert v2_line("259:1", DriveLimits("b", 0.5, 2, 300, 0)) == "259:1 rbps=500000 wbps=2000000 riops=300 wiops=max"


def test_group_names_are_ours_and_differ_per_folder():
    a, b = cgroup_name("/var/tmp/a"), cgroup_name("/var/tmp/b")
    assert a.startswith("replica-tuner-testbed-") and b.startswith("replica-tuner-testbed-") and a != b
    assert cgroup_name("/var/tmp/a") == a


def test_mountinfo_and_sysfs_are_read_as_the_kernel_writes_them():
    info = ("22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "97 22 7:3 / /var/tmp/my\\040bed/a rw,relatime shared:50 - ext4 /dev/loop3 rw\n"
            "98 22 7:4 / /var/tmp/x rw - ext4 /dev/loop4 rw\n"
            "99 98 7:5 / /var/tmp/x rw - ext4 /dev/loop5 rw\n")
    assert mounted_devices(info) == {"/": "252:0", "/var/tmp/my bed/a": "7:3", "/var/tmp/x": "7:5"}
    assert backing_path("/var/tmp/t/.a.img\n") == "/var/tmp/t/.a.img"
    assert backing_path("/var/tmp/t/.a.img (deleted)\n") == "/var/tmp/t/.a.img"


def made_state(root="/var/tmp/tb"):
    drives = plan_drives({"internal": 30, "green": 16.5}, 0, {"green": 100})
    return new_state(root, Controller("v1", "/sys/fs/cgroup/blkio/"), drives, 1 << 30, True, "2026-11-30T15:00:00+00:00")


def test_a_new_state_places_everything_inside_the_folder():
    st = made_state()
    assert st.cgroup == "/sys/fs/cgroup/blkio/" + cgroup_name("/var/tmp/tb")
    assert [(d.image, d.mount) for d in st.drives] == [("/var/tmp/tb/.internal.img", "/var/tmp/tb/internal"),
                                                       ("/var/tmp/tb/.green.img", "/var/tmp/tb/green")]
    assert st.phase == "building" and all(not d.device and not d.mounted for d in st.drives)
    assert st.drive("green").limits.read_iops == 100
    with pytest.raises(UsageError, match="no drive 'white'.*internal, green"):
        st.drive("white")


def test_the_state_document_round_trips_and_pins_its_keys():
    st = made_state()
    st.drives[0].device, st.drives[0].majmin, st.drives[0].mounted = "/dev/loop3", "7:3", True
    doc = json.loads(state_text(st))
    assert doc == state_to_doc(st)
    assert list(doc) == ["kind", "schema", "root", "controller", "cgroup", "size", "drives", "made_root",
                         "enabled_io", "phase", "created"]
    assert doc["kind"] == "replica-tuner-testbed" and doc["schema"] == 1
    assert doc["drives"][0] == {"name": "internal", "image": "/var/tmp/tb/.internal.img", "mount": "/var/tmp/tb/internal",
                                "device": "/dev/loop3", "majmin": "7:3", "mounted": True, "read_mbs": 30.0,
                                "write_mbs": 0.0, "read_iops": 0.0, "write_iops": 0.0}
    back = state_from_doc(doc, "testbed.json")
    assert back == st


def test_a_state_that_reaches_outside_its_folder_or_group_is_refused():
    doc = state_to_doc(made_state())
    outside = json.loads(json.dumps(doc))
    outside["drives"][1]["image"] = "/etc/passwd"
    with pytest.raises(RigError, match=r"testbed.json: .*outside its folder \(/etc/passwd\)"):
        state_from_doc(outside, "testbed.json")
    group = json.loads(json.dumps(doc))
    group["cgroup"] = "/sys/fs/cgroup/blkio/system.slice"
    with pytest.raises(RigError, match="not a testbed's"):
        state_from_doc(group, "testbed.json")
    missing = json.loads(json.dumps(doc))
    del missing["drives"][0]["device"]
    with pytest.raises(RigError, match="bad field"):
        state_from_doc(missing, "testbed.json")
