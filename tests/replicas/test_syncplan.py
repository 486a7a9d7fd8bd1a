"""What sync decides before a byte is written (pure): each destination's plan, space, pieces,
and the one refusal for a source that changed during the copy."""

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import MismatchError, UsageError, WriteError
from core.fsutil import FileIdentity
from replicas import sync, syncplan
from core.constants import ALIGNMENT, IO_BLOCK
from replicas.constants import HEADROOM_MAX, HEADROOM_MIN
from replicas.manifest import PieceRange, piece_count
from replicas.syncplan import (
    ADOPT,
    COPY,
    NOOP,
    REPLACE,
    RESTART_REASON,
    RESUME,
    DestPlan,
    DestResult,
    ExistingTarget,
    PartialState,
    SyncResult,
    blocks_per_piece,
    blocks_to_read,
    bytes_to_write,
    check_space,
    copy_block,
    drive_clash,
    headroom,
    identity_change,
    partial_plan,
    piece_bytes,
    piece_differs,
    pieces_to_read,
    source_changed,
    space_needed,
    target_plan,
    write_error_text,
)
from tests.helpers import impure_imports

MiB = 1 << 20
T = "/d/model.gguf"


def test_the_module_is_pure():
    assert impure_imports(syncplan) == []
    assert any(x.endswith(": os") for x in impure_imports(sync))   # the check sees the I/O around it


def plan_for(existing, replace=False, size=100):
    return target_plan("/d", T, existing, size, replace)


def test_what_is_at_the_target_decides_first():
    assert plan_for(None).action == COPY
    assert plan_for(ExistingTarget(regular=True, size=100, verified=True)).action == NOOP
    # a verified replica stays a no-op even with --replace: it is already what --replace would write
    assert plan_for(ExistingTarget(regular=True, size=5, verified=True), replace=True).action == NOOP
    assert plan_for(ExistingTarget(regular=True, size=5, verified=False), replace=True).action == REPLACE
    adopt = plan_for(ExistingTarget(regular=True, size=100, verified=False))
    assert adopt.action == ADOPT and not adopt.writes and "verifying" in adopt.reason
    with pytest.raises(UsageError, match=r"differs from the source \(size 5 vs 100\); pass --replace"):
        plan_for(ExistingTarget(regular=True, size=5, verified=False))
    with pytest.raises(UsageError, match="not a regular file"):
        plan_for(ExistingTarget(regular=False, size=0, verified=True), replace=True)


def test_a_partial_left_behind_resumes_restarts_or_is_refused():
    fresh = plan_for(None)
    with pytest.raises(UsageError, match="not written by replicas"):
        partial_plan(fresh, PartialState(ours=False, same_source=False))
    restart = partial_plan(fresh, PartialState(ours=True, same_source=False, durable=frozenset({1, 2})))
    assert restart.action == COPY and restart.durable == frozenset() and restart.reason == RESTART_REASON
    resume = partial_plan(fresh, PartialState(ours=True, same_source=True, durable=frozenset({0, 3})))
    assert resume.action == RESUME and resume.durable == {0, 3} and "2 pieces already durable" in resume.reason
    replace = partial_plan(plan_for(ExistingTarget(True, 5, False), replace=True),
                           PartialState(ours=True, same_source=True, durable=frozenset({0})))
    assert replace.action == REPLACE and replace.durable == {0}
    assert partial_plan(fresh, PartialState(ours=True, same_source=True)) == fresh
    assert resume.partial == T + ".partial" and resume.journal == T + ".partial.journal"


def test_who_already_sits_on_the_drive():
    members = {"/x/model.gguf": "disk-b", "/d/model.gguf": "disk-d"}
    assert drive_clash("disk-a", "disk-a", {}, members, T, "/src/m") == "the source /src/m"
    assert drive_clash("disk-c", "disk-a", {"disk-c": "/e"}, members, T, "/src/m") == "destination /e"
    assert drive_clash("disk-b", "disk-a", {}, members, T, "/src/m") == "replica /x/model.gguf"
    # the replica being refreshed is not in its own way
    assert drive_clash("disk-d", "disk-a", {}, members, T, "/src/m") is None
    assert drive_clash("disk-z", None, {}, members, T, "/src/m") is None


