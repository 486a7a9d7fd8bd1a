"""ds4-argodrive (the Argodrive fork of ds4): what it does, as data and pure functions.

Read from the engine's expert reader and profile handling (docs/engine-profiles.md): up to 3 sources
(the `-m` primary, then `DS4_ARGODRIVE_REPLICAS` in order), integer weights 1..100, every
routed-expert read cut on a 256 KiB grid with the primary taking the front and the tail; the
environment and arguments it reads; the log lines in which it says what it applied.

The package holds one module per thing the engine is asked: its facts (`constants`), its split and
weight grid (`blocks`), its read pattern (`ds4_reads`), its log lines (`ds4_log`) and its profile,
export's and launch's side (`ds4_profile`). This file assembles them into the `Engine` the registry
holds; no module of the package imports it.
"""

from __future__ import annotations

from ..base import Engine
from . import ds4_profile
from .blocks import smallest_equivalent, split_ds4, weight_grid
from .constants import BLOCK_BYTES, ENV_DECODE_WEIGHTS, MAX_SOURCES, NAME, PATH_FORBIDDEN, WEIGHT_MAX, WEIGHT_MIN
from .ds4_reads import concurrency, preference, read_pattern, read_shapes, reads_model

# ds4-argodrive cuts every routed-expert read across every source (the split above) and its reader
# takes a replica only as a regular file of the primary's size (docs/engine-profiles.md, the rules
# export checks), so a replica holding part of the model cannot serve it.
PARTIAL_REFUSAL = (f"{NAME} splits every read across every source and reads only full replicas "
                   "(a regular file of the primary's size)")
# A copy in RAM is no member for this engine: it cuts every read across every source, so each must
# hold the whole model (a RAM copy of the whole 518 GB file, which no machine it runs on holds), and
# it runs on macOS (Metal), which has no tmpfs. Our reading of its design, not a check in its code.
MEMORY_MEMBER = ("ds4-argodrive cuts every read across every source, so a RAM member would have to hold the whole "
                 "model in RAM, and it runs on macOS, which has no tmpfs; keep RAM members for colibri")

# ar_open drops a decode list of the wrong count with one log line and reads with the base weights.
DECODE_MISCOUNT = f'ds4 logs "ds4: ignoring {ENV_DECODE_WEIGHTS}=..." and reads with the base weights'

ENGINE = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX,
                granule=BLOCK_BYTES, split=split_ds4, path_forbidden=PATH_FORBIDDEN, pattern=read_pattern,
                concurrency=concurrency, grid=weight_grid, reads_model=reads_model, equivalent=smallest_equivalent,
                profile=ds4_profile, memory_member=MEMORY_MEMBER, partial_refusal=PARTIAL_REFUSAL,
                decode_miscount=DECODE_MISCOUNT, read_shapes=read_shapes,
                preference=preference, calibrate=ds4_profile.calibration_record)
