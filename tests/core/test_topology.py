"""Which drives share what, from sysfs trees recorded in tmp_path, and from this machine's own."""

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from core import topology as T
from core.drives import drive_of, drives_topology, identity_key
from core.sysfs import device_dir, device_links, disk_identity, fs_uuid, superblock_uuid, sysfs_topology, vpd_serial
from core.topology import DriveTopology, Link, group_drives, path_links, topology_from_dict, topology_lines, topology_to_dict

from .sysfs_tree import NVME_CTRL0, NVME_CTRL1, SATA, USB, SysTree


def kinds(links):
    return [(x.kind, x.name) for x in links]


@pytest.fixture
def tree(tmp_path):
    return SysTree(tmp_path / "sys")


def topo(tree, named, dev_of=lambda p: None):
    return sysfs_topology(named, str(tree.root), dev_of)


# ---- the chain of one device ------------------------------------------------------------------------

def test_path_links_of_an_nvme_partition_nearest_first():
    parts = NVME_CTRL0.split("/") + ["nvme0n1", "nvme0n1p2"]
    assert kinds(path_links(parts, partition=True)) == [
        (T.PARTITION, "nvme0n1p2"), (T.DISK, "nvme0n1"), (T.NVME_CTRL, "nvme0"),
        (T.PCI, "0000:3d:00.0"), (T.PCI_BRIDGE, "0000:00:1d.0")]


def test_path_links_of_a_usb_enclosure_name_the_hub_and_the_enclosure():
    parts = USB.format(port="2-1.1", h=3, disk="sdc").split("/")
    assert kinds(path_links(parts)) == [
        (T.DISK, "sdc"), (T.SCSI_HOST, "host3"), (T.USB_DEVICE, "2-1.1"), (T.USB_HUB, "2-1"), (T.USB_BUS, "usb2"),
        (T.PCI, "0000:00:14.0")]


def test_path_links_of_a_pcie_switch_behind_a_root_port():
    parts = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:03.0/0000:05:00.0/nvme/nvme2/nvme2n1".split("/")
    assert kinds(path_links(parts)) == [
        (T.DISK, "nvme2n1"), (T.NVME_CTRL, "nvme2"), (T.PCI, "0000:05:00.0"), (T.PCI_BRIDGE, "0000:02:03.0"),
        (T.PCI_BRIDGE, "0000:01:00.0"), (T.PCI_BRIDGE, "0000:00:01.0")]


# ---- the recorded trees ----------------------------------------------------------------------------------

def test_two_namespaces_of_one_nvme_controller_share_it_and_a_second_controller_is_independent(tree):
    n1 = tree.block(f"{NVME_CTRL0}/nvme0n1", "259:0")
    tree.partition(n1, "nvme0n1p1", "259:3")
    tree.block(f"{NVME_CTRL0}/nvme0n2", "259:1")
    tree.block(f"{NVME_CTRL1}/nvme1n1", "259:2")
    t = topo(tree, [("a", "259:3"), ("b", "259:1"), ("c", "259:2")])
    assert [(g.name, g.drives) for g in t.groups] == [("nvme0", ("a", "b"))]
    assert t.groups[0].reason() == "NVMe controller nvme0"
    assert t.group_of("c") is None
    assert t.drives[0].device == "nvme0n1p1"


def test_namespaces_under_native_nvme_multipath_reach_their_controller(tree):
    for ns, ctrl, subsys, majmin in (("nvme0n1", NVME_CTRL0, "nvme-subsys0", "259:0"),
                                     ("nvme0n2", NVME_CTRL0, "nvme-subsys0", "259:1"),
                                     ("nvme1n1", NVME_CTRL1, "nvme-subsys1", "259:2")):
        head = tree.block(f"virtual/nvme-subsystem/{subsys}/{ns}", majmin)
        path_dev = tree.root / "devices" / ctrl / f"{ns[:5]}c0{ns[5:]}"
        path_dev.mkdir(parents=True)
        (head / "multipath").mkdir()
        (head / "multipath" / path_dev.name).symlink_to(os.path.relpath(path_dev, head / "multipath"))
    links = device_links("259:0", str(tree.root))
    assert kinds(links) == [(T.DISK, "nvme0n1"), (T.NVME_NS_HEAD, "nvme-subsys0"), (T.NVME_CTRL, "nvme0"),
                            (T.PCI, "0000:3d:00.0"), (T.PCI_BRIDGE, "0000:00:1d.0")]
    t = topo(tree, [("a", "259:0"), ("b", "259:1"), ("c", "259:2")])
    assert [g.drives for g in t.groups] == [("a", "b")]


