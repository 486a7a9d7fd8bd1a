"""Parsing and formatting sizes and rates (pure)."""

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
    n = int(value * _BINARY[unit])
    if n <= 0 or value != value:
        raise UsageError(f"{what} {text!r} must be positive")
    return n


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
