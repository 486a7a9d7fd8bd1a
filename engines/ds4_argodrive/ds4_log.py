"""ds4-argodrive's log lines: what the engine says it applied (its reader's fprintf formats,
docs/engine-profiles.md; the reader is argodrive_read.h: `ar_open` parses the split, `ar_close`
prints the per-source bytes). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..handoff import last_match
from .constants import ENV_DECODE_WEIGHTS

LOG_SOURCES = re.compile(r"expert reader sources=(\d+)")
# ar_open prints the decode list verbatim ("%s"); strtoul skips the blanks after each comma, so
# "10, 6, 6" is applied like "10,6,6" and printed with its spaces.
LOG_DECODE_SPLIT = re.compile(r"decode split (\d[\d,\s]*?)(?: \(prefill keeps the base weights\))?[ \t]*$", re.M)
# A decode list of the wrong count or range is dropped with only this line; the base weights run.
LOG_DECODE_IGNORED = re.compile(r"ignoring " + re.escape(ENV_DECODE_WEIGHTS)
                                + r"=(.*?)(?: \(want \d+ comma-separated weights 1\.\.100\))?[ \t]*$", re.M)
# Printed by ar_close per source it had opened: at the end of every reader session, and also
# when ar_open rejects its configuration (a relative path, a 4th source, a bad weight, a size or
# inode clash), which closes the reader at once: then every line says bytes=0 and the engine
# never says 'expert reader sources='.
LOG_SOURCE_BYTES = re.compile(r"source\[(\d+)\] bytes=(\d+)")
LOG_CACHE_BUDGET = re.compile(r"streaming expert cache budget=(\d+) experts")
LOG_DECODE_CACHE = re.compile(r"decode cache requested=(\d+) effective=(\d+)")
LOG_CACHE_CAP = re.compile(r"(using locked cache cap:.*|runtime cache cap now .*)")
# Prefill staging refused its chunk (e.g. the reader is off); the engine falls back to the layer sweep.
LOG_PREFILL_REJECTED = re.compile(r"prefill stage rejected: (.*)")


def weights_text(text: str) -> str:
    """A weight list as the engine reads it: blanks dropped ('10, 6, 6' -> '10,6,6')."""
    return re.sub(r"\s+", "", text)


@dataclass(frozen=True)
class ReaderLog:
    """What one run's log (stdout and stderr) says the engine applied. None or empty: the
    engine printed no such line."""
    sources: int | None = None                      # the last 'expert reader sources=N'
    decode_split: str | None = None                 # the last 'decode split W0,W1,...', blanks dropped
    decode_ignored: str | None = None               # the last decode list the engine ignored, verbatim
    source_bytes: dict[int, int] = field(default_factory=dict)   # source -> bytes, summed over reader sessions
    cache_budgets: tuple[int, ...] = ()             # experts, every budget line in order
    cache_caps: tuple[str, ...] = ()                # lines in which the engine capped the cache
    decode_cache: tuple[tuple[int, int], ...] = ()  # (requested, effective) decode cache, experts
    prefill_rejected: str | None = None             # the last reason prefill staging was rejected

    @property
    def rejected(self) -> bool:
        """The reader refused its replica configuration: source lines, every one bytes=0, and no
        'expert reader sources=' line (ar_open closed the reader before it served a read)."""
        return bool(self.source_bytes) and self.sources is None and not any(self.source_bytes.values())


def read_log(text: str) -> ReaderLog:
    """Every line of `text` the engine prints about what it applied."""
    sources = last_match(LOG_SOURCES, text)
    split = last_match(LOG_DECODE_SPLIT, text)
    per: dict[int, int] = {}
    for i, b in LOG_SOURCE_BYTES.findall(text):
        per[int(i)] = per.get(int(i), 0) + int(b)
    return ReaderLog(
        sources=None if sources is None else int(sources),
        decode_split=None if split is None else weights_text(split),
        decode_ignored=last_match(LOG_DECODE_IGNORED, text),
        source_bytes=dict(sorted(per.items())),
        cache_budgets=tuple(int(x) for x in LOG_CACHE_BUDGET.findall(text)),
        cache_caps=tuple(LOG_CACHE_CAP.findall(text)),
        decode_cache=tuple((int(a), int(b)) for a, b in LOG_DECODE_CACHE.findall(text)),
        prefill_rejected=last_match(LOG_PREFILL_REJECTED, text),
    )

