"""`replicas sync` of models of several files: a real split GGUF set (the gguf library's writer)
and a real safetensors directory (the safetensors library, with index, config, tokenizer and a
file in a sub-folder), copied to two destinations. Every file byte-identical and stamped; the
model never visible under its final name before every file verified; kill -9 in the middle of
the second file resumes writing only what was not durable; extra files kept; free space for the
whole set; a source file changing mid-copy refused as for one file."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from core import rig as rigmod
from core.errors import MismatchError, WriteError
from core.events import Notice, Progress
from replicas import fanout
from replicas.cli import app
from core.coldio import ColdReader
from replicas.hashing import hash_file
from replicas.journal import read_journal
from replicas.manifests import load_manifest
from models.modelset import discover
from replicas.stamps import stamp_state
from replicas.sync import sync
from replicas.syncplan import headroom
from tests.helpers import write_safetensors_dir, write_split_gguf

PIECE = 64 * 1024          # small pieces: every shard of the test models has several
KINDS = ["split", "dir"]


def read(p):
    with open(p, "rb") as f:
        return f.read()


@pytest.fixture(params=KINDS)
def setup(request, tmp_path):
    """(the model on 'internal', [green, white] destination dirs, rig dir, kind)."""
    if request.param == "split":
        path = write_split_gguf(tmp_path / "internal", "moe", 3, tensors_per_part=2, tensor_bytes=150_000, seed=3)[0]
    else:
        path = write_safetensors_dir(tmp_path / "internal" / "moe", 3, shard_bytes=300_000, seed=3,
                                     extra_files={"original/params.json": b'{"dim": 64}'})
    dests = [tmp_path / "green", tmp_path / "white"]
    for d in dests:
        d.mkdir()
    return discover(str(path)), [str(d) for d in dests], str(tmp_path / "rig"), request.param


def leftovers(root):
    """Our temporary names anywhere under `root`: partials, journals, a staging directory."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        found += [n for n in dirnames + filenames if n.endswith(".partial") or n.endswith(".journal")]
    return found


def not_final_yet(model, dests):
    """Watches every event of a sync: the model's final name (the directory, or a split set's
    first member) must not exist at any destination before the end; records what it saw."""
    seen = {"events": 0, "sibling_before_first": False}

    def report(ev):
        seen["events"] += 1
        for d in dests:
            final = model.in_dir(d)
            assert not os.path.exists(final.path), f"{final.path} visible before every file verified"
            if len(final.paths) > 1 and os.path.exists(final.paths[1]):
                seen["sibling_before_first"] = True
    return report, seen


def test_round_trip_two_destinations(setup):
    model, dests, rig, kind = setup
    report, seen = not_final_yet(model, dests)
    res = sync(model.path, dests, rig, piece_size=PIECE, allow_same_device=True, report=report)
    assert res.exit_code == 0, [d.error for d in res.dests]
    size = sum(os.path.getsize(p) for p in model.paths)
    assert res.size == size and res.source_bytes_read == size       # each source file read once for both
    assert seen["events"] > 0
    if kind == "split":   # the other members are renamed as they verify, the first one last
        assert seen["sibling_before_first"]
    r = rigmod.load_rig(rig)
    manifest = load_manifest(r)
    assert (r.layout, r.format, r.files) == (model.layout, model.format, model.files)
    assert manifest.names == model.files and manifest.layout == model.layout and manifest.size == size
    assert res.digest == manifest.digest() and res.files == model.files
    assert [m.path for m in r.members] == [model.path] + [model.in_dir(d).path for d in dests]
    for d in dests:
        copy = model.in_dir(d)
        assert not leftovers(d)
        for rel, src, dst in zip(model.files, model.paths, copy.paths):
            assert read(dst) == read(src)
            assert os.stat(dst).st_mtime_ns == os.stat(src).st_mtime_ns
            m, h = manifest.file(rel), hash_file(src, PIECE)
            assert (m.name, m.size, m.blake3, m.pieces) == (rel, h.size, h.blake3, h.pieces)
            assert stamp_state(dst, m, r) == "verified" and stamp_state(src, m, r) == "verified"
    for dr in res.dests:
        assert [f.file for f in dr.files] == list(model.files)
        assert all(f.outcome == "copied" and f.verified for f in dr.files)
        assert dr.bytes_written == size and dr.outcome == "copied"
    again = sync(model.path, dests, rig, piece_size=PIECE, allow_same_device=True)
    assert again.exit_code == 0 and again.source_bytes_read == 0      # trusted manifest and stamps: nothing read
    assert {f.action for d in again.dests for f in d.files} == {"noop"}


SYNC_KEYS = {"schema", "kind", "source", "size", "blake3", "digest", "layout", "format", "files", "piece_size",
             "dry_run", "source_bytes_read", "seconds", "exit_code", "destinations", "partial"}