def test_two_partitions_of_one_disk_share_the_disk_and_its_controller_reaches_a_third(tree):
    sda = tree.block(SATA.format(n=1, h=0, disk="sda"), "8:0")
    tree.partition(sda, "sda1", "8:1")
    tree.partition(sda, "sda2", "8:2")
    tree.block(SATA.format(n=2, h=1, disk="sdb"), "8:16")
    t = topo(tree, [("a", "8:1"), ("b", "8:2"), ("c", "8:16")])
    g, = t.groups
    assert g.drives == ("a", "b", "c")
    assert [(s.link.text(), s.drives) for s in g.shares] == [("PCI function 0000:00:17.0", ("a", "b", "c")),
                                                             ("disk sda", ("a", "b"))]
    assert g.reason() == "PCI function 0000:00:17.0 (a, b, c); disk sda (a, b)"
    only_two = topo(tree, [("a", "8:1"), ("b", "8:2")])
    assert only_two.groups[0].reason() == "disk sda" and only_two.groups[0].name == "disk-sda"


def test_two_enclosures_on_one_usb_hub_share_the_hub(tree):
    tree.block(USB.format(port="2-1.1", h=3, disk="sdc"), "8:32")
    tree.block(USB.format(port="2-1.2", h=4, disk="sdd"), "8:48")
    tree.block(f"{NVME_CTRL1}/nvme1n1", "259:2")
    t = topo(tree, [("green", "8:32"), ("white", "8:48"), ("internal", "259:2")])
    g, = t.groups
    assert (g.name, g.drives, g.reason()) == ("hub-2-1", ("green", "white"), "USB hub 2-1")


def test_an_md_raid0_of_two_disks_rests_on_both_and_shares_each_with_another_partition(tree):
    sde = tree.block("pci0000:00/0000:00:01.1/0000:02:00.0/nvme/nvme4/nvme4n1", "259:8")
    sdf = tree.block("pci0000:00/0000:00:01.2/0000:03:00.0/nvme/nvme5/nvme5n1", "259:9")
    e1 = tree.partition(sde, "nvme4n1p1", "259:10")
    tree.partition(sde, "nvme4n1p2", "259:11")
    f1 = tree.partition(sdf, "nvme5n1p1", "259:12")
    md = tree.block("virtual/block/md0", "9:0", {"md/level": "raid0"})
    tree.member(md, e1)
    tree.member(md, f1)
    links = device_links("9:0", str(tree.root))
    assert kinds(links)[:4] == [(T.MD, "md0 (raid0)"), (T.PARTITION, "nvme4n1p1"), (T.DISK, "nvme4n1"),
                                (T.NVME_CTRL, "nvme4")]
    assert (T.DISK, "nvme5n1") in kinds(links)
    t = topo(tree, [("raid", "9:0"), ("other", "259:11")])
    assert t.groups[0].reason() == "disk nvme4n1"
    tree.block(f"{NVME_CTRL1}/nvme1n1", "259:2")
    alone = topo(tree, [("raid", "9:0"), ("third", "259:2")])
    assert alone.drives[1].links and alone.groups == ()


def test_a_loop_device_rests_on_the_disk_holding_its_file(tree):
    sdc = tree.block(SATA.format(n=3, h=2, disk="sdc"), "8:32")
    tree.partition(sdc, "sdc1", "8:33")
    tree.partition(sdc, "sdc2", "8:34")
    tree.block("virtual/block/loop0", "7:0", {"loop/backing_file": "/mnt/big/drive.img"})
    tree.block("virtual/block/loop1", "7:1", {"loop/backing_file": "/dev/shm/a.img (deleted)"})
    tree.block("virtual/block/loop2", "7:2", {"loop/backing_file": "/dev/shm/b.img"})
    tree.block("virtual/block/loop3", "7:3", {"loop/backing_file": "/gone/c.img"})
    where = {"/mnt/big/drive.img": "8:33", "/dev/shm/a.img": "0:27", "/dev/shm/b.img": "0:27"}
    t = topo(tree, [("loop", "7:0"), ("disk", "8:34"), ("ram1", "7:1"), ("ram2", "7:2"), ("lost", "7:3")], where.get)
    assert kinds(t.drives[0].links)[:3] == [(T.LOOP, "loop0 (/mnt/big/drive.img)"), (T.PARTITION, "sdc1"), (T.DISK, "sdc")]
    assert [(g.drives, g.reason()) for g in t.groups] == [
        (("loop", "disk"), "disk sdc"),
        (("ram1", "ram2"), "file system 0:27 (no block device: memory or network)")]
    assert kinds(t.drives[4].links)[-1] == (T.FILE, "/gone/c.img (not reachable here)")


