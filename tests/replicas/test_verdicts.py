"""Status remembers what verify found: verdicts kept in the rig, a standing mismatch until repair
or a clean verify, and the verdict's own pure rules."""

import json
import os
import random
import re

import pytest

from core import rig as rigmod
from replicas import checks
from replicas import verdict as verdictmod
from replicas.checks import FileCheck, FilePiece, MemberCheck, VerifyReport
from replicas.manifest import Manifest, PieceRange
from replicas.manifests import load_manifest
from replicas.records import load_verdicts
from replicas.verdict import (
    MISMATCH,
    STATUS_ORDER,
    VERIFIED,
    ScrubMark,
    Verdict,
    mismatch_text,
    plural,
    resume_point,
    rollup_state,
    rollup_verdict,
    scrub_from_doc,
    scrub_to_doc,
    standing_mismatch,
    verdict_of_check,
    verdicts_from_doc,
    verdicts_to_doc,
)
from replicas.verify import sample_indices
from tests.helpers import impure_imports
from tests.replicas.helpers import PIECE, MiB, flip_byte, invoke

FOUND = r"found \d{4}-\d\d-\d\d \d\d:\d\d"


def status(rig):
    r = invoke("status", "--rig", rig, "--json")
    return r.exit_code, json.loads(r.stdout)["members"]


def test_status_remembers_a_mismatch_until_repair(synced):
    rig, data, paths = synced
    assert status(rig)[0] == 0
    flip_byte(paths[2], 3 * MiB + 9)
    assert invoke("verify", "--rig", rig).exit_code == 1
    code, members = status(rig)
    assert code == 1                                   # was: "stale" and exit 0
    assert [m["state"] for m in members] == ["verified", "verified", "mismatch"]
    v = members[2]["verdict"]
    assert v["state"] == "mismatch" and v["how"] == "full"
    assert v["bad"] == [{"index": 3, "offset": 3 * MiB, "length": MiB}]
    r = invoke("status", "--rig", rig)
    assert r.exit_code == 1
    assert re.search(r"mismatch \(1 bad piece, " + FOUND + r"\)", r.stdout), r.stdout
    # Still there on the next look: nothing but repair or a clean verify clears it.
    assert status(rig)[0] == 1
    assert invoke("repair", paths[2], "--rig", rig, "--quiet").exit_code == 0
    code, members = status(rig)
    assert code == 0 and members[2]["state"] == "verified" and members[2]["verdict"]["state"] == "verified"


def test_grammar_for_several_bad_pieces(synced):
    rig, data, paths = synced
    flip_byte(paths[1], 10)
    flip_byte(paths[1], 2 * MiB + 10)
    invoke("verify", "--rig", rig)
    r = invoke("status", "--rig", rig)
    assert re.search(r"mismatch \(2 bad pieces, " + FOUND + r"\)", r.stdout), r.stdout


def test_a_mismatch_hidden_from_quick_verify_stays_until_a_clean_read(synced):
    rig, data, paths = synced
    flip_byte(paths[1], 5 * MiB, keep_mtime=True)      # the stamp still matches the file's identity
    assert invoke("verify", "--rig", rig).exit_code == 0
    assert invoke("verify", "--rig", rig, "--full").exit_code == 1
    # Quick verify now re-reads that member instead of trusting its (older) stamp.
    r = invoke("verify", "--rig", rig, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)["members"]
    assert [m["how"] for m in doc] == ["stamp", "full", "stamp"] and doc[1]["state"] == "mismatch"
    # A clean sample may have skipped the bad piece: it proves nothing and clears nothing. The
    # draw is seeded per member path (a new tmp path each run): take a seed that skips piece 5.
    manifest = load_manifest(rigmod.load_rig(rig))
    seed = next(s for s in range(100) if 5 not in sample_indices(manifest, 10, random.Random(f"{s}:{paths[1]}"))[0])
    assert invoke("verify", "--rig", rig, "--sample", "10", "--seed", seed, paths[1]).exit_code == 0
    assert status(rig)[0] == 1
    # Put the byte back (mtime kept): a quick verify reads it, finds it clean and clears the verdict.
    flip_byte(paths[1], 5 * MiB, keep_mtime=True)
    assert invoke("verify", "--rig", rig).exit_code == 0
    code, members = status(rig)
    assert code == 0 and members[1]["state"] == "verified"


