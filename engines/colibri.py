"""colibri: what it does, as data (its placement and stripe rules are still to be read from its
sources; until then it has no split rule here and plans for it use their base weights).

From colibri's multidisk documentation and loader: COLI_MODEL is the primary, COLI_MODEL_MIRROR a
';'- or ','-separated list of byte-identical copies (at most 4), COLI_DISK_WEIGHTS comma-separated
positive relative weights, primary first; SNAP_MIRROR is the legacy alias of COLI_MODEL_MIRROR.
"""

from __future__ import annotations

from typing import Sequence

from .base import Engine

NAME = "colibri"

MAX_MIRRORS = 4
MAX_SOURCES = 1 + MAX_MIRRORS    # primary + ST_MAX_MIR mirrors
WEIGHT_MIN, WEIGHT_MAX = 1, 100
PATH_FORBIDDEN = ";,"            # both separate COLI_MODEL_MIRROR entries

ENV_MODEL = "COLI_MODEL"
ENV_MIRROR = "COLI_MODEL_MIRROR"
ENV_WEIGHTS = "COLI_DISK_WEIGHTS"
ENV_LEGACY_MIRROR = "SNAP_MIRROR"
ENV_KEYS = (ENV_MODEL, ENV_MIRROR, ENV_WEIGHTS, ENV_LEGACY_MIRROR)   # every key the loader reads; all come from the plan
MIRROR_SEPARATOR = ";"           # written; colibri also accepts ','


def plan_environment(primary: str, mirrors: Sequence[str], weights: Sequence[int]) -> tuple[tuple[str, str], ...]:
    """The variables for a primary, its mirrors and one weight per drive (primary first); a
    single source needs no mirror list and no weights."""
    env = [(ENV_MODEL, primary)]
    if mirrors:
        env += [(ENV_MIRROR, MIRROR_SEPARATOR.join(mirrors)), (ENV_WEIGHTS, ",".join(map(str, weights)))]
    return tuple(env)


ENGINE = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX,
                granule=1, split=None, path_forbidden=PATH_FORBIDDEN)
