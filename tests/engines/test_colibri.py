"""colibri's mirror rules reproduced from its sources (engines.colibri): the placement hash and
the weights' cuts (c/colibri.c expert_route, mirror_setup), the striped read (mir_pread_striped),
what it makes of its variables, and its log lines (copied from its printf formats)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.colibri import colibri_log, colibri_reads, constants as coli, family, mirror_env, placement
from engines.colibri.colibri_log import Served
from engines.registry import get_engine

GLM = family.FAMILY["glm"]


def place(layer: int, expert: int, weights) -> int:
    """The drive colibri's GLM engine routes expert (layer, expert) to (expert_route in c/colibri.c)."""
    return GLM.route(layer, expert, None, weights)


def placement_counts(layers: int, experts: int, weights) -> tuple[int, ...]:
    counts = [0] * max(1, len(weights))
    for layer in range(layers):
        for e in range(experts):
            counts[place(layer, e, weights)] += 1
    return tuple(counts)

# ---------------------------------------------------------------------------------------------
# Cuts and placement

@pytest.mark.parametrize("weights, cuts", [
    # mirror_setup: c = (int)(256.0*cum/W + 0.5), at least the previous cut + 1, the last 256.
    ((10, 5, 5), (128, 192, 256)),      # 256*10/20 = 128; 256*15/20 = 192
    ((9, 3, 3), (154, 205, 256)),       # 153.6+0.5 -> 154; 204.8+0.5 -> 205
    ((1, 1), (128, 256)),
    ((51, 45, 4), (131, 246, 256)),     # 130.56 -> 131; 245.76 -> 246
    ((1047, 515), (172, 256)),          # 171.6 -> 172 (colibri's own docs' example weights)
    ((1, 1, 1, 1, 254), (1, 2, 3, 4, 256)),   # 0.98+0.5 -> 1; then each slice kept non-empty
])
def test_cuts_follow_mirror_setup(weights, cuts):
    assert placement.cuts(weights) == cuts


def test_the_hash_by_hand():
    # expert_route: h = layer*2654435761 ^ eid*0x9E3779B9 (uint32); h ^= h>>16; h *= 0x45d9f3b; h ^= h>>16; h & 255.
    # (0, 1): 0 ^ 0x9e3779b9 -> ^>>16 0x9e37e78e -> *0x45d9f3b 0x86498fba -> ^>>16 0x864909f3 -> 0xf3 = 243
    # (1, 0): 0x9e3779b1 -> 0x9e37e786 -> 0x635c95e2 -> 0x635cf6be -> 0xbe = 190
    # (3, 17): 0xdaa66d13 ^ 0x81af1549 = 0x5b09785a -> 0x5b092353 -> 0xc932b121 -> 0xc9327813 -> 0x13 = 19
    # (39, 383): 0x1a7389f7 ^ 0xb4ff1bc7 = 0xae8c9230 -> 0xae8c3cbc -> 0x5456c354 -> 0x54569702 -> 0x02 = 2
    assert [placement.expert_hash(*x) for x in ((0, 0), (0, 1), (1, 0), (3, 17), (39, 383))] == [0, 243, 190, 19, 2]


def test_placement_by_hand():
    # cuts 128/192/256 for 10:5:5: hash < 128 -> primary, < 192 -> mirror 1, else mirror 2.
    w = (10, 5, 5)
    assert [place(*x, w) for x in ((0, 0), (0, 1), (1, 0), (3, 17), (39, 383))] == [0, 2, 1, 0, 0]
    # 9:3:3 cuts 154/205/256: hash 190 lands on mirror 1, 243 on mirror 2.
    assert place(1, 0, (9, 3, 3)) == 1 and place(0, 1, (9, 3, 3)) == 2
    # One drive: colibri's g_mirror is off and every expert is the primary's.
    assert all(place(0, e, (7,)) == 0 for e in range(64))


def test_a_routed_mirror_without_the_shard_hands_the_expert_to_the_primary():
    # expert_load_impl: rep = expert_route(); if the shard is not in that mirror, rep = 0.
    assert place(0, 1, (10, 5, 5)) == 2
    files = ("gate.w", "up.w", "down.w")
    assert GLM.serve(2, files, lambda source, f: source != 2) == (0, 0, 0)
    assert GLM.serve(place(1, 0, (10, 5, 5)), files, lambda source, f: source != 2) == (1, 1, 1)


