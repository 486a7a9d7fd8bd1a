"""Partial replicas (docs/replicas.md, "Partial replicas"): `sync --partial` chooses whole shards
by ranked miss bytes within a budget; the rig records what a member holds; verify, repair, status
and forget judge only those files (a file outside the member's set is never "missing"); a later
sync grows or shrinks the member without copying again what it keeps."""

import json
import os
import struct

import numpy as np
import pytest

from core import rig as rigmod
from core.jsonfile import write_json
from engine_bridge.moe.synth_colibri import ColibriSpec, synthesize_colibri
from models.usage import (COLI_USAGE, IKU1_MAGIC, MISSES, ROUTINGS, parse_coli_usage, split_history, usage_from_dict,
                          usage_of, usage_to_dict)
from replicas.partial import (BUDGET, NOTHING, SHARE, ExpertTable, ShardUse, choose_partial, coverage,
                              predicted_gain)
from tests.replicas.helpers import flip_byte, invoke

# 4 layers x 8 experts in 4 shards (one layer each), about 0.85 MB: every shard carries experts.
SPEC = ColibriSpec(layers=4, experts=8, top_k=2, dim=64, ff=64, vocab=300, shards=4, q_lora=64, kv_lora=64, seed=3)
SHARDS = tuple(f"out-{i:05d}.safetensors" for i in range(4))


@pytest.fixture
def model(tmp_path):
    """(rig dir, primary model dir, destination dir): the model on 'internal', a rig, an empty 'green'."""
    primary = str(tmp_path / "internal" / "moe")
    os.makedirs(os.path.dirname(primary))
    synthesize_colibri(primary, SPEC)
    rig = str(tmp_path / "rig")
    assert invoke("init", "--rig", rig, "--model", primary, "--name", "internal").exit_code == 0
    green = tmp_path / "green"
    green.mkdir()
    return rig, primary, str(green)


def partial_sync(rig, primary, dest, spec, *extra):
    r = invoke("sync", "--rig", rig, "--piece-size", "64K", "--allow-same-device", "--partial", spec, "--json",
               primary, dest, *extra)
    return r, json.loads(r.stdout) if r.stdout.strip().startswith("{") else None


def member(rig, name="green"):
    return rigmod.load_rig(rig).member(name)


def held_on_disk(dest):
    return sorted(n for n in os.listdir(os.path.join(dest, "moe")))


# -- the choice (pure) --------------------------------------------------------------------------

def table(experts, serves=None):
    """An ExpertTable of experts given as (file of each component, component bytes, rank, held)."""
    files = tuple(frozenset(fs) for fs, _, _, _ in experts)
    size = tuple(n * len(fs) for fs, n, _, _ in experts)

    def served(i, have):
        fs, n, _, _ = experts[i]
        return serves(fs, n, have) if serves else n * sum(f in have for f in fs)
    return ExpertTable(files, tuple(float(r) for _, _, r, _ in experts), tuple(float(h) for _, _, _, h in experts),
                       size, served)


def test_the_choice_adds_the_most_miss_bytes_per_byte_within_the_budget_and_skips_files_without_experts():
    uses = [ShardUse("config.json", 900, 0), ShardUse("a", 100, 90), ShardUse("b", 100, 90), ShardUse("c", 200, 180),
            ShardUse("d", 100, 90)]
    t = table([(("a",), 90, 10, 12), (("b",), 90, 50, 40), (("c",), 180, 30, 35), (("d",), 90, 5, 3)])
    c = choose_partial("/d", uses, t, 250, history="h")
    # b (45 per byte) first; c (27 per byte) no longer fits; a (9), then d does not fit
    assert c.holds == ("a", "b") and c.bytes == 200 and c.stop == BUDGET
    ranked = 10 * 90 + 50 * 90 + 30 * 180 + 5 * 90
    assert c.coverage_rank == pytest.approx((10 * 90 + 50 * 90) / ranked)
    assert c.coverage_held == pytest.approx(coverage(t, frozenset({"a", "b"}), "held"))
    assert c.gain is None and c.share is None


def test_the_choice_stops_at_the_bandwidth_share_and_predicts_the_gain():
    uses = [ShardUse(f"s{i}", 100, 100) for i in range(4)]
    t = table([((f"s{i}",), 100, w, w) for i, w in enumerate((40, 30, 20, 10))])
    # a drive a third as fast as the rest: its share is 25 %, reached by the hottest shard alone
    c = choose_partial("/d", uses, t, 10_000, share=0.25, b_rest=3e9, b_dest=1e9)
    assert c.holds == ("s0",) and c.stop == SHARE and c.coverage_held == pytest.approx(0.4)
    assert c.gain == pytest.approx(c.gain_full) == pytest.approx(1 / 3)
    assert predicted_gain(0.125, 3e9, 1e9) == pytest.approx(1 / (1 - 0.125) - 1)
    assert predicted_gain(0.0, 3e9, 1e9) == 0.0
    # a shard nobody missed is never worth its space
    c = choose_partial("/d", uses, table([((f"s{i}",), 100, w, w) for i, w in enumerate((40, 30, 0, 0))]), 10_000)
    assert c.holds == ("s0", "s1") and c.stop == NOTHING