def test_lvm_volumes_sharing_a_physical_volume(tree):
    sdg = tree.block(SATA.format(n=1, h=0, disk="sdg").replace("0000:00:17.0", "0000:00:11.0"), "8:96")
    sdh = tree.block(SATA.format(n=1, h=0, disk="sdh").replace("0000:00:17.0", "0000:00:12.0"), "8:112")
    g1, h1 = tree.partition(sdg, "sdg1", "8:97"), tree.partition(sdh, "sdh1", "8:113")
    lv0 = tree.block("virtual/block/dm-0", "253:0", {"dm/name": "vg-lv0"})
    lv1 = tree.block("virtual/block/dm-1", "253:1", {"dm/name": "vg-lv1"})
    tree.member(lv0, g1)
    tree.member(lv0, h1)
    tree.member(lv1, h1)
    t = topo(tree, [("lv0", "253:0"), ("lv1", "253:1")])
    assert kinds(t.drives[0].links)[0] == (T.DM, "dm-0 (vg-lv0)")
    assert t.groups[0].reason() == "partition sdh1"


def test_no_block_device_and_unreadable_drives_are_never_grouped(tree):
    t = topo(tree, [("ram", "0:27"), ("ram2", "0:27"), ("gone", None)])
    assert t.groups == ()
    assert [d.note != "" for d in t.drives] == [True, True, True]
    assert any("no block device" in line for line in topology_lines(t))


def test_groups_are_transitive_and_named_uniquely():
    a = DriveTopology("a", "x", (Link(T.DISK, "d1", "sda"),))
    b = DriveTopology("b", "y", (Link(T.DISK, "d1", "sda"), Link(T.USB_HUB, "h", "2-1")))
    c = DriveTopology("c", "z", (Link(T.USB_HUB, "h", "2-1"),))
    d = DriveTopology("d", "w", (Link(T.DISK, "d2", "sda"),))
    e = DriveTopology("e", "v", (Link(T.DISK, "d2", "sda"),))
    g1, g2 = group_drives([a, b, c, d, e])
    assert g1.drives == ("a", "b", "c") and g1.reason() == "disk sda (a, b); USB hub 2-1 (b, c)"
    assert (g1.name, g2.name) == ("disk-sda", "disk-sda-2")


def test_topology_json_round_trip(tree):
    tree.block(USB.format(port="2-1.1", h=3, disk="sdc"), "8:32")
    tree.block(USB.format(port="2-1.2", h=4, disk="sdd"), "8:48")
    t = topo(tree, [("green", "8:32"), ("white", "8:48"), ("ram", "0:27")])
    d = topology_to_dict(t)
    assert d["groups"][0]["reason"] == "USB hub 2-1" and d["groups"][0]["drives"] == ["green", "white"]
    assert topology_from_dict(d) == t


# ---- identity that survives a reboot -------------------------------------------------------------------

def test_disk_identity_from_the_kernels_attributes(tree):
    n1 = tree.block(f"{NVME_CTRL0}/nvme0n1", "259:0", {"wwid": "eui.0025385b71b07e2f"})
    (n1.parent / "serial").write_text("S4EWNX0R123456  \n")     # the controller's serial, under device/
    (n1 / "device").symlink_to("..")
    tree.partition(n1, "nvme0n1p1", "259:1")
    assert disk_identity("259:1", str(tree.root)) == ("S4EWNX0R123456", "eui.0025385b71b07e2f")
    sda = tree.block(SATA.format(n=1, h=0, disk="sda"), "8:0")
    (sda / "device").mkdir()
    (sda / "device" / "vpd_pg80").write_bytes(bytes([0, 0x80, 0, 8]) + b"WD-12345")
    (sda / "device" / "wwid").write_text("naa.50014ee2b5a1c2d3\n")
    assert disk_identity("8:0", str(tree.root)) == ("WD-12345", "naa.50014ee2b5a1c2d3")
    assert disk_identity("7:0", str(tree.root)) == ("", "")


def test_vpd_serial_rejects_another_page():
    assert vpd_serial(bytes([0, 0x83, 0, 4]) + b"abcd") == ""
    assert vpd_serial(b"") == ""


def test_identity_key_prefers_the_file_system_uuid_then_the_serial():
    assert identity_key("1234-ABCD", "S1", "eui.1", "sda", "sda1") == "uuid:1234-ABCD"
    assert identity_key("", "S1", "eui.1", "sda", "sda1") == identity_key("", "S1", "", "nvme9n1", "x")
    assert identity_key("", "", "eui.1", "sda", "sda1").startswith("serial:")
    assert identity_key("", "", "", "sda", "sda1") == "disk:sda"


