"""A drive modelled by its service time (iobench/servedrive.py): when each request ends."""

import pytest

from iobench.servedrive import control_doc, done_at, read_control
from core.jsonfile import write_json

MB = 1e6


def test_a_request_on_an_idle_drive_takes_its_bytes_over_the_rate_from_when_it_came():
    assert done_at(busy_until=0.0, now=10.0, nbytes=6 * MB, rate=60 * MB) == pytest.approx(10.1)


def test_a_request_behind_another_starts_when_that_one_ends():
    first = done_at(0.0, 10.0, 6 * MB, 60 * MB)
    assert done_at(first, 10.01, 3 * MB, 60 * MB) == pytest.approx(first + 0.05)


def test_idle_time_banks_nothing_beyond_the_turnaround():
    # after 100 ms idle a read takes its full time (blk-throttle would let a 100 ms slice of it through at once)
    assert done_at(10.0, 10.1, 6 * MB, 60 * MB, turnaround=0.002) == pytest.approx(10.2)
    # taken up within the turnaround of the last end, it was queued behind it: it starts at that end
    assert done_at(10.0, 10.0015, 6 * MB, 60 * MB, turnaround=0.002) == pytest.approx(10.1)
    # and one taken up just after the turnaround starts when it is taken up
    assert done_at(10.0, 10.0025, 6 * MB, 60 * MB, turnaround=0.002) == pytest.approx(10.1025)


def test_no_limit_serves_at_once_but_in_order():
    assert done_at(0.0, 5.0, 6 * MB, 0) == 5.0
    assert done_at(7.0, 5.0, 6 * MB, 0) == 7.0


def test_the_control_document_carries_both_rates_in_bytes_per_second(tmp_path):
    path = write_json(str(tmp_path / "pace.json"), control_doc(60, 0))
    assert read_control(path) == (60 * MB, 0.0)
