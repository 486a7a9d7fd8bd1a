"""The split reader (docs/reader.md): `SplitReader` is the facade; `sources` (identity at open,
health and failover), `lanes` (threads per source, the barrier), `buffers` and `readstats`
(the counters, pure) are its parts. The modules every piece runs through are compiled at install
when a C compiler is at hand (`build.py`; docs/reader.md "Compiled")."""

from .build import use_compiled

use_compiled()          # before any of them is imported: the compiled copy, or the .py files

from .readstats import ReaderEvent, ReaderStats, SourceStats, format_stats  # noqa: E402 (after use_compiled)
from .split_reader import CachedReader, ReadTicket, SplitReader, span  # noqa: E402

__all__ = ["SplitReader", "ReadTicket", "CachedReader", "ReaderStats", "SourceStats", "ReaderEvent", "format_stats",
           "span"]
