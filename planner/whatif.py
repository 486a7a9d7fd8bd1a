"""What a drive would add before a byte is copied, or what the rig loses without one (pure).

The planner prices any drive set, so it can price a drive that holds no replica yet (its curve
measured by iobench on a scratch file there, or built from read ceilings given by hand) as a full
or a partial member, and the rig without one of its drives. Each side is solved the way `planner
solve` solves a rig (its best weights per phase), so the comparison is best plan against best
plan. The gain the drives give is the reads' gain; what the machine gains is less when it
computes while it waits: with a measured timing breakdown (a run's time waiting for reads against
its whole time, `Timing`), the phase's time is (compute) + (reads), and only the reads shrink
(Amdahl). A phase whose reads are under COMPUTE_BOUND_SHARE of its time is compute-bound, and a
copy whose end-to-end gain stays under MIN_PAYING_GAIN in every phase does not pay.

A partial member holds some of the model's files (shards): which ones is `hottest_files`, the
files carrying the most bytes the workload reads per byte of file, taken hottest first until the
member holds the fraction asked; the engine's read pattern (`engines.pattern.Setup.holds`)
then gives it only the reads of the files it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Sequence

from iobench.drivemodel import DriveModel

from .barrier import SharedLink
from .drivecurves import Background, Drive, DriveCurve
from .solve import PHASES, Problem, solve

COMPUTE_BOUND_SHARE = 0.2      # a phase whose reads are under this share of its time is compute-bound
MIN_PAYING_GAIN = 0.03         # end-to-end gain a copy must bring in some phase (the harness's minimum gain)
GB = 1e9                       # gain per GB: decimal gigabytes copied


@dataclass(frozen=True)
class CandidateDrive:
    """A drive that holds no replica yet, as the pricing would see it."""
    name: str
    curve: DriveCurve
    holds: frozenset[str] | None = None   # the model files its copy would hold (None: all, a full member)
    write_Bps: float | None = None        # bytes/s a copy would be written at (None: not measured)
    memory: bool = False                  # a RAM member (tmpfs): takes RAM, vanishes at reboot
    how: str = ""                         # how its ceilings are known (said in the result)
    path: str = ""                        # the folder its copy would go in ('' when given as ceilings)


@dataclass(frozen=True)
class Timing:
    """A measured run's phases: (seconds, seconds waiting for reads) each, and where it came from."""
    phases: dict[str, tuple[float, float]]
    source: str

    def read_share(self, phase: str) -> float | None:
        t = self.phases.get(phase)
        if not t or t[0] <= 0:
            return None
        return min(1.0, max(0.0, t[1] / t[0]))


@dataclass(frozen=True)
class PhaseChange:
    """One phase, best plan before against best plan after."""
    phase: str
    weights_before: tuple[int, ...]
    weights_after: tuple[int, ...]
    read_s_before: float       # predicted seconds of the phase's reads
    read_s_after: float
    tok_s_before: float        # tokens per second of reads alone
    tok_s_after: float
    read_share: float | None   # measured share of the phase's time spent waiting for reads
    end_to_end: float | None   # the phase's gain with its compute counted (None: no timing)

    @property
    def gain(self) -> float:
        """The reads' gain: before / after - 1 (negative: slower)."""
        return self.read_s_before / self.read_s_after - 1.0 if self.read_s_after > 0 else 0.0

    @property
    def compute_bound(self) -> bool:
        return self.read_share is not None and self.read_share < COMPUTE_BOUND_SHARE

    @property
    def expected(self) -> float:
        """The gain to expect: end to end where a timing says, else the reads'."""
        return self.end_to_end if self.end_to_end is not None else self.gain


@dataclass(frozen=True)
class WhatIf:
    """What a change of drives does to the rig's best plan (a result: `planner whatif --json`)."""
    KIND: ClassVar[str] = "whatif"
    SCHEMA: ClassVar[int] = 1

    engine: str
    change: str                      # 'add' or 'remove'
    drive: str
    before: tuple[str, ...]          # source names, primary first
    after: tuple[str, ...]
    phases: tuple[PhaseChange, ...]
    copy_bytes: int = 0              # bytes a copy would write (0 for a removal)
    write_Bps: float | None = None   # the copy's speed: the drive's write and the primary's read, the slower
    timing_source: str = ""
    holds: tuple[str, ...] | None = None   # a partial member's files (None: full)
    memory: bool = False
    how: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def copy_s(self) -> float | None:
        return self.copy_bytes / self.write_Bps if self.copy_bytes and self.write_Bps else None

    def gain_per_GB(self, phase: PhaseChange) -> float | None:
        """The phase's expected gain per decimal GB copied (a fraction)."""
        return phase.expected / (self.copy_bytes / GB) if self.copy_bytes else None

    @property
    def compute_bound(self) -> tuple[str, ...]:
        return tuple(p.phase for p in self.phases if p.compute_bound)

    @property
    def pays(self) -> bool | None:
        """For an added drive: whether some phase gains at least MIN_PAYING_GAIN end to end
        (None: a removal)."""
        if self.change != "add":
            return None
        return any(p.expected >= MIN_PAYING_GAIN for p in self.phases)

    def verdict(self) -> str:
        """One line saying what the change does."""
        best = max(self.phases, key=lambda p: p.expected)
        if self.change == "remove":
            worst = min(self.phases, key=lambda p: p.expected)
            return (f"without {self.drive}: {worst.phase} {worst.expected:+.1%}"
                    + (" end to end" if worst.end_to_end is not None else " (reads alone)"))
        if self.pays:
            return (f"adding {self.drive} pays: {best.phase} {best.expected:+.1%}"
                    + (" end to end" if best.end_to_end is not None else " (reads alone: no timing of a run)"))
        bound = self.compute_bound
        if bound:
            shares = ", ".join(f"{p.phase} {p.read_share:.0%}" for p in self.phases if p.read_share is not None)
            return (f"adding {self.drive} would not pay: the machine is compute-bound (reads are {shares} of the time), "
                    f"best {best.phase} {best.expected:+.1%} end to end")
        return f"adding {self.drive} would not pay: best {best.phase} {best.expected:+.1%}"


    def to_dict(self) -> dict:
        return whatif_to_dict(self)


