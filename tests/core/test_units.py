"""core.units: sizes binary, rates decimal, changes with one sign."""

import pytest

from core.errors import UsageError
from core.units import format_bytes, format_rate, format_signed_pct, parse_size


def test_signed_percentages_have_exactly_one_sign():
    assert [format_signed_pct(x) for x in (0.012, -0.001, -1.5, 2.0)] == ["+1.2%", "-0.1%", "-150.0%", "+200.0%"]
    assert format_signed_pct(0.12346, 2) == "+12.35%"


@pytest.mark.parametrize("fraction", [0.0, -0.0, -0.0004, 0.0004])
def test_a_change_that_rounds_to_zero_has_no_sign(fraction):
    assert format_signed_pct(fraction) == "0.0%"


def test_sizes_are_binary_and_rates_decimal():
    assert format_bytes(64 << 20) == "64.0 MiB" and format_bytes(1536) == "1.5 KiB" and format_bytes(10) == "10 B"
    assert format_rate(1.5e9) == "1.50 GB/s" and format_rate(250e6) == "250 MB/s"
    assert parse_size("64M") == 64 << 20 and parse_size("1GiB") == 1 << 30 and parse_size("4096") == 4096


@pytest.mark.parametrize("text", ["x", "0", "-1M", "1Q"])
def test_a_size_that_is_not_one_is_a_usage_error(text):
    with pytest.raises(UsageError, match="size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "nanM", "infG", "1e30T"])
def test_a_size_that_is_not_finite_is_refused_in_one_line(text):
    from core.errors import UsageError
    from core.units import parse_size

    with pytest.raises(UsageError, match="finite number of bytes"):
        parse_size(text, "--page-cache")


@pytest.mark.parametrize("spec", ["usb=nan", "usb=inf", "usb=1e400", "usb=0.9@nan", "usb=0.9@inf", "usb=0.9/nan",
                                  "usb=0.9/inf"])
def test_a_ceiling_that_is_not_finite_is_refused(spec):
    from core.errors import UsageError
    from planner.whatifs import parse_ceiling

    with pytest.raises(UsageError, match="finite"):
        parse_ceiling(spec, 1e-4)