def test_missing_member_is_recorded_and_other_members_keep_theirs(synced):
    rig, data, paths = synced
    os.unlink(paths[2])
    assert invoke("verify", "--rig", rig).exit_code == 3
    verdicts = load_verdicts(rigmod.load_rig(rig))
    assert verdicts[paths[2]].state == "missing" and "no such file" in verdicts[paths[2]].detail
    assert verdicts[paths[0]].state == verdicts[paths[1]].state == "verified"
    code, members = status(rig)
    assert members[2]["state"] == "missing" and members[2]["verdict"]["state"] == "missing"


def test_a_sync_that_copies_the_replica_again_clears_its_mismatch(synced):
    rig, data, paths = synced
    flip_byte(paths[1], 7)
    invoke("verify", "--rig", rig)
    assert status(rig)[0] == 1
    os.unlink(paths[1])
    r = invoke("sync", "--rig", rig, "--piece-size", "1M", "--allow-same-device", "--quiet",
               paths[0], os.path.dirname(paths[1]))
    assert r.exit_code == 0, r.output
    code, members = status(rig)
    assert code == 0 and members[1]["verdict"]["how"] == "sync"


def test_corrupt_verdicts_file_is_one_line_exit_2(synced):
    rig, data, paths = synced
    with open(os.path.join(rig, "verdicts.json"), "w") as f:
        f.write('{"schema": 1, "kind": "verdicts", "members": {"/x": {"state": "sad"}}}')
    r = invoke("status", "--rig", rig)
    assert r.exit_code == 2 and "verdicts.json" in r.output and "members./x.state" in r.output
    assert len(r.output.strip().splitlines()) == 1


# --- the pure rules -----------------------------------------------------------------------------

M = Manifest(size=3 * PIECE + 5, blake3="ab" * 32, piece_size=PIECE, pieces=("a", "b", "c", "d"))


def test_the_module_is_pure():
    assert impure_imports(verdictmod) == []


def test_plural():
    assert plural(1, "bad piece") == "1 bad piece"
    assert plural(0, "bad piece") == "0 bad pieces"
    assert plural(2, "piece") == "2 pieces"


def test_verdict_of_check():
    assert verdict_of_check("identical", 5.0, M, "full") == Verdict(VERIFIED, 5.0, M.digest(), "full")
    assert verdict_of_check("identical", 5.0, M, "stamp").state == VERIFIED
    assert verdict_of_check("identical", 5.0, M, "sample") is None
    bad = (PieceRange(1, PIECE, PIECE),)
    v = verdict_of_check("mismatch", 5.0, M, "sample", bad)
    assert v.state == MISMATCH and v.bad == bad
    with pytest.raises(ValueError):
        verdict_of_check("fine", 5.0, M, "full")


def test_standing_mismatch_is_about_this_manifest():
    v = Verdict(MISMATCH, 1.0, M.digest(), "full", (PieceRange(0, 0, PIECE),))
    other = Manifest(size=5, blake3="cd" * 32, piece_size=PIECE, pieces=("e",))
    assert standing_mismatch(v, M)
    assert not standing_mismatch(v, other)
    assert not standing_mismatch(Verdict(VERIFIED, 1.0, M.digest()), M)
    assert not standing_mismatch(None, M) and not standing_mismatch(v, None)


def test_mismatch_text():
    v = Verdict(MISMATCH, 1.0, M.digest(), "full", (PieceRange(0, 0, PIECE),))
    assert mismatch_text(v, "2026-01-02 03:04") == "mismatch (1 bad piece, found 2026-01-02 03:04)"
    sized = Verdict(MISMATCH, 1.0, M.digest(), "full", (), "size 3 bytes, manifest says 4")
    assert mismatch_text(sized, "t") == "mismatch (size 3 bytes, manifest says 4, found t)"


