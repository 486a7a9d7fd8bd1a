"""Never stalled at any speed: a crawling, slowing or bursty drive on slow, medium and fast drives,
short prompts and long, with the reader's defaults beside hedging only, neither, and the plan
that knows.

Three testbed drives (bench/testbed.py) hold byte-identical copies of one small model written by
`engine-bridge synth`; the plan's weights are 1:1:1, right for equal drives. Each *class* sets
the drives' read ceilings (the testbed is built once):

  slow     20 MB/s each; a crawl is 1 MB/s
  medium   150 MB/s each; a crawl is 5 MB/s
  fast     unthrottled (the loop devices share this machine's disk); a crawl is 10 MB/s

and how many tokens a run decodes (--gen-tokens): 16 on the slow and medium classes, 64 on the
fast one, whose 16 tokens last 0.2 s — too short for a crawl that starts during the run to end in
it, so recovery would go unseen.

and each *scenario* changes white or green while the embedded engine runs:

  crawl    white crawls from the start of the run to its end
  recover  white crawls from --crawl-at seconds after the run starts (its "run:" line) for
           --crawl-for seconds, then reads at its class's speed again
  half     green reads at half its class's speed for the whole run (in the fast class: half of
           what it delivers unthrottled beside the others, measured at the class's start)
  healthy  nothing changes (throttled drives deliver in bursts and stalls)

Arms, each a fresh `engine-bridge run --json` inside the drives' group (cold reads, an empty
expert cache), each pass through the arms in an order of its own (shuffled, seeded: --order,
--seed) within each class and prompt:

  reweigh  the engine's defaults: hedging, re-weighting and balancing
  hedge    hedging only (--no-reweigh --no-balance)
  neither  --no-hedge --no-reweigh --no-balance (the engine's own reads)
  alone    internal and green alone at 1:1 (the healthy drives: crawl's and recover's reference)
  best     the right static weights for green at half speed (half's reference): 2:1:2 where the
           drives are held to ceilings (slow, medium); in the fast class, where the two others are
           unthrottled and their speed is the CPU they get, what each of the three delivers while
           green is held to half and all three read at once, measured at the class's start (against
           a fixed 2:1:2 one build scored 0.82, 1.30 and 0.93 on three testbeds in one evening:
           docs/reader.md "Round 37")

and with --feature-arms two more in every scenario, to weigh each feature against hedging alone:

  h+b      hedging and balancing (--no-reweigh)
  h+r      hedging and re-weighting (--no-balance)

and with --tree DIR one more in every scenario, to weigh two builds of the reader side by side:

  tree     the engine's defaults run from another checkout DIR of replica-tuner (its own code,
           compiled in place or not: the header names its commit and its reader's build); printed
           beside the defaults, paired by pass: this build's tok/s, reader CPU and whole CPU over
           the other's

and with --control one more in every scenario (with --order alternate first in each pass, as far
from its reference in the run order as any arm is):

  twin     the scenario's reference arm run again: twin / reference is the bench's own noise on
           this machine (the same arm twice), printed with its 90% interval beside the target's
           ratio — a cell's cost can be told only where it is larger than that

healthy's reference is neither. Every cell is a class, a prompt (--short and --long tokens), a
scenario and a phase (prefill, steady decode): the median of --runs runs per arm, and the ratio
the issue's targets name (crawl and recover >= 0.9 of alone, half >= 0.95 of best, healthy
>= 0.98 of neither with no drive degraded), with the 90% interval of that ratio over the runs'
own noise (a seeded bootstrap of both arms' runs, `iobench.stats.ratio_interval`): a cell whose
interval holds the target is marked "within the noise of its runs" (more --runs tell); beside it
the same ratio paired by pass (the median of each pass's ratio of the two arms, with its 90%
interval, `iobench.stats.paired_ratio`: a drift of the machine between passes cancels); and per arm
the phase's median wait on reads and the rest of its time (the engine's compute, and whatever took
the CPU from it), so a miss shows whether the reads or the CPU cost it. The runs start once the
host has written the freshly made model out (`wait_writeback`), and each class's measured runs
after one warm-up run that is not counted (healthy drives, the engine's own reads, the first
prompt), made after the class's drives were measured: the first run after the testbed was built,
or after that measurement, was slow for reasons of no arm's (a short prompt's prefill up to four
times a warm one's), and it was always the defaults' (the first arm), which pulled the first
cell's median down (docs/reader.md "Round 19"). neither
runs once in crawl and recover (a run reads a crawler's share at its crawl: a minute in the slow
class). Each run's events are summarised (degraded / recovered / re-weighted, with times from the
start of its prefill and the phase each fell in: a crawl that recovers may fall in either) and the
output hashes compared per prompt and decode length (one expected
for each). Exit status: 0, every run done and one hash per prompt; 1, a run failed (its log's
last line is printed) or a prompt gave two hashes.

Run it as root (it takes the testbed lock and always takes the testbed down):

  .venv/bin/python -m bench.stall_bench [--class slow --class medium --class fast] [--runs 3]
      [--scenario crawl --scenario recover --scenario half --scenario healthy] [--prompt short --prompt long]
      [--pacing throttle|service] [--root DIR] [--ram SPEC] [--feature-arms]

--root builds the testbed in DIR: on a tmpfs (--root /dev/shm/sb) the fast class's loop devices
read from memory at GB/s, where drives are faster than the reader (docs/reader.md "Round 14").

--ram SPEC holds every run to a RAM budget, page cache included, as `iobench testbed up --ram`
takes it ("25%+512M": a quarter of the model, plus 512 MiB for the processes' own memory — the
model four times the page cache a user's rig gives it); a run killed for memory is a failed run.
The reads are O_DIRECT, so the budget holds the engine's own memory and the reader's buffer pool
(at most an eighth of what the process may fill), not a cache of the model.

--warm-memory SIZE (default 512M; 0: off) is memory the bench holds between runs and lets go just
before each one starts, so that run's fresh buffers come from memory freed a moment ago: on a VM
that hands freed memory back to its host (this one), memory freed more than a second or two
earlier faults in at ~0.1 GB/s instead of ~8, and a short prefill's buffers landed on one or the
other by chance — the alone arm, which never reads the crawler, prefilled the same 90 MB in
0.15–0.35 s (docs/reader.md "Round 24").

--pacing service (slow and medium classes) builds drives that serve each request in bytes / rate
and bank nothing while idle (`iobench testbed up --pacing service`); blk-throttle lets a drive
that idled serve its next read at once, which flatters every arm that leaves drives idle.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.engine_bench import synth_on_drives  # noqa: E402
from bench.testbed import (PACINGS, THROTTLE, Testbed, WarmMemory, require_testbed, usage_exit,  # noqa: E402
                           wait_writeback)
from core.errors import UsageError  # noqa: E402
from core.units import parse_size  # noqa: E402
from engine_bridge.reader import build  # noqa: E402
from engine_bridge.harness.arms import ArmSpec, plan_changes, run_time  # noqa: E402
from engine_bridge.harness.runner import engine_command, write_arm_plan  # noqa: E402
from engine_bridge.moe.threadtimes import GROUPS as THREADS  # noqa: E402  (a run's thread groups)
from iobench.stats import paired_ratio, ratio_interval  # noqa: E402

DRIVES = ("internal", "green", "white")
UNTHROTTLED = 0.0                # MB/s: no limit (the testbed lifts a drive's rule, cgroup v1 and v2)
CLASSES = {"slow": (20.0, 1.0), "medium": (150.0, 5.0), "fast": (UNTHROTTLED, 10.0)}   # (drive, crawl) MB/s
RECOVER = {"slow": (0.5, 2.0), "medium": (0.3, 0.6), "fast": (0.1, 0.3)}   # recover: crawl at, for (s after "run:"):
# in the fast class the prefill begins ~0.05-0.08 s after "run:" and the 16-token prompt's lasts ~0.2 s, so a
# crawl at 0.3 s fell in its decode in 18 of 20 runs (docs/reader.md "Round 16"); at 0.1 s it falls in both prefills
GENERATED = {"slow": 16, "medium": 16, "fast": 64}   # tokens decoded: sixteen last 0.2 s on the fast class, too short
                                                     # for a crawl that starts in the run to end in it
SCENARIOS = ("crawl", "recover", "half", "healthy")
ARMS = {"crawl": ("reweigh", "hedge", "neither", "alone"), "recover": ("reweigh", "hedge", "neither", "alone"),
        "half": ("reweigh", "hedge", "neither", "best"), "healthy": ("reweigh", "hedge", "neither")}
REFERENCE = {"crawl": "alone", "recover": "alone", "half": "best", "healthy": "neither"}
TARGET = {"crawl": 0.9, "recover": 0.9, "half": 0.95, "healthy": 0.98}
ONCE = {("crawl", "neither"), ("recover", "neither")}
FEATURE_ARMS = ("h+b", "h+r")   # --feature-arms: hedging with balancing, hedging with re-weighting (each feature's cost)
CONTROL = "twin"                 # --control: the reference arm again (the bench's own noise)
TREE = "tree"                    # --tree: the defaults, run from another checkout (two builds side by side)
FLAGS = {"reweigh": ["--hedge", "--reweigh", "--balance"], "hedge": ["--hedge", "--no-reweigh", "--no-balance"],
         "h+b": ["--hedge", "--no-reweigh", "--balance"], "h+r": ["--hedge", "--reweigh", "--no-balance"],
         "neither": ["--no-hedge", "--no-reweigh", "--no-balance"], "alone": ["--no-hedge", "--no-reweigh", "--no-balance"],
         "best": ["--no-hedge", "--no-reweigh", "--no-balance"]}
SHUFFLE, ALTERNATE = "shuffle", "alternate"   # --order: each pass in an order of its own, or forward then backward
AT_CEILINGS = (2, 1, 2)   # the best arm's weights where the drives are held to ceilings: green at half
REST_S = 0.5          # between runs: a throttle's unused budget must not carry into the next run


def measure_unthrottled(tb: Testbed, paths: list[str], seconds: float = 2.0) -> dict[str, float]:
    """MB/s each drive delivers unthrottled while all three read at once."""
    return dict(zip(DRIVES, _measure(tb, paths, seconds)))


def measure_alone(tb: Testbed, paths: list[str], seconds: float = 2.0) -> dict[str, float]:
    """MB/s each drive delivers unthrottled when it reads by itself: beside `measure_unthrottled`'s,
    what the drives share (loop devices over one disk give each alone what they split together)."""
    return {n: _measure(tb, [p], seconds)[0] for n, p in zip(DRIVES, paths)}


def _measure(tb: Testbed, paths: list[str], seconds: float) -> list[float]:
    """MB/s each of `paths` delivers unthrottled while they read at once (1 MiB O_DIRECT reads, 8 in
    flight each, through the project's cold reader), inside the drives' group."""
    code = (
        "import sys, threading, time; sys.path.insert(0, sys.argv[1])\n"
        "from core.coldio import ColdReader, aligned_buffer\n"
        "paths, secs = sys.argv[3:], float(sys.argv[2]); got = [0] * len(paths); stop = time.monotonic() + secs\n"
        "def lane(i, k):\n"
        "    r = ColdReader(paths[i]); buf = memoryview(aligned_buffer(1 << 20)); off = k << 20\n"
        "    while time.monotonic() < stop:\n"
        "        got[i] += r.read_into(buf, off); off = (off + (8 << 20)) % (r.size - (1 << 20)) // 4096 * 4096\n"
        "ts = [threading.Thread(target=lane, args=(i, k)) for i in range(len(paths)) for k in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(' '.join(str(g / secs / 1e6) for g in got))\n")
    p = tb.run([sys.executable, "-c", code, ROOT, str(seconds), *paths], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"stall_bench: measuring the drives failed: {p.stderr[-500:]}")
    return [float(x) for x in p.stdout.split()]


def measure_half(tb: Testbed, paths: list[str], half_of: dict[str, float]) -> dict[str, float]:
    """MB/s each drive delivers while all three read at once with green held to half of `half_of`'s
    (the fast class's half scenario, its others unthrottled): the right static weights for it."""
    tb.throttle("green", speeds("fast", "half", half_of)["green"])
    try:
        return measure_unthrottled(tb, paths)
    finally:
        tb.throttle("green", CLASSES["fast"][0])


def best_weights(under_half: dict[str, float] | None) -> tuple[int, ...]:
    """The best arm's weights: 2:1:2 for drives held to ceilings, else the drives' measured MB/s
    under the half scenario (`measure_half`), in a plan's terms (integers 1..100, the fastest 100)."""
    if under_half is None:
        return AT_CEILINGS
    top = max(under_half.values())
    return tuple(max(1, min(100, round(100 * under_half[n] / top))) if top > 0 else 1 for n in DRIVES)


def speeds(cls: str, scenario: str, half_of: dict[str, float]) -> dict[str, float]:
    """Each drive's read ceiling at the start of a run (MB/s)."""
    drive, crawl = CLASSES[cls]
    out = {n: drive for n in DRIVES}
    if scenario == "crawl":
        out["white"] = crawl
    elif scenario == "half":
        out["green"] = half_of["green"] / 2
    return out


def configured_as(scenario: str, arm: str) -> str:
    """The arm whose plan and flags `arm` runs with: the control runs its scenario's reference, the
    other tree the defaults."""
    return REFERENCE[scenario] if arm == CONTROL else "reweigh" if arm == TREE else arm


def spec_for(scenario: str, arm: str, paths: list[str], best: tuple[int, ...]) -> ArmSpec:
    name, arm = f"{scenario}-{arm}", configured_as(scenario, arm)
    if arm == "alone":
        return ArmSpec(name, tuple(paths[:2]), (1, 1), (1, 1))
    if arm == "best":
        return ArmSpec(name, tuple(paths), best, best)
    return ArmSpec(name, tuple(paths), (1, 1, 1), (1, 1, 1))


def run_arm(tb: Testbed, cls: str, scenario: str, arm: str, paths: list[str], settings: dict, workdir: str,
            seq: int, half_of: dict[str, float], args, pass_no: int = 0, best: tuple[int, ...] = AT_CEILINGS) -> dict:
    """One run (the `pass_no`th of its arm): the drives' ceilings set, the engine started, a crawl
    timed from its "run:" line for `recover`; the run's JSON result (or {'error': ...}). `best`: the
    best arm's weights (`best_weights`)."""
    for n, mbs in speeds(cls, scenario, half_of).items():
        tb.throttle(n, mbs)
    time.sleep(REST_S)
    spec = spec_for(scenario, arm, paths, best)
    plan = os.path.join(workdir, "plans", f"{spec.name}.json")
    write_arm_plan(spec, plan)          # every run: an --out reused from another testbed holds its drives' paths
    cmd = engine_command(spec, {**settings, "run_args": FLAGS[configured_as(scenario, arm)] + args.run_arg}, plan)
    base = os.path.join(workdir, "arms", f"{seq:03d}-{cls}-{settings['prompt_tokens']}-{spec.name}")
    drive, crawl = CLASSES[cls]
    with open(base + ".log", "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        mem0 = tb.memory_counters(reset=True) if args.ram else None   # under a budget: its peak, its limit hits
        use0 = resource.getrusage(resource.RUSAGE_CHILDREN)    # the run is the only child reaped meanwhile
        args.warm.release()             # the run's memory: what the bench held until now (`WarmMemory`)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,   # the other tree: its own code
                                cwd=args.tree if arm == TREE else None,      # (`python -c` imports from its cwd first)
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        at, span = RECOVER[cls] if args.crawl_at is None else (args.crawl_at, args.crawl_for)
        seen, crawled = [], []

        def watch():            # the run's "run:" line starts its clock; recover: the crawl, then back
            while proc.poll() is None and "run: " not in open(base + ".log", encoding="utf-8").read():
                time.sleep(0.005)
            seen.append(time.monotonic())
            if scenario != "recover":
                return
            while proc.poll() is None and time.monotonic() - seen[0] < at:
                time.sleep(0.005)
            tb.throttle("white", crawl)
            crawled.append(time.monotonic_ns())         # the engine's clock too (CLOCK_MONOTONIC, one per machine)
            while proc.poll() is None and time.monotonic() - seen[0] < at + span:
                time.sleep(0.005)
            tb.throttle("white", drive)
            crawled.append(time.monotonic_ns())

        timer = threading.Thread(target=watch, daemon=True)
        timer.start()
        out, _ = proc.communicate()
        ended = time.monotonic()
        use1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        mem1 = tb.memory_counters() if mem0 is not None else None
        timer.join()
    args.warm.hold()
    for n in DRIVES:
        tb.throttle(n, drive)
    if proc.returncode != 0:
        tail = [x for x in open(base + ".log", encoding="utf-8").read().splitlines() if x.strip()]
        return {"error": f"exit {proc.returncode}: {tail[-1] if tail else ''}", "bench_pass": pass_no}
    result = json.loads(out)
    result["bench_run_s"] = round(ended - seen[0], 3) if seen else None    # from its "run:" line to its end
    result["bench_pass"] = pass_no          # the pass it ran in (ratios are paired by pass)
    result["bench_crawl_ns"] = crawled     # recover: when white began to crawl and when it was lifted
    result["bench_major_faults"] = use1.ru_majflt - use0.ru_majflt   # pages read in from a drive (code or data not cached)
    result["bench_minor_faults"] = use1.ru_minflt - use0.ru_minflt   # pages mapped without a read
    result["bench_system_s"] = round(use1.ru_stime - use0.ru_stime, 3)   # the kernel's time for the run
    if mem0 is not None and mem1 is not None:   # the budget's group: its highest use in the run (None: the kernel
        result["bench_peak_mb"] = None if mem0["peak"] is None else round(mem1["peak"] / 1e6, 1)   # cannot restart it)
        result["bench_at_limit"] = mem1["at_limit"] - mem0["at_limit"]   # times its use reached the budget
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return result


def setup(tb: Testbed, out: str, cls: str, label: str, prompt: int, gen: int, args) -> tuple[dict, str]:
    """A set of runs' engine settings and folder (its arms' results and plans under `out/cls/label`)."""
    workdir = os.path.join(out, cls, label)
    os.makedirs(os.path.join(workdir, "arms"), exist_ok=True)
    os.makedirs(os.path.join(workdir, "plans"), exist_ok=True)
    return {"prompt_tokens": prompt, "gen_tokens": gen, "cache_experts": args.cache_experts, "wrap": tb.wrap}, workdir


def warm_up(tb: Testbed, cls: str, paths: list[str], settings: dict, workdir: str, args) -> str:
    """One run of the engine's own reads on healthy drives, not counted: the first run after the
    testbed was built or its drives were measured is slow for reasons of no arm's. Its line."""
    for n in DRIVES:
        tb.throttle(n, CLASSES[cls][0])
    r = run_arm(tb, cls, "healthy", "neither", paths, settings, workdir, 0, {}, args)
    if "error" in r:
        raise SystemExit(f"stall_bench: the warm-up run failed: {r['error']}")
    return (f"warm-up run (not counted): {cls}, prompt {settings['prompt_tokens']}, neither, prefill "
            f"{r['prefill_tps']:.2f} tok/s, steady decode {r['gen_steady_tps']:.2f}")


def arms_of(feature_arms: bool, control: bool = False, tree: bool = False) -> dict[str, tuple[str, ...]]:
    """Each scenario's arms: `ARMS`, with `TREE` and `FEATURE_ARMS` after the defaults and `CONTROL`
    first when asked for."""
    extra = ((TREE,) if tree else ()) + (FEATURE_ARMS if feature_arms else ())
    arms = {sc: (a[0], *extra, *a[1:]) for sc, a in ARMS.items()}
    return {sc: (CONTROL, *a) if control else a for sc, a in arms.items()}


def sequence(runs: int, scenarios=SCENARIOS, arms_by=ARMS, order: str = SHUFFLE,
             seed: int = 0) -> list[tuple[str, str, int]]:
    """(scenario, arm, pass) in run order for one class and prompt: each pass every arm once, in
    an order of its own drawn from `seed` (`order` shuffle), or forward, then backward, and so on
    (alternate); an arm run once is run in the first pass only. recover's alone arm is crawl's
    when crawl runs too. Alternating gives each arm the same neighbours in every pass and runs
    the first and last arms twice in a row at the passes' seams: a cost of its place in the order
    shows as the arm's, and more runs never average it out (docs/reader.md "Round 34")."""
    arms = [(sc, arm) for sc in scenarios for arm in arms_by[sc]
            if not (arm == "alone" and sc == "recover" and "crawl" in scenarios)]
    rng = random.Random(seed)
    out = []
    for k in range(runs):
        if order == SHUFFLE:
            this = rng.sample(arms, len(arms))
        else:
            this = arms if k % 2 == 0 else arms[::-1]
        out += [(sc, arm, k) for sc, arm in this if k == 0 or (sc, arm) not in ONCE]
    return out


def changes(result: dict) -> str:
    return "; ".join(plan_changes(result)) or "none"


def summary(cls: str, prompt: int, rows: list[tuple[str, str, dict]], scenarios=SCENARIOS,
            arms_by=ARMS) -> list[str]:
    """The cell lines of one class and prompt."""
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = []
    for sc in scenarios:
        med, runs, degraded, each, passes, kernel, watchdog = {}, {}, {}, {}, {}, {}, {}
        for arm in arms_by[sc]:
            src = "crawl" if (sc == "recover" and arm == "alone" and "crawl" in scenarios) else sc   # one alone arm
            rs = [r for s, a, r in rows if s == src and a == arm and "error" not in r]
            runs[arm] = len(rs)
            each[arm] = {k: [r[k] for r in rs] for k in ("prefill_tps", "gen_steady_tps")}
            passes[arm] = {k: {r["bench_pass"]: r[k] for r in rs} for k in ("prefill_tps", "gen_steady_tps")}
            for ph in ("prefill", "decode"):        # the whole process's CPU of the phase and its reader's, per pass
                passes[arm][ph + " cpu"] = {r["bench_pass"]: c for r in rs if (c := whole_cpu(r[ph]))}
                passes[arm][ph + " reader"] = {r["bench_pass"]: c for r in rs if (c := reader_cpu(r[ph])) is not None}
            med[arm] = {k: statistics.median(v) if v else None for k, v in each[arm].items()}
            for ph in ("prefill", "decode"):        # the engine's wait on reads, and the rest (its compute)
                med[arm][ph] = split_times([r[ph] for r in rs])
                med[arm][ph + " threads"] = thread_times([r[ph] for r in rs])
                med[arm][ph + " cpu"] = cpu_times([r[ph] for r in rs])
            degraded[arm] = [changes(r) for r in rs]
            kernel[arm] = kernel_use(rs)
            wd = [r["reader"]["watchdog"] for r in rs if (r.get("reader") or {}).get("watchdog")]
            watchdog[arm] = tuple(statistics.median(w[k] for w in wd) for k in ("rounds", "timer", "judged")) if wd else None
        ref = REFERENCE[sc]
        lines.append(f"== {cls} prompt {prompt} {sc}: runs " + " ".join(f"{a} {runs[a]}" for a in arms_by[sc]))
        for k, label in (("prefill_tps", "prefill"), ("gen_steady_tps", "steady decode")):
            vals = " ".join(f"{a} {f(med[a][k])}" for a in arms_by[sc])
            ratios = ", ".join(f"{a}/{ref} {f(_ratio(med, a, ref, k))}" for a in arms_by[sc] if a != ref)
            r = _ratio(med, "reweigh", ref, k)
            noise = ratio_interval(each["reweigh"][k], each[ref][k]) if r is not None else None
            lines.append(f"   {label:13} tok/s {vals}; {ratios}; target >= {TARGET[sc]} {verdict(r, noise, TARGET[sc])}"
                         + "; paired by pass " + (paired(passes["reweigh"][k], passes[ref][k], f"reweigh/{ref}") or "-"))
            if CONTROL in arms_by[sc]:
                lines.append(f"   {'':13} control: {noise_floor(each[CONTROL][k], each[ref][k], ref)}"
                             + "; paired by pass " + (paired(passes[CONTROL][k], passes[ref][k], f"{CONTROL}/{ref}") or "-"))
        for ph in ("prefill", "decode"):
            lines.append(f"   {ph:7} wait / rest ms " + ", ".join(
                f"{a} {'-' if med[a][ph] is None else '%.0f / %.0f' % med[a][ph]}" for a in arms_by[sc]))
            if any(med[a][ph + " threads"] for a in arms_by[sc]):
                lines.append(f"   {ph:7} on a core / waiting for one ms, " + " | ".join(THREADS) + " | minor faults: "
                             + ", ".join(f"{a} {format_threads(med[a][ph + ' threads'])}" for a in arms_by[sc]))
            if med[ref][ph + " cpu"] and any(med[a][ph + " cpu"] for a in arms_by[sc] if a != ref):
                lines.append(f"   {ph:7} the reader's CPU beyond {ref}'s, of {ref}'s whole CPU a run: " + ", ".join(
                    f"{a} {cpu_cost(med[a][ph + ' cpu'], med[ref][ph + ' cpu'])}" for a in arms_by[sc] if a != ref))
                lines.append(f"   {ph:7} the whole process's CPU over {ref}'s, paired by pass: " + (", ".join(
                    paired(passes[a][ph + " cpu"], passes[ref][ph + " cpu"], f"{a}/{ref}") or f"{a} -"
                    for a in arms_by[sc] if a != ref)))
        if TREE in arms_by[sc]:
            lines += tree_lines(passes, med)
        if any(watchdog.values()):
            lines.append("   hedging's watchdog a run, rounds / woken by a timer / that judged a piece out: " + ", ".join(
                f"{a} {'%.0f / %.0f / %.0f' % watchdog[a]}" for a in arms_by[sc] if watchdog[a]))
        budget = any("bench_at_limit" in r for s, _, r in rows if s == sc)      # held to a RAM budget
        lines.append("   page faults major / minor, system s, peak RSS MB"
                     + (", the budget's peak MB, times at the budget (fewest-most)" if budget else "")
                     + " a run " + (", " if not budget else "; ").join(f"{a} {kernel[a]}" for a in arms_by[sc]))
        for a in arms_by[sc]:
            if a in ("reweigh", TREE, "hedge"):
                lines.append(f"   {a} changes: " + " | ".join(degraded[a]))
        if sc == "healthy":
            bad = [a for a in ("reweigh", TREE, "hedge") if a in degraded for c in degraded[a] if "degraded" in c]
            lines.append(f"   healthy degrades: {len(bad)} ({', '.join(bad) or 'none'})")
    return lines


def tree_lines(passes: dict, med: dict) -> list[str]:
    """The defaults of this tree beside those of the other (--tree), per phase: tok/s over the
    other's, paired by pass; the reader threads' CPU beyond the other's (ms a run: the median of the
    per-pass differences, with the range) and the whole process's CPU over it, paired by pass."""
    lines = []
    for k, ph in (("prefill_tps", "prefill"), ("gen_steady_tps", "decode")):
        mine, other = passes["reweigh"], passes[TREE]
        diffs = sorted(mine[ph + " reader"][p] - other[ph + " reader"][p] for p in mine[ph + " reader"]
                       if p in other[ph + " reader"])
        extra = (f"{statistics.median(diffs) * 1e3:+.0f} ms (passes {diffs[0] * 1e3:+.0f} to {diffs[-1] * 1e3:+.0f}), "
                 f"{cpu_cost(med['reweigh'][ph + ' cpu'], med[TREE][ph + ' cpu'])} by the medians" if diffs else "-")
        lines.append(f"   {ph:7} this tree / {TREE}: tok/s " + (paired(mine[k], other[k], f"reweigh/{TREE}") or "-")
                     + f"; the reader's CPU beyond {TREE}'s, paired by pass: {extra}; the whole process's CPU "
                     + (paired(mine[ph + " cpu"], other[ph + " cpu"], f"reweigh/{TREE}") or "-"))
    return lines


def tree_build(tree: str) -> str:
    """The other tree's commit and which copy of its reader its runs use (`build.HOW`, asked from its
    own code as a run imports it), for the header."""
    code = "from engine_bridge.reader import build; print(build.HOW)"
    how = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
    rev = subprocess.run(["git", "-C", tree, "log", "-1", "--format=%h"], capture_output=True, text=True)
    if how.returncode:
        usage_exit(f"--tree {tree}: its reader does not import ({(how.stderr.strip().splitlines() or ['?'])[-1]})")
    return f"{rev.stdout.strip() or 'not a git checkout'}, reader {how.stdout.strip()}"


def kernel_use(results: list[dict]) -> str:
    """The medians of runs' major page faults (pages read in from a drive: code or data not in the
    page cache, evicted under a RAM budget), minor page faults, system seconds (the kernel's
    time: reclaim under a RAM budget lands here) and the engine's peak resident memory (its own,
    beside the page cache: what a budget must leave it); under a budget also the group's peak MB
    (page cache included) and the times its use reached the budget (range over the runs: a few
    runs that reach it hide in a median), '-' without runs."""
    rs = [r for r in results if "bench_system_s" in r]
    if not rs:
        return "-"
    med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
    out = f"{med('bench_major_faults'):.0f} / {med('bench_minor_faults'):.0f}, {med('bench_system_s'):.2f}"
    out += f", {med('peak_rss_bytes') / 1e6:.0f}" if all("peak_rss_bytes" in r for r in rs) else ", -"
    peaks = [r["bench_peak_mb"] for r in rs if r.get("bench_peak_mb") is not None]
    hits = [r["bench_at_limit"] for r in rs if "bench_at_limit" in r]
    if hits:
        out += f", {statistics.median(peaks):.0f}" if peaks else ", -"
        out += f", {min(hits)}-{max(hits)}"
    return out


def split_times(phases: list[dict]) -> tuple[float, float] | None:
    """The medians, in ms, of a phase's wait on reads and of the rest of its time (the engine's
    compute, and whatever took the CPU from it) over runs (each run's phase counters); None
    without runs. A cell's miss in the wait is the reader's; in the rest, the CPU's."""
    if not phases:
        return None
    wait = [p["read_wait_seconds"] for p in phases]
    rest = [p["seconds"] - p["read_wait_seconds"] for p in phases]
    return statistics.median(wait) * 1e3, statistics.median(rest) * 1e3


def thread_times(phases: list[dict]) -> tuple[float, ...] | None:
    """The medians, in ms, of a phase's time on a core and runnable without one, per group of
    THREADS (the engine's thread, its dequantizing helpers, the reader's), over runs; None without
    runs or counts. Beside `split_times`: the engine thread's rest is its time on a core, waiting
    for one, and asleep for something else than reads (its helpers, the interpreter's lock)."""
    ts = [p["threads"] for p in phases if p.get("threads")]
    if not ts:
        return None
    return (*(statistics.median(t[f"{g}_{k}_seconds"] for t in ts) * 1e3 for g in THREADS for k in ("cpu", "runq")),
            statistics.median(t.get("minor_faults", 0) for t in ts))


def cpu_times(phases: list[dict]) -> tuple[float, float] | None:
    """The medians, in ms, of a phase's CPU time of the reader's threads (THREADS' last group: its
    lanes and watchdog) and of all the process's threads, over runs; None without counts."""
    counted = [p for p in phases if p.get("threads")]
    if not counted:
        return None
    return (statistics.median(reader_cpu(p) for p in counted) * 1e3,
            statistics.median(whole_cpu(p) for p in counted) * 1e3)


def reader_cpu(phase: dict) -> float | None:
    """A run's phase's CPU seconds of the reader's threads (THREADS' last group); None without counts."""
    t = phase.get("threads")
    return t[f"{THREADS[-1]}_cpu_seconds"] if t else None


def whole_cpu(phase: dict) -> float | None:
    """A run's phase's CPU seconds, all its threads (THREADS' groups); None without counts."""
    t = phase.get("threads")
    return sum(t[f"{g}_cpu_seconds"] for g in THREADS) if t else None


def cpu_cost(arm: tuple[float, float] | None, ref: tuple[float, float] | None) -> str:
    """What an arm's reader threads use beyond the reference's, in ms a run and as a share of the
    reference's whole CPU: where the engine and the drives take every core (the fast class on this
    testbed) that share is what the features cost the run, a figure the machine's speed moves far
    less than the tok/s of so many runs ('-' without counts)."""
    if not arm or not ref or ref[1] <= 0:
        return "-"
    extra = arm[0] - ref[0]
    return f"{extra:+.0f} ms ({100 * extra / ref[1]:+.1f} %)"


def format_threads(t: tuple[float, ...] | None) -> str:
    """`thread_times`' medians as 'cpu / runq | ... | faults' ('-' without them)."""
    if not t:
        return "-"
    return " | ".join(f"{t[i]:.0f} / {t[i + 1]:.0f}" for i in range(0, len(t) - 1, 2)) + f" | {t[-1]:.0f}"


def verdict(r: float | None, noise: tuple[float, float] | None, target: float) -> str:
    """met or MISSED for the ratio of medians, with the runs' 90% interval of it (`ratio_interval`)
    when the target lies inside: that cell's runs cannot tell a miss from a hit."""
    if r is None:
        return "-"
    word = "met" if r >= target else "MISSED"
    if noise is None:
        return word
    lo, hi = noise
    return f"{word} (90% interval {lo:.2f}-{hi:.2f}{', within the noise of its runs' if lo < target <= hi else ''})"


def noise_floor(twin: list[float], ref: list[float], name: str) -> str:
    """The control's line: the reference arm beside itself run again, and how far that ratio of
    medians moves with the runs' noise (`ratio_interval`) — how small a cost this cell can tell."""
    if not twin or not ref:
        return "-"
    r = statistics.median(twin) / statistics.median(ref)
    noise = ratio_interval(twin, ref)
    spread = "" if noise is None else f" (90% interval {noise[0]:.2f}-{noise[1]:.2f})"
    return f"{CONTROL}/{name} {r:.2f}{spread}, the same arm twice"


def paired(xs: dict[int, float], ys: dict[int, float], name: str) -> str:
    """`name` and the median of the per-pass ratios of two arms with its 90% interval
    (`paired_ratio`): each pass's runs of the two arms ran minutes apart at most, so what moved the
    machine between passes cancels ('' with fewer than two passes holding both)."""
    got = paired_ratio([(xs[k], ys[k]) for k in sorted(xs) if k in ys])
    return "" if got is None else f"{name} {got[0]:.2f} (90% interval {got[1]:.2f}-{got[2]:.2f})"


def _ratio(med, a, b, k):
    x, y = med.get(a, {}).get(k), med.get(b, {}).get(k)
    return None if not x or not y else x / y


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--class", dest="classes", action="append", default=[], choices=list(CLASSES))
    ap.add_argument("--scenario", dest="scenarios", action="append", default=[], choices=list(SCENARIOS),
                    help="only these scenarios (default: all)")
    ap.add_argument("--prompt", dest="prompts", action="append", default=[], choices=("short", "long"),
                    help="only these prompts (default: both)")
    ap.add_argument("--runs", type=int, default=3, help="runs per arm (neither runs once in crawl and recover)")
    ap.add_argument("--short", type=int, default=16, help="the short prompt, tokens")
    ap.add_argument("--long", type=int, default=256, help="the long prompt, tokens")
    ap.add_argument("--gen-tokens", type=int, default=None,
                    help="tokens decoded (default per class: " + ", ".join(f"{c} {g}" for c, g in GENERATED.items()) + ")")
    ap.add_argument("--cache-experts", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--crawl-at", type=float, default=None,
                    help="recover: seconds after the run's 'run:' line (default per class: " +
                         ", ".join(f"{c} {a:g}" for c, (a, _) in RECOVER.items()) + ")")
    ap.add_argument("--crawl-for", type=float, default=None,
                    help="recover: seconds the crawl lasts (default per class: " +
                         ", ".join(f"{c} {b:g}" for c, (_, b) in RECOVER.items()) + ")")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--root", default=None,
                    help="the testbed's folder, where its drive images live (default: a new one in /var/tmp, on this "
                         "machine's disk); a folder on a tmpfs (e.g. under /dev/shm) makes the drives loop devices "
                         "over memory, GB/s each: NVMe's class, where the fast class on disk images reads at what "
                         "the disk gives (needs --size x 3 of free memory)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--feature-arms", action="store_true",
                    help="two more arms in every scenario, h+b (hedging and balancing) and h+r (hedging and "
                         "re-weighting): what each feature adds to hedging, beside the defaults (all three)")
    ap.add_argument("--control", action="store_true",
                    help="one more arm in every scenario, twin: its reference arm run again; "
                         "twin / reference and its 90%% interval are the bench's own noise, the least cost a cell "
                         "can tell apart from none")
    ap.add_argument("--tree", default=None, metavar="DIR",
                    help="another checkout of replica-tuner (its reader compiled in place, or not): one more arm in "
                         "every scenario, tree, the defaults run from its code, printed beside this tree's defaults "
                         "paired by pass (tok/s, the reader's CPU, the whole process's CPU): two builds side by "
                         "side in one bench")
    ap.add_argument("--order", default=SHUFFLE, choices=(SHUFFLE, ALTERNATE),
                    help="the arms' order in each pass: shuffle (each pass an order of its own, drawn from --seed "
                         "and the prompt) or alternate (forward, backward, ...: earlier rounds' order, where an "
                         "arm's place in it is a cost of its own) (default: shuffle)")
    ap.add_argument("--seed", type=int, default=0, help="the shuffled orders' seed (default: 0)")
    ap.add_argument("--ram", default=None,
                    help="hold every run to this RAM budget, page cache included, as `iobench testbed up --ram` takes "
                         "it: '25%%+512M' is a quarter of the model plus 512 MiB for the processes (default: none)")
    ap.add_argument("--run-arg", action="append", default=[],
                    help="one more argument for every run's `engine-bridge run`, as one word (e.g. "
                         "--run-arg=--dequant-threads=0: the engine computes on one thread, the reader has a core "
                         "to itself on a 2-core machine)")
    ap.add_argument("--pacing", default=THROTTLE, choices=PACINGS,
                    help="how the drives keep their ceilings (iobench testbed up --pacing): throttle (blk-throttle, "
                         "which banks credit while a drive idles) or service (each request served in bytes / rate, "
                         "nothing banked; slow and medium classes only)")
    ap.add_argument("--warm-memory", default="512M",
                    help="memory the bench holds between runs and lets go just before each one, so a run's fresh "
                         "buffers fault in as fast as on a machine that keeps its memory (a VM that returns freed "
                         "memory to its host faults it in again at ~0.1 GB/s; docs/reader.md \"Round 24\"); "
                         "0: off (default: 512M)")
    args = ap.parse_args()
    try:
        args.warm = WarmMemory(0 if args.warm_memory.strip() == "0" else parse_size(args.warm_memory, "--warm-memory"))
    except UsageError as e:
        usage_exit(str(e))
    if args.runs < 1:
        usage_exit(f"--runs {args.runs}: must be at least 1")
    if args.gen_tokens is not None and args.gen_tokens < 1:
        usage_exit(f"--gen-tokens {args.gen_tokens}: must be at least 1")
    generated = {c: GENERATED[c] if args.gen_tokens is None else args.gen_tokens for c in CLASSES}
    classes = args.classes or list(CLASSES)
    if args.pacing == "service" and "fast" in classes:
        usage_exit("--pacing service: the fast class is the loop devices unthrottled, and a daemon in the way would be "
                   "its ceiling; give --class slow and/or --class medium")
    scenarios = tuple(sc for sc in SCENARIOS if not args.scenarios or sc in args.scenarios)
    if args.tree is not None:
        args.tree = os.path.abspath(args.tree)
        if not os.path.isfile(os.path.join(args.tree, "engine_bridge", "cli.py")):
            usage_exit(f"--tree {args.tree}: not a checkout of replica-tuner (no engine_bridge/cli.py in it)")
    arms_by = arms_of(args.feature_arms, args.control, args.tree is not None)
    prompts = [p for k, p in (("short", args.short), ("long", args.long)) if not args.prompts or k in args.prompts]
    require_testbed(args.pacing)
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="stall-bench-", dir="/var/tmp"))  # (--tree runs elsewhere)
    t_start = time.monotonic()
    lines: list[str] = []
    hashes: dict[tuple[int, int], set] = {}     # (prompt, generated) -> output hashes
    ran = failed = 0
    with Testbed({n: CLASSES[classes[0]][0] for n in DRIVES}, size=args.size, root=args.root,
                 pacing=args.pacing, ram=args.ram) as tb:
        paths = [os.path.join(m, "model.gguf") for m in tb.mounts().values()]
        size = synth_on_drives(paths, args.layers, args.experts, 2, args.dim, args.ff, "q8_0")
        if args.ram:
            lines.append(tb.set_ram_for(paths[:1]))   # a share of one copy: a run reads the model's bytes once
        head = (f"model {size / 1e6:.0f} MB ({args.layers} layers x {args.experts} experts, dim {args.dim}, ff "
                f"{args.ff}, q8_0), plan 1:1:1; prompts {args.short} and {args.long} tokens, "
                + ", ".join(f"{c} {generated[c]}" for c in classes)
                + f" generated, {args.cache_experts}-expert cache; recover: white crawls "
                + ", ".join(f"{c} {a:g} s after 'run:' for {b:g} s" for c, (a, b) in
                            ({k: (args.crawl_at, args.crawl_for) for k in RECOVER} if args.crawl_at is not None
                             else RECOVER).items() if c in classes)
                + f"; {args.runs} runs per arm, "
                + (f"each pass in an order of its own (seed {args.seed})" if args.order == SHUFFLE
                   else "forward and backward")
                + f"; drives paced by {args.pacing}; reader {build.HOW}; "
                + (f"arm {TREE}: {args.tree} ({tree_build(args.tree)}); " if args.tree else "")
                + (f"{args.warm_memory} of memory let go before each run" if args.warm.nbytes else "no memory let go "
                   "before the runs (--warm-memory 0)")
                + (f"; every run also given {' '.join(args.run_arg)}" if args.run_arg else ""))
        print(head, flush=True)
        lines.append(head)
        args.warm.hold()
        line = "before the runs: " + wait_writeback()
        print(line, flush=True)
        lines.append(line)
        for cls in classes:
            for n in DRIVES:
                tb.throttle(n, CLASSES[cls][0])
            half_of = measure_unthrottled(tb, paths) if cls == "fast" else {n: CLASSES[cls][0] for n in DRIVES}
            alone = (", alone " + ", ".join(f"{n} {v:.0f}" for n, v in measure_alone(tb, paths).items()) + " MB/s"
                     if cls == "fast" else "")
            under_half = measure_half(tb, paths, half_of) if cls == "fast" and "half" in scenarios else None
            best = best_weights(under_half)
            line = (f"class {cls}: drives {', '.join(f'{n} {half_of[n]:.0f}' for n in DRIVES)} MB/s "
                    f"({'measured unthrottled, together' if cls == 'fast' else 'ceilings'}{alone}), crawl "
                    f"{CLASSES[cls][1]:g} MB/s, half: green at {speeds(cls, 'half', half_of)['green']:.0f} MB/s"
                    + (", the three together then " + ", ".join(f"{n} {under_half[n]:.0f}" for n in DRIVES) + " MB/s"
                       if under_half else "") + f", best {':'.join(map(str, best))}")
            print(line, flush=True)
            lines.append(line)
            gen = generated[cls]
            line = warm_up(tb, cls, paths, *setup(tb, out, cls, "warm-up", prompts[0], gen, args), args)
            print(line, flush=True)
            lines.append(line)
            for prompt in prompts:
                settings, workdir = setup(tb, out, cls, str(prompt), prompt, gen, args)
                rows = []
                for seq, (sc, arm, k) in enumerate(sequence(args.runs, scenarios, arms_by, args.order,
                                                             args.seed + prompt)):
                    r = run_arm(tb, cls, sc, arm, paths, settings, workdir, seq, half_of, args, k, best)
                    rows.append((sc, arm, r))
                    ran += 1
                    if "error" in r:
                        failed += 1
                        print(f"  {cls} {prompt} {sc} {arm}: FAILED {r['error']}", file=sys.stderr, flush=True)
                        continue
                    hashes.setdefault((prompt, gen), set()).add(r["output_sha256"])
                    crawl = r.get("bench_crawl_ns") or []
                    when = (f"; crawl from {run_time(r, crawl[0])} to {run_time(r, crawl[1])}"
                            if len(crawl) == 2 else "")
                    print(f"  {cls} {prompt} {sc:8} {arm:8} prefill {r['prefill_tps']:8.2f} steady "
                          f"{r['gen_steady_tps']:7.2f} (prefill {r['prefill']['seconds']:.2f} s, decode "
                          f"{r['decode']['seconds']:.2f} s, run {r['bench_run_s']} s{when})  {changes(r)}",
                          file=sys.stderr, flush=True)
                block = summary(cls, prompt, rows, scenarios, arms_by)
                print("\n".join(block), flush=True)
                lines += block
    tail = ("output hashes: " + ", ".join(f"prompt {p}+{g}: {len(h)} distinct ({', '.join(x[:12] for x in sorted(h))})"
                                          for (p, g), h in sorted(hashes.items()))
            + f"; {(time.monotonic() - t_start) / 60:.1f} min; runs in {out}")
    print(tail, flush=True)
    if failed:
        print(f"{failed} of {ran} runs failed (each above, as FAILED)", flush=True)
    return 0 if not failed and all(len(h) == 1 for h in hashes.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
