"""What a run says besides what it applied, as each engine's profile reads it for the real-engine
tuner (`read_run`, pure), on lines as the engines print them: colibri's GLM engine's oracle mode
(captured from the binary built from tekintian/colibri 4ef9a99), DeepSeek V4.1's reference mode
(c/deepseek_v41.c main's formats) and ds4-bench's CSV with ds4-argodrive's reader lines."""

import pytest

from engines.colibri import colibri_profile
from engines.ds4_argodrive import ds4_profile as ds4_argodrive_profile
from engines.registry import get_engine
from engines.handoff import printed_step

GLM_OUT = """\
== GLM C engine (glm_moe_dsa), cache=2 experts/layer | experts@8-bit dense@8-bit | idot: avx512-vnni ==
loaded in 0.02s | resident dense: 22.13 MB | layers=4 experts=16 | MTP absent (draft=0)

Reference (oracle): 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 
GLM C engine      : 232 232 232 232 232 232 464 132 149 402 430 49 71 366 464 132 
Matching tokens: 0/16
N-gram speculation (DRAFT=0): 1.07 tokens/forward (15 forwards per 16 tokens)
Expert cache hit rate: 21.7% (0 pin + 65 lru / 234 miss) | RSS: 0.11 GB | 14.1 tok/s
MIRROR: primary 0.37 GB (615 reads) | mirror1 0.37 GB (411 reads) | mirror2 0.37 GB (378 reads) \u2014 67% of expert \
bytes from the mirrors
"""
GLM_ERR = """\
[MIRROR] /r1: 1/1 shards (replica 1)
[MIRROR] 3 drives | read split 50% / 25% / 25% (COLI_DISK_WEIGHTS)
[prefill] layer 1/4 \u00b7 12 token \u00b7 +0.00s
[prefill] layer 4/4 \u00b7 12 token \u00b7 +0.29s
"""


def test_colibris_glm_engine_oracle_mode():
    r = colibri_profile.read_run(GLM_OUT, GLM_ERR, "glm")
    assert r.output == "232 232 232 232 232 232 464 132 149 402 430 49 71 366 464 132"
    assert (r.tok_s, r.speed_kind, r.prompt_tokens, r.gen_tokens) == (14.1, "run", 12, 16)
    assert r.served == {0: 370_000_000, 1: 370_000_000, 2: 370_000_000}
    assert r.resolution == pytest.approx(0.05) and r.lines[0].startswith("Expert cache hit rate")
    # a run that stopped before its oracle block: nothing to read
    assert colibri_profile.read_run(GLM_OUT.split("\nReference")[0], GLM_ERR, "glm").tok_s is None


def test_colibris_v41_engine_reference_mode():
    out = "5 17 17 230\n"
    err = ("[MIRROR] 3 replicas, split COLI_DISK_WEIGHTS: primary 50% mirror 25% mirror 25%\n"
           "Matching tokens: 4/4\n[v41] prefill 12 tokens in 0.51s | decode 4 in 1.20s (3.33 tok/s)\n"
           "MIRROR: primary 0.20 GB (10 reads) | mirror1 0.10 GB (5 reads) | mirror2 0.10 GB (5 reads)\n")
    r = colibri_profile.read_run(out, err, "deepseek_v41")
    assert (r.output, r.tok_s, r.speed_kind, r.prompt_tokens, r.gen_tokens) == ("5 17 17 230", 3.33, "decode", 12, 4)
    assert r.served == {0: 200_000_000, 1: 100_000_000, 2: 100_000_000} and r.resolution == pytest.approx(0.005)


def test_ds4_bench_csv_and_the_readers_per_source_bytes():
    out = "48 241 66 11\nctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps\n12,8,16.0,4,2.0\n"
    err = "ds4: Argodrive source[0] bytes=100\nds4: Argodrive source[1] bytes=50\nds4: Argodrive source[0] bytes=10\n"
    r = ds4_argodrive_profile.read_run(out, err)
    assert r.output == "48 241 66 11" and r.served == {0: 110, 1: 50}
    assert r.tok_s == pytest.approx(4 / (8 / 16.0 + 4 / 2.0)) and (r.prompt_tokens, r.gen_tokens) == (8, 4)
    assert ds4_argodrive_profile.read_run("", err).tok_s is None


def test_what_each_engine_keeps_and_runs_by_default():
    env, note = colibri_profile.frozen_state("glm")
    assert env == {"USAGE_SAVE": "0"} and ".coli_usage" in note
    assert ds4_argodrive_profile.frozen_state() == ({}, ds4_argodrive_profile.frozen_state()[1])
    full = (("COLI_MODEL", "/m"), ("SNAP", "/m"), ("COLI_MODEL_MIRROR", "/g"), ("COLI_DISK_WEIGHTS", "2,1"),
            ("DIRECT", "1"), ("COLI_MIR_STRIPE", "1"))
    assert colibri_profile.default_environment(full) == full[:3]       # colibri probes its drives
    assert ds4_argodrive_profile.default_environment(()) is None       # ds4: the primary alone


def test_the_step_of_a_printed_number():
    assert (printed_step("14.1"), printed_step("3"), printed_step("2.467")) == (0.05, 0.5, 0.0005)


def test_ds4s_lines_calibrate_the_workload_but_say_no_compute():
    """ds4-bench's CSV row and the reader's per-source lines are a calibration record over the
    whole run (its bytes include the prompt's staged reads); ds4 prints no compute time and no
    loads in flight, so none is made up; without per-source lines (the primary alone) or a CSV
    row, nothing is recorded."""
    out = "48 241 66 11\nctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps\n12,8,16.0,4,2.0\n"
    err = ("ds4: Argodrive source[0] bytes=100\nds4: Argodrive source[1] bytes=50\nds4: Argodrive source[0] bytes=10\n"
           "ds4:   streaming expert cache budget=16 experts entries=16\n")
    cal = get_engine("ds4-argodrive").calibrate(out + err)
    assert cal["window"] == "run" and (cal["tokens"], cal["prompt_tokens"], cal["bytes_read"]) == (4, 8, 160)
    assert cal["run_s"] == pytest.approx(8 / 16.0 + 4 / 2.0) and cal["lines"]["cache_budget_experts"] == 16
    assert "compute_s" not in cal and "in_flight" not in cal
    assert get_engine("ds4-argodrive").calibrate(out) == {} and get_engine("ds4-argodrive").calibrate(err) == {}
