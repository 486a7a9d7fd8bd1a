"""core.jsonfile: every way a rig JSON file can be wrong, and what read_json / parse_json say."""

import json
import os

import pytest

from core.errors import EXIT_MISSING, EXIT_USAGE, MissingError, RigError
from core.jsonfile import parse_json, read_json, write_json

FIX = "run `thing make`"


def read(path, **kw):
    return read_json(str(path), "thing", FIX, **kw)


def refused(exc_info, cls, code, path):
    """The error is exactly `cls`, has the exit code, and is one line naming the file and the fix."""
    e = exc_info.value
    assert type(e) is cls and e.exit_code == code
    msg = str(e)
    assert "\n" not in msg and msg.startswith(f"{path}: ") and msg.endswith(FIX)
    return msg


def test_a_good_document_comes_back_as_its_dict(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"kind": "thing", "schema": 2, "x": [1, 2]}))
    assert read(p, schema=2) == {"kind": "thing", "schema": 2, "x": [1, 2]}


def test_missing_is_exit_3(tmp_path):
    p = tmp_path / "nope.json"
    with pytest.raises(MissingError) as e:
        read(p)
    assert refused(e, MissingError, EXIT_MISSING, p) == f"{p}: no such thing file; {FIX}"


def test_a_directory_is_exit_2(tmp_path):
    with pytest.raises(RigError) as e:
        read(tmp_path)
    assert "is a directory, not a thing file" in refused(e, RigError, EXIT_USAGE, tmp_path)


@pytest.mark.parametrize("name", ["file.json/inner.json", "x" * 300 + ".json"])
def test_a_path_that_cannot_be_opened_is_exit_2(tmp_path, name):
    (tmp_path / "file.json").write_text("{}")
    p = tmp_path / name                  # through a regular file (ENOTDIR) / name too long (ENAMETOOLONG)
    with pytest.raises(RigError) as e:
        read(p)
    assert "cannot read the thing file (" in refused(e, RigError, EXIT_USAGE, p)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file anyway")
def test_an_unreadable_file_is_exit_2(tmp_path):
    p = tmp_path / "locked.json"
    p.write_text("{}")
    p.chmod(0)
    with pytest.raises(RigError) as e:
        read(p)
    assert "cannot read the thing file (Permission denied)" in refused(e, RigError, EXIT_USAGE, p)


@pytest.mark.parametrize("raw, says", [
    (b"\xff\xfe{}", "not UTF-8 text, so not a thing file"),
    (b"", "is empty, not a thing file"),
    (b" \n\t", "is empty, not a thing file"),
    (b'{"kind": "thing",\n "schema": }', "not valid JSON (Expecting value at line 2 column 12)"),
    (b"[" * 200_000, "JSON nested too deeply to be a thing file"),
    (b"[1, 2]", "expected a JSON object, found list, so not a thing file"),
    (b'"thing"', "expected a JSON object, found str"),
    (b'{"schema": 1}', "not a thing file (kind is None, expected 'thing')"),
    (b'{"kind": "plan", "schema": 1}', "not a thing file (kind is 'plan', expected 'thing')"),
    (b'{"kind": "thing", "schema": 2}', "thing schema 2 is not 1, the one this version reads"),
    (b'{"kind": "thing"}', "thing schema None is not 1"),
    (b'{"kind": "thing", "schema": true}', "thing schema True is not 1"),
    (b'{"kind": "thing", "schema": "1"}', "thing schema '1' is not 1"),
])
def test_bad_content_is_exit_2_with_what_is_wrong(tmp_path, raw, says):
    p = tmp_path / "bad.json"
    p.write_bytes(raw)
    with pytest.raises(RigError) as e:
        read(p, schema=1)
    assert says in refused(e, RigError, EXIT_USAGE, p)


def test_a_kind_in_a_message_is_quoted_safely_on_one_line(tmp_path):
    p = tmp_path / "odd.json"
    p.write_text(json.dumps({"kind": "line\nbreak"}))
    with pytest.raises(RigError) as e:
        read(p)
    assert "kind is 'line\\nbreak'" in refused(e, RigError, EXIT_USAGE, p)


def test_kind_key_none_reads_files_written_before_kinds(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"schema": 1, "size": 3}))
    assert read_json(str(p), "manifest", FIX, schema=1, kind_key=None) == {"schema": 1, "size": 3}
    # The schema is still checked without a kind.
    p.write_text(json.dumps({"schema": 2}))
    with pytest.raises(RigError, match="manifest schema 2 is not 1"):
        read_json(str(p), "manifest", FIX, schema=1, kind_key=None)


def test_another_kind_key_is_honoured(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"type": "thing"}))
    assert read(p, kind_key="type") == {"type": "thing"}
    p.write_text(json.dumps({"type": "plan", "kind": "thing"}))
    with pytest.raises(RigError, match=r"type is 'plan', expected 'thing'"):
        read(p, kind_key="type")


def test_without_a_schema_any_schema_passes(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"kind": "thing", "schema": 7}))
    assert read(p)["schema"] == 7


def test_what_names_the_file_in_messages_and_takes_the_right_article(tmp_path):
    p = tmp_path / "nope.json"
    with pytest.raises(MissingError, match="no such iobench result file"):
        read_json(str(p), "iobench", FIX, what="iobench result")
    with pytest.raises(RigError, match="is a directory, not an iobench result file"):
        read_json(str(tmp_path), "iobench", FIX, what="iobench result")
    p.write_text(json.dumps({"kind": "plan"}))
    with pytest.raises(RigError, match=r"not a routing trace file \(kind is 'plan', expected 'routing-trace'\)"):
        read_json(str(p), "routing-trace", FIX, what="routing trace")


def test_parse_json_checks_text_the_same_way_without_a_file():
    assert parse_json('{"kind": "thing"}', "where", "thing", FIX) == {"kind": "thing"}
    assert parse_json(b'{"kind": "thing"}', "where", "thing", FIX) == {"kind": "thing"}
    with pytest.raises(RigError, match=r"^where: not valid JSON \(Expecting"):
        parse_json("{", "where", "thing", FIX)
    with pytest.raises(RigError, match="^where: not UTF-8 text"):
        parse_json(b"\x80", "where", "thing", FIX)
    with pytest.raises(RigError, match="^where: thing schema 1 is not 2"):
        parse_json('{"kind": "thing", "schema": 1}', "where", "thing", FIX, schema=2)


def test_write_json_round_trips_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "out.json"
    doc = {"kind": "thing", "schema": 1, "text": "naïve ✓", "n": [1, 2.5, None]}
    assert write_json(str(p), doc) == str(p)
    assert read(p, schema=1) == doc
    assert p.read_text().endswith("\n") and os.listdir(tmp_path) == ["out.json"]
    write_json(str(p), {"kind": "thing", "v": 2}, indent=None)
    assert p.read_text() == '{"kind": "thing", "v": 2}\n'
