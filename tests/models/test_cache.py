import pytest

from models.cache import ExpertCache


def test_evicts_the_coldest_then_the_least_recently_used():
    c = ExpertCache(3, 10)
    for k in (1, 2, 3):
        c.select([k])
        c.admit(k, f"v{k}")
    c.select([1, 1])          # 1: count 3
    c.select([3])             # 3: count 2, used after 2
    # 2 has the lowest count (1)
    assert c.admit(4, "v4") == [2]
    # now counts: 1->3, 3->2, 4->0 (admitted, never selected): 4 is coldest
    assert c.admit(5, "v5") == [4]
    c.select([5])
    c.select([3])             # 3 -> 3, ties with 1 but used later
    assert c.victim() == 5    # count 1 < 3
    c.select([5, 5])          # 5 -> 3: three-way tie at 3; least recently used is 1
    assert c.victim() == 1
    assert c.victim(protect=[1]) == 3


def test_halving_every_32_tokens_lets_new_favourites_win():
    c = ExpertCache(1, 4, halving_tokens=32)
    c.select([0] * 1, [8])
    c.admit(0)
    c.advance(31)
    assert c.hot[0] == 8
    c.advance(1)
    assert c.hot[0] == 4
    c.advance(64)
    assert c.hot[0] == 1
    c.select([1], [2])
    assert c.admit(1) == [0]  # a full cache always admits the expert just read, evicting the coldest
    assert 1 in c and 0 not in c


def test_lookup_counts_and_capacity_zero_keeps_nothing():
    c = ExpertCache(0, 4)
    assert c.lookup(2) == (False, None)
    assert c.admit(2, "x") == [] and 2 not in c and len(c) == 0
    c = ExpertCache(2, 4)
    c.admit(1, "a")
    assert c.lookup(1) == (True, "a")
    assert (c.hits, c.misses) == (1, 1 - 1)


def test_never_exceeds_capacity_and_protected_keys_stay():
    c = ExpertCache(2, 8)
    c.admit(0)
    c.admit(1)
    assert c.admit(2, protect=[0, 1]) == [] and 2 not in c
    for k in range(3, 8):
        c.admit(k, protect=[0])
        assert len(c) <= 2 and 0 in c


def test_negative_capacity_is_refused():
    with pytest.raises(ValueError):
        ExpertCache(-1, 4)
