"""`engine-bridge autotune --binary`: the real-engine tuner (engine_bridge.tuning.real_engine) run end to
end against the stand-ins of colibri (its GLM and DeepSeek V4.1 engines) and ds4-argodrive on small
generated models with three copies, its gates tested with stand-ins that misbehave on purpose
(small wrappers written here: one drifts, one hangs, one crashes, one whose counters contradict the
profile, one that prints nothing), and its judgement (engine_bridge.tuning.judge) on trials made
up here."""

import json
import os
import sys

import pytest
from typer.testing import CliRunner

from core.errors import MismatchError, UsageError
from engine_bridge.cli import app
from engine_bridge.profiles.export import load_profile
from engine_bridge.standin import launcher_text
from engine_bridge.tuning.real_engine import tune_with_engine
from engine_bridge.tuning.judge import EngineArm, EngineRun, judge, predicted_tok_s
from planner.plans import latest_plan_path, load_plan
from tests.planner.helpers import COLI, colibri_copies_in, gguf_copies_in, rig_on

runner = CliRunner()
PROMPT = [3, 14, 15, 9, 2, 6]
GEN = 4


# ---------------------------------------------------------------------------------------------
# The judgement, on trials made up here

def pred(share, tokens=10.0, seconds=1.0, bps=100.0):
    return {"tokens": tokens, "seconds": seconds, "throughput_Bps": bps, "sources": [{"share": s} for s in share]}


DEFAULT = EngineArm("probe", ("engine default",), None, default=True, sources=(0, 1))
EQUAL = EngineArm("1:1", ("equal",), (1, 1), sources=(0, 1),
                  predicted={"prefill": pred((0.5, 0.5)), "decode": pred((0.5, 0.5))})
FAST = EngineArm("3:1", ("model #1",), (3, 1), sources=(0, 1),
                 predicted={"prefill": pred((0.75, 0.25)), "decode": pred((0.7, 0.3))})


def rounds(speeds, outputs=None, served=None, rnd=range(2)):
    """Trials of every arm in every round: speeds[arm] tok/s, outputs[arm] ('a' default)."""
    return [EngineRun(i, r, v, 1.0, (outputs or {}).get(i, "a"), (served or {}).get(i, {0: 50, 1: 50}))
            for r in rnd for i, v in enumerate(speeds)]


def test_a_non_default_arm_must_gain_the_minimum_over_the_engines_default():
    v = judge([DEFAULT, EQUAL], rounds([10.0, 10.2]), 2, "run", counters=True, min_gain_pct=3.0)
    assert v.best == 1 and v.winner == 0 and "below the 3 % a non-default arm must gain" in v.why
    v = judge([DEFAULT, EQUAL], rounds([10.0, 10.5]), 2, "run", counters=True, min_gain_pct=3.0)
    assert v.winner == 1 and v.gain_over_default_pct == pytest.approx(5.0) and v.gain_over_equal_pct == 0.0


def test_drift_disqualifies_the_arm_and_shows_both_outputs():
    v = judge([DEFAULT, EQUAL, FAST], rounds([10.0, 11.0, 12.0], outputs={2: "b"}), 2, "run", counters=True)
    assert not v.arms[2].qualified and v.arms[2].why == "output drifted: b where the reference is a"
    assert v.winner == 1 and v.reference == "a"


def test_only_rounds_every_qualified_arm_completed_count():
    trials = rounds([10.0, 11.0]) + [EngineRun(1, 2, 99.0, 1.0, "a", {0: 1, 1: 1})]   # round 3 cut short by the budget
    v = judge([DEFAULT, EQUAL], trials, 2, "run", counters=True)
    assert v.complete_rounds == (0, 1) and v.arms[1].runs == (11.0, 11.0)
    # an arm the budget never reached leaves every round incomplete: no pick
    v = judge([DEFAULT, EQUAL, FAST], rounds([10.0, 11.0]), 2, "run", counters=True)
    assert v.complete_rounds == () and v.winner is None and v.arms[2].why == "not run (the budget ended first)"


