"""colibri's verdict on a launch log (engines.colibri.colibri_profile, pure), on lines copied from each
family member's formats: GLM (c/colibri.c), DeepSeek V4 (c/deepseek_v4.c), V4.1
(c/deepseek_v41.c) and GLM-5.3 (c/glm53.c). A drive the plan leaves idle is expected to serve
nothing; a member that prints no per-drive counters is confirmed by what it does print."""

import pytest

from engines.colibri.colibri_log import read_log, split_percents, split_shares
from engines.colibri.colibri_profile import MirrorExpectation, expect, judge, report_env
from engines.colibri.family import FAMILY
from engines.handoff import Request

E3 = MirrorExpectation(mirrors=("/g", "/w"), weights=(10, 5, 5))

LOAD = "[MIRROR] /g: 4/4 shards (replica 1)\n[MIRROR] /w: 4/4 shards (replica 2)\n"
GOOD = (LOAD + "[MIRROR] 3 drives | read split 50% / 25% / 25% (COLI_DISK_WEIGHTS)\n"
        "MIRROR: primary 2.00 GB (10 reads) | mirror1 1.00 GB (5 reads) | mirror2 1.00 GB (5 reads) "
        "\u2014 50% of expert bytes from the mirrors\n")


def verdict(text, e=E3, rc=0):
    return {c.name: c for c in judge(text, e, rc)}


def test_judgement_on_good_lines_and_each_way_to_fail():
    assert list(verdict(GOOD)) == ["exit", "mirrors", "weights", "served"]
    assert all(c.ok for c in verdict(GOOD).values())
    partial = verdict(GOOD.replace("/w: 4/4", "/w: 3/4"))["mirrors"]
    assert not partial.ok and "loaded 3/4 shards; colibri reads the others from the primary" in partial.detail
    measured = verdict(GOOD.replace("(COLI_DISK_WEIGHTS)", "(measured)"))["weights"]
    assert not measured.ok and "by 'measured'" in measured.detail
    off = verdict(GOOD.replace("50% / 25% / 25%", "60% / 20% / 20%"))["weights"]
    assert not off.ok and off.expected == "50/25/25" and off.observed == "60/20/20"
    no_split = GOOD.replace("[MIRROR] 3 drives | read split 50% / 25% / 25% (COLI_DISK_WEIGHTS)\n", "")
    assert "unconfirmed" in verdict(no_split)["weights"].detail
    err = verdict(GOOD + "[MIRROR] read error on the mirror copy \u2014 falling back to the primary drive\n")["served"]
    assert not err.ok and "a mirror read failed" in err.detail
    gone = verdict(GOOD.replace("MIRROR: primary", "STATS: primary"))["served"]
    assert not gone.ok and "no 'MIRROR:' statistics line from colibri's glm engine (c/colibri.c, on stdout" in gone.detail


@pytest.mark.parametrize("text, ok", [("", True), ("[MIRROR] /x: 2/2 shards (replica 1)\n", False)])
def test_a_single_drive_judgement(text, ok):
    v = verdict(text, MirrorExpectation(mirrors=(), weights=()))
    assert v["mirrors"].ok is ok and v["weights"].ok and v["served"].ok


# ---------------------------------------------------------------------------------------------
# Expected-idle drives

IDLE2 = GOOD.replace("mirror2 1.00 GB (5 reads)", "mirror2 0.00 GB (0 reads)")


def test_a_drive_the_plan_leaves_idle_served_nothing_as_expected():
    e = MirrorExpectation(mirrors=("/g", "/w"), weights=(10, 5, 5), idle=((), (), ("prefill", "decode")))
    c = verdict(IDLE2, e)["served"]
    assert c.ok, c
    assert "mirror2 served 0 bytes, expected idle: the plan gives it nothing in prefill and decode" in c.detail
    assert c.expected == "3 drives > 0 (idle: mirror2 in prefill and decode)"
    # without the plan saying so, the same line fails
    c = verdict(IDLE2)["served"]
    assert not c.ok and "mirror2 served nothing" in c.detail
    # and a drive the plan gives bytes still fails beside an idle one
    both = IDLE2.replace("mirror1 1.00 GB (5 reads)", "mirror1 0.00 GB (0 reads)")
    c = verdict(both, e)["served"]
    assert not c.ok and "mirror1 served nothing" in c.detail and "mirror2 served 0 bytes, expected idle" in c.detail


