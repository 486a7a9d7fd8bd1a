"""colibri's own workload: the expert cache its arguments give it, the memory it keeps of its own,
how many loads it keeps in flight, and what its `[PROF]` lines say a run did (pure; read from
c/colibri.c, docs/engine-profiles.md "colibri's own workload").

The cache (c/colibri.c `main` -> `coli_resolve_cap`, then `cap_for_ram`):
- `cap`: argv[1] when given and not 0, else the CAP variable when not 0, else 8 when an argument
  was given (the coli launcher's "0 = auto"), 64 for a bare binary (`coli_resolve_cap`; the
  Metal fast-SSD default of 1 does not apply to the CPU build);
- `cap_for_ram` takes the RAM budget RAM_GB (GB, 1e9 bytes), or 88 % of MemAvailable at start
  when RAM_GB is unset or <= 0 (`g_mem_avail_boot*0.88`, MemAvailable: colibri does not read a
  memory cgroup's limit), subtracts the resident weights and a slack of 1.2 GB + 2.5 GB (its
  page-cache reserve) + 64 experts of working set + the KV pool, and divides the rest by one
  expert in every layer (`row_b`): capmax. A cap above capmax is lowered to it (floor 1); below it, CAP_RAISE
  (default on for the CPU build) raises it to min(capmax, experts per layer).
  The KV pool and attention scratch (`kv_pool_bytes`, kvb) depend on CTX and the attention shape,
  which a plan does not know: they are left out (the run's `[PROF] config` line is the answer).
- With PIPE off (the default outside Windows, `main`: getenv("PIPE") ?: 0) a layer's misses are
  loaded by `#pragma omp parallel for` in `moe()` and compute waits for all of them: in flight are
  the OpenMP threads (the `[PROF] machine` line's "omp threads"), and reads do not overlap compute.

The lines (c/colibri.c `prof_report` and `prof_config`, with PROF=1; `profile_print` always):
  `[PROF] config: RAM_GB=... | expert cache cap %d/layer (up to %.1f GB) | ... PIPE=%d DIRECT=%d ...`
  `[PROF] machine: CPU | %d cores (%d omp threads) | RAM ...`
  `[PROF] expert I/O: %.3f GB fetched (%.1f MB/token, ...) | hit %.1f%% (...) | %.1f loads/token | ...`
  `[PROF] DISK-CLASS (recency split): cold %llu x ... avg-conc %.1f (...) | warm %llu x ... avg-conc %.1f ...`
  `[PROF] time shares: expert-I/O %.0f%% | expert-matmul %.0f%% | attention %.0f%% | lm_head %.0f%% | other %.0f%%`
  `PROFILE: expert-disk %.3fs service / %.3fs wait | expert-matmul ... | other %.3fs` (`colibri_log.read_timing`)
The `[PROF] expert I/O` window (`prof_report`'s `tokens`) is the generated tokens; in the GLM
engine's oracle mode (REF=) it spans the whole `generate` (the prompt's loads too), and so does
the one PROFILE line it prints.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from .colibri_log import read_timing

GB = 1e9
AUTO_SHARE = 0.88                 # cap_for_ram: the automatic budget is 88 % of MemAvailable at start
SLACK_BYTES = 1.2e9 + 2.5e9       # cap_for_ram: activations/overhead + the page-cache reserve
WORKING_SET = 64                  # cap_for_ram: ws[64] slabs, one expert each
CAP_DEFAULT_ARG, CAP_DEFAULT_BARE = 8, 64   # coli_resolve_cap

ENV_CAP, ENV_CAP_RAISE, ENV_RAM_GB = "CAP", "CAP_RAISE", "RAM_GB"

_CONFIG = re.compile(r"^\[PROF\] config: .*?expert cache cap (\d+)/layer.*?PIPE=(\d+) DIRECT=(\d+)", re.M)
_MACHINE = re.compile(r"^\[PROF\] machine: .*?\| (\d+) cores \((\d+) omp threads\)", re.M)
_IO = re.compile(r"^\[PROF\] expert I/O: ([\d.]+) GB fetched \(([\d.]+) MB/token.*?\| hit ([\d.]+)% \(.*?\) \| "
                 r"([\d.]+) loads/token", re.M)
_CLASS = re.compile(r"^\[PROF\] DISK-CLASS \(recency split\): cold (\d+) x .*?avg-conc ([\d.]+) .*?\| "
                    r"warm (\d+) x .*?avg-conc ([\d.]+)", re.M)
_SHARES = re.compile(r"^\[PROF\] time shares: expert-I/O (\d+)% \| expert-matmul (\d+)% \| attention (\d+)% \| "
                     r"lm_head (\d+)% \| other (\d+)%", re.M)


def _int(v, default: int = 0) -> int:
    """C's atoi: leading digits, 0 when none."""
    m = re.match(r"\s*([+-]?\d+)", str(v or ""))
    return int(m.group(1)) if m else default


