"""What every target engine is described by (pure data and functions): the noun the registry holds.

The one question each engine answers is its read pattern (`engines.pattern`): `pattern(geometry,
step, setup)`. Beside it, what the stages above need to ask instead of testing the engine's name:
its limits, the weights it accepts (`grid`: the distinct ones the solver searches), how many reads
it keeps in flight per phase, its switches, which model layouts it can read, and its `profile`: the
environment and arguments a plan gives it, its rules, its log lines and the verdict on a launch
(`engines.handoff`, docs/architecture.md "Adding an engine")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Sequence

from .switches import NONE, Switches


class Piece(NamedTuple):
    """One source's part of a read (a tuple: patterns are built for every candidate the solver prices)."""
    source: int    # 0 = primary, then replicas in order
    offset: int    # bytes, absolute in the file
    length: int    # bytes (0 when this source reads nothing of this range)
    blocks: int    # whole granules in this piece (the primary's piece also carries the tail)


SplitRule = Callable[[int, int, Sequence[int]], tuple[Piece, ...]]


@dataclass(frozen=True)
class OwnWorkload:
    """What an engine holds and does of its own at given arguments (docs/planner.md, "The
    engine's own workload"): the experts its cache keeps over all layers (None: the engine does
    not say), the RAM it keeps resident (weights it keeps, its cache, working buffers; bytes),
    what that leaves the page cache of the model, and how it was found (one line)."""
    cache_experts: int | None
    resident_bytes: int
    how: str = ""


@dataclass(frozen=True)
class Engine:
    """A target engine's limits and rules, as its own code imposes them."""

    name: str                       # as typed after --engine and stored in plans and profiles
    max_sources: int                # primary + replicas the engine reads from
    weight_min: int                 # each source's weight, inclusive range
    weight_max: int
    granule: int                    # bytes: the unit a split moves between sources
    split: Optional[SplitRule]      # how one read is cut across sources; None: the engine does not split reads
    path_forbidden: str             # characters a source path may not contain (the list separators)
    # (geometry, Step, Setup) -> Pattern: which drive reads which bytes, in barrier groups
    pattern: Optional[Callable[[Any, Any, Any], Any]] = None
    # one clause: what the engine does with a decode weight list of another count than its sources
    # ('' : nothing worth saying), quoted where such a list is refused
    decode_miscount: str = ""
    # phase -> Concurrency: the reads the engine keeps in flight
    concurrency: Optional[Callable[[str], Any]] = None
    # (sources, geometry) -> K x sources int array: every distinct weight vector the solver tries,
    # each the smallest of the vectors that give the same reads on this model, smallest first
    grid: Optional[Callable[[int, Any], Any]] = None
    # (format, layout, files) -> '' when the engine reads such a model, else one line saying why not
    reads_model: Optional[Callable[[str, str, Sequence[str]], str]] = None
    # config.json model_type values the engine runs (its own models' first; () for an engine that
    # does not pick by it): what a model written in its format says it is
    model_types: tuple[str, ...] = ()
    # (format, layout, files) -> how strongly the engine claims a model it reads, for choosing a
    # model's default engine (`engines.registry.engine_for_model`): 0 it reads it, 1 the format is
    # its own, 2 the model's family is its own. The highest wins; a tie goes to the name that sorts
    # first, so the choice never depends on the order engines were registered. None: 0.
    preference: Optional[Callable[[str, str, Sequence[str]], int]] = None
    # the switches the engine declares (names, what each does, which sets are legal: engines.switches);
    # a Setup, a plan and a request carry the ones on as a frozenset of their names
    switches: Switches = NONE
    # geometry -> the switch settings that make a difference on this model, the default (none on) first
    modes: Callable[[Any], tuple[frozenset[str], ...]] = lambda geometry: (frozenset(),)
    phase_weights: bool = True          # one weight vector per phase (False: one for both phases)
    # Setup -> whether the engine's reads go through the page cache (a re-read can come from RAM)
    buffered: Callable[[Any], bool] = lambda setup: False
    # (weights, read length) -> the smallest weights that cut such a read the same (engines that cut reads)
    equivalent: Optional[Callable[[Sequence[int], int], tuple[int, ...]]] = None
    # '' when a source may be a copy kept in RAM (tmpfs, /dev/shm: no drive behind it), else one
    # line why the engine cannot use one (export and `planner whatif` refuse it with that line)
    memory_member: str = ""
    # (the model's expert component in bytes, or None when no header is at hand) -> ReadShapes: its
    # typical read per phase, which iobench's presets measure (None: the engine states none)
    read_shapes: Optional[Callable[[Optional[int]], Any]] = None
    # (log text) -> {phase: (seconds, seconds waiting for reads)} from the engine's own timing
    # lines (None: its log says nothing this tool reads; `planner whatif` then needs a run result)
    timing: Optional[Callable[[str], dict[str, tuple[float, float]]]] = None
    # What export writes for the engine and how launch confirms it from the log: an object (its
    # profile module) giving engines.handoff.EngineProfile; None: the engine has no profile
    profile: Any = None
    # Partial replicas (docs/replicas.md, "Partial replicas"): '' when the engine reads a replica
    # that holds some of the model's files (the rest from the primary), else one line why it
    # cannot; plans for it leave such members out and say so.
    partial_refusal: str = ""
    # A usage history the engine keeps in the model's directory (its file name; '' none) and how to
    # read it: (its bytes, where, the model's layers, routed experts per layer) -> models.usage.Usage,
    # ValueError when it cannot be used. `replicas sync --partial` ranks shards by it.
    usage_file: str = ""
    read_usage: Optional[Callable[[bytes, str, Optional[int], Optional[int]], Any]] = None
    # (geometry, layer, expert, held files) -> bytes of that expert a replica holding those files
    # serves when the engine routes the expert to it (its fallback rule for a missing file); None:
    # each component by its own file (a read falls back on its own)
    replica_serves: Optional[Callable[[Any, int, int, frozenset], int]] = None
    # (geometry, engine arguments, environment, MemAvailable bytes) -> OwnWorkload: the cache and
    # resident memory its arguments give it on this model (None: the engine says nothing)
    own_workload: Optional[Callable[[Any, Sequence[str], Any, int], OwnWorkload]] = None
    # (a run's log text) -> the calibration record its own lines give (docs/planner.md, "Calibrated
    # by the engine's own lines"): {} when they say nothing this tool reads
    calibrate: Optional[Callable[[str], dict]] = None
    # (geometry, sources, switches) -> '' when more drives can shorten the engine's reads of this
    # model, else one line why not and what would (the planner says it beside its prices); None: ''
    drive_limit: Optional[Callable[[Any, int, frozenset], str]] = None
