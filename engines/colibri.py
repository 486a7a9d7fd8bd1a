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

That is colibri's GLM engine, and the module's plain functions keep its rules. colibri runs
each model family on its own engine, chosen by config.json's model_type; `FAMILY` holds one
`Member` per engine with mirror code (c/colibri.c, c/deepseek_v4.c, c/deepseek_v41.c,
c/glm53.c), each rule read from that engine's source, and `member_for` dispatches as colibri's
launcher does (c/family_registry.py). `stripe_read(..., legs='weighted')` is the GLM engine's
weight-sized stripe legs (`mir_stripe_plan`), read from derived copies of a newer colibri.c.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from core.errors import UsageError

from . import colibri_profile
from .base import Engine, Piece
from .pattern import Concurrency, Pattern, Read, Setup, Step

NAME = "colibri"

MAX_MIRRORS = 4                  # ST_MAX_MIR (c/st.h)
MAX_SOURCES = 1 + MAX_MIRRORS    # MIR_REPS (c/colibri.c)
WEIGHT_MIN, WEIGHT_MAX = 1, 100  # what our plans hold; colibri itself takes any positive number
PATH_FORBIDDEN = ";,"            # both separate COLI_MODEL_MIRROR entries (mirror_setup)
MIRROR_SEPARATOR = ";"           # written; colibri also accepts ','
MIRROR_LIST_MAX = 4095           # chars of the mirror list mirror_setup keeps (char buf[4096])
WEIGHTS_MAX = 255                # chars of COLI_DISK_WEIGHTS mirror_setup keeps (char wb[256])
SHARD_PATH_MAX = 2047            # chars of "<mirror>/<shard>" st_mirror_add can open (char mp[2048])
SHARD_SUFFIX = ".safetensors"    # the files st_scan_dir indexes and st_mirror_add mirrors
TOKENIZER = "tokenizer.json"     # the coli launcher refuses a model directory without it (need_model)

HASH_BUCKETS = 256               # expert_route hashes into 0..255; cuts are out of 256
STRIPE_MIN = 4 << 20             # bytes: mir_pread_striped leaves smaller reads whole
ALIGN = 4096                     # bytes: O_DIRECT window and stripe chunk alignment

ENV_MODEL = "COLI_MODEL"                 # the coli launcher's --model default
ENV_SNAP = "SNAP"                        # what the engine binary itself reads (set by coli from --model)
ENV_MIRROR = "COLI_MODEL_MIRROR"
ENV_LEGACY_MIRROR = "SNAP_MIRROR"        # read only when COLI_MODEL_MIRROR is unset or empty
ENV_WEIGHTS = "COLI_DISK_WEIGHTS"
ENV_MODEL_DIRS = "COLI_MODEL_DIRS"       # a split layout (distinct shards per drive), not replicas
ENV_DIRECT = "DIRECT"                    # atoi: 1 = O_DIRECT expert reads, the only path that stripes
ENV_STRIPE = "COLI_MIR_STRIPE"           # atoi: 0 disables striping; unset means on
ENV_PROF = "PROF"                        # the docs ask PROF=1 for the MIRROR: statistics line
# Every key a colibri profile speaks for (sets, or unsets); all come from the plan.
ENV_KEYS = (ENV_MODEL, ENV_SNAP, ENV_MIRROR, ENV_WEIGHTS, ENV_LEGACY_MIRROR, ENV_MODEL_DIRS, ENV_DIRECT, ENV_STRIPE)
ARG_MODEL = "--model"                    # given by the profile through COLI_MODEL; never twice

_M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# Placement (expert_route) and the weights' cuts (mirror_setup)

def cuts(weights: Sequence[float]) -> tuple[int, ...]:
    """Cumulative cuts of 256, one per drive (primary first): drive r serves hash values in
    [cuts[r-1], cuts[r]). Every drive keeps a non-empty slice; the last absorbs rounding
    (the GLM engine's mirror_setup; the family's other members: `Member.cuts`)."""
    return _float_cuts(weights, force_last=True)


def expert_hash(layer: int, expert: int) -> int:
    """expert_route's hash of (layer, expert): 0..255, in uint32 arithmetic."""
    h = ((layer * 2654435761) & _M32) ^ ((expert * 0x9E3779B9) & _M32)
    h ^= h >> 16
    h = (h * 0x45D9F3B) & _M32
    h ^= h >> 16
    return h & 255


def place_expert(layer: int, expert: int, weights: Sequence[float],
                 holders: Sequence[int] | None = None) -> int:
    """The drive (0 = primary, then mirrors in load order) that serves expert (layer, expert)
    for one weight per loaded drive. `holders`: the drives whose copy holds the expert's shard
    (default all); a routed mirror without it hands the expert to the primary."""
    if len(weights) < 2:
        return 0
    hv, r = expert_hash(layer, expert), 0
    c = cuts(weights)
    while hv >= c[r]:
        r += 1
    if r and holders is not None and r not in holders:
        return 0
    return r


