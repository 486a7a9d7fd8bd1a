"""What `iobench run` measures and in what order (pure).

Order (docs/iobench.md): every drive alone (seq first, so its ceilings can set the split weights of
the other presets), then each `--group` of drives together (and each set of drives the OS says
share a disk, controller, bridge or hub: `with_topology`), then all drives together. Each
lane count of each preset is one trial of `repeat` back-to-back windows of `seconds`; the
spread is taken over those windows. A preset with restarts (decode, by default) measures each
lane count in that many trials, each started afresh (new lanes, new offsets), round-robin over
the lane counts (x1 x2 x3 x4, x1 x2 x3 x4, ...) so a drift of the drive or the host over the
run touches every lane count alike; the median trial counts (`aggregate`). A lane count whose
first two trials agree within RESTART_AGREE_PCT gets no third: `count_trials` is the most a run
takes.

`measure` is the whole run as a plan that never touches a drive: a generator that yields each
`Trial` and is sent back that trial's runs (one `StreamRun` per leg, in order), because what
comes next depends on what was measured (the split weights on the seq ceilings, the lanes of a
together run on the alone runs' best). Its return value is the `RunFindings` tally. `bench.py`
opens the files and runs the trials; tests feed it made-up runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Collection, Generator, Mapping, Sequence

from core.errors import UsageError
from engines.split import check_weights

from . import stats
from .aggregate import group_result, lane_result, preset_result, suspect_cache, window_rate
from .constants import (
    DEFAULT_LANES,
    DEFAULT_REPEAT,
    DEFAULT_RESTARTS,
    DEFAULT_SECONDS,
    MAX_RESTARTS,
    PRESETS,
    RESTART_AGREE_PCT,
    SEQ_PIECE,
    TOGETHER_LANES,
)
from .layout import ExpertLayout
from .result import BenchResult, GroupResult, PresetResult
from .shapes import Shape, decode_shape, engine_shapes, min_slots, prefill_shape, rand4k_shape, seq_shape, split_limit

if TYPE_CHECKING:
    from core.drives import DriveInfo
    from core.topology import Topology

    from .trials import StreamRun

SPLIT_PRESETS = ("prefill", "decode")


@dataclass(frozen=True)
class Target:
    """One file to read, on one drive."""

    name: str
    path: str
    size: int
    drive: "DriveInfo"
    layout: ExpertLayout | None = None
    notes: tuple[str, ...] = ()

    @property
    def component_bytes(self) -> int:
        return engine_shapes(self.layout.component_bytes if self.layout else None).decode_bytes

    @property
    def regions(self) -> tuple[tuple[int, int], ...]:
        return self.layout.regions if self.layout else ()


@dataclass(frozen=True)
class RunOptions:
    presets: tuple[str, ...] = PRESETS
    seconds: float = DEFAULT_SECONDS
    repeat: int = DEFAULT_REPEAT
    lanes: tuple[int, ...] | None = None          # overrides every preset's lane counts
    alone: bool = True
    together: bool = True
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    weights: tuple[int, ...] | None = None        # prefill split, one per drive
    decode_weights: tuple[int, ...] | None = None  # decode split (default: weights)
    seed: int = 0
    restarts: int | None = None                   # trials per lane count, overrides every preset's
    topology: bool = True                         # also measure together the drives the OS says share something
    topology_groups: tuple[str, ...] = ()         # which of `groups` came from the topology (`with_topology`)
    # The presets were not named (--preset all, the default): one the files are too small for is
    # skipped with a note (`fitting_presets`) instead of refusing the run.
    skip_small: bool = False

    def lanes_for(self, preset: str) -> tuple[int, ...]:
        return tuple(self.lanes) if self.lanes else DEFAULT_LANES[preset]

    def restarts_for(self, preset: str) -> int:
        """Restarted trials per lane count (and per together run) of a preset."""
        return self.restarts if self.restarts is not None else DEFAULT_RESTARTS[preset]


# ---- options ------------------------------------------------------------------------------------

def parse_presets(text: str, option: str = "--preset") -> tuple[str, ...]:
    """'seq,decode' -> ('seq', 'decode') in the run's order; 'all' -> every preset."""
    if text == "all":
        return PRESETS
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in PRESETS]
    if bad or not items:
        raise UsageError(f"{option} {text!r}: use seq, prefill, decode, rand4k, all, or a comma list")
    return tuple(p for p in PRESETS if p in items)


def parse_lanes(text: str | None, option: str = "--lanes") -> tuple[int, ...] | None:
    """'1,2,4' -> (1, 2, 4): lane counts, 1..256, sorted; None stays None (each preset's own)."""
    if text is None:
        return None
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise UsageError(f"{option} {text!r}: give lane counts separated by commas, e.g. 1,2,4,8,16") from None
    if not values or values[0] < 1 or values[-1] > 256:
        raise UsageError(f"{option} {text!r}: lane counts must be 1..256")
    return values