def test_a_winner_the_reverse_order_does_not_confirm_leaves_the_default():
    trials = rounds([10.0, 12.0]) + [EngineRun(0, -1, 11.0, 1.0, "a", {0: 1, 1: 1}),
                                     EngineRun(1, -1, 10.0, 1.0, "a", {0: 1, 1: 1})]
    v = judge([DEFAULT, EQUAL], trials, 2, "run", counters=True)
    assert v.confirmed is False and v.winner == 0 and v.challenger == 1 and "not confirmed in reverse order" in v.why
    trials[-1] = EngineRun(1, -1, 12.5, 1.0, "a", {0: 1, 1: 1})
    v = judge([DEFAULT, EQUAL], trials, 2, "run", counters=True)
    assert v.confirmed is True and v.winner == 1


def test_per_drive_bytes_outside_the_phases_predictions_fail_the_arm():
    ok = judge([FAST], rounds([10.0], served={0: {0: 72, 1: 28}}), 2, "run", counters=True, tolerance=0.05)
    assert ok.arms[0].qualified
    bad = judge([FAST], rounds([10.0], served={0: {0: 40, 1: 60}}), 2, "run", counters=True, tolerance=0.05)
    assert "per-drive bytes contradict the profile: shares 0.40/0.60" in bad.arms[0].why
    # an engine without per-drive counters is judged on its speed alone
    assert judge([FAST], rounds([10.0], served={0: {}}), 2, "run", counters=False).arms[0].qualified


def test_the_prediction_in_the_engines_own_figure():
    c = EngineArm("x", (), (1,), sources=(0,), predicted={"prefill": pred((1,), tokens=100, seconds=1.0),
                                                          "decode": pred((1,), tokens=10, seconds=2.0)})
    assert predicted_tok_s(c, "decode", None, None) == pytest.approx(5.0)
    # 8 prompt tokens at 0.01 s and 4 generated at 0.2 s
    assert predicted_tok_s(c, "run", 8, 4) == pytest.approx(4 / (8 * 0.01 + 4 * 0.2))
    assert predicted_tok_s(DEFAULT, "run", 8, 4) is None


def test_the_end_to_end_prediction_adds_the_engines_compute_and_the_report_shows_both_errors():
    from engine_bridge.tuning.judge import report_dict, report_lines
    from planner.world import e2e

    ph = {k: e2e(pred((0.5, 0.5), tokens=t, seconds=s), c) for k, t, s, c in (("prefill", 8, 0.08, 0.0),
                                                                             ("decode", 4, 0.8, 0.3))}
    arm = EngineArm("1:1", ("equal",), (1, 1), sources=(0, 1), predicted=ph)
    assert predicted_tok_s(arm, "run", 8, 4) == pytest.approx(4 / 0.88)
    assert predicted_tok_s(arm, "run", 8, 4, e2e=True) == pytest.approx(4 / (0.88 + 4 * 0.3))
    assert predicted_tok_s(EQUAL, "run", 8, 4, e2e=True) is None          # no compute known: reads only
    from dataclasses import replace

    trials = [replace(t, prompt_tokens=8, gen_tokens=4) for t in rounds([1.5, 2.0])]
    v = judge([DEFAULT, arm], trials, 2, "run", counters=True)
    a = v.arms[1]
    assert a.error_e2e_pct == pytest.approx(100 * ((4 / 2.08) / 2.0 - 1))
    assert a.error_pct == pytest.approx(100 * ((4 / 0.88) / 2.0 - 1))
    lines = report_lines(report_dict([DEFAULT, arm], trials, v, {"engine": "x"}))
    assert "reads err" in lines[3] and "e2e err" in lines[3]


def test_the_default_kept_for_want_of_a_confirmed_gain_is_not_marked_the_winner():
    """The measured run that showed it: the engine's default, the slowest arm, stayed because the
    faster arm's gain was not confirmed, and was marked '<- winner'."""
    from engine_bridge.tuning.judge import report_dict, report_lines

    trials = rounds([10.0, 12.0]) + [EngineRun(0, -1, 11.0, 1.0, "a", {0: 1, 1: 1}),
                                     EngineRun(1, -1, 10.0, 1.0, "a", {0: 1, 1: 1})]
    v = judge([DEFAULT, EQUAL], trials, 2, "run", counters=True)
    assert v.winner == 0 and v.best == 1
    lines = report_lines(report_dict([DEFAULT, EQUAL], trials, v, {"engine": "x"}))
    assert not any("<- winner" in x for x in lines)
    assert any(x.startswith("probe") and "<- kept (the engine's default: no gain confirmed)" in x for x in lines)
    assert any(x.startswith("kept: probe") for x in lines) and "measured best: 1:1 (its gain is not confirmed)" in lines
    v = judge([DEFAULT, EQUAL], rounds([10.0, 12.0]), 2, "run", counters=True)
    lines = report_lines(report_dict([DEFAULT, EQUAL], rounds([10.0, 12.0]), v, {"engine": "x"}))
    assert any(x.startswith("1:1") and x.endswith("<- winner") for x in lines)