def _uuid16(u):
    return uuid.UUID(u).bytes


@pytest.mark.parametrize("fs, head, want", [
    ("ext4", {0x438: b"\x53\xef", 0x468: _uuid16("6e8d422a-72b7-45ee-adb1-86eb5a04997a")},
     "6e8d422a-72b7-45ee-adb1-86eb5a04997a"),
    ("xfs", {0: b"XFSB", 32: _uuid16("0f0e0d0c-0b0a-0908-0706-050403020100")}, "0f0e0d0c-0b0a-0908-0706-050403020100"),
    ("btrfs", {0x10040: b"_BHRfS_M", 0x10020: _uuid16("11111111-2222-3333-4444-555555555555")},
     "11111111-2222-3333-4444-555555555555"),
    ("exfat", {3: b"EXFAT   ", 100: bytes.fromhex("efbeadde")}, "DEAD-BEEF"),
    ("ntfs", {3: b"NTFS    ", 0x48: bytes.fromhex("0807060504030201")}, "0102030405060708"),
    ("fat32", {0x52: b"FAT32   ", 0x43: bytes.fromhex("78563412")}, "1234-5678"),
    ("none", {}, ""),
])
def test_superblock_uuid(fs, head, want):
    buf = bytearray(0x10000 + 4096)
    for off, data in head.items():
        buf[off:off + len(data)] = data
    assert superblock_uuid(bytes(buf)) == want


def test_superblock_uuid_of_a_real_ext4_matches_blkid(tmp_path):
    if not (shutil.which("mkfs.ext4") and shutil.which("blkid")):
        pytest.skip("needs mkfs.ext4 and blkid")
    img = tmp_path / "fs.img"
    with open(img, "wb") as f:
        f.truncate(8 << 20)
    u = str(uuid.uuid4())
    subprocess.run(["mkfs.ext4", "-q", "-F", "-U", u, str(img)], check=True, capture_output=True)
    blkid = subprocess.run(["blkid", "-p", "-o", "value", "-s", "UUID", str(img)], capture_output=True, text=True).stdout.strip()
    assert superblock_uuid(img.read_bytes()[:0x11000]) == u == blkid


def test_fs_uuid_from_a_by_uuid_link(tmp_path):
    dev = tmp_path / "dev"
    (dev / "disk" / "by-uuid").mkdir(parents=True)
    (dev / "nvme0n1p2").write_bytes(b"")
    (dev / "disk" / "by-uuid" / "4f1c-2a9b").symlink_to("../../nvme0n1p2")
    assert fs_uuid("nvme0n1p2", str(dev)) == ("4f1c-2a9b", "by-uuid")
    assert fs_uuid("sda1", str(dev)) == ("", "")


# ---- this machine --------------------------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sysfs is Linux's")
def test_this_machines_root_and_tmp():
    st = os.stat("/")
    if not device_dir(f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"):
        pytest.skip("/ sits on no block device sysfs shows (a container's overlay?)")
    t = drives_topology([("root", "/"), ("tmp", "/tmp")])
    root, tmp = t.drives
    assert root.links and root.links[0].name.split(" ")[0] == os.path.basename(drive_of("/").device)
    assert drive_of("/").devno == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    same = os.stat("/tmp").st_dev == st.st_dev
    if same:
        assert t.groups and t.groups[0].drives == ("root", "tmp")
    elif not tmp.links:
        assert t.groups == () and tmp.note


def test_the_disk_key_is_shared_by_partitions_of_one_disk_and_not_by_loop_devices():
    from core.drives import DriveInfo
    p1 = DriveInfo("/a", "ext4", "/dev/sda1", "sda", "uuid:1", devno="8:1", fs_uuid="1", serial="WD-1")
    p2 = DriveInfo("/b", "ext4", "/dev/sda2", "sda", "uuid:2", devno="8:2", fs_uuid="2", serial="WD-1")
    assert p1.key != p2.key and p1.disk_key == p2.disk_key
    l1 = DriveInfo("/c", "ext4", "/dev/loop1", "loop1", "uuid:3", devno="7:1", fs_uuid="3")
    l2 = DriveInfo("/d", "ext4", "/dev/loop2", "loop2", "uuid:4", devno="7:2", fs_uuid="4")
    assert l1.disk_key == "disk:loop1" != l2.disk_key


def test_the_grouping_is_pure():
    from tests.helpers import impure_imports
    assert impure_imports(T) == []