def whatif_to_dict(w: WhatIf) -> dict:
    return {"schema": WhatIf.SCHEMA, "kind": WhatIf.KIND, "engine": w.engine, "change": w.change, "drive": w.drive,
            "before": list(w.before), "after": list(w.after), "how": w.how, "memory": w.memory,
            "holds": list(w.holds) if w.holds is not None else None,
            "phases": [{"phase": p.phase, "weights_before": list(p.weights_before), "weights_after": list(p.weights_after),
                        "read_s_before": p.read_s_before, "read_s_after": p.read_s_after,
                        "tok_s_before": p.tok_s_before, "tok_s_after": p.tok_s_after, "gain": p.gain,
                        "read_share": p.read_share, "end_to_end": p.end_to_end, "compute_bound": p.compute_bound,
                        "gain_per_GB": w.gain_per_GB(p)} for p in w.phases],
            "copy_bytes": w.copy_bytes, "write_Bps": w.write_Bps, "copy_s": w.copy_s,
            "timing_source": w.timing_source, "compute_bound": list(w.compute_bound), "pays": w.pays,
            "verdict": w.verdict(), "notes": list(w.notes)}


# ---------------------------------------------------------------------------------------------
# The problems either side of the change

def _holds(problem: Problem) -> tuple[frozenset[str] | None, ...]:
    n = len(problem.drives)
    return tuple(problem.holds) + (None,) * (n - len(problem.holds))


def with_drive(problem: Problem, cand: CandidateDrive) -> Problem:
    """The problem with `cand` as one more source (last); a UsageError when the engine reads fewer."""
    return replace(problem, drives=problem.drives + (Drive(cand.name, cand.curve),),
                   holds=_holds(problem) + (cand.holds,))


def without_drive(problem: Problem, index: int) -> Problem:
    """The problem without source `index` (the next source becomes the primary when it is 0)."""
    return only_drives(problem, [i for i in range(len(problem.drives)) if i != index])


def only_drives(problem: Problem, keep) -> Problem:
    """The problem over the sources `keep` (in that order, the first the primary): links lose the
    members left out (a link left with one drive is no constraint), background work on them goes."""
    keep = list(keep)
    where = {old: new for new, old in enumerate(keep)}
    links = tuple(SharedLink(k.name, tuple(where[m] for m in k.members if m in where), k.ceiling_Bps) for k in problem.links)
    holds = _holds(problem)
    return replace(problem, drives=tuple(problem.drives[i] for i in keep),
                   holds=tuple(holds[i] for i in keep) if problem.holds else (),
                   links=tuple(k for k in links if len(k.members) > 1),
                   backgrounds=tuple(Background(where[b.source], b.kind, b.value) for b in problem.backgrounds
                                     if b.source in where))


def best_prices(problem: Problem) -> dict[str, dict]:
    """Each phase's prediction at the solver's best plan (the plan's `predicted` blocks)."""
    return solve(problem, top=0).predicted


def phase_changes(before: dict[str, dict], after: dict[str, dict], timing: Timing | None) -> tuple[PhaseChange, ...]:
    out = []
    for ph in PHASES:
        b, a = before[ph], after[ph]
        share = timing.read_share(ph) if timing else None
        e2e = None
        if share is not None and a["seconds"] > 0 and b["seconds"] > 0:
            # the measured phase is (1 - share) compute and `share` reads; the reads scale by the prediction
            e2e = 1.0 / ((1.0 - share) + share * a["seconds"] / b["seconds"]) - 1.0
        out.append(PhaseChange(ph, tuple(b["weights"]), tuple(a["weights"]), b["seconds"], a["seconds"],
                               b["tok_s"], a["tok_s"], share, e2e))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Partial members

def file_heat(geometry, steps: Sequence) -> dict[str, float]:
    """Bytes the steps read from each of the model's files (each step's experts, every component)."""
    heat: dict[str, float] = {}
    for st in steps:
        for e in st.experts:
            for x in geometry.expert_ranges(st.layer, e):
                heat[x.file] = heat.get(x.file, 0.0) + x.length
    return heat


def hottest_files(heat: dict[str, float], sizes: dict[str, int], fraction: float) -> frozenset[str]:
    """The files a partial member of `fraction` (0..1) of the model's bytes would hold: hottest
    first by bytes read per byte of file, until the next would pass the fraction (at least one)."""
    total = sum(sizes.values())
    order = sorted((f for f in sizes if heat.get(f, 0.0) > 0), key=lambda f: (-heat[f] / max(1, sizes[f]), f))
    chosen, held = [], 0
    for f in order:
        if chosen and held + sizes[f] > fraction * total:
            break
        chosen.append(f)
        held += sizes[f]
    return frozenset(chosen)


def ceiling_curve(read_Bps: float, lat_s: float):
    """A drive curve from a read ceiling given by hand: one request streams at the ceiling after
    `lat_s`, and requests in flight overlap up to it (iobench's model form, no IOPS ceiling)."""
    return DriveModel(lat_s=lat_s, stream_bw=read_Bps, bw_max=read_Bps)