@pytest.mark.parametrize("weights, counts, signature", [
    # Computed by compiling expert_route and mirror_setup's cut loop from c/colibri.c verbatim and
    # walking layers 0..79 x experts 0..511 (sig = sig*31 + drive, mod 2**64).
    ((10, 5, 5), (20453, 10246, 10261), 14533845733287081114),
    ((9, 3, 3), (24665, 8073, 8222), 1502216747483892875),
    ((1, 1), (20453, 20507), 8156191699802808863),
    ((51, 45, 4), (20946, 18447, 1567), 7412132499078590523),
    ((1, 1, 1, 1, 254), (162, 138, 183, 152, 40325), 13841409801556345116),
])
def test_placement_matches_the_compiled_source(weights, counts, signature):
    got, sig = [0] * len(weights), 0
    for layer in range(80):
        for e in range(512):
            r = place(layer, e, weights)
            got[r] += 1
            sig = (sig * 31 + r) % (1 << 64)
    assert tuple(got) == counts and sig == signature
    assert placement_counts(80, 512, weights) == counts


@pytest.mark.parametrize("weights", [(10, 5, 5), (9, 3, 3), (2, 1), (12, 7, 7), (1, 1, 1, 1, 1), (51, 45, 4)])
def test_many_experts_split_in_proportion_to_the_weights(weights):
    # 40 layers x 384 experts (DeepSeek V4.1's grid): each drive's share is its cut slice of 256
    # within 1.5 points, and the slice is the weight's share within half a bucket.
    counts = placement_counts(40, 384, weights)
    total, cuts, lo = sum(counts), placement.cuts(weights), 0
    for r, hi in enumerate(cuts):
        assert abs(counts[r] / total - (hi - lo) / 256) < 0.015
        assert abs((hi - lo) / 256 - weights[r] / sum(weights)) <= 1 / 256
        lo = hi


def test_the_registry_holds_the_read_pattern():
    e = get_engine(coli.NAME)
    assert e.pattern is colibri_reads.read_pattern and e.split is None and e.max_sources == 5


# ---------------------------------------------------------------------------------------------
# The O_DIRECT window and the striped read

def test_direct_window_aligns_to_4_kib():
    assert placement.direct_window(0, 19 << 20) == (0, 19 << 20)
    assert placement.direct_window(1000, 6_635_520) == (0, 6_639_616)          # need 6,636,520 -> 1,621 pages
    assert placement.direct_window(8192 + 5, 4096) == (8192, 8192)


def test_stripe_by_hand():
    # 19 MiB over 3 drives: ceil(19,922,944 / 3) = 6,640,982, rounded up to 4 KiB = 6,643,712;
    # the last chunk is 19,922,944 - 2 * 6,643,712 = 6,635,520. Chunk i on drive (routed + i) % 3.
    n = 19 << 20
    pieces = placement.stripe_read(4096, n, routed=1, holders=(0, 1, 2))
    assert [(p.source, p.offset, p.length) for p in pieces] == [
        (1, 4096, 6_643_712), (2, 4096 + 6_643_712, 6_643_712), (0, 4096 + 2 * 6_643_712, 6_635_520)]
    # Two drives, routed to the primary: two halves of 4 MiB + 4 KiB.
    pieces = placement.stripe_read(0, (4 << 20) + 4096, routed=0, holders=(0, 1))
    assert [(p.source, p.length) for p in pieces] == [(0, 2_101_248), (1, 2_097_152)]


def test_what_colibri_does_not_stripe_is_one_read_on_the_routed_drive():
    assert [(p.source, p.length) for p in placement.stripe_read(0, (4 << 20) - 4096, 2, (0, 1, 2))] == [(2, (4 << 20) - 4096)]
    assert [(p.source, p.length) for p in placement.stripe_read(0, 8 << 20, 1, (1,))] == [(1, 8 << 20)]
    # The routed mirror lacks the shard: the primary reads, and stripes over who holds it.
    assert [p.source for p in placement.stripe_read(0, 8 << 20, 2, (0, 1))] == [0, 1]