def test_the_choice_follows_the_engines_rule_for_an_expert_that_straddles_shards():
    # colibri's GLM engine: the anchor (gate, first component) decides; without it nothing is served
    def anchor(fs, n, have):
        return 0 if fs[0] not in have else n * sum(f in have for f in fs)
    uses = [ShardUse("gates", 100, 100), ShardUse("rest", 100, 100)]
    t = table([(("gates", "rest"), 50, 1, 1), (("gates", "rest"), 50, 1, 1)], anchor)
    c = choose_partial("/d", uses, t, 100)
    assert c.holds == ("gates",) and c.coverage_held == pytest.approx(0.5)
    assert coverage(t, frozenset({"rest"})) == 0.0


def test_colibri_says_what_a_mirror_serves_by_each_family_members_rule(tmp_path):
    from engines.colibri import ENGINE
    from models.modelset import discover
    from models.tensortable import inspect_model
    from tests.models.geometry_helpers import write_moe_safetensors

    for model_type, expect in (("glm_moe_dsa", "anchor"), ("deepseek_v41", "tensor"), ("glm5_next", "expert")):
        d = write_moe_safetensors(tmp_path / model_type, layers=1, experts=2, shards=3,
                                  config={"model_type": model_type})
        g = inspect_model(discover(str(d)))
        ext = g.expert_ranges(0, 0)
        gate, other = frozenset({ext[0].file}), frozenset({x.file for x in ext[1:]} - {ext[0].file})
        full = sum(x.length for x in ext)
        assert ENGINE.replica_serves(g, 0, 0, frozenset(x.file for x in ext)) == full
        without_gate = ENGINE.replica_serves(g, 0, 0, other)
        with_gate = ENGINE.replica_serves(g, 0, 0, gate)
        if expect == "anchor":
            assert without_gate == 0 and with_gate == sum(x.length for x in ext if x.file in gate)
        elif expect == "tensor":
            assert without_gate == sum(x.length for x in ext if x.file in other) > 0
        else:
            assert without_gate == with_gate == 0


# -- usage history ------------------------------------------------------------------------------

def test_coli_usage_is_read_as_colibri_writes_it():
    text = b"-1 2 4\n-2 1 123456789\n0 1 5\n1 3 7\n0 1 2\n"
    u = parse_coli_usage(text, "x", 2, 4)
    assert u.kind == ROUTINGS and u.array().tolist() == [[0, 7, 0, 0], [0, 0, 0, 7]]
    # GLM keeps an extra (MTP) row; an empty one is dropped
    assert parse_coli_usage(b"-1 3 4\n0 0 1\n", "x", 2, 4).array().shape == (2, 4)
    # a legacy file has no dimensions: the model's are used
    assert parse_coli_usage(b"1 2 9\n", "x", 2, 4).array()[1, 2] == 9
    # inkling's IKU1: dense uint32 counts after magic and dimensions
    dense = np.arange(8, dtype="<u4")
    assert parse_coli_usage(struct.pack("<III", IKU1_MAGIC, 2, 4) + dense.tobytes(), "x", 2, 4).total == 28
    with pytest.raises(ValueError, match="2 layers x 5 experts"):
        parse_coli_usage(b"-1 2 5\n0 0 1\n", "x", 2, 4)


def test_the_held_out_split_alternates_records_or_splits_one_record_in_two():
    a = usage_of(np.array([[4, 0], [0, 8]]), MISSES, "run", "2026-01-01")
    b = usage_of(np.array([[0, 2], [6, 0]]), MISSES, "run", "2026-01-02")
    s = split_history([b, a], 2, 2)
    assert s.rank.tolist() == [[4, 0], [0, 8]] and s.held.tolist() == [[0, 2], [6, 0]] and s.records == 2
    one = split_history([usage_of(np.full((2, 2), 1000))], 2, 2)
    assert (one.rank + one.held).tolist() == [[1000, 1000], [1000, 1000]] and 0 < one.rank.sum() < 4000
    assert split_history([], 2, 2) is None
    assert usage_from_dict(usage_to_dict(a), "x") == a


# -- sync --partial, and the member everywhere ------------------------------------------------------