def test_verdicts_round_trip_and_keys():
    vs = {"/r/a": Verdict(MISMATCH, 12.5, "d" * 32, "full", (PieceRange(2, 2 * PIECE, PIECE),)),
          "/r/b": Verdict("missing", 13.0, "d" * 32, "full", (), "no such file")}
    doc = json.loads(json.dumps(verdicts_to_doc(vs)))
    assert set(doc) == {"schema", "kind", "members"} and doc["kind"] == "verdicts" and doc["schema"] == 1
    assert set(doc["members"]["/r/a"]) == {"state", "at", "manifest", "how", "detail", "bad"}
    assert verdicts_from_doc(doc, "v.json") == vs


def test_scrub_marks_round_trip_and_resume_point():
    key = (10, 20, 30, 40)
    marks = {"/r/a": ScrubMark(M.digest(), key, 2, (1,))}
    doc = json.loads(json.dumps(scrub_to_doc(marks)))
    assert doc["kind"] == "scrub" and scrub_from_doc(doc, "s.json") == marks
    assert resume_point(marks["/r/a"], M, key) == (2, (1,))
    assert resume_point(marks["/r/a"], M, (10, 21, 30, 40)) == (0, ())         # the file changed
    other = Manifest(size=5, blake3="cd" * 32, piece_size=PIECE, pieces=("e",))
    assert resume_point(marks["/r/a"], other, key) == (0, ())                   # another manifest
    assert resume_point(None, M, key) == (0, ())
    assert resume_point(ScrubMark(M.digest(), key, 99, (1, 7)), M, key) == (M.count, (1,))
    with pytest.raises(Exception, match="s.json"):
        scrub_from_doc({"members": {"/r/a": {"manifest": "x", "done": -1, "identity": [1, 2, 3, 4]}}}, "s.json")



def test_manifest_of_the_rig_is_what_verdicts_name(synced):
    rig, data, paths = synced
    r = rigmod.load_rig(rig)
    # A verdict is about one file: it names that file's manifest, not the model digest.
    (only,) = load_manifest(r).files
    assert {v.manifest for v in load_verdicts(r).values()} == {only.digest()}


def test_a_member_rolls_its_files_up():
    assert rollup_state(["identical", "identical"]) == "identical"
    assert rollup_state(["identical", "missing", "unreadable"]) == "missing"
    assert rollup_state(["missing", "mismatch"]) == "mismatch"          # exit 1 outranks exit 3
    assert rollup_state(["verified", "stale", "unverified"], STATUS_ORDER) == "stale"
    with pytest.raises(ValueError):
        rollup_state(["bogus"])
    a = Verdict(MISMATCH, 5.0, "m1", "full", (PieceRange(0, 0, 10),))
    b = Verdict(MISMATCH, 7.0, "m2", "full", (PieceRange(2, 20, 10), PieceRange(3, 30, 4)))
    ok = Verdict(VERIFIED, 9.0, "m3", "full")
    assert rollup_verdict([a]) == a                                      # one file: its own verdict
    assert rollup_verdict([None, None]) is None
    both = rollup_verdict([a, ok, b])
    assert (both.state, both.at, both.detail) == (MISMATCH, 7.0, "2 files mismatch")
    assert both.bad == a.bad + b.bad
    assert rollup_verdict([ok, None]).state == VERIFIED


def test_the_checks_are_pure_and_roll_up():
    assert impure_imports(checks) == []
    good = FileCheck("a", "/m/a", "identical", "stamp", size=3)
    bad = FileCheck("b", "/m/b", "mismatch", "full", bad=(PieceRange(1, 64, 64),), size=200, bytes_read=200,
                    detail="x", pieces_checked=4)
    gone = FileCheck("c", "/m/c", "missing", "full", detail="no such file")
    m = MemberCheck("/m", "green", "replica", (good, bad, gone))
    assert (m.state, m.how, m.size, m.bytes_read, m.pieces_checked) == ("mismatch", "stamp+full", 203, 200, 4)
    assert m.bad == (FilePiece("b", 1, 64, 64),)
    assert m.detail == "b: x; c: no such file"
    assert VerifyReport((m,), 1.0).exit_code == 1
    assert VerifyReport((MemberCheck("/m", "g", "replica", (good, gone)),), 1.0).exit_code == 3
    assert VerifyReport((MemberCheck("/m", "g", "replica", (good,)),), 1.0).exit_code == 0