# ---------------------------------------------------------------------------------------------
# End to end against the stand-ins

def stand_in(tmp_path, engine, wrap=None):
    """The stand-in's executable; `wrap`: a mode in which a wrapper around it misbehaves."""
    real = tmp_path / f"standin-{engine}"
    real.write_text(launcher_text(engine))
    real.chmod(0o755)
    if wrap is None:
        return str(real)
    w = tmp_path / f"wrapped-{wrap}"
    w.write_text(WRAPPER.format(python=sys.executable, real=str(real), mode=wrap))
    w.chmod(0o755)
    return str(w)


WRAPPER = '''\
#!{python}
# A stand-in that misbehaves on purpose. Variables: SNAP COLI_MODEL COLI_MODEL_MIRROR COLI_DISK_WEIGHTS DIRECT PROF
import os, re, signal, subprocess, sys, time
mode, direct = {mode!r}, os.environ.get("DIRECT") == "1"
if mode == "silent":
    sys.exit(0)
if mode == "hang" and direct:
    time.sleep(3600)
if mode == "crash" and direct:
    os.kill(os.getpid(), signal.SIGSEGV)
p = subprocess.run([{real!r}] + sys.argv[1:], capture_output=True, text=True)
out = p.stdout
if mode == "drift" and direct:
    out = re.sub(r"^(GLM C engine\\s*:\\s*)(\\d+)", lambda m: m.group(1) + str(int(m.group(2)) + 1), out, flags=re.M)
if mode == "contradict" and "COLI_DISK_WEIGHTS" in os.environ:
    out = re.sub(r"^MIRROR: primary [\\d.]+ GB \\(\\d+ reads\\)", "MIRROR: primary 0.00 GB (0 reads)", out, flags=re.M)
sys.stdout.write(out)
sys.stderr.write(p.stderr)
sys.exit(p.returncode)
'''


@pytest.fixture(scope="module")
def colibri_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune-colibri")
    paths = colibri_copies_in(d)
    ref = d / "ref.json"
    ref.write_text(json.dumps({"prompt_ids": PROMPT, "full_ids": PROMPT + [0] * GEN}))
    return paths, str(ref)


def colibri_run(tmp_path, models, binary, **kw):
    paths, ref = models
    rig_on(str(tmp_path / "rig"), paths)
    kw.setdefault("budget_s", 300)
    kw.setdefault("rounds", 1)
    return tune_with_engine(str(tmp_path / "rig"), binary, None, ["2"], allow_unverified=True,
                            inherited={**os.environ, "REF": ref}, **kw)


def test_the_loop_runs_colibris_stand_in_and_writes_the_report_the_profile_and_the_plan(tmp_path, colibri_models):
    events = []
    doc, folder = colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri"), on_event=events.append)
    roles = [r for a in doc["arms"] for r in a["roles"]]
    assert doc["arms"][0]["roles"] == ["engine default"] and doc["arms"][0]["weights"] is None   # colibri's probe
    assert "equal" in roles and "fastest drive alone" in roles and any(r.startswith("mode ") for r in roles)
    assert {tuple(a["mode"]) for a in doc["arms"]} >= {(), ("direct",)}
    assert all(a["qualified"] for a in doc["arms"]), [a["why"] for a in doc["arms"]]
    assert doc["frozen_env"] == {"USAGE_SAVE": "0"} and doc["engine"] == "colibri"
    assert doc["measured_by"] == "the engine's tok/s and its per-drive byte counters"
    assert len({t["output"] for t in doc["trials"]}) == 1 and doc["reference_output"]
    assert doc["verdict"]["winner"] is not None and doc["complete_rounds"] == [0]
    for f in ("report.json", "report.md", "winner.json", "winner.env"):
        assert os.path.isfile(os.path.join(folder, f))
    # the arms are exported without N-1 profiles, the winner with them, beside it as its provenance names them
    assert not list((tmp_path / "rig" / "runs").glob("engine-tune-*/profiles/*.without-*"))
    winner = load_profile(os.path.join(folder, "winner.json"))
    fallbacks = winner.provenance.get("fallbacks", {})      # the winner is whichever arm measured fastest here:
    assert len(fallbacks) == (winner.sources if winner.sources > 1 else 0)    # one drive alone has no N-1 profile
    assert all(os.path.isfile(os.path.join(folder, f["profile"])) for f in fallbacks.values())
    assert any(e.startswith(f"arm 1 of {len(doc['arms'])} (engine default (probe)), round 1; 0/300 s") for e in events)
    plan = load_plan(latest_plan_path(__import__("core.rig", fromlist=["load_rig"]).load_rig(str(tmp_path / "rig"))))
    t = plan.provenance["engine_trials"]
    assert t["engine"] == "colibri" and len(t["arms"]) == len(doc["arms"])
    # the probe's profile leaves the weights and switches to colibri
    probe = json.load(open(doc["arms"][0]["profile"]))
    env = dict(probe["environment"]) if isinstance(probe["environment"], dict) else dict(probe["environment"])
    assert "COLI_DISK_WEIGHTS" not in env and "COLI_DISK_WEIGHTS" in probe["unset"]


