"""Progress events that long work reports (sync, verify, hash, repair); the CLI renders them.

Library code never prints: it calls `report(Event)` if the caller gave one, and checks a
`threading.Event` cancel flag between blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Progress:
    task: str          # what is moving: a destination or member path
    phase: str         # 'hash', 'copy', 'verify', 'repair', 'read'
    done: int          # bytes so far
    total: int         # bytes in all


@dataclass(frozen=True)
class Notice:
    task: str
    message: str       # something the user should know (fallback used, no-op, resumed...)
    warning: bool = False   # something that may go wrong later (a path an engine refuses): --quiet still shows it


Event = Progress | Notice
Reporter = Optional[Callable[[Event], None]]


def emit(report: Reporter, event: Event) -> None:
    if report is not None:
        report(event)
