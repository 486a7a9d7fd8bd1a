"""colibri's log lines: what each member of the family says it did with its mirrors, its
per-drive statistics and its timing (its fprintf/printf formats; pure).

The load and split lines, as each engine's fprintf prints them (docs/engine-profiles.md, "What
each engine prints"):

- GLM (c/colibri.c `mirror_setup`) and DeepSeek V4 (c/deepseek_v4.c `coli_st_mirror_setup`):
  `[MIRROR] DIR: N/M shards (replica K)`, `[MIRROR] N drives | read split 50% / 25% / 25% (HOW)`,
  each share printed `%.0f` of 100·slice/256;
- DeepSeek V4.1 (c/deepseek_v41.c `mirror_setup`): the same load lines, then
  `[MIRROR] N replicas, split HOW: primary 50% mirror 25% mirror 25%`, each share
  `(slice·100 + 128) / 256` in integers;
- GLM-5.3 (c/glm53.c `glm53_mirror_setup`): `[GLM53 MIRROR] replica K: DIR (N/M shards)`,
  `[GLM53 MIRROR] N drives | routing 50% / 25% / 25% (COLI_DISK_WEIGHTS)` (or `(startup bandwidth
  probe)`), each share `(100·slice + 128) / 256` in integers; `[GLM53 MIRROR] invalid
  COLI_DISK_WEIGHTS 'TEXT' for N drives; probing bandwidth`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Sequence

from .family import FamilyMember, member_of
from .placement import cuts

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
class MirrorLog:
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


def read_glm_log(text: str) -> MirrorLog:
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
    return MirrorLog(loaded=loaded, skipped=tuple(skipped), files_skipped=tuple(LOG_FILE_SKIPPED.findall(text)),
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


def read_stats(member: FamilyMember, text: str) -> dict[int, Served]:
    """Bytes and reads per drive (0 = primary) from this engine's log; {} when it printed
    no statistics line (glm53 prints none).

    glm (c/colibri.c profile_print, stdout): the last `MIRROR:` line, cumulative.
    deepseek_v41 (c/deepseek_v41.c mirror_report, stderr): the `MIRROR:` format, printed per
    turn as that turn's counts by the serve loop (V41_STATS=1) or once, cumulative, at the
    end of a reference run: the lines are summed. deepseek_v4 (c/deepseek_v4.c, stderr):
    the last `v4_mirror [drives=N] primary=X.XXGiB/N mirror=X.XXGiB/N ...` line, cumulative,
    GiB (2**30 bytes), mirrors unnumbered, in drive order."""
    if member.stats is None:
        return {}
    if member.name == "deepseek_v4":
        found = _STATS_V4.findall(text)
        if not found:
            return {}
        return {i: Served(round(float(gib) * (1 << 30)), int(reads))
                for i, (_, gib, reads) in enumerate(_STATS_V4_DRIVE.findall(found[-1]))}
    lines = _mirror_lines(text)
    if not lines:
        return {}
    if member.name == "deepseek_v41":
        total: dict[int, Served] = {}
        for line in lines:
            for k, s in line.items():
                t = total.get(k, Served(0, 0))
                total[k] = Served(t.bytes + s.bytes, t.reads + s.reads)
        return total
    return lines[-1]


def split_percents(weights: Sequence[float]) -> tuple[str, ...]:
    """The shares the '[MIRROR] N drives | read split' line prints, as printed ('%.0f')."""
    c, lo, out = cuts(weights), 0, []
    for x in c:
        out.append(f"{100.0 * (x - lo) / 256:.0f}")
        lo = x
    return tuple(out)


# the statistics line each member prints (GLM-5.3: none)
STATS_LINE = {"glm": "MIRROR:", "deepseek_v41": "MIRROR:", "deepseek_v4": "v4_mirror"}
_V41_SPLIT = re.compile(r"^\[MIRROR\] (\d+) replicas, split (.+?):((?: (?:primary|mirror) \d+%)+)[ \t]*$", re.M)
_V41_SHARE = re.compile(r" (?:primary|mirror) (\d+)%")
_G53 = r"^\[GLM53 MIRROR\] "
_G53_LOADED = re.compile(_G53 + r"replica (\d+): (.+) \((\d+)/(\d+) shards\)[ \t]*$", re.M)
_G53_NO_SHARD = re.compile(_G53 + r"(.+): no usable shards -- ignored", re.M)
_G53_IS_MODEL = re.compile(_G53 + r"(.+) equals primary model dir -- ignored", re.M)
_G53_TOO_MANY = re.compile(_G53 + r"too many mirrors; max (\d+) -- (.+) ignored", re.M)
_G53_WEIGHTS_INVALID = re.compile(_G53 + r"invalid COLI_DISK_WEIGHTS '(.*)' for (\d+) drives; probing bandwidth", re.M)
_G53_SPLIT = re.compile(_G53 + r"(\d+) drives \| routing ([\d% /]+?) \((.+)\)[ \t]*$", re.M)


def read_log(text: str, variant: str = "") -> MirrorLog:
    """What the member's log says it did with its mirrors: the
    load and skip lines, the split line (its shares, '%' dropped, and how the split was chosen),
    and `served` from the member's own statistics line (`read_stats`; {} when it prints
    none)."""
    m = member_of(variant)
    if m.name == "glm53":
        loaded = tuple(MirrorLoad(p, int(k), int(t), int(r)) for r, p, k, t in _G53_LOADED.findall(text))
        skipped = [(p, "no usable shards") for p in _G53_NO_SHARD.findall(text)]
        skipped += [(p, f"too many mirrors (max {n})") for n, p in _G53_TOO_MANY.findall(text)]
        skipped += [(p, "equals the model dir") for p in _G53_IS_MODEL.findall(text)]
        bad = _G53_WEIGHTS_INVALID.findall(text)
        drives, split, how = last_split(_G53_SPLIT.findall(text))
        return MirrorLog(loaded=loaded, skipped=tuple(skipped),
                           files_skipped=tuple(LOG_FILE_SKIPPED.findall(text)),
                           weights_rejected=bad[-1][0] if bad else None,
                           weights_wanted=int(bad[-1][1]) if bad else None,
                           drives=drives, split=split, split_how=how, served={})
    log = read_glm_log(text)
    if m.name == "deepseek_v41":
        found = _V41_SPLIT.findall(text)
        if found:
            n, how, shares = found[-1]
            log = replace(log, drives=int(n), split=tuple(_V41_SHARE.findall(shares)), split_how=how)
        else:
            log = replace(log, drives=None, split=(), split_how="")
    return replace(log, served=read_stats(m, text))


def split_shares(variant: str, weights: Sequence[int]) -> tuple[str, ...]:
    """The shares the member's split line prints for one weight per drive: the slices of its cuts,
    `%.0f` of 100·slice/256 (GLM, DeepSeek V4: `split_percents`) or
    (100·slice + 128) / 256 in integers (DeepSeek V4.1, GLM-5.3)."""
    m = member_of(variant)
    cut, lo, out = m.cuts(weights), 0, []
    for x in cut:
        s = x - lo
        out.append(f"{100.0 * s / 256:.0f}" if m.name in ("glm", "deepseek_v4") else str((100 * s + 128) // 256))
        lo = x
    return tuple(out)

