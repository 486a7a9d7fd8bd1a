"""No silent idle drive: which source read nothing in a phase, and whether the split or the run is why."""

from engine_bridge.engine import idle
from engine_bridge.engine.idle import idle_sources, piece_of, plan_pieces
from engines.ds4_argodrive import BLOCK
from tests.helpers import impure_imports

COMPONENT = 557_056               # 2 blocks + 32 KiB
PATHS = ("/i/m.gguf", "/g/m.gguf", "/w/m.gguf")


def _phase(reads, largest, delivered, given):
    return {"reads": reads, "bytes": reads * largest, "largest_read": largest,
            "sources": [{"index": i, "bytes": b, "reads": 1 if b else 0, "given_bytes": g, "given_pieces": 1 if g else 0}
                        for i, (b, g) in enumerate(zip(delivered, given))]}


W = {"prefill": [2, 1, 1], "decode": [2, 1, 1]}
PRE = _phase(4, 4 * COMPONENT, [9, 9, 9], [9, 9, 9])


def test_the_split_gives_the_third_source_nothing_of_a_component_at_2_1_1():
    assert [piece_of(COMPONENT, [2, 1, 1], i).blocks for i in range(3)] == [1, 1, 0]
    dec = _phase(10, COMPONENT, [10 * (COMPONENT - BLOCK), 10 * BLOCK, 0], [1, 1, 0])
    out = idle_sources({"prefill": PRE, "decode": dec}, W, PATHS)
    assert len(out) == 1
    e = out[0]
    assert set(e) == {"phase", "source", "path", "kind", "by", "planned_bytes", "plan_read_bytes", "read_bytes",
                      "piece_bytes", "message"}
    assert (e["phase"], e["source"], e["path"], e["kind"], e["by"]) == ("decode", 2, PATHS[2], "split", "weights")
    assert (e["read_bytes"], e["piece_bytes"], e["planned_bytes"]) == (COMPONENT, 0, None)
    assert e["message"] == ("source[2] read nothing in decode: given nothing by the split: its piece of the phase's "
                            "largest read (557,056 B) at 2:1:1 is 0 blocks (0 B)")


def test_a_plan_that_gave_it_bytes_makes_it_a_flag():
    # solved for V4.1's 6,635,520 B component: 13 / 6 / 6 blocks; this model's reads give source 2 nothing
    planned = {"decode": {"pieces": [3_489_792, 1_572_864, 1_572_864], "read_bytes": 6_635_520}, "prefill": None}
    dec = _phase(10, COMPONENT, [10 * (COMPONENT - BLOCK), 10 * BLOCK, 0], [1, 1, 0])
    [e] = idle_sources({"prefill": PRE, "decode": dec}, W, PATHS, planned=planned)
    assert (e["kind"], e["by"], e["planned_bytes"], e["plan_read_bytes"]) == ("unread", "plan", 1_572_864, 6_635_520)
    assert "the plan gives it 1,572,864 B of each 6,635,520 B read, but the split gave it nothing" in e["message"]
    assert "planner solve" in e["message"]
    # a plan whose own prediction leaves it out: the run did what was planned
    planned["decode"]["pieces"] = [294_912, 262_144, 0]
    planned["decode"]["read_bytes"] = COMPONENT
    [e] = idle_sources({"prefill": PRE, "decode": dec}, W, PATHS, planned=planned)
    assert (e["kind"], e["by"]) == ("split", "plan") and "given nothing by the plan's split" in e["message"]


def test_pieces_given_but_read_by_others_and_degraded_sources_are_flags():
    dec = _phase(10, COMPONENT, [10 * COMPONENT, 0, 0], [COMPONENT, BLOCK, 0])
    out = idle_sources({"decode": dec}, {"decode": [2, 1, 1]}, PATHS, degraded=[False, False, True])
    assert [(e["source"], e["kind"]) for e in out] == [(1, "unread"), (2, "unread")]
    assert "the split gave it 1 pieces (262,144 B) that other sources read" in out[0]["message"]
    assert "degraded by the reader" in out[1]["message"]


def test_a_phase_that_read_nothing_has_no_idle_source():
    empty = _phase(0, 0, [0, 0, 0], [0, 0, 0])
    assert idle_sources({"prefill": empty, "decode": empty}, W, PATHS) == []
    assert idle_sources({}, W, PATHS) == []


def test_plan_pieces_reads_a_prediction_or_says_there_is_none():
    pred = {"sources": [{"name": "a", "blocks": 1, "bytes": 294_912}, {"name": "b", "blocks": 1, "bytes": 262_144}]}
    assert plan_pieces(pred, COMPONENT, 2) == {"pieces": [294_912, 262_144], "read_bytes": COMPONENT}
    assert plan_pieces(pred, COMPONENT, 3) is None          # another source count
    assert plan_pieces(pred, None, 2) is None               # no read size recorded
    assert plan_pieces({}, COMPONENT, 2) is None            # a harness arm's plan: weights only
    assert plan_pieces({"sources": [{"name": "a"}, {"bytes": "x"}]}, COMPONENT, 2) is None


def test_idle_is_pure():
    assert impure_imports(idle) == []
