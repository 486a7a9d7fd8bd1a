"""The contract every registered engine keeps: its read pattern is deterministic, well formed,
covers every byte of every expert the step reads exactly once (with no switch on; a switch may
widen a read, as an O_DIRECT window reads a neighbour's edge too), uses only the sources that may
serve and hold the file, and its weight grid, concurrency and modes are answers the planner can
use. Adding an engine is adding its package, its registry line and its row in ARCH below. The toy
engine the tests define (tests/engines/toy_engine.py) is held to the same contract, registered for
each of its cases."""

import pytest

from engines.pattern import PHASES, Concurrency, Setup, Step, check_pattern
from engines.registry import ENGINES, get_engine
from engines.split import check_weights
from models.geometry import stacked_geometry
from tests.engines import toy_engine

# a config.json model_type (or GGUF architecture) each engine reads, for a model of that family
ARCH = {"ds4-argodrive": "?", "colibri": "glm_moe_dsa", "llama.cpp": "qwen3moe", toy_engine.NAME: "?"}
COMPONENT = 557_056 + 4096          # not a multiple of 4 KiB experts: windows and cuts meet edges
NAMES = sorted(ENGINES) + [toy_engine.NAME]


def test_every_engine_has_a_contract_row():
    assert set(ARCH) == set(ENGINES) | {toy_engine.NAME}


@pytest.fixture
def engine(name):
    """The engine under test, the toy one registered while its case runs."""
    if name != toy_engine.NAME:
        yield get_engine(name)
        return
    with toy_engine.registered() as e:
        yield e


def geometry(name):
    return stacked_geometry(f"m-{name}", 3, 12, 2, COMPONENT, arch=ARCH[name], alignment=1)


def extents(g, step):
    out = []
    for e in step.experts:
        out += [(x.file, x.offset, x.length) for x in g.expert_ranges(step.layer, e)]
    return out


def covered(pattern):
    """(file, byte offset) -> times a piece reads it, as byte intervals per file."""
    spans = {}
    for r in pattern.reads:
        for p in r.pieces:
            spans.setdefault(r.file, []).append((p.offset, p.offset + p.length))
    return spans


def times(spans, file, a, b):
    """How many pieces read each byte of [a, b): the min and max over the range."""
    edges = sorted({a, b} | {x for s, e in spans.get(file, []) for x in (s, e) if a < x < b})
    counts = [sum(1 for s, e in spans.get(file, []) if s <= lo and hi <= e) for lo, hi in zip(edges, edges[1:])]
    return min(counts), max(counts)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("weights", [(1,), (3, 1), (5, 2, 3)])
def test_patterns_are_deterministic_well_formed_and_read_each_expert_byte_once(engine, name, phase, weights):
    e, g = engine, geometry(name)
    sizes = dict(g.file_sizes)
    for mode in e.modes(g):
        setup = Setup(weights, mode)
        for layer in range(g.layers):
            step = Step(phase, layer, tuple(range(0, g.experts, 1 + layer)))
            p = e.pattern(g, step, setup)
            assert p == e.pattern(g, step, Setup(weights, frozenset(mode)))
            check_pattern(p, len(weights), sizes)
            spans = covered(p)
            for f, o, n in extents(g, step):
                lo, hi = times(spans, f, o, o + n)
                assert lo >= 1, (name, mode, step, f, o)
                if not mode:
                    assert hi == 1, (name, mode, step, f, o)
            if not mode:       # nothing read beyond the experts' own bytes (a switch may widen a read: O_DIRECT)
                assert sum(r.length for r in p.reads) == sum(n for _, _, n in extents(g, step))


@pytest.mark.parametrize("name", NAMES)
def test_only_sources_that_may_serve_and_hold_the_file_get_pieces(engine, name):
    e, g = engine, geometry(name)
    step = Step("decode", 1, tuple(range(g.experts)))
    healthy = e.pattern(g, step, Setup((4, 2, 3), healthy=(0, 2)))
    assert {pc.source for r in healthy.reads for pc in r.pieces} <= {0, 2}
    partial = e.pattern(g, step, Setup((4, 2, 3), holds=(None, frozenset(), None)))
    assert 1 not in {pc.source for r in partial.reads for pc in r.pieces}
    check_pattern(partial, 3, dict(g.file_sizes))


@pytest.mark.parametrize("name", NAMES)
def test_the_grid_concurrency_and_modes_are_answers_the_planner_can_use(engine, name):
    e, g = engine, geometry(name)
    for n in range(1, min(3, e.max_sources) + 1):
        for ph in PHASES:
            grid = e.grid(n, g, ph)
            assert len(grid) >= 1 and grid.shape[1] == n
            for w in grid[:50]:
                check_weights(tuple(int(x) for x in w), name)
    for ph in PHASES:
        c = e.concurrency(ph)
        assert isinstance(c, Concurrency) and (c.per_source or c.shared)
    modes = e.modes(g)
    assert modes[0] == frozenset() and all(m <= set(e.switches.names) and not e.switches.problem(m, name) for m in modes)
    assert e.reads_model is not None and e.profile is not None