def test_an_arm_whose_output_drifts_is_disqualified_and_shown(tmp_path, colibri_models):
    doc, _ = colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri", "drift"))
    direct = [a for a in doc["arms"] if "direct" in a["mode"]]
    assert direct and all(not a["qualified"] and a["why"].startswith("output drifted: ") for a in direct)
    assert all(a["qualified"] for a in doc["arms"] if "direct" not in a["mode"])


def test_an_arm_that_hangs_is_killed_after_its_timeout_and_the_loop_goes_on(tmp_path, colibri_models):
    # the timeout is ten times a healthy arm's run on an idle machine (about 1.5 s), so the arms that
    # do not hang finish inside it even on a machine busy with other work; only the direct arms hang
    doc, _ = colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri", "hang"), timeout_s=15)
    direct = [a for a in doc["arms"] if "direct" in a["mode"]]
    assert direct and all(a["why"] == "hung past the arm's timeout (15 s): killed" for a in direct)
    assert sum(a["qualified"] for a in doc["arms"]) == len(doc["arms"]) - len(direct)


def test_an_arm_that_crashes_fails_with_its_signal(tmp_path, colibri_models):
    doc, _ = colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri", "crash"))
    direct = [a for a in doc["arms"] if "direct" in a["mode"]]
    assert direct and all(a["why"] == "crashed: killed by signal 11" for a in direct)


def test_counters_that_contradict_the_profile_fail_the_arm_with_launchs_reason(tmp_path, colibri_models):
    doc, _ = colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri", "contradict"))
    weighted = [a for a in doc["arms"] if a["weights"] and len(a["sources"]) > 1]
    assert weighted and all(a["why"].startswith("not confirmed: served: primary served nothing") for a in weighted)
    assert doc["arms"][0]["qualified"]           # the probe sets no weights: the wrapper left it alone


def test_a_stand_in_that_prints_nothing_fails_every_arm_and_the_command(tmp_path, colibri_models):
    with pytest.raises(MismatchError, match=r"no arm qualified: engine default \(probe\): not confirmed"):
        colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri", "silent"))
    assert os.path.isfile(next((tmp_path / "rig" / "runs").glob("engine-tune-*/report.json")))


def test_a_missing_binary_or_no_budget_is_one_line_before_anything_runs(tmp_path, colibri_models):
    paths, ref = colibri_models
    rig_on(str(tmp_path / "rig"), paths)
    r = runner.invoke(app, ["autotune", "--rig", str(tmp_path / "rig"), "--binary", str(tmp_path / "nope"), "--", "2"])
    assert r.exit_code != 0 and "nope" in r.output and "Traceback" not in r.output
    with pytest.raises(UsageError, match="positive seconds"):
        tune_with_engine(str(tmp_path / "rig"), stand_in(tmp_path, "colibri"), budget_s=0)
    assert not (tmp_path / "rig" / "runs").exists()


def test_a_budget_too_small_for_a_round_is_an_error_not_a_pick(tmp_path, colibri_models):
    with pytest.raises(UsageError, match="no complete round of the arms within --budget 1 s"):
        colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri"), budget_s=1, rounds=None)


