"""colibri: what it does with mirrors, as data and pure functions.

Read from colibri's sources (JustVugg/colibri, stored snapshot 99625c7e of c/colibri.c; the same
code in the snapshot of its merge #1052, 4ef9a99), and docs/engine-profiles.md names every rule's
function:

- the `coli` launcher (c/coli, `env_for`) starts the engine with SNAP=<--model>, whose default is
  COLI_MODEL; `need_model` refuses a model that is not a directory holding tokenizer.json;
- c/colibri.c `main` reads COLI_MODEL_MIRROR, or SNAP_MIRROR when that is unset or empty, and
  COLI_MIR_STRIPE (`g_mir_stripe`, on unless set to 0) and DIRECT (`g_direct`, off unless set);
- `mirror_setup` splits the mirror list on ';' or ',', trims spaces, ignores an entry equal to
  SNAP (else COLI_MODEL) and any entry past 4 loaded mirrors, and registers each through
  c/st.h `st_mirror_add`: a shard is admitted only when the mirror's file of the same basename
  has the primary's size and byte-identical safetensors header; a missing file stays on the
  primary; a directory contributing no shard takes no replica number;
- `mirror_setup` takes COLI_DISK_WEIGHTS only when it holds exactly 1 + loaded-mirrors positive
  numbers (separated by ',' or ' '), else logs "invalid COLI_DISK_WEIGHTS ... probing instead";
  the weights become cumulative cuts of 256 (`g_mir_cut`);
- `expert_route` hashes (layer, expert) into 0..255 and serves the expert from the replica whose
  cut slice holds the hash (`expert_load_impl` falls back to the primary when that replica lacks
  the shard);
- `mir_pread_striped` (only on the O_DIRECT path, DIRECT=1, window >= 4 MiB, >= 2 replicas holding
  the shard) cuts one expert read into equal 4 KiB-aligned chunks, chunk 0 on the routed replica;
- `profile_print` prints the `MIRROR:` line of bytes and reads served per drive.

That is colibri's GLM engine, and `placement`'s plain functions keep its rules. colibri runs
each model family on its own engine, chosen by config.json's model_type; `family.FAMILY` holds
one `FamilyMember` per engine with mirror code (c/colibri.c, c/deepseek_v4.c, c/deepseek_v41.c,
c/glm53.c), each rule read from that engine's source, and `member_for` dispatches as colibri's
launcher does (c/family_registry.py). `stripe_read(..., legs='weighted')` is the GLM engine's
weight-sized stripe legs (`mir_stripe_plan`), read from derived copies of a newer colibri.c.

The package holds one module per thing the engine is asked: its facts (`constants`), where an
expert is read from (`placement`, `family`), what it makes of its variables (`mirror_env`), its
read pattern (`colibri_reads`), its log lines (`colibri_log`), its own workload (cache, memory, the `[PROF]` lines:
`colibri_workload`), its usage history (`usage_file`), its profile, export's and
launch's side (`colibri_profile`, with the stand-in's in `colibri_standin`). This file assembles
them into the `Engine` the registry holds; no module of the package imports it.
"""

from __future__ import annotations

from ..base import Engine
from . import colibri_profile
from .colibri_log import read_timing
from .colibri_workload import calibration_record, own_workload
from .colibri_reads import (
    buffered,
    concurrency,
    modes,
    preference,
    read_pattern,
    reads_model,
    replica_serves,
    weight_grid,
)
from .constants import ALIGN, GLM_MODEL_TYPE, MAX_SOURCES, NAME, PATH_FORBIDDEN, SWITCHES, USAGE_FILE, WEIGHT_MAX, WEIGHT_MIN
from .family import known_model_types
from .usage_file import read_usage

ENGINE = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX,
                granule=ALIGN, split=None, path_forbidden=PATH_FORBIDDEN,
                pattern=read_pattern, concurrency=concurrency, grid=weight_grid, reads_model=reads_model,
                switches=SWITCHES, modes=modes, phase_weights=False, profile=colibri_profile,
                buffered=buffered, timing=read_timing, replica_serves=replica_serves,
                usage_file=USAGE_FILE, read_usage=read_usage, preference=preference,
                own_workload=own_workload, calibrate=calibration_record,
                model_types=(GLM_MODEL_TYPE,) + tuple(t for t in known_model_types() if t != GLM_MODEL_TYPE))