def test_partial_sync_copies_whole_shards_within_the_budget_and_the_rig_records_them(model):
    rig, primary, green = model
    r, doc = partial_sync(rig, primary, green, "50%")
    assert r.exit_code == 0, r.output
    (choice,) = doc["partial"]
    assert len(choice["holds"]) == 2 and set(choice["holds"]) <= set(SHARDS)
    assert choice["bytes"] <= choice["model_bytes"] // 2 and "no usage history yet" in choice["history"]
    assert "no usage history yet" in r.stderr
    assert held_on_disk(green) == sorted(choice["holds"])          # no config, tokenizer or other shard copied
    m = member(rig)
    assert m.partial and m.holds == tuple(sorted(choice["holds"]))
    files = {f["file"]: f["outcome"] for f in doc["destinations"][0]["files"]}
    assert {k for k, v in files.items() if v == "not held"} == set(rigmod.load_rig(rig).files) - set(m.holds)
    assert "holds = [" in open(os.path.join(rig, "rig.toml")).read()


def test_a_partial_member_verifies_and_a_file_outside_its_set_is_never_missing(model):
    rig, primary, green = model
    partial_sync(rig, primary, green, "50%")
    held = member(rig).holds
    for args in ((), ("--full",), ("--sample", "50", "--seed", "1")):
        r = invoke("verify", "--rig", rig, "--json", *args)
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        g = next(x for x in doc["members"] if x["name"] == "green")
        assert g["state"] == "identical" and sorted(f["file"] for f in g["files"]) == sorted(held)
    s = invoke("status", "--rig", rig, "--json")
    g = next(x for x in json.loads(s.stdout)["members"] if x["name"] == "green")
    assert sorted(f["file"] for f in g["files"]) == sorted(held) and g["state"] != "missing"


def test_a_partial_member_is_repaired_a_bad_piece_and_a_lost_shard(model):
    rig, primary, green = model
    partial_sync(rig, primary, green, "50%")
    a, b = member(rig).holds
    flip_byte(os.path.join(green, "moe", a), 70_000)
    os.unlink(os.path.join(green, "moe", b))
    r = invoke("verify", "--rig", rig, "--full", "--json")
    g = next(x for x in json.loads(r.stdout)["members"] if x["name"] == "green")
    states = {f["file"]: f["state"] for f in g["files"]}
    assert states == {a: "mismatch", b: "missing"} and r.exit_code == 1
    r = invoke("repair", "--rig", rig, "green")
    assert r.exit_code == 0, r.output
    assert held_on_disk(green) == sorted((a, b))                   # nothing outside the set was restored
    assert invoke("verify", "--rig", rig, "--full").exit_code == 0


def test_a_partial_member_grows_and_shrinks_without_copying_what_it_keeps(model):
    rig, primary, green = model
    _, small = partial_sync(rig, primary, green, "25%")
    (kept,) = member(rig).holds
    ino = os.stat(os.path.join(green, "moe", kept)).st_ino
    r, big = partial_sync(rig, primary, green, "75%")
    assert r.exit_code == 0, r.output
    grown = member(rig).holds
    assert kept in grown and len(grown) == 3 and held_on_disk(green) == sorted(grown)
    files = {f["file"]: f for f in big["destinations"][0]["files"]}
    assert files[kept]["action"] == "noop" and files[kept]["bytes_written"] == 0
    assert os.stat(os.path.join(green, "moe", kept)).st_ino == ino
    written = sum(f["bytes_written"] for f in files.values())
    assert written == sum(os.path.getsize(os.path.join(primary, f)) for f in grown if f != kept)
    # shrink: the copies it no longer holds are ours (verified, stamped), so they go
    r, shrunk = partial_sync(rig, primary, green, "25%")
    assert r.exit_code == 0, r.output
    assert member(rig).holds == (kept,) and held_on_disk(green) == [kept]
    assert sorted(shrunk["destinations"][0]["dropped"]) == sorted(set(grown) - {kept})
    assert invoke("verify", "--rig", rig, "--full").exit_code == 0


def test_a_file_the_member_no_longer_holds_is_kept_when_it_is_not_a_verified_copy_of_ours(model):
    rig, primary, green = model
    partial_sync(rig, primary, green, "75%")
    grown = member(rig).holds
    _, _ = partial_sync(rig, primary, green, "25%")
    (kept,) = member(rig).holds
    # the user puts a different file where a dropped shard was: a later shrink never removes it
    gone = sorted(set(grown) - {kept})[0]
    open(os.path.join(green, "moe", gone), "wb").write(b"mine")
    r, doc = partial_sync(rig, primary, green, "25%")
    assert r.exit_code == 0 and doc["destinations"][0]["dropped"] == []
    assert open(os.path.join(green, "moe", gone), "rb").read() == b"mine"