DEST_KEYS = {"dest_dir", "target", "action", "outcome", "bytes_written", "bytes_to_write", "seconds", "verified",
             "stamped", "bad", "error", "exit_code", "extra", "files", "dropped"}
FILE_KEYS = {"file", "target", "action", "outcome", "bytes_written", "bytes_to_write", "verified", "stamped", "bad",
             "error", "exit_code", "parses"}


def sync_json(*args):
    r = CliRunner().invoke(app, ["sync", "--json", "--quiet", "--piece-size", "64K", "--allow-same-device",
                                 *[str(a) for a in args]])
    return r.exit_code, json.loads(r.stdout)


def test_json_lists_every_file_per_destination(setup):
    model, dests, rig, kind = setup
    code, doc = sync_json("--rig", rig, model.path, *dests)
    assert code == 0
    assert set(doc) == SYNC_KEYS and doc["files"] == list(model.files) and doc["layout"] == model.layout
    assert doc["digest"] == doc["blake3"] == load_manifest(rigmod.load_rig(rig)).digest()
    for d, dest in zip(doc["destinations"], dests):
        assert set(d) == DEST_KEYS and d["target"] == model.in_dir(dest).path and d["extra"] == []
        assert [f["file"] for f in d["files"]] == list(model.files)
        assert [f["target"] for f in d["files"]] == list(model.in_dir(dest).paths)
        assert all(set(f) == FILE_KEYS and f["outcome"] == "copied" for f in d["files"])
        assert d["bytes_written"] == sum(f["bytes_written"] for f in d["files"]) == doc["size"]


def test_json_of_a_one_file_model_keeps_its_keys(tmp_path):
    src = tmp_path / "internal" / "model.bin"
    src.parent.mkdir()
    src.write_bytes(os.urandom(3 * PIECE + 5))
    (tmp_path / "green").mkdir()
    code, doc = sync_json("--rig", tmp_path / "rig", src, tmp_path / "green")
    assert code == 0 and set(doc) == SYNC_KEYS and doc["layout"] == "file" and doc["format"] == "raw"
    assert doc["blake3"] == hash_file(str(src), PIECE).blake3 != doc["digest"]
    d = doc["destinations"][0]
    assert set(d) == DEST_KEYS and d["target"] == str(tmp_path / "green" / "model.bin")
    assert d["action"] == "copy" and d["outcome"] == "copied" and d["bytes_written"] == 3 * PIECE + 5
    assert [f["file"] for f in d["files"]] == ["model.bin"]


def durable_bytes(journal, size):
    _, durable = read_journal(journal)
    return sum(min(PIECE, size - i * PIECE) for i in durable)


