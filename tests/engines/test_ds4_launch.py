"""ds4-argodrive's verdict on a launch log (engines.ds4_argodrive.ds4_profile, pure): every
confirmation, on captured text; a source the plan leaves idle is expected to serve nothing."""

import pytest

from engines.ds4_argodrive.ds4_profile import ReaderExpectation, expect, judge
from engines.handoff import Request

# Lines as the ds4-argodrive engine prints them (its reader's fprintf formats).
GOOD3 = """\
ds4: Argodrive primary expert descriptor F_NOCACHE=1; mmap/Engram descriptor unchanged
ds4: experimental Argodrive expert reader sources=3; Engram unchanged
ds4: Argodrive decode split 10,6,6 (prefill keeps the base weights)
ds4: Argodrive selective prefill staging for chunks <= 512 tokens
ds4:   streaming expert cache budget=4600 experts entries=4600 expert=19.00 MiB target=85.35 GiB live=85.35 GiB, hits=100 misses=20 hit_rate=0.833
ds4: Argodrive source[0] bytes=1200000000
ds4: Argodrive source[1] bytes=700000000
ds4: Argodrive source[2] bytes=690000000
ds4: Argodrive source[0] lands_last=10 gap_ns=100 reads=50
"""  # noqa: E501 (the engine's log line, verbatim)
E3 = ReaderExpectation(sources=3, decode_split="10,6,6", cache_experts=4600, prefill_split=True)


def verdict(text, expect=E3, rc=0):
    return {c.name: c for c in judge(text, expect, rc)}


def failed(text, expect=E3, rc=0):
    return [c.name for c in judge(text, expect, rc) if not c.ok]


def test_a_complete_log_confirms_everything():
    v = verdict(GOOD3)
    assert all(c.ok for c in v.values())
    assert list(v) == ["exit", "sources", "decode-split", "source-bytes", "cache-budget", "prefill-staging"]
    assert v["sources"].observed == "3" and v["decode-split"].observed == "10,6,6"
    assert v["source-bytes"].observed == "0:1200000000,1:700000000,2:690000000"
    assert v["cache-budget"].observed == "4600"


@pytest.mark.parametrize("rc, seen, why", [(1, "1", "exited with code 1"), (-9, "-9", "killed by signal 9"),
                                           (None, "timeout", "stopped after the timeout")])
def test_exit_status(rc, seen, why):
    c = verdict(GOOD3, rc=rc)["exit"]
    assert not c.ok and c.observed == seen and why in c.detail


def test_sources_line_missing_or_wrong():
    text = GOOD3.replace("expert reader sources=3; Engram unchanged\n", "")
    assert failed(text) == ["sources"]
    assert "did not open the split reader" in verdict(text)["sources"].detail
    c = verdict(GOOD3.replace("sources=3", "sources=2"))["sources"]
    assert not c.ok and c.detail == "engine opened 2 sources, 3 requested"


def test_decode_split_missing_ignored_or_different():
    assert failed(GOOD3.replace("ds4: Argodrive decode split 10,6,6 (prefill keeps the base weights)\n", "")) == ["decode-split"]
    ignored = GOOD3.replace("ds4: Argodrive decode split 10,6,6 (prefill keeps the base weights)",
                            "ds4: ignoring DS4_ARGODRIVE_DECODE_WEIGHTS=10,6 (want 3 comma-separated weights 1..100)")
    c = verdict(ignored)["decode-split"]
    assert not c.ok and "ignored DS4_ARGODRIVE_DECODE_WEIGHTS=10,6" in c.detail
    c = verdict(GOOD3.replace("decode split 10,6,6", "decode split 10,5,5"))["decode-split"]
    assert not c.ok and c.observed == "10,5,5"


def test_a_decode_split_with_blanks_is_the_same_split():
    spaced = GOOD3.replace("decode split 10,6,6", "decode split 10, 6, 6")
    assert verdict(spaced)["decode-split"].ok
    assert verdict(spaced, ReaderExpectation(sources=3, decode_split="10, 6, 6", cache_experts=4600,
                                       prefill_split=True))["decode-split"].ok


def test_a_rejected_replica_configuration_is_named_as_such():
    # The reader refused its configuration: no reader line, bytes=0 from every source it had opened.
    rejected = "\n".join(line for line in GOOD3.splitlines()
                         if "sources=3" not in line and "bytes=" not in line and "decode split" not in line)
    rejected += "\nds4: Argodrive source[0] bytes=0\nds4: Argodrive source[1] bytes=0\n"
    v = verdict(rejected)
    for name in ("sources", "source-bytes"):
        assert not v[name].ok and v[name].detail.startswith("the engine rejected the replica configuration")
        assert "read 0 bytes" not in v[name].detail
    assert v["sources"].observed == "rejected"


def test_source_bytes_missing_zero_extra_and_summed():
    no_bytes = verdict(GOOD3.replace("ds4: Argodrive source[2] bytes=690000000\n", ""))["source-bytes"]
    assert "source[2] reported no bytes" in no_bytes.detail
    zero = verdict(GOOD3.replace("source[1] bytes=700000000", "source[1] bytes=0"))["source-bytes"]
    assert "source[1] read 0 bytes" in zero.detail
    extra = GOOD3 + "ds4: Argodrive source[3] bytes=5\n"
    assert "source[3] was not requested" in verdict(extra)["source-bytes"].detail
    # Two reader sessions: the first read nothing from source 1, the second did; the total counts.
    two = GOOD3 + "ds4: Argodrive source[0] bytes=1\nds4: Argodrive source[1] bytes=0\nds4: Argodrive source[2] bytes=1\n"
    assert verdict(two)["source-bytes"].ok


