"""The testbed's pure parts: limits, sizes, which controller, the cgroup lines, the state document."""

import json

import pytest

from core.errors import RigError, UsageError
from iobench import testbed_spec as spec
from iobench.testbed_spec import (
    REF_RAM,
    Controller,
    DriveLimits,
    RamSpec,
    RamState,
    backing_path,
    cgroup_mounts,
    cgroup_name,
    choose_controller,
    choose_memory,
    memory_line,
    memory_use,
    mounted_devices,
    new_state,
    parse_pairs,
    parse_ram,
    parse_size,
    plan_drives,
    ram_bytes,
    ram_text,
    state_from_doc,
    state_text,
    state_to_doc,
    v1_lines,
    v1_mount,
    v2_line,
)
from tests.helpers import impure_imports

V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
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


def test_the_memory_controller_is_v2s_where_it_offers_one_else_v1s_else_one_line_why():
    assert v1_mount(V1_MOUNTS, "memory") == "/sys/fs/cgroup/memory" and v1_mount(V2_MOUNTS, "memory") is None
    assert v1_mount("cgroup /sys/fs/cgroup/my\\040mem cgroup rw,memory 0 0\n", "memory") == "/sys/fs/cgroup/my mem"
    assert choose_memory("/sys/fs/cgroup", "cpuset cpu io memory pids", None) == (
        Controller("v2", "/sys/fs/cgroup"), "cgroup v2 memory controller at /sys/fs/cgroup")
    # this machine: the unified hierarchy has no memory controller, v1 has it
    ctl, why = choose_memory("/sys/fs/cgroup/unified", "hugetlb", "/sys/fs/cgroup/memory")
    assert ctl == Controller("v1", "/sys/fs/cgroup/memory") and why == "cgroup v1 memory controller at /sys/fs/cgroup/memory"
    assert choose_memory("/sys/fs/cgroup/unified", "hugetlb memoryx", None) == (
        None, "no memory controller (the unified hierarchy at /sys/fs/cgroup/unified has no memory controller; "
              "no cgroup-v1 memory mount)")
    assert choose_memory(None, "", None) == (None, "no memory controller (no cgroup2 mount; no cgroup-v1 memory mount)")


def test_a_ram_budget_is_a_size_or_a_share_of_the_model_with_an_allowance():
    assert parse_ram("2G") == RamSpec("2G", size=2 << 30)
    assert parse_ram("100M").size == 100 << 20 and parse_ram("1.5G").size == 3 << 29 and parse_ram("64MiB").size == 64 << 20
    assert parse_ram("104857600").size == 104857600
    assert parse_ram("25%") == RamSpec("25%", share=0.25, share_text="25%")
    assert parse_ram("128/518") == RamSpec("128/518", share=128 / 518, share_text="128/518")
    ref = parse_ram("ref")
    assert (ref.share, ref.share_text, ref.own) == (REF_RAM[0] / REF_RAM[1], "128/518", 0) and ref.needs_model
    assert parse_ram(" Ref+768M ") == RamSpec("Ref+768M", share=128 / 518, share_text="128/518", own=768 << 20)
    assert parse_ram("none") is None and parse_ram("OFF") is None
    for bad in ("", "0", "-1G", "2X", "0%", "x%", "1/0", "a/b", "ref+", "ref+x", "2G+1G", "+1G", "inf%", "nan%"):
        with pytest.raises(UsageError, match="--ram"):
            parse_ram(bad)


def test_a_share_needs_the_models_bytes_and_says_how_much_goes_where():
    assert ram_bytes(parse_ram("2G")) == 2 << 30
    assert ram_bytes(parse_ram("25%"), 1000) == 250
    assert ram_bytes(parse_ram("ref+768M"), 518 * 10**6) == 128 * 10**6 + (768 << 20)
    with pytest.raises(UsageError, match="needs the model: give --ram-of"):
        ram_bytes(parse_ram("ref"))
    model = 226779136                                      # the demo's model
    limit = ram_bytes(parse_ram("ref+768M"), model)
    assert ram_text(limit, "ref+768M", model) == ("RAM budget 821.4 MiB = 128/518 of the model's 216.3 MiB (53.4 MiB) "
                                                  "+ 768.0 MiB for the processes' own memory")
    assert ram_text(ram_bytes(parse_ram("ref"), model), "ref", model) == "RAM budget 53.4 MiB = 128/518 of the model's 216.3 MiB"
    assert ram_text(2 << 30, "2G", 0) == "RAM budget 2.0 GiB"
    assert ram_text(0, "", 0) == "no RAM budget"
    assert RamState(note="no memory controller (no cgroup2 mount; no cgroup-v1 memory mount)").text() == (
        "no RAM budget (no memory controller (no cgroup2 mount; no cgroup-v1 memory mount))")