def test_resume_after_kill_9_in_the_second_file_writes_only_what_was_not_durable(setup):
    model, dests, rig, kind = setup
    sizes = [os.path.getsize(p) for p in model.paths]
    kill_at = sizes[0] + 2 * PIECE           # the destination's progress over the whole set
    # A real kill -9 in the middle of the second file. Its pieces from the fourth on never land
    # before the kill (their writes wait), so what is durable is decided by order, not timing.
    script = textwrap.dedent(f"""
        import os, signal, threading
        from core.events import Progress
        from replicas.sync import sync
        real_pwrite = os.pwrite
        never = threading.Event()
        def drive(fd, data, offset):
            if os.readlink(f"/proc/self/fd/{{fd}}").endswith({os.path.basename(model.files[1]) + ".partial"!r}) \\
                    and offset >= 3 * {PIECE}:
                never.wait()
            return real_pwrite(fd, data, offset)
        os.pwrite = drive
        reached = set()
        def report(ev):
            # The kill waits for EVERY destination to have its first pieces of the second file
            # durable (each gets there: only pieces from the fourth on are held back), so a
            # destination running behind under load is never killed with nothing to resume.
            if isinstance(ev, Progress) and ev.phase == "copy" and ev.done >= {kill_at}:
                reached.add(ev.task)
                if len(reached) == {len(dests)}:
                    os.kill(os.getpid(), signal.SIGKILL)
        sync({model.path!r}, {dests!r}, {rig!r}, piece_size={PIECE}, allow_same_device=True, report=report)
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    second, durable = model.files[1], {}
    for d in dests:
        final = model.in_dir(d)
        assert not os.path.exists(final.path)                  # not visible under its final name
        work = model.at(final.path + ".partial") if kind == "dir" else final
        journal = work.abs(second) + ".partial.journal"
        durable[d] = durable_bytes(journal, sizes[1])
        assert 2 * PIECE <= durable[d] <= 3 * PIECE < sizes[1]  # the second file is not finished
        assert not os.path.exists(work.abs(model.files[2]) + ".partial")   # the third not started
    res = sync(model.path, dests, rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0, [d.error for d in res.dests]
    for dr in res.dests:
        first, nxt = dr.files[0], dr.files[1]
        assert first.bytes_written == 0                        # finished before the kill: verified, not copied
        assert first.action == ("resume" if kind == "split" else "adopt")
        assert nxt.action == "resume" and nxt.bytes_written == sizes[1] - durable[dr.dest_dir]
        assert dr.bytes_written == sum(sizes) - sizes[0] - durable[dr.dest_dir]   # count the bytes
        copy = model.in_dir(dr.dest_dir)
        assert all(read(a) == read(b) for a, b in zip(model.paths, copy.paths))
        assert not leftovers(dr.dest_dir)
    r = rigmod.load_rig(rig)
    assert all(stamp_state(p, load_manifest(r).file(rel), r) == "verified"
               for d in dests for rel, p in zip(model.files, model.in_dir(d).paths))


def test_extra_files_in_a_destination_are_reported_and_kept(setup):
    model, dests, rig, kind = setup
    assert sync(model.path, dests[:1], rig, piece_size=PIECE, allow_same_device=True).exit_code == 0
    copy = model.in_dir(dests[0])
    extra = os.path.join(copy.root, "notes.txt" if kind == "dir" else "moe-00001-of-00002.gguf")
    with open(extra, "wb") as f:
        f.write(b"mine")
    events = []
    res = sync(model.path, dests[:1], rig, piece_size=PIECE, allow_same_device=True, report=events.append)
    assert res.exit_code == 0
    name = os.path.basename(extra)
    assert res.dests[0].extra == (name,)
    assert any(isinstance(e, Notice) and name in e.message and "kept" in e.message for e in events)
    assert read(extra) == b"mine"
    code, doc = sync_json("--rig", rig, model.path, dests[0])
    assert code == 0 and doc["destinations"][0]["extra"] == [name] and read(extra) == b"mine"
    if kind == "split":   # files of other sets, or the drive's own, are no business of the model's
        assert res.dests[0].files[0].action == "noop"


def test_free_space_is_checked_for_the_whole_set_before_a_byte_is_written(setup, monkeypatch):
    model, dests, rig, kind = setup
    sizes = [os.path.getsize(p) for p in model.paths]
    need = sum(sizes) + headroom(sum(sizes))                 # one destination; the largest file alone fits
    assert need - 1 > max(sizes) + headroom(max(sizes))
    monkeypatch.setattr("replicas.syncfacts.free_bytes", lambda path: need - 1)
    with pytest.raises(WriteError, match="not enough free space"):
        sync(model.path, dests[:1], rig, piece_size=PIECE, allow_same_device=True)
    assert not os.listdir(dests[0])
    monkeypatch.setattr("replicas.syncfacts.free_bytes", lambda path: need)
    assert sync(model.path, dests[:1], rig, piece_size=PIECE, allow_same_device=True).exit_code == 0


class RewrittenSecondFile(ColdReader):
    """The copy's cold reader, with the user rewriting the model's second file just before its
    last piece is read (ordered by the hook, not by timing)."""

    target = ""
    at = 0

    def read_into(self, buffer, offset):
        if self.path == self.target and offset == self.at:
            with open(self.path, "r+b") as f:
                f.seek(-10, os.SEEK_END)
                f.write(b"0123456789")
        return super().read_into(buffer, offset)


def test_a_source_file_changed_mid_copy_is_refused_and_nothing_appears(setup, monkeypatch):
    model, dests, rig, kind = setup
    assert sync(model.path, dests[:1], rig, piece_size=PIECE, allow_same_device=True).exit_code == 0
    before = [read(p) for p in model.in_dir(dests[0]).paths]
    RewrittenSecondFile.target = model.paths[1]
    RewrittenSecondFile.at = (os.path.getsize(model.paths[1]) - 1) // PIECE * PIECE
    monkeypatch.setattr(fanout, "open_cold", RewrittenSecondFile)
    with pytest.raises(MismatchError) as excinfo:
        sync(model.path, dests[1:], rig, piece_size=PIECE, allow_same_device=True)
    assert "the source changed during the copy" in str(excinfo.value) and excinfo.value.exit_code == 1
    assert model.paths[1] in str(excinfo.value)
    assert not os.path.exists(model.in_dir(dests[1]).path)            # nothing visible under the final name
    assert [read(p) for p in model.in_dir(dests[0]).paths] == before   # the verified replica untouched
    r = rigmod.load_rig(rig)
    assert [m.path for m in r.replicas] == [model.in_dir(dests[0]).path]


def test_a_differing_file_is_named_in_the_human_output(setup):
    model, dests, rig, kind = setup
    assert sync(model.path, dests[:1], rig, piece_size=PIECE, allow_same_device=True).exit_code == 0
    copy = model.in_dir(dests[0])
    victim = copy.paths[1]                # a file in the middle: the files after it are still judged
    data = bytearray(read(victim))
    data[len(data) // 2] ^= 0xFF
    os.unlink(victim)                     # a new file of the same size: no stamp, so it is read back
    with open(victim, "wb") as f:
        f.write(bytes(data))
    r = CliRunner().invoke(app, ["sync", "--rig", rig, "--piece-size", "64K", "--allow-same-device",
                                 model.path, dests[0]], env={"COLUMNS": "400"})
    assert r.exit_code == 1, r.output
    assert f"{victim}: {victim} exists and differs from the source (1 piece); pass --replace" in r.stderr
    assert f"{victim}: bad piece {len(data) // 2 // PIECE} at byte {len(data) // 2 // PIECE * PIECE}" in r.stderr
    assert "Traceback" not in r.output
    assert read(victim) == bytes(data)    # never overwritten without --replace
    code, doc = sync_json("--rig", rig, model.path, dests[0])
    files = doc["destinations"][0]["files"]
    assert code == 1 and [f["outcome"] for f in files] == ["identical", "failed"] + ["identical"] * (len(files) - 2)
    assert doc["destinations"][0]["error"].startswith(f"{model.files[1]}: ")
    assert [b["file"] for b in doc["destinations"][0]["bad"]] == [model.files[1]]


def test_a_write_failure_stops_that_destination_and_a_rerun_finishes_it(setup):
    import resource

    model, dests, rig, kind = setup
    limit = 200_000           # bytes: the first big file cannot be written

    def limit_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([sys.executable, "-m", "replicas.cli", "sync", "--rig", rig, "--json", "--quiet", "--piece-size",
                        "64K", "--allow-same-device", model.path, dests[0]], capture_output=True, text=True,
                       preexec_fn=limit_writes)
    assert p.returncode == 4, p.stderr
    files = json.loads(p.stdout)["destinations"][0]["files"]
    big = next(i for i, path in enumerate(model.paths) if os.path.getsize(path) > limit)
    assert [f["outcome"] for f in files] == ["copied"] * big + ["failed"] + ["skipped"] * (len(files) - big - 1)
    assert "write failed" in files[big]["error"] and "Traceback" not in p.stderr
    assert not os.path.exists(model.in_dir(dests[0]).path)
    res = sync(model.path, dests[:1], rig, piece_size=PIECE, allow_same_device=True)
    assert res.exit_code == 0
    assert all(read(a) == read(b) for a, b in zip(model.paths, model.in_dir(dests[0]).paths))


def test_ctrl_c_in_the_third_file_keeps_every_finished_file(setup, monkeypatch):
    import threading

    from core.errors import Interrupted

    model, dests, rig, kind = setup
    small = 4096             # many pieces per file: the Ctrl-C lands while the third file still has some to read
    sizes = [os.path.getsize(p) for p in model.paths]
    real_pwrite = os.pwrite
    cancel = threading.Event()
    third = os.path.basename(model.files[2]) + ".partial"

    def drive(fd, data, offset):
        # The third file's blocks from the tenth on land only after the Ctrl-C: the copy is
        # interrupted with most of that file unread (at most the reader's buffers ahead).
        if os.readlink(f"/proc/self/fd/{fd}").endswith(third) and offset >= 10 * small:
            cancel.wait()
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", drive)

    def report(ev):
        if isinstance(ev, Progress) and ev.phase == "copy" and ev.done >= sum(sizes[:2]) + 2 * small:
            cancel.set()

    with pytest.raises(Interrupted):
        sync(model.path, dests[:1], rig, piece_size=small, allow_same_device=True, report=report, cancel=cancel)
    assert not os.path.exists(model.in_dir(dests[0]).path)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    res = sync(model.path, dests[:1], rig, piece_size=small, allow_same_device=True)
    assert res.exit_code == 0
    written = [f.bytes_written for f in res.dests[0].files]
    assert written[:2] == [0, 0]                        # finished files are verified, never re-copied
    assert 0 < written[2] < sizes[2]                    # the interrupted one: only what was not durable
    assert written[3:] == sizes[3:]
    assert all(read(a) == read(b) for a, b in zip(model.paths, model.in_dir(dests[0]).paths))


def test_dry_run_of_a_set_writes_nothing_and_counts_every_file(setup):
    model, dests, rig, kind = setup
    code, doc = sync_json("--rig", rig, "--dry-run", model.path, *dests)
    assert code == 0 and doc["dry_run"]
    size = sum(os.path.getsize(p) for p in model.paths)
    for d in doc["destinations"]:
        assert d["outcome"] == "planned" and d["action"] == "copy" and d["bytes_to_write"] == size
        assert [f["bytes_to_write"] for f in d["files"]] == [os.path.getsize(p) for p in model.paths]
    assert all(not os.listdir(d) for d in dests) and not os.path.exists(rig)
