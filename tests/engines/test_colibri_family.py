"""colibri's family of engines (engines.colibri.family: FamilyMember, FAMILY): each member's mirror rules,
against worked examples computed by hand or by compiling the engine's own C function.

"Compiled" below means: the function was copied verbatim from the engine's source into a small
harness in a scratch directory outside this repository (gcc -O1), run, and its output pasted
here. The harnesses printed, for a layers x experts grid walked layer by layer, each drive's
count and sig = sig*31 + drive (mod 2**64), exactly as test_colibri.py's
test_placement_matches_the_compiled_source does for the GLM engine."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import UsageError
from engines.colibri import colibri_log, family, mirror_env, placement
from engines.colibri.colibri_log import Served

MIB = 1 << 20

# ---------------------------------------------------------------------------------------------
# The weighted stripe legs (mir_stripe_plan)


def legs(pieces):
    return [(p.source, p.offset, p.length) for p in pieces]


@pytest.mark.parametrize("weights, routed, holders, length, expected", [
    # Compiled: mir_stripe_plan with g_mir_cut set from the weights' cuts, the legs listed as
    # mir_pread_striped issues them (owner srep[(rep+i)%nsf], offset, size).
    # 51:45:4 -> cuts 131/246/256, shares 131/115/10 of 256; 19 MiB = 256 * 77,824:
    # 77,824*131 = 10,194,944 and 77,824*115 = 8,949,760 (both already 4 KiB multiples).
    ((51, 45, 4), 0, (0, 1, 2), 19 * MIB, [(0, 0, 10_194_944), (1, 10_194_944, 8_949_760), (2, 19_144_704, 778_240)]),
    ((51, 45, 4), 1, (0, 1, 2), 19 * MIB, [(1, 0, 8_949_760), (2, 8_949_760, 778_240), (0, 9_728_000, 10_194_944)]),
    ((51, 45, 4), 2, (0, 1, 2), 19 * MIB, [(2, 0, 778_240), (0, 778_240, 10_194_944), (1, 10_973_184, 8_949_760)]),
    # 10:5:5 -> 128/192/256: shares 64 and 64 of 256 -> 4,980,736 each, the primary the rest.
    ((10, 5, 5), 1, (0, 1, 2), 19 * MIB, [(1, 0, 4_980_736), (2, 4_980_736, 4_980_736), (0, 9_961_472, 9_961_472)]),
    ((1, 1), 0, (0, 1), 19 * MIB, [(0, 0, 9_961_472), (1, 9_961_472, 9_961_472)]),
    # 1:1:254 -> cuts 1/2/256, shares 1/1/254: 4 MiB * 1/256 = 16,384 each.
    ((1, 1, 254), 0, (0, 1, 2), 4 * MIB, [(0, 0, 16_384), (1, 16_384, 16_384), (2, 32_768, 4_161_536)]),
    # A partial mirror: drive 1 lacks the shard. 9:3:3 -> 154/205/256, holders 0 and 2 with
    # shares 154 and 51 of 205; routed 2 is a list index (k = (2+i) % 2): holder 0 first.
    # 19,922,944 * 154 // 205 = 14,966,504 -> up to 4 KiB: 14,966,784.
    ((9, 3, 3), 2, (0, 2), 19 * MIB, [(0, 0, 14_966_784), (2, 14_966_784, 4_956_160)]),
    # 4 MiB + 4 KiB on two equal drives: the first leg rounds up (2,099,200 -> 2,101,248).
    ((1, 1), 0, (0, 1), 4 * MIB + 4096, [(0, 0, 2_101_248), (1, 2_101_248, 2_097_152)]),
])
def test_weighted_legs_match_the_compiled_plan(weights, routed, holders, length, expected):
    assert legs(placement.stripe_read(0, length, routed, holders, weights, legs="weighted")) == expected
    base = 1 << 30
    assert legs(placement.stripe_read(base, length, routed, holders, weights, legs="weighted")) == [
        (s, base + o, n) for s, o, n in expected]


def test_weighted_legs_keep_the_source_contract():
    # tests/test_mirror_stripe_split.c (colibri's own test of mir_stripe_plan): a 4 % leg gets
    # under half an equal third, a 51 % leg over 1.3 equal thirds; equal weights split evenly.
    n = 19 * MIB
    sizes = [p.length for p in placement.stripe_read(0, n, 0, (0, 1, 2), (51, 45, 4), legs="weighted")]
    assert sizes[2] < n // 3 // 2 and sizes[0] > n // 3 * 13 // 10
    a, b = (p.length for p in placement.stripe_read(0, n, 0, (0, 1), (50, 50), legs="weighted"))
    assert abs(a - b) <= 8192


def test_weighted_legs_leave_what_colibri_does_not_stripe_whole():
    # Under 4 MiB, or one holder: one read on the routed drive, as with equal legs.
    assert legs(placement.stripe_read(0, 4 * MIB - 4096, 1, (0, 1), (1, 1), legs="weighted")) == [(1, 0, 4 * MIB - 4096)]
    assert legs(placement.stripe_read(0, 8 * MIB, 1, (1,), (1, 1), legs="weighted")) == [(1, 0, 8 * MIB)]


def test_weighted_legs_need_the_weights_of_every_holder():
    with pytest.raises(ValueError):
        placement.stripe_read(0, 8 * MIB, 0, (0, 1), legs="weighted")
    with pytest.raises(ValueError):
        placement.stripe_read(0, 8 * MIB, 0, (0, 1, 2), (1, 1), legs="weighted")
    with pytest.raises(ValueError):
        placement.stripe_read(0, 8 * MIB, 0, (0, 1), (1, 1), legs="proportional")


def test_equal_legs_stay_the_default():
    assert placement.stripe_read(0, 19 * MIB, 1, (0, 1, 2)) == placement.stripe_read(0, 19 * MIB, 1, (0, 1, 2), (51, 45, 4))


@settings(max_examples=300, deadline=None)
@given(weights=st.lists(st.integers(1, 100), min_size=2, max_size=5),
       length=st.integers(1, 64 * MIB).map(lambda x: (x + 4095) & ~4095), data=st.data())
def test_weighted_legs_cover_the_window_exactly(weights, length, data):
    n = len(weights)
    holders = tuple(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))))
    routed = data.draw(st.sampled_from(holders))
    pieces = placement.stripe_read(4096, length, routed, holders, weights, legs="weighted")
    pos = 4096
    for p in pieces:
        assert p.offset == pos and p.length > 0 and p.source in holders
        pos += p.length
    assert pos == 4096 + length
    assert len({p.source for p in pieces}) == len(pieces)
    if placement.stripes(length, len(holders)):
        assert all(p.offset % 4096 == 0 for p in pieces)
        assert pieces[0].source == holders[routed % len(holders)]


# ---------------------------------------------------------------------------------------------
# The family and colibri's dispatch by model_type (c/family_registry.py family_for_config)

GLM, V4, V41, GLM53 = (family.FAMILY[n] for n in ("glm", "deepseek_v4", "deepseek_v41", "glm53"))


def test_the_family_as_read_from_each_source():
    assert {n: (m.source, m.integer_weights, m.stripes, m.fallback, m.stats, m.placement)
            for n, m in family.FAMILY.items()} == {
        "glm": ("c/colibri.c", False, True, "anchor", "stdout", "xor"),
        "deepseek_v4": ("c/deepseek_v4.c", False, False, "shard", "stderr", "flat"),
        "deepseek_v41": ("c/deepseek_v41.c", False, False, "tensor", "stderr", "flat"),
        "glm53": ("c/glm53.c", True, False, "expert", None, "xor"),
    }
    assert (V4.experts_per_layer, V41.experts_per_layer) == (256, 384)


@pytest.mark.parametrize("model_type, member", [
    ("glm_moe_dsa", "glm"), ("glm5_moe", "glm"), ("glm", "glm"),
    ("deepseek_v4", "deepseek_v4"),
    ("deepseek_v41", "deepseek_v41"), ("deepseek_v41_text", "deepseek_v41"),
    ("glm5_next", "glm53"), ("glm5_next_text", "glm53"),
    (" GLM_MOE_DSA ", "glm"),              # _normalize_model_type: strip().lower()
])
def test_member_for_dispatches_like_the_family_registry(model_type, member):
    assert family.member_for(model_type).name == member


@pytest.mark.parametrize("model_type, says", [
    ("llama", "no engine for model_type 'llama'"),          # UnknownFamilyError: colibri refuses
    ("deepseek_v4_vision", "no engine"),                    # exact match, no substrings
    ("olmoe", "colibri's olmoe engine"),                    # a family colibri runs but we do not model
    ("kimi_linear", "colibri's kimi_k3 engine"),
    (None, "no model_type"), ("  ", "no model_type"),       # FamilyConfigError
])
def test_member_for_refuses_what_colibri_refuses(model_type, says):
    with pytest.raises(UsageError) as e:
        family.member_for(model_type)
    message = str(e.value)
    assert says in message and "\n" not in message
    assert "glm5_next_text" in message and "deepseek_v41" in message   # names the known model types


# ---------------------------------------------------------------------------------------------
# Cuts (the weights' cumulative cuts of 256)

@pytest.mark.parametrize("weights, cuts", [
    # atof weights, c = (int)(256*cum/W + 0.5), at least the previous + 1 (colibri.c mirror_setup,
    # deepseek_v4.c coli_st_mirror_setup, deepseek_v41.c mirror_setup: the same loop; compiled).
    ((10, 5, 5), (128, 192, 256)),
    ((9, 3, 3), (154, 205, 256)),
    ((51, 45, 4), (131, 246, 256)),
    ((1, 1, 1, 1, 254), (1, 2, 3, 4, 256)),
    ((0.5, 2), (51, 256)),                # 256*0.5/2.5 = 51.2 -> 51
])
@pytest.mark.parametrize("member", [GLM, V4, V41], ids=lambda m: m.name)
def test_float_cuts(member, weights, cuts):
    assert member.cuts(weights) == cuts


@pytest.mark.parametrize("weights, cuts", [
    # glm53_mirror_setup: cut = (256*acc + total/2) / total in longs, clamped 1..256, last 256.
    ((3, 2), (154, 256)),                 # (768 + 2) / 5 = 154
    ((10, 5, 5), (128, 192, 256)),        # (2560 + 10) / 20 = 128; (3840 + 10) / 20 = 192
    ((1000, 1, 1000), (128, 128, 256)),   # 257,000 / 2001 = 128; 257,256 / 2001 = 128: drive 1 gets nothing
    ((1, 1, 1, 1, 1), (51, 102, 154, 205, 256)),   # (256k + 2) / 5
    ((1, 1_000_000), (1, 256)),           # 500,256 / 1,000,001 = 0 -> clamped to 1
    ((1000, 1), (256, 256)),              # 256,500 / 1001 = 256: the mirror's slice is empty
])
def test_glm53_integer_cuts(weights, cuts):
    assert GLM53.cuts(weights) == cuts


def test_glm53_cuts_refuse_non_integer_weights():
    with pytest.raises(ValueError, match="integer"):
        GLM53.cuts((9.5, 3))
    assert GLM53.cuts((9.0, 3.0)) == GLM53.cuts((9, 3))


@pytest.mark.parametrize("member", list(family.FAMILY.values()), ids=lambda m: m.name)
def test_cuts_refuse_what_no_engine_computes(member):
    for bad in ((), (0, 1), (-1, 2), (float("nan"), 1), (float("inf"), 1)):
        with pytest.raises(ValueError):
            member.cuts(bad)


def test_the_glm_member_is_the_existing_glm_rules():
    for w in ((10, 5, 5), (9, 3, 3), (1047, 515), (1, 1, 1, 1, 254)):
        assert GLM.cuts(w) == placement.cuts(w)
    assert all(GLM.bucket(layer, e) == placement.expert_hash(layer, e) for layer in range(8) for e in range(64))


# ---------------------------------------------------------------------------------------------
# Buckets and placement

def test_flat_buckets_by_hand():
    # v4_expert_route: h = (uint32)(layer*epl + eid) * 2654435761; bucket (h >> 16) & 255.
    # (0,1): 0x9E3779B1 -> 0x9E37 -> 0x37 = 55.  (1,0), epl 256: 256*0x9E3779B1 = 0x3779B100
    # (mod 2**32) -> 0x3779 -> 0x79 = 121.  (3,17), epl 256: 785*2654435761 = 2,083,732,072,385
    # = 485*2**32 + 672,933,825 -> >>16 = 10,268 = 0x281C -> 0x1C = 28.
    assert [V4.bucket(*x, 256) for x in ((0, 0), (0, 1), (1, 0), (3, 17), (42, 255))] == [0, 55, 121, 28, 57]
    # epl 384 (DeepSeek V4.1): (1,0): 384*2654435761 = 237*2**32 + 1,396,083,072 -> 21,302 = 0x5336 -> 0x36 = 54.
    assert [V41.bucket(*x, 384) for x in ((0, 1), (1, 0), (3, 17), (39, 383))] == [55, 54, 82, 78]
    # Compiled (deepseek_v4.c v4_expert_route's hash): 0 55 121 28 57 and 55 54 82 78.
    assert V4.bucket(3, 17) == 28 and V41.bucket(1, 0) == 54      # the members' default experts_per_layer


def test_xor_buckets_are_glm_s_for_glm53():
    # glm53_expert_replica hashes exactly like colibri.c expert_route (test_colibri.py's by-hand values).
    assert [GLM53.bucket(*x) for x in ((0, 0), (0, 1), (1, 0), (3, 17), (39, 383))] == [0, 243, 190, 19, 2]


def grid(member, layers, experts, epl, weights):
    got, sig = [0] * len(weights), 0
    for layer in range(layers):
        for e in range(experts):
            r = member.route(layer, e, epl, weights)
            got[r] += 1
            sig = (sig * 31 + r) % (1 << 64)
    return tuple(got), sig


@pytest.mark.parametrize("weights, counts, signature", [
    # Compiled deepseek_v4.c v4_expert_route + the cut loop; 43 layers x 256 experts (V4 Flash).
    ((10, 5, 5), (5508, 2752, 2748), 4313780134433279044),
    ((9, 3, 3), (6625, 2191, 2192), 12520022056356766433),
    ((1, 1), (5508, 5500), 16198723232766455424),
    ((51, 45, 4), (5639, 4945, 424), 2792509780782871523),
    ((1, 1, 1, 1, 254), (46, 46, 40, 44, 10832), 13839537681609939150),
])
def test_v4_placement_matches_the_compiled_source(weights, counts, signature):
    assert grid(V4, 43, 256, 256, weights) == (counts, signature)


@pytest.mark.parametrize("weights, counts, signature", [
    # Compiled deepseek_v41.c expert_route + mirror_setup's cut loop; 40 layers x 384 experts.
    ((10, 5, 5), (7685, 3841, 3834), 551972198015746087),
    ((9, 3, 3), (9243, 3058, 3059), 1491265279542507008),
    ((1, 1), (7685, 7675), 17667460365442881505),
    ((51, 45, 4), (7867, 6900, 593), 12789046247187755624),
    ((1, 1, 1, 1, 254), (64, 63, 56, 62, 15115), 4517270448334593417),
])
def test_v41_placement_matches_the_compiled_source(weights, counts, signature):
    assert grid(V41, 40, 384, 384, weights) == (counts, signature)


@pytest.mark.parametrize("weights, counts, signature", [
    # Compiled glm53.c glm53_expert_replica + glm53_mirror_setup's cut loop; 45 layers x 288 experts.
    ((3, 2), (7701, 5259), 280414013754026319),
    ((10, 5, 5), (6439, 3230, 3291), 15034595368523053658),
    ((9, 3, 3), (7701, 2597, 2662), 1066043932485510807),
    ((1000, 1, 1000), (6439, 0, 6521), 11795187518145480582),     # the empty slice serves nothing
    ((1, 1, 1, 1, 1), (2552, 2584, 2565, 2597, 2662), 4368895242123740559),
    ((1, 1_000_000), (64, 12896), 4160966564076947034),
    ((1000, 1), (12960, 0), 0),
])
def test_glm53_placement_matches_the_compiled_source(weights, counts, signature):
    assert grid(GLM53, 45, 288, None, weights) == (counts, signature)


@pytest.mark.parametrize("member", list(family.FAMILY.values()), ids=lambda m: m.name)
def test_one_drive_serves_everything(member):
    assert all(member.route(layer, e, 256, (7,)) == 0 for layer in range(4) for e in range(64))


# ---------------------------------------------------------------------------------------------
# What a mirror without one of an expert's files does

GLM_FILES = ("gate.w", "up.w", "down.w", "gate.qs", "up.qs", "down.qs")


def lacking(*missing):
    """holds() of a rig whose mirror 1 lacks `missing` (the primary and mirror 2 hold everything)."""
    return lambda source, f: not (source == 1 and f in missing)


@pytest.mark.parametrize("missing, served", [
    ((), (1,) * 6),
    (("gate.w",), (0,) * 6),                       # the anchor's shard missing: the whole expert from the primary
    (("up.w",), (1, 0, 1, 1, 1, 1)),               # anchor there: up_proj alone falls back (mir_pread)
    (("down.qs",), (1, 1, 1, 1, 1, 0)),            # a scale's shard: that scale alone
])
def test_glm_anchor_fallback(missing, served):
    # expert_load_impl: if (rep && st_fd_rep(tw[0]->fd, rep) < 0) rep = 0; then every read goes
    # through mir_pread / rep_bfd, which fall back to the primary per file.
    assert GLM.serve(1, GLM_FILES, lacking(*missing)) == served
    assert GLM.serve(2, GLM_FILES, lacking(*missing)) == (2,) * 6
    assert GLM.serve(0, GLM_FILES, lacking(*missing)) == (0,) * 6


@pytest.mark.parametrize("member", [V4, V41], ids=lambda m: m.name)
def test_deepseek_fallback_is_per_file(member):
    # deepseek_v4.c coli_st_read_at_rep / v4_pread_rep and deepseek_v41.c st_read_range_rep:
    # each read goes to the routed replica when it holds that read's shard, else to the primary.
    files = ("a.safetensors", "a.safetensors", "b.safetensors", "b.safetensors", "a.safetensors", "b.safetensors")
    assert member.serve(1, files, lacking()) == (1,) * 6
    assert member.serve(1, files, lacking("b.safetensors")) == (1, 1, 0, 0, 1, 0)
    assert member.serve(1, files, lacking("a.safetensors", "b.safetensors")) == (0,) * 6
    assert member.serve(2, files, lacking("b.safetensors")) == (2,) * 6


def test_glm53_whole_expert_preflight():
    # glm53_expert_read_replica: any of the six pieces absent on the routed replica -> the whole
    # expert from the primary ("Never mix pieces of one expert across drives").
    pieces = ("gate_proj.weight", "gate_proj.weight.qs", "up_proj.weight", "up_proj.weight.qs",
              "down_proj.weight", "down_proj.weight.qs")
    assert GLM53.serve(1, pieces, lacking()) == (1,) * 6
    assert GLM53.serve(1, pieces, lacking("down_proj.weight.qs")) == (0,) * 6
    assert GLM53.serve(2, pieces, lacking("down_proj.weight.qs")) == (2,) * 6


# ---------------------------------------------------------------------------------------------
# COLI_DISK_WEIGHTS

@pytest.mark.parametrize("text, loaded, parsed", [
    # Compiled (the three engines' strtok(", ") + atof + v <= 0 loop gave identical output):
    ("9,3,3", 3, (9.0, 3.0, 3.0)),
    ("10, 5, 5", 3, (10.0, 5.0, 5.0)),
    ("1047 515", 2, (1047.0, 515.0)),
    ("0.5,2", 2, (0.5, 2.0)),
    ("3x,1", 2, (3.0, 1.0)),
    ("1e2,1", 2, (100.0, 1.0)),
    (" 9 ,,3", 2, (9.0, 3.0)),            # empty tokens vanish in strtok
    ("+9,3", 2, (9.0, 3.0)),
    ("9,3", 3, None),
    ("9,0,3", 3, None),
    ("a,b", 2, None),
    ("9;3", 2, None),                     # atof("9;3") = 9: one weight for two drives
    ("1,1,1,1,1,1", 6, None),             # a sixth weight: bad
])
@pytest.mark.parametrize("member", [GLM, V4, V41], ids=lambda m: m.name)
def test_atof_weights(member, text, loaded, parsed):
    assert mirror_env.parse_weights(member, text, loaded) == parsed


@pytest.mark.parametrize("text, loaded, parsed", [
    # Compiled glm53_mirror_setup's strtol loop:
    ("9,3,3", 3, (9, 3, 3)),
    ("10, 5, 5", 3, (10, 5, 5)),
    (" 9 , 3 ,3", 3, (9, 3, 3)),          # blanks before (strtol) and around the commas
    ("\t9,3", 2, (9, 3)),                 # strtol skips any leading white space
    ("9,3,", 2, (9, 3)),                  # a trailing comma ends the list
    ("+9,3", 2, (9, 3)),
    ("010,1", 2, (10, 1)),                # base 10: no octal
    ("1000000,1", 2, (1_000_000, 1)),
    ("1,1,1,1,1,7", 5, (1, 1, 1, 1, 1)),  # at most five are read; the rest is ignored
    ("9.5,3", 2, None),                   # strtol stops at '.': not ' ', ',' or the end
    ("9,3.0", 2, None),
    ("3x,1", 2, None),                    # (atof would take 3)
    ("1e2,1", 2, None),
    ("-9,3", 2, None), ("0,3", 2, None),
    ("1000001,1", 2, None),
    ("99999999999999999999,1", 2, None),  # LONG_MAX
    ("9 3", 2, None),                     # blanks do not separate
    ("9,,3", 2, None), (",9,3", 2, None), ("9;3", 2, None),
    ("9\t,3", 2, None),                   # only ' ' may follow a number
    ("0x10,1", 2, None),
    ("9,3", 3, None), ("", 1, None),
])
def test_glm53_strtol_weights(text, loaded, parsed):
    assert mirror_env.parse_weights(GLM53, text, loaded) == (None if parsed is None else tuple(map(float, parsed)))
    assert mirror_env.strtol_weights(text, loaded) == parsed


def test_glm53_keeps_511_characters():
    # char wb[512]: past 511 characters the text is cut (compiled: the same four answers).
    assert mirror_env.strtol_weights("1,1," + " " * 600 + "7", 2) == (1, 1)        # the 7 is cut off
    assert mirror_env.strtol_weights("1,1," + " " * 500 + "7", 2) is None          # a third weight
    assert mirror_env.strtol_weights("1," + " " * 600 + "1", 2) is None            # the second weight is cut off
    assert mirror_env.strtol_weights("1,1" + " " * 600, 2) == (1, 1)


# ---------------------------------------------------------------------------------------------
# The per-drive statistics line, as each engine's printf writes it

def test_glm_stats_line():
    # colibri.c profile_print, stdout: "MIRROR: primary %.2f GB (%lld reads)" " | mirror%d %.2f GB
    # (%lld reads)" " — %.0f%% of expert bytes from the mirrors"; the counters are cumulative.
    text = ("MIRROR: primary 1.00 GB (10 reads) | mirror1 0.50 GB (5 reads) | mirror2 0.50 GB (5 reads) "
            "\u2014 50% of expert bytes from the mirrors\n"
            "MIRROR: primary 12.34 GB (617 reads) | mirror1 4.10 GB (205 reads) | mirror2 4.00 GB (200 reads) "
            "\u2014 40% of expert bytes from the mirrors\n")
    assert colibri_log.read_stats(GLM, text) == {0: Served(12_340_000_000, 617), 1: Served(4_100_000_000, 205),
                                    2: Served(4_000_000_000, 200)}
    assert colibri_log.read_stats(GLM, text) == colibri_log.read_glm_log(text).served


def test_v41_stats_lines_are_summed():
    # deepseek_v41.c mirror_report, stderr, the same format; the serve loop (V41_STATS=1) prints
    # each turn's own counts (the counters minus those before the turn).
    text = ("[v41] expert I/O: 12 misses, 225.6 MB in 0.10s (2.26 GB/s); prefill 0.0 MB, disk 0.00s, matmul 0.00s, wall 0.20s\n"
            "MIRROR: primary 1.50 GB (30 reads) | mirror1 0.75 GB (15 reads) \u2014 33% of expert bytes from the mirrors\n"
            "MIRROR: primary 0.25 GB (6 reads) | mirror1 0.05 GB (1 reads) \u2014 17% of expert bytes from the mirrors\n")
    assert colibri_log.read_stats(V41, text) == {0: Served(1_750_000_000, 36), 1: Served(800_000_000, 16)}


def test_v4_stats_lines():
    # deepseek_v4.c, stderr: per turn in serve, " %s=%.2fGiB/%llu" after "v4_mirror", primary then
    # every mirror spelled "mirror"; at the CLI's exit the same after "v4_mirror drives=%d".
    serve = ("v4_mirror primary=1.00GiB/10 mirror=0.50GiB/5\n"
             "v4_mirror primary=2.50GiB/20 mirror=1.25GiB/9 mirror=0.00GiB/0\n")
    assert colibri_log.read_stats(V4, serve) == {0: Served(2_684_354_560, 20), 1: Served(1_342_177_280, 9), 2: Served(0, 0)}
    cli = "TUNE decode: 20 tokens in 3.000s\nv4_mirror drives=2 primary=0.75GiB/12 mirror=0.25GiB/4\n"
    assert colibri_log.read_stats(V4, cli) == {0: Served(805_306_368, 12), 1: Served(268_435_456, 4)}
    # The setup lines are not statistics.
    assert colibri_log.read_stats(V4, "[MIRROR] 2 drives | read split 50% / 50% (COLI_DISK_WEIGHTS)\n") == {}


def test_who_prints_which_line():
    glm_line = "MIRROR: primary 1.00 GB (10 reads) | mirror1 0.50 GB (5 reads) \u2014 33% of expert bytes from the mirrors\n"
    assert colibri_log.read_stats(V4, glm_line) == {}
    assert colibri_log.read_stats(GLM, "v4_mirror primary=1.00GiB/10 mirror=0.50GiB/5\n") == {}
    assert colibri_log.read_stats(GLM53, glm_line + "v4_mirror primary=1.00GiB/10 mirror=0.50GiB/5\n") == {}   # glm53 prints none


# ---------------------------------------------------------------------------------------------
# Vectorised == scalar

MEMBERS = st.sampled_from(list(family.FAMILY.values()))


@settings(max_examples=200, deadline=None)
@given(member=MEMBERS, data=st.data())
def test_cuts_many_equals_cuts(member, data):
    n = data.draw(st.integers(1, 5))
    if member.integer_weights:
        row = st.lists(st.integers(1, 1_000_000), min_size=n, max_size=n)
    else:
        row = st.lists(st.one_of(st.integers(1, 100).map(float),
                                 st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False)),
                       min_size=n, max_size=n)
    rows = data.draw(st.lists(row, min_size=1, max_size=8))
    got = family.cuts_many(member, rows)
    assert [tuple(int(x) for x in r) for r in got] == [member.cuts(r) for r in rows]


@settings(max_examples=100, deadline=None)
@given(member=MEMBERS, weights=st.lists(st.integers(1, 100), min_size=1, max_size=5),
       layer=st.integers(0, 90), expert=st.integers(0, 511))
def test_route_is_the_bucket_s_slice(member, weights, layer, expert):
    r = member.route(layer, expert, 512, weights)
    cuts, hv = member.cuts(weights), member.bucket(layer, expert, 512)
    if len(weights) == 1:
        assert r == 0
    else:
        assert (cuts[r - 1] if r else 0) <= hv < cuts[r]


def test_vectorised_rejects_what_the_scalar_rejects():
    with pytest.raises(ValueError):
        family.cuts_many(GLM53, [[9.5, 3]])
    with pytest.raises(ValueError):
        family.cuts_many(GLM, [[0, 1]])
