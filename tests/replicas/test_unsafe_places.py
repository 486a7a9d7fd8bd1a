"""Nothing is written inside the model it copies, and two writers of one destination never meet
(issue: `sync MODEL MODEL/inner` made a model of twice the files; two syncs into one destination
shared its staging folder and journals, the second failed half-way and the first's stamp went stale)."""

import os

import pytest

from core.fsutil import folder_lock
from core.rig import load_rig
from tests.replicas.helpers import invoke, write_model
from tests.replicas.test_upstream import hf_snapshot


def one_line(r, code, *words):
    assert r.exit_code == code, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output
    for w in words:
        assert w in " ".join(r.output.split()), (w, r.output)


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path / "internal", "dir")


def files_of(path):
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, _, ns in os.walk(path) for n in ns)


@pytest.mark.parametrize("where", ["inner", ".", "extra"])
def test_a_replica_inside_the_model_is_refused(tmp_path, model, where):
    before = files_of(model)
    dest = os.path.join(model, where)
    os.makedirs(dest, exist_ok=True)
    r = invoke("sync", "--rig", tmp_path / "rig", "--allow-same-device", model, dest)
    one_line(r, 2, "inside the source model's folder", "choose a folder outside it")
    assert files_of(model) == before


def test_a_replica_inside_another_members_copy_is_refused(tmp_path, model):
    (tmp_path / "green").mkdir()
    rig = tmp_path / "rig"
    assert invoke("sync", "--rig", rig, "--allow-same-device", model, tmp_path / "green").exit_code == 0
    green = load_rig(str(rig)).replicas[0].path
    os.makedirs(os.path.join(green, "sub"))
    r = invoke("sync", "--rig", rig, "--allow-same-device", model, os.path.join(green, "sub"))
    one_line(r, 2, "inside member 'green'")


def test_a_destination_that_would_hold_the_source_is_refused(tmp_path):
    model = write_model(tmp_path / "drive" / "moe", "dir")      # .../drive/moe/moe: a copy into drive/ would be drive/moe
    r = invoke("sync", "--rig", tmp_path / "rig", "--allow-same-device", model, tmp_path / "drive")
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_a_rig_inside_the_model_is_refused(tmp_path, model):
    r = invoke("init", "--rig", os.path.join(model, "rig"), "--model", model)
    one_line(r, 2, "the rig folder", "inside the source model's folder")
    (tmp_path / "green").mkdir()
    r = invoke("sync", "--rig", os.path.join(model, "rig"), "--allow-same-device", model, tmp_path / "green")
    one_line(r, 2, "the rig folder", "inside the source model's folder")
    assert not os.path.exists(os.path.join(model, "rig"))


def test_a_replica_inside_a_hugging_face_repository_is_refused(tmp_path, model):
    """The snapshot folder holds only links; its bytes are in the repository's blobs/: that is the
    model's own folder too."""
    snap = hf_snapshot(tmp_path / "hf", model)
    repo = os.path.dirname(os.path.dirname(snap))
    r = invoke("sync", "--rig", tmp_path / "rig", "--allow-same-device", snap, os.path.join(repo, "blobs"))
    one_line(r, 2, "inside the source model's folder", repo)


def test_a_second_writer_of_one_destination_is_refused_at_once(tmp_path, model):
    (tmp_path / "green").mkdir()
    with folder_lock(str(tmp_path / "green"), "busy"):             # another sync holds it
        r = invoke("sync", "--rig", tmp_path / "rig", "--allow-same-device", model, tmp_path / "green")
        one_line(r, 2, f"destination {tmp_path / 'green'}", "another `replicas sync`", "wait for it")
    assert os.listdir(tmp_path / "green") == []
    r = invoke("sync", "--rig", tmp_path / "rig", "--allow-same-device", model, tmp_path / "green")
    assert r.exit_code == 0, r.output
    assert invoke("verify", "--rig", tmp_path / "rig").exit_code == 0
