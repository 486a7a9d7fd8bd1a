"""The user's world in the pricing (planner/world.py, rigmodel.engine_world): the page cache's room
is the RAM the process runs under less the engine's own memory, so under a small budget a buffered
mode is priced from the drives; the engine's cache comes from its arguments or its last run's
lines; a plan predicts end-to-end tok/s from its reads and the engine's compute."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from core.ramlimit import RamLimit
from engines.colibri.colibri_workload import cache_per_layer, calibration_record, resident_bytes
from engines.registry import get_engine
from models.tensortable import inspect_model
from planner.cli import app
from planner.rigmodel import engine_world, problem_for_rig
from planner.solve import Pricer
from planner.world import calibrated_misses, compute_per_token, e2e, page_cache_room
from tests.planner.helpers import FAST, LAGGY, SLOW, make_dir_rig, write_dir_model

runner = CliRunner()
MiB, GB = 1 << 20, 10**9


def test_page_cache_room_is_the_ram_less_the_engines_own():
    assert page_cache_room(128 * GB, 40 * GB) == 88 * GB
    assert page_cache_room(1 * GB, 3 * GB) == 0          # the engine alone fills the budget
    assert page_cache_room(0, 1) == 0                    # RAM unknown: every read from a drive


def test_colibri_cache_follows_its_arguments_and_its_ram_check():
    """c/colibri.c coli_resolve_cap then cap_for_ram: argv[1], CAP, 8/64; lowered to what RAM_GB
    (or 88 % of MemAvailable) leaves after the resident weights and the slack; raised to the
    layer's experts unless CAP_RAISE=0."""
    eb, dense, layers, experts = 100 * MiB, 2 * GB, 4, 256
    big = 5000 * GB
    assert cache_per_layer(["4"], {"CAP_RAISE": "0"}, layers, experts, eb, dense, big) == 4
    assert cache_per_layer([], {"CAP": "6", "CAP_RAISE": "0"}, layers, experts, eb, dense, big) == 6
    assert cache_per_layer(["0"], {"CAP_RAISE": "0"}, layers, experts, eb, dense, big) == 8
    assert cache_per_layer([], {"CAP_RAISE": "0"}, layers, experts, eb, dense, big) == 64
    assert cache_per_layer(["4"], {}, layers, experts, eb, dense, big) == experts   # raised, at most the experts
    # RAM_GB=20: 20e9 - 2e9 - 3.7e9 - 64 experts of working set, over one expert in each of 4 layers
    raised = cache_per_layer(["4"], {"RAM_GB": "20"}, layers, experts, eb, dense, big)
    assert raised == int((20 * GB - dense - 3.7e9 - 64 * eb) / (layers * eb)) == 18
    assert cache_per_layer(["64"], {"RAM_GB": "20", "CAP_RAISE": "0"}, layers, experts, eb, dense, big) == raised
    assert resident_bytes(4, 10, experts, eb, dense) == dense + 40 * eb + 64 * eb


def dir_rig(tmp_path):
    model = write_dir_model(tmp_path / "m", "glm_moe_dsa")
    rig, _ = make_dir_rig(tmp_path / "rig", model, names=("fast", "slow", "laggy"), models=(FAST, SLOW, LAGGY))
    return rig, model


