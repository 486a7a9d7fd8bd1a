"""`replicas init` finds the model on disk (models.modelset.discover, models.formats): one
file, any file of a split GGUF set (the whole set), a directory; and refuses, in one line with the
right exit code, what is not a model it can keep byte-identical."""

import json
import os
import shutil

import pytest

from core import rig as rigmod
from models.formats import GGUF, SAFETENSORS, gguf_split_fields, read_safetensors_header, sniff
from models.modelset import DIR, FILE, SPLIT, discover
from tests.helpers import write_random, write_safetensors_dir, write_split_gguf
from tests.replicas.helpers import invoke

SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]


def init(tmp_path, model, *more):
    return invoke("init", "--rig", str(tmp_path / "rig"), "--model", str(model), *more)


def one_line(r, code, *words):
    """A refusal: exit `code`, one line on the output naming each of `words`, no traceback."""
    assert r.exit_code == code, r.output
    text = r.output.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    for w in words:
        assert w in " ".join(text.split()), (w, text)


def test_one_gguf_file(tmp_path):
    (path,) = write_split_gguf(tmp_path / "m", "solo", 1)
    assert sniff(str(path)) == GGUF and gguf_split_fields(str(path)) is None
    assert init(tmp_path, path, "--json").exit_code == 0
    r = rigmod.load_rig(str(tmp_path / "rig"))
    assert (r.model.path, r.layout, r.format, r.files) == (str(path), FILE, GGUF, ("solo.gguf",))


