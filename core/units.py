"""Parsing and formatting sizes and rates (pure)."""

import math

from .errors import UsageError

_BINARY = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str = "size") -> int:
    """'64M' -> 67108864. Suffixes K/M/G/T are binary (KiB, MiB, ...); an optional 'iB'/'B' is accepted."""
    s = str(text).strip().upper()
    for tail in ("IB", "B"):
        if s.endswith(tail) and len(s) > len(tail) and s[-len(tail) - 1] in "KMGT":
            s = s[: -len(tail)]
            break
    unit = s[-1:] if s[-1:] in "KMGT" else ""
    number = s[: len(s) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a size: use bytes or a number with K, M, G or T (binary), e.g. 64M") from None
    if not math.isfinite(value) or value * _BINARY[unit] >= 1 << 63:     # nan, inf, 1e400: no size at all
        raise UsageError(f"{what} {text!r} is not a size a drive holds: give a finite number of bytes, e.g. 64M")
    n = int(value * _BINARY[unit])
    if n <= 0:
        raise UsageError(f"{what} {text!r} must be positive")
    return n


def finite_or_none(value):
    """The value, unless it is a float that is not finite (nan, inf, a number too large for a
    float such as 1e400): None then (`core.cli` refuses such an option in one line)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def format_bytes(n: float) -> str:
    """Binary units for sizes: 67108864 -> '64.0 MiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def format_rate(bytes_per_s: float) -> str:
    """Decimal units for throughput, as drive makers and fio's bw_bytes: 1.5e9 -> '1.50 GB/s'."""
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.2f} GB/s"
    return f"{bytes_per_s / 1e6:.0f} MB/s"


def format_signed_pct(fraction: float, digits: int = 1) -> str:
    """A change as a percentage with exactly one sign: 0.012 -> '+1.2%', -0.001 -> '-0.1%'.

    `fraction` is the change over the base (0.01 = 1 %). A change that rounds to zero is '0.0%':
    neither '-0.0%' nor '+0.0%', which would claim a direction the digits cannot show."""
    value = round(100 * float(fraction), digits)
    if value == 0:
        return f"{0:.{digits}f}%"
    return f"{value:+.{digits}f}%"


def plural(n: int, noun: str) -> str:
    """'1 bad piece', '3 bad pieces': a count and its noun, as a reader says them."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