def test_an_idle_drive_that_served_is_said_but_not_failed():
    e = MirrorExpectation(mirrors=("/g", "/w"), weights=(10, 5, 5), idle=((), (), ("prefill", "decode")))
    c = verdict(GOOD, e)["served"]
    assert c.ok and "mirror2 served 1000000000 B though the plan gives it nothing" in c.detail


def test_the_expectation_a_request_gives():
    r = Request(paths=("/m", "/g", "/w"), prefill=(9, 3, 3), decode=(10, 6, 6), variant="glm53",
                idle=((), ("decode",), ()))
    assert expect(r, {"COLI_MIR_STRIPE": "1", "COLI_DISK_WEIGHTS": "9,3,3"}) == MirrorExpectation(
        mirrors=("/g", "/w"), weights=(9, 3, 3), stripe=True, variant="glm53", idle=((), ("decode",), ()))
    assert expect(Request(paths=("/m",), prefill=(1,), decode=(1,)), {}) == MirrorExpectation(mirrors=(), weights=())
    # mirrors without weights: colibri probes the drives (the tuner's arm of the engine's default)
    assert expect(r, {}) == MirrorExpectation(mirrors=("/g", "/w"), weights=(), variant="glm53", probe=True)


def test_a_probe_arm_is_confirmed_by_a_split_colibri_chose_itself():
    probe = MirrorExpectation(mirrors=("/g", "/w"), weights=(), probe=True)
    measured = LOAD + "[MIRROR] 3 drives | read split 52% / 24% / 24% (measured)\n"
    stats = "MIRROR: primary 0.50 GB (10 reads) | mirror1 0.20 GB (5 reads) | mirror2 0.20 GB (5 reads)\n"
    v = verdict(measured + stats, probe)
    assert v["weights"].ok and v["weights"].observed == "52/24/24" and v["served"].ok
    taken = LOAD + "[MIRROR] 3 drives | read split 50% / 25% / 25% (COLI_DISK_WEIGHTS)\n" + stats
    assert not verdict(taken, probe)["weights"].ok


# ---------------------------------------------------------------------------------------------
# Each member's own lines

def test_deepseek_v4_counters_come_from_its_v4_mirror_line_in_gib():
    text = (LOAD + "[MIRROR] 3 drives | read split 50% / 25% / 25% (COLI_DISK_WEIGHTS)\n"
            "v4_mirror primary=2.00GiB/10 mirror=1.00GiB/5 mirror=0.50GiB/2\n")
    v = verdict(text, MirrorExpectation(mirrors=("/g", "/w"), weights=(10, 5, 5), variant="deepseek_v4"))
    assert all(c.ok for c in v.values()), v
    assert v["served"].observed == f"0:{2 << 30}B/10r, 1:{1 << 30}B/5r, 2:{1 << 29}B/2r"
    # GLM's MIRROR: line is not V4's: without its own line V4's counters are missing
    v = verdict(GOOD, MirrorExpectation(mirrors=("/g", "/w"), weights=(10, 5, 5), variant="deepseek_v4"))
    assert not v["served"].ok and "no 'v4_mirror' statistics line" in v["served"].detail