def test_the_memory_groups_lines_and_what_it_holds():
    assert memory_line("v1", 100 << 20) == ("memory.limit_in_bytes", "104857600")
    assert memory_line("v1", 0) == ("memory.limit_in_bytes", "-1")
    assert memory_line("v2", 100 << 20) == ("memory.max", "104857600") and memory_line("v2", 0) == ("memory.max", "max")
    v1 = "cache 40960\nrss 8192\nhierarchical_memory_limit 104857600\ntotal_cache 81920\ntotal_rss 16384\n"
    assert memory_use("v1", v1) == (81920, 16384)
    assert memory_use("v1", "cache 40960\nrss 8192\n") == (40960, 8192)
    assert memory_use("v2", "anon 4096\nfile 12288\nkernel 100\n") == (12288, 4096)
    assert memory_use("v2", "") == (0, 0)


def test_v1_writes_one_line_per_limit_given_in_bytes_and_ops():
    assert v1_lines("7:3", DriveLimits("a", 30)) == [("blkio.throttle.read_bps_device", "7:3 30000000")]
    assert v1_lines("7:4", DriveLimits("b", 16.5, 10, 200, 50)) == [
        ("blkio.throttle.read_bps_device", "7:4 16500000"), ("blkio.throttle.write_bps_device", "7:4 10000000"),
        ("blkio.throttle.read_iops_device", "7:4 200"), ("blkio.throttle.write_iops_device", "7:4 50")]


def test_v1_lifting_a_limit_writes_zero_which_removes_the_rule():
    # a drive throttled and then unthrottled while the testbed is up: v1 keeps a rule until 0 is written
    assert v1_lines("7:0", DriveLimits("a", 0), clear=True) == [
        ("blkio.throttle.read_bps_device", "7:0 0"), ("blkio.throttle.write_bps_device", "7:0 0"),
        ("blkio.throttle.read_iops_device", "7:0 0"), ("blkio.throttle.write_iops_device", "7:0 0")]
    assert v1_lines("7:0", DriveLimits("a", 0)) == []
    assert v1_lines("7:0", DriveLimits("a", 5, 10), clear=True)[:2] == [
        ("blkio.throttle.read_bps_device", "7:0 5000000"), ("blkio.throttle.write_bps_device", "7:0 10000000")]


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


MEMORY = Controller("v1", "/sys/fs/cgroup/memory")


def made_state(root="/var/tmp/tb", memory=MEMORY, pacing="throttle"):
    drives = plan_drives({"internal": 30, "green": 16.5}, 0, {"green": 100})
    return new_state(root, Controller("v1", "/sys/fs/cgroup/blkio/"), drives, 1 << 30, True, "2026-11-30T15:00:00+00:00",
                     memory, "cgroup v1 memory controller at /sys/fs/cgroup/memory" if memory else "no memory controller",
                     pacing)