def test_the_loop_runs_colibris_v41_stand_in(tmp_path):
    from dataclasses import replace as dc_replace

    paths = colibri_copies_in(tmp_path, dc_replace(COLI, model_type="deepseek_v41"))
    rig_on(str(tmp_path / "rig"), paths)
    binary = stand_in(tmp_path, "colibri")
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"prompt_ids": PROMPT, "output_ids": [0] * GEN}))
    import subprocess

    # the reference: what the engine says alone (V4.1's reference mode exits 1 on a mismatch)
    p = subprocess.run([binary, "2", str(ref)], env={**os.environ, "SNAP": paths[0]}, capture_output=True, text=True)
    assert p.returncode == 1 and f"Matching tokens: 0/{GEN}" in p.stderr or p.returncode == 0
    ref.write_text(json.dumps({"prompt_ids": PROMPT, "output_ids": [int(x) for x in p.stdout.split()]}))
    doc, _ = tune_with_engine(str(tmp_path / "rig"), binary, None, ["2", str(ref)], budget_s=300, rounds=1,
                              allow_unverified=True)
    assert doc["speed_kind"] == "decode" and all(a["qualified"] for a in doc["arms"]), [a["why"] for a in doc["arms"]]
    assert not any("direct" in a["mode"] and "stripe" in a["mode"] for a in doc["arms"])   # V4.1 never stripes
    assert any(line.startswith("MIRROR: primary") for t in doc["trials"] for line in t["lines"])


def test_the_command_runs_ds4_argodrives_stand_in(tmp_path):
    paths = gguf_copies_in(tmp_path)
    rig_on(str(tmp_path / "rig"), paths)
    r = runner.invoke(app, ["autotune", "--rig", str(tmp_path / "rig"), "--binary", stand_in(tmp_path, "ds4-argodrive"),
                            "--rounds", "1", "--cache-experts", "4", "--allow-unverified", "--json", "--",
                            "--prompt-tokens", "8", "--gen-tokens", str(GEN)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["kind"] == "engine-tune" and doc["schema"] == 1 and doc["engine"] == "ds4-argodrive"
    assert doc["arms"][0]["roles"][0] == "engine default" and doc["arms"][0]["sources"] == [0]   # ds4 alone
    assert doc["frozen_env"] == {}
    multi = [t for t in doc["trials"] if len(doc["arms"][t["arm"]]["sources"]) > 1]
    assert multi and all(len(t["served"]) == 3 for t in multi)        # ds4's source[i] bytes= lines
    assert all(a["qualified"] for a in doc["arms"]), [a["why"] for a in doc["arms"]]


def test_an_interrupt_keeps_the_complete_rounds_and_runs_no_confirmation(tmp_path, colibri_models):
    events = []

    def stop():           # Ctrl-C once the first round and one arm of the second have run
        arms = int(events[0].split(" arms:")[0])
        return sum(e.startswith("  arm ") and "tok/s" in e for e in events) > arms

    doc, _ = colibri_run(tmp_path, colibri_models, stand_in(tmp_path, "colibri"), rounds=None, on_event=events.append,
                         stop=stop)
    assert doc["interrupted"] and doc["complete_rounds"] == [0] and len(doc["trials"]) == len(doc["arms"]) + 1
    assert all(t["round"] >= 0 for t in doc["trials"]) and doc["verdict"]["confirmed"] is None


def test_a_calibrated_problem_leaves_out_alternatives_predicted_far_slower_end_to_end():
    from engine_bridge.tuning.real_engine import prune_calibrated
    from planner.world import e2e

    def arm(label, roles, dec_s):
        return EngineArm(label, roles, (1, 1), sources=(0, 1),
                         predicted={"prefill": e2e(pred((0.5, 0.5), tokens=8, seconds=0.1), 0.0),
                                    "decode": e2e(pred((0.5, 0.5), tokens=4, seconds=dec_s), 0.1)})

    pick, near, far = arm("pick", ("model #1",), 1.0), arm("near", ("model #2",), 1.2), arm("far", ("mode direct",), 4.0)
    slow_equal = arm("eq", ("equal",), 9.0)
    kept, left = prune_calibrated([DEFAULT, pick, near, far, slow_equal], 8, 4)
    assert [a.label for a in kept] == ["probe", "pick", "near", "eq"]        # the baselines always run
    assert [x["label"] for x in left] == ["far"] and "slower than the pick end to end" in left[0]["why"]
    # without end-to-end predictions (no calibration) every arm runs
    assert prune_calibrated([DEFAULT, EQUAL, FAST], 8, 4) == ([DEFAULT, EQUAL, FAST], [])