def test_cache_budget_missing_reduced_or_capped():
    budget = "ds4:   streaming expert cache budget=4600 experts"
    assert "unconfirmed" in verdict(GOOD3.replace(budget, "ds4:   something else"))["cache-budget"].detail
    c = verdict(GOOD3.replace(budget, "ds4:   streaming expert cache budget=3900 experts"))["cache-budget"]
    assert not c.ok and c.detail == "engine reduced the expert cache to 3900 of 4600 experts"
    c = verdict(GOOD3 + "ds4: using locked cache cap: 4000 experts\n")["cache-budget"]
    assert not c.ok and "capped" in c.detail
    c = verdict(GOOD3 + "ds4: Argodrive decode cache requested=4600 effective=4100 reserve_bytes=0\n")["cache-budget"]
    assert not c.ok and "4100 of 4600" in c.detail
    assert verdict(GOOD3 + "ds4: Argodrive decode cache requested=4600 effective=4600 reserve_bytes=0\n")["cache-budget"].ok
    assert "cache-budget" not in verdict(GOOD3, ReaderExpectation(sources=3, decode_split="10,6,6"))


def test_prefill_rejection_fails_only_when_staging_was_requested():
    text = GOOD3 + "ds4: Argodrive prefill stage rejected: reader invalid=0 sources=1\n"
    c = verdict(text)["prefill-staging"]
    assert not c.ok and "reader invalid=0 sources=1" in c.detail
    assert verdict(text, ReaderExpectation(sources=3, decode_split="10,6,6", cache_experts=4600))["prefill-staging"].ok


def test_single_source_needs_no_reader_lines_but_checks_them_when_present():
    e1 = ReaderExpectation(sources=1, cache_experts=3600)
    log = "ds4:   streaming expert cache budget=3600 experts entries=1\n"
    v = verdict(log, e1)
    assert all(c.ok for c in v.values()), v
    assert failed(log + "ds4: experimental Argodrive expert reader sources=2; Engram unchanged\n", e1) == ["sources"]
    assert failed(log + "ds4: Argodrive source[0] bytes=0\n", e1) == ["source-bytes"]


# ---------------------------------------------------------------------------------------------
# Expected-idle sources: a plan may give a source no blocks in a phase

IDLE2 = GOOD3.replace("source[2] bytes=690000000", "source[2] bytes=0")


def test_a_source_the_plan_leaves_idle_in_both_phases_may_serve_nothing():
    e = ReaderExpectation(sources=3, decode_split="10,6,6", cache_experts=4600, prefill_split=True,
                    idle=((), (), ("prefill", "decode")))
    c = verdict(IDLE2, e)["source-bytes"]
    assert c.ok and "source[2] served 0 bytes, expected idle: the plan gives it nothing in prefill and decode" in c.detail
    assert c.expected == "3 sources > 0 (idle: source[2] in prefill and decode)"
    # ... and a source it gives bytes still fails when it reads nothing
    c = verdict(IDLE2.replace("source[1] bytes=700000000", "source[1] bytes=0"), e)["source-bytes"]
    assert not c.ok and "source[1] read 0 bytes" in c.detail and "source[2] served 0 bytes, expected idle" in c.detail


def test_a_source_idle_in_one_phase_that_served_nothing_is_not_a_failure():
    # a run's counters add both phases; a run that only decoded reads nothing from a source the
    # plan leaves idle in decode
    e = ReaderExpectation(sources=3, decode_split="10,6,6", idle=((), (), ("decode",)))
    c = verdict(IDLE2, e)["source-bytes"]
    assert c.ok and "expected idle: the plan gives it nothing in decode" in c.detail
    # with bytes it is simply a source that delivered
    assert verdict(GOOD3, e)["source-bytes"].detail == "every source delivered bytes"


def test_an_idle_source_that_read_bytes_is_said_but_not_failed():
    e = ReaderExpectation(sources=3, decode_split="10,6,6", idle=((), (), ("prefill", "decode")))
    c = verdict(GOOD3, e)["source-bytes"]
    assert c.ok and "source[2] read 690000000 bytes though the plan gives it nothing in prefill and decode" in c.detail


def test_a_missing_line_or_a_rejected_configuration_fails_even_for_an_idle_source():
    e = ReaderExpectation(sources=3, decode_split="10,6,6", idle=((), (), ("prefill", "decode")))
    c = verdict(GOOD3.replace("ds4: Argodrive source[2] bytes=690000000\n", ""), e)["source-bytes"]
    assert not c.ok and "source[2] reported no bytes" in c.detail
    rejected = "ds4: Argodrive source[0] bytes=0\nds4: Argodrive source[1] bytes=0\nds4: Argodrive source[2] bytes=0\n"
    assert verdict(rejected, e)["source-bytes"].detail.startswith("the engine rejected the replica configuration")


def test_the_expectation_a_request_gives():
    env = {"DS4_ARGODRIVE_DECODE_WEIGHTS": "10, 6, 6", "DS4_ARGODRIVE_PREFILL_SPLIT": "1"}
    r = Request(paths=("/a", "/b", "/c"), prefill=(10, 5, 5), decode=(10, 6, 6), cache_experts=4600,
                idle=((), (), ("decode",)))
    assert expect(r, env) == ReaderExpectation(sources=3, decode_split="10,6,6", cache_experts=4600, prefill_split=True,
                                         idle=((), (), ("decode",)))
    assert expect(Request(paths=("/a",), prefill=(1,), decode=()), {}) == ReaderExpectation(sources=1)