def test_headroom_and_space():
    assert headroom(1) == HEADROOM_MIN
    assert headroom(10_000 * MiB) == 100 * MiB          # 1 %
    assert headroom(10**15) == HEADROOM_MAX
    size = 10_000 * MiB
    # two destinations on one file system, one already holding 4,000 MiB of its partial
    assert space_needed(size, [0, 4_000 * MiB]) == size + 6_000 * MiB + 2 * headroom(size)
    assert space_needed(size, [size + 1]) == headroom(size)   # never negative
    check_space(["/a"], 10, 10)
    with pytest.raises(WriteError, match="not enough free space on /a, /b") as e:
        check_space(["/a", "/b"], 11, 10)
    assert e.value.exit_code == 4


def test_piece_bookkeeping():
    size, piece = 9 * MiB + 12345, MiB
    assert piece_bytes(range(piece_count(size, piece)), size, piece) == size
    assert piece_bytes({9}, size, piece) == 12345
    resume = DestPlan("/d", T, RESUME, frozenset({0, 9}))
    assert bytes_to_write(resume, size, piece) == size - MiB - 12345
    assert bytes_to_write(DestPlan("/d", T, ADOPT), size, piece) == 0
    assert pieces_to_read(10, False, []) == set(range(10))               # the manifest is still to compute
    assert pieces_to_read(10, True, [{1, 2}, {2, 7}]) == {1, 2, 7}
    assert pieces_to_read(10, True, []) == set()


def test_copy_block_divides_the_piece():
    assert copy_block(MiB) == MiB
    assert copy_block(IO_BLOCK) == IO_BLOCK
    assert copy_block(64 * MiB) == IO_BLOCK
    assert copy_block(24 * MiB) == 12 * MiB
    assert copy_block(4099 * ALIGNMENT) == ALIGNMENT              # a prime count of units
    for p in (MiB, 24 * MiB, 64 * MiB, 100 * MiB + 4 * ALIGNMENT):
        b = copy_block(p)
        assert p % b == 0 and b % ALIGNMENT == 0 and b <= IO_BLOCK


@given(size=st.integers(1, 40 * 4096), units=st.integers(1, 12), data=st.data())
def test_blocks_cover_the_pieces_exactly_one_piece_each(size, units, data):
    piece = units * 4096
    block = data.draw(st.sampled_from([b for b in range(4096, piece + 1, 4096) if piece % b == 0]))
    n = piece_count(size, piece)
    pieces = data.draw(st.sets(st.integers(0, n - 1)))
    blocks = list(blocks_to_read(pieces, size, piece, block))
    assert sum(length for _, length in blocks) == piece_bytes(pieces, size, piece)
    assert [off for off, _ in blocks] == sorted(off for off, _ in blocks)
    for off, length in blocks:
        assert off // piece == (off + length - 1) // piece and off // piece in pieces
    per_piece = blocks_per_piece(pieces, size, piece, block)
    assert sum(per_piece.values()) == len(blocks)


def test_identity_changes_in_words():
    before = FileIdentity(size=100, mtime_ns=5, inode=7, device=1)
    assert identity_change(before, FileIdentity(100, 5, 7, 2)) is None          # device numbers change on re-plug
    assert identity_change(before, FileIdentity(100, 6, 7, 1)) == "its modification time changed"
    assert identity_change(before, FileIdentity(90, 6, 7, 1)) == "its size went from 100 to 90 bytes"
    assert "replaced by another file" in identity_change(before, FileIdentity(100, 5, 8, 1))


def test_one_refusal_for_a_changed_source():
    e = source_changed("/src/m", "its modification time changed")
    assert isinstance(e, MismatchError) and e.exit_code == 1
    assert str(e).startswith("source /src/m: the source changed during the copy (its modification time changed); ")
    assert "no replica was renamed" in str(e) and "\n" not in str(e)
    why = piece_differs(PieceRange(3, 3 * MiB, MiB))
    assert "piece 3 (bytes 3145728+1048576)" in why and "replicas verify --full" in why
    assert syncplan.SOURCE_CHANGED in str(source_changed("/src/m", why))


def test_write_errors_say_what_the_errno_means():
    assert write_error_text(OSError(errno.ENOSPC, "No space left on device")) == \
        "write failed: No space left on device (the drive is full)"
    assert "RLIMIT_FSIZE" in write_error_text(OSError(errno.EFBIG, "File too large"))
    assert write_error_text(OSError(errno.EAGAIN, "Try again")) == "write failed: Try again"
    assert write_error_text(RuntimeError("odd")) == "odd"


def test_a_mismatch_outranks_other_failures():
    def result(*codes):
        return SyncResult("s", 1, "", 1, tuple(DestResult("/d", T, COPY, "x", exit_code=c) for c in codes), 0, 0.0)

    assert result(0, 0).exit_code == 0
    assert result(4, 1, 0).exit_code == 1
    assert result(4, 3).exit_code == 4
