"""The split reader (docs/reader.md): `SplitReader` is the facade; `sources` (identity at open,
health and failover), `lanes` (threads per source, the barrier), `buffers` and `readstats`
(the counters, pure) are its parts."""

from .readstats import ReaderEvent, ReaderStats, SourceStats, format_stats
from .split_reader import CachedReader, ReadTicket, SplitReader, span

__all__ = ["SplitReader", "ReadTicket", "CachedReader", "ReaderStats", "SourceStats", "ReaderEvent", "format_stats",
           "span"]