def placement_counts(layers: int, experts: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Experts each drive serves over a layers x experts grid (the whole model's placement)."""
    counts = [0] * max(1, len(weights))
    for layer in range(layers):
        for e in range(experts):
            counts[place_expert(layer, e, weights)] += 1
    return tuple(counts)


# ---------------------------------------------------------------------------------------------
# The striped read (mir_pread_striped) and the O_DIRECT window it stripes

def direct_window(offset: int, length: int) -> tuple[int, int]:
    """(offset, length) in bytes of the 4 KiB-aligned window expert_load_impl reads with
    O_DIRECT for an expert's weights at [offset, offset+length)."""
    base = offset & ~(ALIGN - 1)
    need = offset - base + length
    return base, (need + ALIGN - 1) & ~(ALIGN - 1)


def stripes(length: int, holders: int) -> bool:
    """Whether mir_pread_striped cuts a window of `length` bytes over `holders` drives."""
    return holders >= 2 and length >= STRIPE_MIN


def stripe_read(offset: int, length: int, routed: int, holders: Sequence[int],
                weights: Sequence[float] | None = None, legs: str = "equal") -> tuple[Piece, ...]:
    """The pieces that serve one O_DIRECT window [offset, offset+length) with striping on, leg
    i on holders[(routed + i) % drives] (`holders`: the drives holding the shard with an O_DIRECT
    descriptor, ascending). `routed` is a drive number used as a list index, as the source does:
    with a partial mirror chunk 0 can land on another drive. A window colibri does not stripe is
    one piece on the routed drive (the primary when the routed drive lacks the shard).

    legs='equal' (c/colibri.c `mir_pread_striped` before the weighted-stripe change, the code in
    every stored upstream snapshot read): chunks of ceil(length / drives) rounded up to 4 KiB,
    the last one shorter.

    legs='weighted' (`mir_stripe_plan`, the weighted-stripe change colibri's docs credit to PR
    #1270): `weights` holds one weight per loaded drive (primary first; the holders' numbers
    index it). Each holder's share is the width of its slice of the cuts the weights give
    (`cuts`, not the raw weight), at least 1; every leg but the last is
    floor(length * share / sum of the holders' shares) rounded up to 4 KiB and clipped to what
    is left; the last leg takes the rest. A leg that comes out empty is skipped; fewer than two
    non-empty legs and colibri reads the window whole on the routed drive."""
    if legs not in ("equal", "weighted"):
        raise ValueError(f"legs must be 'equal' or 'weighted', not {legs!r}")
    hs = sorted(holders)
    if routed not in hs:
        routed = 0
    whole = (Piece(routed, offset, length, length // ALIGN),)
    if not stripes(length, len(hs)):
        return whole
    n = len(hs)
    if legs == "equal":
        chunk = ((length + n - 1) // n + ALIGN - 1) & ~(ALIGN - 1)
        pieces = []
        for i in range(n):
            o = i * chunk
            if o >= length:
                break
            size = min(chunk, length - o)
            pieces.append(Piece(hs[(routed + i) % n], offset + o, size, size // ALIGN))
        return tuple(pieces)
    if weights is None:
        raise ValueError("weighted legs need one weight per loaded drive")
    if any(h < 0 or h >= len(weights) for h in hs):
        raise ValueError(f"holders {tuple(hs)} name drives beyond the {len(weights)} weights")
    c = cuts(weights)
    share = [max(1, c[h] - (c[h - 1] if h else 0)) for h in hs]
    total = sum(share)
    pieces, acc = [], 0
    for i in range(n):
        k = (routed + i) % n
        want = length - acc if i == n - 1 else ((length * share[k] // total) + ALIGN - 1) & ~(ALIGN - 1)
        want = max(0, min(want, length - acc))
        if want > 0:
            pieces.append(Piece(hs[k], offset + acc, want, want // ALIGN))
        acc += want
    return tuple(pieces) if len(pieces) >= 2 else whole


# ---------------------------------------------------------------------------------------------
# What colibri makes of its variables (main, mirror_setup)

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


def split_percents(weights: Sequence[float]) -> tuple[str, ...]:
    """The shares the '[MIRROR] N drives | read split' line prints, as printed ('%.0f')."""
    c, lo, out = cuts(weights), 0, []
    for x in c:
        out.append(f"{100.0 * (x - lo) / 256:.0f}")
        lo = x
    return tuple(out)


def plan_environment(model_dir: str, mirrors: Sequence[str], weights: Sequence[int],
                     stripe: bool = False, direct: bool = False) -> tuple[tuple[str, str], ...]:
    """The variables for a model directory, its mirror directories and one weight per drive
    (primary first). COLI_MODEL for the coli launcher, SNAP for the engine binary; a single
    drive needs no mirror list and no weights; striping needs DIRECT=1 (O_DIRECT is the only
    path that stripes) and says COLI_MIR_STRIPE=1 rather than rely on its default. O_DIRECT
    without striping (`direct`) says COLI_MIR_STRIPE=0 over mirrors: unset, colibri stripes."""
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


def reads_model(fmt: str, layout: str, files: Sequence[str]) -> str:
    """colibri loads a directory of safetensors shards holding tokenizer.json: the coli launcher's
    `need_model` refuses a model directory without TOKENIZER, c/st.h `st_scan_dir` indexes the
    *.safetensors (SHARD_SUFFIX) at the top of it. A lone shard stands for its folder (export then
    checks that folder). '' when colibri reads such a model, else one line why not."""
    if fmt != "safetensors":
        what = "a split GGUF set" if layout == "gguf-split" else \
            f"a {fmt} {'directory' if layout == 'dir' else 'file' if layout == 'file' else layout}"
        return f"{NAME} loads a directory of safetensors shards with {TOKENIZER}; this model is {what}"
    if layout == "file":
        return ""
    if layout != "dir":
        return f"{NAME} loads a directory of safetensors shards with {TOKENIZER}; this model is a safetensors {layout}"
    top = [f for f in files if "/" not in f]
    if not any(f.endswith(SHARD_SUFFIX) for f in top):
        return f"{NAME} loads the *{SHARD_SUFFIX} shards at the top of the model directory; this one has none"
    if TOKENIZER not in top:
        return f"{NAME}'s coli launcher refuses a model directory without {TOKENIZER} (need_model); this one has none"
    return ""


# ---------------------------------------------------------------------------------------------
# Log lines: what colibri says it applied (its fprintf/printf formats)

_DASH = r"(?:\u2014|--|-)"
LOG_MIRROR_LOADED = re.compile(r"^\[MIRROR\] (.+): (\d+)/(\d+) shards \(replica (\d+)\)\s*$", re.M)
LOG_MIRROR_SKIPPED = re.compile(r"^\[MIRROR\] (.+): no usable shard \(missing or divergent copy\) " + _DASH, re.M)
LOG_MIRROR_TOO_MANY = re.compile(r"^\[MIRROR\] (.+): too many mirrors \(max (\d+)\) " + _DASH, re.M)
LOG_MIRROR_IS_MODEL = re.compile(r"^\[MIRROR\] (.+) equals the model dir " + _DASH, re.M)
LOG_FILE_SKIPPED = re.compile(r"^\[MIRROR\] (.+): (size|header) differs from the primary copy " + _DASH, re.M)
LOG_NO_MIRROR = re.compile(r"^\[MIRROR\] no usable mirror " + _DASH, re.M)
LOG_WEIGHTS_INVALID = re.compile(r"^\[MIRROR\] invalid COLI_DISK_WEIGHTS '(.*)' \(want (\d+) positive", re.M)
LOG_SPLIT = re.compile(r"^\[MIRROR\] (\d+) drives \| read split ([\d% /]+?) \((.+)\)\s*$", re.M)
LOG_READ_ERROR = re.compile(r"^\[MIRROR\] read error on the mirror copy", re.M)
LOG_STATS = re.compile(r"^MIRROR: primary ([\d.]+) GB \((\d+) reads\)(.*)$", re.M)
# c/colibri.c `profile_print` (always printed): the phase's time by part, the expert reads' wait first.
# The first such line after `PROFILO PREFILL (Xs):` is the prompt's; the last one is the decode's
# (`profile_reset` runs between them). Unconfirmed for the V4, V4.1 and GLM-5.3 engines.
LOG_PREFILL_TIME = re.compile(r"^PROFILO PREFILL \(([\d.]+)s\):\s*$", re.M)
LOG_PROFILE = re.compile(r"^PROFILE: expert-disk ([\d.]+)s service / ([\d.]+)s wait \| expert-matmul ([\d.]+)s \| "
                         r"attention ([\d.]+)s \(including kvb [\d.]+s\) \| lm_head ([\d.]+)s \| other (-?[\d.]+)s", re.M)
LOG_STATS_MIRROR = re.compile(r"\| mirror(\d*) ([\d.]+) GB \((\d+) reads\)")
HOW_WEIGHTS = ENV_WEIGHTS        # the split line's '(COLI_DISK_WEIGHTS)': the weights were taken
STATS_RESOLUTION = 10_000_000    # bytes: the MIRROR: line prints GB with two decimals


@dataclass(frozen=True)
class MirrorLoad:
    path: str        # the mirror entry, as colibri printed it
    shards: int      # shard files admitted
    total: int       # shard files of the primary
    replica: int     # the drive number colibri gave it (1 = first mirror that loaded)


@dataclass(frozen=True)
class Served:
    bytes: int       # decimal GB as printed, times 1e9 (resolution STATS_RESOLUTION)
    reads: int


@dataclass(frozen=True)
class LogReport:
    """What one colibri run's log (stdout and stderr) says it applied; empty or None: no such line."""
    loaded: tuple[MirrorLoad, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()         # (mirror entry, why colibri dropped it)
    files_skipped: tuple[tuple[str, str], ...] = ()   # (shard path, 'size' | 'header')
    no_mirror: bool = False                           # '[MIRROR] no usable mirror' was printed
    weights_rejected: str | None = None               # the COLI_DISK_WEIGHTS text colibri refused
    weights_wanted: int | None = None                 # how many weights it wanted then
    drives: int | None = None                         # from the last read-split line
    split: tuple[str, ...] = ()                       # its per-drive shares, '%' dropped
    split_how: str = ""                               # 'COLI_DISK_WEIGHTS', 'measured', 'fallback 1:1 (probe failed)'
    read_error: bool = False                          # a mirror read failed and the primary served it
    served: dict[int, Served] = field(default_factory=dict)   # drive -> last MIRROR: line's counters


def last_split(found) -> tuple[int | None, tuple[str, ...], str]:
    """(drives, per-drive shares with '%' dropped, how chosen) from the last of the split lines
    `found` ((drives, 'A% / B% ...', how) tuples); (None, (), '') when there is none."""
    if not found:
        return None, (), ""
    n, shares, how = found[-1]
    return int(n), tuple(x.strip().rstrip("%") for x in shares.split(" /")), how


def read_log(text: str) -> LogReport:
    """Every line of `text` in which colibri says what it did with its mirrors."""
    loaded = tuple(MirrorLoad(p, int(n), int(m), int(k)) for p, n, m, k in LOG_MIRROR_LOADED.findall(text))
    skipped = [(p, "no usable shard (missing or divergent copy)") for p in LOG_MIRROR_SKIPPED.findall(text)]
    skipped += [(p, f"too many mirrors (max {n})") for p, n in LOG_MIRROR_TOO_MANY.findall(text)]
    skipped += [(p, "equals the model dir") for p in LOG_MIRROR_IS_MODEL.findall(text)]
    bad = LOG_WEIGHTS_INVALID.findall(text)
    drives, split, how = last_split(LOG_SPLIT.findall(text))
    served: dict[int, Served] = {}
    stats = LOG_STATS.findall(text)
    if stats:
        gb, reads, rest = stats[-1]
        served[0] = Served(round(float(gb) * 1e9), int(reads))
        for i, (k, gb_k, reads_k) in enumerate(LOG_STATS_MIRROR.findall(rest), 1):
            served[int(k) if k else i] = Served(round(float(gb_k) * 1e9), int(reads_k))
    return LogReport(loaded=loaded, skipped=tuple(skipped), files_skipped=tuple(LOG_FILE_SKIPPED.findall(text)),
                     no_mirror=bool(LOG_NO_MIRROR.search(text)),
                     weights_rejected=bad[-1][0] if bad else None, weights_wanted=int(bad[-1][1]) if bad else None,
                     drives=drives, split=split, split_how=how, read_error=bool(LOG_READ_ERROR.search(text)),
                     served=served)


def read_timing(text: str) -> dict[str, tuple[float, float]]:
    """{phase: (seconds, seconds waiting for expert reads)} from colibri's PROFILE lines: the
    line right after `PROFILO PREFILL (Xs):` is the prompt's (its seconds that header's), the
    last other one the decode's (its seconds the sum of its parts, as `profile_print` derives
    'other')."""
    out: dict[str, tuple[float, float]] = {}
    pre = LOG_PREFILL_TIME.search(text)
    rows = list(LOG_PROFILE.finditer(text))
    for m in rows:
        service, wait, matmul, attention, head, other = (float(x) for x in m.groups())
        total = wait + matmul + attention + head + max(0.0, other)
        if pre is not None and m.start() > pre.end() and "prefill" not in out:
            out["prefill"] = (float(pre.group(1)) or total, wait)
        elif pre is None or m.start() > pre.end():
            out["decode"] = (total, wait)
    return out


# =============================================================================================
# colibri's family: one engine per model family, each with its own mirror rules
#
# The `coli` launcher picks the engine from config.json's model_type (c/family_registry.py
# `family_for_config`, called by c/coli `resolve_model` / `engine_for`): the model_type is
# stripped and lower-cased and looked up among the registered families; one it does not know
# raises UnknownFamilyError ("unsupported model_type: X") and nothing is launched. Older
# launchers (c/coli `model_arch` at 4ef9a99) matched substrings instead and gave everything
# unrecognised to the GLM engine, and "deepseek_v41" to the DeepSeek V4 engine.
#
# Each member below was read from its engine's source; the functions and files are named where
# each rule is reproduced. Everything is pure: no file is opened, no drive is probed.
#
# Unconfirmed (docs/engine-profiles.md, "Unconfirmed"): which upstream commit brought the
# weighted stripe legs (read in derived copies of a newer colibri.c, not upstream); whether the
# newest deepseek_v4.c's expert store reads an expert split across shards tensor by tensor (the
# answer serve() gives is the same either way: each read falls back by its own shard); the
# V4 CLI-exit "v4_mirror drives=" line, read in one upstream snapshot only.

GOLDEN = 2654435761              # the multiplier both placement hashes use
PLACEMENT_XOR = "xor"            # layer*2654435761 ^ eid*0x9E3779B9, mixed, & 255 (c/colibri.c expert_route)
PLACEMENT_FLAT = "flat"          # ((layer*experts_per_layer + eid) * 2654435761) >> 16 & 255 (deepseek_v4.c)
FALLBACKS = ("anchor", "shard", "tensor", "expert")
GLM53_WEIGHT_MAX = 1_000_000     # c/glm53.c glm53_mirror_setup: strtol value must be 1..1e6
GLM53_WEIGHTS_MAX = 511          # chars of COLI_DISK_WEIGHTS glm53_mirror_setup keeps (char wb[512])
V4_STATS_RESOLUTION = (1 << 30) // 100   # bytes: the v4_mirror line prints GiB with two decimals
DSV41_EXPERTS_PER_LAYER = 384    # c/deepseek_v41.c g_mir_epl default (n_routed of the released model)
DSV4_EXPERTS_PER_LAYER = 256     # c/deepseek_v4.c g_v4_mir_epl default (n_routed of V4 Flash)

_C_SPACE = " \t\n\v\f\r"         # what strtol skips before a number (isspace in the C locale)


def _float_cuts(weights: Sequence[float], force_last: bool) -> tuple[int, ...]:
    """The cut loop colibri.c, deepseek_v4.c and deepseek_v41.c share: c = (int)(256*cum/W + 0.5),
    at least the previous cut + 1, at most 256. colibri.c and deepseek_v4.c then force the last
    cut to 256; deepseek_v41.c does not, and need not: cum == W at the last drive, so it is 256."""
    total = 0.0
    for w in weights:
        total += w
    out, acc, cum = [], 0, 0.0
    for w in weights:
        cum += w
        c = int(256.0 * cum / total + 0.5)
        if c <= acc:
            c = acc + 1
        c = min(c, HASH_BUCKETS)
        out.append(c)
        acc = c
    if force_last:
        out[-1] = HASH_BUCKETS
    return tuple(out)


def _integer_cuts(weights: Sequence[int]) -> tuple[int, ...]:
    """c/glm53.c glm53_mirror_setup: cut = (256*acc + total/2) / total in integers, clamped to
    1..256, no guard against the previous cut (a drive's slice can be empty), the last 256."""
    total = sum(weights)
    out, acc = [], 0
    for w in weights:
        acc += w
        out.append(min(max((HASH_BUCKETS * acc + total // 2) // total, 1), HASH_BUCKETS))
    out[-1] = HASH_BUCKETS
    return tuple(out)


def flat_hash(layer: int, expert: int, experts_per_layer: int) -> int:
    """c/deepseek_v4.c v4_expert_route and c/deepseek_v41.c expert_route: the flat index
    layer*experts_per_layer + eid (C int, then uint32), times 2654435761 (uint32), bits 16..23."""
    idx = (layer * experts_per_layer + expert) & _M32
    return (((idx * GOLDEN) & _M32) >> 16) & 255


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


_STATS_V4 = re.compile(r"^v4_mirror(?: drives=\d+)?((?: (?:primary|mirror)=[\d.]+GiB/\d+)+)[ \t]*$", re.M)
_STATS_V4_DRIVE = re.compile(r" (primary|mirror)=([\d.]+)GiB/(\d+)")


def _mirror_lines(text: str) -> list[dict[int, Served]]:
    """Every `MIRROR: primary X GB (N reads) | mirrorK ...` line (c/colibri.c profile_print,
    c/deepseek_v41.c mirror_report: the same printf format), in order."""
    lines = []
    for gb, reads, rest in LOG_STATS.findall(text):
        served = {0: Served(round(float(gb) * 1e9), int(reads))}
        for i, (k, gb_k, reads_k) in enumerate(LOG_STATS_MIRROR.findall(rest), 1):
            served[int(k) if k else i] = Served(round(float(gb_k) * 1e9), int(reads_k))
        lines.append(served)
    return lines


@dataclass(frozen=True)
class Member:
    """One colibri engine's mirror rules, as its source has them."""

    name: str                       # 'glm', 'deepseek_v4', 'deepseek_v41', 'glm53'
    source: str                     # the file its rules were read from
    model_types: frozenset[str]     # config.json model_type values colibri's launcher sends to it
    integer_weights: bool           # COLI_DISK_WEIGHTS read with strtol (glm53), else atof
    stripes: bool                   # splits one expert read across drives (only the GLM engine)
    fallback: str                   # what a mirror without an expert's file does (FALLBACKS)
    stats: str | None               # 'stdout' | 'stderr' | None: where its per-drive statistics line goes
    placement: str                  # PLACEMENT_XOR | PLACEMENT_FLAT
    experts_per_layer: int | None = None   # the flat hash's default multiplier (None: the hash ignores it)

    def cuts(self, weights: Sequence[float]) -> tuple[int, ...]:
        """The 256-cut vector for one weight per loaded drive, primary first: drive r serves
        buckets [cuts[r-1], cuts[r])."""
        if not weights:
            raise ValueError("cuts need at least one weight")
        if any(not w > 0 or w != w or w == float("inf") for w in weights):
            raise ValueError(f"{self.name}: weights must be positive and finite, not {tuple(weights)}")
        if self.integer_weights:
            if any(int(w) != w for w in weights):
                raise ValueError(f"{self.name} takes integer weights (strtol), not {tuple(weights)}")
            return _integer_cuts([int(w) for w in weights])
        return _float_cuts(weights, force_last=self.name != "deepseek_v41")

    def bucket(self, layer: int, expert: int, experts_per_layer: int | None = None) -> int:
        """The placement hash of (layer, expert): 0..255. The flat hash needs experts_per_layer
        (the config's n_routed_experts; default: this member's released model's)."""
        if self.placement == PLACEMENT_XOR:
            return expert_hash(layer, expert)
        epl = experts_per_layer if experts_per_layer is not None else self.experts_per_layer
        if not epl or epl < 1:
            raise ValueError(f"{self.name}'s placement hash needs experts_per_layer")
        return flat_hash(layer, expert, epl)

    def route(self, layer: int, expert: int, experts_per_layer: int | None,
              weights: Sequence[float]) -> int:
        """The drive the cuts pick for (layer, expert) with one weight per loaded drive, before
        looking at what the mirrors hold. One drive: no mirror is active and the primary serves."""
        if len(weights) < 2:
            return 0
        c = self.cuts(weights)
        hv, r = self.bucket(layer, expert, experts_per_layer), 0
        while r + 1 < len(c) and hv >= c[r]:     # glm53's guard; the others end on cut 256
            r += 1
        return r

    def serve(self, routed: int, tensor_files: Sequence[str], holds) -> tuple[int, ...]:
        """One source per tensor of the expert, in the order given (the anchor tensor first):
        `holds(source, file)` says whether that drive's copy has that shard; the primary (0)
        holds everything.

        'anchor' (c/colibri.c expert_load_impl): the routed mirror must hold the gate_proj
        weight's shard, else the whole expert comes from the primary; when it does, each other
        tensor is read from it only if it holds that tensor's shard (mir_pread, rep_bfd fall
        back per tensor). 'shard' (c/deepseek_v4.c coli_st_read_at_rep) and 'tensor'
        (c/deepseek_v41.c expert_fetch, st_read_range_rep): each read falls back on its own,
        by the shard that holds it. 'expert' (c/glm53.c glm53_expert_read_replica): any piece
        missing and the whole expert comes from the primary."""
        files = tuple(tensor_files)
        if routed == 0 or not files:
            return (0,) * len(files)
        if self.fallback == "expert":
            r = routed if all(holds(routed, f) for f in files) else 0
            return (r,) * len(files)
        if self.fallback == "anchor" and not holds(routed, files[0]):
            return (0,) * len(files)
        return tuple(routed if holds(routed, f) else 0 for f in files)

    def parse_weights(self, text: str, loaded: int) -> tuple[float, ...] | None:
        """COLI_DISK_WEIGHTS as this engine reads it for `loaded` drives (primary + mirrors that
        loaded); None: the engine rejects it and probes the drives instead."""
        if self.integer_weights:
            parsed = strtol_weights(text, loaded)
            return None if parsed is None else tuple(float(v) for v in parsed)
        return parse_disk_weights(text, loaded)

    def read_stats(self, text: str) -> dict[int, Served]:
        """Bytes and reads per drive (0 = primary) from this engine's log; {} when it printed
        no statistics line (glm53 prints none).

        glm (c/colibri.c profile_print, stdout): the last `MIRROR:` line, cumulative.
        deepseek_v41 (c/deepseek_v41.c mirror_report, stderr): the `MIRROR:` format, printed per
        turn as that turn's counts by the serve loop (V41_STATS=1) or once, cumulative, at the
        end of a reference run: the lines are summed. deepseek_v4 (c/deepseek_v4.c, stderr):
        the last `v4_mirror [drives=N] primary=X.XXGiB/N mirror=X.XXGiB/N ...` line, cumulative,
        GiB (2**30 bytes), mirrors unnumbered, in drive order."""
        if self.stats is None:
            return {}
        if self.name == "deepseek_v4":
            found = _STATS_V4.findall(text)
            if not found:
                return {}
            return {i: Served(round(float(gib) * (1 << 30)), int(reads))
                    for i, (_, gib, reads) in enumerate(_STATS_V4_DRIVE.findall(found[-1]))}
        lines = _mirror_lines(text)
        if not lines:
            return {}
        if self.name == "deepseek_v41":
            total: dict[int, Served] = {}
            for line in lines:
                for k, s in line.items():
                    t = total.get(k, Served(0, 0))
                    total[k] = Served(t.bytes + s.bytes, t.reads + s.reads)
            return total
        return lines[-1]


FAMILY: dict[str, Member] = {m.name: m for m in (
    Member(name="glm", source="c/colibri.c",
           model_types=frozenset({"glm_moe_dsa", "glm5_moe", "glm"}),
           integer_weights=False, stripes=True, fallback="anchor", stats="stdout",
           placement=PLACEMENT_XOR),
    Member(name="deepseek_v4", source="c/deepseek_v4.c",
           model_types=frozenset({"deepseek_v4"}),
           integer_weights=False, stripes=False, fallback="shard", stats="stderr",
           placement=PLACEMENT_FLAT, experts_per_layer=DSV4_EXPERTS_PER_LAYER),
    Member(name="deepseek_v41", source="c/deepseek_v41.c",
           model_types=frozenset({"deepseek_v41", "deepseek_v41_text"}),
           integer_weights=False, stripes=False, fallback="tensor", stats="stderr",
           placement=PLACEMENT_FLAT, experts_per_layer=DSV41_EXPERTS_PER_LAYER),
    Member(name="glm53", source="c/glm53.c",
           model_types=frozenset({"glm5_next", "glm5_next_text"}),
           integer_weights=True, stripes=False, fallback="expert", stats=None,
           placement=PLACEMENT_XOR),
)}

# colibri's other families (c/family_registry.py FAMILIES): the launcher runs them on engines
# whose mirror rules replica-tuner does not reproduce.
OTHER_FAMILIES: dict[str, str] = {
    "inkling_mm_model": "inkling", "inkling": "inkling", "kimi_k3": "kimi_k3", "kimi_linear": "kimi_k3",
    "olmoe": "olmoe", "qwen3_5_moe": "qwen36", "qwen3_5_moe_text": "qwen36",
    "qwen4_exp": "qwen38", "qwen4_exp_text": "qwen38",
}


def known_model_types() -> tuple[str, ...]:
    return tuple(sorted(t for m in FAMILY.values() for t in m.model_types))


def member_for(model_type: str | None) -> Member:
    """The engine colibri's launcher runs for config.json's model_type (c/family_registry.py
    family_for_config: stripped, lower-cased, looked up exactly). colibri refuses a model_type
    it does not know, and so does this (UsageError); so it does for a missing one."""
    known = ", ".join(known_model_types())
    if not isinstance(model_type, str) or not model_type.strip():
        raise UsageError(f"config.json has no model_type; colibri picks its engine by it (known: {known})")
    key = model_type.strip().lower()
    for m in FAMILY.values():
        if key in m.model_types:
            return m
    if key in OTHER_FAMILIES:
        raise UsageError(f"model_type {key!r} runs colibri's {OTHER_FAMILIES[key]} engine, whose mirror rules "
                         f"replica-tuner does not reproduce; known: {known}")
    raise UsageError(f"colibri has no engine for model_type {key!r} (unsupported model_type); known: {known}")


def buckets_many(member: Member, layers: int, experts: int,
                 experts_per_layer: int | None = None) -> np.ndarray:
    """(layers, experts) array of member.bucket(layer, expert, experts_per_layer) over the grid
    0..layers-1 x 0..experts-1 (the flat hash's experts_per_layer defaults to `experts`)."""
    m32 = np.uint64(_M32)
    lay = np.arange(layers, dtype=np.uint64)[:, None]
    exp = np.arange(experts, dtype=np.uint64)[None, :]
    if member.placement == PLACEMENT_XOR:
        h = ((lay * np.uint64(GOLDEN)) & m32) ^ ((exp * np.uint64(0x9E3779B9)) & m32)
        h ^= h >> np.uint64(16)
        h = (h * np.uint64(0x45D9F3B)) & m32
        h ^= h >> np.uint64(16)
        return (h & np.uint64(255)).astype(np.int64)
    epl = np.uint64(experts if experts_per_layer is None else experts_per_layer)
    idx = (lay * epl + exp) & m32
    return ((((idx * np.uint64(GOLDEN)) & m32) >> np.uint64(16)) & np.uint64(255)).astype(np.int64)


def cuts_many(member: Member, weights_2d) -> np.ndarray:
    """member.cuts for every row of `weights_2d` (K x drives) at once: a K x drives int array."""
    w = np.atleast_2d(np.asarray(weights_2d, dtype=np.float64))
    if w.ndim != 2 or w.shape[1] < 1:
        raise ValueError("cuts_many needs a K x drives array of weights")
    if not (np.isfinite(w).all() and (w > 0).all()):
        raise ValueError(f"{member.name}: weights must be positive and finite")
    k, n = w.shape
    out = np.empty((k, n), dtype=np.int64)
    if member.integer_weights:
        if not (w == np.floor(w)).all():
            raise ValueError(f"{member.name} takes integer weights (strtol)")
        wi = w.astype(np.int64)
        acc = np.cumsum(wi, axis=1)
        total = acc[:, -1:]
        out[:] = np.clip((HASH_BUCKETS * acc + total // 2) // total, 1, HASH_BUCKETS)
        out[:, -1] = HASH_BUCKETS
        return out
    cum = np.cumsum(w, axis=1)                       # sequential, as the C loops add
    raw = np.floor(256.0 * cum / cum[:, -1:] + 0.5).astype(np.int64)
    prev = np.zeros(k, dtype=np.int64)
    for r in range(n):
        c = np.minimum(np.where(raw[:, r] <= prev, prev + 1, raw[:, r]), HASH_BUCKETS)
        out[:, r] = c
        prev = c
    if member.name != "deepseek_v41":
        out[:, -1] = HASH_BUCKETS
    return out


# =============================================================================================
# The read pattern: what the member running the model reads for one step (docs/engine-profiles.md)
#
# - `moe` resolves a layer's unique experts in blocks of PREFILL_BLOCK (ESlot ws[64]); a block's
#   misses are loaded at once and the block's compute waits for them all: in prefill a group per
#   block of the step's experts (the blocks are counted over the misses alone: a prefill from a
#   cold cache misses every expert). A decoded token's layer waits for its misses: one group.
# - `expert_load_impl` reads an expert's weight tensors (contiguous in one shard) with one pread
#   from the drive the member's placement picks (`Member.route`), each tensor falling back to the
#   primary as the member does when that drive's copy lacks its shard (`Member.serve`); adjacent
#   tensors served by one drive are one read. Its small scale reads are not counted.
# - With DIRECT=1 the read is the 4 KiB-aligned O_DIRECT window (`direct_window`, clipped to the
#   file); with stripes on as well (COLI_MIR_STRIPE), a window of at least STRIPE_MIN bytes held by
#   two or more drives is cut into legs over them (`stripe_read`, with STRIPE_LEGS: equal legs in
#   the code we run, tekintian/colibri 4ef9a99). Only the members that stripe do.
# - READ_THREADS loads in flight (PIPE_WORKERS' default, and OpenMP's on an 8-core machine:
#   *assumed*, colibri sizes both from the machine), each load with all its legs.

PREFILL_BLOCK = 64               # unique experts moe() resolves (and loads) per block (ESlot ws[64])
READ_THREADS = 8                 # loads in flight (assumed: PIPE_WORKERS' default)
STRIPE_LEGS = "equal"            # mir_pread_striped at 4ef9a99; 'weighted' since the weighted-stripe change


def _window(geometry, file: str, offset: int, length: int) -> tuple[int, int]:
    """The O_DIRECT window of [offset, offset+length), clipped to the file's end when known."""
    o, n = direct_window(offset, length)
    size = geometry.file_bytes(file)
    return (o, min(n, size - o)) if size is not None else (o, n)


_LAYOUT: dict = {}       # (geometry id, member, layer, expert) -> (geometry, bucket, extents, merged): weight-independent


def _layout(geometry, member: Member, layer: int, expert: int):
    """(bucket, the expert's extents in component order, the same sorted by place and merged
    where they touch)."""
    key = (id(geometry), member.name, layer, expert)
    hit = _LAYOUT.get(key)
    if hit is not None and hit[0] is geometry:
        return hit[1:]
    ext = geometry.expert_ranges(layer, expert)          # in component order: the anchor (gate) first
    merged: list[list] = []
    for x in sorted(ext, key=lambda x: (x.file, x.offset)):
        if merged and merged[-1][0] == x.file and merged[-1][1] + merged[-1][2] == x.offset:
            merged[-1][2] += x.length
        else:
            merged.append([x.file, x.offset, x.length])
    out = (member.bucket(layer, expert, geometry.experts), tuple(ext), tuple(tuple(m) for m in merged))
    if len(_LAYOUT) > 200_000:
        _LAYOUT.clear()
    _LAYOUT[key] = (geometry,) + out
    return out


_CUTS: dict = {}


def _member_cuts(member: Member, weights: tuple) -> tuple[int, ...]:
    key = (member.name, weights)
    c = _CUTS.get(key)
    if c is None:
        c = _CUTS[key] = member.cuts(weights)
    return c


def _routed(member: Member, bucket: int, weights: tuple) -> int:
    """The drive (index into `weights`) whose cut slice holds `bucket` (`Member.route`)."""
    if len(weights) < 2:
        return 0
    c, r = _member_cuts(member, weights), 0
    while r + 1 < len(c) and bucket >= c[r]:
        r += 1
    return r


def expert_reads(geometry, member: Member, layer: int, expert: int, setup: Setup) -> list[Read]:
    """The reads of one expert: its tensors served by the drives the member picks (`Member.route`,
    `Member.serve`), adjacent tensors on one drive merged, each cut (or not) as the switches say."""
    usable = setup.usable()
    if not usable:
        return []
    bucket, ext, merged = _layout(geometry, member, layer, expert)
    routed = usable[_routed(member, bucket, tuple(setup.weights[i] for i in usable))]
    whole_model = all(setup.holds_file(s, x.file) for s in usable for x in ext)
    if whole_model:
        runs = [(f, o, n, routed) for f, o, n in merged]
    else:
        served = member.serve(routed, [x.file for x in ext], lambda s, f: s in usable and setup.holds_file(s, f))
        served = tuple(s if s in usable else usable[0] for s in served)
        runs = []
        for x, s in sorted(zip(ext, served), key=lambda t: (t[0].file, t[0].offset)):
            if runs and runs[-1][0] == x.file and runs[-1][1] + runs[-1][2] == x.offset and runs[-1][3] == s:
                runs[-1] = (x.file, runs[-1][1], runs[-1][2] + x.length, s)
            else:
                runs.append((x.file, x.offset, x.length, s))
    out = []
    for file, off, n, s in runs:
        if setup.direct:
            off, n = _window(geometry, file, off, n)
        if setup.direct and setup.stripe and member.stripes:
            holders = [h for h in usable if setup.holds_file(h, file)]
            pieces = stripe_read(off, n, s, holders, setup.weights, STRIPE_LEGS)
        else:
            pieces = (Piece(s, off, n, n // ALIGN),)
        out.append(Read(file, off, n, pieces))
    return out


def read_pattern(geometry, step: Step, setup: Setup) -> Pattern:
    """The reads of one step by the family member that runs this model (its config.json
    model_type, `geometry.arch`): whole experts on the drives its placement picks, in blocks of
    PREFILL_BLOCK (prefill) or one group (decode). A source that may not serve (the reader's
    failover, not colibri's: colibri fails closed) is left out of the placement."""
    member = member_for(geometry.arch)
    if step.phase == "prefill":
        blocks = [step.experts[i:i + PREFILL_BLOCK] for i in range(0, len(step.experts), PREFILL_BLOCK)]
    else:
        blocks = [step.experts] if step.experts else []
    groups = tuple(tuple(r for e in b for r in expert_reads(geometry, member, step.layer, e, setup)) for b in blocks)
    return Pattern(step, tuple(g for g in groups if g))


def replica_serves(geometry, layer: int, expert: int, held: frozenset) -> int:
    """Bytes of expert (layer, expert) a mirror holding the files `held` serves when colibri
    routes the expert to it: its family member's fallback for a missing shard (`Member.serve`:
    the GLM engine's anchor tensor, DeepSeek V4's shard, V4.1's tensor, GLM-5.3's whole expert)."""
    ext = geometry.expert_ranges(layer, expert)
    srcs = member_for(geometry.arch).serve(1, [x.file for x in ext], lambda src, f: src == 0 or f in held)
    return sum(x.length for x, src in zip(ext, srcs) if src == 1)


def buffered(setup: Setup) -> bool:
    """Without DIRECT=1 expert_load_impl reads with plain pread: through the page cache."""
    return not setup.direct


def modes(geometry) -> tuple[frozenset[str], ...]:
    """Buffered reads (colibri's default), O_DIRECT (DIRECT=1), and O_DIRECT striped where the
    member running this model stripes (COLI_MIR_STRIPE; only on the O_DIRECT path)."""
    out = (frozenset(), frozenset({"direct"}))
    return out + (frozenset({"direct", "stripe"}),) if member_for(geometry.arch).stripes else out


def concurrency(phase: str) -> Concurrency:
    """READ_THREADS loads in flight in either phase, each with all its stripe legs."""
    return Concurrency(shared=READ_THREADS, per_read=True)


def weight_grid(n: int, geometry, phase: str = "decode") -> np.ndarray:
    """Every distinct cut vector the member's weights give (its cuts decide everything), as the
    smallest weights that give it; the grid is 1..GRID_MAX[n] per drive (colibri's whole 1..100
    up to three drives; beyond, nearly every vector is a cut vector of its own)."""
    return _cut_classes(member_for(geometry.arch).name, n)[1]


GRID_MAX = {1: WEIGHT_MAX, 2: WEIGHT_MAX, 3: WEIGHT_MAX, 4: 15, 5: 9}


def _grid(n: int) -> np.ndarray:
    """Every weight vector of n drives (WEIGHT_MIN..GRID_MAX[n] each), smallest first: by sum,
    max, then lexicographic."""
    top = GRID_MAX[n]
    axes = np.meshgrid(*([np.arange(WEIGHT_MIN, top + 1, dtype=np.int64)] * n), indexing="ij")
    w = np.stack([a.ravel() for a in axes], axis=1)
    keys = [w[:, i] for i in reversed(range(n))] + [w.max(axis=1), w.sum(axis=1)]
    return w[np.lexsort(keys)]


_CLASSES: dict = {}


def _cut_classes(member: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(cuts K x n, smallest weights K x n) of every distinct cut vector of the grid."""
    key = (member, n)
    if key not in _CLASSES:
        w = _grid(n)
        c = cuts_many(FAMILY[member], w)
        code = np.zeros(len(w), dtype=np.int64)
        for r in range(n):
            code = code * (HASH_BUCKETS + 1) + c[:, r]
        _, first = np.unique(code, return_index=True)
        first.sort()
        _CLASSES[key] = (c[first], w[first])
    return _CLASSES[key]


ENGINE = Engine(name=NAME, max_sources=MAX_SOURCES, weight_min=WEIGHT_MIN, weight_max=WEIGHT_MAX,
                granule=ALIGN, split=None, path_forbidden=PATH_FORBIDDEN,
                pattern=read_pattern, concurrency=concurrency, grid=weight_grid, reads_model=reads_model,
                switches=("direct", "stripe"), modes=modes, phase_weights=False, profile=colibri_profile,
                buffered=buffered, timing=read_timing, replica_serves=replica_serves)