@pytest.mark.parametrize("given", [0, 1, 2])
def test_any_file_of_a_split_set_takes_the_whole_set(tmp_path, given):
    paths = write_split_gguf(tmp_path / "m", "moe", 3)
    assert [gguf_split_fields(str(p)) for p in paths] == [(0, 3), (1, 3), (2, 3)]
    r = init(tmp_path, paths[given], "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["path"] == str(paths[0]) and doc["layout"] == SPLIT
    rig = rigmod.load_rig(str(tmp_path / "rig"))
    assert (rig.model.path, rig.layout, rig.format) == (str(paths[0]), SPLIT, GGUF)
    assert rig.files == tuple(p.name for p in paths)


def test_a_safetensors_directory_keeps_every_file_with_relative_paths(tmp_path):
    d = write_safetensors_dir(tmp_path / "hf", 3, extra_files={"sub/dir/notes.txt": b"hello"})
    assert all(sniff(str(d / s)) == SAFETENSORS for s in SHARDS)
    header = read_safetensors_header(str(d / SHARDS[0]))
    assert set(header.tensors) == {"model.layers.0.w0", "model.layers.0.w1"} and header.metadata == {"format": "pt"}
    assert init(tmp_path, d).exit_code == 0
    rig = rigmod.load_rig(str(tmp_path / "rig"))
    assert (rig.model.path, rig.layout, rig.format) == (str(d), DIR, SAFETENSORS)
    assert rig.files == tuple(sorted(["config.json", "model.safetensors.index.json", "tokenizer.json",
                                      "sub/dir/notes.txt", *SHARDS]))
    # Found the same way again: a second init of the same model changes nothing.
    before = open(rigmod.load_rig(str(tmp_path / "rig")).rig_file).read()
    assert init(tmp_path, d).exit_code == 0
    assert open(rig.rig_file).read() == before


def test_a_file_that_is_no_model_needs_format_raw(tmp_path):
    p = tmp_path / "blob.bin"
    write_random(p, 5000, seed=1)
    one_line(init(tmp_path, p), 2, str(p), "--format raw")
    assert init(tmp_path, p, "--format", "raw").exit_code == 0
    rig = rigmod.load_rig(str(tmp_path / "rig"))
    assert (rig.layout, rig.format, rig.files) == (FILE, "raw", ("blob.bin",))
    one_line(init(tmp_path, p, "--format", "zip"), 2, "--format 'zip'")


def test_a_directory_without_model_files_needs_format_raw(tmp_path):
    d = tmp_path / "stuff"
    d.mkdir()
    (d / "a.txt").write_text("a")
    (d / "b.bin").write_bytes(b"\0" * 10)
    one_line(init(tmp_path, d), 2, str(d), "--format raw")
    assert init(tmp_path, d, "--format", "raw").exit_code == 0
    assert rigmod.load_rig(str(tmp_path / "rig")).files == ("a.txt", "b.bin")


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
    d = write_safetensors_dir(tmp_path / "hf", 2)
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", d / "config-link.json")
    one_line(init(tmp_path, d), 2, "config-link.json", "symbolic link out of the model's folder", "elsewhere.json")


@pytest.mark.parametrize("how", ["loop", "dangling", "folder"])
def test_a_link_that_leads_nowhere_or_to_a_folder_is_one_line(tmp_path, how):
    d = write_safetensors_dir(tmp_path / "hf", 2)
    if how == "loop":
        os.symlink("self", d / "self")
        words = ("self", "symbolic link loop")
    elif how == "dangling":
        os.symlink("gone.json", d / "x.json")
        words = ("x.json", "link to nowhere (gone.json)")
    else:
        os.symlink("..", d / "up")
        words = ("up", "out of the model's folder")
    one_line(init(tmp_path, d), 3 if how in ("loop", "dangling") else 2, *words)   # one that cannot be followed: missing
    os.makedirs(d / "sub")
    if how == "folder":                # a link to a folder inside the model: never walked
        os.unlink(d / "up")
        os.symlink("sub", d / "down")
        one_line(init(tmp_path, d), 2, "down", "a link to a folder")


def test_a_model_given_as_a_loop_is_one_line(tmp_path):
    os.symlink("loop.gguf", tmp_path / "loop.gguf")
    one_line(init(tmp_path, tmp_path / "loop.gguf"), 3, "loop.gguf", "symbolic link loop")


def test_a_hugging_face_snapshot_is_read_through_its_links_and_named_by_its_repository(tmp_path):
    """`hf download` leaves each file a link into ../../blobs: the model is read through them, a
    replica is made of the bytes (regular files) and named after the repository, not the revision."""
    from tests.replicas.test_upstream import hf_snapshot

    d = write_safetensors_dir(tmp_path / "src", 2)
    snap = hf_snapshot(tmp_path / "hf", d)
    found = discover(snap)
    assert found.path == snap and found.layout == DIR and found.format == SAFETENSORS
    assert set(found.files) == {os.path.relpath(os.path.join(p, n), d) for p, _, ns in os.walk(d) for n in ns}
    assert found.name == "moe" and found.tree == str(tmp_path / "hf" / "models--org--moe")
    repo = tmp_path / "hf" / "models--org--moe"          # the repository folder: the snapshot refs/main names
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(os.path.basename(snap))
    assert discover(str(repo)) == found
    (tmp_path / "green").mkdir()
    rig = str(tmp_path / "rig")
    r = invoke("sync", "--rig", rig, "--allow-same-device", snap, str(tmp_path / "green"))
    assert r.exit_code == 0, r.output
    copy = tmp_path / "green" / "moe"
    for rel in found.files:
        assert not os.path.islink(copy / rel) and (copy / rel).read_bytes() == (d / rel).read_bytes()
    assert invoke("verify", "--rig", rig, "--full").exit_code == 0
    # the blobs' names are the published digests: kept without a separate `replicas upstream`
    r = invoke("verify", "--rig", rig, "--full", "--upstream", os.path.join(rig, "upstream.json"), "--json")
    assert r.exit_code == 0, r.output
    assert {u["state"] for u in json.loads(r.stdout)["upstream"].values()} == {"match"}


def test_a_special_file_inside_the_directory_is_refused(tmp_path):
    d = write_safetensors_dir(tmp_path / "hf", 2)
    os.mkfifo(d / "pipe")
    one_line(init(tmp_path, d), 2, "pipe", "not a regular file")


def test_a_special_file_as_the_model_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe.gguf")
    one_line(init(tmp_path, tmp_path / "pipe.gguf"), 2, "not a regular file or directory")


def test_a_missing_model_is_exit_3(tmp_path):
    one_line(init(tmp_path, tmp_path / "nope.gguf"), 3, "nope.gguf", "no such file")


def test_a_split_set_with_a_missing_member_is_exit_3(tmp_path):
    paths = write_split_gguf(tmp_path / "m", "moe", 4)
    os.unlink(paths[2])
    one_line(init(tmp_path, paths[0]), 3, "1 of 4 files missing", paths[2].name)


def test_split_metadata_that_disagrees_with_the_name_is_refused(tmp_path):
    paths = write_split_gguf(tmp_path / "m", "moe", 3)
    tmp = paths[1].with_name("swap")
    os.rename(paths[1], tmp)                 # parts 2 and 3 trade names
    os.rename(paths[2], paths[1])
    os.rename(tmp, paths[2])
    one_line(init(tmp_path, paths[0]), 2, paths[1].name, "part 2 of 3", "split.no=2")


def test_a_safetensors_directory_missing_a_shard_its_index_names_is_exit_3(tmp_path):
    d = write_safetensors_dir(tmp_path / "hf", 3)
    os.unlink(d / SHARDS[1])
    one_line(init(tmp_path, d), 3, "model.safetensors.index.json", SHARDS[1], "finish the download")


def test_a_truncated_shard_is_refused(tmp_path):
    d = write_safetensors_dir(tmp_path / "hf", 2)
    shard = d / "model-00002-of-00002.safetensors"
    os.truncate(shard, 6)
    one_line(init(tmp_path, d), 2, "model-00002-of-00002.safetensors", "is not one")


def test_a_changed_model_is_not_taken_into_the_same_rig(tmp_path):
    d = write_safetensors_dir(tmp_path / "hf", 2)
    assert init(tmp_path, d).exit_code == 0
    (d / "added.txt").write_text("new")
    one_line(init(tmp_path, d), 2, "other files", "--rig")


def test_discover_through_a_link_to_the_model_itself(tmp_path):
    paths = write_split_gguf(tmp_path / "m", "moe", 2)
    link = tmp_path / "current.gguf"
    os.symlink(paths[1], link)
    found = discover(str(link))
    assert found.path == str(paths[0]) and found.files == tuple(p.name for p in paths)
    assert found.in_dir(str(tmp_path / "green")).paths == tuple(str(tmp_path / "green" / p.name) for p in paths)


def test_init_refuses_a_second_model_in_one_rig(tmp_path):
    a = write_split_gguf(tmp_path / "a", "one", 1)[0]
    b = shutil.copy(a, tmp_path / "other.gguf")
    assert init(tmp_path, a).exit_code == 0
    one_line(init(tmp_path, b), 2, "already has model")


def test_a_one_file_replica_keeps_its_own_name_and_sets_keep_theirs(tmp_path):
    (path,) = write_split_gguf(tmp_path / "m", "solo", 1)
    one = discover(str(path))
    copy = one.at(str(tmp_path / "green" / "renamed.gguf"))
    assert copy.files == ("renamed.gguf",) and copy.paths == (str(tmp_path / "green" / "renamed.gguf"),)
    parts = write_split_gguf(tmp_path / "s", "moe", 2)
    split = discover(str(parts[0]))
    there = split.at(str(tmp_path / "white" / parts[0].name))
    assert there.files == split.files and there.paths == tuple(str(tmp_path / "white" / p.name) for p in parts)
