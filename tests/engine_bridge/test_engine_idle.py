"""No silent idle drive: which source read nothing in a phase, and whether the engine's reads or the run is why."""

from engine_bridge.moe import idle
from engine_bridge.moe.idle import idle_sources, plan_shares
from engines.ds4_argodrive import BLOCK_BYTES
from tests.helpers import impure_imports

COMPONENT = 557_056               # 2 blocks + 32 KiB: at 2:1:1 ds4 cuts it 1 / 1 / 0 blocks
PATHS = ("/i/m.gguf", "/g/m.gguf", "/w/m.gguf")


def _phase(reads, largest, delivered, given):
    return {"reads": reads, "bytes": reads * largest, "largest_read": largest,
            "sources": [{"index": i, "bytes": b, "reads": 1 if b else 0, "given_bytes": g, "given_pieces": 1 if g else 0}
                        for i, (b, g) in enumerate(zip(delivered, given))]}


W = {"prefill": [2, 1, 1], "decode": [2, 1, 1]}
PRE = _phase(4, 4 * COMPONENT, [9, 9, 9], [9, 9, 9])
DEC = _phase(10, COMPONENT, [10 * (COMPONENT - BLOCK_BYTES), 10 * BLOCK_BYTES, 0], [1, 1, 0])


def test_a_source_the_engines_reads_give_nothing_is_a_note():
    out = idle_sources({"prefill": PRE, "decode": DEC}, W, PATHS)
    assert len(out) == 1
    e = out[0]
    assert set(e) == {"phase", "source", "path", "kind", "by", "planned_share", "message"}
    assert (e["phase"], e["source"], e["path"], e["kind"], e["by"], e["planned_share"]) == \
        ("decode", 2, PATHS[2], "split", "weights", None)
    assert e["message"] == ("source[2] read nothing in decode: the engine's reads at 2:1:1 gave it nothing in the 10 reads "
                            "of the phase")


def test_a_plan_that_gave_it_a_share_makes_it_a_flag():
    # a plan whose prediction gives source 2 a fifth of the bytes; this model's reads give it nothing
    planned = {"decode": {"shares": [0.6, 0.2, 0.2]}, "prefill": None}
    [e] = idle_sources({"prefill": PRE, "decode": DEC}, W, PATHS, planned=planned)
    assert (e["kind"], e["by"], e["planned_share"]) == ("unread", "plan", 0.2)
    assert "the plan gives it 20.0% of the phase's bytes, but the engine's reads of this model at 2:1:1 gave it nothing" \
        in e["message"] and "planner solve" in e["message"]
    # a plan whose own prediction leaves it out: the run did what was planned (expected idle)
    planned["decode"]["shares"] = [0.53, 0.47, 0.0]
    [e] = idle_sources({"prefill": PRE, "decode": DEC}, W, PATHS, planned=planned)
    assert (e["kind"], e["by"]) == ("split", "plan") and "as the plan predicted" in e["message"]


def test_pieces_given_but_read_by_others_and_degraded_sources_are_flags():
    dec = _phase(10, COMPONENT, [10 * COMPONENT, 0, 0], [COMPONENT, BLOCK_BYTES, 0])
    out = idle_sources({"decode": dec}, {"decode": [2, 1, 1]}, PATHS, degraded=[False, False, True])
    assert [(e["source"], e["kind"]) for e in out] == [(1, "unread"), (2, "unread")]
    assert "the engine's reads gave it 1 piece (262,144 B) that other sources read" in out[0]["message"]
    assert "degraded by the reader" in out[1]["message"]


def test_a_phase_that_read_nothing_has_no_idle_source():
    empty = _phase(0, 0, [0, 0, 0], [0, 0, 0])
    assert idle_sources({"prefill": empty, "decode": empty}, W, PATHS) == []
    assert idle_sources({}, W, PATHS) == []


def test_plan_shares_read_a_prediction_or_say_there_is_none():
    pred = {"sources": [{"name": "a", "bytes": 300.0}, {"name": "b", "bytes": 100.0}]}
    assert plan_shares(pred, 2) == {"shares": [0.75, 0.25]}
    assert plan_shares(pred, 3) is None                     # another source count
    assert plan_shares({}, 2) is None                       # a harness arm's plan: weights only
    assert plan_shares({"sources": [{"name": "a"}, {"bytes": "x"}]}, 2) is None
    assert plan_shares({"sources": [{"bytes": 0}, {"bytes": 0}]}, 2) == {"shares": [0.0, 0.0]}


def test_idle_is_pure():
    assert impure_imports(idle) == []