def _float(v) -> float:
    """C's atof: a leading number, 0 when none."""
    m = re.match(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", str(v or ""))
    return float(m.group(1)) if m else 0.0


def asked_cap(args: Sequence[str], env: Mapping[str, str]) -> int:
    """The cache per layer asked before the RAM check (`coli_resolve_cap`): argv[1], CAP, 8 / 64."""
    given = len(args) > 0
    cli = _int(args[0]) if given else 0
    if given and cli:
        return cli
    env_cap = _int(env.get(ENV_CAP))
    if env_cap:
        return env_cap
    return CAP_DEFAULT_ARG if given else CAP_DEFAULT_BARE


def cache_per_layer(args: Sequence[str], env: Mapping[str, str], layers: int, experts: int, expert_bytes: int,
                    dense_bytes: int, mem_available: int) -> int:
    """Experts per layer colibri's LRU holds (`cap_for_ram`), from its arguments and environment,
    the model (layers with routed experts, routed experts per layer, bytes of one expert, the
    resident non-expert bytes) and MemAvailable at its start (bytes; what it budgets from when
    RAM_GB is unset). One slot per layer costs an expert in every layer (`row_b`)."""
    cap = asked_cap(args, env)
    ram_gb = _float(env.get(ENV_RAM_GB))
    budget = ram_gb * GB if ram_gb > 0 else max(AUTO_SHARE * mem_available, 8 * GB if mem_available * AUTO_SHARE < 4 * GB
                                                else 0)
    avail = budget - dense_bytes - SLACK_BYTES - WORKING_SET * expert_bytes
    row = expert_bytes * max(1, layers)
    capmax = max(1, int(avail / row)) if avail > 0 and row > 0 else 1
    if capmax < cap:
        return min(capmax, experts)
    raise_on = _int(env.get(ENV_CAP_RAISE)) if env.get(ENV_CAP_RAISE) is not None else 1    # set: atoi
    # a layer never holds more experts than it has, whatever the cap's slots
    return min(experts, max(cap, min(capmax, experts)) if raise_on else cap)


def resident_bytes(per_layer: int, layers: int, experts: int, expert_bytes: int, dense_bytes: int) -> int:
    """What colibri keeps in RAM of its own: the non-expert weights, its LRU (per_layer experts in
    every layer) and the working set of a layer's loads (min(64, experts) slabs, `ws[64]`)."""
    return int(dense_bytes + per_layer * layers * expert_bytes + min(WORKING_SET, experts) * expert_bytes)


@dataclass(frozen=True)
class Calibration:
    """What one run's lines say the engine did (None: the line was not printed)."""
    cache_per_layer: int | None = None      # `[PROF] config`: expert cache cap N/layer
    pipe: int | None = None                 # `[PROF] config`: PIPE (0: reads do not overlap compute)
    direct: int | None = None
    omp_threads: int | None = None          # `[PROF] machine`: the loads in flight with PIPE off
    fetched_gb: float | None = None         # `[PROF] expert I/O`: expert bytes read (GB, 1e9)
    mb_per_token: float | None = None       # MB (1e6) read per generated token
    hit_pct: float | None = None            # its expert cache's hit rate
    loads_per_token: float | None = None    # expert requests per generated token (hits and loads)
    tokens: int | None = None               # the window's generated tokens (fetched / MB per token)
    avg_conc: float | None = None           # loads in flight on average (DISK-CLASS, cold and warm by count)
    io_share_pct: float | None = None       # `[PROF] time shares`: expert-I/O
    run_s: float | None = None              # the PROFILE line's seconds (its parts summed)
    wait_s: float | None = None             # of which waiting for expert reads
    compute_s: float | None = None          # the rest: matmul, attention, lm_head, other

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def calibrate(text: str) -> Calibration:
    """The run's workload from its lines (stdout and stderr together): the last of each line."""
    got: dict = {}
    if m := _CONFIG.findall(text):
        cap, pipe, direct = m[-1]
        got.update(cache_per_layer=int(cap), pipe=int(pipe), direct=int(direct))
    if m := _MACHINE.findall(text):
        got["omp_threads"] = int(m[-1][1])
    if m := _IO.findall(text):
        gb, mbt, hit, loads = (float(x) for x in m[-1])
        got.update(fetched_gb=gb, mb_per_token=mbt, hit_pct=hit, loads_per_token=loads,
                   tokens=round(gb * 1000 / mbt) if mbt > 0 else None)
    if m := _CLASS.findall(text):
        nc, cc, nw, wc = m[-1]
        n = int(nc) + int(nw)
        if n:
            got["avg_conc"] = (int(nc) * float(cc) + int(nw) * float(wc)) / n
    if m := _SHARES.findall(text):
        got["io_share_pct"] = float(m[-1][0])
    timing = read_timing(text)
    # the run's own window: the decode line (in the oracle mode the only one, spanning the whole
    # generate), plus the prompt's when a `PROFILO PREFILL` line split it off
    parts = [timing[ph] for ph in ("prefill", "decode") if ph in timing]
    if parts:
        run = sum(s for s, _ in parts)
        wait = sum(w for _, w in parts)
        got.update(run_s=run, wait_s=wait, compute_s=max(0.0, run - wait))
    return Calibration(**got)


def loads_in_flight(cal: Calibration) -> int | None:
    """The loads colibri keeps in flight, as the run says: with PIPE off its OpenMP threads."""
    if cal.pipe == 0 and cal.omp_threads:
        return cal.omp_threads
    return None


def calibration_record(text: str) -> dict:
    """The run as the planner's calibration record (docs/planner.md, "Calibrated by the engine's
    own lines"): {} when the run printed no `[PROF] expert I/O` line (PROF=1 not set)."""
    cal = calibrate(text)
    if cal.fetched_gb is None or not cal.tokens:
        return {}
    out = {"window": "run",                 # the oracle mode's window spans the prompt and the generated tokens
           "tokens": cal.tokens, "bytes_read": round(cal.fetched_gb * GB),
           "cache_per_layer": cal.cache_per_layer, "in_flight": loads_in_flight(cal),
           "overlap": None if cal.pipe is None else bool(cal.pipe),
           "compute_s": cal.compute_s, "wait_s": cal.wait_s, "run_s": cal.run_s,
           "lines": cal.as_dict()}
    return {k: v for k, v in out.items() if v is not None}


def own_workload(geometry, args: Sequence[str], env: Mapping[str, str], mem_available: int):
    """The cache and resident memory colibri's arguments give it on this model (`cache_per_layer`,
    `resident_bytes`); the dense bytes are the model's files less its routed experts."""
    from ..base import OwnWorkload

    eb = geometry.expert_bytes
    dense = geometry.dense_bytes
    per = cache_per_layer(args, env, geometry.layers, geometry.experts, eb, dense, mem_available)
    how = (f"colibri's expert cache {per}/layer (cap {asked_cap(args, env)} asked"
           f"{', RAM_GB ' + str(env.get(ENV_RAM_GB)) if env.get(ENV_RAM_GB) else ', its budget 88 % of MemAvailable'}"
           f"{', CAP_RAISE=' + str(env.get(ENV_CAP_RAISE)) if env.get(ENV_CAP_RAISE) is not None else ''})")
    return OwnWorkload(per * geometry.layers, resident_bytes(per, geometry.layers, geometry.experts, eb, dense), how)
