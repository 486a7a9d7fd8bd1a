"""What colibri makes of its variables (pure): the mirror list, COLI_DISK_WEIGHTS as each member
parses it, and the environment a plan gives (c/colibri.c `main`, `mirror_setup`; c/glm53.c
`glm53_mirror_setup`)."""

from __future__ import annotations

import re
from typing import Sequence

from .constants import (
    DIRECT,
    ENV_DIRECT,
    ENV_MIRROR,
    ENV_MODEL,
    ENV_SNAP,
    ENV_STRIPE,
    ENV_WEIGHTS,
    GLM53_WEIGHT_MAX,
    GLM53_WEIGHTS_MAX,
    MAX_SOURCES,
    MIRROR_LIST_MAX,
    MIRROR_SEPARATOR,
    STRIPE,
    WEIGHTS_MAX,
)
from .family import FamilyMember

_C_SPACE = " \t\n\v\f\r"         # what strtol skips before a number (isspace in the C locale)


def mirror_list(mirror: str | None, legacy: str | None = None) -> tuple[str, ...]:
    """The mirror entries mirror_setup tries, in order: COLI_MODEL_MIRROR (else SNAP_MIRROR)
    cut to its first 4095 chars, split on ';' or ',', spaces trimmed, empty entries dropped."""
    text = mirror if mirror else legacy
    if not text:
        return ()
    entries = re.split(r"[;,]", text[:MIRROR_LIST_MAX])
    return tuple(e.strip(" ") for e in entries if e.strip(" "))


_ATOF = re.compile(r"[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.I)


def _atof(token: str) -> float:
    m = _ATOF.match(token)
    return float(m.group(0)) if m else 0.0


def parse_disk_weights(text: str, loaded: int) -> tuple[float, ...] | None:
    """COLI_DISK_WEIGHTS as mirror_setup takes it for `loaded` drives (primary + mirrors that
    loaded): tokens split on ',' or ' ', each read like atof and > 0, exactly `loaded` of them;
    None when colibri rejects it and probes the drives instead."""
    out = []
    for tok in (t for t in re.split(r"[, ]", text[:WEIGHTS_MAX]) if t):
        v = _atof(tok)
        if not v > 0 or len(out) >= MAX_SOURCES:   # 'not v > 0' also refuses nan, as v<=0 does not
            return None
        out.append(v)
    return tuple(out) if out and len(out) == loaded else None



def plan_environment(model_dir: str, mirrors: Sequence[str], weights: Sequence[int],
                     switches: frozenset[str] = frozenset()) -> tuple[tuple[str, str], ...]:
    """The variables for a model directory, its mirror directories and one weight per drive
    (primary first). COLI_MODEL for the coli launcher, SNAP for the engine binary; a single
    drive needs no mirror list and no weights; striping needs DIRECT=1 (O_DIRECT is the only
    path that stripes) and says COLI_MIR_STRIPE=1 rather than rely on its default. O_DIRECT
    without striping (`direct`) says COLI_MIR_STRIPE=0 over mirrors: unset, colibri stripes."""
    stripe, direct = STRIPE in switches, DIRECT in switches
    env = [(ENV_MODEL, model_dir), (ENV_SNAP, model_dir)]
    if mirrors:
        env += [(ENV_MIRROR, MIRROR_SEPARATOR.join(mirrors)), (ENV_WEIGHTS, ",".join(map(str, weights)))]
        if stripe:
            env += [(ENV_DIRECT, "1"), (ENV_STRIPE, "1")]
        elif direct:
            env += [(ENV_DIRECT, "1"), (ENV_STRIPE, "0")]
    elif direct:
        env += [(ENV_DIRECT, "1")]
    return tuple(env)



def strtol_weights(text: str, loaded: int) -> tuple[int, ...] | None:
    """COLI_DISK_WEIGHTS as c/glm53.c glm53_mirror_setup reads it for `loaded` drives: its first
    511 chars; strtol base 10 (leading blanks, tabs and a sign allowed), each value 1..1e6, then
    only blanks before a ',' (blanks after it skipped) or the end; at most 5 values are read and
    the rest ignored; exactly `loaded` of them. None: glm53 rejects it and probes the drives."""
    s = text[:GLM53_WEIGHTS_MAX]
    if not s:
        return None
    out: list[int] = []
    i = 0
    while i is not None and i < len(s) and len(out) < MAX_SOURCES:
        j = i
        while j < len(s) and s[j] in _C_SPACE:
            j += 1
        k = j + 1 if j < len(s) and s[j] in "+-" else j
        d = k
        while d < len(s) and s[d].isascii() and s[d].isdigit():
            d += 1
        if d == k:                                   # end == q: no number
            return None
        v = int(s[j:d])
        if v <= 0 or v > GLM53_WEIGHT_MAX:
            return None
        out.append(v)
        while d < len(s) and s[d] == " ":
            d += 1
        if d == len(s):
            i = None
        elif s[d] == ",":
            i = d + 1
            while i < len(s) and s[i] == " ":
                i += 1
        else:
            return None
    return tuple(out) if len(out) == loaded else None



def parse_weights(member: FamilyMember, text: str, loaded: int) -> tuple[float, ...] | None:
    """COLI_DISK_WEIGHTS as `member` reads it for `loaded` drives (primary + mirrors that
    loaded); None: the engine rejects it and probes the drives instead."""
    if member.integer_weights:
        parsed = strtol_weights(text, loaded)
        return None if parsed is None else tuple(float(v) for v in parsed)
    return parse_disk_weights(text, loaded)