def test_deepseek_v41_prints_its_split_its_own_way_and_sums_its_turns():
    split = "[MIRROR] 3 replicas, split COLI_DISK_WEIGHTS: primary 50% mirror 25% mirror 25%\n"
    turn = "MIRROR: primary 1.00 GB (5 reads) | mirror1 0.50 GB (2 reads) | mirror2 0.50 GB (3 reads) \u2014 50% of x\n"
    e = MirrorExpectation(mirrors=("/g", "/w"), weights=(10, 5, 5), variant="deepseek_v41")
    v = verdict(LOAD + split + turn + turn, e)
    assert all(c.ok for c in v.values()), v
    assert v["weights"].observed == "50/25/25"
    assert v["served"].observed == "0:2000000000B/10r, 1:1000000000B/4r, 2:1000000000B/6r"
    probed = LOAD + "[MIRROR] 3 replicas, split measured: primary 34% mirror 33% mirror 33%\n" + turn
    assert "by 'measured'" in verdict(probed, e)["weights"].detail
    # GLM's split line is not what V4.1 prints
    assert not verdict(GOOD, e)["weights"].ok
    assert report_env("deepseek_v41") == {"PROF": "1", "V41_STATS": "1"} and report_env("glm") == {"PROF": "1"}


G53 = ("[GLM53 MIRROR] replica 1: /g (4/4 shards)\n[GLM53 MIRROR] replica 2: /w (4/4 shards)\n"
       "[GLM53 MIRROR] 3 drives | routing 60% / 20% / 20% (COLI_DISK_WEIGHTS)\n")


def test_glm53_is_confirmed_by_its_own_lines_and_its_bytes_are_said_unchecked():
    e = MirrorExpectation(mirrors=("/g", "/w"), weights=(9, 3, 3), variant="glm53")
    v = verdict(G53, e)
    assert all(c.ok for c in v.values()), v
    assert v["mirrors"].observed == "/g 4/4 shards replica 1; /w 4/4 shards replica 2"
    assert v["served"].detail.startswith("per-drive bytes could not be checked: colibri's glm53 engine (c/glm53.c) "
                                         "prints no per-drive counters")
    bad = G53.replace("[GLM53 MIRROR] 3 drives | routing 60% / 20% / 20% (COLI_DISK_WEIGHTS)",
                      "[GLM53 MIRROR] invalid COLI_DISK_WEIGHTS '9,3,3' for 2 drives; probing bandwidth\n"
                      "[GLM53 MIRROR] 2 drives | routing 50% / 50% (startup bandwidth probe)")
    v = verdict(bad.replace("[GLM53 MIRROR] replica 2: /w (4/4 shards)", "[GLM53 MIRROR] /w: no usable shards -- ignored"), e)
    assert [n for n, c in v.items() if not c.ok] == ["mirrors", "weights"]
    assert "mirror /w did not load (no usable shards)" in v["mirrors"].detail
    assert "colibri rejected COLI_DISK_WEIGHTS=9,3,3 (it wanted 2 weights" in v["weights"].detail
    # GLM's [MIRROR] lines are not glm53's
    assert not verdict(GOOD, e)["mirrors"].ok


def test_glm53_skips_read_from_its_own_lines():
    text = ("[GLM53 MIRROR] /m equals primary model dir -- ignored\n"
            "[GLM53 MIRROR] too many mirrors; max 4 -- /e ignored\n")
    log = read_log(text, "glm53")
    assert log.skipped == (("/e", "too many mirrors (max 4)"), ("/m", "equals the model dir"))
    assert log.served == {} and log.drives is None


def test_each_member_prints_the_shares_of_its_own_cuts():
    # 9:3:3 -> cuts 154/205/256 (GLM: +0.5 then (int)); glm53's integer cuts give the same here
    assert split_shares("glm", (9, 3, 3)) == ("60", "20", "20") == split_percents((9, 3, 3))
    assert split_shares("glm53", (9, 3, 3)) == ("60", "20", "20")
    # a slice of 32/256 is 12.5%: printf's %.0f rounds it to even (12), the integer (x*100+128)/256 up (13)
    w = (32, 224)
    assert FAMILY["glm"].cuts(w) == (32, 256)
    assert split_shares("glm", w) == ("12", "88") and split_shares("deepseek_v41", w) == ("13", "88")
    assert split_shares("glm53", w) == ("13", "88")
    assert split_shares("", w) == split_shares("glm", w)       # a profile without a variant: the GLM engine