def test_a_partial_mirror_uses_the_drive_number_as_a_list_index_like_the_source():
    # holders [0, 2], routed 2: k = (2 + i) % 2 -> holders[0] first (the source's own indexing).
    assert [p.source for p in placement.stripe_read(0, 8 << 20, 2, (0, 2))] == [0, 2]


@settings(max_examples=300, deadline=None)
@given(offset=st.integers(0, 1 << 40).map(lambda x: x & ~4095), length=st.integers(1, 64 << 20).map(lambda x: (x + 4095) & ~4095),
       drives=st.integers(1, 5), routed=st.integers(0, 4))
def test_stripe_pieces_cover_the_window_exactly(offset, length, drives, routed):
    holders = tuple(range(drives))
    pieces = placement.stripe_read(offset, length, routed % drives, holders)
    pos = offset
    for p in pieces:
        assert p.offset == pos and p.length > 0 and p.offset % 4096 == 0 and p.source in holders
        pos += p.length
    assert pos == offset + length
    assert len({p.source for p in pieces}) == len(pieces)            # one chunk per drive at most
    if placement.stripes(length, drives):
        assert pieces[0].source == holders[routed % drives]


# ---------------------------------------------------------------------------------------------
# What colibri makes of its variables

def test_mirror_list_like_mirror_setup():
    assert mirror_env.mirror_list("/a;/b,/c") == ("/a", "/b", "/c")
    assert mirror_env.mirror_list("  /a ; ;, /b  ") == ("/a", "/b")
    assert mirror_env.mirror_list("", "/legacy") == ("/legacy",)          # SNAP_MIRROR only when COLI_MODEL_MIRROR is empty
    assert mirror_env.mirror_list("/new", "/legacy") == ("/new",)
    assert mirror_env.mirror_list(None) == ()
    assert mirror_env.mirror_list("/" + "x" * 5000 + ";/b") == ("/" + "x" * 4094,)   # buf[4096] keeps 4095 chars


@pytest.mark.parametrize("text, loaded, parsed", [
    ("9,3,3", 3, (9.0, 3.0, 3.0)),
    ("10, 5, 5", 3, (10.0, 5.0, 5.0)),      # strtok on ", ": blanks separate too
    ("1047 515", 2, (1047.0, 515.0)),
    ("0.5,2", 2, (0.5, 2.0)),
    ("3x,1", 2, (3.0, 1.0)),               # atof reads the leading number
    ("9,3", 3, None),                      # wrong count: probing instead
    ("9,0,3", 3, None),                    # not positive
    ("9,-1,3", 3, None),
    ("a,b", 2, None),                      # atof("a") == 0
    ("1,1,1,1,1,1", 6, None),              # more than MIR_REPS
    ("", 1, None),
])
def test_disk_weights_like_mirror_setup(text, loaded, parsed):
    assert mirror_env.parse_disk_weights(text, loaded) == parsed


def test_split_percents_as_the_split_line_prints_them():
    assert colibri_log.split_percents((10, 5, 5)) == ("50", "25", "25")
    assert colibri_log.split_percents((9, 3, 3)) == ("60", "20", "20")      # 154/256 = 60.2; 51/256 = 19.9
    assert colibri_log.split_percents((1, 1)) == ("50", "50")


def test_plan_environment():
    assert mirror_env.plan_environment("/m", (), ()) == (("COLI_MODEL", "/m"), ("SNAP", "/m"))
    assert mirror_env.plan_environment("/m", ("/g", "/w"), (9, 3, 3)) == (
        ("COLI_MODEL", "/m"), ("SNAP", "/m"), ("COLI_MODEL_MIRROR", "/g;/w"), ("COLI_DISK_WEIGHTS", "9,3,3"))
    striped = mirror_env.plan_environment("/m", ("/g",), (2, 1), frozenset({"direct", "stripe"}))
    assert striped[-2:] == (("DIRECT", "1"), ("COLI_MIR_STRIPE", "1"))
    assert mirror_env.plan_environment("/m", (), (), frozenset({"stripe"})) == (("COLI_MODEL", "/m"), ("SNAP", "/m"))
    # O_DIRECT without stripes must say so: colibri stripes when COLI_MIR_STRIPE is unset
    direct = mirror_env.plan_environment("/m", ("/g",), (2, 1), frozenset({"direct"}))
    assert direct[-2:] == (("DIRECT", "1"), ("COLI_MIR_STRIPE", "0"))
    assert mirror_env.plan_environment("/m", (), (), frozenset({"direct"}))[-1] == ("DIRECT", "1")


