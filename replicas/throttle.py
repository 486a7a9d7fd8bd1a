"""The I/O ring's half of --max-rate: a `Pacer` per drive asks its token bucket how long to wait
and sleeps that long (waking early on cancel). The clock is injected so tests never sleep."""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from .pacing import TokenBucket


class Clock(Protocol):
    def now(self) -> float: ...                                          # seconds, monotonic

    def sleep(self, seconds: float, cancel: threading.Event | None) -> None: ...


class WallClock:
    """The real one: monotonic seconds; a sleep ends early when `cancel` is set."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, cancel: threading.Event | None) -> None:
        if cancel is not None:
            cancel.wait(seconds)
        else:
            time.sleep(seconds)


class Pacer:
    """Call it with the bytes about to move on its drive; it returns when they may. Shared by
    every thread touching the drive (reads, writes, read-back)."""

    def __init__(self, rate: float, clock: Clock | None = None, cancel: threading.Event | None = None):
        self.bucket = TokenBucket.for_rate(rate)
        self.clock = clock or WallClock()
        self.cancel = cancel
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            wait = self.bucket.take(self.clock.now(), nbytes)
        if wait > 0 and not (self.cancel is not None and self.cancel.is_set()):
            self.clock.sleep(wait, self.cancel)


Pace = Callable[[int], None]


class Pacers:
    """One Pacer per drive key, made on first use; `None` for every drive when no rate is set."""

    def __init__(self, rate: float | None, clock: Clock | None = None, cancel: threading.Event | None = None):
        self.rate, self.clock, self.cancel = rate, clock, cancel
        self._by_key: dict[str, Pacer] = {}
        self._lock = threading.Lock()

    def for_drive(self, key: str) -> Pace | None:
        if self.rate is None:
            return None
        with self._lock:
            if key not in self._by_key:
                self._by_key[key] = Pacer(self.rate, self.clock, self.cancel)
            return self._by_key[key]