def test_under_a_small_budget_a_buffered_mode_is_priced_from_the_drives(tmp_path):
    """The same rig priced with the RAM of a machine holding the whole model and with a quarter of
    it (explicit RAM figures, no cgroup): the buffered mode's decode costs more drive time under the
    budget, O_DIRECT the same, and the room is the RAM less colibri's own memory."""
    rig, model = dir_rig(tmp_path)
    g = inspect_model(str(model))
    e = get_engine("colibri")
    args, env = ["2"], {"CAP_RAISE": "0"}
    own = e.own_workload(g, args, env, 0)
    big = engine_world(e, g, args, env, ram=RamLimit(own.resident_bytes + 2 * g.file_size, "cgroup v1"))
    small = engine_world(e, g, args, env, ram=RamLimit(own.resident_bytes + g.routed_bytes // 4, "cgroup v1"))
    assert big.page_cache_bytes >= g.routed_bytes and big.cache_experts == 2 * g.layers
    assert small.page_cache_bytes == g.routed_bytes // 4
    prices = {}
    for name, w in (("big", big), ("small", small)):
        _, _, prob = problem_for_rig(rig.root, None, "colibri", page_cache_bytes=w.page_cache_bytes,
                                     cache_experts=w.cache_experts)
        p = Pricer(prob)
        prices[name] = {m: p.price("decode", (1, 1, 1), frozenset(m)).seconds for m in ((), ("direct",))}
    assert prices["small"][()] > 1.5 * prices["big"][()]
    assert prices["small"][("direct",)] == pytest.approx(prices["big"][("direct",)])


def test_the_engines_measured_peak_is_its_memory_once_it_has_run(tmp_path):
    """After a run, the engine's own memory is its measured peak (launch's wait4 rusage), not its
    arguments' estimate (which knows no buffers or allocator), adjusted for the cache priced."""
    _, model = dir_rig(tmp_path)
    g = inspect_model(str(model))
    e = get_engine("colibri")
    args, env = ["2"], {"CAP_RAISE": "0"}
    ram = RamLimit(e.own_workload(g, args, env, 0).resident_bytes + 256 * 2**20, "cgroup v1")
    estimated = engine_world(e, g, args, env, ram=ram)
    peak = estimated.resident_bytes + 64 * 2**20
    ran = engine_world(e, g, args, env, ram=ram, calibration={"cache_per_layer": 2, "resident_bytes": peak})
    assert ran.resident_bytes == peak and ran.page_cache_bytes == estimated.page_cache_bytes - 64 * 2**20
    bigger = engine_world(e, g, args, env, ram=ram, cache_experts=3 * g.layers,
                          calibration={"cache_per_layer": 2, "resident_bytes": peak})
    assert bigger.resident_bytes == peak + g.layers * g.expert_bytes


def test_a_buffered_run_under_the_same_ram_caps_the_page_cache_share(tmp_path):
    """What the page cache served a buffered run (the drives' bytes against the engine's fetched
    bytes, measured by launch) caps the room the pricing counts on, under the RAM it was measured
    in only; a run with O_DIRECT says nothing of it."""
    from planner.world import measured_hits

    _, model = dir_rig(tmp_path)
    g = inspect_model(str(model))
    e = get_engine("colibri")
    args, env = ["2"], {"CAP_RAISE": "0"}
    ram = RamLimit(e.own_workload(g, args, env, 0).resident_bytes + 2 * g.file_size, "cgroup v1")
    full = engine_world(e, g, args, env, ram=ram)
    assert full.page_cache_bytes >= g.routed_bytes // 2
    # the drives served the model's bytes outside its experts once (the engine's dense weights) and
    # 98 % of the experts' bytes the engine fetched
    once = g.file_size - g.routed_bytes
    fetched = 10 * g.routed_bytes
    run = {"cache_per_layer": 2, "bytes_read": fetched, "storage_bytes": int(0.98 * fetched) + once, "buffered": True,
           "ram_bytes": ram.bytes}
    assert measured_hits(run, ram.bytes, once) == pytest.approx(0.02, abs=1e-6)
    capped = engine_world(e, g, args, env, ram=ram, calibration=run)
    assert capped.page_cache_bytes == int(0.02 * g.routed_bytes) and "served 2 %" in capped.page_cache_from
    for other in ({**run, "buffered": False}, {**run, "ram_bytes": 2 * ram.bytes}, {**run, "storage_bytes": None}):
        assert measured_hits(other, ram.bytes, once) is None
        assert engine_world(e, g, args, env, ram=ram, calibration=other).page_cache_bytes == full.page_cache_bytes
    assert measured_hits({**run, "storage_bytes": 3 * fetched}, ram.bytes, once) == 0.0   # readahead: more than fetched
    # the share is of everything the run fetched; the page cache can serve only what that run read
    # again, as many as its own prompt and tokens through its cache made
    from planner.workload import ModelShape, run_reread_share

    ran = {**run, "window": "run", "prompt_tokens": 12, "tokens": 16}
    reread = run_reread_share(ModelShape.from_geometry(g), ran, None)       # its cache: 2 per layer
    assert 0.0 < reread < 1.0
    short = engine_world(e, g, args, env, ram=ram, calibration=ran)
    assert short.page_cache_bytes == pytest.approx(0.02 / reread * g.routed_bytes, abs=1)
    assert f"{100 * 0.02 / reread:.0f} % of what it read again" in short.page_cache_from
    assert short.hit_share == pytest.approx(0.02, abs=1e-6)
    longer = run_reread_share(ModelShape.from_geometry(g), {**ran, "tokens": 400}, None)
    assert longer > reread            # a longer run reads more of it again: the same share asks less room


def test_what_a_buffered_run_read_beyond_its_fetches_prices_buffered_reads_dearer(tmp_path):
    """Where a buffered run's drives served more than it fetched (beyond the model's bytes outside
    its experts, read once), the excess is the kernel's readahead: buffered reads are priced at
    that many bytes per byte, O_DIRECT reads as before; nothing when the page cache served more
    than the readahead added, or the run did not say."""
    from planner.world import readahead_excess, served_ratio

    rig, model = dir_rig(tmp_path)
    g = inspect_model(str(model))
    e = get_engine("colibri")
    args, env = ["2"], {"CAP_RAISE": "0"}
    ram = RamLimit(e.own_workload(g, args, env, 0).resident_bytes + g.routed_bytes // 4, "cgroup v1")
    once, fetched = g.file_size - g.routed_bytes, 10 * g.routed_bytes
    run = {"cache_per_layer": 2, "bytes_read": fetched, "storage_bytes": int(1.05 * fetched) + once, "buffered": True,
           "ram_bytes": ram.bytes}
    assert served_ratio(run, ram.bytes, once) == pytest.approx(1.05, abs=1e-6)
    assert readahead_excess(run, ram.bytes, once) == pytest.approx(0.05, abs=1e-6)
    assert readahead_excess({**run, "storage_bytes": int(0.9 * fetched) + once}, ram.bytes, once) == 0.0
    assert readahead_excess({**run, "buffered": False}, ram.bytes, once) == 0.0
    world = engine_world(e, g, args, env, ram=ram, calibration=run)
    assert world.buffered_excess == pytest.approx(0.05, abs=1e-6) and world.hit_share == 0.0
    assert world.as_dict()["buffered_excess"] == world.buffered_excess
    # a room given (--page-cache) leaves the excess to the run; an excess given (a plan's, re-priced
    # outside the RAM it was measured in) is taken as it is
    given_room = engine_world(e, g, args, env, ram=ram, calibration=run, page_cache_bytes=0)
    assert given_room.buffered_excess == pytest.approx(0.05, abs=1e-6)
    assert engine_world(e, g, args, env, ram=RamLimit(1 << 40, "MemTotal"), calibration=run).buffered_excess == 0.0
    assert engine_world(e, g, args, env, ram=RamLimit(1 << 40, "MemTotal"), calibration=run,
                        buffered_excess=0.05).buffered_excess == 0.05
    _, _, prob = problem_for_rig(rig.root, None, "colibri", page_cache_bytes=0, cache_experts=world.cache_experts)
    plain, dearer = Pricer(prob), Pricer(replace(prob, buffered_excess=world.buffered_excess))
    for mode, factor in (((), 1.05), (("direct",), 1.0)):
        a, b = plain.price("decode", (1, 1, 1), frozenset(mode)), dearer.price("decode", (1, 1, 1), frozenset(mode))
        assert b.seconds == pytest.approx(factor * a.seconds, rel=1e-6)
        assert b.bytes == pytest.approx(factor * a.bytes, rel=1e-6) and b.reads == a.reads


def test_the_share_of_a_run_read_again_is_what_its_steps_read_before():
    """`reread_share`: the experts of the steps read before in the run, over all of theirs; the room
    a measured share needs is that share over it, at most all; a record that does not say how
    many tokens it ran asks the whole share."""
    from engines.pattern import Step
    from planner.workload import ModelShape, run_reread_share
    from planner.world import hit_room, reread_share

    steps = (Step("prefill", 0, (0, 1, 2, 3)), Step("decode", 0, (0, 1)), Step("decode", 0, (1, 4)))
    fresh = (Step("prefill", 0, (0, 1, 2, 3)), Step("decode", 0, ()), Step("decode", 0, (4,)))
    assert reread_share(steps, fresh) == pytest.approx(1 - 5 / 8)
    assert reread_share((), ()) == 1.0
    assert hit_room(0.3, 0.5) == pytest.approx(0.6) and hit_room(0.8, 0.5) == 1.0
    shape = ModelShape("m", 4, 16, 4, 1 << 20, 3, 3 << 20)
    assert run_reread_share(shape, {"window": "run", "prompt_tokens": 12}, 8) == 1.0
    run = run_reread_share(shape, {"window": "run", "prompt_tokens": 12, "tokens": 16}, 8)
    decode = run_reread_share(shape, {"window": "decode", "prompt_tokens": 12, "tokens": 16}, 8)
    assert 0.0 < run < decode < 1.0       # the prompt's first reads are outside a decode window


def test_calibration_sets_decode_reads_and_compute():
    cal = {"window": "run", "tokens": 16, "bytes_read": 1_108_000_000, "compute_s": 0.8}
    eb = 4_718_592
    # 234.8 experts over the run, 60 of them the prompt's: the rest over 16 tokens
    assert calibrated_misses(cal, eb, 60.0) == pytest.approx((1_108_000_000 / eb - 60) / 16)
    assert calibrated_misses({**cal, "window": "decode"}, eb, 60.0) == pytest.approx(1_108_000_000 / eb / 16)
    assert calibrated_misses({}, eb, 0) is None
    assert compute_per_token(cal) == {"prefill": 0.0, "decode": 0.05}
    p = e2e({"tokens": 16, "seconds": 4.0}, 0.05)
    assert p["e2e_seconds"] == pytest.approx(4.8) and p["e2e_tok_s"] == pytest.approx(16 / 4.8)
    assert e2e({"tokens": 16, "seconds": 4.0}, 0.5, overlap=True)["e2e_seconds"] == pytest.approx(8.0)


COLIBRI_LINES = "\n".join((
    'Expert cache hit rate: 21.7% (0 pin + 65 lru / 234 miss) | RSS: 0.11 GB | 13.6 tok/s',
    'PROFILE: expert-disk 0.499s service / 0.350s wait | expert-matmul 0.660s | attention 0.063s (includi'
    'ng kvb 0.007s) | lm_head 0.000s | other 0.099s',
    '[PROF] expert I/O: 1.108 GB fetched (69.2 MB/token, 0.94 GB/s over the run) | hit 21.7% (0 pin + 65 '
    'lru / 234 load) | 27.0 loads/token | 0.5s read service / 0.4s felt wait',
    '[PROF] DISK-CLASS (recency split): cold 104 x 0.49 GB @ 2.11 GB/s-thread, wall 0.2s @ 3.06 GB/s-wall'
    ', avg-conc 1.4 (direct 0/104) | warm 130 x 0.62 GB @ 2.67 GB/s-thread, wall 0.2s @ 3.13 GB/s-wall, a'
    'vg-conc 1.2 (direct 0/130) | disk-busy 0.3s (29% of window)',
    '[PROF] time shares: expert-I/O 30% | expert-matmul 56% | attention 5% | lm_head 0% | other 8%',
    '[PROF] machine: AMD EPYC | 2 cores (2 omp threads) | RAM 24.7 GB total, 23.7 GB available | backend '
    'CPU',
    '[PROF] config: RAM_GB=auto 20.9 CTX=4096 | expert cache cap 2/layer (up to 0.0 GB) | pinned 0 (0.0 G'
    'B) | DRAFT=0 PIPE=0 DIRECT=0 MMAP=0 IDOT=1 DSA=off PILOT=0 CACHE_ROUTE=0',
)) + "\n"


def test_colibri_lines_give_the_calibration_record():
    """The lines as the real GLM engine printed them (PROF=1, oracle mode, 16 tokens)."""
    r = calibration_record(COLIBRI_LINES)
    assert r["window"] == "run" and r["tokens"] == 16 and r["bytes_read"] == 1_108_000_000
    assert r["cache_per_layer"] == 2 and r["in_flight"] == 2 and r["overlap"] is False
    assert r["compute_s"] == pytest.approx(1.172 - 0.35)
    assert r["lines"]["avg_conc"] == pytest.approx((104 * 1.4 + 130 * 1.2) / 234)
    assert r["lines"]["hit_pct"] == 21.7 and r["lines"]["loads_per_token"] == 27.0
    assert calibration_record("no lines") == {}


def test_the_next_solve_uses_the_calibration_a_plan_carries(tmp_path):
    """A plan whose provenance holds the engine's calibration: the next `planner solve` prices the
    engine's cache, loads in flight and decode reads from it, predicts end to end beside reads
    only, and carries the record forward."""
    from dataclasses import replace

    from core.rig import load_rig
    from planner.plans import latest_plan, save_plan
    from planner.rigmodel import calibration_entry

    rig, model = dir_rig(tmp_path)
    r = runner.invoke(app, ["solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0", "--json"])
    assert r.exit_code == 0, r.output
    plan = latest_plan(load_rig(rig.root))
    g = inspect_model(str(model))
    cal = calibration_record(COLIBRI_LINES)
    save_plan(load_rig(rig.root), replace(plan, created="", provenance={
        **plan.provenance, "engine_calibration": calibration_entry("colibri", g.path, cal)}))
    r = runner.invoke(app, ["solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    world = doc["provenance"]["world"]
    assert world["cache_experts"] == 2 * g.layers and world["in_flight"] == 2
    assert doc["provenance"]["model"]["concurrency"]["decode"]["shared"] == 2
    assert doc["workload"]["traffic"]["source"] == "engine"
    assert doc["workload"]["traffic"]["cache_experts"] == 2 * g.layers
    dec = doc["decode"]["predicted"]
    assert dec["e2e_tok_s"] < dec["tok_s"] and dec["compute_s"] == pytest.approx(cal["compute_s"] / 16 * dec["tokens"])
    assert doc["provenance"]["engine_calibration"]["record"] == cal


def test_a_calibrated_plan_is_priced_again_as_it_was_solved(tmp_path):
    """`plan_problem` (whatif, sync --partial) rebuilds the calibrated workload, the loads in
    flight and the compute a plan recorded: the same prediction, end to end too."""
    from dataclasses import replace

    from core.rig import load_rig
    from engines.registry import get_engine as engine_of
    from planner.plans import latest_plan, load_inputs, save_plan
    from planner.rigmodel import calibration_entry, plan_problem
    from planner.solve import predict

    rig, model = dir_rig(tmp_path)
    assert runner.invoke(app, ["solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0"]).exit_code == 0
    plan = latest_plan(load_rig(rig.root))
    save_plan(load_rig(rig.root), replace(plan, created="", provenance={
        **plan.provenance, "engine_calibration": calibration_entry("colibri", inspect_model(str(model)).path,
                                                                   calibration_record(COLIBRI_LINES))}))
    assert runner.invoke(app, ["solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0"]).exit_code == 0
    plan = latest_plan(load_rig(rig.root))
    _, prob = plan_problem(load_rig(rig.root), load_inputs(rig.root), engine_of("colibri"), plan)
    again = predict(prob, "decode", plan.decode.weights, plan.switches)
    assert again["seconds"] == pytest.approx(plan.decode.predicted["seconds"])
    assert again["e2e_tok_s"] == pytest.approx(plan.decode.predicted["e2e_tok_s"])


def test_a_winner_reading_with_o_direct_carries_what_the_page_cache_served_the_buffered_arms():
    """The real-engine tuner's calibration is its winner's runs; when the winner reads with
    O_DIRECT, the buffered arms' runs under the same RAM (their medians) ride along as
    `buffered_run`, and the next solve caps the page cache's room with them."""
    from engine_bridge.tuning.judge import EngineRun
    from engine_bridge.tuning.real_engine import run_calibration
    from planner.world import measured_hits

    ram = 1 << 30
    direct = {"tokens": 6, "bytes_read": 1000, "buffered": False, "storage_bytes": 1030, "ram_bytes": ram}
    runs = [EngineRun(0, r, 1.0, 1.0, calibration=dict(direct)) for r in range(3)]
    runs += [EngineRun(1, r, 0.5, 2.0, calibration={**direct, "buffered": True, "storage_bytes": s})
             for r, s in enumerate((900, 950, 1100))]
    runs.append(EngineRun(1, 3, None, 2.0, calibration={**direct, "buffered": True, "storage_bytes": 10}, failed="crashed"))
    cal = run_calibration(runs, 0)
    assert cal["runs"] == 3 and cal["buffered"] is False
    assert cal["buffered_run"] == {"buffered": True, "bytes_read": 1000, "storage_bytes": 950, "ram_bytes": ram, "runs": 3,
                                   "tokens": 6}                         # how long they ran: their share of re-reads
    assert measured_hits(cal, ram) == pytest.approx(0.05)               # 1 - 950 / 1000, the failed run left out
    assert measured_hits(cal, 2 * ram) is None                           # another RAM: it says nothing
    assert "buffered_run" not in run_calibration(runs[:3], 0)            # no buffered arm ran: nothing rides along
    assert measured_hits({**direct}, ram) is None


def test_compute_the_engines_lines_do_not_give_is_inferred_from_its_arms(tmp_path):
    """An engine whose lines give no compute (ds4): the tuner's arms ran the same window with other
    weights, so what each took beyond its priced reads is its compute; the next solve takes the
    median over them as the compute per generated token, says so, and predicts end to end."""
    from core.rig import load_rig
    from planner.plans import latest_plan, save_plan
    from planner.rigmodel import _world_for_rig, arms_compute, calibration_entry
    from planner.solve import problem_prediction

    rig, model = dir_rig(tmp_path)
    r = runner.invoke(app, ["solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0", "--json"])
    assert r.exit_code == 0, r.output
    g = inspect_model(str(model))
    cal = {k: v for k, v in calibration_record(COLIBRI_LINES).items() if k not in ("compute_s", "overlap")}
    prompt, gen = cal.get("prompt_tokens") or 0, cal["tokens"]
    plan = latest_plan(load_rig(rig.root))

    def calibrated(record):
        save_plan(load_rig(rig.root), replace(plan, created="", provenance={
            **plan.provenance, "engine_calibration": calibration_entry("colibri", g.path, record)}))

    calibrated(cal)
    _, _, prob, world = _world_for_rig(rig.root, None, "colibri", page_cache_bytes=0)    # as `solve` below
    assert world.calibration == cal and not world.compute and world.compute_from == ""
    pricer = Pricer(prob)

    def reads(w, mode=()):       # the window's priced read seconds of an arm over every source
        per = {ph: problem_prediction(prob, pricer.price(ph, w, frozenset(mode)), w, frozenset(mode))
               for ph in ("prefill", "decode") if prob.phases[ph].steps}
        return sum(n * per[ph]["seconds"] / per[ph]["tokens"] for ph, n in (("prefill", prompt), ("decode", gen))
                   if ph in per and n)

    c = 0.25 * gen                # the engine's compute over the window, seconds
    arms = [{"weights": list(w), "mode": list(m), "sources": [0, 1, 2], "tok_s": gen / (reads(w, m) + c + d)}
            for w, m, d in (((1, 1, 1), (), 0.1), ((2, 1, 1), ("direct",), 0.0), ((4, 1, 1), (), -0.05))]
    compute, how = arms_compute(prob, cal, arms)
    assert compute == {"prefill": 0.0, "decode": pytest.approx(c / gen, rel=1e-6)}
    assert "inferred from 3 arms" in how
    assert arms_compute(prob, cal, arms[:1]) == ({}, "1 arm(s) with weights ran: 2 needed to tell compute from the reads")
    fast = [dict(a, tok_s=gen / (reads(a["weights"], a["mode"]) * 0.5)) for a in arms]
    assert arms_compute(prob, cal, fast)[0] == {}         # faster than the reads are priced: nothing to add

    calibrated({**cal, "arms": arms})
    r = runner.invoke(app, ["solve", "--rig", rig.root, "--engine", "colibri", "--page-cache", "0", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    world = doc["provenance"]["world"]
    assert world["compute_s_per_token"]["decode"] == pytest.approx(c / gen, rel=1e-6)
    assert world["compute_from"].startswith("inferred from 3 arms of the real-engine tuner")
    dec = doc["decode"]["predicted"]
    assert dec["e2e_tok_s"] < dec["tok_s"]


def test_the_tuner_records_each_qualified_arms_speed_for_the_next_solve():
    """What `arms_compute` reads: each qualified arm with weights, its median tok/s by the engine's
    own line over the runs that counted; the engine's default (no weights) and a gated arm left out."""
    from engine_bridge.tuning.judge import EngineArm, EngineRun
    from engine_bridge.tuning.real_engine import arm_speeds

    cands = [EngineArm("default", ("engine default",), None, default=True),
             EngineArm("2:1:1", ("model #1",), (2, 1, 1), (3, 1, 1), ("direct",), (0, 1, 2)),
             EngineArm("1:1:1", ("equal",), (1, 1, 1), None, (), (0, 1, 2)),
             EngineArm("drifted", ("capability",), (5, 1, 1), None, (), (0, 1, 2))]
    trials = [EngineRun(0, 0, 0.4, 1.0), EngineRun(1, 0, 0.8, 1.0), EngineRun(1, 1, 0.7, 1.0),
              EngineRun(1, 2, 0.9, 1.0), EngineRun(1, 3, None, 1.0, failed="crashed"), EngineRun(2, 0, 0.6, 1.0),
              EngineRun(3, 0, 0.9, 1.0)]
    out = arm_speeds(cands, trials, [True, True, True, False])
    assert out == [{"label": "2:1:1", "weights": [2, 1, 1], "decode_weights": [3, 1, 1], "mode": ["direct"],
                    "sources": [0, 1, 2], "tok_s": 0.8, "runs": 3},
                   {"label": "1:1:1", "weights": [1, 1, 1], "decode_weights": None, "mode": [], "sources": [0, 1, 2],
                    "tok_s": 0.6, "runs": 1}]