# ---------------------------------------------------------------------------------------------
# Log lines, as colibri's printf formats write them

LOG = """\
[MIRROR] /green/glm: 12/12 shards (replica 1)
[MIRROR] /white/x/glm: size differs from the primary copy \u2014 file skipped
[MIRROR] /white/glm: 11/12 shards (replica 2)
[MIRROR] /blue/glm: no usable shard (missing or divergent copy) \u2014 skipped
[MIRROR] /red/glm: too many mirrors (max 4) \u2014 ignored
[MIRROR] /m/glm equals the model dir \u2014 ignored
[MIRROR] 3 drives | read split 60% / 20% / 20% (COLI_DISK_WEIGHTS)
Expert cache hit rate: 62.0% (0 pin + 10 lru / 6 miss) | RSS: 12.00 GB | 1.1 tok/s
MIRROR: primary 12.34 GB (617 reads) | mirror1 4.10 GB (205 reads) | mirror2 4.00 GB (200 reads) \u2014 50% of expert bytes from the mirrors
"""  # noqa: E501 (the engine's log line, verbatim)


def test_read_log_on_colibris_lines():
    r = colibri_log.read_glm_log(LOG)
    assert r.loaded == (colibri_log.MirrorLoad("/green/glm", 12, 12, 1), colibri_log.MirrorLoad("/white/glm", 11, 12, 2))
    assert r.skipped == (("/blue/glm", "no usable shard (missing or divergent copy)"),
                         ("/red/glm", "too many mirrors (max 4)"), ("/m/glm", "equals the model dir"))
    assert r.files_skipped == (("/white/x/glm", "size"),)
    assert (r.drives, r.split, r.split_how) == (3, ("60", "20", "20"), "COLI_DISK_WEIGHTS")
    assert r.served == {0: Served(12_340_000_000, 617), 1: Served(4_100_000_000, 205), 2: Served(4_000_000_000, 200)}
    assert r.weights_rejected is None and not r.no_mirror and not r.read_error


def test_read_log_weights_rejected_probe_and_no_mirror():
    text = ("[MIRROR] invalid COLI_DISK_WEIGHTS '9,3' (want 3 positive comma-separated weights, e.g. 9,3) \u2014 probing "
            "instead\n"
            "[MIRROR] probe: primary 6.10 GB/s | mirror 3.02 GB/s | mirror 2.90 GB/s\n"
            "[MIRROR] 3 drives | read split 51% / 25% / 24% (measured)\n"
            "[MIRROR] read error on the mirror copy \u2014 falling back to the primary drive\n")
    r = colibri_log.read_glm_log(text)
    assert (r.weights_rejected, r.weights_wanted, r.split_how, r.read_error) == ("9,3", 3, "measured", True)
    assert colibri_log.read_glm_log("[MIRROR] no usable mirror \u2014 running on the primary drive only\n").no_mirror
    r = colibri_log.read_glm_log("[MIRROR] 2 drives | read split 50% / 50% (fallback 1:1 (probe failed))\n")
    assert (r.drives, r.split, r.split_how) == (2, ("50", "50"), "fallback 1:1 (probe failed)")
    assert colibri_log.read_glm_log("nothing here\n") == colibri_log.MirrorLog()


def test_read_log_takes_the_last_statistics_line_and_the_two_drive_form():
    # Older two-drive builds print "| mirror 1.00 GB (5 reads)" without a number.
    text = ("MIRROR: primary 1.00 GB (10 reads) | mirror 1.00 GB (5 reads) \u2014 50% of expert bytes from the mirror\n"
            "MIRROR: primary 2.50 GB (20 reads) | mirror 0.00 GB (0 reads) \u2014 0% of expert bytes from the mirror\n")
    assert colibri_log.read_glm_log(text).served == {0: Served(2_500_000_000, 20), 1: Served(0, 0)}
