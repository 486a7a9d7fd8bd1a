"""--max-rate: a token bucket that paces one drive's reads and writes (pure arithmetic).

The caller asks `take(now, nbytes)` before moving `nbytes` and waits the seconds it returns;
`now` comes from whatever clock the caller uses (the I/O ring's monotonic clock, a test's fake
one). Rates are decimal bytes per second, as drive makers quote them (500M = 500,000,000 B/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import UsageError

from .constants import BURST_S

_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_rate(text: str, what: str = "--max-rate") -> float:
    """'500M' -> 5e8 bytes/s. K/M/G/T are decimal; a trailing 'B', '/s' or 'B/s' is accepted."""
    s = str(text).strip().upper()
    for tail in ("B/S", "/S", "B"):
        if s.endswith(tail) and len(s) > len(tail):
            s = s[: -len(tail)]
            break
    unit = s[-1:] if s[-1:] in "KMGT" else ""
    try:
        value = float(s[: len(s) - len(unit)])
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a rate: use bytes per second or a number with K, M, G or T "
                         "(decimal), e.g. 500M") from None
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{what} {text!r} must be a positive rate, e.g. 500M")
    return value * _DECIMAL[unit]


@dataclass
class TokenBucket:
    """Bytes may move at `rate` (bytes/s) on average, in bursts of at most `burst` bytes after
    idling. A request larger than what is in the bucket goes into debt, which the next requests
    wait off, so any request size keeps the average."""

    rate: float                     # bytes/s
    burst: float                    # bytes
    tokens: float = 0.0
    last: float | None = None       # the clock's seconds at the previous take

    @classmethod
    def for_rate(cls, rate: float) -> "TokenBucket":
        return cls(rate=rate, burst=rate * BURST_S)

    def take(self, now: float, nbytes: int) -> float:
        """Seconds to wait from `now` before `nbytes` may move (0 when the bucket holds them)."""
        if self.last is None:
            self.tokens, self.last = self.burst, now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        self.tokens -= nbytes
        return -self.tokens / self.rate if self.tokens < 0 else 0.0