def test_a_full_sync_makes_a_partial_member_whole_again(model):
    rig, primary, green = model
    partial_sync(rig, primary, green, "25%")
    r = invoke("sync", "--rig", rig, "--piece-size", "64K", "--allow-same-device", primary, green)
    assert r.exit_code == 0, r.output
    assert not member(rig).partial
    assert invoke("verify", "--rig", rig, "--full").exit_code == 0


def test_usage_history_decides_which_shards_a_partial_replica_holds(model):
    rig, primary, green = model
    # two runs that missed mostly layer 2's experts (shard out-00002): ranked on one, checked on the other
    for i in range(2):
        counts = np.ones((SPEC.layers, SPEC.experts), dtype=np.int64)
        counts[2] = 50
        write_json(os.path.join(rig, "usage", f"2026010{i}T000000Z.json"),
                   usage_to_dict(usage_of(counts, MISSES, "engine-bridge run", f"2026-01-0{i}")))
    r, doc = partial_sync(rig, primary, green, "25%")
    assert r.exit_code == 0, r.output
    (c,) = doc["partial"]
    assert c["holds"] == ["out-00002.safetensors"] and c["coverage_held"] > 0.8
    assert "misses history, 2 records" in c["history"]


def test_colibri_usage_history_is_read_from_the_model_directory(model, tmp_path):
    rig, primary, green = model
    lines = ["-1 4 8", "-2 1 1"] + [f"1 {e} 400" for e in range(8)] + [f"{lay} 0 1" for lay in (0, 2, 3)]
    with open(os.path.join(primary, COLI_USAGE), "w") as f:
        f.write("\n".join(lines) + "\n")
    r, doc = partial_sync(rig, primary, green, "25%")
    assert r.exit_code == 0, r.output
    assert doc["partial"][0]["holds"] == ["out-00001.safetensors"] and "routings history" in doc["partial"][0]["history"]


def test_partial_refuses_a_budget_that_holds_no_shard_and_a_one_file_model(model, tmp_path):
    rig, primary, green = model
    r, _ = partial_sync(rig, primary, green, "100K")
    assert r.exit_code == 2 and "holds no shard" in r.stderr
    assert not os.listdir(green)


def test_forget_a_partial_member(model):
    rig, primary, green = model
    partial_sync(rig, primary, green, "50%")
    assert invoke("forget", "--rig", rig, "green").exit_code == 0
    assert len(rigmod.load_rig(rig).replicas) == 0
    assert held_on_disk(green)                     # its files are never touched


def test_rig_toml_refuses_a_holds_entry_that_is_not_a_model_file(model):
    rig, primary, green = model
    partial_sync(rig, primary, green, "50%")
    path = os.path.join(rig, "rig.toml")
    text = open(path).read().replace('holds = [', 'holds = [\n    "nope.safetensors",')
    open(path, "w").write(text)
    r = invoke("status", "--rig", rig)
    assert r.exit_code == 2 and "replica[0].holds" in r.stderr and "nope.safetensors" in r.stderr


def test_hash_of_a_partial_member_prints_the_files_it_holds_with_the_primarys_hashes(model):
    rig, primary, green = model
    partial_sync(rig, primary, green, "50%")
    held = member(rig).holds
    mine = invoke("hash", os.path.join(green, "moe")).stdout.splitlines()
    theirs = {line.split()[1].rsplit("/", 1)[1]: line.split()[0]
              for line in invoke("hash", primary).stdout.splitlines()}
    assert [line.split()[1].rsplit("/", 1)[1] for line in mine] == list(held)
    assert all(theirs[line.split()[1].rsplit("/", 1)[1]] == line.split()[0] for line in mine)


def test_the_choice_and_the_history_are_pure():
    import models.usage
    import replicas.partial
    from tests.helpers import impure_imports

    assert impure_imports(replicas.partial) == [] and impure_imports(models.usage) == []


def test_partial_auto_takes_the_free_space_less_a_reserve(model):
    rig, primary, green = model
    r, doc = partial_sync(rig, primary, green, "auto", "--dry-run")
    assert r.exit_code == 0, r.output
    (c,) = doc["partial"]
    free = os.statvfs(green).f_bavail * os.statvfs(green).f_frsize
    assert 0 < c["budget"] <= free and c["stop"] == "every shard" and c["holds"] == list(SHARDS)
    assert not os.listdir(green)                    # a dry run writes nothing
    r, _ = partial_sync(rig, primary, green, "150%")
    assert r.exit_code == 2 and "1%..100%" in r.stderr
