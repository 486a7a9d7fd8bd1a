"""llama.cpp: how it reads a model, as data and pure functions (docs/engine-profiles.md, "llama.cpp").

Read from llama.cpp's source (the registry's llama-cpp-python 0.3.36, vendor/llama.cpp at commit
0c1e570) and checked with the binaries built from it:

- it opens a model through one mmap per file (src/llama-mmap.cpp `llama_mmap::impl`:
  `posix_fadvise(SEQUENTIAL)`, MAP_POPULATE and MADV_WILLNEED at load); after load, pages the
  kernel evicted are faulted back in by the compute thread that touches them, only the selected
  experts' slices (ggml-cpu.c `ggml_compute_forward_mul_mat_id`), one expert tensor at a time;
- it loads a split set from its first split and derives the others by name, from the path as
  given (src/llama.cpp `llama_split_path`), so a folder of links is a model: the plan places each
  file on a drive (`llamacpp_placement`), export writes the links (`llamacpp_profile.links`);
- `-lm/--load-mode` (common/arg.cpp) is its only load setting: mmap (default), or none,
  mmap+mlock, dio, which keep every weight in RAM (our switches no-mmap, mlock, dio);
  `--no-repack` keeps Q4 experts mapped on x86 (no-repack).

ik_llama.cpp's `--prefetch-experts` (a pool faulting the selected experts in ahead of compute) was
read, not built or run here: the planner names it where it would help, and prices nothing of it.

The package holds one module per thing the engine is asked: its facts (`constants`), which drive
serves each file (`llamacpp_placement`), its read pattern (`llamacpp_reads`), its log lines
(`llamacpp_log`) and its profile (`llamacpp_profile`). No module of the package imports this file.
"""

from __future__ import annotations

from ..base import Engine
from ..switches import Switch, Switches
from . import llamacpp_profile
from .constants import DIO, MAX_SOURCES, MLOCK, NAME, NO_MMAP, NO_REPACK, PAGE, PATH_FORBIDDEN, WEIGHT_MAX, WEIGHT_MIN
from .llamacpp_placement import weight_grid
from .llamacpp_reads import (
    buffered,
    concurrency,
    drive_limit,
    modes,
    preference,
    read_pattern,
    read_shapes,
    reads_model,
)

SWITCHES = Switches((
    Switch(NO_MMAP, "-lm none: every weight read into RAM at load (the model must fit in RAM)"),
    Switch(MLOCK, "-lm mmap+mlock: the mappings locked in RAM (the model must fit in RAM)"),
    Switch(DIO, "-lm dio: every tensor read at load with O_DIRECT into RAM (the model must fit in RAM)"),
    Switch(NO_REPACK, "--no-repack: Q4 experts stay mapped from the files instead of repacked copies in RAM"),
))

# A partial replica serves the files it holds: each file's link points at a drive that holds it.
ENGINE = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX,
                granule=PAGE, split=None, path_forbidden=PATH_FORBIDDEN, pattern=read_pattern,
                concurrency=concurrency, grid=weight_grid, reads_model=reads_model, preference=preference,
                switches=SWITCHES, modes=modes, phase_weights=False, buffered=buffered,
                read_shapes=read_shapes, profile=llamacpp_profile, drive_limit=drive_limit)