def parse_groups(items: Sequence[str], names: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """'NAME=DRIVE,DRIVE' -> (NAME, (DRIVE, DRIVE)); drives must be measured, at least two."""
    out, seen = [], set()
    for item in items:
        gname, sep, rest = item.partition("=")
        members = tuple(x.strip() for x in rest.split(",") if x.strip())
        if not sep or not gname.strip() or len(members) < 2:
            raise UsageError(f"--group {item!r}: use NAME=DRIVE,DRIVE (at least two drives), e.g. hub=green,white")
        unknown = [m for m in members if m not in names]
        if unknown:
            raise UsageError(f"--group {item!r}: no drive named {unknown[0]!r}; drives here: {', '.join(names)}")
        if len(set(members)) != len(members):
            raise UsageError(f"--group {item!r}: a drive is named twice")
        if gname in seen or gname == "together":
            raise UsageError(f"--group {item!r}: group name {gname!r} is taken")
        seen.add(gname)
        out.append((gname.strip(), members))
    return tuple(out)


def with_topology(opts: RunOptions, topology: "Topology", names: Sequence[str]) -> RunOptions:
    """`opts` with a group run for each set of drives the OS says share something
    (`core.topology`), unless a --group already measures that set or it is all the drives (the
    together run measures those). The topology's own group name is kept where it is free."""
    have = {frozenset(members) for _, members in opts.groups}
    taken = {g for g, _ in opts.groups} | {"together"}
    extra = []
    for g in topology.groups:
        members = tuple(x for x in names if x in g.drives)
        if len(members) < 2 or frozenset(members) in have or set(members) == set(names):
            continue
        name, i = g.name, 2
        while name in taken:
            name, i = f"{g.name}-{i}", i + 1
        taken.add(name)
        extra.append((name, members))
    return replace(opts, groups=opts.groups + tuple(extra), topology_groups=tuple(n for n, _ in extra))


def check_options(targets: Sequence[Target], opts: RunOptions, real_paths: Sequence[str] | None = None) -> None:
    """Everything that can be wrong before the first read: a UsageError naming it.
    `real_paths`: the targets' paths with symlinks resolved by the caller (default: as given)."""
    if not targets:
        raise UsageError("nothing to measure: give PATHs or a rig with members")
    if opts.seconds <= 0 or opts.seconds > 600:
        raise UsageError(f"--seconds {opts.seconds}: give a positive number of seconds (at most 600)")
    if opts.repeat < 1 or opts.repeat > 100:
        raise UsageError(f"--repeat {opts.repeat}: give 1..100")
    if opts.restarts is not None and not 1 <= opts.restarts <= MAX_RESTARTS:
        raise UsageError(f"--restarts {opts.restarts}: give 1..{MAX_RESTARTS} trials per lane count")
    bad = [p for p in opts.presets if p not in PRESETS]
    if bad or not opts.presets:
        raise UsageError(f"--preset {bad[0] if bad else ''!r}: use seq, prefill, decode, rand4k or all")
    if opts.lanes is not None and (not opts.lanes or any(x < 1 or x > 256 for x in opts.lanes)):
        raise UsageError("--lanes: give lane counts 1..256, e.g. 1,2,4,8,16")
    if not opts.alone and not opts.together:
        raise UsageError("nothing to run: both alone and together runs are off")
    if not opts.alone and len(targets) < 2:
        raise UsageError("--together needs at least two drives")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise UsageError(f"two targets share a name ({', '.join(names)})")
    paths = list(real_paths) if real_paths is not None else [t.path for t in targets]
    if len(set(paths)) != len(paths):
        raise UsageError("the same file is given twice")
    split = [p for p in opts.presets if p in SPLIT_PRESETS]
    engine, limit = split_limit()
    if split and len(targets) > limit:
        raise UsageError(f"{'/'.join(split)} split each read over at most {limit} sources as {engine} does; "
                         f"got {len(targets)} drives (measure at most {limit}, or use --preset seq)")
    for w, what in ((opts.weights, "--weights"), (opts.decode_weights, "--decode-weights")):
        if w is not None:
            check_weights(w)
            if len(w) != len(targets):
                raise UsageError(f"{what} {':'.join(map(str, w))}: give one weight per drive ({len(targets)}: "
                                 f"{', '.join(names)})")
    for t in targets:
        for p in opts.presets:
            why = too_small(t, p, opts)
            if why:
                raise UsageError(f"{why}; give a bigger file or fewer --lanes")


def too_small(t: Target, preset: str, opts: RunOptions) -> str | None:
    """Why `t` cannot hold the preset's requests at the most lanes (None: it can). The largest
    piece the preset can ask of a drive, unsplit, as many times apart as lanes run at once."""
    # together runs use the alone best lane count, or the engine's default without alone runs
    lanes = tuple(opts.lanes_for(preset)) if opts.alone else (TOGETHER_LANES[preset],)
    probe = shape_for(t, preset, 0, (1,), (1,))
    need = min_slots(lanes)
    if probe.slots >= need:
        return None
    return (f"{t.path}: {t.size:,} bytes is too small for the {preset} preset at {max(lanes)} lanes "
            f"(needs {need} requests of {probe.step:,} B apart, about {need * probe.step + probe.piece_bytes:,} bytes)")


def fitting_presets(targets: Sequence[Target], opts: RunOptions) -> tuple[RunOptions, list[tuple[str, str]]]:
    """(the options without the presets some target is too small for, (drive, note) per preset skipped)
    when the presets were not named (`skip_small`); else the options as they are (a named preset
    that does not fit is refused by `check_options`). No preset left: refused with the first reason."""
    if not opts.skip_small:
        return opts, []
    keep, notes, first = [], [], None
    for p in opts.presets:
        small = [(t.name, w) for t, w in ((t, too_small(t, p, opts)) for t in targets) if w]
        if not small:
            keep.append(p)
            continue
        first = first or small[0][1]
        notes += [(name, f"{p} preset skipped: {why}; to measure it name it with --preset {p} and fewer --lanes")
                  for name, why in small]
    if not keep:
        raise UsageError(f"{first}; give a bigger file or fewer --lanes")
    return replace(opts, presets=tuple(keep)), notes


def shape_for(t: Target, preset: str, index: int, weights, decode_weights) -> Shape | None:
    """Drive `index`'s requests for a preset (None: the weights give it no bytes)."""
    if preset == "seq":
        return seq_shape(t.size)
    if preset == "prefill":
        return prefill_shape(t.size, weights, index, engine_shapes().prefill_bytes)
    if preset == "rand4k":
        return rand4k_shape(t.size)
    return decode_shape(t.size, decode_weights, index, t.component_bytes, t.regions)


def count_trials(targets: Sequence[Target], opts: RunOptions) -> int:
    """Trials a run takes at most (a drive the weights give no bytes skips its trials)."""
    n = 0
    if opts.alone:
        n += len(targets) * sum(len(opts.lanes_for(p)) * opts.restarts_for(p) for p in opts.presets)
    if opts.together:
        per_group = sum(opts.restarts_for(p) for p in opts.presets)
        n += len(opts.groups) * per_group
        if len(targets) > 1:
            n += per_group
    return n


def resolve_weights(targets: Sequence[Target], given: tuple[int, ...] | None, seq_bw: dict[str, float],
                    previous: BenchResult | None) -> tuple[tuple[int, ...], str]:
    """(weights, where they came from): --weights, else this run's seq ceilings, else the previous
    result's seq ceilings for the same drive names, else equal."""
    if given:
        return tuple(given), "--weights"
    names = [t.name for t in targets]
    if all(seq_bw.get(n, 0) > 0 for n in names):
        return stats.integer_weights([seq_bw[n] for n in names]), "seq ceilings of this run"
    if previous is not None:
        try:
            bws = [previous.drive(n).presets["seq"].bw_bytes for n in names]
            if all(b > 0 for b in bws):
                return stats.integer_weights(bws), f"seq ceilings of the result of {previous.created}"
        except KeyError:
            pass
    return tuple(1 for _ in names), "equal (no seq ceilings known)"


# ---- the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Leg:
    """One drive's part of a trial: its requests and how many it keeps in flight."""

    name: str
    shape: Shape
    lanes: int


@dataclass(frozen=True)
class Trial:
    label: str                   # what progress says: 'green prefill x8', 'hub decode (2/3)'
    legs: tuple[Leg, ...]        # one drive alone, or the drives read together
    restart: int = 0             # which restarted trial of its lane count (0-based)


@dataclass
class RunFindings:
    """What a run found, filled in as its trials come back."""

    presets: dict[str, dict[str, PresetResult]]    # drive name -> preset -> alone result
    notes: dict[str, list[str]]                    # drive name -> what the plan says about it
    order: list[str]                               # presets measured, in order
    groups: list[GroupResult] = field(default_factory=list)
    together: list[GroupResult] = field(default_factory=list)
    weights: tuple[int, ...] | None = None
    decode_weights: tuple[int, ...] | None = None
    weights_from: str = ""


Plan = Generator[Trial, "list[StreamRun]", RunFindings]


def measure(targets: Sequence[Target], opts: RunOptions, not_cold: Mapping[str, bool],
            previous: BenchResult | None = None, memory: Collection[str] = ()) -> Plan:
    """The run as a plan (see the module's docstring). `not_cold`: drive name -> its reads may
    come from the page cache (no O_DIRECT, a cached file under F_NOCACHE), so its results are
    flagged. `memory`: the names of RAM members (tmpfs copies), measured as RAM and never flagged."""
    m = RunFindings(presets={t.name: {} for t in targets}, notes={t.name: [] for t in targets},
                 order=[p for p in PRESETS if p in opts.presets])
    shapes: dict[tuple[str, str], Shape | None] = {}
    for preset in m.order:
        if preset in SPLIT_PRESETS and m.weights is None:
            seq_bw = {n: d["seq"].bw_bytes for n, d in m.presets.items() if "seq" in d}
            m.weights, m.weights_from = resolve_weights(targets, opts.weights, seq_bw, previous)
            m.decode_weights = tuple(opts.decode_weights) if opts.decode_weights else m.weights
        for i, t in enumerate(targets):
            shape = shapes[(t.name, preset)] = shape_for(t, preset, i, m.weights, m.decode_weights)
            if shape is None:
                m.notes[t.name].append(f"{preset}: the weights give this drive no bytes; not measured")
                continue
            if not opts.alone:
                continue
            counts = opts.lanes_for(preset)
            n = opts.restarts_for(preset)
            runs: dict[int, list] = {lanes: [] for lanes in counts}
            for r in range(n):
                for lanes in counts:
                    if r >= 2 and _agree([window_rate(x) for x in runs[lanes]]):
                        continue
                    run, = yield Trial(f"{t.name} {preset} x{lanes}{_nth(r, n)}", (Leg(t.name, shape, lanes),), r)
                    runs[lanes].append(run)
            lanes_res = [lane_result(runs[lanes], not_cold[t.name], t.name in memory) for lanes in counts]
            m.presets[t.name][preset] = preset_result(preset, shape.piece_bytes, lanes_res)

    def together_run(name: str, members: Sequence[Target], preset: str):
        legs = []
        for t in members:
            shape = shapes.get((t.name, preset))
            if shape is not None:
                alone = m.presets[t.name].get(preset)
                legs.append(Leg(t.name, shape, alone.best_lanes if alone else TOGETHER_LANES[preset]))
        if len(legs) < 2:
            return None
        n = opts.restarts_for(preset)
        trials = []
        for r in range(n):
            if r >= 2 and _agree([sum(window_rate(x) for x in runs) for runs in trials]):
                break
            trials.append((yield Trial(f"{name} {preset}{_nth(r, n)}", tuple(legs), r)))
        return group_result(name, preset, trials,
                            [suspect_cache(x, not_cold[x.name], x.name in memory) for runs in trials for x in runs])

    if opts.together:
        by_name = {t.name: t for t in targets}
        for gname, members in opts.groups:
            for preset in m.order:
                g = yield from together_run(gname, [by_name[x] for x in members], preset)
                if g:
                    m.groups.append(g)
        if len(targets) > 1:
            for preset in m.order:
                g = yield from together_run("together", targets, preset)
                if g:
                    m.together.append(g)
    return m


def _agree(rates: Sequence[float]) -> bool:
    """The trials so far agree within RESTART_AGREE_PCT (of the larger)."""
    top = max(rates, default=0.0)
    return top > 0 and (top - min(rates)) / top * 100 <= RESTART_AGREE_PCT


def _nth(r: int, n: int) -> str:
    return f" ({r + 1}/{n})" if n > 1 else ""


def run_plan(plan: Plan, run: Callable[[Trial], "list[StreamRun]"]) -> RunFindings:
    """Carry a plan out: `run` each trial it yields and send back the runs; its tally at the end."""
    try:
        trial = next(plan)
    except StopIteration as done:
        return done.value
    while True:
        runs = run(trial)
        try:
            trial = plan.send(runs)
        except StopIteration as done:
            return done.value


def run_settings(opts: RunOptions, m: RunFindings) -> dict:
    """The `settings` of a result: what was asked and what the plan chose."""
    return {
        "seconds": opts.seconds,
        "repeat": opts.repeat,
        "restarts": {p: opts.restarts_for(p) for p in m.order},
        "presets": list(m.order),
        "lanes": {p: list(opts.lanes_for(p)) for p in m.order},
        "alone": opts.alone,
        "together": opts.together,
        "groups": {g: list(members) for g, members in opts.groups},
        "topology_groups": list(opts.topology_groups),
        "weights": list(m.weights) if m.weights else None,
        "decode_weights": list(m.decode_weights) if m.decode_weights else None,
        "weights_from": m.weights_from or None,
        "prefill_chunk": engine_shapes().prefill_bytes,
        "seq_piece": SEQ_PIECE,
        "seed": opts.seed,
    }
