"""A third engine, defined only here, in the tests: what "adding an engine is one module and a
registry line" asks of every stage (docs/architecture.md, "Adding an engine").

`toy` reads one GGUF file from up to three copies. It places each expert component whole on one
source, by the weights: the source whose slice of the weights' sum holds (layer x experts +
expert) mod that sum; a layer waits for all its reads. Its own switch, `halves`, cuts each
component in two 4 KiB-aligned halves, the second on the next source that holds the file. Its
profile gives the environment TOY_SOURCES=path*weight,... and TOY_HALVES=1, and judges a log by
its `toy: source[i] bytes=N` lines. Nothing outside this file knows any of it: `registered()`
adds it to the registry for a `with` block.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from itertools import accumulate
from typing import Iterable, Mapping, Sequence

import numpy as np

from engines.base import Engine, Piece
from engines.handoff import (
    NO_SOURCES,
    Check,
    Request,
    RunReading,
    Setting,
    SourceFacts,
    Violation,
    exit_check,
    list_rules,
    unverified,
    weight_rules,
)
from engines.pattern import Concurrency, Pattern, Read, Setup, Step
from engines.registry import register
from engines.switches import Switch, Switches

NAME = "toy"
HALVES = "halves"
SWITCHES = Switches((Switch(HALVES, "each component read in two halves, the second from the next source"),))
MAX_SOURCES = 3
WEIGHT_MIN, WEIGHT_MAX = 1, 5
ALIGN = 4096
IN_FLIGHT = 2                       # reads in flight per source
ENV_SOURCES, ENV_HALVES = "TOY_SOURCES", "TOY_HALVES"
LOG_BYTES = re.compile(r"^toy: source\[(\d+)\] bytes=(\d+)$", re.M)


def placed(layer: int, expert: int, experts: int, weights: Sequence[int]) -> int:
    """Index into `weights` of the source that serves (layer, expert)."""
    k = (layer * experts + expert) % sum(weights)
    return next(i for i, c in enumerate(accumulate(weights)) if k < c)


def read_pattern(geometry, step: Step, setup: Setup) -> Pattern:
    usable = setup.usable() or (0,)
    reads = []
    for e in step.experts:
        for x in geometry.expert_ranges(step.layer, e):
            holders = [s for s in usable if setup.holds_file(s, x.file)] or [0]
            i = placed(step.layer, e, geometry.experts, [setup.weights[s] for s in holders])
            half = x.length // 2 // ALIGN * ALIGN
            if HALVES in setup.switches and len(holders) > 1 and half > 0:
                second = holders[(i + 1) % len(holders)]
                pieces = (Piece(holders[i], x.offset, half, half // ALIGN),
                          Piece(second, x.offset + half, x.length - half, (x.length - half) // ALIGN))
            else:
                pieces = (Piece(holders[i], x.offset, x.length, x.length // ALIGN),)
            reads.append(Read(x.file, x.offset, x.length, pieces))
    return Pattern(step, (tuple(reads),) if reads else ())


def concurrency(phase: str) -> Concurrency:
    return Concurrency(per_source=IN_FLIGHT)


def weight_grid(n: int, geometry, phase: str = "decode") -> np.ndarray:
    """Every vector of WEIGHT_MIN..WEIGHT_MAX per source, smallest sum first."""
    axes = np.meshgrid(*([np.arange(WEIGHT_MIN, WEIGHT_MAX + 1)] * n), indexing="ij")
    w = np.stack([a.ravel() for a in axes], axis=1)
    return w[np.lexsort([w[:, i] for i in reversed(range(n))] + [w.sum(axis=1)])]


def modes(geometry) -> tuple[frozenset[str], ...]:
    return (frozenset(), frozenset({HALVES}))


def reads_model(fmt: str, layout: str, files: Sequence[str]) -> str:
    return "" if (fmt, layout) == ("gguf", "file") else f"{NAME} reads one GGUF file"


class ToyProfile:
    """`engines.handoff.EngineProfile` for the toy engine (a class here; the real engines' are modules)."""

    named_profiles = False
    cache_experts = False
    checks = ("exit", "source-bytes")
    source_view = None

    def clear_prefix(self) -> str:
        return "TOY_"

    def profile_args(self) -> frozenset[str]:
        return frozenset()

    def plan_keys(self) -> tuple[str, ...]:
        return (ENV_SOURCES, ENV_HALVES)

    def managed_keys(self, named: Iterable[str] = ()) -> tuple[str, ...]:
        return (ENV_SOURCES, ENV_HALVES)

    def variant(self, facts: Sequence[SourceFacts]) -> str:
        return ""

    def check(self, facts: Sequence[SourceFacts], request: Request, *, allow_unverified: bool = False,
              manifest_size: int | None = None) -> list[Violation]:
        if not facts:
            return [NO_SOURCES]
        v = list_rules(facts, MAX_SOURCES, f"{NAME} reads at most {MAX_SOURCES} sources")
        v += weight_rules(len(facts), request.prefill, request.decode, WEIGHT_MIN, WEIGHT_MAX)
        v += [Violation("missing", f"sources[{f.index}]", f"{f.path} does not exist") for f in facts if not f.exists]
        if not allow_unverified:
            v += [unverified(f, f"sources[{f.index}]") for f in facts[1:] if f.exists and f.state != "verified"]
        return v

    def setting(self, request: Request) -> Setting:
        env = [(ENV_SOURCES, ",".join(f"{p}*{w}" for p, w in zip(request.paths, request.prefill)))]
        return Setting(tuple(env + ([(ENV_HALVES, "1")] if HALVES in request.switches else [])), ())

    def header(self, request: Request, environment) -> tuple[str, ...]:
        return (f"{ENV_SOURCES}: each source and its weight; {ENV_HALVES}=1 reads every component in two halves",)

    def unset_note(self) -> str:
        return "toy variables this profile does not want"

    def given_by(self, argv: Sequence[str], environment: Mapping[str, str]) -> str:
        return f"{ENV_SOURCES}={dict(environment).get(ENV_SOURCES, '')}"

    def report_env(self, variant: str = "") -> dict[str, str]:
        return {}

    def read_log(self, text: str, variant: str = "") -> dict[int, int]:
        return {int(i): int(b) for i, b in LOG_BYTES.findall(text)}

    def expect(self, request: Request, environment: Mapping[str, str]) -> int:
        return request.sources

    def judge(self, text: str, expectation: int, returncode: int | None = 0) -> tuple[Check, ...]:
        served = self.read_log(text)
        ok = all(served.get(i, 0) > 0 for i in range(expectation))
        return (exit_check(returncode), Check("source-bytes", ok, f"{expectation} sources > 0",
                                              ",".join(f"{i}:{b}" for i, b in sorted(served.items())) or "none",
                                              "every source served bytes" if ok else "a source served nothing"))

    def read_run(self, stdout: str, stderr: str, variant: str = "") -> RunReading:
        return RunReading(None, None, served=self.read_log(stdout + "\n" + stderr))

    def frozen_state(self, variant: str = "") -> tuple[dict[str, str], str]:
        return {}, "the toy engine learns nothing from a run"

    def links(self, request: Request) -> tuple[tuple[str, str], ...]:
        return ()

    def default_environment(self, environment) -> tuple[tuple[str, str], ...] | None:
        return None


TOY = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX, granule=ALIGN,
             split=None, path_forbidden=",*", pattern=read_pattern, concurrency=concurrency, grid=weight_grid,
             reads_model=reads_model, switches=SWITCHES, modes=modes, phase_weights=False, profile=ToyProfile())


@contextmanager
def registered():
    """The toy engine is known to every stage for the block."""
    with register(TOY) as engine:
        yield engine
