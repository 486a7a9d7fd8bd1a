"""The launcher's generic pure half: the environment and arguments an engine is started with (as
its profile says), the dead-knob scan and the ds4-bench CSV. The verdicts on the logs are the
engines' own: tests/engines/test_ds4_launch.py, tests/engines/test_colibri_launch.py."""

import pytest

from core.errors import UsageError
from engine_bridge.profiles.confirm import (
    confirm,
    csv_block,
    dead_knobs,
    engine_argv,
    launch_environment,
    parse_bench_csv,
)
from engine_bridge.profiles.profile import Profile, idle_phases

def test_bench_csv_anywhere_in_stdout():
    out = ("ds4-bench: loading\n"
           "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,gen_first_ms,gen_steady_tokens,gen_steady_tps,kvcache_bytes\n"
           "512,512,43.6,128,17.1,210.5,127,17.4,1048576\n"
           "1024,512,41.0,128,16.9,220.0,127,17.2,2097152\n"
           "ds4-bench: done\n")
    rows = parse_bench_csv(out)
    assert rows[0] == {"ctx_tokens": 512, "prefill_tokens": 512, "prefill_tps": 43.6, "gen_tokens": 128, "gen_tps": 17.1,
                       "gen_first_ms": 210.5, "gen_steady_tokens": 127, "gen_steady_tps": 17.4, "kvcache_bytes": 1048576}
    assert rows[1]["ctx_tokens"] == 1024 and len(rows) == 2
    assert len(csv_block(out)) == 3
    assert parse_bench_csv("no csv here\n") == ()


def test_dead_knobs_match_whole_names_only():
    blob = b"\x00DS4_ARGODRIVE_PREFILL_LANES\x00getenv\x00DS4_ARGODRIVE_REPLICAS\x00"
    assert dead_knobs(blob, ["DS4_ARGODRIVE_PREFILL", "DS4_ARGODRIVE_PREFILL_LANES", "DS4_ARGODRIVE_REPLICAS",
                             "DS4_ARGODRIVE_PSO_CACHE"]) == ["DS4_ARGODRIVE_PREFILL", "DS4_ARGODRIVE_PSO_CACHE"]


def profile(**kw):
    base = dict(id="p", engine="ds4-argodrive", environment=(("DS4_ARGODRIVE_PRIMARY_WEIGHT", "10"),),
                unset=("DS4_ARGODRIVE_PSO_CACHE",), argv=("--ssd-streaming", "-m", "/m", "--ssd-streaming-cache-experts", "9"),
                primary="/m", primary_weight=10, replicas=(), replica_weights=(), decode_weights=(), cache_experts=9)
    base.update(kw)
    return Profile(**base)


def test_launch_environment_is_clean_plus_the_profile():
    env = launch_environment({"PATH": "/bin", "HOME": "/h", "DS4_ARGODRIVE_PSO_CACHE": "0", "DS4_OTHER": "1"}, profile())
    assert env == {"PATH": "/bin", "HOME": "/h", "DS4_ARGODRIVE_PRIMARY_WEIGHT": "10",
                   "DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY": "1"}


def test_a_colibri_profile_clears_only_its_own_keys_and_asks_for_its_statistics():
    p = Profile(id="c", engine="colibri", environment=(("COLI_MODEL", "/m"), ("SNAP", "/m")), unset=("SNAP_MIRROR",),
                argv=(), primary="/m", primary_weight=1, replicas=(), replica_weights=(), decode_weights=(),
                cache_experts=None, variant="deepseek_v41")
    env = launch_environment({"SNAP_MIRROR": "/old", "COLI_RAM": "16", "DS4_X": "1"}, p)
    assert env == {"COLI_RAM": "16", "DS4_X": "1", "COLI_MODEL": "/m", "SNAP": "/m", "PROF": "1", "V41_STATS": "1"}
    with pytest.raises(UsageError, match=r"already given by the profile \(COLI_MODEL=/m\)"):
        engine_argv("/bin/coli", p, ["--model", "/x"])


def test_the_verdict_is_the_engines_own():
    log = ("ds4: experimental Argodrive expert reader sources=1; Engram unchanged\n"
           "ds4:   streaming expert cache budget=9 experts\n")
    assert [c.name for c in confirm(log, profile())] == ["exit", "sources", "decode-split", "source-bytes",
                                                         "cache-budget", "prefill-staging"]
    assert all(c.ok for c in confirm(log, profile()))


def test_engine_arguments_the_profile_owns_are_refused():
    assert engine_argv("/bin/ds4", profile(), ["--ctx", "512"])[1:] == ["--ssd-streaming", "-m", "/m",
                                                                        "--ssd-streaming-cache-experts", "9", "--ctx", "512"]
    for bad in (["-m", "/x"], ["--ssd-streaming-cache-experts=10"]):
        with pytest.raises(UsageError, match="already given by the profile"):
            engine_argv("/bin/ds4", profile(), bad)


def test_which_sources_a_plan_leaves_idle_in_which_phase():
    plan = {"sources": [{"name": "internal"}, {"name": "green"}, {"name": "white"}],
            "prefill": {"predicted": {"sources": [{"name": "internal", "bytes": 9}, {"name": "green", "bytes": 0},
                                                  {"name": "white"}]}},          # no 'bytes': not known idle
            "decode": {"predicted": {}},
            "workload": {"idle": {"decode": {"sources": ["white"]}, "placement": {"sources": ["internal", "nobody"]}}}}
    assert idle_phases(plan, 3) == (("prefill", "decode"), ("prefill",), ("decode",))
    assert idle_phases({}, 2) == ((), ())
