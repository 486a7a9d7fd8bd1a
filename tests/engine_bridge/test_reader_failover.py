"""A failing, short or vanished source degrades the plan; reads still return exact bytes."""

import os

import pytest

from core.errors import MissingError
from engine_bridge.reader.split_reader import SplitReader
from engine_bridge.reader.settings import ReaderSettings
from engines.ds4_argodrive.constants import BLOCK_BYTES
from tests.engine_bridge.helpers import primary_and_copies
from tests.helpers import FailingReader

SIZE = 8 * BLOCK_BYTES + 3000


@pytest.fixture
def model(tmp_path):
    return primary_and_copies(tmp_path, SIZE, seed=3)


def _reads():
    return [(i * 4096 + 17, 3 * BLOCK_BYTES + 999) for i in range(40)]


def _check_all(r, data, phase="prefill"):
    views = r.read_many(_reads(), phase)
    for (off, ln), v in zip(_reads(), views):
        assert bytes(v) == data[off:off + ln]


def test_unreadable_replica_fails_over_and_degrades(model):
    paths, data = model
    events = []
    FailingReader.broken = {paths[1]: 2}
    with SplitReader(paths, [2, 1, 1], opener=FailingReader, report=events.append, settings=ReaderSettings(lanes=2)) as r:
        _check_all(r, data)
        _check_all(r, data, "decode")
        s = r.stats()
    assert r.degraded == (False, True, False)
    kinds = [e.kind for e in s.events]
    assert "read_failed" in kinds and "degraded" in kinds and "failover" in kinds
    assert kinds.count("degraded") == 1
    assert [e.kind for e in events] == kinds
    assert s.sources[1].degraded and s.sources[1].events >= 2
    # every byte returned was delivered by someone: the split's total, nothing lost or doubled
    assert sum(x.bytes for x in s.sources) == 2 * sum(ln for _, ln in _reads())
    assert s.sources[0].failover_bytes + s.sources[2].failover_bytes > 0


def test_truncated_replica_mid_run(model):
    paths, data = model
    with SplitReader(paths, [1, 1, 1], health_interval=None, settings=ReaderSettings(lanes=2)) as r:
        _check_all(r, data)
        os.truncate(paths[2], BLOCK_BYTES)
        _check_all(r, data)                    # short pieces are re-read elsewhere
        s = r.stats()
    assert r.degraded == (False, False, True)
    assert any(e.kind == "short_read" and e.source == 2 for e in s.events)


def test_truncation_found_by_health_check(model):
    paths, data = model
    with SplitReader(paths, [1, 1, 1], health_interval=0, settings=ReaderSettings(lanes=1)) as r:
        _check_all(r, data)
        os.truncate(paths[1], SIZE - 1)        # only the last byte: reads may not even notice
        _check_all(r, data)
        s = r.stats()
    assert r.degraded == (False, True, False)
    assert any(e.kind == "vanished" and "truncated" in e.message for e in s.events)


def test_deleted_replica_mid_run_degrades_plan(model):
    paths, data = model
    with SplitReader(paths, [2, 1, 1], health_interval=0, settings=ReaderSettings(lanes=2)) as r:
        _check_all(r, data)
        before = r.stats().sources[2].bytes
        os.unlink(paths[2])
        _check_all(r, data)
        s = r.stats()
    assert r.degraded == (False, False, True)
    assert any(e.kind == "vanished" and "gone" in e.message for e in s.events)
    assert s.sources[2].bytes == before        # its share went to the others


def test_primary_failure_moves_front_to_replica(model):
    paths, data = model
    FailingReader.broken = {paths[0]: 0}
    with SplitReader(paths, [10, 5, 5], opener=FailingReader, settings=ReaderSettings(lanes=2)) as r:
        _check_all(r, data)
    assert r.degraded == (True, False, False)


def test_all_sources_failing_raises_missing(model):
    paths, data = model
    FailingReader.broken = {p: 0 for p in paths}
    with SplitReader(paths, [1, 1, 1], opener=FailingReader, settings=ReaderSettings(lanes=1)) as r:
        with pytest.raises(MissingError, match="no source could read"):
            r.read(0, 3 * BLOCK_BYTES)
        with pytest.raises(MissingError, match="every source is degraded"):
            r.read(0, 10)
        assert any(e.kind == "all_failed" for e in r.stats().events)
