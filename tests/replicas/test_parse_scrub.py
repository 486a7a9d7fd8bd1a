"""A scrub also parses (docs/replicas.md): sync's read-back, `verify --full` and repair report a
file whose bytes match the manifest but which does not parse as its format (a GGUF cut short, a
garbled safetensors header) as `broken`, exit 1, per file; a whole model parses."""

import json
import struct

from models.modelset import discover
from replicas.sync import sync
from tests.helpers import write_safetensors_dir, write_split_gguf
from tests.replicas.helpers import SET_PIECE, invoke, model_rig


def broken_rig(tmp_path, kind):
    """A model damaged before anything was hashed (so its bytes are the manifest's), synced to
    'green': (rig, the sync result, [primary, replica] paths)."""
    if kind == "gguf":
        src = write_split_gguf(tmp_path / "internal", "moe", 1, tensors_per_part=3, tensor_bytes=100_000, seed=4)[0]
        data = src.read_bytes()
        src.write_bytes(data[:-1000])                     # the download stopped short of the last tensor's end
    else:
        d = write_safetensors_dir(tmp_path / "s", 1, shard_bytes=100_000, tensors_per_shard=2, seed=4)
        src = tmp_path / "internal" / "model.safetensors"
        src.parent.mkdir()
        raw = bytearray((d / "model-00001-of-00001.safetensors").read_bytes())
        (n,) = struct.unpack("<Q", raw[:8])
        raw[8 + n // 2] = 0                               # a NUL in the middle of the JSON header
        src.write_bytes(bytes(raw))
    rig = str(tmp_path / "rig")
    assert invoke("init", "--rig", rig, "--model", str(src), "--name", "internal").exit_code == 0
    (tmp_path / "green").mkdir()
    res = sync(str(src), [str(tmp_path / "green")], rig, piece_size=SET_PIECE, allow_same_device=True)
    return rig, res, [str(src), str(tmp_path / "green" / src.name)]


def test_sync_copies_a_model_that_does_not_parse_and_says_so(tmp_path):
    for kind, fmt in (("gguf", "gguf"), ("safetensors", "safetensors")):
        rig, res, (src, copy) = broken_rig(tmp_path / kind, kind)
        assert res.exit_code == 1
        f = res.dests[0].files[0]
        assert (f.outcome, f.parses, f.verified, f.exit_code) == ("copied", False, False, 1)
        assert f"does not parse as {fmt}" in f.error and "the source has the same bytes" in f.error
        with open(src, "rb") as a, open(copy, "rb") as b:
            assert a.read() == b.read()                  # the copy is faithful, under its final name
        st = invoke("status", "--rig", rig, "--json")
        assert st.exit_code == 1
        assert [m["state"] for m in json.loads(st.stdout)["members"]] == ["broken", "broken"]


def test_verify_full_reports_identical_bytes_that_do_not_parse(tmp_path):
    rig, _, (src, copy) = broken_rig(tmp_path, "gguf")
    r = invoke("verify", "--rig", rig, "--full", "--json")
    assert r.exit_code == 1
    for m in json.loads(r.stdout)["members"]:
        assert m["state"] == "broken" and m["bad"] == []                 # no piece differs
        (f,) = m["files"]
        assert (f["state"], f["parsed"], f["parses"], f["stamped"]) == ("broken", "gguf", False, None)
        assert f["detail"].startswith("identical to the manifest, but does not parse as gguf: ")
    text = invoke("verify", "--rig", rig, "--full")
    assert text.exit_code == 1 and f"{copy}: broken: identical to the manifest" in text.stderr
    # Nothing a re-copy can mend: every copy has these bytes.
    rep = invoke("repair", copy, "--rig", rig)
    assert rep.exit_code == 1 and "nothing a re-copy can mend; broken" in rep.stdout


def test_a_whole_model_parses_file_by_file(tmp_path):
    for kind in ("split", "dir"):
        rig, paths = model_rig(tmp_path / kind, kind)
        r = invoke("verify", "--rig", rig, "--full", "--json")
        assert r.exit_code == 0, r.output
        model = discover(paths[0])
        for m in json.loads(r.stdout)["members"]:
            assert m["state"] == "identical"
            parsed = {f["file"]: (f["parsed"], f["parses"]) for f in m["files"]}
            for rel in model.files:
                if rel.endswith(".gguf"):
                    assert parsed[rel] == ("gguf", True)
                elif rel.endswith(".safetensors"):
                    assert parsed[rel] == ("safetensors", True)
                else:                                     # config, tokenizer, index: nothing to parse
                    assert parsed[rel] == (None, None)
        # quick verify trusts the stamps and parses nothing
        q = json.loads(invoke("verify", "--rig", rig, "--json").stdout)
        assert all(f["parses"] is None for m in q["members"] for f in m["files"])
