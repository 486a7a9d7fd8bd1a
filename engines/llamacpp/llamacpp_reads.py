"""llama.cpp's read pattern: what its compute faults in for one step, from which drive, how many
faults are in flight, the models it opens, and when a second drive cannot help (pure;
docs/engine-profiles.md, "llama.cpp").

- With mmap (the default load mode) every file is one shared mapping (src/llama-mmap.cpp
  `llama_mmap::impl`: `posix_fadvise(SEQUENTIAL)`, MAP_POPULATE and MADV_WILLNEED over the whole
  file at load). After load nothing but the kernel decides what stays cached: a page that was
  evicted is faulted back in by the compute thread that touches it.
- Each MUL_MAT_ID touches only the selected experts' slices of one expert tensor, in ascending
  expert index (ggml-cpu.c `ggml_compute_forward_mul_mat_id`); build_moe_ffn issues up, gate,
  then down (src/llama-graph.cpp), and an op starts when the one before it is done. So a step is
  three groups, one per component in that order, each of one read per selected expert, whole, on
  the drive serving the tensor's file (`llamacpp_placement.place_files`).
- The load modes that keep the weights in RAM (none, mmap+mlock, dio) read nothing per step.
"""

from __future__ import annotations

from typing import Sequence

from ..pattern import Concurrency, Pattern, Read, ReadShapes, Setup, Step, whole
from .constants import (
    COMPONENT_ORDER,
    FAULT_READ,
    FAULTS_IN_FLIGHT,
    NAME,
    PAGE,
    RESIDENT,
)
from .llamacpp_placement import geometry_files, place_files

_PLACED: dict = {}        # (geometry id, weights, holds, usable) -> (geometry, {file: source})


def file_sources(geometry, setup: Setup) -> dict[str, int]:
    """The source serving each of the model's files under the setup's weights (only the usable
    sources holding a file may serve it)."""
    key = (id(geometry), setup.weights, setup.holds, setup.healthy)
    hit = _PLACED.get(key)
    if hit is not None and hit[0] is geometry:
        return hit[1]
    files = geometry_files(geometry)
    usable = setup.usable() or (0,)
    holders = [[s for s in usable if setup.holds_file(s, f)] or [0] for f, _ in files]
    placed = dict(zip((f for f, _ in files), place_files(files, setup.weights, holders)))
    if len(_PLACED) > 4096:
        _PLACED.clear()
    _PLACED[key] = (geometry, placed)
    return placed


def read_pattern(geometry, step: Step, setup: Setup) -> Pattern:
    """One group per expert matmul (up, gate, down, as build_moe_ffn issues them; the model's
    components in its own order when it names others), each one read per selected expert of
    that component, whole, on the drive serving its file. Nothing with a load mode that keeps
    the weights in RAM."""
    if setup.switches & RESIDENT:
        return Pattern(step, ())
    where = file_sources(geometry, setup)
    comps = list(geometry.components)
    order = [c for c in COMPONENT_ORDER if c in comps] + [c for c in comps if c not in COMPONENT_ORDER]
    groups = []
    ranges = {e: geometry.expert_ranges(step.layer, e) for e in step.experts}
    for c in order:
        k = comps.index(c)
        reads = tuple(Read(x.file, x.offset, x.length, whole(where.get(x.file, 0), x.offset, x.length, PAGE))
                      for x in (ranges[e][k] for e in step.experts))
        if reads:
            groups.append(reads)
    return Pattern(step, tuple(groups))


def concurrency(phase: str) -> Concurrency:
    """One fault in flight for the whole process in both phases: the compute thread waits for the
    page it touched (more threads share one tensor's rows: still one file, one drive)."""
    return Concurrency(shared=FAULTS_IN_FLIGHT)


def buffered(setup: Setup) -> bool:
    """mmap reads through the page cache: a page still cached is not read again."""
    return not (setup.switches & RESIDENT)


def modes(geometry) -> tuple[frozenset[str], ...]:
    """Only the default (mmap): the load modes that keep the weights in RAM read nothing per step,
    which no drive can price — they are a RAM question (the model must fit), not a plan's."""
    return (frozenset(),)


def read_shapes(component_bytes: int | None = None) -> ReadShapes:
    """A fault's read: the kernel's read-around (2 x read_ahead_kb after FADV_SEQUENTIAL, the usual
    128 KiB default), no larger than the expert slice it serves, in both phases."""
    n = FAULT_READ if component_bytes is None else min(FAULT_READ, max(PAGE, component_bytes))
    return ReadShapes(n, n)


def reads_model(fmt: str, layout: str, files: Sequence[str]) -> str:
    """llama.cpp loads GGUF: one file, or the first split of a gguf-split set (the others it
    derives by name)."""
    if fmt == "gguf" and layout in ("file", "gguf-split"):
        return ""
    what = "a safetensors directory" if fmt == "safetensors" else f"a {fmt} {layout}"
    return f"{NAME} loads GGUF (one file or a gguf-split set, -m the first split); this model is {what}"


def preference(fmt: str, layout: str, files: Sequence[str]) -> int:
    """1: GGUF is llama.cpp's own format (asked only of a model it reads)."""
    return 1


def drive_limit(geometry, sources: int, switches: frozenset[str] = frozenset()) -> str:
    """'' when more drives can shorten this engine's reads of the model, else one line why not and
    what would."""
    if switches & RESIDENT:
        return (f"{NAME} with this load mode keeps every weight in RAM after load: no step reads a drive, "
                "and a model larger than RAM does not load")
    files = geometry_files(geometry)
    expert_files = {t.file for t in geometry.tensors}
    if len(expert_files) <= 1:
        return (f"{NAME} reads a file through one mmap and this model's experts are all in one file: one drive serves "
                "every read, so a second drive cannot help; re-split it one tensor per file (`replicas resplit`) "
                "to place its files across drives")
    if sources > 1:
        return (f"{NAME} faults the pages of one expert tensor at a time (one file, one drive), one after another: "
                f"placing its {len(files)} files across drives spreads the bytes but never reads two drives at once, "
                "so a second drive helps only by its own speed; what would read them together is a prefetch pool "
                "(ik_llama.cpp --prefetch-experts: workers faulting the selected experts in ahead of compute), "
                "which the plan does not price")
    return ""