def test_a_new_state_places_everything_inside_the_folder():
    st = made_state()
    assert st.cgroup == "/sys/fs/cgroup/blkio/" + cgroup_name("/var/tmp/tb")
    assert st.ram == RamState("v1", "/sys/fs/cgroup/memory/" + cgroup_name("/var/tmp/tb"),
                              note="cgroup v1 memory controller at /sys/fs/cgroup/memory")
    assert made_state(memory=None).ram == RamState(note="no memory controller")
    # on the unified hierarchy the drives' group is the memory group
    v2 = new_state("/var/tmp/tb", Controller("v2", "/sys/fs/cgroup"), plan_drives({"a": 1}), 1 << 30, True, "",
                   Controller("v2", "/sys/fs/cgroup"), "")
    assert v2.cgroup == v2.ram.cgroup == "/sys/fs/cgroup/" + cgroup_name("/var/tmp/tb")
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
                         "enabled_io", "phase", "created", "ram", "pacing"]
    assert doc["kind"] == "replica-tuner-testbed" and doc["schema"] == 3 and doc["pacing"] == "throttle"
    assert doc["ram"] == {"controller": "v1", "cgroup": "/sys/fs/cgroup/memory/" + cgroup_name("/var/tmp/tb"),
                          "enabled_memory": False, "limit": 0, "spec": "", "model_bytes": 0,
                          "note": "cgroup v1 memory controller at /sys/fs/cgroup/memory"}
    assert doc["drives"][0] == {"name": "internal", "image": "/var/tmp/tb/.internal.img", "mount": "/var/tmp/tb/internal",
                                "device": "/dev/loop3", "majmin": "7:3", "mounted": True, "served": "", "control": "",
                                "daemon": 0, "read_mbs": 30.0, "write_mbs": 0.0, "read_iops": 0.0, "write_iops": 0.0}
    back = state_from_doc(doc, "testbed.json")
    assert back == st


def test_drives_paced_by_service_time_are_served_from_hidden_paths_inside_the_folder():
    st = made_state(pacing="service")
    d = st.drive("green")
    assert (d.served, d.control) == ("/var/tmp/tb/.green.served", "/var/tmp/tb/.green.pace.json")
    assert d.backing == "/var/tmp/tb/.green.served/.green.img"          # the loop device's file: the paced view
    assert made_state().drive("green").backing == "/var/tmp/tb/.green.img"
    d.daemon = 4242
    back = state_from_doc(json.loads(state_text(st)), "testbed.json")
    assert back == st and back.pacing == "service" and back.drive("green").daemon == 4242
    with pytest.raises(UsageError, match="--pacing 'fast': not one of throttle, service"):
        made_state(pacing="fast")


def test_a_state_whose_drives_do_not_match_its_pacing_or_serve_from_outside_is_refused():
    doc = state_to_doc(made_state(pacing="service"))
    mixed = json.loads(json.dumps(doc))
    mixed["pacing"] = "throttle"
    with pytest.raises(RigError, match="do not match"):
        state_from_doc(mixed, "testbed.json")
    outside = json.loads(json.dumps(doc))
    outside["drives"][0]["served"] = "/mnt"
    with pytest.raises(RigError, match=r"outside its folder \(/mnt\)"):
        state_from_doc(outside, "testbed.json")


def test_a_schema_2_state_from_before_pacing_is_read_as_throttled():
    doc = state_to_doc(made_state())
    doc["schema"] = 2
    del doc["pacing"]
    for d in doc["drives"]:
        del d["served"], d["control"], d["daemon"]
    back = state_from_doc(doc, "testbed.json")
    assert back.pacing == "throttle" and back == made_state()


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


def test_a_schema_1_state_from_before_ram_budgets_is_still_read():
    doc = state_to_doc(made_state())
    del doc["ram"]
    doc["schema"] = 1
    back = state_from_doc(doc, "testbed.json")
    assert back.ram == RamState(note="built before RAM budgets") and back.ram.text() == "no RAM budget (built before RAM budgets)"
    assert [d.name for d in back.drives] == ["internal", "green"]


def test_a_state_whose_memory_group_is_not_a_testbeds_is_refused():
    doc = state_to_doc(made_state())
    for bad in ({"cgroup": "/sys/fs/cgroup/memory/user.slice"}, {"controller": "v3"}, {"controller": ""},
                {"limit": "lots"}):
        broken = json.loads(json.dumps(doc))
        broken["ram"].update(bad)
        with pytest.raises(RigError, match="not a testbed's|bad field"):
            state_from_doc(broken, "testbed.json")
    missing = json.loads(json.dumps(doc))
    del missing["ram"]
    with pytest.raises(RigError, match="bad field"):
        state_from_doc(missing, "testbed.json")
